// tools/cmd_case.cpp — burstlab as an oracle for other implementations (docs/conformance.md):
//   gen      write the curated suite of case directories (inputs as .npy + case.json)
//   oracle   write the fp64 expected outputs into a case (or every case of a suite)
//   check    compare a candidate's output files with the oracle under spec §9
//   conform  every built-in implementation over the suite: one PASS/FAIL matrix
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "burstlab/error.hpp"
#include "case.hpp"
#include "lmhead_case.hpp"
#include "cmd_case.hpp"
#include "npy.hpp"
#include "common.hpp"
#include "resources.hpp"
#include "algorithm.hpp"  // the schedules of spec §7: algorithms()
#include "sim_run.hpp"
#include "gather.hpp"

namespace burstlab::tools {
namespace {

namespace fs = std::filesystem;
using check::CaseData;
using check::CaseMeta;

std::vector<Dtype> parse_dtypes(const std::string& list) {
  std::vector<Dtype> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string one = list.substr(at, comma - at);
    if (!one.empty()) out.push_back(parse_dtype(one));
    at = comma + 1;
  }
  if (out.empty()) fail("dtype (", list, ") must name at least one dtype");
  return out;
}

// A directory is one case (case.json) or a suite (subdirectories with case.json, sorted).
std::vector<std::string> case_dirs(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "case.json")) return {dir};
  if (!fs::is_directory(dir)) fail("case (", dir, ") is neither a case directory nor a suite directory");
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && fs::exists(e.path() / "case.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  if (out.empty()) fail("case (", dir, ") holds no case.json and no case subdirectory; see `burstlab gen`");
  return out;
}

// Refuses (exit 2) before any case is read beyond its case.json when one would not fit in memory
// (resources.hpp): the case, its step, what is available, and what fits instead. LM head cases
// are not estimated here.
using CaseNeed = std::function<MemNeed(const CaseMeta& m, int threads)>;
void require_case_fits(const CaseMeta& m, int threads, const MemAvailable& avail, const CaseNeed& need,
                       const std::function<std::string()>& other = {}) {
  MemNeed n = need(m, threads);
  n.step = "case " + m.name + ": " + n.step;
  require_memory(n, avail, [&] {
    return case_advice(m.p, threads, avail, [&](const Problem& p, int t) {
      CaseMeta x = m;
      x.p = p;
      return need(x, t);
    }, other ? other() : "");
  });
}
CaseMeta read_meta(const std::string& dir) {
  const std::string json = (fs::path(dir) / "case.json").string();
  return check::parse_case_json(check::read_file(json), json);
}
void require_cases_fit(const std::vector<std::string>& dirs, int threads, const CaseNeed& need) {
  const MemAvailable avail = memory_available();
  if (avail.bytes < 0) return;
  for (const std::string& d : dirs)
    if (!check::is_lmhead_case(d)) require_case_fits(read_meta(d), threads, avail, need);
}

std::string fmt_ratio(double x) {
  char buf[32];
  if (std::isinf(x)) return "inf";
  std::snprintf(buf, sizeof buf, "%.1e", x);
  return buf;
}

