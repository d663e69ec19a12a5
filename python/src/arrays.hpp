// python/src/arrays.hpp — NumPy arrays as the contract's strided views (spec §1.2), for the
// bindings of python/src/core.cpp. An array is read in its stored layout (BSHD: (B, N, H, d),
// BHSD: (B, H, N, d)) and seen in the spec's logical order (b, h, n, k) by permuting strides, so
// no layout costs a copy. fp64 arrays with non-negative, element-aligned strides are used in
// place; every other array (fp32, fp16, bf16 held as uint16 bits, negative strides) is converted
// to a contiguous fp64 copy, exactly (every fp32/fp16/bf16 value is a double).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/tensor.hpp"
#include "npy.hpp"

namespace burstlab::py_arrays {

namespace py = pybind11;

inline std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t k = 0; k < a.ndim(); ++k) s += (k ? ", " : "") + std::to_string(a.shape(k));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

inline const char* axes_of(Layout layout) { return layout == Layout::BSHD ? "(B, N, H, d)" : "(B, H, N, d)"; }

// A dtype's size in bytes, read through Python: pybind11 before 2.12 reads it from NumPy 1's C
// struct layout, which NumPy 2 changed (garbage there, and Debian 12 ships pybind11 2.10).
inline int64_t itemsize_of(const py::dtype& t) { return t.attr("itemsize").cast<int64_t>(); }

// The element type of a floating-point array (native byte order); anything else is an Error
// naming the argument.
inline Dtype dtype_of_array(const py::array& a, const char* name) {
  const py::dtype t = a.dtype();
  const std::string text = py::str(static_cast<const py::handle&>(t));
  const std::string order = py::str(t.attr("byteorder"));
  if (order == ">") fail(name, " is big-endian (dtype ", text, "): native byte order expected");
  const std::string kind = py::str(t.attr("kind"));  // through Python, as itemsize_of
  const int64_t size = itemsize_of(t);
  if (kind == "f") {
    if (size == 8) return Dtype::F64;
    if (size == 4) return Dtype::F32;
    if (size == 2) return Dtype::F16;
  }
  // NumPy has no bfloat16: the package hands bf16 tensors over as their uint16 bits (same memory,
  // same strides) and refuses integer arrays from its callers, so uint16 here means bf16.
  if (kind == "u" && size == 2) return Dtype::BF16;
  fail(name, " has dtype ", text, ": float64, float32, float16 or bfloat16 (as uint16 bits) expected");
}

// One element as double, through byte offsets (any sign).
inline double element(const char* base, int64_t byte_offset, Dtype t) {
  const char* p = base + byte_offset;
  switch (t) {
    case Dtype::F64: { double x; std::memcpy(&x, p, 8); return x; }
    case Dtype::F32: { float x; std::memcpy(&x, p, 4); return x; }
    case Dtype::F16: { uint16_t h; std::memcpy(&h, p, 2); return check::half_bits_to_double(h); }
    case Dtype::BF16: { uint16_t h; std::memcpy(&h, p, 2); return check::bf16_bits_to_double(h); }
  }
  return 0;
}

// A 4-D array as a logical (B, H, N, d) fp64 view: in place when possible, else a converted copy
// held in `owned` (contiguous BHSD).
struct In4 {
  View4<const double> view;
  std::vector<double> owned;
  Dtype dtype = Dtype::F64;  // of the array
};

inline void logical_dims(const py::array& a, Layout layout, const char* name, int64_t dim[4]) {
  if (a.ndim() != 4)
    fail(name, " has shape ", shape_str(a), ": 4 dimensions ", axes_of(layout), " expected for layout ",
         to_string(layout));
  const bool bshd = layout == Layout::BSHD;
  dim[0] = a.shape(0);
  dim[1] = a.shape(bshd ? 2 : 1);
  dim[2] = a.shape(bshd ? 1 : 2);
  dim[3] = a.shape(3);
}

inline In4 in4(const py::array& a, Layout layout, const char* name) {
  In4 r;
  r.dtype = dtype_of_array(a, name);
  int64_t dim[4];
  logical_dims(a, layout, name, dim);
  const bool bshd = layout == Layout::BSHD;
  const int64_t item = itemsize_of(a.dtype());
  const int64_t bytes[4] = {a.strides(0), a.strides(bshd ? 2 : 1), a.strides(bshd ? 1 : 2), a.strides(3)};
  bool in_place = r.dtype == Dtype::F64 && reinterpret_cast<uintptr_t>(a.data()) % alignof(double) == 0;
  for (int k = 0; k < 4; ++k) in_place = in_place && bytes[k] >= 0 && bytes[k] % item == 0;
  r.view.data = static_cast<const double*>(a.data());
  for (int k = 0; k < 4; ++k) r.view.dim[k] = dim[k];
  if (in_place) {
    for (int k = 0; k < 4; ++k) r.view.stride[k] = bytes[k] / item;
    return r;
  }
  r.owned.resize(element_count({dim[0], dim[1], dim[2], dim[3]}));
  const char* base = static_cast<const char*>(a.data());
  size_t at = 0;
  for (int64_t b = 0; b < dim[0]; ++b)
    for (int64_t h = 0; h < dim[1]; ++h)
      for (int64_t n = 0; n < dim[2]; ++n)
        for (int64_t k = 0; k < dim[3]; ++k)
          r.owned[at++] = element(base, b * bytes[0] + h * bytes[1] + n * bytes[2] + k * bytes[3], r.dtype);
  r.view = view4<const double>(r.owned.data(), Layout::BHSD, dim[0], dim[1], dim[2], dim[3]);
  return r;
}

