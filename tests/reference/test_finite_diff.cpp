// The oracle's backward (eq. 5.1-5.7) against central finite differences of its own forward, in
// double, on every mask kind and GQA. Loss L = sum(dO o O); dL/dX ~ (L(X + h) - L(X - h)) / 2h.
// With h = 1e-6 and O(1) values the truncation error is ~h^2 = 1e-12 and the cancellation error
// ~eps |L| / h ~ 1e-9, so agreement to ~1e-7 relative to the gradient's scale is expected.
// Also: dLSE_i/dQ_i = scale sum_j P_ij K_j, i.e. the forward with V := K (LSE consistency).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "harness.hpp"
#include "reference.hpp"
#include "testutil.hpp"

namespace burstlab {
namespace {

constexpr double kStep = 1e-6;
constexpr double kRel = 1e-7;  // see the header comment

struct Case {
  std::string mask;
  int64_t B, H_q, H_kv, N_q, N_k, d;
};

double loss(const Problem& p, const Inputs& in) {
  Tensor4<double> O = make_tensor4<double>(in.Q.layout(), p.B, p.H_q, p.N_q, p.d);
  Tensor3<double> L = make_tensor3<double>(p.B, p.H_q, p.N_q);
  reference::forward<double>(p, as_const(in.Q.f64().view()), as_const(in.K.f64().view()), as_const(in.V.f64().view()), O.view(), L.view());
  double s = 0;
  for (size_t e = 0; e < O.data.size(); ++e) s += in.dO.f64().data[e] * O.data[e];  // same layout
  return s;
}

// Max |fd - analytic| over the tensor, and max |analytic|.
void check_tensor(const char* name, const Problem& p, Inputs in, AnyTensor4 Inputs::*which,
                  const Tensor4<double>& grad, const std::string& ctx) {
  Tensor4<double>& X = (in.*which).f64();
  double max_err = 0, max_g = 0;
  size_t worst = 0;
  for (size_t e = 0; e < X.data.size(); ++e) {
    const double x0 = X.data[e];
    X.data[e] = x0 + kStep;
    const double Lp = loss(p, in);
    X.data[e] = x0 - kStep;
    const double Lm = loss(p, in);
    X.data[e] = x0;
    const double fd = (Lp - Lm) / (2 * kStep);
    const double err = std::fabs(fd - grad.data[e]);  // grad has X's layout (run_oracle)
    if (err > max_err) { max_err = err; worst = e; }
    max_g = std::max(max_g, std::fabs(grad.data[e]));
  }
  std::printf("  %-38s %-3s max|grad| %.3e  max|fd - grad| %.3e  rel %.2e\n", ctx.c_str(), name, max_g,
              max_err, max_err / std::max(max_g, 1e-300));
  EXPECT_LE(max_err, kRel * std::max(max_g, 1.0)) << ctx << " " << name << " flat element " << worst;
}

class FiniteDiff : public ::testing::TestWithParam<Case> {};

TEST_P(FiniteDiff, Gradients) {
  const Case c = GetParam();
  const Problem p = testutil::make_problem(c.B, c.H_q, c.H_kv, c.N_q, c.N_k, c.d, c.mask, 17);
  const Inputs in = make_inputs(p, Layout::BSHD, Dtype::F64, 23);
  const Oracle o = run_oracle(p, in, true);
  const std::string ctx = c.mask + " " + describe(p.mask);
  check_tensor("dQ", p, in, &Inputs::Q, o.dQ, ctx);
  check_tensor("dK", p, in, &Inputs::K, o.dK, ctx);
  check_tensor("dV", p, in, &Inputs::V, o.dV, ctx);
  // Gradients of positions no one sees are exactly zero: rows with LSE = -inf.
  const View3<const double> L = o.LSE.view();
  const View4<const double> dQ = o.dQ.view();
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H_q; ++h)
      for (int64_t i = 0; i < p.N_q; ++i)
        if (std::isinf(L(b, h, i))) {
          for (int64_t k = 0; k < p.d; ++k) EXPECT_EQ(dQ(b, h, i, k), 0.0);
        }
}

INSTANTIATE_TEST_SUITE_P(
    Masks, FiniteDiff,
    ::testing::Values(Case{"none", 1, 2, 1, 7, 9, 3}, Case{"causal", 1, 2, 1, 7, 9, 3},
                      Case{"causal", 1, 1, 1, 9, 5, 3}, Case{"window:2,1", 1, 2, 1, 8, 6, 3},
                      Case{"window:-1,0", 1, 1, 1, 5, 8, 3}, Case{"document:3", 1, 2, 1, 9, 7, 3},
                      Case{"block:2x3", 1, 2, 1, 7, 9, 3},
                      Case{"causal+document:2+block:3x2@0.8", 2, 2, 1, 8, 9, 3},
                      Case{"none", 2, 4, 2, 6, 7, 3}, Case{"window:1,2+document:2", 1, 4, 2, 9, 8, 3},
                      Case{"causal", 1, 4, 1, 5, 6, 3}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return testutil::param_name(std::to_string(info.index) + "_" + info.param.mask + "_Hq" +
                                  std::to_string(info.param.H_q) + "_Hkv" + std::to_string(info.param.H_kv));
    });

// dLSE_i / dQ_ik = scale sum_j P_ij K_jk = scale * (forward with V := K)_ik.
TEST(FiniteDiffLse, MatchesSoftmaxWeightedKeys) {
  for (const std::string mask : {"none", "causal+document:3", "window:1,1+block:2x2"}) {
    const Problem p = testutil::make_problem(1, 2, 1, 7, 8, 3, mask, 5);
    Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 29);
    Tensor4<double> PK = make_tensor4<double>(Layout::BHSD, p.B, p.H_q, p.N_q, p.d);
    Tensor3<double> L0 = make_tensor3<double>(p.B, p.H_q, p.N_q);
    reference::forward<double>(p, as_const(in.Q.f64().view()), as_const(in.K.f64().view()), as_const(in.K.f64().view()), PK.view(), L0.view());
    const double scale = scale_of(p);
    Tensor4<double> O = make_tensor4<double>(Layout::BHSD, p.B, p.H_q, p.N_q, p.d);
    Tensor3<double> Lp = L0, Lm = L0;
    double max_err = 0;
    for (size_t e = 0; e < in.Q.f64().data.size(); ++e) {
      const size_t row = e / p.d;  // BHSD: flat row index (b, h, i)
      if (std::isinf(L0.data[row])) continue;
      const double x0 = in.Q.f64().data[e];
      in.Q.f64().data[e] = x0 + kStep;
      reference::forward<double>(p, as_const(in.Q.f64().view()), as_const(in.K.f64().view()), as_const(in.V.f64().view()), O.view(), Lp.view());
      in.Q.f64().data[e] = x0 - kStep;
      reference::forward<double>(p, as_const(in.Q.f64().view()), as_const(in.K.f64().view()), as_const(in.V.f64().view()), O.view(), Lm.view());
      in.Q.f64().data[e] = x0;
      const double fd = (Lp.data[row] - Lm.data[row]) / (2 * kStep);
      max_err = std::max(max_err, std::fabs(fd - scale * PK.data[e]));
    }
    std::printf("  LSE %-30s max|fd - scale P K| %.3e\n", mask.c_str(), max_err);
    EXPECT_LE(max_err, kRel);
  }
}

}  // namespace
}  // namespace burstlab
