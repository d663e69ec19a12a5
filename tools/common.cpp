// tools/common.cpp — see common.hpp.
#include "common.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <stdexcept>

#include <omp.h>

#include "burstlab/error.hpp"
#include "resources.hpp"

namespace burstlab::tools {

// ---------------------------------------------------------------- flags
namespace {
// A refusal from inside CLI11's parse: a ParseError whose text is the whole message (a
// ValidationError would prefix the option's name again).
[[noreturn]] void refuse(const std::string& message) { throw CLI::ConversionError(message); }
std::string quoted(const std::string& field, const std::string& text) { return field + " (" + text + ")"; }
}  // namespace

CLI::Option* int_range(CLI::Option* o, const std::string& field, int64_t lo, uint64_t hi, const std::string& at_least,
                       const std::string& at_most) {
  const std::string flag = o->get_name();
  o->transform(CLI::Validator(  // transform: it may rewrite the text (leading zeros)
      [=](std::string& text) -> std::string {
        const std::string typed = text;  // quoted in messages
        const bool negative = !text.empty() && text[0] == '-';
        const size_t first = negative ? 1 : 0;
        if (text.size() == first || text.find_first_not_of("0123456789", first) != std::string::npos)
          refuse(quoted(field, typed) + " must be a decimal integer (" + flag + ")");
        // CLI11 converts with base 0: 010 would be octal 8. Leading zeros go; the value is decimal.
        const size_t nonzero = std::min(text.find_first_not_of('0', first), text.size() - 1);
        if (nonzero > first) text.erase(first, nonzero - first);
        // The magnitude; huge: beyond 2^64 - 1 (more digits than any bound allows).
        uint64_t mag = 0;
        const bool huge = std::from_chars(text.data() + first, text.data() + text.size(), mag).ec != std::errc();
        if (text == "-0") text = "0";
        const uint64_t lo_mag = lo < 0 ? uint64_t(0) - static_cast<uint64_t>(lo) : 0;  // |lo| when lo < 0
        // -0 is 0: below a positive lo like 0 itself.
        const bool below = negative ? (lo >= 0 ? huge || mag != 0 || lo > 0 : huge || mag > lo_mag)
                                    : (lo > 0 && !huge && mag < static_cast<uint64_t>(lo));
        if (below) refuse(quoted(field, typed) + " must be " + (at_least.empty() ? ">= " + std::to_string(lo) : at_least));
        if (!negative && (huge || mag > hi))
          refuse(quoted(field, typed) + " must be <= " + std::to_string(hi) + at_most);
        return "";
      },
      "", "range"));
  return o;
}

CLI::Option* real_range(CLI::Option* o, const std::string& field, double lo, double hi, bool lo_open) {
  o->check(CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) refuse(quoted(field, text) + " must be a number");
        if (!std::isfinite(v)) refuse(quoted(field, text) + " must be finite");
        auto str = [](double x) { return format("%g", x); };
        const bool has_lo = lo > std::numeric_limits<double>::lowest(), has_hi = hi < std::numeric_limits<double>::max();
        const bool below = lo_open ? !(v > lo) : v < lo;
        if (has_lo && has_hi && !lo_open && (below || v > hi))
          refuse(quoted(field, text) + " must lie in [" + str(lo) + ", " + str(hi) + "]");
        if (has_lo && below) refuse(quoted(field, text) + " must be " + (lo_open ? "> " : ">= ") + str(lo));
        if (has_hi && v > hi) refuse(quoted(field, text) + " must be <= " + str(hi));
        return "";
      },
      "", "range"));
  return o;
}

