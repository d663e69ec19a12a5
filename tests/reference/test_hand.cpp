// Hand-computed tiny cases for the oracle (reference<double>), to ~1e-15.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "burstlab/error.hpp"
#include "harness.hpp"
#include "reference.hpp"
#include "testutil.hpp"

namespace burstlab {
namespace {

constexpr double kTol = 1e-15;  // a few ulps of O(1) values: these cases have no long sums

// All outputs of one run of reference<double> on BHSD tensors given as flat vectors.
using Outputs = testutil::RefRun<double>;
Tensor4<double> tensor(const std::vector<double>& x, int64_t B, int64_t H, int64_t N, int64_t d) {
  Tensor4<double> t = make_tensor4<double>(Layout::BHSD, B, H, N, d);
  EXPECT_EQ(t.data.size(), x.size());
  t.data = x;
  return t;
}
Outputs run(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
        const std::vector<double>& v, const std::vector<double>& dout) {
  return testutil::run_reference<double>(p, tensor(q, p.B, p.H_q, p.N_q, p.d), tensor(k, p.B, p.H_kv, p.N_k, p.d),
                                         tensor(v, p.B, p.H_kv, p.N_k, p.d), tensor(dout, p.B, p.H_q, p.N_q, p.d));
}

Problem problem(int64_t H_q, int64_t H_kv, int64_t N_q, int64_t N_k, int64_t d) {
  Problem p;
  p.H_q = H_q; p.H_kv = H_kv; p.N_q = N_q; p.N_k = N_k; p.d = d;
  return p;
}

// N_q = 1, N_k = 2, d = 1 (scale 1): q = 1, k = (1, 2), v = (3, 5), dO = 2.
// S = (1, 2); with s = sigmoid(1) = e/(1+e): P = (1 - s, s); O = 3 + 2s; LSE = 2 + log(1 + e^-1).
// D = dO O = 6 + 4s; dP = dO v = (6, 10); dS = P (dP - D) = (-4s(1-s), 4s(1-s));
// dQ = dS . k = 4s(1-s); dK = dS q = (-4s(1-s), 4s(1-s)); dV = P dO = (2(1-s), 2s).
TEST(Hand, OneQueryTwoKeys) {
  const Problem p = problem(1, 1, 1, 2, 1);
  const Outputs r = run(p, {1}, {1, 2}, {3, 5}, {2});
  const double s = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(s, 0.7310585786300049, kTol);
  EXPECT_NEAR(r.O.data[0], 3 + 2 * s, kTol);
  EXPECT_NEAR(r.O.data[0], 4.4621171572600098, 4 * kTol);
  EXPECT_NEAR(r.LSE.data[0], 2 + std::log1p(std::exp(-1.0)), kTol);
  EXPECT_NEAR(r.LSE.data[0], 2.3132616875182228, 4 * kTol);
  const double g = 4 * s * (1 - s);
  EXPECT_NEAR(r.dQ.data[0], g, kTol);
  EXPECT_NEAR(r.dK.data[0], -g, kTol);
  EXPECT_NEAR(r.dK.data[1], g, kTol);
  EXPECT_NEAR(r.dV.data[0], 2 * (1 - s), kTol);
  EXPECT_NEAR(r.dV.data[1], 2 * s, kTol);
}

// Explicit scale and d = 2: q = (1, -1), k0 = (2, 0), k1 = (0, 2), scale 0.5: S = (1, -1).
TEST(Hand, ExplicitScale) {
  Problem p = problem(1, 1, 1, 2, 2);
  p.scale = 0.5;
  const Outputs r = run(p, {1, -1}, {2, 0, 0, 2}, {1, 0, 0, 1}, {1, 1});
  const double s = 1.0 / (1.0 + std::exp(-2.0));  // P0 = e^1/(e^1 + e^-1)
  EXPECT_NEAR(r.O.data[0], s, kTol);
  EXPECT_NEAR(r.O.data[1], 1 - s, kTol);
  EXPECT_NEAR(r.LSE.data[0], std::log(std::exp(1.0) + std::exp(-1.0)), kTol);
  // dP = dO v_j = (1, 1) = D, so dS = 0 and dQ = dK = 0 exactly; dV_j = P_j dO.
  for (double x : r.dQ.data) EXPECT_NEAR(x, 0.0, kTol);
  for (double x : r.dK.data) EXPECT_NEAR(x, 0.0, kTol);
  EXPECT_NEAR(r.dV.data[0], s, kTol);
  EXPECT_NEAR(r.dV.data[3], 1 - s, kTol);
}

// Causal 2x2, d = 1: q = (1, 2), k = (1, -1), v = (10, 20), dO = (1, 1).
// Row 0 sees key 0 only: O0 = 10, LSE0 = 1 (S00 = 1), dQ0 = 0 (dS = P(dP - D) = 1 (10 - 10)).
// Row 1 sees both: S1 = (2, -2); P1 = (t, 1 - t) with t = sigmoid(4).
TEST(Hand, Causal2x2) {
  Problem p = problem(1, 1, 2, 2, 1);
  p.mask.causal = true;
  const Outputs r = run(p, {1, 2}, {1, -1}, {10, 20}, {1, 1});
  const double t = 1.0 / (1.0 + std::exp(-4.0));
  EXPECT_NEAR(r.O.data[0], 10, kTol);
  EXPECT_NEAR(r.LSE.data[0], 1, kTol);
  EXPECT_NEAR(r.O.data[1], 10 * t + 20 * (1 - t), 20 * kTol);
  EXPECT_NEAR(r.LSE.data[1], 2 + std::log1p(std::exp(-4.0)), kTol);
  EXPECT_NEAR(r.dQ.data[0], 0.0, kTol);
  // Row 1: D = O1, dP = (10, 20), dS = (t (10 - O1), (1-t)(20 - O1)) = (-10 t(1-t), 10 t(1-t)).
  const double g = 10 * t * (1 - t);
  EXPECT_NEAR(r.dQ.data[1], -g * 1 + g * -1, 20 * kTol);  // scale 1: sum_j dS_j k_j
  // dK_0 = dS_00 q0 + dS_10 q1 = 0 + (-g) 2; dK_1 = g 2 (key 1 is seen by row 1 only).
  EXPECT_NEAR(r.dK.data[0], -2 * g, 20 * kTol);
  EXPECT_NEAR(r.dK.data[1], 2 * g, 20 * kTol);
  // dV_0 = P00 + P10 = 1 + t; dV_1 = 1 - t.
  EXPECT_NEAR(r.dV.data[0], 1 + t, kTol);
  EXPECT_NEAR(r.dV.data[1], 1 - t, kTol);
}

// Bottom-right alignment, N_q = 1 < N_k = 3, causal: the one query sees every key.
// N_q = 3 > N_k = 1, causal: diag of row i is i - 2, so rows 0, 1 are empty and row 2 sees key 0.
TEST(Hand, CausalBottomRight) {
  Problem p = problem(1, 1, 3, 1, 1);
  p.mask.causal = true;
  const Outputs r = run(p, {1, 2, 3}, {1}, {7}, {1, 1, 1});
  const double ninf = -std::numeric_limits<double>::infinity();
  EXPECT_EQ(r.LSE.data[0], ninf);
  EXPECT_EQ(r.LSE.data[1], ninf);
  EXPECT_EQ(r.LSE.data[2], 3.0);
  EXPECT_EQ(r.O.data[0], 0.0);
  EXPECT_EQ(r.O.data[1], 0.0);
  EXPECT_EQ(r.O.data[2], 7.0);
  EXPECT_EQ(r.dQ.data[0], 0.0);
  EXPECT_EQ(r.dQ.data[1], 0.0);
  EXPECT_EQ(r.dQ.data[2], 0.0);  // one key: P = 1, dS = 1 (dP - D) = 0
  EXPECT_EQ(r.dV.data[0], 1.0);  // only row 2 contributes, P = 1
  Problem p2 = problem(1, 1, 1, 3, 1);
  p2.mask.causal = true;
  const Outputs r2 = run(p2, {1}, {0, 1, 2}, {1, 2, 3}, {1});
  EXPECT_NEAR(r2.LSE.data[0], std::log(1 + std::exp(1.0) + std::exp(2.0)), kTol);
}

// An empty row from the document mask: q docs (0, 1), k docs (0, 0): row 1 sees nothing.
TEST(Hand, EmptyRowDocument) {
  Problem p = problem(1, 1, 2, 2, 2);
  p.mask.q_segment = {0, 1};
  p.mask.k_segment = {0, 0};
  const Outputs r = run(p, {1, 2, 3, 4}, {1, 0, 0, 1}, {5, 6, 7, 8}, {1, -1, 2, 3});
  EXPECT_EQ(r.LSE.data[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.O.data[2], 0.0);
  EXPECT_EQ(r.O.data[3], 0.0);
  EXPECT_EQ(r.dQ.data[2], 0.0);
  EXPECT_EQ(r.dQ.data[3], 0.0);
  // Row 0 alone: scale 1/sqrt(2), S = (1, 2)/sqrt(2); dK, dV come from row 0 only.
  const double c = 1 / std::sqrt(2.0);
  const double s = 1.0 / (1.0 + std::exp(-c));  // P01
  EXPECT_NEAR(r.O.data[0], 5 * (1 - s) + 7 * s, 10 * kTol);
  EXPECT_NEAR(r.dV.data[0], 1 * (1 - s), kTol);
  EXPECT_NEAR(r.dV.data[3], -1 * s, kTol);
}

// An empty row and an empty key column from a block mask.
TEST(Hand, EmptyRowAndKeyBlock) {
  Problem p = problem(1, 1, 2, 2, 1);
  p.mask.block_q = 1;
  p.mask.block_k = 1;
  p.mask.block_mask = {1, 0, 0, 0};  // only (0, 0) visible
  const Outputs r = run(p, {1, 2}, {3, 4}, {5, 6}, {1, 1});
  EXPECT_EQ(r.O.data[0], 5.0);
  EXPECT_EQ(r.LSE.data[0], 3.0);
  EXPECT_EQ(r.O.data[1], 0.0);
  EXPECT_EQ(r.LSE.data[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.dK.data[1], 0.0);  // key 1 visible to nobody
  EXPECT_EQ(r.dV.data[1], 0.0);
  EXPECT_EQ(r.dV.data[0], 1.0);
}

// GQA: 2 q-heads share one kv-head. Each q-head equals the MHA problem on its own, and dK, dV are
// the sum of the two single-head results.
TEST(Hand, GqaTwoHeadsShareKv) {
  const Problem p = problem(2, 1, 1, 2, 1);
  // head 0: q = 1, head 1: q = -1; k = (1, 2), v = (3, 5), dO = 2 for both
  const Outputs r = run(p, {1, -1}, {1, 2}, {3, 5}, {2, 2});
  const double s0 = 1.0 / (1.0 + std::exp(-1.0));  // head 0: S = (1, 2): P = (1 - s0, s0)
  const double s1 = 1.0 / (1.0 + std::exp(1.0));   // head 1: S = (-1, -2): P = (1 - s1, s1)
  EXPECT_NEAR(r.O.data[0], 3 + 2 * s0, 4 * kTol);
  EXPECT_NEAR(r.O.data[1], 3 + 2 * s1, 4 * kTol);
  const double g0 = 4 * s0 * (1 - s0), g1 = 4 * s1 * (1 - s1);  // dS = (-g, g) per head
  EXPECT_NEAR(r.dQ.data[0], g0, kTol);
  EXPECT_NEAR(r.dQ.data[1], g1, kTol);
  // dK_j = sum_h dS_hj q_h = (-g0 + g1, g0 - g1); dV_j = sum_h P_hj dO.
  EXPECT_NEAR(r.dK.data[0], -g0 * 1 + -g1 * -1, 4 * kTol);
  EXPECT_NEAR(r.dK.data[1], g0 * 1 + g1 * -1, 4 * kTol);
  EXPECT_NEAR(r.dV.data[0], 2 * (1 - s0) + 2 * (1 - s1), 4 * kTol);
  EXPECT_NEAR(r.dV.data[1], 2 * s0 + 2 * s1, 4 * kTol);
}

// GQA against a loop of MHA problems on random inputs (H_q = 4, H_kv = 2): identical up to the
// order of the group sum, and both layouts agree.
TEST(Hand, GqaEqualsPerHeadSum) {
  Problem p = testutil::make_problem(1, 4, 2, 6, 5, 3, "causal");
  for (Layout layout : {Layout::BHSD, Layout::BSHD}) {
    const Inputs in = make_inputs(p, layout, Dtype::F64, 11);
    const Oracle o = run_oracle(p, in, true);
    Problem p1 = p;
    p1.H_q = 1;
    p1.H_kv = 1;
    for (int64_t hk = 0; hk < 2; ++hk) {
      std::vector<double> dK(5 * 3, 0.0), dV(5 * 3, 0.0);
      for (int64_t g = 0; g < 2; ++g) {
        const int64_t h = hk * 2 + g;
        Inputs one;
        one.Q = make_tensor4<double>(Layout::BHSD, 1, 1, 6, 3);
        one.dO = make_tensor4<double>(Layout::BHSD, 1, 1, 6, 3);
        one.K = make_tensor4<double>(Layout::BHSD, 1, 1, 5, 3);
        one.V = make_tensor4<double>(Layout::BHSD, 1, 1, 5, 3);
        for (int64_t i = 0; i < 6; ++i)
          for (int64_t k = 0; k < 3; ++k) {
            one.Q.f64().view()(0, 0, i, k) = in.Q.f64().view()(0, h, i, k);
            one.dO.f64().view()(0, 0, i, k) = in.dO.f64().view()(0, h, i, k);
          }
        for (int64_t j = 0; j < 5; ++j)
          for (int64_t k = 0; k < 3; ++k) {
            one.K.f64().view()(0, 0, j, k) = in.K.f64().view()(0, hk, j, k);
            one.V.f64().view()(0, 0, j, k) = in.V.f64().view()(0, hk, j, k);
          }
        const Oracle o1 = run_oracle(p1, one, true);
        for (int64_t i = 0; i < 6; ++i) {
          const double a = o.LSE.view()(0, h, i), b = o1.LSE.view()(0, 0, i);
          if (std::isinf(a) || std::isinf(b)) EXPECT_EQ(a, b);
          else EXPECT_NEAR(a, b, kTol * 4);
          for (int64_t k = 0; k < 3; ++k) {
            EXPECT_NEAR(o.O.view()(0, h, i, k), o1.O.view()(0, 0, i, k), kTol * 4);
            EXPECT_NEAR(o.dQ.view()(0, h, i, k), o1.dQ.view()(0, 0, i, k), kTol * 4);
          }
        }
        for (int64_t j = 0; j < 5; ++j)
          for (int64_t k = 0; k < 3; ++k) {
            dK[j * 3 + k] += o1.dK.view()(0, 0, j, k);
            dV[j * 3 + k] += o1.dV.view()(0, 0, j, k);
          }
      }
      for (int64_t j = 0; j < 5; ++j)
        for (int64_t k = 0; k < 3; ++k) {
          EXPECT_NEAR(o.dK.view()(0, hk, j, k), dK[j * 3 + k], kTol * 8);
          EXPECT_NEAR(o.dV.view()(0, hk, j, k), dV[j * 3 + k], kTol * 8);
        }
    }
  }
}

// BSHD and BHSD inputs of one seed hold the same logical values, and the oracle gives the same
// logical outputs for both. 1e-14: the two runs can differ only in the order of the oracle's
// sums (N_k = 9 keys, d = 5, G = 2) over N(0,1) values, gamma(9) = 1.0e-15 of O(1) magnitudes;
// a transposed or misread layout changes elements by O(1).
TEST(Hand, LayoutsAgree) {
  const Problem p = testutil::make_problem(2, 4, 2, 7, 9, 5, "window:2,1+document:2", 4);
  const Inputs a = make_inputs(p, Layout::BHSD, Dtype::F64, 3), b = make_inputs(p, Layout::BSHD, Dtype::F64, 3);
  const Oracle oa = run_oracle(p, a, true), ob = run_oracle(p, b, true);
  auto same4 = [](const Tensor4<double>& x, const Tensor4<double>& y) {
    const View4<const double> u = x.view(), v = y.view();
    for (int64_t q = 0; q < u.dim[0]; ++q)
      for (int64_t h = 0; h < u.dim[1]; ++h)
        for (int64_t n = 0; n < u.dim[2]; ++n)
          for (int64_t k = 0; k < u.dim[3]; ++k) EXPECT_NEAR(u(q, h, n, k), v(q, h, n, k), 1e-14);
  };
  same4(a.Q.f64(), b.Q.f64());
  same4(a.V.f64(), b.V.f64());
  same4(oa.O, ob.O);
  same4(oa.dQ, ob.dQ);
  same4(oa.dK, ob.dK);
  same4(oa.dV, ob.dV);
  for (size_t e = 0; e < oa.LSE.data.size(); ++e)
    if (std::isfinite(oa.LSE.data[e])) EXPECT_NEAR(oa.LSE.data[e], ob.LSE.data[e], 1e-14);
    else EXPECT_EQ(oa.LSE.data[e], ob.LSE.data[e]);
}

// Validation: the oracle names bad views.
TEST(Hand, ValidatesViews) {
  const Problem p = problem(1, 1, 2, 3, 4);
  Tensor4<double> Q = make_tensor4<double>(Layout::BHSD, 1, 1, 2, 4), K = make_tensor4<double>(Layout::BHSD, 1, 1, 3, 4);
  Tensor4<double> O = make_tensor4<double>(Layout::BHSD, 1, 1, 3, 4);  // wrong N
  Tensor3<double> L = make_tensor3<double>(1, 1, 2);
  try {
    reference::forward<double>(p, as_const(Q.view()), as_const(K.view()), as_const(K.view()), O.view(), L.view());
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("O.dim[2] (3) must equal N (2)"));
  }
  try {
    reference::forward<double>(p, as_const(K.view()), as_const(K.view()), as_const(K.view()), Q.view(), L.view());
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Q.dim[2] (3) must equal N (2)"));
  }
}

}  // namespace
}  // namespace burstlab
