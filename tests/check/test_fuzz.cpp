// tests/check/test_fuzz.cpp — a deterministic, bounded fuzz of the .npy and JSON readers: valid
// files of every dtype and valid case/candidate JSON are mutated (bit flips, byte overwrites with
// interesting values, insertions, deletions, truncations, splices); every input must parse or
// throw burstlab::Error, nothing else, and never crash. The libFuzzer entry (fuzz_npy.cpp) runs
// the same readers unbounded where clang is available.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "burstlab/error.hpp"
#include "case.hpp"
#include "npy.hpp"

using namespace burstlab;
using namespace burstlab::check;

namespace {

std::string mutate(std::string s, std::mt19937_64& rng) {
  static const char interesting[] = {0, '\xff', '\x7f', '\x80', '9', '(', ')', ',', '\'', '"', '{', '}', '[', ']',
                                     ':', '-', 'e', '<', '>', ' ', '\n', 'T', 'F'};
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < n; ++k) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 7) {
      case 0: if (!s.empty()) s[at] ^= static_cast<char>(1u << (rng() % 8)); break;
      case 1: if (!s.empty()) s[at] = interesting[rng() % sizeof interesting]; break;
      case 2: s.insert(at, 1, static_cast<char>(rng() & 0xff)); break;
      case 3: if (!s.empty()) s.erase(at, 1 + rng() % 8); break;
      case 4: s.resize(at); break;
      case 5: if (!s.empty()) s.insert(at, s.substr(rng() % s.size(), 1 + rng() % 16)); break;
      case 6: if (s.size() > 8) s[at] = static_cast<char>('0' + rng() % 10); break;
    }
  }
  return s;
}

// Runs `parse` on `iters` mutations of the seeds; counts accepted inputs and Errors.
template <class F>
void fuzz(const std::vector<std::string>& seeds, int iters, uint64_t seed, F parse, int* ok, int* errors) {
  std::mt19937_64 rng(seed);
  for (int it = 0; it < iters; ++it) {
    std::string in = seeds[rng() % seeds.size()];
    if (it % 5 == 0) in = mutate(mutate(in, rng), rng);
    else in = mutate(in, rng);
    try {
      parse(in);
      ++*ok;
    } catch (const Error&) {
      ++*errors;
    } catch (const std::exception& e) {
      FAIL() << "input " << it << " threw a non-burstlab exception: " << e.what();
    }
  }
}

}  // namespace

TEST(Fuzz, NpyReaderOnlyThrowsBurstlabError) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> seeds;
  std::vector<double> v(60);
  for (size_t k = 0; k < v.size(); ++k) v[k] = std::cos(k * 0.7) * 3;
  seeds.push_back(format_npy(Dtype::F64, {3, 4, 5}, v.data(), 60));
  seeds.push_back(format_npy(Dtype::F32, {60}, v.data(), 60));
  seeds.push_back(format_npy(Dtype::F16, {2, 2, 3, 5}, v.data(), 60));
  seeds.push_back(format_npy(Dtype::BF16, {6, 10}, v.data(), 60));
  seeds.push_back(format_npy(Dtype::F32, {}, v.data(), 1));
  int ok = 0, errors = 0;
  fuzz(seeds, 40000, 0xB0057, [](const std::string& s) {
    const NpyArray a = parse_npy(s, "fuzz.npy");
    size_t n = 1;
    for (int64_t d : a.shape) n *= static_cast<size_t>(d);
    if (n != a.data.size()) throw std::logic_error("size disagrees with shape");
  }, &ok, &errors);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("npy fuzz: %d accepted, %d rejected with burstlab::Error, %.2f s\n", ok, errors, s);
  EXPECT_GT(errors, 1000);  // the mutations do reach the error paths
  EXPECT_GT(ok, 100);       // and some stay valid (payload-only changes)
}

TEST(Fuzz, CaseAndCandidateJsonOnlyThrowBurstlabError) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> seeds;
  for (const CaseMeta& m : suite(true, Dtype::F32))
    if (m.p.N_q * m.p.N_k < 10000) seeds.push_back(case_json(m));
  int ok = 0, errors = 0;
  fuzz(seeds, 4000, 0x15, [](const std::string& s) { parse_case_json(s, "fuzz.json"); }, &ok, &errors);
  std::vector<std::string> cand = {R"({"lse_empty": "+inf", "lse_base": "2", "dtype": "bf16", "layout": "BSHD"})",
                                   R"({"lse_empty": "-inf"})"};
  fuzz(cand, 20000, 0x16, [](const std::string& s) { parse_candidate_json(s, "fuzz.json"); }, &ok, &errors);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("json fuzz: %d accepted, %d rejected with burstlab::Error, %.2f s\n", ok, errors, s);
  EXPECT_GT(errors, 1000);
  EXPECT_GT(ok, 10);
}
