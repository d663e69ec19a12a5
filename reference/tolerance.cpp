// reference/tolerance.cpp — THE tolerance rule (spec §9), implemented once.
// Every bound is per element, computed in double from the candidate's (rounded) inputs and the
// oracle's P, O, LSE, which are recomputed here in double (O(N_q N_k d) per head).
//
// Precision model (§9.1): a candidate of storage dtype s reads inputs already rounded to s and
// accumulates in a = fp64 for F64, fp32 otherwise. u_s, u_a their unit roundoffs; u_P = u_s for
// BF16/F16 (tensor-core kernels round P and dS to storage precision before the matmul), else 0.
// gamma(n) = gamma_n(n, u_a). tiny_s = subnormal spacing of s, tiny_a = smallest normal of a: the
// absolute floors that cover underflow (of P_ij, of products) and the final rounding of zeros.
//
// Safety factor kSafety = 2: every bound below is FIRST ORDER in u (O(u^2) terms dropped, and
// approximations such as log(1 + x) ~ x and (1 + x)^-1 ~ 1 - x used); doubling covers both.
#include "tolerance.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/parallel.hpp"
#include "eigen_views.hpp"

namespace burstlab {
namespace {

using MatD = reference::eigen::Mat<double>;
using VecD = Eigen::VectorXd;
using ConstMapD = reference::eigen::ConstMap<double>;
using reference::eigen::slice;

constexpr double kSafety = kRuleSafety;  // see the header comment: first-order bounds, doubled

// OpenMP only when there is enough work (see reference.cpp).
bool worth_threads(const Problem& p, int64_t items) {
  return items > 1 && double(p.B) * double(p.H_q) * double(p.N_q) * double(p.N_k) * double(p.d) >= 65536.0;
}

using Precision = RuleConstants;  // §9.1

// The oracle's row quantities for one (b, h), in double: P (N_q, N_k) on the visible set,
// LSE_i, whether row i is empty, and eta_i (eq. 9.2).
struct RowFacts {
  MatD P;                  // (N_q, N_k)
  VecD LSE;                // (N_q)
  VecD eta;                // (N_q) relative error of every computed P_ij and of l_i
  std::vector<char> empty; // (N_q)
};

// lse_in: when given (backward), P is recomputed from it as eq. (5.2) does; otherwise the softmax
// is computed here as eq. (2.1)-(2.4).
RowFacts row_facts(const Problem& p, const Precision& pr, const MaskParams& mask,
                   const ConstMapD& Qm, const ConstMapD& Km, const double* lse_in,
                   int64_t lse_stride) {
  const int64_t N_q = p.N_q, N_k = p.N_k, d = p.d;
  const double scale = scale_of(p), ascale = std::fabs(scale);
  const double ninf = -std::numeric_limits<double>::infinity();
  RowFacts f;
  f.P = scale * (Qm * Km.transpose());                           // S (N_q, N_k)
  const MatD A = Qm.cwiseAbs() * Km.cwiseAbs().transpose();      // sum_k |Q_ik||K_jk|  (N_q, N_k)
  f.LSE.resize(N_q);
  f.eta.resize(N_q);
  f.empty.assign(static_cast<size_t>(N_q), 0);
  for (int64_t i = 0; i < N_q; ++i) {
    double m = ninf, a_i = 0;
    bool any = false;
    for (int64_t j = 0; j < N_k; ++j)
      if (visible(mask, i, j)) {
        if (!any || f.P(i, j) > m) m = f.P(i, j);
        a_i = std::max(a_i, A(i, j));
        any = true;
      }
    if (!any) {
      f.empty[i] = 1;
      f.P.row(i).setZero();
      f.LSE(i) = ninf;
      f.eta(i) = 0;
      continue;
    }
    a_i *= ascale;  // eq. (9.1): a_i = |scale| max_{j in V_i} sum_k |Q_ik||K_jk|
    // eq. (9.2): logit error twice (S_ij and the running max), exp/rescale and N_k-term sums.
    f.eta(i) = rule_eta(pr, d, N_k, a_i);
    if (lse_in) {
      const double L = lse_in[i * lse_stride];
      f.LSE(i) = L;
      for (int64_t j = 0; j < N_k; ++j)
        f.P(i, j) = visible(mask, i, j) && L != ninf ? std::exp(f.P(i, j) - L) : 0.0;
    } else {
      double l = 0;
      for (int64_t j = 0; j < N_k; ++j) {
        if (visible(mask, i, j)) {
          const double e = std::exp(f.P(i, j) - m);
          f.P(i, j) = e;
          l += e;
        } else {
          f.P(i, j) = 0;
        }
      }
      for (int64_t j = 0; j < N_k; ++j) f.P(i, j) /= l;
      f.LSE(i) = m + std::log(l);
    }
  }
  return f;
}

// Forward bound of O before the safety factor (eq. 9.3), rows of one (b, h):
//   (2 eta_i + u_s) (P|V|)_ik + N_k tiny_a max_j |V_jk| + tiny_s;   empty row: 0.
// max_j runs over all keys of the kv-head (>= the max over V_i: generous, and the term is tiny).
MatD o_bound_raw(const Problem& p, const Precision& pr, const RowFacts& f, const ConstMapD& Vm) {
  const MatD absV = Vm.cwiseAbs();
  const Eigen::RowVectorXd maxV = absV.colwise().maxCoeff();  // (d): max_j |V_jk|
  MatD PV = f.P * absV;  // (N_q, d)
  for (int64_t i = 0; i < p.N_q; ++i) {
    if (f.empty[i]) { PV.row(i).setZero(); continue; }
    for (int64_t k = 0; k < p.d; ++k)
      PV(i, k) = (2 * f.eta(i) + pr.u_s) * PV(i, k) + double(p.N_k) * pr.tiny_a * maxV(k) + pr.tiny_s;
  }
  return PV;
}

std::string fmt_coord(const int64_t* idx, int rank, const char* const* names) {
  static const char* const bhik[] = {"b", "h", "i", "k"};
  if (!names) names = bhik;
  std::string s = "(";
  for (int a = 0; a < rank; ++a) {
    if (a) s += ", ";
    s += names[a];
    s += "=" + std::to_string(idx[a]);
  }
  return s + ")";
}

std::string fmt_g(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

template <int R>
void check_dims(const char* name, const int64_t* got, const int64_t* want, const char* what) {
  for (int a = 0; a < R; ++a)
    if (got[a] != want[a])
      fail(name, ".dim[", a, "] (", got[a], ") must equal the ", what, "'s dim[", a, "] (", want[a], ")");
}

}  // namespace

RuleConstants rule_constants(Dtype s) {
  const Dtype a = accumulator_of(s);
  RuleConstants c;
  c.u_s = unit_roundoff(s);
  c.u_a = unit_roundoff(a);
  c.u_P = (s == Dtype::BF16 || s == Dtype::F16) ? c.u_s : 0.0;
  c.tiny_s = 0;
  switch (s) {  // subnormal spacing of s
    case Dtype::F64: c.tiny_s = std::ldexp(1.0, -1074); break;
    case Dtype::F32: c.tiny_s = std::ldexp(1.0, -149); break;
    case Dtype::BF16: c.tiny_s = std::ldexp(1.0, -133); break;
    case Dtype::F16: c.tiny_s = std::ldexp(1.0, -24); break;
  }
  c.tiny_a = a == Dtype::F64 ? std::ldexp(1.0, -1022) : std::ldexp(1.0, -126);  // smallest normal of a
  return c;
}

// One element of §9.3. Updates m; returns nothing.
void compare_element(Metrics& m, double got, double want, double bound, const int64_t* idx, int rank,
                     const char* const* names) {
  ++m.checked;
  bool wrong = false;
  double ratio = 0;
  if (std::isnan(got)) {
    wrong = true;
    ratio = HUGE_VAL;
  } else if (!std::isfinite(want)) {  // only LSE = -inf on empty rows: bitwise the same infinity
    if (!(got == want)) { wrong = true; ratio = HUGE_VAL; }
  } else if (!std::isfinite(got)) {
    wrong = true;
    ratio = HUGE_VAL;
  } else {
    const double diff = std::fabs(got - want);
    m.max_abs = std::max(m.max_abs, diff);
    if (want != 0) m.max_rel = std::max(m.max_rel, diff / std::fabs(want));
    if (diff > bound) wrong = true;
    ratio = diff == 0 ? 0.0 : (bound > 0 ? diff / bound : HUGE_VAL);
  }
  m.err_bound = std::max(m.err_bound, ratio);
  if (wrong) {
    if (m.wrong == 0)
      m.first_wrong = fmt_coord(idx, rank, names) + ": got " + fmt_g(got) + " want " + fmt_g(want) +
                      " bound " + fmt_g(bound);
    ++m.wrong;
  }
}

// eq. (9.3)-(9.4).
ForwardBounds forward_bounds(const Problem& p, Dtype dtype, View4<const double> Q,
                             View4<const double> K, View4<const double> V) {
  validate_views(p, Q, K, V);
  const MaskData md = compile_mask(p);
  const MaskParams mask = md.params();
  const Precision pr = rule_constants(dtype);
  const int64_t G = group_size(p);
  ForwardBounds out;
  out.O = make_tensor4<double>(Layout::BHSD, p.B, p.H_q, p.N_q, p.d);
  out.LSE = make_tensor3<double>(p.B, p.H_q, p.N_q);
  View4<double> bO = out.O.view();
  View3<double> bL = out.LSE.view();
  FirstError err;  // row_facts holds two N_q x N_k matrices per thread (burstlab/parallel.hpp)
#pragma omp parallel for schedule(dynamic) if (worth_threads(p, p.B * p.H_q))
  for (int64_t bh = 0; bh < p.B * p.H_q; ++bh) err.run([&] {
    const int64_t b = bh / p.H_q, h = bh % p.H_q, hk = kv_head(h, G);
    const ConstMapD Qm = slice(Q, b, h), Km = slice(K, b, hk), Vm = slice(V, b, hk);
    const RowFacts f = row_facts(p, pr, mask, Qm, Km, nullptr, 0);
    const MatD ob = o_bound_raw(p, pr, f, Vm);
    for (int64_t i = 0; i < p.N_q; ++i) {
      for (int64_t k = 0; k < p.d; ++k) bO(b, h, i, k) = f.empty[i] ? 0.0 : kSafety * ob(i, k);
      // eq. (9.4); LSE is stored in the accumulator precision: eta_i + 2 u_a |LSE_i| + tiny_a.
      bL(b, h, i) = f.empty[i] ? 0.0 : kSafety * (f.eta(i) + 2 * pr.u_a * std::fabs(f.LSE(i)) + pr.tiny_a);
    }
  });
  err.rethrow();
  return out;
}

// eq. (9.5)-(9.9).
BackwardBounds backward_bounds(const Problem& p, Dtype dtype, View4<const double> Q,
                               View4<const double> K, View4<const double> V,
                               View4<const double> O, View4<const double> dO,
                               View3<const double> LSE) {
  validate_views(p, Q, K, V);
  validate_q_side(p, "O", O);
  validate_q_side(p, "dO", dO);
  validate_rows(p, "LSE", LSE);
  const MaskData md = compile_mask(p);
  const MaskParams mask = md.params();
  const Precision pr = rule_constants(dtype);
  const int64_t G = group_size(p), N_q = p.N_q, N_k = p.N_k, d = p.d;
  const double ascale = std::fabs(scale_of(p));
  const double g_d = pr.gamma(double(d));
  const double g_k = pr.gamma(double(N_k) + 2);           // dQ: sum over N_k keys
  const double g_q = pr.gamma(double(G) * double(N_q) + 2);  // dK, dV: sum over the group's rows
  BackwardBounds out;
  out.dQ = make_tensor4<double>(Layout::BHSD, p.B, p.H_q, N_q, d);
  out.dK = make_tensor4<double>(Layout::BHSD, p.B, p.H_kv, N_k, d);
  out.dV = make_tensor4<double>(Layout::BHSD, p.B, p.H_kv, N_k, d);
  View4<double> bdQ = out.dQ.view(), bdK = out.dK.view(), bdV = out.dV.view();

  FirstError err;  // six N_q x N_k matrices per thread below (burstlab/parallel.hpp)
#pragma omp parallel for schedule(dynamic) if (worth_threads(p, p.B * p.H_kv))
  for (int64_t bk = 0; bk < p.B * p.H_kv; ++bk) err.run([&] {
    const int64_t b = bk / p.H_kv, hk = bk % p.H_kv;
    const ConstMapD Km = slice(K, b, hk), Vm = slice(V, b, hk);
    const MatD absK = Km.cwiseAbs(), absV = Vm.cwiseAbs();
    const double maxK = absK.size() ? absK.maxCoeff() : 0.0;
    MatD sumEQ = MatD::Zero(N_k, d), sumdSQ = MatD::Zero(N_k, d), sumdV = MatD::Zero(N_k, d);
    double maxQ = 0, maxdO = 0;
    std::vector<char> key_seen(static_cast<size_t>(N_k), 0);  // visible to some row of the group
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hk * G + g;
      const ConstMapD Qm = slice(Q, b, h), Om = slice(O, b, h), dOm = slice(dO, b, h);
      const MatD absQ = Qm.cwiseAbs(), absdO = dOm.cwiseAbs(), absO = Om.cwiseAbs();
      maxQ = std::max(maxQ, absQ.size() ? absQ.maxCoeff() : 0.0);
      maxdO = std::max(maxdO, absdO.size() ? absdO.maxCoeff() : 0.0);
      const RowFacts f = row_facts(p, pr, mask, Qm, Km, &LSE(b, h, 0), LSE.stride[2]);
      const MatD boundO = o_bound_raw(p, pr, f, Vm);           // (N_q, d), before the safety factor
      const MatD dP = dOm * Vm.transpose();                    // (N_q, N_k) eq. (5.4), exact
      const MatD dOV = absdO * absV.transpose();               // sum_k |dO_ik||V_jk|  (N_q, N_k)
      MatD E(N_q, N_k), adS(N_q, N_k), W(N_q, N_k);
      for (int64_t i = 0; i < N_q; ++i) {
        double D = 0, dD_a = 0, dD_b = 0;
        for (int64_t k = 0; k < d; ++k) {
          D += dOm(i, k) * Om(i, k);                           // eq. (5.1), exact
          dD_a += absdO(i, k) * boundO(i, k);
          dD_b += absdO(i, k) * absO(i, k);
        }
        const double dD = f.empty[i] ? 0.0 : dD_a + g_d * dD_b;      // eq. (9.6): error of D
        const double pi = 2 * f.eta(i) +  // eq. (9.5)
                          2 * pr.u_a * (f.empty[i] ? 0.0 : std::fabs(f.LSE(i)));
        for (int64_t j = 0; j < N_k; ++j) {
          const double P = f.P(i, j);
          if (P != 0 || (!f.empty[i] && visible(mask, i, j))) key_seen[j] = 1;
          const double dPD = dP(i, j) - D;
          // eq. (9.7), the error of dS_ij (5.5): relative error of P, of (dP - D), and of D
          E(i, j) = P * ((pi + 2 * pr.u_a + pr.u_P) * std::fabs(dPD) + g_d * dOV(i, j) + dD);
          adS(i, j) = std::fabs(P * dPD);
          W(i, j) = P * (pi + g_q + pr.u_s);
        }
      }
      // eq. (9.9) dQ_ik : |scale| [ sum_j E_ij |K_jk| + (gamma(N_k + 2) + u_s) sum_j |dS_ij||K_jk| ]
      //         + N_k tiny_a max|K| |scale| + tiny_s
      const MatD bq = ascale * (E * absK + (g_k + pr.u_s) * (adS * absK));
      for (int64_t i = 0; i < N_q; ++i)
        for (int64_t k = 0; k < d; ++k)
          bdQ(b, h, i, k) = f.empty[i] ? pr.tiny_s  // row visible to no key: expected 0 exactly
                                       : kSafety * (bq(i, k) + double(N_k) * pr.tiny_a * maxK * ascale + pr.tiny_s);
      sumEQ.noalias() += E.transpose() * absQ;
      sumdSQ.noalias() += adS.transpose() * absQ;
      sumdV.noalias() += W.transpose() * absdO;
    }
    const double GN = double(G) * double(N_q);
    for (int64_t j = 0; j < N_k; ++j)
      for (int64_t k = 0; k < d; ++k) {
        if (!key_seen[j]) {  // key visible to no row of the group: expected 0 exactly
          bdK(b, hk, j, k) = pr.tiny_s;
          bdV(b, hk, j, k) = pr.tiny_s;
          continue;
        }
        // eq. (9.8) dV_jk : sum_{h,i} P_ij |dO_ik| (pi_i + gamma(G N_q + 2) + u_s) + G N_q tiny_a max|dO| + tiny_s
        bdV(b, hk, j, k) = kSafety * (sumdV(j, k) + GN * pr.tiny_a * maxdO + pr.tiny_s);
        // eq. (9.9) dK_jk : |scale| [ sum E_ij |Q_ik| + (gamma(G N_q + 2) + u_s) sum |dS_ij||Q_ik| ]
        //         + G N_q tiny_a max|Q| |scale| + tiny_s
        bdK(b, hk, j, k) = kSafety * (ascale * (sumEQ(j, k) + (g_q + pr.u_s) * sumdSQ(j, k)) +
                                      GN * pr.tiny_a * maxQ * ascale + pr.tiny_s);
      }
  });
  err.rethrow();
  return out;
}

// Element idx of a 3-D or 4-D view.
template <int N, class V>
auto element(const V& v, const int64_t* idx) {
  if constexpr (N == 4) return v(idx[0], idx[1], idx[2], idx[3]);
  else return v(idx[0], idx[1], idx[2]);
}

// Every element of got against want and bound, in row-major order (the first failure reported is
// the first in that order).
template <int N, class Got, class Want>
Metrics compare_all(const char* name, const Got& got, const Want& want, const Want& bound) {
  check_dims<N>(name, got.dim, want.dim, "oracle");
  check_dims<N>(name, bound.dim, want.dim, "oracle");
  if (!got.data) fail(name, " (null) must point to data");
  Metrics m;
  m.tensor = name;
  int64_t total = 1, idx[N] = {};
  for (int a = 0; a < N; ++a) total *= want.dim[a];
  for (int64_t n = 0; n < total; ++n) {
    compare_element(m, static_cast<double>(element<N>(got, idx)), element<N>(want, idx), element<N>(bound, idx),
                    idx, N);
    for (int a = N - 1; a >= 0 && ++idx[a] == want.dim[a]; --a) idx[a] = 0;  // the next index, last fastest
  }
  return m;
}

template <class T>
Metrics compare(const char* name, View4<const T> got, View4<const double> want, View4<const double> bound) {
  return compare_all<4>(name, got, want, bound);
}

template <class T>
Metrics compare(const char* name, View3<const T> got, View3<const double> want, View3<const double> bound) {
  return compare_all<3>(name, got, want, bound);
}

Metrics combine(const Metrics* ms, int n, const char* name) {
  Metrics all;
  all.tensor = name ? name : "all";
  for (int t = 0; t < n; ++t) {
    const Metrics& m = ms[t];
    all.max_abs = std::max(all.max_abs, m.max_abs);
    all.max_rel = std::max(all.max_rel, m.max_rel);
    all.err_bound = std::max(all.err_bound, m.err_bound);
    if (all.first_wrong.empty() && !m.first_wrong.empty()) all.first_wrong = m.tensor + " " + m.first_wrong;
    all.wrong += m.wrong;
    all.checked += m.checked;
  }
  return all;
}

template Metrics compare<float>(const char*, View4<const float>, View4<const double>, View4<const double>);
template Metrics compare<double>(const char*, View4<const double>, View4<const double>, View4<const double>);
template Metrics compare<float>(const char*, View3<const float>, View3<const double>, View3<const double>);
template Metrics compare<double>(const char*, View3<const double>, View3<const double>, View3<const double>);

}  // namespace burstlab