void add_shape_flags(CLI::App* app, ShapeFlags& f, bool multi_d) {
  extent_flag(app, "-B,--batch", f.B, "batch size B", "B");
  extent_flag(app, "--hq", f.H_q, "query heads H_q", "H_q");
  extent_flag(app, "--hkv", f.H_kv, "key/value heads H_kv (H_q % H_kv == 0; GQA/MQA when smaller)", "H_kv");
  extent_flag(app, "--nq", f.N_q, "queries per (b, h), N_q", "N_q");
  extent_flag(app, "--nk", f.N_k, "keys per (b, h), N_k", "N_k");
  CLI::Option* d = app->add_option("-d,--head-dim", f.d,
                                   multi_d ? "head dimension(s) d, e.g. -d 64,128" : "head dimension d")
                       ->capture_default_str()
                       ->delimiter(',');
  if (!multi_d) d->expected(1);
  int_range(d, "d", kNoLowerBound, kMaxExtent, ">= 1");
  app->add_option("--mask", f.mask,
                  "mask spec, '+'-joined parts: none | causal | window:L,R (-1 = unbounded) | "
                  "document[:n_docs] | block[:BQxBK[@density]]")
      ->capture_default_str();
  f.scale_opt = real_range(app->add_option("--scale", f.scale, "softmax scale (default 1/sqrt(d))"), "scale",
                           std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max());
  int_flag(app, "--seed", f.seed, "seed of inputs and generated masks", "seed", 0, std::numeric_limits<uint64_t>::max());
}
void add_dtype_flag(CLI::App* app, RunFlags& f) {
  app->add_option("--dtype", f.dtype, "storage dtype: fp64 | fp32 | bf16 | fp16")->capture_default_str();
}
void add_layout_flag(CLI::App* app, RunFlags& f) {
  app->add_option("--layout", f.layout, "memory layout: BHSD (SDPA) | BSHD (flash-attn)")->capture_default_str();
}
void add_values_flag(CLI::App* app, RunFlags& f) {
  app->add_option("--values", f.values,
                  "input values: normal | large (logits ~1e3+) | ties | widev (V, dO over 1e-6..1e6)")
      ->capture_default_str();
}
void add_impl_flag(CLI::App* app, RunFlags& f) {
  app->add_option("--impl", f.impl, "implementations, comma-separated; built here: " + registry_names())
      ->capture_default_str();
}
void add_pass_flag(CLI::App* app, RunFlags& f) {
  app->add_option("--pass", f.pass, "fwd | bwd | both")->capture_default_str();
}
void add_tile_flags(CLI::App* app, RunFlags& f) {
  const char* zero = ">= 1, or 0 for the implementation's default";
  int_flag(app, "--br", f.Br, "query rows per tile Br (0 = the implementation's default)", "br", 0, kMaxExtent, zero);
  int_flag(app, "--bc", f.Bc, "keys per tile Bc (0 = the implementation's default)", "bc", 0, kMaxExtent, zero);
}
void add_threads_flag(CLI::App* app, RunFlags& f) {
  int_flag(app, "--threads", f.threads, "OpenMP threads (0 = all, OMP_NUM_THREADS or every core)", "threads", 0,
           kMaxThreads, ">= 1, or 0 for all");
}
void add_json_flag(CLI::App* app, RunFlags& f) {
  app->add_flag("--json", f.json, "print JSON on stdout instead of the table");
}

// ---------------------------------------------------------------- problem
Problem make_problem(int64_t B, int64_t H_q, int64_t H_kv, int64_t N_q, int64_t N_k, int64_t d,
                     const std::string& mask_spec, uint64_t seed, const double* scale) {
  Problem p;
  p.B = B; p.H_q = H_q; p.H_kv = H_kv; p.N_q = N_q; p.N_k = N_k; p.d = d;
  if (scale) p.scale = *scale;
  validate(p);  // the shape first: make_mask needs sane lengths
  {
    Allocating step("generating the mask '" + mask_spec + "' (segment ids: 4 bytes per query and key)", 0);
    p.mask = make_mask(mask_spec, N_q, N_k, seed);
  }
  validate(p);
  return p;
}

Passes parse_pass(const std::string& s, Operator op) {
  const bool lm = op == Operator::LmHeadCe;
  if (s == "fwd") return {true, false, false};
  if (s == "bwd") return {false, true, false};
  if (s == "fused" && lm) return {false, false, true};
  if (s == "both") return {true, true, lm};
  if (lm) fail("pass (", s, ") must be fwd, bwd, fused or both (all three) with --op lmhead-ce");
  fail("pass (", s, ") must be fwd, bwd or both");
}

