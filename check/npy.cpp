// check/npy.cpp — strict .npy reader/writer (see npy.hpp). The header is a Python dict literal
// (NumPy's format.py): {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
// spaces and a newline. It is parsed by hand, strictly: exactly these three keys, once each.
#include "npy.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "burstlab/error.hpp"

namespace burstlab::check {
namespace {

constexpr size_t kMaxHeader = 1 << 16;  // NumPy itself refuses headers over 10000 bytes by default
constexpr size_t kMaxDims = 32;         // NumPy's limit is 64; case tensors have at most 4

int itemsize(Dtype t) { return t == Dtype::F64 ? 8 : t == Dtype::F32 ? 4 : 2; }
const char* descr_of(Dtype t) {
  switch (t) {
    case Dtype::F64: return "<f8";
    case Dtype::F32: return "<f4";
    case Dtype::F16: return "<f2";
    case Dtype::BF16: return "<V2";
  }
  return "?";
}

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

// Cursor over the header text; every error names the file.
struct Parser {
  const std::string& s;
  const std::string& name;
  size_t at = 0;
  [[noreturn]] void bad(const std::string& what) const {
    fail(name, ": malformed .npy header: ", what, " at header byte ", at, " (header: ", printable(), ")");
  }
  std::string printable() const {
    std::string out;
    for (char c : s.substr(0, 120)) out += (c >= 32 && c < 127) ? c : '?';
    return s.size() > 120 ? out + "..." : out;
  }
  void ws() {
    while (at < s.size() && (s[at] == ' ' || s[at] == '\t' || s[at] == '\n' || s[at] == '\r')) ++at;
  }
  bool eat(char c) {
    ws();
    if (at < s.size() && s[at] == c) { ++at; return true; }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) bad(std::string("expected '") + c + "'");
  }
  std::string str() {
    ws();
    if (at >= s.size() || (s[at] != '\'' && s[at] != '"')) bad("expected a quoted string");
    const char q = s[at++];
    std::string out;
    while (at < s.size() && s[at] != q) {
      if (s[at] == '\\') bad("escapes are not allowed in keys or descr");
      out += s[at++];
    }
    if (at >= s.size()) bad("unterminated string");
    ++at;
    return out;
  }
  bool word(const char* w) {
    ws();
    const size_t n = std::strlen(w);
    if (s.compare(at, n, w) == 0) { at += n; return true; }
    return false;
  }
  int64_t integer() {
    ws();
    if (at >= s.size() || s[at] < '0' || s[at] > '9') bad("expected a non-negative integer in shape");
    int64_t v = 0;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
      const int digit = s[at++] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) bad("shape entry overflows int64");
      v = v * 10 + digit;
    }
    if (at < s.size() && (s[at] == 'L' || s[at] == 'l')) ++at;  // Python 2 long suffix
    return v;
  }
};

Dtype parse_descr(const std::string& d, const std::string& name) {
  if (d == "<f8") return Dtype::F64;
  if (d == "<f4") return Dtype::F32;
  if (d == "<f2") return Dtype::F16;
  if (d == "<V2" || d == "|V2") return Dtype::BF16;  // ml_dtypes bfloat16 (raw 2-byte void)
  if (d == ">f8" || d == ">f4" || d == ">f2" || d == ">V2")
    fail(name, ": dtype '", d, "' is big-endian; burstlab reads little-endian only (np.save(a.astype(a.dtype.newbyteorder('<'))))");
  fail(name, ": dtype '", d, "' is not supported; expected '<f8' (fp64), '<f4' (fp32), '<f2' (fp16) or '<V2' (bf16)");
}