// Copies a logical view into an owning tensor stored in `layout` (what check/ holds).
inline Tensor4<double> to_tensor4(const View4<const double>& v, Layout layout) {
  Tensor4<double> t = make_tensor4<double>(layout, v.dim[0], v.dim[1], v.dim[2], v.dim[3]);
  const View4<double> w = t.view();
  for (int64_t b = 0; b < v.dim[0]; ++b)
    for (int64_t h = 0; h < v.dim[1]; ++h)
      for (int64_t n = 0; n < v.dim[2]; ++n)
        for (int64_t k = 0; k < v.dim[3]; ++k) w(b, h, n, k) = v(b, h, n, k);
  return t;
}

// A (B, H, N) array (LSE) as an owning fp64 tensor.
inline Tensor3<double> to_tensor3(const py::array& a, const char* name, Dtype* dtype = nullptr) {
  const Dtype t = dtype_of_array(a, name);
  if (dtype) *dtype = t;
  if (a.ndim() != 3) fail(name, " has shape ", shape_str(a), ": 3 dimensions (B, H_q, N_q) expected");
  Tensor3<double> r = make_tensor3<double>(a.shape(0), a.shape(1), a.shape(2));
  const char* base = static_cast<const char*>(a.data());
  size_t at = 0;
  for (int64_t b = 0; b < r.B; ++b)
    for (int64_t h = 0; h < r.H; ++h)
      for (int64_t n = 0; n < r.N; ++n)
        r.data[at++] = element(base, b * a.strides(0) + h * a.strides(1) + n * a.strides(2), t);
  return r;
}

// A view of T (float or double) over an array of T, in place (the operator's CPU kernel reads and
// writes torch's memory). Strides must be non-negative multiples of the element size; outputs
// must be writable (inputs are checked the same way: torch's CPU tensors always are).
template <class T>
void same_type(const py::array& a, const char* name) {
  const Dtype t = dtype_of_array(a, name);
  if (t != (sizeof(T) == 8 ? Dtype::F64 : Dtype::F32))
    fail(name, " has dtype ", to_string(t), " but q has ", sizeof(T) == 8 ? "fp64" : "fp32", ": one dtype for all");
}
template <class T>
View4<T> out4(const py::array& a, Layout layout, const char* name) {
  same_type<T>(a, name);
  int64_t dim[4];
  logical_dims(a, layout, name, dim);
  if (!a.writeable()) fail(name, " is read-only");
  const bool bshd = layout == Layout::BSHD;
  const int64_t bytes[4] = {a.strides(0), a.strides(bshd ? 2 : 1), a.strides(bshd ? 1 : 2), a.strides(3)};
  View4<T> v;
  v.data = static_cast<T*>(const_cast<void*>(a.data()));
  for (int k = 0; k < 4; ++k) {
    if (bytes[k] < 0 || bytes[k] % static_cast<int64_t>(sizeof(T)) != 0)
      fail(name, " has byte strides that are negative or not a multiple of ", sizeof(T));
    v.dim[k] = dim[k];
    v.stride[k] = bytes[k] / static_cast<int64_t>(sizeof(T));
  }
  return v;
}
template <class T>
View3<T> out3(const py::array& a, const char* name) {
  same_type<T>(a, name);
  if (a.ndim() != 3) fail(name, " has shape ", shape_str(a), ": 3 dimensions (B, H_q, N_q) expected");
  if (!a.writeable()) fail(name, " is read-only");
  View3<T> v;
  v.data = static_cast<T*>(const_cast<void*>(a.data()));
  for (int k = 0; k < 3; ++k) {
    if (a.strides(k) < 0 || a.strides(k) % static_cast<int64_t>(sizeof(T)) != 0)
      fail(name, " has byte strides that are negative or not a multiple of ", sizeof(T));
    v.dim[k] = a.shape(k);
    v.stride[k] = a.strides(k) / static_cast<int64_t>(sizeof(T));
  }
  return v;
}

}  // namespace burstlab::py_arrays
