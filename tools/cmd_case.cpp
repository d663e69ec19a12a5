// tools/cmd_case.cpp — burstlab as an oracle for other implementations (docs/conformance.md):
//   gen      write the curated suite of case directories (inputs as .npy + case.json)
//   oracle   write the fp64 expected outputs into a case (or every case of a suite)
//   check    compare a candidate's output files with the oracle under spec §9
// (conform, every built-in implementation over the suite: cmd_conform.cpp; the cases' memory
// estimates: case_need.cpp)
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

namespace burstlab::tools {

namespace fs = std::filesystem;
using check::CaseData;
using check::CaseMeta;

std::vector<Dtype> parse_dtypes(const std::string& list) {
  std::vector<Dtype> out;
  for (const std::string& one : split_commas(list)) out.push_back(parse_dtype(one));
  if (out.empty()) fail("dtype (", list, ") must name at least one dtype");
  return out;
}

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

void require_case_fits(const CaseMeta& m, int threads, const MemAvailable& avail, const CaseNeed& need,
                       const std::function<std::string()>& other) {
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
namespace {
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
}  // namespace

std::string fmt_ratio(double x) { return std::isinf(x) ? "inf" : format("%.1e", x); }

namespace {

// ---- gen ---------------------------------------------------------------------------------------
struct GenFlags { std::string out, dtype = "fp32", op = "attention"; bool quick = false, oracle = false, list = false; };

// One operator's suite: suite(quick, dtype) its cases, line(meta) a case's --list line, write(dir,
// meta) its directory.
template <class Suite, class Line, class Write>
int gen_suite(const GenFlags& s, Suite suite, Line line, Write write) {
  std::vector<typename decltype(suite(false, Dtype::F32))::value_type> metas;
  for (Dtype t : parse_dtypes(s.dtype)) {
    const auto part = suite(s.quick, t);
    metas.insert(metas.end(), part.begin(), part.end());
  }
  if (s.list) {
    for (const auto& m : metas) std::printf("%s\n", line(m).c_str());
    return kExitPass;
  }
  if (s.out.empty()) fail("out (empty) must name a directory: gen --out DIR");
  Progress progress(static_cast<int>(metas.size()));
  for (const auto& m : metas) {
    progress.step(m.name);
    write((fs::path(s.out) / m.name).string(), m);
  }
  progress.done();
  std::printf("wrote %zu cases to %s%s\n", metas.size(), s.out.c_str(), s.oracle ? " (with expected outputs)" : "");
  return kExitPass;
}

Command add_gen(CLI::App& app) {
  auto s = std::make_shared<GenFlags>();
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
  return {sub, [s]() -> int {
    const bool oracle = s->oracle;
    if (parse_operator(s->op) == Operator::LmHeadCe)
      return gen_suite(
          *s, check::lmhead_suite,
          [](const check::LmHeadCaseMeta& m) {
            return format("%-44s %s values=%s g=%g", m.name.c_str(), shape_string(m.p).c_str(),
                          to_string(m.values).c_str(), m.g);
          },
          [oracle](const std::string& dir, const check::LmHeadCaseMeta& m) {
            const check::LmHeadCaseData cd = check::make_lmhead_case(m);
            check::write_lmhead_case(dir, cd);
            if (oracle) check::write_lmhead_expected(dir, check::compute_lmhead_expected(cd));
          });
    return gen_suite(
        *s, check::suite,
        [](const CaseMeta& m) {
          return format("%-40s %s %s mask=%s values=%s", m.name.c_str(), shape_string(m.p).c_str(),
                        to_string(m.layout).c_str(), m.mask_spec.c_str(), to_string(m.values).c_str());
        },
        [oracle](const std::string& dir, const CaseMeta& m) {
          const CaseData cd = check::make_case(m);
          check::write_case(dir, cd);
          if (oracle) check::write_expected(dir, cd, check::compute_expected(cd));
        });
  }};
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
  return {sub, [s]() -> int {
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
  }};
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
  int_flag(sub, "--max-list", s->max_list, "mismatches listed per tensor", "max-list", 0, kMaxRepeat);
  int_flag(sub, "--dw-roundings", s->dW_roundings,
           "LM head cases: how often the candidate rounds a partial sum of dW to its storage type (r_W of spec "
           "(10.21)): 1 when it sums in fp32 and stores once; the number of row chunks when it adds each chunk into a "
           "bf16/fp16 dW (as liger-kernel does)",
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
  return {sub, [s]() -> int {
    check::CandidateMeta over;
    if (s->lse_empty == "+inf" || s->lse_empty == "inf") over.conv.empty_lse_pos_inf = true;
    else if (s->lse_empty != "-inf") fail("lse-empty (", s->lse_empty, ") must be -inf or +inf");
    if (s->lse_base == "2") over.conv.lse_log2 = true;
    else if (s->lse_base != "e") fail("lse-base (", s->lse_base, ") must be e or 2");
    if (!s->dtype.empty()) { parse_dtype(s->dtype); over.dtype = s->dtype; }
    if (!s->layout.empty()) { parse_layout(s->layout); over.layout = s->layout; }
    const std::vector<std::string> only = split_commas(s->tensors, true);
    for (const std::string& one : only)
      if (one != "O" && one != "LSE" && one != "dQ" && one != "dK" && one != "dV" && one != "L" && one != "dH" &&
          one != "dW")
        fail("tensors (", s->tensors, ") has '", one, "'; names: O, LSE, dQ, dK, dV (attention), L, LSE, dH, dW (LM head)");
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
    // A candidate that skipped the case: every tensor missing.
    auto skipped = [](const std::string& name, Dtype dtype, std::initializer_list<const char*> tensors) {
      check::CheckResult r;
      r.case_name = name;
      r.dtype = dtype;
      for (const char* t : tensors) {
        check::TensorCheck tc;
        tc.m.tensor = t;
        tc.missing = true;
        r.tensors.push_back(tc);
      }
      return r;
    };
    for (const std::string& d : dirs) {
      const std::string cand_dir = single ? s->cand : (fs::path(s->cand) / fs::path(d).filename()).string();
      const bool lm = check::is_lmhead_case(d);  // spec §10: L, LSE, dH, dW under §10.8; no LSE conventions apply
      check::CheckResult r;
      if (lm) {
        const check::LmHeadCaseData cd = check::read_lmhead_case(d);
        const check::LmHeadExpected e = check::read_lmhead_expected(d, cd.meta);
        if (!fs::is_directory(cand_dir)) {
          r = skipped(cd.meta.name, cd.meta.dtype, {"L", "LSE", "dH", "dW"});
        } else {
          const check::LmHeadCandidate cand = check::read_lmhead_candidate(cand_dir, cd.meta, over.dtype);
          r = check::check_lmhead_candidate(cd, e, cand, cand.dtype, s->max_list, s->dW_roundings);
        }
      } else {
        const CaseData cd = check::read_case(d);
        const check::Expected e = check::read_expected(d, cd.meta);
        if (!fs::is_directory(cand_dir)) {
          r = skipped(cd.meta.name, cd.meta.dtype, {"O", "LSE", "dQ", "dK", "dV"});
        } else {
          const check::Candidate cand = check::read_candidate(cand_dir, cd.meta, over);
          r = check::check_candidate(cd, e, cand, cand.dtype, s->max_list);
        }
      }
      if (!only.empty()) {
        std::vector<check::TensorCheck> keep;
        for (const check::TensorCheck& t : r.tensors)
          if (std::find(only.begin(), only.end(), t.m.tensor) != only.end()) keep.push_back(t);
        r.tensors = keep;
      }
      failed += !r.pass();
      judged += static_cast<int>(r.tensors.size());
      if (s->json) {
        out += check::check_json(r) + "\n";
        continue;
      }
      std::string text = check::format_check(r);
      const std::string rule = "bound of spec §9 for", lm_rule = "bound of spec §10.8 for";
      if (const size_t at = text.find(rule); lm && at != std::string::npos) text.replace(at, rule.size(), lm_rule);
      out += text + (dirs.size() > 1 ? "\n" : "");
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
  }};
}

}  // namespace

std::vector<Command> add_case_commands(CLI::App& app) {
  return {add_gen(app), add_oracle(app), add_check(app), add_conform_command(app)};
}

}  // namespace burstlab::tools
