// tests/check/test_npy.cpp — the strict .npy reader/writer: fp16/bf16 bit conversions, round
// trips with files written and read by NumPy (Debian's /usr/bin/python3), and one clear
// burstlab::Error naming the file for every malformed class.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "burstlab/error.hpp"
#include "npy.hpp"

using namespace burstlab;
using namespace burstlab::check;

namespace {

std::string tmp(const std::string& name) { return ::testing::TempDir() + "h7_npy_" + name; }

bool have_numpy() {
  static const int rc = std::system(BURSTLAB_PYTHON " -c 'import numpy' > /dev/null 2>&1");
  return rc == 0;
}

// Runs a Python script with Debian's python3 (NumPy); returns its exit status.
int python(const std::string& script) {
  const std::string path = tmp("script.py");
  write_file(path, script);
  return std::system((std::string(BURSTLAB_PYTHON " ") + path).c_str());
}

// Hex-float lines ("0x1.8p+1", "inf", "-inf", "nan") parsed with strtod: exact.
std::vector<double> read_hex(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<double> v;
  std::string w;
  while (in >> w) v.push_back(std::strtod(w.c_str(), nullptr));
  return v;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

// A header with arbitrary dict text, version and payload.
std::string npy_bytes(const std::string& dict, const std::string& payload, int version = 1) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(version);
  out += '\0';
  const size_t n = dict.size();
  const int len_bytes = version == 1 ? 2 : 4;
  for (int k = 0; k < len_bytes; ++k) out += static_cast<char>((n >> (8 * k)) & 0xff);
  return out + dict + payload;
}

// Expects parse_npy to throw Error whose message names the file and contains `what`.
void expect_error(const std::string& bytes, const std::string& what) {
  try {
    parse_npy(bytes, "bad_file.npy");
    ADD_FAILURE() << "no error; expected one containing '" << what << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad_file.npy"), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << "message: " << m << "\nexpected to contain: " << what;
  }
}

}  // namespace

// Every non-NaN 16-bit pattern comes back from double unchanged.
template <class ToDouble, class ToBits>
void expect_round_trip_every_pattern(const char* name, ToDouble to_double, ToBits to_bits) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double x = to_double(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;
    ASSERT_EQ(to_bits(x), h) << name << " 0x" << std::hex << h;
  }
}

TEST(Npy, HalfBitsRoundTripEveryPattern) {
  expect_round_trip_every_pattern("half", half_bits_to_double, double_to_half_bits);
  EXPECT_EQ(half_bits_to_double(0x3c00), 1.0);
  EXPECT_EQ(half_bits_to_double(0x0001), std::ldexp(1.0, -24));  // smallest subnormal
  EXPECT_EQ(half_bits_to_double(0x7bff), 65504.0);
  EXPECT_EQ(double_to_half_bits(1e6), 0x7c00);                    // overflows to +inf
  EXPECT_EQ(double_to_half_bits(1.0 + std::ldexp(1.0, -11)), 0x3c00);  // tie to even
}

TEST(Npy, Bf16BitsRoundTripEveryPattern) {
  expect_round_trip_every_pattern("bf16", bf16_bits_to_double, double_to_bf16_bits);
  EXPECT_EQ(bf16_bits_to_double(0x3f80), 1.0);
}

TEST(Npy, OwnRoundTripEveryDtype) {
  const std::vector<double> v = {1.5, -2.25, 0.0, -0.0, 3.0e-5, 65504.0, HUGE_VAL, -HUGE_VAL};
  for (Dtype t : {Dtype::F64, Dtype::F32, Dtype::F16, Dtype::BF16}) {
    const NpyArray a = parse_npy(format_npy(t, {2, 4}, v.data(), v.size()), "x.npy");
    EXPECT_EQ(a.dtype, t);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 4}));
    for (size_t k = 0; k < v.size(); ++k) EXPECT_TRUE(same(a.data[k], round_to(t, v[k]))) << to_string(t) << " " << k;
  }
  // Scalars and one-dimensional arrays: "()" and "(3,)".
  const double s = 7.0;
  EXPECT_EQ(parse_npy(format_npy(Dtype::F64, {}, &s, 1), "s.npy").data.at(0), 7.0);
  EXPECT_EQ(parse_npy(format_npy(Dtype::F32, {3}, v.data(), 3), "s.npy").shape, std::vector<int64_t>{3});
  EXPECT_THROW(format_npy(Dtype::F32, {2, 2}, v.data(), 3), Error);
}

