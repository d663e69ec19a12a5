// reference/lmhead_check.cpp — seeded inputs, the oracle and the tolerance rule of the LM head +
// cross-entropy (spec §10.8), implemented once. Bounds are computed in double, per row chunk, from
// the candidate's (rounded) inputs and the oracle's LSE; the safety factor is §9.4's kRuleSafety.
#include "lmhead_check.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <random>

#include "burstlab/error.hpp"
#include "eigen_views.hpp"
#include "reference_lmhead.hpp"
#include "streams.hpp"

namespace burstlab {
namespace {

using MatD = reference::eigen::Mat<double>;
using ConstMapD = reference::eigen::ConstMap<double>;
using reference::eigen::map;
using reference::stream;

constexpr double kSafety = kRuleSafety;
// Rows per chunk of the bounds: four (chunk, V) fp64 matrices live at once (256 rows, V = 128K:
// 1 GiB); small enough to leave room for the oracle's own (N, V) logits.
constexpr int64_t kChunk = 256;

// Streams of their own (reference/streams.hpp), apart from the attention harness's ids.
enum StreamId : uint64_t { kH = 101, kW = 102, kY = 103 };

template <class Draw>
void fill(Matrix<double>& m, Dtype dtype, std::mt19937_64& rng, Draw draw) {
  for (double& x : m.data) {
    do { x = round_to(dtype, draw(rng)); } while (x == 0.0 || !std::isfinite(x));  // never zeros (§9.5)
  }
}

}  // namespace

LmHeadInputs make_lmhead_inputs(const LmHeadProblem& p, Dtype dtype, uint64_t seed, Values values, double ignored) {
  validate(p);
  if (values == Values::WideV) fail("values (widev) does not apply to the LM head; use normal, large or ties");
  if (!(ignored >= 0 && ignored <= 1)) fail("ignored fraction (", ignored, ") must be in [0, 1]");
  LmHeadInputs in;
  in.dtype = dtype;
  in.H = make_matrix<double>(p.N, p.d);
  in.W = make_matrix<double>(p.V, p.d);
  std::mt19937_64 rH = stream(seed, kH), rW = stream(seed, kW), rY = stream(seed, kY);
  std::normal_distribution<double> nd(0.0, 1.0);
  const double inv_sqrt_d = 1.0 / std::sqrt(double(p.d));
  if (values == Values::Ties) {
    auto tie = [](std::mt19937_64& r) {
      static const double v[3] = {-1.0, 0.5, 1.0};
      return v[std::uniform_int_distribution<int>(0, 2)(r)];
    };
    fill(in.H, dtype, rH, tie);
    fill(in.W, dtype, rW, tie);
  } else {
    // Large: H ~ c N(0,1), W ~ c N(0,1) / sqrt(d), c^2 = 1.5e4, so z ~ 1.5e4 N(0, 1): the median |z|
    // is ~1e4 (|N(0,1)| has median 0.67), and H stays far below fp16's 65504.
    const double c = values == Values::Large ? std::sqrt(1.5e4) : 1.0;
    fill(in.H, dtype, rH, [&](std::mt19937_64& r) { return c * nd(r); });
    fill(in.W, dtype, rW, [&](std::mt19937_64& r) { return c * inv_sqrt_d * nd(r); });
  }
  in.y.resize(static_cast<size_t>(p.N));
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uniform_int_distribution<int64_t> label(0, p.V - 1);
  for (int64_t& yi : in.y) {
    const bool skip = u01(rY) < ignored;
    const int64_t l = label(rY);  // drawn either way: the labels do not shift with `ignored`
    yi = skip ? p.ignore_index : l;
  }
  return in;
}

void lmhead_bounds(const LmHeadProblem& p, Dtype dtype, View2<const double> H, View2<const double> W,
                   const int64_t* y, const double* LSE, double g, bool backward, LmHeadOracle& out) {
  validate_lmhead_forward(p, H, W, y, LSE);
  const RuleConstants c = rule_constants(dtype);
  const int64_t N = p.N, V = p.V, d = p.d;
  const double eps = p.label_smoothing, lam = p.z_loss;
  const int64_t n_R = counted_rows(p, y);
  const double w = loss_weight(p, n_R);
  const double ac = std::fabs(g * w);  // |c_i| on the counted rows (eq. 10.5)
  const ConstMapD Hm = map(H), Wm = map(W);
  const MatD absW = Wm.cwiseAbs();                                 // (V, d)
  const Eigen::RowVectorXd maxW = absW.colwise().maxCoeff();      // (d): max_j |W_jk|
  const double g_d = c.gamma(double(d)), g_d2 = c.gamma(double(d) + 2), g_Vd = c.gamma(double(V + d));
  const double g_sum = c.gamma(10.0 * double(V) + 16), g_5 = c.gamma(5), g_4 = c.gamma(4);
  const double g_V2 = c.gamma(double(V) + 2), g_R = c.gamma(double(n_R) + 2);

  out.dtype = dtype;
  out.bound_LSE.assign(static_cast<size_t>(N), 0.0);
  MatD sumEH, sumDH;                                 // (V, d): sum_i E_ij |H_ik|, sum_i |dz|+_ij |H_ik|
  Eigen::RowVectorXd floorH = Eigen::RowVectorXd::Zero(d);  // max_{i in R} |c_i| (1 + 2 lam |LSE_i|) |H_ik|
  if (backward) {
    out.bound_dH = make_matrix<double>(N, d);
    out.bound_dW = make_matrix<double>(V, d);
    out.bound_dW_round = make_matrix<double>(V, d);
    sumEH = MatD::Zero(V, d);
    sumDH = MatD::Zero(V, d);
  }
  double sum_err = 0;  // sum_{i in R} ( err(l_i) + gamma(n_R + 2) |l_i| )
  for (int64_t i0 = 0; i0 < N; i0 += kChunk) {
    const int64_t rows = std::min(kChunk, N - i0);
    const MatD Hc = Hm.middleRows(i0, rows);
    const MatD absH = Hc.cwiseAbs();
    const MatD Z = Hc * Wm.transpose();    // z (rows, V), eq. (10.1)
    const MatD A = absH * absW.transpose();  // a_ij (rows, V), eq. (10.12)
    MatD E, Dp;                            // E_ij, |dz|+_ij (rows, V)
    if (backward) {
      E = MatD::Zero(rows, V);
      Dp = MatD::Zero(rows, V);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      const double a_i = A.row(r).maxCoeff(), abar_i = A.row(r).sum() / double(V);
      const double L = LSE[i];
      const double eta = 2 * g_d2 * a_i + g_sum;       // eq. (10.13)
      const double e_i = eta + 2 * c.u_a * std::fabs(L);  // eq. (10.14)
      out.bound_LSE[i] = kSafety * (e_i + c.tiny_a);
      if (y[i] == p.ignore_index) continue;
      const int64_t t = y[i];
      const double zsum = Z.row(r).sum();
      const double l_i = L - (1 - eps) * Z(r, t) - eps / double(V) * zsum + lam * L * L;  // eq. (10.3)
      const double M_i = std::fabs(L) + (1 - eps) * std::fabs(Z(r, t)) + eps / double(V) * std::fabs(zsum) + lam * L * L;
      // eq. (10.15)
      const double err = (1 + 2 * lam * std::fabs(L)) * e_i + (1 - eps) * g_d * A(r, t) + eps * g_Vd * abar_i + g_5 * M_i;
      sum_err += err + g_R * std::fabs(l_i);
      if (!backward) continue;
      const double coef = 1 + 2 * lam * std::fabs(L);
      const double pi = 2 * eta + 2 * c.u_a * std::fabs(L);  // eq. (10.17)
      const double eP = ac * (coef * (pi + g_4) + 2 * lam * e_i);
      for (int64_t j = 0; j < V; ++j) {
        const double P = std::exp(Z(r, j) - L);
        const double dp = ac * (coef * P + eps / double(V) + (j == t ? 1 - eps : 0.0));  // eq. (10.18)
        Dp(r, j) = dp;
        E(r, j) = eP * P + (g_4 + c.u_P) * dp;  // eq. (10.19)
      }
      floorH = floorH.cwiseMax(ac * coef * absH.row(r));
    }
    if (!backward) continue;
    const MatD BE = E * absW, BD = Dp * absW;  // (rows, d)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      for (int64_t k = 0; k < d; ++k) {
        double& b = out.bound_dH.data[static_cast<size_t>(i * d + k)];
        if (y[i] == p.ignore_index) { b = c.tiny_s; continue; }  // exact zero expected
        const double coef = 1 + 2 * lam * std::fabs(LSE[i]);
        // eq. (10.20)
        b = kSafety * (BE(r, k) + (g_V2 + c.u_s) * BD(r, k) + double(V) * c.tiny_a * ac * coef * maxW(k) + c.tiny_s);
      }
    }
    sumEH.noalias() += E.transpose() * absH;
    sumDH.noalias() += Dp.transpose() * absH;
  }
  out.bound_L = kSafety * (w * sum_err + c.tiny_a);  // eq. (10.16)
  if (!backward) return;
  for (int64_t j = 0; j < V; ++j)
    for (int64_t k = 0; k < d; ++k) {  // eq. (10.21) with r_W = 1; n_R = 0: dW = 0 exactly
      const size_t e = static_cast<size_t>(j * d + k);
      out.bound_dW.data[e] =
          n_R == 0 ? c.tiny_s
                   : kSafety * (sumEH(j, k) + (g_R + c.u_s) * sumDH(j, k) + double(n_R) * c.tiny_a * floorH(k) + c.tiny_s);
      out.bound_dW_round.data[e] = n_R == 0 ? 0.0 : kSafety * c.u_s * sumDH(j, k);
    }
}

