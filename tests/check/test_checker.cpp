// tests/check/test_checker.cpp — case files and the checker: case.json round trip and strict
// validation, an exact copy of the oracle passes, one perturbed element fails and is named by
// its coordinates, NaN and missing tensors fail, LSE conventions (+inf empty rows, log2) are
// converted, the bound follows the candidate's dtype, and the GoogleTest helper.
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "burstlab/error.hpp"
#include "burstlab_gtest.hpp"
#include "case.hpp"
#include "npy.hpp"

using namespace burstlab;
using namespace burstlab::check;
namespace fs = std::filesystem;

namespace {

// GQA, N_q > N_k under causal (the first N_q - N_k rows are empty), BSHD, fp32 inputs.
CaseMeta small_meta() {
  CaseMeta m;
  m.name = "unit_causal_gqa";
  m.p.B = 2; m.p.H_q = 4; m.p.H_kv = 2; m.p.N_q = 23; m.p.N_k = 17; m.p.d = 8;
  m.p.mask = make_mask("causal", m.p.N_q, m.p.N_k, 5);
  m.p.scale = 1.0 / std::sqrt(8.0);
  m.layout = Layout::BSHD;
  m.dtype = Dtype::F32;
  m.seed = 11;
  m.mask_spec = "causal";
  return m;
}

Candidate exact_copy(const CaseData& c, const Expected& e) {
  Candidate k;
  k.dtype = Dtype::F32;
  k.layout = c.meta.layout;
  k.O = e.O; k.LSE = e.LSE; k.dQ = e.dQ; k.dK = e.dK; k.dV = e.dV;
  k.has_O = k.has_LSE = k.has_dQ = k.has_dK = k.has_dV = true;
  return k;
}

std::string tmpdir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "h7_check_" + name;
  fs::remove_all(d);
  return d;
}

void expect_json_error(const std::string& text, const std::string& what) {
  try {
    parse_case_json(text, "case.json");
    ADD_FAILURE() << "no error; expected '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("case.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what() << "\nexpected: " << what;
  }
}

}  // namespace

TEST(CaseFile, JsonRoundTripKeepsEveryField) {
  CaseMeta m = small_meta();
  m.p.mask = make_mask("window:3,1+document:3+block:4x8@0.5", m.p.N_q, m.p.N_k, 9);
  const CaseMeta back = parse_case_json(case_json(m), "case.json");
  EXPECT_EQ(back.name, m.name);
  EXPECT_EQ(back.p.B, 2); EXPECT_EQ(back.p.H_q, 4); EXPECT_EQ(back.p.H_kv, 2);
  EXPECT_EQ(back.p.N_q, 23); EXPECT_EQ(back.p.N_k, 17); EXPECT_EQ(back.p.d, 8);
  EXPECT_EQ(*back.p.scale, *m.p.scale);
  EXPECT_EQ(back.p.mask.window_left, 3);
  EXPECT_EQ(back.p.mask.q_segment, m.p.mask.q_segment);
  EXPECT_EQ(back.p.mask.k_segment, m.p.mask.k_segment);
  EXPECT_EQ(back.p.mask.block_mask, m.p.mask.block_mask);
  EXPECT_EQ(back.layout, Layout::BSHD);
  EXPECT_EQ(back.dtype, Dtype::F32);
  EXPECT_EQ(back.seed, 11u);
}

TEST(CaseFile, StrictJsonErrorsNameTheField) {
  const nlohmann::json good = nlohmann::json::parse(case_json(small_meta()));
  auto with = [&](const char* key, nlohmann::json v) { nlohmann::json j = good; j[key] = v; return j.dump(); };
  auto without = [&](const char* key) { nlohmann::json j = good; j.erase(key); return j.dump(); };
  expect_json_error("{not json", "invalid JSON");
  expect_json_error("[1, 2]", "must hold a JSON object");
  expect_json_error(without("N_q"), "missing field 'N_q'");
  expect_json_error(with("N_q", "23"), "field 'N_q' must be an integer");
  expect_json_error(with("N_q", 0), "field 'N_q' (0) must be in [1, ");
  expect_json_error(with("d", 1.5), "field 'd' must be an integer");
  expect_json_error(with("B", 18446744073709551615ull), "field 'B' (18446744073709551615) must be in");
  expect_json_error(with("H_kv", 3), "H_q (4) must be a multiple of H_kv (3)");
  expect_json_error(with("layout", "SBHD"), "layout");
  expect_json_error(with("dtype", "int8"), "int8");
  expect_json_error(with("surprise", 1), "unknown field 'surprise'");
  expect_json_error(with("version", 2), "version (2) is not supported");
  expect_json_error(with("seed", -1), "field 'seed' must be a non-negative integer");
  nlohmann::json j = good;
  j["mask"]["q_segment"] = {0, 1};
  expect_json_error(j.dump(), "q_segment");
  j = good;
  j["mask"]["block_mask"] = {0, 2};
  expect_json_error(j.dump(), "block_mask[1] (2) must be an integer in [0, 1]");
  j = good;
  j["mask"].erase("causal");
  expect_json_error(j.dump(), "missing field 'causal'");
}

