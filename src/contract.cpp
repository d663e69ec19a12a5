// The contract's host functions: validation (spec §1.4), mask compilation (§3), FLOPs (§8).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "burstlab/error.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/names.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/storage.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

std::string to_string(Layout layout) { return layout == Layout::BSHD ? "BSHD" : "BHSD"; }
Layout parse_layout(const std::string& s) {
  if (s == "BSHD" || s == "bshd") return Layout::BSHD;
  if (s == "BHSD" || s == "bhsd") return Layout::BHSD;
  fail("layout (", s, ") must be BSHD or BHSD");
}

std::string to_string(Dtype t) {
  static constexpr Named<Dtype> names[] = {
      {Dtype::F64, "fp64"}, {Dtype::F32, "fp32"}, {Dtype::BF16, "bf16"}, {Dtype::F16, "fp16"}};
  return name_of(t, names);
}
Dtype parse_dtype(const std::string& s) {
  if (s == "fp64" || s == "f64" || s == "double") return Dtype::F64;
  if (s == "fp32" || s == "f32" || s == "float") return Dtype::F32;
  if (s == "bf16" || s == "bfloat16") return Dtype::BF16;
  if (s == "fp16" || s == "f16" || s == "half") return Dtype::F16;
  fail("dtype (", s, ") must be one of fp64, fp32, bf16, fp16");
}

float round_to_fp16(float x) {
  if (std::isnan(x)) return x;
  const float ax = std::fabs(x);
  if (ax >= 65520.0f) return std::copysign(HUGE_VALF, x);  // rounds past the largest half (65504)
  int e;
  std::frexp(ax, &e);                                     // ax = f * 2^e, f in [0.5, 1)
  const int exp_unit = std::max(e - 11, -24);             // 11 significant bits; subnormal step 2^-24
  const float q = std::ldexp(1.0f, exp_unit);
  return std::copysign(std::nearbyint(ax / q) * q, x);    // nearbyint: ties to even (default mode)
}

// f16_t: the float is rounded to fp16 first, so the encoding below is exact.
f16_t::f16_t(float x) {
  const float r = round_to_fp16(x);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(r);
  if (std::isnan(r)) { bits = sign | 0x7e00u; return; }
  if (std::isinf(r)) { bits = sign | 0x7c00u; return; }
  if (a < std::ldexp(1.0f, -14)) {  // subnormal (or zero): a multiple of 2^-24
    bits = sign | static_cast<uint16_t>(std::ldexp(a, 24));
    return;
  }
  int e;
  const float f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): exponent field e - 1 + 15
  const uint32_t mant = static_cast<uint32_t>(std::ldexp(f, 11)) - 1024u;  // 10 fraction bits
  bits = sign | static_cast<uint16_t>(((e + 14) << 10) | mant);
}
f16_t::operator float() const {
  const uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
  const float s = (bits & 0x8000u) ? -1.0f : 1.0f;
  if (e == 0) return s * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return m ? std::numeric_limits<float>::quiet_NaN() : s * HUGE_VALF;
  return s * std::ldexp(static_cast<float>(m + 1024u), static_cast<int>(e) - 25);
}

// ---------------------------------------------------------------- mask (§3)
int64_t band_left(const MaskSpec& m) { return m.window_left; }
int64_t band_right(const MaskSpec& m) {
  if (!m.causal) return m.window_right;
  return m.window_right < 0 ? 0 : std::min<int64_t>(m.window_right, 0);
}
bool has_band(const MaskSpec& m) { return band_left(m) >= 0 || band_right(m) >= 0; }
bool has_document(const MaskSpec& m) { return !m.q_segment.empty() || !m.k_segment.empty(); }
bool has_block(const MaskSpec& m) { return m.block_q > 0 || m.block_k > 0 || !m.block_mask.empty(); }
bool is_full(const MaskSpec& m) { return !has_band(m) && !has_document(m) && !has_block(m); }