// ---- gen ---------------------------------------------------------------------------------------
Command add_gen(CLI::App& app) {
  struct S { std::string out, dtype = "fp32", op = "attention"; bool quick = false, oracle = false, list = false; };
  auto s = std::make_shared<S>();
  CLI::App* sub = app.add_subcommand("gen", "Write the conformance suite as case directories (.npy + case.json)");
  sub->add_option("--out", s->out, "directory to write the cases into (created; required unless --list)");
  sub->add_flag("--quick", s->quick, "the quick subset (CI)");
  sub->add_option("--dtype", s->dtype, "input dtype(s), comma-separated: fp64, fp32, bf16, fp16")->capture_default_str();
  sub->add_flag("--oracle", s->oracle, "also write the expected outputs (as `burstlab oracle`)");
  sub->add_flag("--list", s->list, "print the cases and exit");
  sub->add_option("--op", s->op, "operator: attention | lmhead-ce (the fused LM head + cross-entropy, spec §10)")
      ->capture_default_str();
  sub->footer(
      "Each case: case.json (shape, layout, dtype, scale, the full mask, seed), q.npy k.npy v.npy dO.npy.\n"
      "Deterministic: the same flags write the same bytes. See docs/conformance.md.\n\n"
      "Examples:\n"
      "  burstlab gen --out cases --quick --oracle\n"
      "  burstlab gen --out cases-bf16 --dtype bf16 --oracle\n"
      "  burstlab gen --op lmhead-ce --out lm-cases --quick --oracle   h.npy w.npy y.npy per case (spec §10)");
  Command c;
  c.app = sub;
  c.run = [s]() -> int {
    if (s->op != "attention" && s->op != "lmhead-ce") fail("op (", s->op, ") must be attention or lmhead-ce");
    if (s->op == "lmhead-ce") {
      std::vector<check::LmHeadCaseMeta> metas;
      for (Dtype t : parse_dtypes(s->dtype)) {
        const auto part = check::lmhead_suite(s->quick, t);
        metas.insert(metas.end(), part.begin(), part.end());
      }
      if (s->list) {
        for (const check::LmHeadCaseMeta& m : metas)
          std::printf("%-44s %s values=%s g=%g\n", m.name.c_str(), shape_string(m.p).c_str(), to_string(m.values).c_str(),
                      m.g);
        return kExitPass;
      }
      if (s->out.empty()) fail("out (empty) must name a directory: gen --out DIR");
      Progress progress(static_cast<int>(metas.size()));
      for (const check::LmHeadCaseMeta& m : metas) {
        progress.step(m.name);
        const check::LmHeadCaseData cd = check::make_lmhead_case(m);
        const std::string dir = (fs::path(s->out) / m.name).string();
        check::write_lmhead_case(dir, cd);
        if (s->oracle) check::write_lmhead_expected(dir, check::compute_lmhead_expected(cd));
      }
      progress.done();
      std::printf("wrote %zu cases to %s%s\n", metas.size(), s->out.c_str(), s->oracle ? " (with expected outputs)" : "");
      return kExitPass;
    }
    std::vector<CaseMeta> metas;
    for (Dtype t : parse_dtypes(s->dtype)) {
      const auto part = check::suite(s->quick, t);
      metas.insert(metas.end(), part.begin(), part.end());
    }
    if (s->list) {
      for (const CaseMeta& m : metas)
        std::printf("%-40s %s %s mask=%s values=%s\n", m.name.c_str(), shape_string(m.p).c_str(),
                    to_string(m.layout).c_str(), m.mask_spec.c_str(), to_string(m.values).c_str());
      return kExitPass;
    }
    if (s->out.empty()) fail("out (empty) must name a directory: gen --out DIR");
    Progress progress(static_cast<int>(metas.size()));
    for (const CaseMeta& m : metas) {
      progress.step(m.name);
      const CaseData cd = check::make_case(m);
      const std::string dir = (fs::path(s->out) / m.name).string();
      check::write_case(dir, cd);
      if (s->oracle) check::write_expected(dir, cd, check::compute_expected(cd));
    }
    progress.done();
    std::printf("wrote %zu cases to %s%s\n", metas.size(), s->out.c_str(), s->oracle ? " (with expected outputs)" : "");
    return kExitPass;
  };
  return c;
}

// ---- oracle ------------------------------------------------------------------------------------
Command add_oracle(CLI::App& app) {
  struct S {
    std::string dir;
    RunFlags run;  // --threads
  };
  auto s = std::make_shared<S>();
  CLI::App* sub = app.add_subcommand("oracle", "Write the fp64 oracle's O, LSE, dQ, dK, dV into a case (or suite)");
  sub->add_option("--case", s->dir, "a case directory, or a suite directory of cases")->required();
  add_threads_flag(sub, s->run);
  sub->footer("Writes CASE/expected/{O,LSE,dQ,dK,dV}.npy in fp64 (spec §2, §5), on the case's inputs exactly;\n"
              "for an LM head case (burstlab gen --op lmhead-ce) CASE/expected/{L,LSE,dH,dW}.npy (spec §10).\n"
              "Exit 2, before anything is written: a case that would not fit in memory (the oracle's N_q x N_k\n"
              "fp64 per thread; the message names what fits), or inputs that are not finite or whose logits\n"
              "overflow fp64 (spec §1.4).");
  Command c;
  c.app = sub;
  c.run = [s]() -> int {
    apply_threads(s->run.threads);
    const auto dirs = case_dirs(s->dir);
    require_cases_fit(dirs, max_threads(), [](const CaseMeta& m, int t) {
      return oracle_case_need(m.p, m.dtype, m.backward, t);
    });
    // A suite writes case after case: every case's inputs are validated (read_case) first.
    if (dirs.size() > 1)
      for (const std::string& d : dirs)
        if (!check::is_lmhead_case(d)) check::read_case(d);
    Progress progress(static_cast<int>(dirs.size()));
    for (const std::string& d : dirs) {
      progress.step(d);
      if (check::is_lmhead_case(d)) {
        const check::LmHeadCaseData cd = check::read_lmhead_case(d);
        check::write_lmhead_expected(d, check::compute_lmhead_expected(cd));
        continue;
      }
      const CaseData cd = check::read_case(d);
      check::write_expected(d, cd, check::compute_expected(cd));
    }
    progress.done();
    std::printf("wrote expected outputs for %zu case%s\n", dirs.size(), dirs.size() == 1 ? "" : "s");
    return kExitPass;
  };
  return c;
}