TEST(CaseFile, WriteReadRoundTripAndShapeErrors) {
  const CaseData c = make_case(small_meta());
  const std::string dir = tmpdir("rt");
  write_case(dir, c);
  write_expected(dir, c, compute_expected(c));
  const CaseData back = read_case(dir);
  EXPECT_EQ(back.in.Q.f64().data, c.in.Q.f64().data);
  EXPECT_EQ(back.in.K.f64().data, c.in.K.f64().data);
  EXPECT_EQ(back.in.dO.f64().data, c.in.dO.f64().data);
  const Expected e = read_expected(dir, back.meta);
  EXPECT_EQ(e.LSE.data, compute_expected(c).LSE.data);
  // q.npy of the wrong shape / dtype: the file and the problem are named.
  const std::vector<double> v(2 * 23 * 4 * 7, 0.5);
  write_npy(dir + "/q.npy", Dtype::F32, {2, 23, 4, 7}, v.data(), v.size());
  try { read_case(dir); ADD_FAILURE(); } catch (const Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("q.npy: shape (2, 23, 4, 7) must be (2, 23, 4, 8)"), std::string::npos) << ex.what();
  }
  const std::vector<double> w(2 * 23 * 4 * 8, 0.5);
  write_npy(dir + "/q.npy", Dtype::F64, {2, 23, 4, 8}, w.data(), w.size());
  try { read_case(dir); ADD_FAILURE(); } catch (const Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("q.npy: dtype fp64 must be the case's dtype fp32"), std::string::npos) << ex.what();
  }
}

TEST(Checker, ExactCopyPassesAndOnePerturbedElementIsNamed) {
  const CaseData c = make_case(small_meta());
  const Expected e = compute_expected(c);
  const Candidate k = exact_copy(c, e);
  for (Dtype t : {Dtype::F64, Dtype::F32, Dtype::BF16}) {
    const CheckResult r = check_candidate(c, e, k, t);
    EXPECT_TRUE(r.pass()) << format_check(r);
    EXPECT_EQ(r.tensors.size(), 5u);
    EXPECT_EQ(r.worst_err_bound(), 0.0);
  }
  // dV of kv-head 1, key 5, feature 2, batch 1: stored BSHD.
  for (const char* which : {"dV", "O"}) {
    Candidate bad = k;
    Tensor4<double>& x = std::string(which) == "dV" ? bad.dV : bad.O;
    double& el = x.view()(1, 1, 5, 2);
    // 1e-3 (1 + |x|): ~20x or more above the F32 bound of this small case (eq. 9.3, 9.8: about
    // 4 eta relative, eta ~ gamma(10 N_k + 16) = 186 u_32 = 1.1e-5); err/bound > 1 is asserted.
    el += 1e-3 * (1 + std::fabs(el));
    const CheckResult r = check_candidate(c, e, bad, Dtype::F32);
    EXPECT_FALSE(r.pass());
    int failed = 0;
    for (const TensorCheck& t : r.tensors) {
      if (t.pass()) continue;
      ++failed;
      EXPECT_EQ(t.m.tensor, which);
      EXPECT_EQ(t.m.wrong, 1);
      ASSERT_EQ(t.mismatches.size(), 1u);
      const std::string want = std::string(which) == "dV" ? "(b=1, h=1, j=5, k=2)" : "(b=1, h=1, i=5, k=2)";
      EXPECT_EQ(t.mismatches[0].rfind(want, 0), 0u) << t.mismatches[0];
      EXPECT_GT(t.m.err_bound, 1.0);
    }
    EXPECT_EQ(failed, 1);
    EXPECT_NE(format_check(r).find("FAIL"), std::string::npos);
  }
}

