// check/case.cpp — case directories, the oracle files, candidates and the checker (case.hpp).
#include "case.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "burstlab/error.hpp"
#include "json_fields.hpp"
#include "npy.hpp"

namespace burstlab::check {
namespace {

using Json = nlohmann::json;
using detail::Fields;
using detail::parse_json;
namespace fs = std::filesystem;

constexpr int kFormatVersion = 1;

// Upper limits for the metadata: the spec allows up to 2^48 elements per tensor (§1.4); case
// files are meant for problems a fp64 oracle can run, so each dimension is capped at 2^24.
constexpr int64_t kMaxDim = int64_t(1) << 24;

// Shape of a (B, H, N, d) tensor as stored in `layout`.
std::vector<int64_t> file_shape(Layout layout, int64_t B, int64_t H, int64_t N, int64_t d) {
  if (layout == Layout::BHSD) return {B, H, N, d};
  return {B, N, H, d};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + ")";
}

void save4(const fs::path& path, Dtype t, const Tensor4<double>& x) {
  write_npy(path.string(), t, file_shape(x.layout, x.B, x.H, x.N, x.d), x.data.data(), x.data.size());
}
void save3(const fs::path& path, Dtype t, const Tensor3<double>& x) {
  write_npy(path.string(), t, {x.B, x.H, x.N}, x.data.data(), x.data.size());
}

NpyArray load_shaped(const fs::path& path, const std::vector<int64_t>& want, const char* what) {
  NpyArray a = read_npy(path.string());
  if (a.shape != want)
    fail(path.string(), ": shape ", shape_str(a.shape), " must be ", shape_str(want), " (", what, ")");
  return a;
}
Tensor4<double> load4(const fs::path& path, Layout layout, int64_t B, int64_t H, int64_t N, int64_t d,
                      Dtype* dtype = nullptr) {
  const char* what = layout == Layout::BHSD ? "BHSD: B, H, N, d" : "BSHD: B, N, H, d";
  NpyArray a = load_shaped(path, file_shape(layout, B, H, N, d), what);
  if (dtype) *dtype = a.dtype;
  Tensor4<double> t;
  t.layout = layout; t.B = B; t.H = H; t.N = N; t.d = d;
  t.data = std::move(a.data);
  return t;
}
Tensor3<double> load3(const fs::path& path, int64_t B, int64_t H, int64_t N) {
  NpyArray a = load_shaped(path, {B, H, N}, "B, H_q, N_q");
  Tensor3<double> t;
  t.B = B; t.H = H; t.N = N;
  t.data = std::move(a.data);
  return t;
}

// §9.3's per-element predicate (as compare() in reference/tolerance.cpp applies it).
bool wrong_element(double got, double want, double bound) {
  if (std::isnan(got)) return true;
  if (!std::isfinite(want)) return !(got == want);
  if (!std::isfinite(got)) return true;
  return std::fabs(got - want) > bound;
}

std::string fmt_g(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

template <int R, class View>
void list_mismatches(TensorCheck& tc, const View& got, const View& want, const View& bound, const char* row,
                     int max_list) {
  int64_t idx[4] = {0, 0, 0, 0};
  const int64_t n3 = R == 4 ? got.dim[3] : 1;
  for (idx[0] = 0; idx[0] < got.dim[0]; ++idx[0])
    for (idx[1] = 0; idx[1] < got.dim[1]; ++idx[1])
      for (idx[2] = 0; idx[2] < got.dim[2]; ++idx[2])
        for (idx[3] = 0; idx[3] < n3; ++idx[3]) {
          double g, w, b;
          if constexpr (R == 4) {
            g = got(idx[0], idx[1], idx[2], idx[3]); w = want(idx[0], idx[1], idx[2], idx[3]);
            b = bound(idx[0], idx[1], idx[2], idx[3]);
          } else {
            g = got(idx[0], idx[1], idx[2]); w = want(idx[0], idx[1], idx[2]); b = bound(idx[0], idx[1], idx[2]);
          }
          if (!wrong_element(g, w, b)) continue;
          std::string s = "(b=" + std::to_string(idx[0]) + ", h=" + std::to_string(idx[1]) + ", " + row + "=" +
                          std::to_string(idx[2]);
          if (R == 4) s += ", k=" + std::to_string(idx[3]);
          tc.mismatches.push_back(s + "): got " + fmt_g(g) + " want " + fmt_g(w) + " bound " + fmt_g(b));
          Mismatch mm;
          for (int a = 0; a < R; ++a) mm.index[a] = idx[a];
          mm.rank = R;
          mm.got = g; mm.want = w; mm.bound = b;
          tc.where.push_back(mm);
          if (static_cast<int>(tc.mismatches.size()) >= max_list) return;
        }
}

TensorCheck check4(const char* name, const char* row, bool present, const Tensor4<double>& got,
                   const Tensor4<double>& want, const Tensor4<double>& bound, int max_list) {
  TensorCheck tc;
  tc.m.tensor = name;
  if (!present) { tc.missing = true; tc.m.err_bound = HUGE_VAL; return tc; }
  tc.m = compare<double>(name, got.view(), want.view(), bound.view());
  if (tc.m.wrong) list_mismatches<4>(tc, got.view(), want.view(), bound.view(), row, max_list);
  return tc;
}
TensorCheck check3(const char* name, bool present, const Tensor3<double>& got, const Tensor3<double>& want,
                   const Tensor3<double>& bound, int max_list) {
  TensorCheck tc;
  tc.m.tensor = name;
  if (!present) { tc.missing = true; tc.m.err_bound = HUGE_VAL; return tc; }
  tc.m = compare<double>(name, got.view(), want.view(), bound.view());
  if (tc.m.wrong) list_mismatches<3>(tc, got.view(), want.view(), bound.view(), "i", max_list);
  return tc;
}

// The mask object of case.json: every MaskSpec field (spec §3), by its name.
Json mask_object(const MaskSpec& k) {
  return {{"causal", k.causal},           {"window_left", k.window_left}, {"window_right", k.window_right},
          {"q_segment", k.q_segment},     {"k_segment", k.k_segment},     {"block_q", k.block_q},
          {"block_k", k.block_k},         {"block_mask", k.block_mask}};
}
// Its strict parser; N_q, N_k only cap the array lengths (validate() checks them exactly).
MaskSpec parse_mask(const Json& mj, const std::string& where, int64_t N_q, int64_t N_k) {
  if (!mj.is_object()) fail(where, ": must hold a JSON object");
  Fields g{mj, where, {}};
  MaskSpec k;
  k.causal = g.boolean("causal");
  k.window_left = g.integer("window_left", -1, std::numeric_limits<int64_t>::max());
  k.window_right = g.integer("window_right", -1, std::numeric_limits<int64_t>::max());
  k.q_segment = g.int_array<int32_t>("q_segment", 0, std::numeric_limits<int32_t>::max(), N_q);
  k.k_segment = g.int_array<int32_t>("k_segment", 0, std::numeric_limits<int32_t>::max(), N_k);
  k.block_q = g.integer("block_q", 0, kMaxDim);
  k.block_k = g.integer("block_k", 0, kMaxDim);
  // At most one entry per (query, key) pair; validate() checks the exact count.
  const double max_blocks = static_cast<double>(N_q) * static_cast<double>(N_k);
  k.block_mask = g.int_array<uint8_t>("block_mask", 0, 1, static_cast<size_t>(std::min(max_blocks, 1e12)));
  g.no_others();
  return k;
}

}  // namespace

// ---- metadata ---------------------------------------------------------------------------------
std::string case_json(const CaseMeta& m) {
  Json j = {{"format", "burstlab-case"},
            {"version", kFormatVersion},
            {"name", m.name},
            {"B", m.p.B},
            {"H_q", m.p.H_q},
            {"H_kv", m.p.H_kv},
            {"N_q", m.p.N_q},
            {"N_k", m.p.N_k},
            {"d", m.p.d},
            {"scale", scale_of(m.p)},
            {"layout", to_string(m.layout)},
            {"dtype", to_string(m.dtype)},
            {"values", to_string(m.values)},
            {"seed", m.seed},
            {"backward", m.backward},
            {"mask_spec", m.mask_spec},
            {"mask", mask_object(m.p.mask)}};
  return j.dump(1) + "\n";
}

std::string mask_json(const MaskSpec& m) { return mask_object(m).dump(); }

MaskSpec parse_mask_json(const std::string& text, const std::string& where) {
  return parse_mask(parse_json(text, where), where, kMaxDim, kMaxDim);
}

CaseMeta parse_case_json(const std::string& text, const std::string& where) {
  const Json j = parse_json(text, where);
  Fields f{j, where, {}};
  if (f.string("format") != "burstlab-case") fail(where, ": field 'format' must be \"burstlab-case\"");
  const int64_t version = f.integer("version", 0, 1 << 20);
  if (version != kFormatVersion) fail(where, ": version (", version, ") is not supported; this burstlab reads ", kFormatVersion);
  CaseMeta m;
  m.name = f.string("name");
  m.p.B = f.integer("B", 1, kMaxDim);
  m.p.H_q = f.integer("H_q", 1, kMaxDim);
  m.p.H_kv = f.integer("H_kv", 1, kMaxDim);
  m.p.N_q = f.integer("N_q", 1, kMaxDim);
  m.p.N_k = f.integer("N_k", 1, kMaxDim);
  m.p.d = f.integer("d", 1, kMaxDim);
  m.p.scale = f.number("scale");
  try {
    m.layout = parse_layout(f.string("layout"));
    m.dtype = parse_dtype(f.string("dtype"));
    m.values = parse_values(f.string("values"));
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  m.seed = f.uinteger("seed");
  m.backward = f.boolean("backward");
  m.mask_spec = f.string("mask_spec");
  const Json& mj = f.get("mask");
  if (!mj.is_object()) fail(where, ": field 'mask' must be an object");
  m.p.mask = parse_mask(mj, where + " mask", m.p.N_q, m.p.N_k);
  f.no_others();
  try {
    validate(m.p);
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  // 2^31 elements per tensor keeps every file of a case loadable on an ordinary machine.
  const double big = static_cast<double>(m.p.B) * std::max(m.p.H_q, m.p.H_kv) * std::max(m.p.N_q, m.p.N_k) * m.p.d;
  if (big > std::ldexp(1.0, 31)) fail(where, ": tensors of ", big, " elements are beyond case files' 2^31 limit");
  return m;
}

CaseData make_case(const CaseMeta& m) {
  validate(m.p);
  CaseData c;
  c.meta = m;
  c.in = as_fp64(make_inputs(m.p, m.layout, m.dtype, m.seed, m.values));  // held in fp64, as read_case's
  return c;
}

void write_case(const std::string& dir, const CaseData& c) {
  const fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) fail(dir, ": cannot create directory: ", ec.message());
  write_file((d / "case.json").string(), case_json(c.meta));
  save4(d / "q.npy", c.meta.dtype, c.in.Q.as<double>());
  save4(d / "k.npy", c.meta.dtype, c.in.K.as<double>());
  save4(d / "v.npy", c.meta.dtype, c.in.V.as<double>());
  if (c.meta.backward) save4(d / "dO.npy", c.meta.dtype, c.in.dO.as<double>());
}

// ---- the inputs' values (spec §1.4) ------------------------------------------------------------
namespace {
std::string coords(const char* row, int64_t b, int64_t h, int64_t n, int64_t k) {
  return "(b=" + std::to_string(b) + ", h=" + std::to_string(h) + ", " + row + "=" + std::to_string(n) +
         ", k=" + std::to_string(k) + ")";
}
// The first element of x (in (b, h, n, k) order) that fails ok(), as "<value> at (b, h, row, k)".
// Rows are scanned side by side (a 1M-token tensor holds billions of elements): the first bad
// element is in the smallest row holding one, each thread skipping its rows past its own find.
template <class S, class Ok>
bool first_bad4(const Tensor4<S>& x, const char* row, Ok ok, std::string* where) {
  const View4<const S> v = x.view();
  const int64_t rows = x.B * x.H * x.N;
  int64_t first = rows;
#pragma omp parallel for schedule(static) reduction(min : first) if (rows * x.d >= (int64_t(1) << 20))
  for (int64_t r = 0; r < rows; ++r) {
    if (r > first) continue;
    const S* e = v.row(r / (x.H * x.N), r / x.N % x.H, r % x.N);
    const int64_t d = x.d, s = v.stride[3];
    bool bad = false;  // the whole row, without a branch per element
    for (int64_t k = 0; k < d; ++k) bad |= !ok(to_double(e[k * s]));
    if (bad) first = r;
  }
  if (first >= rows) return false;
  const int64_t b = first / (x.H * x.N), h = first / x.N % x.H, n = first % x.N;
  for (int64_t k = 0; k < x.d; ++k)
    if (!ok(to_double(v(b, h, n, k)))) {
      *where = fmt_g(to_double(v(b, h, n, k))) + " at " + coords(row, b, h, n, k);
      return true;
    }
  return false;  // unreachable: row `first` holds a bad element
}
template <class Ok>
bool first_bad3(const Tensor3<double>& x, Ok ok, std::string* where) {
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t n = 0; n < x.N; ++n) {
        const double v = x.data[static_cast<size_t>((b * x.H + h) * x.N + n)];
        if (!ok(v)) {
          *where = fmt_g(v) + " at (b=" + std::to_string(b) + ", h=" + std::to_string(h) + ", i=" + std::to_string(n) + ")";
          return true;
        }
      }
  return false;
}
// A closure rather than a function, so that first_bad4 inlines it into its threads' loop.
constexpr auto finite = [](double x) { return std::isfinite(x); };
std::string g3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}
}  // namespace

namespace {
template <class QV, class KV>
double logit_bound_of(const Problem& p, const QV& Q, const KV& K) {
  const int64_t G = p.H_q / p.H_kv;
  double most = 0;
  // A (b, kv-head) per thread: the maxima are exact in any order, and at 1M tokens each is a scan
  // of N d elements of Q and of K.
#pragma omp parallel for schedule(dynamic) reduction(max : most) if (p.B * p.H_kv > 1)
  for (int64_t bk = 0; bk < p.B * p.H_kv; ++bk) {
    const int64_t b = bk / p.H_kv, hk = bk % p.H_kv;
    std::vector<double> mq(static_cast<size_t>(p.d)), mk(static_cast<size_t>(p.d), 0.0);
    for (int64_t j = 0; j < p.N_k; ++j)
      for (int64_t k = 0; k < p.d; ++k) mk[k] = std::max(mk[k], std::fabs(to_double(K(b, hk, j, k))));
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
      std::fill(mq.begin(), mq.end(), 0.0);
      for (int64_t i = 0; i < p.N_q; ++i)
        for (int64_t k = 0; k < p.d; ++k) mq[k] = std::max(mq[k], std::fabs(to_double(Q(b, h, i, k))));
      double s = 0;  // overflows to inf rather than wrapping: inf > kMaxLogit refuses it
      for (int64_t k = 0; k < p.d; ++k) s += mq[k] * mk[k];
      most = std::max(most, s);
    }
  }
  return most;
}
}  // namespace

