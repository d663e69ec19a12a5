// check/npy.hpp — a strict reader and writer of NumPy .npy files (format versions 1.0, 2.0, 3.0)
// for the case files of `burstlab gen/oracle/check` (docs/conformance.md).
// Accepted element types: '<f8' (fp64), '<f4' (fp32), '<f2' (fp16) and '<V2' (bf16: NumPy has no
// bfloat16; ml_dtypes and PyTorch's numpy bridge store it as 2 raw little-endian bytes, the top
// half of the fp32 bit pattern). Only C order (fortran_order False). Every malformed file
// (truncated, another dtype, Fortran order, big-endian, absurd shape, header garbage) throws
// burstlab::Error naming the file and the problem; nothing is allocated before the header's size
// has been checked against the bytes present. Values are returned upcast to double (exact).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/precision.hpp"

namespace burstlab::check {

struct NpyArray {
  Dtype dtype = Dtype::F64;     // the file's element type
  std::vector<int64_t> shape;   // C order; empty = a scalar
  std::vector<double> data;     // prod(shape) values, upcast exactly
};

// Parses the bytes of a .npy file; `name` (usually its path) starts every error message.
NpyArray parse_npy(const std::string& bytes, const std::string& name);
NpyArray read_npy(const std::string& path);  // throws Error naming the path if it cannot be read

// Serializes `data` (prod(shape) values, rounded to `dtype` with round-to-nearest-even) as a
// version 1.0 .npy (2.0 when the header needs it). Throws Error when sizes disagree.
std::string format_npy(Dtype dtype, const std::vector<int64_t>& shape, const double* data, size_t n);
void write_npy(const std::string& path, Dtype dtype, const std::vector<int64_t>& shape, const double* data,
               size_t n);

// Integer arrays ('<i8', and '<i4' read as int64), little-endian, C order: the labels of the LM
// head's case files (check/lmhead_case.hpp). Same strictness as parse_npy; written as '<i8'.
struct NpyInt64 {
  std::vector<int64_t> shape;
  std::vector<int64_t> data;
};
NpyInt64 parse_npy_int64(const std::string& bytes, const std::string& name);
NpyInt64 read_npy_int64(const std::string& path);
std::string format_npy_int64(const std::vector<int64_t>& shape, const int64_t* data, size_t n);
void write_npy_int64(const std::string& path, const std::vector<int64_t>& shape, const int64_t* data, size_t n);

// Bit conversions used by the reader/writer (exposed for tests).
double half_bits_to_double(uint16_t h);
uint16_t double_to_half_bits(double x);   // round to nearest even, subnormals, inf, nan
double bf16_bits_to_double(uint16_t b);
uint16_t double_to_bf16_bits(double x);   // via fp32, round to nearest even

// Whole-file helpers shared by the case reader.
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace burstlab::check
