// tests/check/test_lmhead_case.cpp — the LM head's case files (check/lmhead_case.hpp, spec §10):
// int64 .npy labels round trip and are read strictly; case.json is strict; a case written, read
// back and given to the cpu layer passes `check`; a perturbed, missing or wrongly shaped candidate
// fails; and `burstlab gen --op lmhead-ce`, `oracle`, `check` end to end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "cpu_lmhead.hpp"
#include "lmhead_case.hpp"
#include "npy.hpp"
#include "testutil.hpp"

namespace burstlab::check {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testutil::error_message;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / ("lmcase_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(LmHeadNpy, Int64RoundTripAndStrictness) {
  const std::vector<int64_t> y = {0, -100, 31999, int64_t(1) << 40, -1};
  const std::string bytes = format_npy_int64({5}, y.data(), y.size());
  const NpyInt64 back = parse_npy_int64(bytes, "y.npy");
  EXPECT_EQ(back.shape, std::vector<int64_t>{5});
  EXPECT_EQ(back.data, y);
  // A float file is not a label file, and a label file is not a float file.
  const double x[2] = {1, 2};
  EXPECT_THAT(error_message([&] { parse_npy_int64(format_npy(Dtype::F32, {2}, x, 2), "f.npy"); }),
              HasSubstr("f.npy: dtype '<f4' is not supported for integers"));
  EXPECT_THAT(error_message([&] { parse_npy(bytes, "y.npy"); }), HasSubstr("y.npy: dtype '<i8' is not supported"));
  // Truncated data and '<i4' (NumPy's default int on some platforms).
  EXPECT_THAT(error_message([&] { parse_npy_int64(bytes.substr(0, bytes.size() - 3), "t.npy"); }), HasSubstr("truncated"));
  std::string i4 = bytes.substr(0, bytes.find("<i8")) + "<i4" + bytes.substr(bytes.find("<i8") + 3);
  i4.resize(i4.size() - 5 * 8);
  for (int32_t v : {7, -100, 3, 0, -1})
    for (int b = 0; b < 4; ++b) i4 += static_cast<char>((static_cast<uint32_t>(v) >> (8 * b)) & 0xff);
  EXPECT_EQ(parse_npy_int64(i4, "i4.npy").data, (std::vector<int64_t>{7, -100, 3, 0, -1}));
}

TEST(LmHeadCaseJson, RoundTripAndStrictErrors) {
  const std::vector<LmHeadCaseMeta> suite = lmhead_suite(false, Dtype::BF16);
  ASSERT_GE(suite.size(), 8u);
  for (const LmHeadCaseMeta& m : suite) {
    const LmHeadCaseMeta b = parse_lmhead_case_json(lmhead_case_json(m), "case.json");
    EXPECT_EQ(b.name, m.name);
    EXPECT_EQ(shape_string(b.p), shape_string(m.p));
    EXPECT_EQ(b.dtype, m.dtype);
    EXPECT_EQ(b.seed, m.seed);
    EXPECT_EQ(b.g, m.g);
    EXPECT_EQ(b.ignored, m.ignored);
  }
  std::string text = lmhead_case_json(suite[0]);
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_THAT(error_message([&] { parse_lmhead_case_json(edit("\"V\": 1000", "\"V\": 0"), "c.json"); }),
              HasSubstr("c.json: field 'V' (0) must be in [1, "));
  EXPECT_THAT(error_message([&] { parse_lmhead_case_json(edit("\"reduction\": \"mean\"", "\"reduction\": \"avg\""), "c.json"); }),
              HasSubstr("c.json: reduction (avg) must be mean or sum"));
  EXPECT_THAT(error_message([&] { parse_lmhead_case_json(edit("\"label_smoothing\": 0.0", "\"label_smoothing\": 2.0"), "c.json"); }),
              HasSubstr("c.json: label_smoothing (2) must be in [0, 1]"));
  EXPECT_THAT(error_message([&] { parse_lmhead_case_json(edit("\"seed\"", "\"sed\""), "c.json"); }),
              HasSubstr("c.json: missing field 'seed'"));
  EXPECT_THAT(error_message([&] { parse_lmhead_case_json(edit("{", "{\"extra\": 1,"), "c.json"); }),
              HasSubstr("c.json: unknown field 'extra'"));
}

// The cpu layer as a candidate: its outputs written as .npy in their own dtypes.
void write_cpu_candidate(const fs::path& dir, const LmHeadCaseData& c) {
  using T = bf16_t;
  const LmHeadProblem& p = c.meta.p;
  const Matrix<T> H = convert<T>(c.in.H), W = convert<T>(c.in.W);
  std::vector<float> LSE(static_cast<size_t>(p.N));
  Matrix<T> dH = make_matrix<T>(p.N, p.d), dW = make_matrix<T>(p.V, p.d);
  const double L = cpu::lmhead_fused<T>(p, H.view(), W.view(), c.in.y.data(), c.meta.g, LSE.data(), dH.view(), dW.view());
  fs::create_directories(dir);
  write_npy((dir / "L.npy").string(), Dtype::F32, {}, &L, 1);
  const std::vector<double> LSEd(LSE.begin(), LSE.end());
  write_npy((dir / "LSE.npy").string(), Dtype::F32, {p.N}, LSEd.data(), LSEd.size());
  std::vector<double> x(dH.data.size());
  for (size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(dH.data[e]);
  write_npy((dir / "dH.npy").string(), Dtype::BF16, {p.N, p.d}, x.data(), x.size());
  x.resize(dW.data.size());
  for (size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(dW.data[e]);
  write_npy((dir / "dW.npy").string(), Dtype::BF16, {p.V, p.d}, x.data(), x.size());
}

TEST(LmHeadCase, CpuCandidatePassesPerturbedFails) {
  const fs::path root = fresh_dir("api");
  for (const LmHeadCaseMeta& m : lmhead_suite(true, Dtype::BF16)) {
    const fs::path dir = root / m.name;
    write_lmhead_case(dir.string(), make_lmhead_case(m));
    ASSERT_TRUE(is_lmhead_case(dir.string()));
    const LmHeadCaseData c = read_lmhead_case(dir.string());
    write_lmhead_expected(dir.string(), compute_lmhead_expected(c));
    const LmHeadExpected e = read_lmhead_expected(dir.string(), c.meta);
    const fs::path cand = root / ("cand_" + m.name);
    write_cpu_candidate(cand, c);
    LmHeadCandidate k = read_lmhead_candidate(cand.string(), c.meta, "");
    EXPECT_EQ(k.dtype, Dtype::BF16);  // dH.npy's
    const CheckResult r = check_lmhead_candidate(c, e, k, k.dtype);
    EXPECT_TRUE(r.pass()) << format_check(r);
    ASSERT_EQ(r.tensors.size(), 4u);
    // The loss off by 1e-2 relative (plus an absolute step for a zero loss) fails and is named.
    k.L = k.L * 1.01 + 1e-3;
    const CheckResult bad = check_lmhead_candidate(c, e, k, k.dtype);
    EXPECT_FALSE(bad.pass());
    EXPECT_FALSE(bad.tensors[0].pass());
    EXPECT_EQ(bad.tensors[0].m.tensor, "L");
  }
  EXPECT_FALSE(fs::exists(root / "nothing" / "case.json"));
  EXPECT_FALSE(is_lmhead_case((root / "nothing").string()));
}

// r_W of (10.21): a dW error between the bound for one rounding and the bound for three passes
// with r_W = 3 (a kernel that adds three chunks into a bf16 dW) and fails with r_W = 1.
TEST(LmHeadCase, DwRoundingsWidenOnlyTheDwBound) {
  const fs::path root = fresh_dir("rw");
  const LmHeadCaseMeta m = lmhead_suite(true, Dtype::BF16).front();
  ASSERT_TRUE(m.backward);
  const fs::path dir = root / m.name;
  write_lmhead_case(dir.string(), make_lmhead_case(m));
  const LmHeadCaseData c = read_lmhead_case(dir.string());
  write_lmhead_expected(dir.string(), compute_lmhead_expected(c));
  const LmHeadExpected e = read_lmhead_expected(dir.string(), c.meta);
  const fs::path cand = root / "cand";
  write_cpu_candidate(cand, c);
  LmHeadCandidate k = read_lmhead_candidate(cand.string(), c.meta, "");
  LmHeadOracle o;
  lmhead_bounds(c.meta.p, k.dtype, c.in.H.view(), c.in.W.view(), c.in.y.data(), e.LSE.data(), c.meta.g, true, o);
  size_t at = 0;  // the element where a rounding adds most, relative to the bound
  for (size_t i = 0; i < o.bound_dW.data.size(); ++i)
    if (o.bound_dW_round.data[i] / o.bound_dW.data[i] > o.bound_dW_round.data[at] / o.bound_dW.data[at]) at = i;
  ASSERT_GT(o.bound_dW_round.data[at], 0.0);
  k.dW.data[at] = e.dW.data[at] + o.bound_dW.data[at] + 1.5 * o.bound_dW_round.data[at];
  const CheckResult one = check_lmhead_candidate(c, e, k, k.dtype, 5, 1), three = check_lmhead_candidate(c, e, k, k.dtype, 5, 3);
  EXPECT_FALSE(one.tensors[3].pass()) << format_check(one);
  EXPECT_TRUE(three.pass()) << format_check(three);
  EXPECT_EQ(dW_bound(o, 1).data, o.bound_dW.data);
  try {
    dW_bound(o, 0);
    ADD_FAILURE() << "dW_bound(o, 0) did not throw";
  } catch (const Error& x) {
    EXPECT_THAT(x.what(), HasSubstr("dW_roundings (0) must be >= 1"));
  }
}

TEST(LmHeadCase, MissingOrMisshapenCandidateFiles) {
  const fs::path root = fresh_dir("missing");
  const LmHeadCaseMeta m = lmhead_suite(true, Dtype::F32).front();
  const LmHeadCaseData c = make_lmhead_case(m);
  write_lmhead_case((root / "case").string(), c);
  const LmHeadExpected e = compute_lmhead_expected(c);
  const fs::path cand = root / "cand";
  fs::create_directories(cand);
  write_npy((cand / "LSE.npy").string(), Dtype::F32, {m.p.N}, e.LSE.data(), e.LSE.size());
  const LmHeadCandidate k = read_lmhead_candidate(cand.string(), m, "");
  const CheckResult r = check_lmhead_candidate(c, e, k, k.dtype);
  EXPECT_FALSE(r.pass());
  EXPECT_TRUE(r.tensors[0].missing);  // L
  EXPECT_TRUE(r.tensors[1].pass());   // LSE: the oracle's own values
  EXPECT_TRUE(r.tensors[2].missing);  // dH
  write_npy((cand / "dH.npy").string(), Dtype::F32, {m.p.N + 1, m.p.d}, std::vector<double>((m.p.N + 1) * m.p.d).data(),
            static_cast<size_t>((m.p.N + 1) * m.p.d));
  EXPECT_THAT(error_message([&] { read_lmhead_candidate(cand.string(), m, ""); }), HasSubstr("dH.npy: shape"));
  // Labels out of range in y.npy are named.
  std::vector<int64_t> y = c.in.y;
  y[3] = m.p.V;
  write_npy_int64((root / "case" / "y.npy").string(), {m.p.N}, y.data(), y.size());
  EXPECT_THAT(error_message([&] { read_lmhead_case((root / "case").string()); }),
              HasSubstr("y.npy: y[3] (1000) must be in [0, V) = [0, 1000)"));
}

int run(const std::string& args, std::string* out = nullptr) {
  const std::string log = ::testing::TempDir() + "lmcase_cli_" + std::to_string(getpid()) + ".txt";
  const int status = std::system(("'" BURSTLAB_EXE "' " + args + " >" + log + " 2>&1").c_str());
  if (out) *out = read_file(log);
  std::remove(log.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

TEST(LmHeadCaseCli, GenOracleCheck) {
  const fs::path root = fresh_dir("cli");
  std::string out;
  ASSERT_EQ(run("gen --op lmhead-ce --quick --dtype fp32 --out " + (root / "cases").string(), &out), 0) << out;
  ASSERT_EQ(run("oracle --case " + (root / "cases").string(), &out), 0) << out;
  // Candidates: the oracle's own expected files (exact) for every case.
  for (const auto& e : fs::directory_iterator(root / "cases")) {
    const fs::path cand = root / "cand" / e.path().filename();
    fs::create_directories(cand);
    for (const char* t : {"L", "LSE", "dH", "dW"})
      fs::copy_file(e.path() / "expected" / (std::string(t) + ".npy"), cand / (std::string(t) + ".npy"));
  }
  EXPECT_EQ(run("check --case " + (root / "cases").string() + " --candidate " + (root / "cand").string() +
                    " --dtype fp32", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("bound of spec §10.8 for fp32"));
  EXPECT_THAT(out, HasSubstr("6 passed, 0 failed"));
  // One dW element changed in one case: that case fails, the tensor and element are named.
  const fs::path victim = root / "cand" / "lmhead_01_plain_fp32" / "dW.npy";
  NpyArray a = read_npy(victim.string());
  a.data[5] += 1.0;
  write_npy(victim.string(), Dtype::F64, a.shape, a.data.data(), a.data.size());
  EXPECT_EQ(run("check --case " + (root / "cases").string() + " --candidate " + (root / "cand").string() +
                    " --dtype fp32", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("dW (j=0, k=5)"));
  EXPECT_THAT(out, HasSubstr("5 passed, 1 failed"));
  EXPECT_EQ(run("gen --op softmax --out x", &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("op (softmax) must be attention or lmhead-ce"));
}

}  // namespace
}  // namespace burstlab::check