double logit_bound(const Problem& p, const Inputs& in) {
  return std::visit([&](const auto& Q, const auto& K) { return logit_bound_of(p, Q, K); }, in.Q.view(), in.K.view());
}

void require_valid_inputs(const Problem& p, const Inputs& in, bool backward, const std::string& where,
                          const char* const names[4], const std::string& scale_name) {
  const AnyTensor4* xs[4] = {&in.Q, &in.K, &in.V, &in.dO};
  const char* rows[4] = {"i", "j", "j", "i"};
  std::string at;
  for (int t = 0; t < (backward ? 4 : 3); ++t)
    if (xs[t]->visit([&](const auto& x) { return first_bad4(x, rows[t], finite, &at); }))
      fail(where, names[t], " holds ", at, ": inputs must be finite (spec §1.4); a NaN or infinity there makes "
           "the fp64 oracle's outputs NaN, which no candidate can match (spec §9.3)");
  const double dot = logit_bound(p, in), scale = scale_of(p);
  const double logits = std::max(1.0, std::fabs(scale)) * dot;
  if (!(logits <= kMaxLogit)) {
    std::string allowed;
    if (dot <= kMaxLogit && dot > 0) allowed = "; with these inputs |" + scale_name + "| must be at most " + g3(kMaxLogit / dot);
    else allowed = "; these inputs' products alone exceed it: scale them down";
    fail(where, "the logits overflow fp64: ", scale_name, " (", g3(scale), ") x sum_k max_i |Q_ik| max_j |K_jk| (",
         g3(dot), ") over a (b, h) = ", g3(std::fabs(scale) * dot),
         " exceeds ", g3(kMaxLogit), " (half of fp64's largest number; spec §1.4, eq. 2.1 and 9.1)", allowed);
  }
}