int max_threads() { return omp_get_max_threads(); }

void apply_threads(int threads) {
  if (threads == 0) return;
  // Eigen's GEMMs follow it too (Eigen::setNbThreads would pin a count for every thread, SimComm
  // ranks included; cpu/cpu.cpp relies on it not being set).
  omp_set_num_threads(threads);
}

// ---------------------------------------------------------------- tables
std::string pick_rate_unit(const std::vector<Result>& rs) {
  double best = 0;
  for (const Result& r : rs)
    if (r.ms > 0) best = std::max(best, r.flops / (r.ms * 1e-3));
  return best >= 1e12 ? "TFLOP/s" : "GFLOP/s";
}

Table result_table(const std::vector<Result>& rs, bool verbose, bool numbered) {
  const std::string unit = pick_rate_unit(rs);
  const double div = unit == "TFLOP/s" ? 1e12 : 1e9;
  Table t;
  if (numbered) t.columns.push_back({"case", "#", false});
  t.columns.insert(t.columns.end(), {{"impl", "impl", true},
                                     {"dtype", "dtype", true},
                                     {"shape", "shape (layout)", true},
                                     {"mask", "mask", true},
                                     {"values", "values", true},
                                     {"pass", "pass", true}});
  if (verbose) t.columns.push_back({"tensor", "tensor", true});
  t.columns.insert(t.columns.end(), {{"time_ms", "time(ms)", false},
                                     {unit == "TFLOP/s" ? "tflops" : "gflops", unit, false},
                                     {"max_abs", "max_abs", false},
                                     {"max_rel", "max_rel", false},
                                     {"err_bound", "err/bound", false},
                                     {"wrong", "#wrong", false},
                                     {"result", "result", true}});
  int n = 0;
  for (const Result& r : rs) {
    ++n;
    auto add = [&](const Metrics& m, const std::string& tensor, bool summary) {
      std::vector<Cell> row;
      if (numbered) row.push_back(summary ? integer(n) : text(""));
      row.insert(row.end(), {text(r.impl), text(to_string(r.dtype)), text(r.shape + " " + r.layout),
                             text(r.mask), text(r.values), text(r.pass)});
      if (verbose) row.push_back(text(tensor));
      const bool ran = r.error.empty();
      if (summary && ran) {
        row.push_back(number(r.ms, "%.3f"));
        row.push_back(number(r.ms > 0 ? r.flops / (r.ms * 1e-3) / div : 0.0, "%.2f"));
      } else {
        row.push_back(missing());
        row.push_back(missing());
      }
      if (ran) {
        row.insert(row.end(), {number(m.max_abs, "%.2e"), number(m.max_rel, "%.2e"),
                               number(m.err_bound, "%.2e"), integer(m.wrong)});
      } else {
        row.insert(row.end(), {missing(), missing(), missing(), missing()});
      }
      row.push_back(text(!ran ? "ERROR" : m.pass() ? "PASS" : "FAIL"));
      t.add(std::move(row));
    };
    add(r.all, "all", true);
    if (verbose)
      for (const Metrics& m : r.tensors) add(m, m.tensor, false);
  }
  return t;
}

