// burstlab/any_tensor.hpp — a host tensor held in any storage type (spec §9.1): fp64, fp32, bf16
// or fp16, 8, 4, 2 or 2 bytes an element. Inputs rounded to a dtype are exact in its storage
// type, so they are kept there: at N = 1M, H = 32, d = 128 one bf16 tensor is 8.6 GB, fp64 34 GB.
// Every read widens an element to fp64 (exact); every conversion to a storage type T goes through
// that fp64 value (from_double<T>), so a consumer sees the bits it would see of an fp64 copy.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <variant>

#include "burstlab/error.hpp"
#include "burstlab/storage.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

// A read-only view of a tensor in any storage type, in the logical order (b, h, n, k).
using AnyView4 = std::variant<View4<const double>, View4<const float>, View4<const bf16_t>, View4<const f16_t>>;

// The view's dims and strides, and its data pointer only to tell null from not: what the
// problem's checks of a view (validate_views) read.
inline View4<const double> shape_of(const AnyView4& v) {
  return std::visit([](const auto& x) {
    View4<const double> s;
    s.data = x.data == nullptr ? nullptr : reinterpret_cast<const double*>(x.data);
    for (int a = 0; a < 4; ++a) {
      s.dim[a] = x.dim[a];
      s.stride[a] = x.stride[a];
    }
    return s;
  }, v);
}
// An owning host tensor (Tensor4) of one of the storage types.
struct AnyTensor4 {
  std::variant<Tensor4<double>, Tensor4<float>, Tensor4<bf16_t>, Tensor4<f16_t>> t;

  // A tensor of `dtype`'s storage type, zeros.
  static AnyTensor4 zeros(Dtype dtype, Layout layout, int64_t B, int64_t H, int64_t N, int64_t d) {
    AnyTensor4 a;
    switch (dtype) {
      case Dtype::F64: a.t = make_tensor4<double>(layout, B, H, N, d); break;
      case Dtype::F32: a.t = make_tensor4<float>(layout, B, H, N, d); break;
      case Dtype::BF16: a.t = make_tensor4<bf16_t>(layout, B, H, N, d, bf16_t()); break;
      case Dtype::F16: a.t = make_tensor4<f16_t>(layout, B, H, N, d, f16_t()); break;
    }
    return a;
  }
  AnyTensor4() = default;
  template <class S>
  AnyTensor4(Tensor4<S> x) : t(std::move(x)) {}  // NOLINT: a tensor of a storage type is one

  template <class F> decltype(auto) visit(F&& f) const { return std::visit(std::forward<F>(f), t); }
  template <class F> decltype(auto) visit(F&& f) { return std::visit(std::forward<F>(f), t); }

  Dtype dtype() const {  // of the storage type
    return visit([](const auto& x) { return dtype_of<typename std::decay_t<decltype(x.data)>::value_type>(); });
  }
  Layout layout() const { return visit([](const auto& x) { return x.layout; }); }
  int64_t dim(int a) const {
    return visit([a](const auto& x) { const int64_t d[4] = {x.B, x.H, x.N, x.d}; return d[a]; });
  }
  size_t size() const { return visit([](const auto& x) { return x.data.size(); }); }
  size_t bytes() const { return visit([](const auto& x) { return x.data.size() * sizeof(x.data[0]); }); }
  AnyView4 view() const { return visit([](const auto& x) -> AnyView4 { return x.view(); }); }
  // The tensor itself when held in fp64 (a case's inputs, fp64 inputs); Error otherwise.
  const Tensor4<double>& f64() const { return const_cast<AnyTensor4*>(this)->f64(); }
  Tensor4<double>& f64() {
    if (auto* x = std::get_if<Tensor4<double>>(&t)) return *x;
    fail("tensor held in ", to_string(dtype()), ", not fp64: read it with as<double>()");
  }

  // Every element as T (from_double<T> of its fp64 value), same layout.
  template <class T> Tensor4<T> as() const {
    return visit([](const auto& x) {
      Tensor4<T> y;
      y.layout = x.layout; y.B = x.B; y.H = x.H; y.N = x.N; y.d = x.d;
      using S = typename std::decay_t<decltype(x.data)>::value_type;
      if constexpr (std::is_same_v<S, T>) {
        y.data = x.data;
      } else {
        y.data.resize(x.data.size());
        const int64_t n = static_cast<int64_t>(x.data.size());
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
        for (int64_t e = 0; e < n; ++e) y.data[size_t(e)] = from_double<T>(to_double(x.data[size_t(e)]));
      }
      return y;
    });
  }
};

// x in fp64: a view of x itself when it is held in fp64, else of `copy`, which this fills with
// x widened (the full oracle's and the bounds' way to read inputs of any storage type).
inline View4<const double> f64_view(const AnyTensor4& x, Tensor4<double>& copy) {
  if (const auto* t = std::get_if<Tensor4<double>>(&x.t)) return t->view();
  copy = x.as<double>();
  return as_const(copy.view());
}

}  // namespace burstlab