void require_finite_bounds(const Problem&, const ForwardBounds* fb, const BackwardBounds* bb, const std::string& what,
                           const std::string& scale_name) {
  std::string at;
  const std::string why = ": the inputs' magnitudes are beyond the §9 rule's fp64 arithmetic, so nothing could be "
                          "judged; use a smaller " + scale_name + " or smaller values";
  if (fb && first_bad4(fb->O, "i", finite, &at)) fail(what, ": the §9 bound of O is ", at, why);
  if (fb && first_bad3(fb->LSE, finite, &at)) fail(what, ": the §9 bound of LSE is ", at, why);
  if (bb && first_bad4(bb->dQ, "i", finite, &at)) fail(what, ": the §9 bound of dQ is ", at, why);
  if (bb && first_bad4(bb->dK, "j", finite, &at)) fail(what, ": the §9 bound of dK is ", at, why);
  if (bb && first_bad4(bb->dV, "j", finite, &at)) fail(what, ": the §9 bound of dV is ", at, why);
}

void require_finite_oracle(const Problem& p, const Oracle& o, bool backward, const std::string& what,
                           const std::string& scale_name) {
  std::string at;
  const std::string why = ": the inputs' magnitudes are beyond the fp64 oracle's range; use a smaller " + scale_name +
                          " or smaller values";
  if (first_bad4(o.O, "i", finite, &at)) fail(what, ": O is ", at, why);
  // -inf is the LSE of an empty row (spec §2.3); nothing else may be non-finite.
  if (first_bad3(o.LSE, [](double x) { return std::isfinite(x) || x == -HUGE_VAL; }, &at)) fail(what, ": LSE is ", at, why);
  if (backward) {
    if (first_bad4(o.dQ, "i", finite, &at)) fail(what, ": dQ is ", at, why);
    if (first_bad4(o.dK, "j", finite, &at)) fail(what, ": dK is ", at, why);
    if (first_bad4(o.dV, "j", finite, &at)) fail(what, ": dV is ", at, why);
  }
  require_finite_bounds(p, &o.fwd, backward ? &o.bwd : nullptr, what, scale_name);
}