Matrix<double> dW_bound(const LmHeadOracle& o, int64_t r_W) {
  if (r_W < 1) fail("dW_roundings (", r_W, ") must be >= 1");
  Matrix<double> b = o.bound_dW;
  if (r_W > 1)
    for (size_t e = 0; e < b.data.size(); ++e) b.data[e] += double(r_W - 1) * o.bound_dW_round.data[e];
  return b;
}

LmHeadOracle lmhead_oracle(const LmHeadProblem& p, const LmHeadInputs& in, double g, bool backward) {
  LmHeadOracle o;
  o.LSE.assign(static_cast<size_t>(p.N), 0.0);
  const View2<const double> H = in.H.view(), W = in.W.view();
  o.L = reference::lmhead_forward<double>(p, H, W, in.y.data(), o.LSE.data());
  if (backward) {
    o.dH = make_matrix<double>(p.N, p.d);
    o.dW = make_matrix<double>(p.V, p.d);
    reference::lmhead_backward<double>(p, H, W, in.y.data(), o.LSE.data(), g, o.dH.view(), o.dW.view());
  }
  lmhead_bounds(p, in.dtype, H, W, in.y.data(), o.LSE.data(), g, backward, o);
  return o;
}

Metrics compare_loss(double got, double want, double bound) {
  Metrics m;
  m.tensor = "L";
  compare_element(m, got, want, bound, nullptr, 0);
  return m;
}

}  // namespace burstlab