// ---- check -------------------------------------------------------------------------------------
Command add_check(CLI::App& app) {
  struct S {
    std::string case_dir, cand, dtype, lse_empty = "-inf", lse_base = "e", layout, tensors;
    RunFlags run;  // --threads
    bool json = false;
    int max_list = 5;
    int64_t dW_roundings = 1;
  };
  auto s = std::make_shared<S>();
  CLI::App* sub = app.add_subcommand("check", "Check a candidate's outputs against the oracle (spec §9 rule)");
  sub->add_option("--case", s->case_dir, "a case directory (or a suite directory)")->required();
  sub->add_option("--candidate", s->cand,
                  "directory with O.npy [LSE.npy dQ.npy dK.npy dV.npy] (for a suite: one subdirectory per case)")
      ->required();
  sub->add_option("--dtype", s->dtype, "the candidate's precision (default: O.npy's dtype): fp64, fp32, bf16, fp16");
  sub->add_option("--lse-empty", s->lse_empty, "LSE of empty rows in the candidate: -inf | +inf")->capture_default_str();
  sub->add_option("--lse-base", s->lse_base, "LSE units of the candidate: e (natural log) | 2 (log2)")->capture_default_str();
  sub->add_option("--layout", s->layout, "layout of the candidate's O, dQ, dK, dV (default: the case's)");
  sub->add_option("--tensors", s->tensors, "only these tensors, comma-separated (default: O,LSE and, for backward cases, dQ,dK,dV)");
  int_range(sub->add_option("--max-list", s->max_list, "mismatches listed per tensor")->capture_default_str(),
            "max-list",
            0, kMaxRepeat);
  int_range(sub->add_option("--dw-roundings", s->dW_roundings,
                            "LM head cases: how often the candidate rounds a partial sum of dW to its storage type (r_W "
                            "of spec (10.21)): 1 when it sums in fp32 and stores once; the number of row chunks when it "
                            "adds each chunk into a bf16/fp16 dW (as liger-kernel does)")
                ->capture_default_str(),
            "dw-roundings", 1, kMaxExtent);
  sub->add_flag("--json", s->json, "one JSON object per case on stdout");
  add_threads_flag(sub, s->run);
  sub->footer(
      "Per tensor: max_abs, max_rel, err/bound, #wrong and the first mismatches with (b, h, i|j, k).\n"
      "An LM head case (burstlab gen --op lmhead-ce) checks L, LSE, dH, dW .npy files under spec §10.8.\n"
      "candidate.json in the candidate directory may state {\"lse_empty\", \"lse_base\", \"dtype\", \"layout\"}.\n"
      "Exit: 0 pass, 1 a tensor failed or is missing, 2 bad input: among it a case that would not fit in\n"
      "memory (the §9 bounds hold N_q x N_k fp64 per thread; the message names what fits), inputs that\n"
      "are not finite or whose logits overflow fp64 (spec §1.4). Nothing is printed before every case is\n"
      "read and judged.\n\n"
      "Example:\n"
      "  burstlab check --case cases/01_full_mha_fp32 --candidate out/01_full_mha_fp32 --lse-base 2");
  Command c;
  c.app = sub;
  c.run = [s]() -> int {
    check::CandidateMeta over;
    if (s->lse_empty == "+inf" || s->lse_empty == "inf") over.conv.empty_lse_pos_inf = true;
    else if (s->lse_empty != "-inf") fail("lse-empty (", s->lse_empty, ") must be -inf or +inf");
    if (s->lse_base == "2") over.conv.lse_log2 = true;
    else if (s->lse_base != "e") fail("lse-base (", s->lse_base, ") must be e or 2");
    if (!s->dtype.empty()) { parse_dtype(s->dtype); over.dtype = s->dtype; }
    if (!s->layout.empty()) { parse_layout(s->layout); over.layout = s->layout; }
    if (s->max_list < 0) fail("max-list (", s->max_list, ") must be >= 0");
    if (s->dW_roundings < 1) fail("dw-roundings (", s->dW_roundings, ") must be >= 1");
    std::vector<std::string> only;
    for (size_t at = 0; at <= s->tensors.size() && !s->tensors.empty();) {
      const size_t comma = std::min(s->tensors.find(',', at), s->tensors.size());
      const std::string one = s->tensors.substr(at, comma - at);
      at = comma + 1;
      if (one != "O" && one != "LSE" && one != "dQ" && one != "dK" && one != "dV" && one != "L" && one != "dH" &&
          one != "dW")
        fail("tensors (", s->tensors, ") has '", one, "'; names: O, LSE, dQ, dK, dV (attention), L, LSE, dH, dW (LM head)");
      only.push_back(one);
    }
    apply_threads(s->run.threads);
    const auto dirs = case_dirs(s->case_dir);
    require_cases_fit(dirs, max_threads(), [](const CaseMeta& m, int t) {
      return check_case_need(m.p, m.dtype, m.backward, t);
    });
    // A case of a suite whose subdirectory is absent is a candidate that skipped it (every tensor
    // missing: exit 1); a candidate path that is absent altogether is bad input.
    if (!fs::is_directory(s->cand))
      fail("candidate (", s->cand, ") ", fs::exists(s->cand) ? "is not a directory" : "does not exist",
           ": it must be a directory of O.npy [LSE.npy dQ.npy dK.npy dV.npy]",
           dirs.size() > 1 ? ", one subdirectory per case" : "");
    const bool single = dirs.size() == 1 && dirs[0] == s->case_dir;
    int failed = 0, judged = 0;  // judged: tensors compared (or found missing), over all cases
    std::string out;             // printed once every case is judged: bad input prints no partial table
    for (const std::string& d : dirs) {
      const std::string cand_dir = single ? s->cand : (fs::path(s->cand) / fs::path(d).filename()).string();
      check::CheckResult r;
      if (check::is_lmhead_case(d)) {  // spec §10: L, LSE, dH, dW under §10.8; no LSE conventions apply
        const check::LmHeadCaseData cd = check::read_lmhead_case(d);
        const check::LmHeadExpected e = check::read_lmhead_expected(d, cd.meta);
        if (!fs::is_directory(cand_dir)) {
          r.case_name = cd.meta.name;
          r.dtype = cd.meta.dtype;
          for (const char* t : {"L", "LSE", "dH", "dW"}) {
            check::TensorCheck tc;
            tc.m.tensor = t;
            tc.missing = true;
            r.tensors.push_back(tc);
          }
        } else {
          const check::LmHeadCandidate cand = check::read_lmhead_candidate(cand_dir, cd.meta, over.dtype);
          r = check::check_lmhead_candidate(cd, e, cand, cand.dtype, s->max_list, s->dW_roundings);
        }
        if (!only.empty()) {
          std::vector<check::TensorCheck> keep;
          for (const check::TensorCheck& t : r.tensors)
            if (std::find(only.begin(), only.end(), t.m.tensor) != only.end()) keep.push_back(t);
          r.tensors = keep;
        }
        failed += !r.pass();
        judged += static_cast<int>(r.tensors.size());
        if (s->json) out += check::check_json(r) + "\n";
        else {
          std::string text = check::format_check(r);
          const std::string rule = "bound of spec §9 for", lm_rule = "bound of spec §10.8 for";
          if (const size_t at = text.find(rule); at != std::string::npos) text.replace(at, rule.size(), lm_rule);
          out += text + (dirs.size() > 1 ? "\n" : "");
        }
        continue;
      }
      const CaseData cd = check::read_case(d);
      const check::Expected e = check::read_expected(d, cd.meta);
      if (!fs::is_directory(cand_dir)) {  // a suite run that skipped a case: every tensor missing
        r.case_name = cd.meta.name;
        r.dtype = cd.meta.dtype;
        for (const char* t : {"O", "LSE", "dQ", "dK", "dV"}) {
          check::TensorCheck tc;
          tc.m.tensor = t;
          tc.missing = true;
          r.tensors.push_back(tc);
        }
      } else {
        const check::Candidate cand = check::read_candidate(cand_dir, cd.meta, over);
        r = check::check_candidate(cd, e, cand, cand.dtype, s->max_list);
      }
      if (!only.empty()) {
        std::vector<check::TensorCheck> keep;
        for (const check::TensorCheck& t : r.tensors)
          if (std::find(only.begin(), only.end(), t.m.tensor) != only.end()) keep.push_back(t);
        r.tensors = keep;
      }
      failed += !r.pass();
      judged += static_cast<int>(r.tensors.size());
      if (s->json) out += check::check_json(r) + "\n";
      else out += check::format_check(r) + (dirs.size() > 1 ? "\n" : "");
    }
    std::fputs(out.c_str(), stdout);
    if (!s->json && dirs.size() > 1)
      std::printf("%zu passed, %d failed\n", dirs.size() - failed, failed);
    if (judged == 0) {  // --tensors named none of the tensors these cases have
      std::fflush(stdout);
      std::fprintf(stderr,
                   "burstlab check: FAIL: nothing was judged: --tensors (%s) names no tensor of %s (a forward-only "
                   "case has O, LSE; a backward case also dQ, dK, dV; an LM head case L, LSE, dH, dW); drop "
                   "--tensors or name one the case has\n",
                   s->tensors.c_str(), dirs.size() == 1 ? "this case" : "these cases");
      return kExitFail;
    }
    return failed ? kExitFail : kExitPass;
  };
  return c;
}