std::string describe(const MaskSpec& m) {
  std::vector<std::string> parts;
  if (has_band(m)) {
    if (m.causal && m.window_left < 0 && band_right(m) == 0) {
      parts.push_back("causal");
    } else {
      std::ostringstream os;
      os << "window(" << band_left(m) << "," << band_right(m) << ")";
      parts.push_back(os.str());
    }
  }
  if (has_document(m)) {
    std::vector<int32_t> ids(m.q_segment);  // documents seen on either side
    ids.insert(ids.end(), m.k_segment.begin(), m.k_segment.end());
    std::sort(ids.begin(), ids.end());
    const int64_t docs = std::unique(ids.begin(), ids.end()) - ids.begin();
    parts.push_back("doc(" + std::to_string(docs) + ")");
  }
  if (has_block(m)) {
    int64_t on = 0;
    for (uint8_t b : m.block_mask) on += b != 0;
    const double pct = m.block_mask.empty() ? 0.0 : 100.0 * on / m.block_mask.size();
    std::ostringstream os;
    os << "block(" << m.block_q << "x" << m.block_k << "," << static_cast<int>(std::lround(pct)) << "%)";
    parts.push_back(os.str());
  }
  if (parts.empty()) return "none";
  std::string s = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) s += "+" + parts[k];
  return s;
}

// ---------------------------------------------------------------- validation (§1.4)
namespace {
constexpr int64_t kMaxElems = int64_t(1) << 48;  // keeps every index product far from overflow

void check_positive(const char* name, int64_t v) {
  if (v < 1) fail(name, " (", v, ") must be >= 1");
}

void check_segments(const char* name, const char* n_name, const std::vector<int32_t>& s, int64_t n) {
  if (static_cast<int64_t>(s.size()) != n)
    fail(name, " has ", s.size(), " entries but ", n_name, " is ", n);
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] < 0) fail(name, "[", i, "] (", s[i], ") must be >= 0");
    if (i > 0 && s[i] < s[i - 1])
      fail(name, "[", i, "] (", s[i], ") is less than ", name, "[", i - 1, "] (", s[i - 1],
           "): segment ids must be non-decreasing (documents are contiguous)");
  }
}
}  // namespace

void validate(const Problem& p) {
  check_positive("B", p.B);
  check_positive("H_q", p.H_q);
  check_positive("H_kv", p.H_kv);
  check_positive("N_q", p.N_q);
  check_positive("N_k", p.N_k);
  check_positive("d", p.d);
  if (p.H_q % p.H_kv != 0) fail("H_q (", p.H_q, ") must be a multiple of H_kv (", p.H_kv, ")");
  const double q_elems = double(p.B) * p.H_q * p.N_q * p.d, k_elems = double(p.B) * p.H_kv * p.N_k * p.d;
  if (q_elems > double(kMaxElems) || k_elems > double(kMaxElems) || double(p.N_q) * p.N_k > double(kMaxElems))
    fail("problem size (", shape_string(p), ") exceeds 2^48 elements per tensor");
  if (p.scale && !std::isfinite(*p.scale)) fail("scale (", *p.scale, ") must be finite");
  const MaskSpec& m = p.mask;
  if (m.window_left < -1) fail("window_left (", m.window_left, ") must be >= 0, or -1 for unbounded");
  if (m.window_right < -1) fail("window_right (", m.window_right, ") must be >= 0, or -1 for unbounded");
  if (has_document(m)) {
    if (m.q_segment.empty()) fail("q_segment is empty but k_segment has ", m.k_segment.size(), " entries: give both or neither");
    if (m.k_segment.empty()) fail("k_segment is empty but q_segment has ", m.q_segment.size(), " entries: give both or neither");
    check_segments("q_segment", "N_q", m.q_segment, p.N_q);
    check_segments("k_segment", "N_k", m.k_segment, p.N_k);
  }
  if (has_block(m)) {
    if (m.block_q < 1) fail("block_q (", m.block_q, ") must be >= 1 when a block mask is given");
    if (m.block_k < 1) fail("block_k (", m.block_k, ") must be >= 1 when a block mask is given");
    const int64_t nbq = (p.N_q + m.block_q - 1) / m.block_q, nbk = (p.N_k + m.block_k - 1) / m.block_k;
    if (static_cast<int64_t>(m.block_mask.size()) != nbq * nbk)
      fail("block_mask has ", m.block_mask.size(), " entries but needs ceil(N_q/block_q) x ceil(N_k/block_k) = ",
           nbq, " x ", nbk, " = ", nbq * nbk);
  }
}