TEST(Checker, BoundFollowsTheCandidateDtype) {
  const CaseData c = make_case(small_meta());
  const Expected e = compute_expected(c);
  Candidate k = exact_copy(c, e);
  // A perturbation of ~1e-4 relative is inside the bf16 bound and outside the fp64 bound.
  for (double& x : k.O.data) x *= 1 + 1e-4;
  EXPECT_TRUE(check_candidate(c, e, k, Dtype::BF16).tensors[0].pass());
  EXPECT_FALSE(check_candidate(c, e, k, Dtype::F64).tensors[0].pass());
}

TEST(Checker, NanMissingAndEmptyRows) {
  const CaseData c = make_case(small_meta());
  const Expected e = compute_expected(c);
  Candidate k = exact_copy(c, e);
  k.dQ.data[3] = std::nan("");
  k.has_LSE = false;
  const CheckResult r = check_candidate(c, e, k, Dtype::F32);
  EXPECT_FALSE(r.tensors[1].pass());
  EXPECT_TRUE(r.tensors[1].missing);
  EXPECT_FALSE(r.tensors[2].pass());
  EXPECT_TRUE(std::isinf(r.worst_err_bound()));
  // Empty rows (i < N_q - N_k under causal) must hold LSE = -inf: a finite value there is wrong.
  Candidate z = exact_copy(c, e);
  ASSERT_TRUE(std::isinf(e.LSE.view()(0, 0, 0)));
  z.LSE.view()(0, 0, 0) = 0.0;
  const CheckResult rz = check_candidate(c, e, z, Dtype::F32);
  EXPECT_FALSE(rz.tensors[1].pass());
  EXPECT_EQ(rz.tensors[1].mismatches.at(0).rfind("(b=0, h=0, i=0)", 0), 0u) << rz.tensors[1].mismatches[0];
}

TEST(Checker, LseConventionsAreConverted) {
  const CaseData c = make_case(small_meta());
  const Expected e = compute_expected(c);
  const std::string dir = tmpdir("conv");
  write_case(dir, c);
  write_expected(dir, c, e);
  const std::string cand = dir + "/cand";
  fs::create_directories(cand);
  // Candidate in fp32 with +inf on empty rows and LSE in log2 units.
  Tensor3<double> L2 = e.LSE;
  for (double& x : L2.data) x = std::isinf(x) ? HUGE_VAL : x / std::log(2.0);
  auto save4 = [&](const char* f, const Tensor4<double>& x) {
    write_npy(cand + "/" + f, Dtype::F32, {x.B, x.N, x.H, x.d}, x.data.data(), x.data.size());
  };
  save4("O.npy", e.O); save4("dQ.npy", e.dQ); save4("dK.npy", e.dK); save4("dV.npy", e.dV);
  write_npy(cand + "/LSE.npy", Dtype::F32, {L2.B, L2.H, L2.N}, L2.data.data(), L2.data.size());
  const CaseData rc = read_case(dir);
  const Expected re = read_expected(dir, rc.meta);
  // Without conversion the LSE fails; with flags, or with candidate.json, it passes.
  const CheckResult plain = check_candidate(rc, re, read_candidate(cand, rc.meta, {}), Dtype::F32);
  EXPECT_FALSE(plain.tensors[1].pass());
  EXPECT_TRUE(plain.tensors[0].pass()) << format_check(plain);
  CandidateMeta flags;
  flags.conv.empty_lse_pos_inf = flags.conv.lse_log2 = true;
  const Candidate kf = read_candidate(cand, rc.meta, flags);
  EXPECT_EQ(kf.dtype, Dtype::F32);
  const CheckResult conv = check_candidate(rc, re, kf, kf.dtype);
  EXPECT_TRUE(conv.pass()) << format_check(conv);
  write_file(cand + "/candidate.json", R"({"lse_empty": "+inf", "lse_base": "2"})");
  EXPECT_TRUE(check_candidate(rc, re, read_candidate(cand, rc.meta, {}), Dtype::F32).pass());
  write_file(cand + "/candidate.json", R"({"lse_empty": "zero"})");
  EXPECT_THROW(read_candidate(cand, rc.meta, {}), Error);
}