// ---- conform -----------------------------------------------------------------------------------
// A column of the matrix. prepare() validates and sets up one case (throws Error when the column
// cannot run that problem: cell "n/a"); the closure it returns runs it (any throw: cell FAIL).
using RunFn = std::function<check::Candidate()>;
struct Column {
  std::string name;
  std::vector<Dtype> dtypes;
  std::function<RunFn(const CaseData& cd)> prepare;
  Footprint footprint;  // host bytes of its run (resources.hpp); empty: not estimated
};

check::Candidate candidate_of(Dtype t, Layout layout) {
  check::Candidate c;
  c.dtype = t;
  c.layout = layout;
  return c;
}

Column impl_column(const Impl& m) {
  Column col;
  col.name = m.name;
  col.dtypes = m.suite_dtypes;
  col.footprint = m.footprint;
  col.prepare = [&m](const CaseData& cd) -> RunFn {
    check_impl(m, cd.meta.p, cd.meta.dtype, ImplOptions{}, m.has_backward);
    auto r = std::make_shared<Runner>(m.prepare(cd.meta.p, cd.in, ImplOptions{}));
    const bool bwd = m.has_backward && cd.meta.backward;
    const Dtype t = cd.meta.dtype;
    const Layout layout = cd.meta.layout;
    return [r, bwd, t, layout] {
      check::Candidate c = candidate_of(t, layout);
      r->forward();
      r->fetch_forward(c.O, c.LSE);
      c.has_O = c.has_LSE = true;
      if (bwd) {
        r->backward();
        r->fetch_backward(c.dQ, c.dK, c.dV);
        c.has_dQ = c.has_dK = c.has_dV = true;
      }
      return c;
    };
  };
  return col;
}

