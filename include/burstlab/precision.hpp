// burstlab/precision.hpp — dtypes and unit roundoffs used by the tolerance rule (spec §9).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace burstlab {

// Storage precision of a candidate's inputs and outputs. Accumulation is fp64 for F64 and fp32
// for every other dtype (§9.1).
enum class Dtype { F64, F32, BF16, F16 };

std::string to_string(Dtype t);
Dtype parse_dtype(const std::string& s);  // "fp64|f64|double", "fp32|f32|float", "bf16", "fp16|f16"

// Unit roundoff u = 2^-p (round to nearest), p = significand bits incl. the implicit one.
inline double unit_roundoff(Dtype t) {
  switch (t) {
    case Dtype::F64: return std::ldexp(1.0, -53);
    case Dtype::F32: return std::ldexp(1.0, -24);
    case Dtype::BF16: return std::ldexp(1.0, -8);
    case Dtype::F16: return std::ldexp(1.0, -11);
  }
  return 1.0;
}
inline Dtype accumulator_of(Dtype t) { return t == Dtype::F64 ? Dtype::F64 : Dtype::F32; }

// Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term dot product or sum.
// Saturates at +inf when n u >= 1 (no bound exists then).
inline double gamma_n(double n, double u) {
  const double nu = n * u;
  return nu < 1.0 ? nu / (1.0 - nu) : HUGE_VAL;
}

// Host rounding of a float to bf16 / fp16 (round to nearest even), returned as float. Inputs for
// a bf16/fp16 candidate are rounded first so the oracle sees exactly what the candidate sees.
inline float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) {  // inf / nan: keep, quiet nan
    if (u & 0x007fffffu) u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  u &= 0xffff0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}
float round_to_fp16(float x);  // via IEEE half rounding, subnormals included
inline double round_to(Dtype t, double x) {
  switch (t) {
    case Dtype::F64: return x;
    case Dtype::F32: return static_cast<float>(x);
    case Dtype::BF16: return round_to_bf16(static_cast<float>(x));
    case Dtype::F16: return round_to_fp16(static_cast<float>(x));
  }
  return x;
}

}  // namespace burstlab