TEST(Checker, GTestHelperPassesAndFailsWithCoordinates) {
  const CaseData c = make_case(small_meta());
  const Expected e = compute_expected(c);
  const Candidate k = exact_copy(c, e);
  BURSTLAB_EXPECT_CONFORMS(c, e, k, Dtype::F32);
  Candidate bad = k;
  bad.dK.view()(0, 1, 3, 4) += 0.5;
  EXPECT_NONFATAL_FAILURE(BURSTLAB_EXPECT_CONFORMS(c, e, bad, Dtype::F32), "dK (b=0, h=1, j=3, k=4)");
}

TEST(Suite, CoversTheCuratedKindsDeterministically) {
  const auto full = suite(false, Dtype::F32), quick = suite(true, Dtype::BF16);
  EXPECT_GT(full.size(), quick.size());
  bool mqa = false, gqa = false, nq_gt = false, nq_lt = false, d1 = false, d256 = false, bshd = false, bhsd = false,
       large = false, ties = false, doc = false, block = false, window = false, causal = false;
  for (const CaseMeta& m : full) {
    mqa |= m.p.H_kv == 1 && m.p.H_q > 1;
    gqa |= m.p.H_kv > 1 && m.p.H_q > m.p.H_kv;
    nq_gt |= m.p.N_q > m.p.N_k;
    nq_lt |= m.p.N_q < m.p.N_k;
    d1 |= m.p.d == 1;
    d256 |= m.p.d == 256;
    bshd |= m.layout == Layout::BSHD;
    bhsd |= m.layout == Layout::BHSD;
    large |= m.values == Values::Large;
    ties |= m.values == Values::Ties;
    doc |= has_document(m.p.mask);
    block |= has_block(m.p.mask);
    window |= m.p.mask.window_left >= 0;
    causal |= m.p.mask.causal;
  }
  EXPECT_TRUE(mqa && gqa && nq_gt && nq_lt && d1 && d256 && bshd && bhsd && large && ties && doc && block && window && causal);
  EXPECT_EQ(case_json(suite(true, Dtype::F32)[3]), case_json(suite(true, Dtype::F32)[3]));
  EXPECT_EQ(quick[0].dtype, Dtype::BF16);
  // Fully masked rows exist in the quick set (causal with N_q > N_k).
  const CaseData c = make_case(suite(true, Dtype::F32)[2]);
  const Expected e = compute_expected(c);
  int empty = 0;
  for (double x : e.LSE.data) empty += std::isinf(x);
  EXPECT_GT(empty, 0);
}

namespace {

// Inputs of 2^20 elements per tensor (scanned on threads) with Q's values at `bad` set to inf
// or NaN; require_valid_inputs must name the first of them in (b, h, i, k) order.
std::string first_bad_message(const std::vector<std::pair<std::array<int64_t, 4>, double>>& bad) {
  Problem p;
  p.B = 1; p.H_q = 2; p.H_kv = 2; p.N_q = 4096; p.N_k = 4096; p.d = 128;
  p.mask = make_mask("causal", p.N_q, p.N_k, 1);
  p.scale = 1.0 / std::sqrt(128.0);
  Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 2, Values::Normal);
  Tensor4<float> Q = in.Q.as<float>();
  for (const auto& [at, v] : bad) Q.view()(at[0], at[1], at[2], at[3]) = static_cast<float>(v);
  in.Q = Q;
  static const char* const names[4] = {"Q", "K", "V", "dO"};
  try {
    require_valid_inputs(p, in, true, "", names, "scale");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ValidInputs, TheFirstNonFiniteElementOfALargeTensorIsNamed) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  auto names = [](const std::string& msg, const std::string& want) {
    return msg.find(want) != std::string::npos ? ::testing::AssertionSuccess()
                                                : ::testing::AssertionFailure() << "'" << msg << "' lacks '" << want << "'";
  };
  // A later head's first row (another thread's first) and a late row of head 0: head 0's.
  EXPECT_TRUE(names(first_bad_message({{{0, 1, 0, 0}, inf}, {{0, 0, 4000, 5}, nan}}),
                    "Q holds nan at (b=0, h=0, i=4000, k=5)"));
  // Two in one row: the smaller k.
  EXPECT_TRUE(names(first_bad_message({{{0, 0, 10, 7}, inf}, {{0, 0, 10, 3}, -inf}, {{0, 1, 4095, 127}, nan}}),
                    "Q holds -inf at (b=0, h=0, i=10, k=3)"));
  EXPECT_TRUE(names(first_bad_message({{{0, 1, 4095, 127}, nan}}), "Q holds nan at (b=0, h=1, i=4095, k=127)"));
  EXPECT_EQ(first_bad_message({}), "");
}