// One distributed session (dist::Session of an algorithm of the table)
// on SimComm threads, with the engine of an implementation; outputs gathered back to global BHSD.
template <class T, class Session, class Options>
RunFn dist_prepare(const CaseData& cd, Options o, std::unique_ptr<Engine<T>> engine, const EngineMakers& mk) {
  struct S {
    std::unique_ptr<Engine<T>> engine;
    std::unique_ptr<Session> session;
  };
  auto s = std::make_shared<S>();
  s->engine = std::move(engine);
  o.sim.memory.copy = mk.copy;
  o.sim.memory.poison = mk.poison;
  s->session = std::make_unique<Session>(cd.meta.p, cd.in.Q.view(), cd.in.K.view(), cd.in.V.view(), cd.in.dO.view(),
                                         o, *s->engine);  // validates: Error = n/a
  const Dtype t = cd.meta.dtype;
  return [s, t] {
    s->session->forward();
    s->session->backward();
    const auto res = s->session->result();
    check::Candidate c = candidate_of(t, Layout::BHSD);
    c.O = widen(dist::gather(res.O, res.qp));
    c.LSE = widen(dist::gather(res.LSE, res.qp));
    c.dQ = widen(dist::gather(res.dQ, res.qp));
    c.dK = widen(dist::gather(res.dK, res.kp));
    c.dV = widen(dist::gather(res.dV, res.kp));
    c.has_O = c.has_LSE = c.has_dQ = c.has_dK = c.has_dV = true;
    return c;
  };
}

// A Session of options o with the engine of `mk` for the case's dtype.
RunFn dist_prepare_any(const CaseData& cd, const dist::AlgoOptions& o, const EngineMakers& mk, const ImplOptions& io) {
  switch (cd.meta.dtype) {
    case Dtype::F64: return dist_prepare<double, dist::Session<double>>(cd, o, mk.f64(io), mk);
    case Dtype::F32: return dist_prepare<float, dist::Session<float>>(cd, o, mk.f32(io), mk);
    case Dtype::BF16: return dist_prepare<bf16_t, dist::Session<bf16_t>>(cd, o, mk.bf16(io), mk);
    case Dtype::F16: break;
  }
  return dist_prepare<f16_t, dist::Session<f16_t>>(cd, o, mk.f16(io), mk);
}

