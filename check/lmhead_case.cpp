// check/lmhead_case.cpp — the LM head's case directories, oracle files, candidates and checker
// (lmhead_case.hpp); the JSON and .npy conventions of case.cpp.
#include "lmhead_case.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "burstlab/error.hpp"
#include "json_fields.hpp"
#include "npy.hpp"
#include "reference_lmhead.hpp"

namespace burstlab::check {
namespace {

using detail::Fields;
using detail::Json;
using detail::parse_json;
namespace fs = std::filesystem;

constexpr int kFormatVersion = 1;
constexpr const char* kFormat = "burstlab-lmhead-case";
constexpr int64_t kMaxDim = int64_t(1) << 24;  // as case.cpp: problems an fp64 oracle can run

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + ")";
}

NpyArray load_shaped(const fs::path& path, const std::vector<int64_t>& want) {
  NpyArray a = read_npy(path.string());
  if (a.shape != want) fail(path.string(), ": shape ", shape_str(a.shape), " must be ", shape_str(want));
  return a;
}
Matrix<double> load_matrix(const fs::path& path, int64_t rows, int64_t cols, Dtype* dtype = nullptr) {
  NpyArray a = load_shaped(path, {rows, cols});
  if (dtype) *dtype = a.dtype;
  Matrix<double> m;
  m.rows = rows;
  m.cols = cols;
  m.data = std::move(a.data);
  return m;
}
void save_matrix(const fs::path& path, Dtype t, const Matrix<double>& m) {
  write_npy(path.string(), t, {m.rows, m.cols}, m.data.data(), m.data.size());
}

std::string fmt_g(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// §9.3 per element, as compare_element; lists the first max_list mismatches.
TensorCheck check_values(const char* name, bool present, const std::vector<const char*>& coords, int64_t cols,
                         const double* got, const double* want, const double* bound, size_t n, int max_list) {
  TensorCheck tc;
  tc.m.tensor = name;
  if (!present) {
    tc.missing = true;
    return tc;
  }
  for (size_t e = 0; e < n; ++e) {
    const int64_t idx[2] = {cols > 0 ? int64_t(e) / cols : int64_t(e), cols > 0 ? int64_t(e) % cols : 0};
    const int64_t before = tc.m.wrong;
    compare_element(tc.m, got[e], want[e], bound[e], idx, static_cast<int>(coords.size()), coords.data());
    if (tc.m.wrong > before && static_cast<int>(tc.mismatches.size()) < max_list) {
      std::string s = "(";
      for (size_t a = 0; a < coords.size(); ++a) s += (a ? ", " : "") + std::string(coords[a]) + "=" + std::to_string(idx[a]);
      tc.mismatches.push_back(s + "): got " + fmt_g(got[e]) + " want " + fmt_g(want[e]) + " bound " + fmt_g(bound[e]));
    }
  }
  return tc;
}

}  // namespace

bool is_lmhead_case(const std::string& dir) {
  const fs::path f = fs::path(dir) / "case.json";
  if (!fs::exists(f)) return false;
  try {
    const Json j = Json::parse(read_file(f.string()));
    return j.is_object() && j.contains("format") && j["format"] == kFormat;
  } catch (const Json::exception&) {
    return false;  // the attention reader reports the broken file
  }
}

std::string lmhead_case_json(const LmHeadCaseMeta& m) {
  Json j = {{"format", kFormat},
            {"version", kFormatVersion},
            {"name", m.name},
            {"N", m.p.N},
            {"d", m.p.d},
            {"V", m.p.V},
            {"ignore_index", m.p.ignore_index},
            {"label_smoothing", m.p.label_smoothing},
            {"z_loss", m.p.z_loss},
            {"reduction", to_string(m.p.reduction)},
            {"g", m.g},
            {"dtype", to_string(m.dtype)},
            {"values", to_string(m.values)},
            {"seed", m.seed},
            {"ignore_fraction", m.ignored},
            {"backward", m.backward}};
  return j.dump(1) + "\n";
}

LmHeadCaseMeta parse_lmhead_case_json(const std::string& text, const std::string& where) {
  const Json j = parse_json(text, where);
  Fields f{j, where, {}};
  if (f.string("format") != kFormat) fail(where, ": field 'format' must be \"", kFormat, "\"");
  const int64_t version = f.integer("version", 0, 1 << 20);
  if (version != kFormatVersion)
    fail(where, ": version (", version, ") is not supported; this burstlab reads ", kFormatVersion);
  LmHeadCaseMeta m;
  m.name = f.string("name");
  m.p.N = f.integer("N", 1, kMaxDim);
  m.p.d = f.integer("d", 1, kMaxDim);
  m.p.V = f.integer("V", 1, kMaxDim);
  m.p.ignore_index = f.integer("ignore_index", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  m.p.label_smoothing = f.number("label_smoothing");
  m.p.z_loss = f.number("z_loss");
  m.g = f.number("g");
  try {
    m.p.reduction = parse_reduction(f.string("reduction"));
    m.dtype = parse_dtype(f.string("dtype"));
    m.values = parse_values(f.string("values"));
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  m.seed = f.uinteger("seed");
  m.ignored = f.number("ignore_fraction");
  m.backward = f.boolean("backward");
  f.no_others();
  try {
    validate(m.p);
    if (!std::isfinite(m.g)) fail("g (", m.g, ") must be finite");
    if (!(m.ignored >= 0 && m.ignored <= 1)) fail("ignore_fraction (", m.ignored, ") must be in [0, 1]");
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  const double big = static_cast<double>(std::max(m.p.N, m.p.V)) * static_cast<double>(m.p.d);
  if (big > std::ldexp(1.0, 31)) fail(where, ": tensors of ", big, " elements are beyond case files' 2^31 limit");
  return m;
}

LmHeadCaseData make_lmhead_case(const LmHeadCaseMeta& m) {
  LmHeadCaseData c;
  c.meta = m;
  c.in = make_lmhead_inputs(m.p, m.dtype, m.seed, m.values, m.ignored);
  return c;
}

void write_lmhead_case(const std::string& dir, const LmHeadCaseData& c) {
  const fs::path d(dir);
  fs::create_directories(d);
  write_file((d / "case.json").string(), lmhead_case_json(c.meta));
  save_matrix(d / "h.npy", c.meta.dtype, c.in.H);
  save_matrix(d / "w.npy", c.meta.dtype, c.in.W);
  write_npy_int64((d / "y.npy").string(), {c.meta.p.N}, c.in.y.data(), c.in.y.size());
}

LmHeadCaseData read_lmhead_case(const std::string& dir) {
  const fs::path d(dir);
  LmHeadCaseData c;
  c.meta = parse_lmhead_case_json(read_file((d / "case.json").string()), (d / "case.json").string());
  const LmHeadProblem& p = c.meta.p;
  c.in.dtype = c.meta.dtype;
  Dtype th, tw;
  c.in.H = load_matrix(d / "h.npy", p.N, p.d, &th);
  c.in.W = load_matrix(d / "w.npy", p.V, p.d, &tw);
  if (th != c.meta.dtype || tw != c.meta.dtype)
    fail(dir, ": h.npy (", to_string(th), ") and w.npy (", to_string(tw), ") must hold the case's dtype (",
         to_string(c.meta.dtype), ")");
  NpyInt64 y = read_npy_int64((d / "y.npy").string());
  if (y.shape != std::vector<int64_t>{p.N}) fail((d / "y.npy").string(), ": shape ", shape_str(y.shape), " must be (", p.N, ",)");
  c.in.y = std::move(y.data);
  try {
    validate_labels(p, c.in.y.data());
  } catch (const Error& e) {
    fail((d / "y.npy").string(), ": ", e.what());
  }
  return c;
}

LmHeadExpected compute_lmhead_expected(const LmHeadCaseData& c) {
  const LmHeadProblem& p = c.meta.p;
  LmHeadExpected e;
  e.LSE.assign(static_cast<size_t>(p.N), 0.0);
  e.L = reference::lmhead_forward<double>(p, c.in.H.view(), c.in.W.view(), c.in.y.data(), e.LSE.data());
  if (c.meta.backward) {
    e.dH = make_matrix<double>(p.N, p.d);
    e.dW = make_matrix<double>(p.V, p.d);
    reference::lmhead_backward<double>(p, c.in.H.view(), c.in.W.view(), c.in.y.data(), e.LSE.data(), c.meta.g,
                                       e.dH.view(), e.dW.view());
  }
  return e;
}

void write_lmhead_expected(const std::string& dir, const LmHeadExpected& e) {
  const fs::path d = fs::path(dir) / "expected";
  fs::create_directories(d);
  write_npy((d / "L.npy").string(), Dtype::F64, {}, &e.L, 1);
  write_npy((d / "LSE.npy").string(), Dtype::F64, {static_cast<int64_t>(e.LSE.size())}, e.LSE.data(), e.LSE.size());
  if (!e.dH.data.empty()) {
    save_matrix(d / "dH.npy", Dtype::F64, e.dH);
    save_matrix(d / "dW.npy", Dtype::F64, e.dW);
  }
}

LmHeadExpected read_lmhead_expected(const std::string& dir, const LmHeadCaseMeta& m) {
  const fs::path d = fs::path(dir) / "expected";
  if (!fs::exists(d / "L.npy")) fail(dir, ": no expected outputs; run `burstlab oracle --case ", dir, "`");
  LmHeadExpected e;
  e.L = load_shaped(d / "L.npy", {}).data.at(0);
  e.LSE = load_shaped(d / "LSE.npy", {m.p.N}).data;
  if (m.backward) {
    e.dH = load_matrix(d / "dH.npy", m.p.N, m.p.d);
    e.dW = load_matrix(d / "dW.npy", m.p.V, m.p.d);
  }
  return e;
}

LmHeadCandidate read_lmhead_candidate(const std::string& dir, const LmHeadCaseMeta& m, const std::string& dtype) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail(dir, ": candidate directory does not exist");
  LmHeadCandidate c;
  bool have_type = false;
  Dtype t = Dtype::F32;
  if (fs::exists(d / "L.npy")) {
    c.L = load_shaped(d / "L.npy", {}).data.at(0);
    c.has_L = true;
  }
  if (fs::exists(d / "LSE.npy")) {
    NpyArray a = load_shaped(d / "LSE.npy", {m.p.N});
    c.LSE = std::move(a.data);
    c.has_LSE = true;
    t = a.dtype;
    have_type = true;
  }
  if (fs::exists(d / "dH.npy")) {
    c.dH = load_matrix(d / "dH.npy", m.p.N, m.p.d, &t);
    c.has_dH = true;
    have_type = true;
  }
  if (fs::exists(d / "dW.npy")) {
    c.dW = load_matrix(d / "dW.npy", m.p.V, m.p.d);
    c.has_dW = true;
  }
  if (!dtype.empty()) c.dtype = parse_dtype(dtype);
  else if (have_type) c.dtype = t;
  else fail(dir, ": candidate has neither LSE.npy nor dH.npy: say its precision with --dtype");
  return c;
}

CheckResult check_lmhead_candidate(const LmHeadCaseData& c, const LmHeadExpected& e, const LmHeadCandidate& cand,
                                   Dtype dtype, int max_list, int64_t r_W) {
  const LmHeadProblem& p = c.meta.p;
  LmHeadOracle o;
  lmhead_bounds(p, dtype, c.in.H.view(), c.in.W.view(), c.in.y.data(), e.LSE.data(), c.meta.g, c.meta.backward, o);
  CheckResult r;
  r.case_name = c.meta.name;
  r.dtype = dtype;
  r.tensors.push_back(check_values("L", cand.has_L, {}, 0, &cand.L, &e.L, &o.bound_L, 1, max_list));
  r.tensors.push_back(check_values("LSE", cand.has_LSE, {"i"}, 0, cand.LSE.data(), e.LSE.data(), o.bound_LSE.data(),
                                   e.LSE.size(), max_list));
  if (c.meta.backward) {
    r.tensors.push_back(check_values("dH", cand.has_dH, {"i", "k"}, p.d, cand.dH.data.data(), e.dH.data.data(),
                                     o.bound_dH.data.data(), e.dH.data.size(), max_list));
    const Matrix<double> bound_dW = dW_bound(o, r_W);
    r.tensors.push_back(check_values("dW", cand.has_dW, {"j", "k"}, p.d, cand.dW.data.data(), e.dW.data.data(),
                                     bound_dW.data.data(), e.dW.data.size(), max_list));
  }
  return r;
}

std::vector<LmHeadCaseMeta> lmhead_suite(bool quick, Dtype dtype) {
  struct S {
    const char* name;
    int64_t N, d, V;
    double eps, lambda;
    Reduction red;
    double ignored, g;
    Values values;
    bool in_quick;
  };
  // Sizes keep the quick set's oracle well under a second on 2 cores.
  const S cases[] = {
      {"plain", 64, 64, 1000, 0, 0, Reduction::Mean, 0.1, 1, Values::Normal, true},
      {"ragged_smoothing_zloss_sum", 113, 24, 1023, 0.1, 1e-4, Reduction::Sum, 0.2, 0.5, Values::Normal, true},
      {"vocab_1", 17, 8, 1, 0.2, 0.01, Reduction::Mean, 0.1, 1, Values::Normal, true},
      {"all_ignored", 20, 16, 300, 0.1, 1e-3, Reduction::Mean, 1.0, 1, Values::Normal, true},
      {"large_logits", 50, 16, 517, 0.05, 1e-4, Reduction::Mean, 0.1, 1, Values::Large, true},
      {"ties", 40, 16, 257, 0, 0, Reduction::Sum, 0.25, 1, Values::Ties, true},
      {"one_row", 1, 32, 4099, 0, 0, Reduction::Mean, 0, 1, Values::Normal, false},
      {"half_ignored_smoothing", 203, 64, 2048, 0.3, 0, Reduction::Mean, 0.5, 1, Values::Normal, false},
      {"vocab_32000", 64, 32, 32000, 0.1, 1e-4, Reduction::Mean, 0.1, 1, Values::Normal, false},
  };
  std::vector<LmHeadCaseMeta> out;
  int k = 0;
  for (const S& s : cases) {
    ++k;  // deterministic: case k gets seed 7000 + k whatever the subset
    if (quick && !s.in_quick) continue;
    LmHeadCaseMeta m;
    char name[96];
    std::snprintf(name, sizeof name, "lmhead_%02d_%s_%s", k, s.name, to_string(dtype).c_str());
    m.name = name;
    m.p.N = s.N;
    m.p.d = s.d;
    m.p.V = s.V;
    m.p.label_smoothing = s.eps;
    m.p.z_loss = s.lambda;
    m.p.reduction = s.red;
    m.g = s.g;
    m.dtype = dtype;
    m.values = s.values;
    m.seed = 7000 + static_cast<uint64_t>(k);
    m.ignored = s.ignored;
    out.push_back(m);
  }
  return out;
}

}  // namespace burstlab::check
