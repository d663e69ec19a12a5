// reference/ — naive attention that materializes S and P per (b, h) (spec §2 forward, §5 backward).
// reference<double> is THE oracle. Written to be obviously right, not fast:
//   * Eigen maps with runtime strides over the strided views (BSHD / BHSD, GQA without copies);
//   * S = scale * Q K^T with an Eigen GEMM, then a plain per-element loop that applies the mask
//     predicate visible(mask, i, j) (eq. 3.5) and the softmax with std::exp;
//   * O = P V with an Eigen GEMM.
// Everything is computed in T (float or double): reference<float> is what a naive fp32
// implementation achieves, and must pass the §9 rule against reference<double>.
#include "reference.hpp"

#include <Eigen/Dense>
#include <cmath>
#include <cstdint>
#include <limits>

#include "burstlab/mask.hpp"
#include "eigen_views.hpp"
#include "burstlab/parallel.hpp"
#include "burstlab/problem.hpp"

namespace burstlab::reference {
namespace {

using eigen::ConstMap;
using eigen::Mat;
using eigen::slice;

// Writes an (N, d) matrix into the view's (b, h) slice, element by element (outputs overwritten).
template <class T>
void store(const View4<T>& v, int64_t b, int64_t h, const Mat<T>& m) {
  for (int64_t n = 0; n < m.rows(); ++n)
    for (int64_t k = 0; k < m.cols(); ++k) v(b, h, n, k) = m(n, k);
}

// OpenMP only when there is enough work: tiny problems (property tests call the oracle thousands
// of times) would otherwise pay a thread team's start and barrier on every call.
inline bool worth_threads(const Problem& p, int64_t items) {
  return items > 1 && double(p.B) * double(p.H_q) * double(p.N_q) * double(p.N_k) * double(p.d) >= 65536.0;
}

// Does query i see any key? (band + document + block, eq. 3.5)
inline bool row_has_visible(const MaskParams& mask, int64_t i, int64_t N_k) {
  for (int64_t j = 0; j < N_k; ++j)
    if (visible(mask, i, j)) return true;
  return false;
}

}  // namespace

// eq. (2.1)-(2.4): S = scale Q K^T, V_i = visible keys, LSE = log sum exp, P = softmax, O = P V.
template <class T>
void forward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
             View3<T> LSE) {
  validate_forward_views(p, Q, K, V, O, LSE);
  const MaskData md = compile_mask(p);
  const MaskParams mask = md.params();
  const T scale = static_cast<T>(scale_of(p));
  const int64_t G = group_size(p);
  const int64_t N_q = p.N_q, N_k = p.N_k;
  const T ninf = -std::numeric_limits<T>::infinity();

  // P below is N_q x N_k per (b, h) and thread: an allocation that fails there (std::bad_alloc)
  // must reach the caller, not std::terminate (burstlab/parallel.hpp).
  FirstError err;
#pragma omp parallel for schedule(dynamic) if (worth_threads(p, p.B * p.H_q))
  for (int64_t bh = 0; bh < p.B * p.H_q; ++bh) err.run([&] {
    const int64_t b = bh / p.H_q, h = bh % p.H_q, hk = kv_head(h, G);
    const ConstMap<T> Qm = slice(Q, b, h);   // (N_q, d)
    const ConstMap<T> Km = slice(K, b, hk);  // (N_k, d)
    const ConstMap<T> Vm = slice(V, b, hk);  // (N_k, d)
    Mat<T> P = scale * (Qm * Km.transpose());  // S (N_q, N_k), eq. (2.1); becomes P below
    for (int64_t i = 0; i < N_q; ++i) {
      T m = ninf;  // row max over V_i (eq. 2.2), for a stable exp
      bool any = false;
      for (int64_t j = 0; j < N_k; ++j)
        if (visible(mask, i, j)) {
          if (!any || P(i, j) > m) m = P(i, j);
          any = true;
        }
      if (!any) {  // empty row (§2.3): P = 0, so O = 0; LSE = -inf
        P.row(i).setZero();
        LSE(b, h, i) = ninf;
        continue;
      }
      T l = 0;  // l = sum_{j in V_i} exp(S_ij - m)
      for (int64_t j = 0; j < N_k; ++j) {
        if (visible(mask, i, j)) {
          const T e = std::exp(P(i, j) - m);
          P(i, j) = e;
          l += e;
        } else {
          P(i, j) = T(0);
        }
      }
      for (int64_t j = 0; j < N_k; ++j) P(i, j) = P(i, j) / l;  // eq. (2.4): P_ij = exp(S_ij - LSE_i)
      LSE(b, h, i) = m + std::log(l);                            // eq. (2.3)
    }
    const Mat<T> Ob = P * Vm;  // (N_q, d), eq. (2.4): O = P V
    store(O, b, h, Ob);
  });
  err.rethrow();
}

