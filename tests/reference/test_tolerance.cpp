// The §9 tolerance rule is neither too tight nor vacuous:
//   * reference<float> (a naive fp32 implementation) passes it against reference<double> on a
//     sweep of ragged lengths, N_q != N_k, d in {1, 3, 64, 128}, every value mode and mask kind
//     (with fully masked rows), GQA/MQA and both layouts;
//   * one element of O, LSE or dK perturbed by 1e-3 relative fails, and first_wrong names it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "harness.hpp"
#include "reference.hpp"
#include "testutil.hpp"
#include "tolerance.hpp"

namespace burstlab {
namespace {

using testutil::make_problem;
using ::testing::HasSubstr;

using FloatRun = testutil::RefRun<float>;

// reference<float> on the F32-rounded inputs; the backward uses its own forward O and LSE.
FloatRun run_float(const Problem& p, const Inputs& in) {
  return testutil::run_reference<float>(p, convert<float>(in.Q), convert<float>(in.K), convert<float>(in.V),
                                        convert<float>(in.dO));
}

std::vector<Metrics> check_all(const Oracle& o, const FloatRun& r) {
  return testutil::cat(check_forward<float>(o, r.O, r.LSE), check_backward<float>(o, r.dQ, r.dK, r.dV));
}

// Worst err/bound seen per (value mode, tensor), printed at the end of the sweep.
struct Worst {
  std::map<std::string, double> by_key;
  void add(const std::string& mode, const std::vector<Metrics>& ms) {
    for (const Metrics& m : ms) {
      double& w = by_key[mode + " " + m.tensor];
      w = std::max(w, m.err_bound);
    }
  }
  void print() const {
    std::printf("worst err/bound of reference<float> vs the oracle, per value mode and tensor:\n");
    for (const auto& kv : by_key) std::printf("  %-14s %.3e\n", kv.first.c_str(), kv.second);
  }
};

// One test per (N_q, N_k) so ctest can spread the sweep over cores.
class FloatSweep : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(FloatSweep, PassesTheRule) {
  const auto [N_q, N_k] = GetParam();
  const std::vector<int64_t> ds = {1, 3, 64, 128};
  const std::vector<Values> modes = {Values::Normal, Values::Large, Values::Ties, Values::WideV};
  const std::vector<std::string> masks = {"none",       "causal",      "window:16,4", "document:4",
                                          "block:16x32", "causal+document:3+block:8x8@0.7"};
  Worst worst;
  int64_t configs = 0;
  uint64_t seed = static_cast<uint64_t>(N_q * 1000 + N_k);
  for (int64_t d : ds)
    for (const std::string& mask : masks)
      for (Values mode : modes) {
        const Problem p = make_problem(1, 2, 1, N_q, N_k, d, mask, ++seed);
        const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, seed, mode);
        const Oracle o = run_oracle(p, in, true);
        const std::vector<Metrics> ms = check_all(o, run_float(p, in));
        worst.add(to_string(mode), ms);
        ++configs;
        ASSERT_TRUE(testutil::all_pass(ms, shape_string(p) + " mask=" + mask + " (" + describe(p.mask) +
                                               ") values=" + to_string(mode)));
      }
  std::printf("N_q=%lld N_k=%lld: %lld configurations\n", (long long)N_q, (long long)N_k, (long long)configs);
  worst.print();
}

INSTANTIATE_TEST_SUITE_P(Lengths, FloatSweep,
                         ::testing::Values(std::make_pair<int64_t, int64_t>(1, 1), std::make_pair<int64_t, int64_t>(1, 203),
                                           std::make_pair<int64_t, int64_t>(203, 1), std::make_pair<int64_t, int64_t>(113, 203),
                                           std::make_pair<int64_t, int64_t>(203, 113), std::make_pair<int64_t, int64_t>(113, 113)),
                         [](const ::testing::TestParamInfo<std::pair<int64_t, int64_t>>& info) {
                           return "Nq" + std::to_string(info.param.first) + "_Nk" + std::to_string(info.param.second);
                         });

// GQA / MQA / MHA, B > 1, both layouts, fully masked rows.
TEST(Tolerance, FloatReferencePassesGqaLayouts) {
  struct Heads { int64_t H_q, H_kv; };
  Worst worst;
  int64_t seed = 1000;
  for (Heads hh : {Heads{4, 2}, Heads{4, 1}, Heads{3, 3}})
    for (Layout layout : {Layout::BHSD, Layout::BSHD})
      for (const char* mask : {"none", "causal+document:5", "window:7,-1+block:13x9"})
        for (Values mode : {Values::Normal, Values::Large, Values::WideV}) {
          const Problem p = make_problem(2, hh.H_q, hh.H_kv, 37, 61, 16, mask, ++seed);
          const Inputs in = make_inputs(p, layout, Dtype::F32, seed, mode);
          const Oracle o = run_oracle(p, in, true);
          const std::vector<Metrics> ms = check_all(o, run_float(p, in));
          worst.add(to_string(mode), ms);
          ASSERT_TRUE(testutil::all_pass(ms, shape_string(p) + " layout=" + to_string(layout) +
                                                 " mask=" + std::string(mask) + " values=" + to_string(mode)));
        }
  worst.print();
}

// The oracle against itself in F64 (err 0: compare() of identical tensors, empty rows included)
// and reference<double> run on a BHSD copy of the same logical inputs (a different memory walk
// for the Eigen maps) against the BSHD oracle, under the F64 rule.
TEST(Tolerance, DoubleAgainstItself) {
  const Problem p = make_problem(2, 4, 2, 29, 41, 8, "causal+document:3");
  const Inputs in = make_inputs(p, Layout::BSHD, Dtype::F64, 7);
  const Oracle o = run_oracle(p, in, true);
  const std::vector<Metrics> ms =
      testutil::cat(check_forward<double>(o, o.O, o.LSE), check_backward<double>(o, o.dQ, o.dK, o.dV));
  testutil::expect_pass(ms);
  for (const Metrics& m : ms) {
    EXPECT_EQ(m.err_bound, 0.0) << m.tensor;
    EXPECT_EQ(m.max_abs, 0.0) << m.tensor;
    EXPECT_GT(m.checked, 0) << m.tensor;
  }
  // make_inputs of one seed gives the same logical values in both layouts (Hand.LayoutsAgree).
  const Inputs in_bhsd = make_inputs(p, Layout::BHSD, Dtype::F64, 7);
  const Oracle r = run_oracle(p, in_bhsd, true);
  ASSERT_EQ(r.O.layout, Layout::BHSD);
  const std::vector<Metrics> mr =
      testutil::cat(check_forward<double>(o, r.O, r.LSE), check_backward<double>(o, r.dQ, r.dK, r.dV));
  testutil::expect_pass(mr);
  for (const Metrics& m : mr) EXPECT_GT(m.checked, 0) << m.tensor;
  std::printf("reference<double> BHSD vs BSHD oracle:\n%s", testutil::format(mr).c_str());
}

// ---- not vacuous: perturbed outputs fail, at the right coordinates.
class Perturbed : public ::testing::Test {
 protected:
  void SetUp() override {
    p_ = make_problem(1, 2, 1, 9, 16, 3, "none");
    in_ = make_inputs(p_, Layout::BHSD, Dtype::F32, 42);
    oracle_ = run_oracle(p_, in_, true);
    run_ = run_float(p_, in_);
    testutil::expect_pass(check_all(oracle_, run_));
  }
  Problem p_;
  Inputs in_;
  Oracle oracle_;
  FloatRun run_;
};

std::string coord4(int64_t b, int64_t h, int64_t i, int64_t k) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "(b=%lld, h=%lld, i=%lld, k=%lld)", (long long)b, (long long)h, (long long)i,
                (long long)k);
  return buf;
}