// Every algorithm of the table (distributed/algorithm.hpp), on the engine of each implementation
// that conform treats as a layer (cpu, and cuda when built). attention2d runs on the cyclic
// partition it needs, distflash on the contiguous one, usp with groups of 2 (when 2 divides G).
std::vector<Column> dist_columns(int world, const std::string& partition) {
  std::vector<Column> out;
  for (const Impl& m : registry()) {
    if (!m.engines.any() || (m.name != "cpu" && m.name != "cuda")) continue;
    const EngineMakers mk = m.engines;
    for (const dist::Algorithm& a : dist::algorithms()) {
      const std::string name = a.name;
      dist::AlgoOptions o;
      o.algo = name;
      o.partition = dist::parse_partition(partition);
      o.world = world;
      o.backward = true;
      Column col;
      col.name = name + "/" + m.name + " G=" + std::to_string(world);
      if (a.grid && a.partition) {  // the grid's algorithms run on their own partition whatever --partition says
        o.partition = *a.partition;
        col.name += " " + dist::to_string(o.partition);
      }
      if (a.ulysses_groups) {
        if (world % 2 != 0) continue;
        o.ulysses_degree = 2;
        col.name += " u=2";
      }
      col.dtypes = mk.dtypes();
      col.footprint = distributed_footprint(a.gathers_kv, world, mk.footprint);
      col.prepare = [o, mk](const CaseData& cd) { return dist_prepare_any(cd, o, mk, ImplOptions{}); };
      out.push_back(col);
    }
  }
  return out;
}

