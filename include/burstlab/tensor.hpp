// burstlab/tensor.hpp — strided views (spec §1.2).
// Every tensor is seen through a view indexed in the spec's LOGICAL order, whatever its memory
// layout: Q/O/dO/dQ as (b, h, i, k), K/V/dK/dV as (b, h, j, k), LSE/D as (b, h, i).
// BSHD (flash-attn) and BHSD (SDPA) storage are two stride choices of the same view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/hd.hpp"

namespace burstlab {

enum class Layout { BSHD, BHSD };

// Logical (B, H, N, d) tensor with element strides; strides may be any non-negative values.
template <class T>
struct View4 {
  T* data = nullptr;
  int64_t dim[4] = {0, 0, 0, 0};     // (B, H, N, d)
  int64_t stride[4] = {0, 0, 0, 0};  // elements
  BURSTLAB_HD T& operator()(int64_t b, int64_t h, int64_t n, int64_t k) const {
    return data[b * stride[0] + h * stride[1] + n * stride[2] + k * stride[3]];
  }
  BURSTLAB_HD T* row(int64_t b, int64_t h, int64_t n) const {  // (d) with stride[3]
    return data + b * stride[0] + h * stride[1] + n * stride[2];
  }
};

// Logical (B, H, N) tensor: LSE and D rows.
template <class T>
struct View3 {
  T* data = nullptr;
  int64_t dim[3] = {0, 0, 0};
  int64_t stride[3] = {0, 0, 0};
  BURSTLAB_HD T& operator()(int64_t b, int64_t h, int64_t n) const {
    return data[b * stride[0] + h * stride[1] + n * stride[2]];
  }
};

// A view over contiguous storage in the given layout: BHSD = (B, H, N, d) row-major,
// BSHD = (B, N, H, d) row-major.
template <class T>
View4<T> view4(T* data, Layout layout, int64_t B, int64_t H, int64_t N, int64_t d) {
  View4<T> v;
  v.data = data;
  v.dim[0] = B; v.dim[1] = H; v.dim[2] = N; v.dim[3] = d;
  if (layout == Layout::BHSD) {
    v.stride[0] = H * N * d; v.stride[1] = N * d; v.stride[2] = d; v.stride[3] = 1;
  } else {
    v.stride[0] = N * H * d; v.stride[1] = d; v.stride[2] = H * d; v.stride[3] = 1;
  }
  return v;
}

// Contiguous (B, H, N) view.
template <class T>
View3<T> view3(T* data, int64_t B, int64_t H, int64_t N) {
  View3<T> v;
  v.data = data;
  v.dim[0] = B; v.dim[1] = H; v.dim[2] = N;
  v.stride[0] = H * N; v.stride[1] = N; v.stride[2] = 1;
  return v;
}

namespace detail {
// A view's read-only twin C: the same data, dims and strides.
template <class C, class V>
C const_view(const V& v) {
  C c;
  c.data = v.data;
  for (size_t a = 0; a < sizeof(v.dim) / sizeof(v.dim[0]); ++a) {
    c.dim[a] = v.dim[a];
    c.stride[a] = v.stride[a];
  }
  return c;
}
}  // namespace detail
template <class T>
View4<const T> as_const(const View4<T>& v) { return detail::const_view<View4<const T>>(v); }
template <class T>
View3<const T> as_const(const View3<T>& v) { return detail::const_view<View3<const T>>(v); }

// Owning host tensor: storage plus the layout it was made in. Plain data.
template <class T>
struct Tensor4 {
  std::vector<T> data;
  Layout layout = Layout::BHSD;
  int64_t B = 0, H = 0, N = 0, d = 0;
  View4<T> view() { return view4(data.data(), layout, B, H, N, d); }
  View4<const T> view() const { return view4(data.data(), layout, B, H, N, d); }
};

// The element count of a tensor with these dimensions. Throws Error when a dimension is negative
// or the product overflows int64 (undefined behaviour otherwise): "tensor (1048576 x 1048576 x
// 1048576 x 1048576) has more elements than int64 holds".
inline size_t element_count(std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t x : dims) {
    if (x < 0) fail("tensor dimension (", x, ") must be >= 0");
    overflow = overflow || __builtin_mul_overflow(n, x, &n);
  }
  if (overflow) {
    std::string s;
    for (int64_t x : dims) s += (s.empty() ? "" : " x ") + std::to_string(x);
    fail("tensor (", s, ") has more elements than int64 holds");
  }
  return static_cast<size_t>(n);
}

template <class T>
Tensor4<T> make_tensor4(Layout layout, int64_t B, int64_t H, int64_t N, int64_t d, T fill = T(0)) {
  Tensor4<T> t;
  t.layout = layout; t.B = B; t.H = H; t.N = N; t.d = d;
  t.data.assign(element_count({B, H, N, d}), fill);
  return t;
}

struct Tensor3Shape { int64_t B = 0, H = 0, N = 0; };
template <class T>
struct Tensor3 {
  std::vector<T> data;
  int64_t B = 0, H = 0, N = 0;
  View3<T> view() { return view3(data.data(), B, H, N); }
  View3<const T> view() const { return view3(data.data(), B, H, N); }
};
template <class T>
Tensor3<T> make_tensor3(int64_t B, int64_t H, int64_t N, T fill = T(0)) {
  Tensor3<T> t;
  t.B = B; t.H = H; t.N = N;
  t.data.assign(element_count({B, H, N}), fill);
  return t;
}

std::string to_string(Layout layout);
Layout parse_layout(const std::string& s);  // throws Error naming "layout"

}  // namespace burstlab