// The element (row, k) of head h of b = 0 whose bound is smallest relative to |want| (the most
// sensitive one), printed with that ratio.
struct Sensitive {
  double ratio = HUGE_VAL;
  int64_t i = 0, k = 0;
};
Sensitive most_sensitive(const char* name, const char* row, const View4<const double>& want,
                         const View4<const double>& bound, int64_t h) {
  Sensitive s;
  for (int64_t i = 0; i < want.dim[2]; ++i)
    for (int64_t k = 0; k < want.dim[3]; ++k) {
      const double r = bound(0, h, i, k) / std::fabs(want(0, h, i, k));
      if (r < s.ratio) s = {r, i, k};
    }
  std::printf("%s: smallest bound/|%s| = %.3e at %s=%lld k=%lld\n", name, name, s.ratio, row, (long long)s.i,
              (long long)s.k);
  return s;
}

TEST_F(Perturbed, OneElementOfO) {
  const View4<const double> want = as_const(oracle_.O.view());
  const Sensitive m = most_sensitive("O", "i", want, as_const(oracle_.fwd.O.view()), 1);
  const int64_t bi = m.i, bk = m.k;
  ASSERT_LT(m.ratio, 1e-3);  // so the 1e-3 relative perturbation below exceeds that element's bound
  View4<float> O = run_.O.view();
  O(0, 1, bi, bk) = static_cast<float>(want(0, 1, bi, bk) * (1 + 1e-3));
  const std::vector<Metrics> ms = check_forward<float>(oracle_, run_.O, run_.LSE);
  ASSERT_EQ(ms[0].tensor, "O");
  EXPECT_EQ(ms[0].wrong, 1);
  EXPECT_GT(ms[0].err_bound, 1.0);
  EXPECT_THAT(ms[0].first_wrong, HasSubstr(coord4(0, 1, bi, bk)));
  EXPECT_TRUE(ms[1].pass());
  std::printf("%s", testutil::format(ms).c_str());
}

