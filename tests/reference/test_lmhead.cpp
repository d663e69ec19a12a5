// The LM head + cross-entropy oracle (spec §10) checked by itself:
//   * hand-computed tiny cases (ignore_index, label smoothing, z-loss, both reductions, V = 1,
//     all rows ignored);
//   * central finite differences in fp64 for dH and dW;
//   * the row-sum identity of dz (§10.4) seen through dW;
//   * the §10.8 rule: reference<float> passes it on a sweep of ragged N, V, d and every value
//     mode, perturbed or incomplete outputs fail it;
//   * bad input gets an Error naming the field and the value.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "burstlab/lmhead.hpp"
#include "reference_lmhead.hpp"
#include "lmhead_check.hpp"
#include "lmhead_testutil.hpp"
#include "testutil.hpp"

namespace burstlab {
namespace {

using ::testing::HasSubstr;
using namespace testutil;  // the LM head helpers (lmhead_testutil.hpp) and error_message

std::string ctx(const LmHeadProblem& p, Values v, Dtype t) {
  return shape_string(p) + " values=" + to_string(v) + " dtype=" + to_string(t);
}

struct Fwd64 {
  double L;
  std::vector<double> LSE;
};
Fwd64 fwd64(const LmHeadProblem& p, const Matrix<double>& H, const Matrix<double>& W, const std::vector<int64_t>& y) {
  Fwd64 f;
  f.LSE.assign(static_cast<size_t>(p.N), std::nan(""));
  f.L = reference::lmhead_forward<double>(p, H.view(), W.view(), y.data(), f.LSE.data());
  return f;
}

// ------------------------------------------------------------------ hand-computed
// N = 3, d = 1, V = 2: H = (1, 2, 0.5), W = (1, -1), y = (0, 1, ignored). Row i has logits
// (a, -a), a = H_i, so LSE_i = a + log1p(e^-2a), P_i = (sigma(2a), sigma(-2a)), and
// sum_j z_ij = 0 (the smoothing term vanishes from the loss but not from the gradient).
TEST(LmHeadHand, TinyCaseEveryOption) {
  const double sig2 = 1 / (1 + std::exp(-2.0)), sig4 = 1 / (1 + std::exp(-4.0));
  for (Reduction red : {Reduction::Mean, Reduction::Sum})
    for (double eps : {0.0, 0.1})
      for (double lam : {0.0, 0.01}) {
        LmHeadProblem p = lmhead_problem(3, 1, 2, eps, lam, red);
        Matrix<double> H = make_matrix<double>(3, 1), W = make_matrix<double>(2, 1);
        H.data = {1, 2, 0.5};
        W.data = {1, -1};
        const std::vector<int64_t> y = {0, 1, p.ignore_index};
        const double g = 0.7;
        const double L0 = 1 + std::log1p(std::exp(-2.0)), L1 = 2 + std::log1p(std::exp(-4.0)),
                     L2 = 0.5 + std::log1p(std::exp(-1.0));
        // eq. (10.3): l_0 = L0 - (1 - eps) * 1 + lam L0^2, l_1 = L1 - (1 - eps) * (-2) + lam L1^2
        const double l0 = L0 - (1 - eps) + lam * L0 * L0, l1 = L1 + 2 * (1 - eps) + lam * L1 * L1;
        const double w = red == Reduction::Mean ? 0.5 : 1.0;
        const Fwd64 f = fwd64(p, H, W, y);
        const std::string c = shape_string(p);
        EXPECT_NEAR(f.LSE[0], L0, 1e-15) << c;
        EXPECT_NEAR(f.LSE[1], L1, 1e-15) << c;
        EXPECT_NEAR(f.LSE[2], L2, 1e-15) << c;  // ignored rows still get their LSE
        EXPECT_NEAR(f.L, w * (l0 + l1), 1e-14) << c;
        // eq. (10.7): dz_i = c [(1 + 2 lam LSE_i) P_i - (1 - eps) e_{y_i} - eps/2]
        const double cw = g * w, q0 = cw * (1 + 2 * lam * L0), q1 = cw * (1 + 2 * lam * L1);
        const double dz00 = q0 * sig2 - cw * (1 - eps) - cw * eps / 2, dz01 = q0 * (1 - sig2) - cw * eps / 2;
        const double dz10 = q1 * sig4 - cw * eps / 2, dz11 = q1 * (1 - sig4) - cw * (1 - eps) - cw * eps / 2;
        Matrix<double> dH = make_matrix<double>(3, 1, std::nan("")), dW = make_matrix<double>(2, 1, std::nan(""));
        reference::lmhead_backward<double>(p, H.view(), W.view(), y.data(), f.LSE.data(), g, dH.view(), dW.view());
        EXPECT_NEAR(dH.data[0], dz00 - dz01, 1e-15) << c;  // dH_i = dz_i0 W_0 + dz_i1 W_1
        EXPECT_NEAR(dH.data[1], dz10 - dz11, 1e-15) << c;
        EXPECT_EQ(dH.data[2], 0.0) << c;                   // ignored row: exactly 0
        EXPECT_NEAR(dW.data[0], dz00 * 1 + dz10 * 2, 1e-15) << c;  // dW_j = sum_i dz_ij H_i
        EXPECT_NEAR(dW.data[1], dz01 * 1 + dz11 * 2, 1e-15) << c;
      }
}

TEST(LmHeadHand, AllIgnoredGivesZeroLossAndGradients) {
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    LmHeadProblem p = lmhead_problem(4, 3, 5, 0.1, 0.01, red);
    LmHeadInputs in = make_lmhead_inputs(p, Dtype::F64, 7, Values::Normal, 1.0);
    for (int64_t yi : in.y) ASSERT_EQ(yi, p.ignore_index);
    const Fwd64 f = fwd64(p, in.H, in.W, in.y);
    EXPECT_EQ(f.L, 0.0);
    for (double L : f.LSE) EXPECT_TRUE(std::isfinite(L));
    Matrix<double> dH = make_matrix<double>(4, 3, std::nan("")), dW = make_matrix<double>(5, 3, std::nan(""));
    reference::lmhead_backward<double>(p, in.H.view(), in.W.view(), in.y.data(), f.LSE.data(), 1.0, dH.view(), dW.view());
    for (double x : dH.data) EXPECT_EQ(x, 0.0);
    for (double x : dW.data) EXPECT_EQ(x, 0.0);
  }
}

// V = 1: LSE_i = z_i0 and l_i = lambda z_i0^2 whatever eps (eq. 10.3: z - (1-eps) z - eps z).
TEST(LmHeadHand, OneWordVocabulary) {
  LmHeadProblem p = lmhead_problem(3, 2, 1, 0.3, 0.5, Reduction::Sum);
  Matrix<double> H = make_matrix<double>(3, 2), W = make_matrix<double>(1, 2);
  H.data = {1, 2, -1, 0.5, 3, -2};
  W.data = {0.25, -0.5};
  const std::vector<int64_t> y = {0, 0, 0};
  const Fwd64 f = fwd64(p, H, W, y);
  const double z[3] = {0.25 - 1.0, -0.25 - 0.25, 0.75 + 1.0};
  double L = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(f.LSE[i], z[i]);
    L += 0.5 * z[i] * z[i];
  }
  EXPECT_NEAR(f.L, L, 1e-15);
}