CaseData read_case(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail(dir, ": not a case directory (see `burstlab gen`)");
  CaseData c;
  c.meta = parse_case_json(read_file((d / "case.json").string()), (d / "case.json").string());
  const CaseMeta& m = c.meta;
  c.in.dtype = m.dtype;
  Dtype t;
  auto in4 = [&](const char* file, int64_t H, int64_t N) {
    Tensor4<double> x = load4(d / file, m.layout, m.p.B, H, N, m.p.d, &t);
    if (t != m.dtype)
      fail((d / file).string(), ": dtype ", to_string(t), " must be the case's dtype ", to_string(m.dtype));
    return x;
  };
  c.in.Q = in4("q.npy", m.p.H_q, m.p.N_q);
  c.in.K = in4("k.npy", m.p.H_kv, m.p.N_k);
  c.in.V = in4("v.npy", m.p.H_kv, m.p.N_k);
  if (m.backward) c.in.dO = in4("dO.npy", m.p.H_q, m.p.N_q);
  else c.in.dO = make_tensor4<double>(m.layout, m.p.B, m.p.H_q, m.p.N_q, m.p.d);
  static const char* const names[4] = {"q.npy", "k.npy", "v.npy", "dO.npy"};
  require_valid_inputs(m.p, c.in, m.backward, dir + ": ", names, "scale (case.json)");
  return c;
}

