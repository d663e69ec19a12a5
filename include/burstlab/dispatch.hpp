// burstlab/dispatch.hpp — the one switch from a runtime storage dtype (Dtype, precision.hpp) to the
// storage type T that templates take (storage.hpp, spec §9.1): every layer that picks an
// instantiation by a dtype picks it here.
#pragma once

#include "burstlab/error.hpp"
#include "burstlab/storage.hpp"

namespace burstlab {

// A storage type passed as a value: `using T = typename decltype(tag)::type;`.
template <class T>
struct type_tag {
  using type = T;
};

// Calls f(type_tag<T>{}) with T = double, float, bf16_t or f16_t as `t` names it, and returns
// what f returns (the same type for every T). A generic lambda is the usual f:
//   dispatch_dtype(in.dtype, [&](auto tag) { return runner<typename decltype(tag)::type>(p, in); });
template <class F>
decltype(auto) dispatch_dtype(Dtype t, F&& f) {
  switch (t) {
    case Dtype::F64: return f(type_tag<double>{});
    case Dtype::F32: return f(type_tag<float>{});
    case Dtype::BF16: return f(type_tag<bf16_t>{});
    case Dtype::F16: return f(type_tag<f16_t>{});
  }
  fail("dtype (", static_cast<int>(t), ") is not a storage type");
}

}  // namespace burstlab