// ------------------------------------------------------------------ finite differences
// L(H, W) by the fp64 forward; dL/dX ~ (L(X + h) - L(X - h)) / 2h, h = 1e-6: truncation ~h^2,
// cancellation ~1e-16 |L| / h ~ 1e-10 for O(1) losses, so 1e-7 relative to the gradient's scale.
constexpr double kStep = 1e-6, kRel = 1e-7;

void fd_check(const LmHeadProblem& p, LmHeadInputs in, double g) {
  const Fwd64 f = fwd64(p, in.H, in.W, in.y);
  Matrix<double> dH = make_matrix<double>(p.N, p.d), dW = make_matrix<double>(p.V, p.d);
  reference::lmhead_backward<double>(p, in.H.view(), in.W.view(), in.y.data(), f.LSE.data(), g, dH.view(), dW.view());
  for (int which = 0; which < 2; ++which) {
    Matrix<double>& X = which == 0 ? in.H : in.W;
    const Matrix<double>& grad = which == 0 ? dH : dW;
    double max_err = 0, max_g = 0;
    for (size_t e = 0; e < X.data.size(); ++e) {
      const double x0 = X.data[e];
      X.data[e] = x0 + kStep;
      const double Lp = fwd64(p, in.H, in.W, in.y).L;
      X.data[e] = x0 - kStep;
      const double Lm = fwd64(p, in.H, in.W, in.y).L;
      X.data[e] = x0;
      const double fd = g * (Lp - Lm) / (2 * kStep);  // the backward returns g dL/dX
      max_err = std::max(max_err, std::fabs(fd - grad.data[e]));
      max_g = std::max(max_g, std::fabs(grad.data[e]));
    }
    const char* name = which == 0 ? "dH" : "dW";
    std::printf("  %-70s %s max|grad| %.3e  max|fd - grad| %.3e\n", shape_string(p).c_str(), name, max_g, max_err);
    EXPECT_LE(max_err, kRel * std::max(max_g, 1.0)) << shape_string(p) << " " << name;
  }
}

