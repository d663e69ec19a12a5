// burstlab/lmhead.hpp — the second operator's contract: the fused LM head + cross-entropy
// (spec §10). Problem, 2-D strided views, validation (§10.6) and FLOPs (§10.7).
//   H (N, d) hidden states, W (V, d) head weight, y (N) int64 labels  ->  L (scalar), LSE (N);
//   backward: dH (N, d), dW (V, d).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/hd.hpp"
#include "burstlab/storage.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

enum class Reduction { Mean, Sum };  // eq. (10.4)
std::string to_string(Reduction r);
Reduction parse_reduction(const std::string& s);  // "mean" | "sum"; Error naming "reduction"

struct LmHeadProblem {
  int64_t N = 1;                  // rows (tokens)
  int64_t d = 1;                  // hidden size
  int64_t V = 1;                  // vocabulary size
  int64_t ignore_index = -100;    // rows with this label do not count (§10.3)
  double label_smoothing = 0;     // eps in [0, 1]          (eq. 10.3)
  Reduction reduction = Reduction::Mean;
  double z_loss = 0;              // lambda >= 0            (eq. 10.3)
};

// Throws Error naming the first bad field and its value (§10.6): "V (0) must be >= 1".
void validate(const LmHeadProblem& p);
// validate(p), then every label: "y[7] (32000) must be in [0, V) = [0, 32000) or equal
// ignore_index (-100)". y (N), non-null.
void validate_labels(const LmHeadProblem& p, const int64_t* y);

// Logical (rows, cols) matrix with element strides: H, dH (N, d); W, dW (V, d).
template <class T>
struct View2 {
  T* data = nullptr;
  int64_t dim[2] = {0, 0};
  int64_t stride[2] = {0, 0};  // elements
  View2() = default;
  // View2<T> -> View2<const T>, implicitly (outputs passed where inputs are read).
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
  BURSTLAB_HD View2(const View2<U>& o) : data(o.data), dim{o.dim[0], o.dim[1]}, stride{o.stride[0], o.stride[1]} {}
  BURSTLAB_HD T& operator()(int64_t r, int64_t c) const { return data[r * stride[0] + c * stride[1]]; }
  BURSTLAB_HD T* row(int64_t r) const { return data + r * stride[0]; }
};
template <class T>
View2<T> view2(T* data, int64_t rows, int64_t cols) {  // row-major contiguous
  View2<T> v;
  v.data = data;
  v.dim[0] = rows; v.dim[1] = cols;
  v.stride[0] = cols; v.stride[1] = 1;
  return v;
}
template <class T>
View2<const T> as_const(const View2<T>& v) { return detail::const_view<View2<const T>>(v); }

// Owning row-major host matrix. Plain data.
template <class T>
struct Matrix {
  std::vector<T> data;
  int64_t rows = 0, cols = 0;
  View2<T> view() { return view2(data.data(), rows, cols); }
  View2<const T> view() const { return view2(data.data(), rows, cols); }
};
template <class T>
Matrix<T> make_matrix(int64_t rows, int64_t cols, T fill = T(0)) {
  Matrix<T> m;
  m.rows = rows; m.cols = cols;
  m.data.assign(element_count({rows, cols}), fill);
  return m;
}
// m with every element in U: rounded to nearest even when narrowing, exact when widening.
template <class U, class T>
Matrix<U> convert(const Matrix<T>& m) {
  Matrix<U> s = make_matrix<U>(m.rows, m.cols);
  for (size_t e = 0; e < m.data.size(); ++e) s.data[e] = from_double<U>(to_double(m.data[e]));
  return s;
}

// One view: non-null data and dim == (rows, cols): "W.dim[0] (31999) must equal V (32000)".
void validate_view2(const char* name, const int64_t* dim, const void* data, int64_t rows, const char* rows_name,
                    int64_t cols, const char* cols_name);
// Forward views: validate_labels(p, y), H (N, d), W (V, d), LSE (N) non-null.
template <class T, class A>
void validate_lmhead_forward(const LmHeadProblem& p, const View2<const T>& H, const View2<const T>& W,
                             const int64_t* y, const A* LSE) {
  validate_labels(p, y);
  validate_view2("H", H.dim, H.data, p.N, "N", p.d, "d");
  validate_view2("W", W.dim, W.data, p.V, "V", p.d, "d");
  if (!LSE) fail("LSE (null) must point to N (", p.N, ") elements");
}
// Backward views: the forward's, then dH (N, d), dW (V, d), and g finite.
template <class T, class A, class G>
void validate_lmhead_backward(const LmHeadProblem& p, const View2<const T>& H, const View2<const T>& W,
                              const int64_t* y, const A* LSE, double g, const View2<G>& dH, const View2<G>& dW) {
  validate_lmhead_forward(p, H, W, y, LSE);
  if (!std::isfinite(g)) fail("g (", g, ") must be finite");
  validate_view2("dH", dH.dim, dH.data, p.N, "N", p.d, "d");
  validate_view2("dW", dW.dim, dW.data, p.V, "V", p.d, "d");
}

// n_R = |{i : y_i != ignore_index}| and the weight w of eq. (10.4) (0 for mean with n_R = 0).
int64_t counted_rows(const LmHeadProblem& p, const int64_t* y);
double loss_weight(const LmHeadProblem& p, int64_t n_R);

// eq. (10.11): forward 2 N V d, backward 4 N V d, fused 6 N V d.
double lmhead_forward_flops(const LmHeadProblem& p);
double lmhead_backward_flops(const LmHeadProblem& p);

// "N=113 d=64 V=203 eps=0.1 lambda=0.0001 reduction=mean ignore_index=-100"
std::string shape_string(const LmHeadProblem& p);

}  // namespace burstlab