TEST(Npy, ReadsFilesWrittenByNumPy) {
  if (!have_numpy()) GTEST_SKIP() << BURSTLAB_PYTHON " has no numpy (Debian: python3-numpy)";
  const std::string dir = ::testing::TempDir() + "h7_npy_";
  const std::string script = R"(
import numpy as np
d = ")" + dir + R"("
rng = np.random.default_rng(7)
special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 5.96e-8, 6.1e-5, 65504.0])
for name, dt in [("f8", np.float64), ("f4", np.float32), ("f2", np.float16)]:
    a = rng.standard_normal((2, 3, 5, 4)).astype(dt)
    a.reshape(-1)[:8] = special.astype(dt)
    np.save(d + "np_" + name + ".npy", a)
    open(d + "np_" + name + ".txt", "w").write("\n".join(float(x).hex() if np.isfinite(x) else str(x) for x in a.astype(np.float64).reshape(-1)))
# version 2.0 header
a = rng.standard_normal((3, 7)).astype(np.float32)
with open(d + "np_v2.npy", "wb") as f:
    np.lib.format.write_array(f, a, version=(2, 0))
open(d + "np_v2.txt", "w").write("\n".join(float(x).hex() for x in a.astype(np.float64).reshape(-1)))
# bf16 as ml_dtypes stores it: 2 raw bytes, the top half of the fp32 pattern (numpy: '|V2')
f = rng.standard_normal((4, 6)).astype(np.float32)
bits = (f.view(np.uint32) >> 16).astype(np.uint16)
np.save(d + "np_bf16.npy", bits.view("V2"))
back = (bits.astype(np.uint32) << 16).view(np.float32)
open(d + "np_bf16.txt", "w").write("\n".join(float(x).hex() for x in back.astype(np.float64).reshape(-1)))
)";
  ASSERT_EQ(python(script), 0);
  struct F { const char* name; Dtype t; std::vector<int64_t> shape; };
  for (const F& f : {F{"f8", Dtype::F64, {2, 3, 5, 4}}, F{"f4", Dtype::F32, {2, 3, 5, 4}},
                     F{"f2", Dtype::F16, {2, 3, 5, 4}}, F{"v2", Dtype::F32, {3, 7}}, F{"bf16", Dtype::BF16, {4, 6}}}) {
    const NpyArray a = read_npy(dir + "np_" + f.name + ".npy");
    const std::vector<double> want = read_hex(dir + "np_" + f.name + ".txt");
    EXPECT_EQ(a.dtype, f.t) << f.name;
    EXPECT_EQ(a.shape, f.shape) << f.name;
    ASSERT_EQ(a.data.size(), want.size()) << f.name;
    for (size_t k = 0; k < want.size(); ++k) ASSERT_TRUE(same(a.data[k], want[k])) << f.name << " element " << k;
  }
}