TEST(LmHeadFiniteDiff, EveryOption) {
  struct C { int64_t N, d, V; double eps, lam; Reduction red; double ignored; };
  const C cases[] = {
      {5, 3, 7, 0.0, 0.0, Reduction::Mean, 0.2},   {4, 1, 1, 0.1, 0.01, Reduction::Sum, 0.0},
      {6, 4, 13, 0.2, 0.05, Reduction::Mean, 0.5}, {7, 2, 9, 0.0, 0.1, Reduction::Sum, 0.3},
      {3, 5, 2, 1.0, 0.0, Reduction::Mean, 0.0},   {1, 3, 17, 0.05, 0.0, Reduction::Mean, 0.0},
  };
  uint64_t seed = 11;
  for (const C& c : cases) {
    const LmHeadProblem p = lmhead_problem(c.N, c.d, c.V, c.eps, c.lam, c.red);
    fd_check(p, make_lmhead_inputs(p, Dtype::F64, seed++, Values::Normal, c.ignored), 1.3);
  }
}

TEST(LmHeadFiniteDiff, AllIgnoredIsFlat) {
  const LmHeadProblem p = lmhead_problem(4, 3, 6, 0.1, 0.02, Reduction::Mean);
  fd_check(p, make_lmhead_inputs(p, Dtype::F64, 5, Values::Normal, 1.0), 1.0);
}

// §10.4: every row of dz sums to 2 lambda c_i LSE_i, so sum_j dW_jk = sum_i 2 lambda c_i LSE_i H_ik.
TEST(LmHeadIdentity, RowsOfDzSumToTheZLossTerm) {
  for (double lam : {0.0, 0.03}) {
    const LmHeadProblem p = lmhead_problem(9, 4, 11, 0.1, lam, Reduction::Mean);
    const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F64, 3, Values::Normal, 0.3);
    const Fwd64 f = fwd64(p, in.H, in.W, in.y);
    Matrix<double> dH = make_matrix<double>(p.N, p.d), dW = make_matrix<double>(p.V, p.d);
    const double g = 0.9;
    reference::lmhead_backward<double>(p, in.H.view(), in.W.view(), in.y.data(), f.LSE.data(), g, dH.view(), dW.view());
    const double w = loss_weight(p, counted_rows(p, in.y.data()));
    for (int64_t k = 0; k < p.d; ++k) {
      double got = 0, want = 0, scale = 0;
      for (int64_t j = 0; j < p.V; ++j) { got += dW.data[j * p.d + k]; scale += std::fabs(dW.data[j * p.d + k]); }
      for (int64_t i = 0; i < p.N; ++i)
        if (in.y[i] != p.ignore_index) want += 2 * lam * g * w * f.LSE[i] * in.H.data[i * p.d + k];
      EXPECT_NEAR(got, want, 1e-14 * std::max(scale, 1.0)) << "lambda " << lam << " k " << k;
    }
  }
}

// ------------------------------------------------------------------ the §10.8 rule
struct FloatRun {
  float L;
  std::vector<float> LSE;
  Matrix<float> dH, dW;
};
Matrix<float> to_float(const Matrix<double>& m) {
  Matrix<float> f = make_matrix<float>(m.rows, m.cols);
  for (size_t e = 0; e < m.data.size(); ++e) f.data[e] = static_cast<float>(m.data[e]);
  return f;
}
// reference<float> on the fp32-rounded inputs; the backward reads its own LSE (§10.8).
FloatRun run_float(const LmHeadProblem& p, const LmHeadInputs& in, float g) {
  const Matrix<float> H = to_float(in.H), W = to_float(in.W);
  FloatRun r;
  r.LSE.assign(static_cast<size_t>(p.N), std::nanf(""));
  r.dH = make_matrix<float>(p.N, p.d, std::nanf(""));
  r.dW = make_matrix<float>(p.V, p.d, std::nanf(""));
  r.L = reference::lmhead_forward<float>(p, H.view(), W.view(), in.y.data(), r.LSE.data());
  reference::lmhead_backward<float>(p, H.view(), W.view(), in.y.data(), r.LSE.data(), g, r.dH.view(), r.dW.view());
  return r;
}