// ---- the oracle ------------------------------------------------------------------------------
Expected compute_expected(const CaseData& c) {
  const Oracle o = run_oracle(c.meta.p, c.in, c.meta.backward);
  require_finite_oracle(c.meta.p, o, c.meta.backward, "case " + c.meta.name + ": the fp64 oracle", "scale");
  Expected e;
  e.O = o.O;
  e.LSE = o.LSE;
  if (c.meta.backward) { e.dQ = o.dQ; e.dK = o.dK; e.dV = o.dV; }
  return e;
}

void write_expected(const std::string& dir, const CaseData& c, const Expected& e) {
  const fs::path d = fs::path(dir) / "expected";
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) fail(d.string(), ": cannot create directory: ", ec.message());
  save4(d / "O.npy", Dtype::F64, e.O);
  save3(d / "LSE.npy", Dtype::F64, e.LSE);
  if (c.meta.backward) {
    save4(d / "dQ.npy", Dtype::F64, e.dQ);
    save4(d / "dK.npy", Dtype::F64, e.dK);
    save4(d / "dV.npy", Dtype::F64, e.dV);
  }
}

bool has_expected(const std::string& dir) { return fs::exists(fs::path(dir) / "expected" / "O.npy"); }

Expected read_expected(const std::string& dir, const CaseMeta& m) {
  const fs::path d = fs::path(dir) / "expected";
  if (!has_expected(dir)) fail(dir, ": no expected outputs; run `burstlab oracle --case ", dir, "` first");
  Expected e;
  Dtype t;
  auto f64 = [&](const fs::path& p) {
    if (t != Dtype::F64) fail(p.string(), ": expected outputs must be fp64, got ", to_string(t));
  };
  e.O = load4(d / "O.npy", m.layout, m.p.B, m.p.H_q, m.p.N_q, m.p.d, &t);
  f64(d / "O.npy");
  e.LSE = load3(d / "LSE.npy", m.p.B, m.p.H_q, m.p.N_q);
  if (m.backward) {
    e.dQ = load4(d / "dQ.npy", m.layout, m.p.B, m.p.H_q, m.p.N_q, m.p.d, &t);
    f64(d / "dQ.npy");
    e.dK = load4(d / "dK.npy", m.layout, m.p.B, m.p.H_kv, m.p.N_k, m.p.d, &t);
    f64(d / "dK.npy");
    e.dV = load4(d / "dV.npy", m.layout, m.p.B, m.p.H_kv, m.p.N_k, m.p.d, &t);
    f64(d / "dV.npy");
  }
  return e;
}