TEST_F(Perturbed, OneLseValue) {
  const View3<const double> want = as_const(oracle_.LSE.view());
  const int64_t i = 5;
  // |LSE| > 0.1: the 1e-3 relative perturbation is > 1e-4 absolute, above the F32 LSE bound
  // 2 [eta_i + 2 u_a |LSE_i| + tiny_a] (eq. 9.4) of this N_k = 16, d = 3 row, whose leading term
  // gamma(10 N_k + 16) = 176 u_32 = 1.05e-5 makes it ~2.5e-5 (wrong == 1 is asserted below).
  ASSERT_GT(std::fabs(want(0, 0, i)), 0.1);
  run_.LSE.view()(0, 0, i) = static_cast<float>(want(0, 0, i) * (1 + 1e-3));
  const std::vector<Metrics> ms = check_forward<float>(oracle_, run_.O, run_.LSE);
  EXPECT_TRUE(ms[0].pass());
  ASSERT_EQ(ms[1].tensor, "LSE");
  EXPECT_EQ(ms[1].wrong, 1);
  EXPECT_THAT(ms[1].first_wrong, HasSubstr("(b=0, h=0, i=5)"));
  std::printf("%s", testutil::format(ms).c_str());
}

TEST_F(Perturbed, OneDkValue) {
  const View4<const double> want = as_const(oracle_.dK.view());
  const Sensitive m = most_sensitive("dK", "j", want, as_const(oracle_.bwd.dK.view()), 0);
  const int64_t j = m.i, k = m.k;
  ASSERT_LT(m.ratio, 1e-3);  // so the 1e-3 relative perturbation below exceeds that element's bound
  run_.dK.view()(0, 0, j, k) = static_cast<float>(want(0, 0, j, k) * (1 + 1e-3));
  const std::vector<Metrics> ms = check_backward<float>(oracle_, run_.dQ, run_.dK, run_.dV);
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_TRUE(ms[0].pass());
  EXPECT_EQ(ms[1].tensor, "dK");
  EXPECT_EQ(ms[1].wrong, 1);
  EXPECT_THAT(ms[1].first_wrong, HasSubstr(coord4(0, 0, j, k)));
  EXPECT_TRUE(ms[2].pass());
  const Metrics all = combine(ms.data(), 3);
  EXPECT_EQ(all.wrong, 1);
  EXPECT_THAT(all.first_wrong, HasSubstr("dK " + coord4(0, 0, j, k)));
  std::printf("%s", testutil::format(ms).c_str());
}