Command add_conform(CLI::App& app) {
  struct S {
    std::string suite_dir, dtype = "fp64,fp32", impl, partition = "contiguous";
    bool full = false, json = false;
    int world = 2;
    RunFlags run;  // --threads
  };
  auto s = std::make_shared<S>();
  CLI::App* sub = app.add_subcommand(
      "conform", "Run every built-in implementation over the case suite: one PASS/FAIL matrix (worst err/bound)");
  // --case as in oracle and check (a case directory or a suite of them); --suite is its old name.
  sub->add_option("--case,--suite", s->suite_dir,
                  "a case directory, or a suite directory from `burstlab gen` (default: generate the suite in memory)");
  sub->add_flag("--full", s->full, "the full generated suite (default: the quick subset)");
  sub->add_option("--dtype", s->dtype, "dtypes of the generated suite, comma-separated: fp64, fp32, bf16, fp16 (not "
                                       "with --suite: its cases name theirs)")
      ->capture_default_str();
  sub->add_option("--impl", s->impl, "only these columns (comma-separated names as printed)");
  int_range(sub->add_option("--world", s->world, "ranks of the distributed columns (SimComm)")->capture_default_str(),
            "world", 1, kMaxWorld);
  sub->add_option("--partition", s->partition,
                  "contiguous | zigzag | striped: partition of the distributed columns (attention2d, attention2d-o: always striped)")
      ->capture_default_str();
  sub->add_flag("--json", s->json, "one JSON object per cell instead of the matrix");
  add_threads_flag(sub, s->run);
  sub->footer(
      "Cells: PASS/FAIL and the worst err/bound over O, LSE, dQ, dK, dV (spec §9); '-' = the column does\n"
      "not run that dtype; 'n/a' = it cannot run that problem (reason listed below the matrix).\n"
      "Exit: 0 every cell passed, 1 a cell failed or no cell was judged (every cell '-' or 'n/a'), 2 bad\n"
      "input: among it a case that would not fit in memory with the columns that run it (the message\n"
      "names what fits), inputs that are not finite or whose logits overflow fp64 (spec §1.4).\n\n"
      "Examples:\n"
      "  burstlab conform                                   the quick suite, generated in memory, fp64 and fp32\n"
      "  burstlab conform --case cases --impl cpu,ring       the cases `burstlab gen --out cases` wrote");
  Command c;
  c.app = sub;
  c.run = [s]() -> int {
    if (s->world < 1) fail("world (", s->world, ") must be >= 1");
    apply_threads(s->run.threads);
    std::vector<Column> cols;
    for (const Impl& m : registry())
      if (m.op == Operator::Attention) cols.push_back(impl_column(m));
    for (Column& col : dist_columns(s->world, s->partition)) cols.push_back(col);
    if (!s->impl.empty()) {
      std::vector<Column> keep;
      std::string names;
      for (const Column& col : cols) names += (names.empty() ? "" : ", ") + col.name;
      size_t at = 0;
      while (at <= s->impl.size()) {
        const size_t comma = std::min(s->impl.find(',', at), s->impl.size());
        const std::string one = s->impl.substr(at, comma - at);
        at = comma + 1;
        if (one.empty()) continue;
        auto it = std::find_if(cols.begin(), cols.end(),
                               [&](const Column& col) { return col.name == one || col.name.rfind(one + "/", 0) == 0; });
        if (it == cols.end()) fail("impl (", one, ") is not a column; columns: ", names);
        for (; it != cols.end(); ++it)
          if (it->name == one || it->name.rfind(one + "/", 0) == 0) keep.push_back(*it);
      }
      cols = keep;
    }
    // Rows: cases (from disk or generated).
    std::vector<std::string> dirs;
    std::vector<CaseMeta> metas;
    if (!s->suite_dir.empty()) {
      dirs = case_dirs(s->suite_dir);
      for (const std::string& d : dirs)
        metas.push_back(check::parse_case_json(check::read_file((fs::path(d) / "case.json").string()),
                                               (fs::path(d) / "case.json").string()));
    } else {
      for (Dtype t : parse_dtypes(s->dtype)) {
        const auto part = check::suite(!s->full, t);
        metas.insert(metas.end(), part.begin(), part.end());
      }
    }
    // Every case fits with the columns that run its dtype, or nothing runs (resources.hpp).
    if (const MemAvailable avail = memory_available(); avail.bytes >= 0) {
      const int threads = max_threads();
      for (size_t r = 0; r < metas.size(); ++r) {
        const CaseMeta& m = metas[r];
        const bool on_disk = !dirs.empty() && check::has_expected(dirs[r]);
        std::vector<ConformColumn> running;
        for (const Column& col : cols)
          if (std::find(col.dtypes.begin(), col.dtypes.end(), m.dtype) != col.dtypes.end())
            running.push_back({col.name, col.footprint});
        auto need_with = [&](const std::vector<ConformColumn>& cs) {
          return [&m, on_disk, cs](const CaseMeta& x, int t) {
            return conform_case_need(x.p, m.dtype, m.backward, on_disk, cs, t);
          };
        };
        require_case_fits(m, threads, avail, need_with(running), [&]() -> std::string {
          std::string fit;  // the columns that fit on their own, when not all do
          size_t n = 0;
          for (const ConformColumn& col : running)
            if (need_with({col})(m, threads).bytes <= advice_budget(avail)) {
              fit += (fit.empty() ? "" : ",") + col.name;
              ++n;
            }
          if (n == 0 || n == running.size()) return "";
          return fit.find(' ') == std::string::npos ? "--impl " + fit : "--impl '" + fit + "'";
        });
      }
    }
    struct Cell { std::string text; bool fail = false; double worst = 0; std::string note; };
    std::vector<std::vector<Cell>> cells(metas.size(), std::vector<Cell>(cols.size()));
    std::vector<std::string> notes;
    std::map<std::pair<std::string, std::string>, std::vector<std::string>> na;  // (column, reason) -> cases
    Progress progress(static_cast<int>(metas.size()));
    int failed = 0, passed = 0;
    for (size_t r = 0; r < metas.size(); ++r) {
      progress.step(metas[r].name);
      const CaseData cd = dirs.empty() ? check::make_case(metas[r]) : check::read_case(dirs[r]);
      const check::Expected e = !dirs.empty() && check::has_expected(dirs[r])
                                    ? check::read_expected(dirs[r], cd.meta)
                                    : check::compute_expected(cd);
      for (size_t k = 0; k < cols.size(); ++k) {
        Cell& cell = cells[r][k];
        const Column& col = cols[k];
        if (std::find(col.dtypes.begin(), col.dtypes.end(), cd.meta.dtype) == col.dtypes.end()) { cell.text = "-"; continue; }
        RunFn run;
        try {
          run = col.prepare(cd);
        } catch (const Error& ex) {
          cell.text = "n/a";
          cell.note = ex.what();
          na[{col.name, ex.what()}].push_back(cd.meta.name);
          continue;
        }
        try {
          const check::CheckResult res = check::check_candidate(cd, e, run(), cd.meta.dtype);
          cell.fail = !res.pass();
          cell.worst = res.worst_err_bound();
          cell.text = std::string(cell.fail ? "FAIL " : "PASS ") + fmt_ratio(cell.worst);
          if (cell.fail)
            for (const check::TensorCheck& t : res.tensors)
              if (!t.pass()) {
                cell.note = t.m.tensor + (t.missing ? " missing" : " " + (t.mismatches.empty() ? t.m.first_wrong : t.mismatches[0]));
                notes.push_back("FAIL " + col.name + " on " + cd.meta.name + ": " + cell.note);
                break;
              }
        } catch (const std::exception& ex) {
          cell.fail = true;
          cell.worst = HUGE_VAL;
          cell.text = "FAIL error";
          cell.note = ex.what();
          notes.push_back("FAIL " + col.name + " on " + cd.meta.name + ": threw: " + ex.what());
        }
        (cell.fail ? failed : passed) += 1;
      }
    }
    progress.done();
    // A matrix of '-' and 'n/a' checked nothing: it must not pass.
    std::string nothing_judged;
    if (passed + failed == 0) {
      int dashes = 0, na_cells = 0;
      for (const auto& row : cells)
        for (const Cell& cell : row) (cell.text == "-" ? dashes : na_cells) += 1;
      std::string unrun;  // the cases' dtypes that no selected column runs
      for (const CaseMeta& m : metas) {
        const std::string t = to_string(m.dtype);
        const bool runs = std::any_of(cols.begin(), cols.end(), [&](const Column& col) {
          return std::find(col.dtypes.begin(), col.dtypes.end(), m.dtype) != col.dtypes.end();
        });
        if (!runs && ("," + unrun + ",").find("," + t + ",") == std::string::npos) unrun += (unrun.empty() ? "" : ",") + t;
      }
      std::string why;
      if (dashes)
        why += std::to_string(dashes) + " '-': " +
               (unrun.empty() ? std::string("the column does not run the case's dtype") : "no column here runs " + unrun);
      if (na_cells) why += std::string(why.empty() ? "" : "; ") + std::to_string(na_cells) + " 'n/a': the reasons above";
      nothing_judged = "FAIL: nothing was judged: none of the " + std::to_string(metas.size() * cols.size()) +
                       " cells ran (" + why +
                       "). Choose columns (--impl) and cases (--case, --dtype) that run here; bf16 and fp16 cells "
                       "need a build with CUDA on a GPU machine";
    }
    if (s->json) {
      for (size_t r = 0; r < metas.size(); ++r)
        for (size_t k = 0; k < cols.size(); ++k) {
          const Cell& cell = cells[r][k];
          Json j = {{"case", metas[r].name}, {"impl", cols[k].name}, {"cell", cell.text}, {"note", cell.note}};
          if (cell.text != "-" && cell.text != "n/a") {
            j["pass"] = !cell.fail;
            j["worst_err_bound"] = std::isfinite(cell.worst) ? Json(cell.worst) : Json("inf");
          }
          std::printf("%s\n", j.dump().c_str());
        }
      if (!nothing_judged.empty()) {
        std::fflush(stdout);
        std::fprintf(stderr, "burstlab conform: %s\n", nothing_judged.c_str());
        return kExitFail;
      }
      return failed ? kExitFail : kExitPass;
    }
    size_t w0 = 4;
    for (const CaseMeta& m : metas) w0 = std::max(w0, m.name.size());
    std::printf("%-*s", static_cast<int>(w0), "case");
    std::vector<int> w(cols.size());
    for (size_t k = 0; k < cols.size(); ++k) {
      w[k] = static_cast<int>(std::max<size_t>(cols[k].name.size(), 12));
      std::printf("  %-*s", w[k], cols[k].name.c_str());
    }
    std::printf("\n");
    for (size_t r = 0; r < metas.size(); ++r) {
      std::printf("%-*s", static_cast<int>(w0), metas[r].name.c_str());
      for (size_t k = 0; k < cols.size(); ++k) std::printf("  %-*s", w[k], cells[r][k].text.c_str());
      std::printf("\n");
    }
    for (const auto& [key, cases] : na)
      std::printf("n/a %s on %zu case%s (%s%s): %s\n", key.first.c_str(), cases.size(), cases.size() == 1 ? "" : "s",
                  cases[0].c_str(), cases.size() > 1 ? ", ..." : "", key.second.c_str());
    for (const std::string& n : notes) std::printf("%s\n", n.c_str());
    std::printf("%d passed, %d failed (cells: PASS/FAIL worst err/bound, spec §9)\n", passed, failed);
    if (!nothing_judged.empty()) {
      std::printf("%s\n", nothing_judged.c_str());
      return kExitFail;
    }
    return failed ? kExitFail : kExitPass;
  };
  return c;
}

}  // namespace

std::vector<Command> add_case_commands(CLI::App& app) {
  return {add_gen(app), add_oracle(app), add_check(app), add_conform(app)};
}

}  // namespace burstlab::tools