void validate_view(const char* name, const int64_t* dim, const void* data, int rank, const int64_t* expected) {
  static const char* axes4[] = {"B", "H", "N", "d"};
  static const char* axes3[] = {"B", "H", "N"};
  for (int a = 0; a < rank; ++a)
    if (dim[a] != expected[a])
      fail(name, ".dim[", a, "] (", dim[a], ") must equal ", (rank == 4 ? axes4 : axes3)[a], " (", expected[a], ")");
  if (data == nullptr) fail(name, " (null) must point to data");
}
void validate_block_view(const char* name, const int64_t* dim, const void* data, int rank, const int64_t* expected) {
  static const char placeholder = 0;  // a view of 0 rows touches nothing: null data is fine
  validate_view(name, dim, expected[2] == 0 && data == nullptr ? &placeholder : data, rank, expected);
}
void expect_q_side(const Problem& p, int64_t out[4]) { out[0] = p.B; out[1] = p.H_q; out[2] = p.N_q; out[3] = p.d; }
void expect_kv_side(const Problem& p, int64_t out[4]) { out[0] = p.B; out[1] = p.H_kv; out[2] = p.N_k; out[3] = p.d; }
void expect_rows(const Problem& p, int64_t out[3]) { out[0] = p.B; out[1] = p.H_q; out[2] = p.N_q; }

double scale_of(const Problem& p) { return p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(p.d)); }
int64_t group_size(const Problem& p) { return p.H_q / p.H_kv; }

// eq. (3.3): per-query document facts from the two segment arrays.
MaskData compile_mask(const Problem& p) {
  validate(p);
  const MaskSpec& m = p.mask;
  MaskData md;
  md.base.N_q = p.N_q;
  md.base.N_k = p.N_k;
  md.base.left = band_left(m);
  md.base.right = band_right(m);
  if (has_document(m)) {
    md.doc.resize(static_cast<size_t>(p.N_q));
    int64_t qi = 0, kj = 0;
    while (qi < p.N_q) {
      const int32_t s = m.q_segment[qi];
      int64_t q_end = qi;
      while (q_end < p.N_q && m.q_segment[q_end] == s) ++q_end;
      while (kj < p.N_k && m.k_segment[kj] < s) ++kj;  // keys of earlier documents
      int64_t k_end = kj;
      while (k_end < p.N_k && m.k_segment[k_end] == s) ++k_end;
      for (int64_t i = qi; i < q_end; ++i)
        md.doc[i] = RowDoc{i - qi, q_end - qi, k_end > kj ? kj : 0, k_end - kj};
      qi = q_end;
      kj = k_end;
    }
  }
  if (has_block(m)) {
    md.block = m.block_mask;
    md.base.block_q = m.block_q;
    md.base.block_k = m.block_k;
    md.base.n_block_k = (p.N_k + m.block_k - 1) / m.block_k;
  }
  return md;
}

namespace {
// f(n) for each run of n > 0 visible keys of rows [i0, i1) within [j0, j1), in row order; true
// as soon as f returns true.
template <class F>
bool visible_runs(const MaskParams& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1, F f) {
  for (int64_t i = i0; i < i1; ++i) {
    int64_t lo, hi;
    row_range(m, i, &lo, &hi);
    lo = std::max(lo, j0);
    hi = std::min(hi, j1);
    if (lo >= hi) continue;
    if (!m.block) {
      if (f(hi - lo)) return true;
      continue;
    }
    const uint8_t* brow = m.block + (i / m.block_q) * m.n_block_k;
    for (int64_t c = lo / m.block_k; c * m.block_k < hi; ++c)
      if (brow[c] && f(std::min(hi, (c + 1) * m.block_k) - std::max(lo, c * m.block_k))) return true;
  }
  return false;
}
}  // namespace

int64_t count_visible(const MaskParams& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  int64_t total = 0;
  visible_runs(m, i0, i1, j0, j1, [&](int64_t n) {
    total += n;
    return false;
  });
  return total;
}

bool any_visible(const MaskParams& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  return visible_runs(m, i0, i1, j0, j1, [](int64_t) { return true; });
}

int64_t visible_pairs(const Problem& p) {
  const MaskData md = compile_mask(p);
  return count_visible(md.params(), 0, p.N_q, 0, p.N_k);
}
double forward_flops(const Problem& p) {
  return 4.0 * double(p.B) * double(p.H_q) * double(visible_pairs(p)) * double(p.d);
}
double backward_flops(const Problem& p) { return 2.5 * forward_flops(p); }

std::string shape_string(const Problem& p) {
  std::ostringstream os;
  os << "B=" << p.B << " Hq=" << p.H_q << " Hkv=" << p.H_kv << " Nq=" << p.N_q << " Nk=" << p.N_k << " d=" << p.d;
  return os.str();
}

}  // namespace burstlab