// eq. (5.1)-(5.7). Parallel over (b, kv-head): the q-heads of a group are looped inside, so dK and
// dV (summed over the group) and dQ (one q-head each) are written by one thread each.
template <class T>
void backward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
              View4<const T> O, View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK,
              View4<T> dV) {
  validate_backward_views(p, Q, K, V, O, dO, LSE, dQ, dK, dV);
  const MaskData md = compile_mask(p);
  const MaskParams mask = md.params();
  const T scale = static_cast<T>(scale_of(p));
  const int64_t G = group_size(p);
  const int64_t N_q = p.N_q, N_k = p.N_k, d = p.d;
  const T ninf = -std::numeric_limits<T>::infinity();

  FirstError err;  // P and dS are N_q x N_k per thread (see forward)
#pragma omp parallel for schedule(dynamic) if (worth_threads(p, p.B * p.H_kv))
  for (int64_t bk = 0; bk < p.B * p.H_kv; ++bk) err.run([&] {
    const int64_t b = bk / p.H_kv, hk = bk % p.H_kv;
    const ConstMap<T> Km = slice(K, b, hk);  // (N_k, d)
    const ConstMap<T> Vm = slice(V, b, hk);  // (N_k, d)
    Mat<T> dK_acc = Mat<T>::Zero(N_k, d);    // (N_k, d) sum over the group
    Mat<T> dV_acc = Mat<T>::Zero(N_k, d);    // (N_k, d) sum over the group
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hk * G + g;
      const ConstMap<T> Qm = slice(Q, b, h);     // (N_q, d)
      const ConstMap<T> Om = slice(O, b, h);     // (N_q, d)
      const ConstMap<T> dOm = slice(dO, b, h);   // (N_q, d)
      // eq. (5.1): D_i = sum_k dO_ik O_ik
      Eigen::Matrix<T, Eigen::Dynamic, 1> D(N_q);
      for (int64_t i = 0; i < N_q; ++i) {
        T s = 0;
        for (int64_t k = 0; k < d; ++k) s += dOm(i, k) * Om(i, k);
        D(i) = s;
      }
      // eq. (5.2): P_ij = exp(scale q_i.k_j - LSE_i) on visible (i, j), 0 elsewhere and on empty rows
      Mat<T> P = scale * (Qm * Km.transpose());  // S (N_q, N_k)
      for (int64_t i = 0; i < N_q; ++i) {
        const T L = LSE(b, h, i);
        const bool empty = L == ninf || !row_has_visible(mask, i, N_k);
        for (int64_t j = 0; j < N_k; ++j)
          P(i, j) = (!empty && visible(mask, i, j)) ? std::exp(P(i, j) - L) : T(0);
      }
      dV_acc.noalias() += P.transpose() * dOm;  // eq. (5.3): dV = P^T dO
      Mat<T> dS = dOm * Vm.transpose();         // eq. (5.4): dP = dO V^T  (N_q, N_k)
      for (int64_t i = 0; i < N_q; ++i)
        for (int64_t j = 0; j < N_k; ++j) dS(i, j) = P(i, j) * (dS(i, j) - D(i));  // eq. (5.5)
      const Mat<T> dQb = scale * (dS * Km);     // eq. (5.6): dQ = scale dS K  (N_q, d)
      store(dQ, b, h, dQb);
      dK_acc.noalias() += scale * (dS.transpose() * Qm);  // eq. (5.7): dK = scale dS^T Q
    }
    store(dK, b, hk, dK_acc);
    store(dV, b, hk, dV_acc);
  });
  err.rethrow();
}

template void forward<float>(const Problem&, View4<const float>, View4<const float>,
                             View4<const float>, View4<float>, View3<float>);
template void forward<double>(const Problem&, View4<const double>, View4<const double>,
                              View4<const double>, View4<double>, View3<double>);
template void backward<float>(const Problem&, View4<const float>, View4<const float>,
                              View4<const float>, View4<const float>, View4<const float>,
                              View3<const float>, View4<float>, View4<float>, View4<float>);
template void backward<double>(const Problem&, View4<const double>, View4<const double>,
                               View4<const double>, View4<const double>, View4<const double>,
                               View3<const double>, View4<double>, View4<double>, View4<double>);

}  // namespace burstlab::reference