Json result_json(const Result& r) {
  auto metrics = [](const Metrics& m) {
    return Json{{"tensor", m.tensor},        {"max_abs", json_number(m.max_abs)}, {"max_rel", json_number(m.max_rel)},
                {"err_bound", json_number(m.err_bound)}, {"wrong", m.wrong},  {"checked", m.checked},
                {"first_wrong", m.first_wrong}, {"pass", m.pass()}};
  };
  const bool ran = r.error.empty();
  Json j = {{"impl", r.impl}, {"dtype", to_string(r.dtype)}, {"shape", r.shape}, {"layout", r.layout},
            {"mask", r.mask}, {"values", r.values}, {"pass", r.pass},
            {"time_ms", ran ? json_number(r.ms) : Json(nullptr)}, {"flops", r.flops},
            {"gflops", ran && r.ms > 0 ? json_number(r.flops / (r.ms * 1e-3) / 1e9) : Json(nullptr)},
            {"all", metrics(r.all)}, {"tensors", Json::array()}};
  for (const Metrics& m : r.tensors) j["tensors"].push_back(metrics(m));
  j["error"] = r.error;
  j["result"] = !ran ? "ERROR" : r.all.pass() ? "PASS" : "FAIL";
  return j;
}

std::vector<std::string> failure_notes(const std::vector<Result>& rs) {
  std::vector<std::string> notes;
  for (const Result& r : rs) {
    const std::string who = r.impl + " " + to_string(r.dtype) + " " + r.pass + " [" + r.shape +
                            " mask=" + r.mask + " values=" + r.values + "]";
    if (!r.error.empty()) {
      notes.push_back("ERROR " + who + ": " + r.error);
      continue;
    }
    for (const Metrics& m : r.tensors)
      if (!m.pass())
        notes.push_back("FAIL " + who + " " + m.tensor + ": " + std::to_string(m.wrong) + " of " +
                        std::to_string(m.checked) + " wrong; first " + m.first_wrong);
  }
  return notes;
}

// ---------------------------------------------------------------- progress
Progress::Progress(int total_) : total(total_), tty(isatty(fileno(stderr)) != 0) {}
void Progress::step(const std::string& what) {
  ++k;
  if (tty)
    std::fprintf(stderr, "\r\033[K[%d/%d] %s", k, total, what.c_str());
  else
    std::fprintf(stderr, "[%d/%d] %s\n", k, total, what.c_str());
  std::fflush(stderr);
}
void Progress::done() {
  if (tty) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace burstlab::tools

namespace burstlab::tools {
bool verified(const std::vector<Case>& cases, const std::vector<const Impl*>& impls, const RunFlags& f, Json header,
              Progress& progress, std::vector<Result>& checked) {
  for (const Case& c : cases) {
    progress.step("verify " + case_shape(c));
    const auto part = run_case(c, impls, 1);
    checked.insert(checked.end(), part.begin(), part.end());
  }
  bool all_pass = !checked.empty();
  for (const Result& x : checked) all_pass = all_pass && x.pass_ok();
  if (all_pass) return true;
  progress.done();
  header["verified"] = false;
  header["error"] = "an implementation failed its check; no speed is reported";
  if (!f.json) std::printf("verification against the fp64 oracle FAILED: no speed is reported\n");
  report(checked, f, false, header);
  return false;
}

int report(const std::vector<Result>& rs, const RunFlags& f, bool numbered, Json header) {
  int passed = 0, failed = 0;
  for (const Result& r : rs) (r.pass_ok() ? passed : failed)++;
  if (f.json) {
    Json j = std::move(header);
    j["rows"] = Json::array();
    for (const Result& r : rs) j["rows"].push_back(result_json(r));
    j["passed"] = passed;
    j["failed"] = failed;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    result_table(rs, f.verbose, numbered).print(stdout);
    const auto notes = failure_notes(rs);
    if (!notes.empty()) std::printf("\n");
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
    int skipped = 0;  // commands that skip (suite) list {"runs": n, ...} under "skipped"
    if (header.contains("skipped"))
      for (const auto& k : header["skipped"]) skipped += k.value("runs", 0);
    if (skipped)
      std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    else
      std::printf("%d passed, %d failed\n", passed, failed);
  }
  std::fflush(stdout);
  if (rs.empty())  // an empty table passes nothing
    std::fprintf(stderr, "FAIL: nothing was judged: no implementation ran; choose --impl that runs here (built: %s)\n",
                 registry_names().c_str());
  return failed == 0 && passed > 0 ? kExitPass : kExitFail;
}
}  // namespace burstlab::tools
