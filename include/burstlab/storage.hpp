// burstlab/storage.hpp — element types an Engine stores (spec §9.1): fp64, fp32 and two 16-bit
// storage-only types. bf16_t and f16_t carry bits, not arithmetic: host code moves and rounds
// them; engines (cuda/) compute on them, bit-compatible with __nv_bfloat16 and __half.
// acc_t<T> is the accumulation type of a storage type: fp64 for fp64, fp32 for the others.
#pragma once

#include <cstdint>
#include <cstring>

#include "burstlab/precision.hpp"

namespace burstlab {

struct bf16_t {
  uint16_t bits = 0;
  bf16_t() = default;
  explicit bf16_t(float x) {  // round to nearest even (precision.hpp)
    const float r = round_to_bf16(x);
    uint32_t u;
    std::memcpy(&u, &r, 4);
    bits = static_cast<uint16_t>(u >> 16);
  }
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  }
  explicit operator double() const { return static_cast<float>(*this); }
};

struct f16_t {
  uint16_t bits = 0;
  f16_t() = default;
  explicit f16_t(float x);  // round to nearest even, subnormals included (src/contract.cpp)
  explicit operator float() const;
  explicit operator double() const { return static_cast<float>(*this); }
};

template <class T> struct Accum { using type = float; };
template <> struct Accum<double> { using type = double; };
template <class T> using acc_t = typename Accum<T>::type;

template <class T> constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<double>() { return Dtype::F64; }
template <> constexpr Dtype dtype_of<float>() { return Dtype::F32; }
template <> constexpr Dtype dtype_of<bf16_t>() { return Dtype::BF16; }
template <> constexpr Dtype dtype_of<f16_t>() { return Dtype::F16; }

inline int64_t bytes_of(Dtype t) { return t == Dtype::F64 ? 8 : t == Dtype::F32 ? 4 : 2; }

// Host conversions that every storage type accepts: from double (rounded once to T) and back.
template <class T> T from_double(double x) { return static_cast<T>(x); }
template <> inline bf16_t from_double<bf16_t>(double x) { return bf16_t(static_cast<float>(x)); }
template <> inline f16_t from_double<f16_t>(double x) { return f16_t(static_cast<float>(x)); }
template <class T> double to_double(T x) { return static_cast<double>(x); }

}  // namespace burstlab