// ---- candidates ------------------------------------------------------------------------------
CandidateMeta parse_candidate_json(const std::string& text, const std::string& where) {
  const Json j = parse_json(text, where);
  Fields f{j, where, {}};
  CandidateMeta cm;
  if (f.has("lse_empty")) {
    const std::string s = f.string("lse_empty");
    if (s == "+inf" || s == "inf") cm.conv.empty_lse_pos_inf = true;
    else if (s != "-inf") fail(where, ": lse_empty (", s, ") must be \"-inf\" or \"+inf\"");
  }
  if (f.has("lse_base")) {
    const std::string s = f.string("lse_base");
    if (s == "2") cm.conv.lse_log2 = true;
    else if (s != "e") fail(where, ": lse_base (", s, ") must be \"e\" or \"2\"");
  }
  if (f.has("dtype")) {
    cm.dtype = f.string("dtype");
    try { parse_dtype(cm.dtype); } catch (const Error& e) { fail(where, ": ", e.what()); }
  }
  if (f.has("layout")) {
    cm.layout = f.string("layout");
    try { parse_layout(cm.layout); } catch (const Error& e) { fail(where, ": ", e.what()); }
  }
  f.no_others();
  return cm;
}

void convert_lse(Tensor3<double>& LSE, const Conventions& conv) {
  for (double& x : LSE.data) {
    if (conv.empty_lse_pos_inf && x == HUGE_VAL) x = -HUGE_VAL;
    else if (conv.lse_log2 && std::isfinite(x)) x *= std::log(2.0);
  }
}

Candidate read_candidate(const std::string& dir, const CaseMeta& m, const CandidateMeta& over) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail(dir, ": candidate directory does not exist");
  CandidateMeta cm = over;
  if (fs::exists(d / "candidate.json")) {
    const CandidateMeta file = parse_candidate_json(read_file((d / "candidate.json").string()),
                                                    (d / "candidate.json").string());
    // Command-line flags win over the file; the file fills what the flags left unset.
    if (!over.conv.empty_lse_pos_inf) cm.conv.empty_lse_pos_inf = file.conv.empty_lse_pos_inf;
    if (!over.conv.lse_log2) cm.conv.lse_log2 = file.conv.lse_log2;
    if (cm.dtype.empty()) cm.dtype = file.dtype;
    if (cm.layout.empty()) cm.layout = file.layout;
  }
  Candidate c;
  c.layout = cm.layout.empty() ? m.layout : parse_layout(cm.layout);
  if (!fs::exists(d / "O.npy")) fail(dir, ": candidate has no O.npy");
  Dtype t;
  c.O = load4(d / "O.npy", c.layout, m.p.B, m.p.H_q, m.p.N_q, m.p.d, &t);
  c.has_O = true;
  c.dtype = cm.dtype.empty() ? t : parse_dtype(cm.dtype);
  if (fs::exists(d / "LSE.npy")) {
    c.LSE = load3(d / "LSE.npy", m.p.B, m.p.H_q, m.p.N_q);
    convert_lse(c.LSE, cm.conv);
    c.has_LSE = true;
  }
  if (fs::exists(d / "dQ.npy")) { c.dQ = load4(d / "dQ.npy", c.layout, m.p.B, m.p.H_q, m.p.N_q, m.p.d); c.has_dQ = true; }
  if (fs::exists(d / "dK.npy")) { c.dK = load4(d / "dK.npy", c.layout, m.p.B, m.p.H_kv, m.p.N_k, m.p.d); c.has_dK = true; }
  if (fs::exists(d / "dV.npy")) { c.dV = load4(d / "dV.npy", c.layout, m.p.B, m.p.H_kv, m.p.N_k, m.p.d); c.has_dV = true; }
  return c;
}