TEST(Npy, NumPyReadsOurFiles) {
  if (!have_numpy()) GTEST_SKIP() << BURSTLAB_PYTHON " has no numpy (Debian: python3-numpy)";
  const std::string dir = ::testing::TempDir() + "h7_npy_";
  std::vector<double> v(2 * 3 * 4);
  for (size_t k = 0; k < v.size(); ++k) v[k] = std::sin(1.0 + k) * std::pow(10.0, static_cast<int>(k % 7) - 3);
  v[5] = -HUGE_VAL;
  for (auto [name, t] : {std::pair{"f8", Dtype::F64}, {"f4", Dtype::F32}, {"f2", Dtype::F16}, {"bf16", Dtype::BF16}})
    write_npy(dir + "ours_" + name + ".npy", t, {2, 3, 4}, v.data(), v.size());
  const std::string script = R"(
import numpy as np
d = ")" + dir + R"("
for name in ["f8", "f4", "f2", "bf16"]:
    a = np.load(d + "ours_" + name + ".npy")
    assert a.shape == (2, 3, 4), a.shape
    if name == "bf16":
        assert a.dtype.itemsize == 2 and a.dtype.kind == "V", a.dtype
        a = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    open(d + "ours_" + name + ".txt", "w").write("\n".join(float(x).hex() if np.isfinite(x) else str(x) for x in a.astype(np.float64).reshape(-1)))
)";
  ASSERT_EQ(python(script), 0);
  for (auto [name, t] : {std::pair{"f8", Dtype::F64}, {"f4", Dtype::F32}, {"f2", Dtype::F16}, {"bf16", Dtype::BF16}}) {
    const std::vector<double> got = read_hex(dir + "ours_" + name + ".txt");
    ASSERT_EQ(got.size(), v.size());
    for (size_t k = 0; k < v.size(); ++k) EXPECT_TRUE(same(got[k], round_to(t, v[k]))) << name << " " << k;
  }
}

TEST(Npy, EveryMalformedClassGetsAClearError) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6};
  const std::string good = format_npy(Dtype::F32, {2, 3}, v.data(), v.size());
  ASSERT_NO_THROW(parse_npy(good, "good.npy"));
  const std::string payload = good.substr(good.size() - 24);
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";

  // truncated: data, header, header length, magic
  expect_error(good.substr(0, good.size() - 1), "truncated data");
  expect_error(good.substr(0, 40), "truncated .npy");
  expect_error(good.substr(0, 9), "not a .npy file");
  expect_error("", "not a .npy file");
  expect_error(good + "xx", "trailing data");
  // wrong dtype, big-endian, structured
  expect_error(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", payload), "dtype '<i4' is not supported");
  expect_error(npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", payload), "not supported");
  expect_error(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", payload), "big-endian");
  expect_error(npy_bytes("{'descr': '>f8', 'fortran_order': False, 'shape': (3,), }", payload), "big-endian");
  expect_error(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", payload), "structured");
  // Fortran order
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", payload), "fortran_order is True");
  // absurd shapes: far beyond the file, overflowing products, overflowing integers, too many dims
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }", payload),
               "absurd");
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }", payload),
               "truncated data or absurd shape");
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775807), }", payload),
               "trailing data");  // zero elements, 24 bytes present
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }", payload),
               "overflows int64");
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,), }", payload),
               "more than 32 dimensions");
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", payload), "non-negative integer");
  // header garbage
  expect_error(npy_bytes("garbage", payload), "malformed .npy header");
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 3), }", payload), "True or False");
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}", payload), "unknown key 'extra'");
  expect_error(npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", payload), "duplicate key");
  expect_error(npy_bytes("{'descr': '<f4', 'shape': (2, 3)}", payload), "lacks 'fortran_order'");
  expect_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} trailing", payload), "trailing characters");
  expect_error(npy_bytes("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}", payload), "malformed .npy header");
  expect_error(npy_bytes(f4, payload, 4), "version 4.0 is not supported");
  std::string huge_len = good;
  huge_len[8] = '\xff';
  huge_len[9] = '\xff';
  expect_error(npy_bytes(f4, payload, 2).substr(0, 8) + std::string("\xff\xff\xff\x7f", 4) + f4, "absurd");
  expect_error(huge_len, "truncated .npy");
  // version 2.0 and 3.0 headers are accepted
  EXPECT_EQ(parse_npy(npy_bytes(f4, payload, 2), "v2.npy").data.size(), 6u);
  EXPECT_EQ(parse_npy(npy_bytes(f4, payload, 3), "v3.npy").data.size(), 6u);
  // a missing file names its path
  try {
    read_npy(tmp("does_not_exist.npy"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does_not_exist.npy: cannot open"), std::string::npos) << e.what();
  }
}