TEST(LmHeadTolerance, NaiveFp32PassesOnASweep) {
  struct S { int64_t N, d, V; };
  const S shapes[] = {{1, 1, 1}, {37, 3, 2}, {113, 64, 203}, {64, 1, 1000}, {113, 3, 1023}, {5, 64, 1}, {200, 16, 129}};
  std::map<std::string, double> worst;
  uint64_t seed = 1;
  for (const S& s : shapes)
    for_each_lmhead_case(s.N, s.d, s.V, Dtype::F32, seed, [&](const LmHeadProblem& p, const LmHeadInputs& in, Values v, int) {
      const double g = 1.25;
      const LmHeadOracle o = lmhead_oracle(p, in, g, true);
      const FloatRun r = run_float(p, in, float(g));
      const std::vector<Metrics> ms =
          testutil::cat(check_lmhead_forward(o, r.L, r.LSE.data()),
                        check_lmhead_backward(o, as_const(r.dH.view()), as_const(r.dW.view())));
      testutil::expect_pass(ms, ctx(p, v, Dtype::F32));
      for (const Metrics& m : ms) {
        double& w = worst[to_string(v) + " " + m.tensor];
        w = std::max(w, m.err_bound);
      }
    });
  std::printf("  naive fp32, worst err/bound per value mode and tensor:\n");
  for (const auto& [k, w] : worst) std::printf("    %-14s %.2e\n", k.c_str(), w);
}

// V = 23: the rule's relative width grows with gamma(10 V) (§10.9), 1e-3 must stand out.
TEST(LmHeadTolerance, PerturbedOrIncompleteOutputsFail) {
  const LmHeadProblem p = lmhead_problem(37, 16, 23, 0.1, 1e-3, Reduction::Mean);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F32, 4, Values::Normal, 0.2);
  const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
  FloatRun r = run_float(p, in, 1.0f);
  ASSERT_TRUE(testutil::all_pass(check_lmhead_forward(o, r.L, r.LSE.data())));
  // The loss off by 1e-3 relative.
  EXPECT_FALSE(compare_loss(r.L * (1 + 1e-3), o.L, o.bound_L).pass());
  // One LSE element off by 1e-3 relative; first_wrong names it.
  std::vector<float> LSE = r.LSE;
  LSE[17] *= 1.001f;
  const Metrics mL = compare_lse(LSE.data(), o.LSE, o.bound_LSE);
  EXPECT_EQ(mL.wrong, 1);
  EXPECT_THAT(mL.first_wrong, HasSubstr("(i=17)"));
  // One dW element off by 1e-3 of the tensor's scale (an element's own value may be a cancelled sum).
  Matrix<float> dW = r.dW;
  const int64_t j = 15, k = 3;
  float scale = 0;
  for (float x : dW.data) scale = std::max(scale, std::fabs(x));
  dW.data[j * p.d + k] += 1e-3f * scale;
  const Metrics mW = compare_matrix("dW", "j", as_const(dW.view()), o.dW, o.bound_dW);
  EXPECT_EQ(mW.wrong, 1);
  EXPECT_THAT(mW.first_wrong, HasSubstr("(j=15, k=3)"));
  // An unwritten element (NaN) fails.
  Matrix<float> dH = r.dH;
  dH.data[5] = std::nanf("");
  EXPECT_EQ(compare_matrix("dH", "i", as_const(dH.view()), o.dH, o.bound_dH).wrong, 1);
  // A gradient on an ignored row fails (bound tiny_s).
  for (int64_t i = 0; i < p.N; ++i)
    if (in.y[i] == p.ignore_index) {
      dH = r.dH;
      dH.data[i * p.d] = 1e-30f;
      EXPECT_EQ(compare_matrix("dH", "i", as_const(dH.view()), o.dH, o.bound_dH).wrong, 1);
      break;
    }
}

