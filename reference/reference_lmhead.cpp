// reference/reference_lmhead.cpp — the naive LM head + cross-entropy (spec §10.2-§10.4). Written to be
// obviously right, not fast: z = H W^T is one Eigen GEMM into an (N, V) matrix, the softmax and
// the loss are plain per-element loops in T, dz is formed in place of z, and dH = dz W,
// dW = dz^T H are two more GEMMs. Eigen maps with runtime strides read the views in place.
#include "reference_lmhead.hpp"

#include <Eigen/Dense>
#include <cmath>
#include <limits>

#include "eigen_views.hpp"


namespace burstlab::reference {
namespace {

using eigen::map;
using eigen::Mat;
template <class T>
void store(const View2<T>& v, const Mat<T>& m) {
  for (int64_t r = 0; r < m.rows(); ++r)
    for (int64_t c = 0; c < m.cols(); ++c) v(r, c) = m(r, c);
}

// OpenMP over rows only when there is enough work (the property tests call this often).
inline bool worth_threads(const LmHeadProblem& p) { return double(p.N) * double(p.V) >= 65536.0; }

// eq. (10.1): z = H W^T  (N, V)
template <class T>
Mat<T> logits(const View2<const T>& H, const View2<const T>& W) {
  return map(H) * map(W).transpose();
}

}  // namespace

template <class T>
T lmhead_forward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, T* LSE) {
  validate_lmhead_forward(p, H, W, y, LSE);
  const Mat<T> z = logits(H, W);  // (N, V)
  const T eps = static_cast<T>(p.label_smoothing), lambda = static_cast<T>(p.z_loss);
  const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for if (worth_threads(p))
  for (int64_t i = 0; i < p.N; ++i) {
    T m = ninf;  // row max, for a stable exp
    for (int64_t j = 0; j < p.V; ++j) m = z(i, j) > m ? z(i, j) : m;
    T s = 0;
    for (int64_t j = 0; j < p.V; ++j) s += std::exp(z(i, j) - m);
    LSE[i] = m + std::log(s);  // eq. (10.2)
  }
  T sum = 0;  // sum_{i in R} l_i
  for (int64_t i = 0; i < p.N; ++i) {
    if (y[i] == p.ignore_index) continue;
    T zsum = 0;
    if (eps != T(0))
      for (int64_t j = 0; j < p.V; ++j) zsum += z(i, j);
    // eq. (10.3)
    sum += LSE[i] - (T(1) - eps) * z(i, y[i]) - eps / static_cast<T>(p.V) * zsum + lambda * LSE[i] * LSE[i];
  }
  return static_cast<T>(loss_weight(p, counted_rows(p, y))) * sum;  // eq. (10.4)
}

template <class T>
void lmhead_backward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y,
                     const T* LSE, T g, View2<T> dH, View2<T> dW) {
  validate_lmhead_backward(p, H, W, y, LSE, static_cast<double>(g), dH, dW);
  Mat<T> dz = logits(H, W);  // z (N, V); becomes dz below
  const T w = static_cast<T>(loss_weight(p, counted_rows(p, y)));
  const T eps = static_cast<T>(p.label_smoothing), lambda = static_cast<T>(p.z_loss);
  const T smooth = eps / static_cast<T>(p.V);
#pragma omp parallel for if (worth_threads(p))
  for (int64_t i = 0; i < p.N; ++i) {
    if (y[i] == p.ignore_index) {  // c_i = 0 (eq. 10.5): exact zeros
      dz.row(i).setZero();
      continue;
    }
    const T c = g * w;                                   // eq. (10.5)
    const T q = c * (T(1) + T(2) * lambda * LSE[i]);
    for (int64_t j = 0; j < p.V; ++j)
      dz(i, j) = q * std::exp(dz(i, j) - LSE[i]) - c * smooth;  // eq. (10.6)-(10.7)
    dz(i, y[i]) -= c * (T(1) - eps);
  }
  const Mat<T> dHm = dz * map(W);              // eq. (10.8): dH = dz W     (N, d)
  const Mat<T> dWm = dz.transpose() * map(H);  // eq. (10.9): dW = dz^T H   (V, d)
  store(dH, dHm);
  store(dW, dWm);
}

template float lmhead_forward<float>(const LmHeadProblem&, View2<const float>, View2<const float>, const int64_t*, float*);
template double lmhead_forward<double>(const LmHeadProblem&, View2<const double>, View2<const double>, const int64_t*,
                                       double*);
template void lmhead_backward<float>(const LmHeadProblem&, View2<const float>, View2<const float>, const int64_t*,
                                     const float*, float, View2<float>, View2<float>);
template void lmhead_backward<double>(const LmHeadProblem&, View2<const double>, View2<const double>, const int64_t*,
                                      const double*, double, View2<double>, View2<double>);

}  // namespace burstlab::reference