// The header of a .npy file, parsed strictly; data_at is the offset of the first element.
struct Header {
  std::string descr;
  std::vector<int64_t> shape;
  bool fortran = false;
  size_t data_at = 0;
};
Header parse_header(const std::string& bytes, const std::string& name) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0)
    fail(name, ": not a .npy file (missing the \\x93NUMPY magic; ", bytes.size(), " bytes)");
  const int major = p[6], minor = p[7];
  if (major < 1 || major > 3 || minor != 0)
    fail(name, ": .npy format version ", major, ".", minor, " is not supported (1.0, 2.0, 3.0 are)");
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes) fail(name, ": truncated .npy (", bytes.size(), " bytes, no header length)");
  const uint64_t hlen = le(p + 8, static_cast<int>(len_bytes));
  const size_t start = 8 + len_bytes;
  if (hlen > kMaxHeader) fail(name, ": .npy header length ", hlen, " is absurd (limit ", kMaxHeader, ")");
  if (bytes.size() < start + hlen)
    fail(name, ": truncated .npy: header says ", hlen, " header bytes but the file has ", bytes.size() - start);
  const std::string header = bytes.substr(start, hlen);

  Parser ps{header, name};
  ps.expect('{');
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  std::string descr;
  std::vector<int64_t> shape;
  while (!ps.eat('}')) {
    const std::string key = ps.str();
    ps.expect(':');
    if (key == "descr") {
      if (have_descr) ps.bad("duplicate key 'descr'");
      ps.ws();
      if (ps.at < header.size() && header[ps.at] == '[')
        fail(name, ": structured dtype (descr is a list) is not supported; expected '<f8', '<f4', '<f2' or '<V2'");
      descr = ps.str();
      have_descr = true;
    } else if (key == "fortran_order") {
      if (have_order) ps.bad("duplicate key 'fortran_order'");
      if (ps.word("True")) fortran = true;
      else if (ps.word("False")) fortran = false;
      else ps.bad("fortran_order must be True or False");
      have_order = true;
    } else if (key == "shape") {
      if (have_shape) ps.bad("duplicate key 'shape'");
      ps.expect('(');
      while (!ps.eat(')')) {
        if (shape.size() >= kMaxDims) fail(name, ": shape has more than ", kMaxDims, " dimensions");
        shape.push_back(ps.integer());
        if (!ps.eat(',')) { ps.expect(')'); break; }
      }
      have_shape = true;
    } else {
      ps.bad("unknown key '" + key + "'");
    }
    if (!ps.eat(',')) { ps.expect('}'); break; }
  }
  ps.ws();
  if (ps.at != header.size()) ps.bad("trailing characters after the dict");
  if (!have_descr || !have_order || !have_shape)
    fail(name, ": .npy header lacks '", !have_descr ? "descr" : !have_order ? "fortran_order" : "shape", "'");
  Header h;
  h.descr = descr;
  h.shape = shape;
  h.fortran = fortran;
  h.data_at = start + hlen;
  return h;
}

// prod(shape) elements of isz bytes must be exactly what follows the header; checked before any
// allocation.
uint64_t element_count(const std::string& bytes, const std::string& name, const Header& h, uint64_t isz) {
  const uint64_t have = bytes.size() - h.data_at;
  const std::vector<int64_t>& shape = h.shape;
  std::ostringstream sh;
  for (size_t k = 0; k < shape.size(); ++k) sh << (k ? ", " : "") << shape[k];
  bool zero = false;
  for (int64_t n : shape) zero = zero || n == 0;
  uint64_t count = zero ? 0 : 1;
  for (int64_t n : shape) {
    if (zero) break;
    if (count > std::numeric_limits<uint64_t>::max() / 8 / static_cast<uint64_t>(n))
      fail(name, ": shape (", sh.str(), ") is absurd: its element count overflows 64 bits");
    count *= static_cast<uint64_t>(n);
  }
  if (count > have / isz)
    fail(name, ": truncated data or absurd shape: shape (", sh.str(), ") needs ", count, " x ", isz, " bytes of ",
         h.descr, " but ", have, " follow the header");
  if (count * isz != have)
    fail(name, ": trailing data: shape (", sh.str(), ") needs ", count * isz, " bytes of ", h.descr, " but ", have,
         " follow the header");
  return count;
}

// The dict and padding of a version 1.0 header (2.0 when it needs it), for `count` elements.
std::string header_bytes(const char* descr, const std::vector<int64_t>& shape, size_t n) {
  size_t count = 1;
  std::string sh;
  for (int64_t k : shape) {
    if (k < 0) fail("npy shape entry (", k, ") must be >= 0");
    count *= static_cast<size_t>(k);
    sh += std::to_string(k) + ", ";
  }
  if (shape.size() > 1) sh.resize(sh.size() - 2);  // "(2, 3)"
  else if (shape.size() == 1) sh.resize(sh.size() - 1);  // "(3,)": a one-element tuple
  if (count != n) fail("npy data size (", n, ") must equal the product of its shape (", count, ")");
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + sh + "), }";
  // Pad so that magic + length + header is a multiple of 64 bytes, ending in '\n' (format.py).
  const bool v2 = dict.size() + 11 > 65535;
  const size_t pre = v2 ? 12 : 10;
  const size_t total = ((pre + dict.size() + 1 + 63) / 64) * 64;
  dict.append(total - pre - dict.size() - 1, ' ');
  dict += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  const size_t hl = dict.size();
  for (size_t k = 0; k < (v2 ? 4u : 2u); ++k) out += static_cast<char>((hl >> (8 * k)) & 0xff);
  return out + dict;
}

}  // namespace

double half_bits_to_double(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0) v = std::ldexp(static_cast<double>(m), -24);  // zero or subnormal
  else if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : HUGE_VAL;
  else v = std::ldexp(static_cast<double>(m | 0x400), e - 25);
  return sign ? -v : v;
}