// Non-finite handling (§9.3): NaN anywhere is wrong; -inf must match bitwise; +inf in place of a
// finite value is wrong; an unwritten (poisoned) element is caught.
TEST(Tolerance, NonFinite) {
  const Problem p = make_problem(1, 1, 1, 4, 4, 2, "document:2", 3);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 5);
  const Oracle o = run_oracle(p, in, false);
  int64_t empty_row = -1;
  for (int64_t i = 0; i < p.N_q; ++i)
    if (std::isinf(o.LSE.view()(0, 0, i))) empty_row = i;
  ASSERT_GE(empty_row, 0) << "make_mask(document:2) must produce an empty row";
  Tensor4<float> O = convert<float>(o.O);
  Tensor3<float> L = convert<float>(o.LSE);
  testutil::expect_pass(check_forward<float>(o, O, L));
  // +inf where -inf is expected
  L.view()(0, 0, empty_row) = HUGE_VALF;
  std::vector<Metrics> ms = check_forward<float>(o, O, L);
  EXPECT_EQ(ms[1].wrong, 1);
  EXPECT_TRUE(std::isinf(ms[1].err_bound));
  // NaN where -inf is expected; a finite value where -inf is expected
  L.view()(0, 0, empty_row) = NAN;
  EXPECT_EQ(check_forward<float>(o, O, L)[1].wrong, 1);
  L.view()(0, 0, empty_row) = -1e30f;
  EXPECT_EQ(check_forward<float>(o, O, L)[1].wrong, 1);
  L = convert<float>(o.LSE);
  // empty row O must be exactly 0
  O.view()(0, 0, empty_row, 0) = 1e-30f;
  EXPECT_EQ(check_forward<float>(o, O, L)[0].wrong, 1);
  // poisoned (never written) output
  poison(O);
  ms = check_forward<float>(o, O, L);
  EXPECT_EQ(ms[0].wrong, ms[0].checked);
  EXPECT_THAT(ms[0].first_wrong, HasSubstr("(b=0, h=0, i=0, k=0): got nan"));
}

TEST(Tolerance, BoundsArePositiveAndFinite) {
  for (Dtype t : {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16}) {
    const Problem p = make_problem(1, 2, 1, 13, 17, 4, "causal+document:3", 9);
    const Inputs in = make_inputs(p, Layout::BHSD, t, 3);
    const Oracle o = run_oracle(p, in, true);
    const View3<const double> L = o.LSE.view();
    auto check4 = [&](const Tensor4<double>& b, bool q_side, const char* name) {
      const View4<const double> v = b.view();
      for (int64_t x = 0; x < v.dim[0]; ++x)
        for (int64_t h = 0; h < v.dim[1]; ++h)
          for (int64_t n = 0; n < v.dim[2]; ++n)
            for (int64_t k = 0; k < v.dim[3]; ++k) {
              const double e = v(x, h, n, k);
              EXPECT_TRUE(std::isfinite(e)) << name;
              if (q_side && std::isinf(L(x, h, n)) && std::string(name) == "O") EXPECT_EQ(e, 0.0);
              else EXPECT_GT(e, 0.0) << name << " " << to_string(t);
            }
    };
    check4(o.fwd.O, true, "O");
    check4(o.bwd.dQ, true, "dQ");
    check4(o.bwd.dK, false, "dK");
    check4(o.bwd.dV, false, "dV");
  }
}

}  // namespace
}  // namespace burstlab