// A structural error (one vocabulary entry lost: the last, ragged tile one short) fails in fp64.
TEST(LmHeadTolerance, LostVocabularyEntryFailsInFp64) {
  const LmHeadProblem p = lmhead_problem(64, 8, 1000), short_p = lmhead_problem(64, 8, 999);
  LmHeadInputs in = make_lmhead_inputs(p, Dtype::F64, 9, Values::Normal, 0.0);
  for (int64_t& yi : in.y) yi = yi % 999;  // labels valid for both
  const LmHeadOracle o = lmhead_oracle(p, in, 1.0, false);
  Matrix<double> W = in.W;
  W.rows = 999;
  W.data.resize(static_cast<size_t>(999 * p.d));
  std::vector<double> LSE(static_cast<size_t>(p.N));
  const double L = reference::lmhead_forward<double>(short_p, in.H.view(), W.view(), in.y.data(), LSE.data());
  const std::vector<Metrics> ms = check_lmhead_forward(o, L, LSE.data());
  EXPECT_FALSE(ms[0].pass());
  EXPECT_EQ(ms[1].wrong, p.N);
}

// ------------------------------------------------------------------ bad input
TEST(LmHeadValidation, ErrorsNameTheFieldAndValue) {
  LmHeadProblem p = lmhead_problem(3, 2, 4);
  Matrix<double> H = make_matrix<double>(3, 2, 1.0), W = make_matrix<double>(4, 2, 1.0);
  std::vector<double> LSE(3);
  std::vector<int64_t> y = {0, 3, -100};
  auto fwd = [&](const LmHeadProblem& q, const Matrix<double>& h, const Matrix<double>& w, const int64_t* yy) {
    return error_message([&] { reference::lmhead_forward<double>(q, h.view(), w.view(), yy, LSE.data()); });
  };
  EXPECT_EQ(fwd(p, H, W, y.data()), "no error");
  EXPECT_THAT(fwd(lmhead_problem(3, 2, 0), H, W, y.data()), HasSubstr("V (0) must be >= 1"));
  EXPECT_THAT(fwd(lmhead_problem(0, 2, 4), H, W, y.data()), HasSubstr("N (0) must be >= 1"));
  EXPECT_THAT(fwd(lmhead_problem(3, 2, 4, 1.5), H, W, y.data()), HasSubstr("label_smoothing (1.5) must be in [0, 1]"));
  EXPECT_THAT(fwd(lmhead_problem(3, 2, 4, 0, -1), H, W, y.data()), HasSubstr("z_loss (-1) must be finite and >= 0"));
  EXPECT_THAT(fwd(lmhead_problem(3, 2, 4, std::nan("")), H, W, y.data()), HasSubstr("label_smoothing (nan)"));
  std::vector<int64_t> bad = {0, 4, 1};
  EXPECT_THAT(fwd(p, H, W, bad.data()), HasSubstr("y[1] (4) must be in [0, V) = [0, 4) or equal ignore_index (-100)"));
  bad = {0, 1, -1};
  EXPECT_THAT(fwd(p, H, W, bad.data()), HasSubstr("y[2] (-1)"));
  EXPECT_THAT(fwd(p, H, W, nullptr), HasSubstr("y (null)"));
  EXPECT_THAT(fwd(p, H, make_matrix<double>(5, 2, 1.0), y.data()), HasSubstr("W.dim[0] (5) must equal V (4)"));
  EXPECT_THAT(fwd(p, H, make_matrix<double>(4, 3, 1.0), y.data()), HasSubstr("W.dim[1] (3) must equal d (2)"));
  EXPECT_THAT(fwd(p, make_matrix<double>(2, 2, 1.0), W, y.data()), HasSubstr("H.dim[0] (2) must equal N (3)"));
  Matrix<double> dH = make_matrix<double>(3, 2), dW = make_matrix<double>(3, 2);
  EXPECT_THAT(error_message([&] {
                reference::lmhead_backward<double>(p, H.view(), W.view(), y.data(), LSE.data(), 1.0, dH.view(), dW.view());
              }),
              HasSubstr("dW.dim[0] (3) must equal V (4)"));
  dW = make_matrix<double>(4, 2);
  EXPECT_THAT(error_message([&] {
                reference::lmhead_backward<double>(p, H.view(), W.view(), y.data(), LSE.data(), std::nan(""), dH.view(),
                                                   dW.view());
              }),
              HasSubstr("g (nan) must be finite"));
  EXPECT_THAT(error_message([] { parse_reduction("avg"); }), HasSubstr("reduction (avg) must be mean or sum"));
  EXPECT_THAT(error_message([&] { make_lmhead_inputs(p, Dtype::F32, 1, Values::WideV); }), HasSubstr("values (widev)"));
}

}  // namespace
}  // namespace burstlab