// ---- the checker -----------------------------------------------------------------------------
bool CheckResult::pass() const {
  for (const TensorCheck& t : tensors)
    if (!t.pass()) return false;
  return !tensors.empty();
}
double CheckResult::worst_err_bound() const {
  double w = 0;
  for (const TensorCheck& t : tensors) w = std::max(w, t.missing ? HUGE_VAL : t.m.err_bound);
  return w;
}

CheckResult check_candidate(const CaseData& c, const Expected& e, const Candidate& cand, Dtype dtype, int max_list) {
  const Problem& p = c.meta.p;
  CheckResult r;
  r.case_name = c.meta.name;
  r.dtype = dtype;
  // §9.1: the bound assumes the candidate read exactly the case's inputs; recomputing it for the
  // requested dtype costs one more pass over S, like the oracle.
  Tensor4<double> copies[4];  // the inputs widened to fp64 when they are held narrower
  const View4<const double> Q = f64_view(c.in.Q, copies[0]), K = f64_view(c.in.K, copies[1]),
                            V = f64_view(c.in.V, copies[2]);
  const ForwardBounds fb = forward_bounds(p, dtype, Q, K, V);
  const std::string what = "case " + c.meta.name + ": the check for " + to_string(dtype);
  require_finite_bounds(p, &fb, nullptr, what, "scale");
  r.tensors.push_back(check4("O", "i", cand.has_O, cand.O, e.O, fb.O, max_list));
  r.tensors.push_back(check3("LSE", cand.has_LSE, cand.LSE, e.LSE, fb.LSE, max_list));
  if (c.meta.backward) {
    const BackwardBounds bb = backward_bounds(p, dtype, Q, K, V, e.O.view(), f64_view(c.in.dO, copies[3]),
                                              e.LSE.view());
    require_finite_bounds(p, nullptr, &bb, what, "scale");
    r.tensors.push_back(check4("dQ", "i", cand.has_dQ, cand.dQ, e.dQ, bb.dQ, max_list));
    r.tensors.push_back(check4("dK", "j", cand.has_dK, cand.dK, e.dK, bb.dK, max_list));
    r.tensors.push_back(check4("dV", "j", cand.has_dV, cand.dV, e.dV, bb.dV, max_list));
  }
  return r;
}

std::string format_check(const CheckResult& r) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "case %s, candidate dtype %s (bound of spec §9 for %s)\n", r.case_name.c_str(),
                to_string(r.dtype).c_str(), to_string(r.dtype).c_str());
  out += line;
  std::snprintf(line, sizeof line, "%-6s %12s %12s %12s %10s %10s  %s\n", "tensor", "max_abs", "max_rel", "err/bound",
                "#wrong", "checked", "result");
  out += line;
  for (const TensorCheck& t : r.tensors) {
    if (t.missing) {
      std::snprintf(line, sizeof line, "%-6s %12s %12s %12s %10s %10s  %s\n", t.m.tensor.c_str(), "-", "-", "-", "-",
                    "-", "FAIL (missing file)");
    } else {
      std::snprintf(line, sizeof line, "%-6s %12.3e %12.3e %12.3e %10lld %10lld  %s\n", t.m.tensor.c_str(), t.m.max_abs,
                    t.m.max_rel, t.m.err_bound, static_cast<long long>(t.m.wrong),
                    static_cast<long long>(t.m.checked), t.pass() ? "PASS" : "FAIL");
    }
    out += line;
  }
  for (const TensorCheck& t : r.tensors)
    for (const std::string& s : t.mismatches) out += "  " + t.m.tensor + " " + s + "\n";
  out += r.pass() ? "PASS\n" : "FAIL\n";
  return out;
}

std::string check_json(const CheckResult& r) {
  Json j = {{"case", r.case_name}, {"dtype", to_string(r.dtype)}, {"pass", r.pass()}};
  auto num = [](double x) -> Json { return std::isfinite(x) ? Json(x) : Json(x > 0 ? "inf" : "-inf"); };
  j["worst_err_bound"] = num(r.worst_err_bound());
  j["tensors"] = Json::array();
  for (const TensorCheck& t : r.tensors) {
    Json tj = {{"tensor", t.m.tensor}, {"pass", t.pass()}, {"missing", t.missing}};
    if (!t.missing) {
      tj["max_abs"] = num(t.m.max_abs);
      tj["max_rel"] = num(t.m.max_rel);
      tj["err_bound"] = num(t.m.err_bound);
      tj["wrong"] = t.m.wrong;
      tj["checked"] = t.m.checked;
      tj["mismatches"] = t.mismatches;
    }
    j["tensors"].push_back(tj);
  }
  return j.dump();
}