uint16_t double_to_half_bits(double x) {
  const double r = round_to_fp16(static_cast<float>(x));  // exact fp16 value (or inf / nan)
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (std::isnan(r)) return sign | 0x7e00;
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::ldexp(a, 24));  // subnormal / 0
  int e;
  const double f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  const uint16_t m = static_cast<uint16_t>(std::ldexp(f, 11)) & 0x3ff;
  return sign | static_cast<uint16_t>((e + 14) << 10) | m;
}

double bf16_bits_to_double(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t double_to_bf16_bits(double x) {
  const float f = round_to_bf16(static_cast<float>(x));
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

NpyArray parse_npy(const std::string& bytes, const std::string& name) {
  const Header h = parse_header(bytes, name);
  NpyArray a;
  a.dtype = parse_descr(h.descr, name);
  if (h.fortran) fail(name, ": fortran_order is True; burstlab reads C order only (save np.ascontiguousarray(a))");
  a.shape = h.shape;
  const uint64_t count = element_count(bytes, name, h, static_cast<uint64_t>(itemsize(a.dtype)));
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  a.data.resize(count);
  const unsigned char* d = p + h.data_at;
  for (uint64_t k = 0; k < count; ++k) {
    switch (a.dtype) {
      case Dtype::F64: { const uint64_t u = le(d + 8 * k, 8); double v; std::memcpy(&v, &u, 8); a.data[k] = v; break; }
      case Dtype::F32: { const uint32_t u = static_cast<uint32_t>(le(d + 4 * k, 4)); float v; std::memcpy(&v, &u, 4); a.data[k] = v; break; }
      case Dtype::F16: a.data[k] = half_bits_to_double(static_cast<uint16_t>(le(d + 2 * k, 2))); break;
      case Dtype::BF16: a.data[k] = bf16_bits_to_double(static_cast<uint16_t>(le(d + 2 * k, 2))); break;
    }
  }
  return a;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot open for reading");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail(path, ": read error");
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(path, ": cannot open for writing");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) fail(path, ": write error");
}

NpyArray read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

std::string format_npy(Dtype dtype, const std::vector<int64_t>& shape, const double* data, size_t n) {
  std::string out = header_bytes(descr_of(dtype), shape, n);
  const int isz = itemsize(dtype);
  out.reserve(out.size() + n * isz);
  for (size_t k = 0; k < n; ++k) {
    uint64_t u = 0;
    switch (dtype) {
      case Dtype::F64: std::memcpy(&u, &data[k], 8); break;
      case Dtype::F32: { const float f = static_cast<float>(data[k]); uint32_t w; std::memcpy(&w, &f, 4); u = w; break; }
      case Dtype::F16: u = double_to_half_bits(data[k]); break;
      case Dtype::BF16: u = double_to_bf16_bits(data[k]); break;
    }
    for (int b = 0; b < isz; ++b) out += static_cast<char>((u >> (8 * b)) & 0xff);
  }
  return out;
}

void write_npy(const std::string& path, Dtype dtype, const std::vector<int64_t>& shape, const double* data,
               size_t n) {
  write_file(path, format_npy(dtype, shape, data, n));
}

NpyInt64 parse_npy_int64(const std::string& bytes, const std::string& name) {
  const Header h = parse_header(bytes, name);
  if (h.descr != "<i8" && h.descr != "<i4")
    fail(name, ": dtype '", h.descr, "' is not supported for integers; expected '<i8' (int64) or '<i4' (int32)");
  if (h.fortran) fail(name, ": fortran_order is True; burstlab reads C order only (save np.ascontiguousarray(a))");
  const int isz = h.descr == "<i8" ? 8 : 4;
  const uint64_t count = element_count(bytes, name, h, static_cast<uint64_t>(isz));
  NpyInt64 a;
  a.shape = h.shape;
  a.data.resize(count);
  const auto* d = reinterpret_cast<const unsigned char*>(bytes.data()) + h.data_at;
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t u = le(d + isz * k, isz);
    a.data[k] = isz == 8 ? static_cast<int64_t>(u) : static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(u)));
  }
  return a;
}

NpyInt64 read_npy_int64(const std::string& path) { return parse_npy_int64(read_file(path), path); }

std::string format_npy_int64(const std::vector<int64_t>& shape, const int64_t* data, size_t n) {
  std::string out = header_bytes("<i8", shape, n);
  out.reserve(out.size() + n * 8);
  for (size_t k = 0; k < n; ++k) {
    const uint64_t u = static_cast<uint64_t>(data[k]);
    for (int b = 0; b < 8; ++b) out += static_cast<char>((u >> (8 * b)) & 0xff);
  }
  return out;
}

void write_npy_int64(const std::string& path, const std::vector<int64_t>& shape, const int64_t* data, size_t n) {
  write_file(path, format_npy_int64(shape, data, n));
}

}  // namespace burstlab::check