// ---- the curated suite -----------------------------------------------------------------------
std::vector<CaseMeta> suite(bool quick, Dtype dtype) {
  struct S {
    const char* name;
    int64_t B, H_q, H_kv, N_q, N_k, d;
    const char* mask;
    Values values;
    Layout layout;
    bool in_quick;
  };
  // Sizes keep the quick set's oracle under a second or two on 2 cores.
  const S cases[] = {
      {"full_mha", 1, 4, 4, 64, 64, 64, "none", Values::Normal, Layout::BHSD, true},
      {"causal_gqa_nq_lt_nk", 2, 4, 2, 37, 75, 64, "causal", Values::Normal, Layout::BSHD, true},
      {"causal_nq_gt_nk_empty_rows", 1, 4, 2, 75, 37, 32, "causal", Values::Normal, Layout::BHSD, true},
      {"window", 1, 2, 2, 96, 96, 64, "window:16,8", Values::Normal, Layout::BSHD, true},
      {"document_mqa", 1, 4, 1, 128, 128, 64, "document:4", Values::Normal, Layout::BHSD, true},
      {"block", 1, 2, 2, 100, 130, 64, "block:16x32@0.5", Values::Normal, Layout::BHSD, true},
      {"causal_doc_block", 1, 4, 2, 120, 160, 128, "causal+document:3+block:32x32@0.6", Values::Normal,
       Layout::BSHD, true},
      {"d1_causal", 1, 2, 1, 33, 47, 1, "causal", Values::Normal, Layout::BHSD, true},
      {"d3_large_logits", 1, 2, 1, 50, 70, 3, "causal", Values::Large, Layout::BHSD, true},
      {"ties_doc_block", 1, 2, 2, 64, 64, 16, "document:3+block:16x16", Values::Ties, Layout::BSHD, true},
      {"wide_v", 1, 3, 3, 40, 40, 64, "causal", Values::WideV, Layout::BHSD, true},
      {"one_query", 1, 2, 2, 1, 113, 64, "none", Values::Normal, Layout::BHSD, false},
      {"one_key", 1, 2, 1, 113, 1, 3, "none", Values::Normal, Layout::BHSD, false},
      {"d128_window_large", 1, 2, 2, 113, 203, 128, "window:8,8", Values::Large, Layout::BSHD, false},
      {"d256_causal", 1, 2, 1, 64, 96, 256, "causal", Values::Normal, Layout::BHSD, false},
      {"sliding_nk_1023", 1, 2, 2, 203, 1023, 64, "window:64,0", Values::Normal, Layout::BSHD, false},
      {"batch2_gqa_document", 2, 8, 2, 113, 203, 64, "document:5", Values::Normal, Layout::BHSD, false},
      {"window_doc", 1, 2, 2, 300, 300, 64, "window:32,0+document:5", Values::Normal, Layout::BSHD, false},
      {"ties_causal_nq_gt_nk", 1, 4, 4, 203, 113, 64, "causal", Values::Ties, Layout::BHSD, false},
  };
  std::vector<CaseMeta> out;
  uint64_t seed = 6000;  // deterministic: case k gets seed 6001 + k whatever the subset
  int k = 0;
  for (const S& s : cases) {
    ++seed;
    ++k;
    if (quick && !s.in_quick) continue;
    CaseMeta m;
    char name[96];
    std::snprintf(name, sizeof name, "%02d_%s_%s", k, s.name, to_string(dtype).c_str());
    m.name = name;
    m.p.B = s.B; m.p.H_q = s.H_q; m.p.H_kv = s.H_kv; m.p.N_q = s.N_q; m.p.N_k = s.N_k; m.p.d = s.d;
    m.p.mask = make_mask(s.mask, s.N_q, s.N_k, seed);
    m.p.scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    validate(m.p);
    m.layout = s.layout;
    m.dtype = dtype;
    m.values = s.values;
    m.seed = seed;
    m.mask_spec = s.mask;
    m.backward = true;
    out.push_back(m);
  }
  return out;
}

}  // namespace burstlab::check
