// tools/cmd_suite.cpp — `burstlab suite`: the embedded conformance set. Every implementation in
// the registry, in each of its suite dtypes, on every mask kind, GQA/MQA, ragged N_q != N_k both
// ways, d in {3, 64, 128}, adversarial values, forward and backward; each checked against the
// fp64 oracle (spec §9). One table, "N passed, M failed", non-zero exit on any failure.
#include <algorithm>
#include <cstdlib>
#include <memory>

#include "burstlab/error.hpp"
#include "burstlab/env.hpp"
#include "common.hpp"

namespace burstlab::tools {
namespace {

struct SuiteCase {
  int64_t B, H_q, H_kv, N_q, N_k, d;
  const char* mask;  // make_mask grammar (harness.hpp)
  Values values;
  Layout layout;
  int64_t Br = 0, Bc = 0;  // tiles for tiled impls; 0 = default
};

// Sizes keep the whole set under a minute on 2 cores (the fp64 oracle dominates).
const SuiteCase kCases[] = {
    // every mask kind, normal values
    {1, 4, 4, 128, 128, 64, "none", Values::Normal, Layout::BHSD},
    {2, 4, 2, 113, 203, 64, "causal", Values::Normal, Layout::BSHD},            // GQA, N_q < N_k
    {1, 8, 2, 203, 113, 128, "causal", Values::Normal, Layout::BHSD},           // N_q > N_k: empty rows
    {1, 8, 2, 203, 113, 128, "window:32,16", Values::Normal, Layout::BHSD},
    {1, 4, 1, 1023, 1023, 64, "document:4", Values::Normal, Layout::BSHD},      // MQA
    {1, 2, 2, 256, 301, 64, "block:32x64@0.5", Values::Normal, Layout::BHSD},
    {1, 4, 2, 500, 700, 128, "causal+document:3+block:64x64@0.6", Values::Normal, Layout::BHSD},
    {1, 2, 2, 300, 300, 64, "window:64,0+document:5", Values::Normal, Layout::BSHD, 17, 33},
    // ragged edges: one query, one key, d = 3
    {1, 2, 2, 1, 113, 64, "causal", Values::Normal, Layout::BHSD},
    {1, 2, 1, 113, 1, 3, "none", Values::Normal, Layout::BHSD},
    // adversarial values (spec §9.5)
    {1, 2, 1, 113, 203, 3, "causal", Values::Large, Layout::BHSD},
    {1, 2, 2, 203, 1023, 64, "window:64,0", Values::Large, Layout::BSHD},
    {1, 2, 2, 1023, 203, 128, "none", Values::Large, Layout::BHSD},
    {1, 4, 2, 203, 203, 64, "causal+document:3+block:16x32@0.5", Values::Large, Layout::BHSD, 16, 16},
    {1, 2, 1, 203, 203, 3, "document:5+block:16x16", Values::Ties, Layout::BHSD},
    {1, 3, 3, 113, 113, 64, "causal", Values::WideV, Layout::BSHD},
    {1, 2, 2, 203, 113, 128, "window:8,8", Values::WideV, Layout::BHSD},
};

// Dtypes in a fixed order, so every run prints the same table.
const Dtype kDtypes[] = {Dtype::F32, Dtype::F64, Dtype::BF16, Dtype::F16};

bool has(const std::vector<Dtype>& ts, Dtype t) { return std::find(ts.begin(), ts.end(), t) != ts.end(); }

struct Group {
  Case c;
  std::vector<const Impl*> impls;
};
// The (problem x dtype) runs an implementation skipped for one reason.
struct Skips {
  std::string impl, reason;
  int runs = 0;
};

}  // namespace

Command add_suite_command(CLI::App& app) {
  struct State {
    RunFlags run;
    bool list = false;
  };
  auto s = std::make_shared<State>();
  s->run.impl.clear();
  CLI::App* sub = app.add_subcommand(
      "suite",
      "Run the embedded conformance set on every built implementation (the first command to run)");
  sub->add_option("--impl", s->run.impl, "only these implementations (comma-separated; default: all built: " +
                                             registry_names() + ")");
  add_threads_flag(sub, s->run);
  add_json_flag(sub, s->run);
  sub->add_flag("-v,--verbose", s->run.verbose, "also print one row per tensor");
  sub->add_flag("--list", s->list, "print the problem set and exit");
  sub->footer(
      "Every built implementation in its suite dtypes, on every mask kind (none, causal, window,\n"
      "document, block and their conjunction), GQA/MQA, ragged N_q != N_k, d in {3, 64, 128},\n"
      "large/tied/wide values, forward and backward, each checked against the fp64 oracle.\n"
      "Progress on stderr; one table and \"N passed, M failed\" on stdout; exit 1 on any failure.\n\n"
      "Examples:\n"
      "  burstlab suite                      everything built here (what `bash scripts/main` runs)\n"
      "  burstlab suite --impl cpu -v        one implementation, per-tensor rows\n"
      "  burstlab suite --json > suite.json  machine-readable\n"
      "  burstlab suite --list               the problems, without running them");

  return {sub, [s]() -> int {
    apply_threads(s->run.threads);
    const std::vector<const Impl*> impls =
        s->run.impl.empty() ? [] {
          std::vector<const Impl*> all;
          for (const Impl& m : registry())
            if (m.op == Operator::Attention) all.push_back(&m);
          return all;
        }()
                            : find_impls(s->run.impl);
    // Build and validate every group before running any.
    std::vector<Group> groups;
    std::vector<Skips> skipped;  // by (impl, reason), in the order first met
    uint64_t seed = 1000;
    for (const SuiteCase& sc : kCases) {
      ++seed;
      const Problem p = make_problem(sc.B, sc.H_q, sc.H_kv, sc.N_q, sc.N_k, sc.d, sc.mask, seed, nullptr);
      for (Dtype t : kDtypes) {
        Group g;
        g.c.p = p;
        g.c.mask_spec = sc.mask;
        g.c.layout = sc.layout;
        g.c.dtype = t;
        g.c.values = sc.values;
        g.c.seed = seed;
        g.c.opt.Br = sc.Br;
        g.c.opt.Bc = sc.Bc;
        for (const Impl* m : impls) {
          if (!has(m->suite_dtypes, t)) continue;
          try {
            check_impl(*m, p, t, g.c.opt, m->has_backward);
          } catch (const Error& e) {
            auto it = std::find_if(skipped.begin(), skipped.end(),
                                   [&](const Skips& k) { return k.impl == m->name && k.reason == e.what(); });
            if (it == skipped.end()) it = skipped.insert(skipped.end(), Skips{m->name, e.what()});
            ++it->runs;
            continue;
          }
          g.c.pass.bwd = g.c.pass.bwd && m->has_backward;
          g.impls.push_back(m);
        }
        if (!g.impls.empty()) groups.push_back(std::move(g));
      }
    }
    if (s->list) {
      for (size_t k = 0; k < groups.size(); ++k) {
        std::string names;
        for (const Impl* m : groups[k].impls) names += (names.empty() ? "" : ",") + m->name;
        std::printf("%2zu  %-5s %s %s mask=%s values=%s impls=%s\n", k + 1, to_string(groups[k].c.dtype).c_str(),
                    shape_string(groups[k].c.p).c_str(), to_string(groups[k].c.layout).c_str(),
                    groups[k].c.mask_spec.c_str(), to_string(groups[k].c.values).c_str(), names.c_str());
      }
      return kExitPass;
    }
    if (groups.empty()) {  // nothing would be judged: say why, per implementation
      std::string why;
      for (const Impl* m : impls) {
        const auto k = std::find_if(skipped.begin(), skipped.end(), [&](const Skips& x) { return x.impl == m->name; });
        why += "; " + m->name + ": " +
               (k != skipped.end() ? k->reason : std::string("no suite dtype (it is not compared with itself)"));
      }
      fail("impl (", s->run.impl.empty() ? registry_names() : s->run.impl,
           ") has nothing to run here, so nothing would be judged", why,
           ". Choose implementations that run on this machine (built: ", registry_names(), ")");
    }

    Progress progress(static_cast<int>(groups.size()));
    std::vector<Result> rs;
    for (const Group& g : groups) {
      progress.step(to_string(g.c.dtype) + " " + shape_string(g.c.p) + " mask=" + g.c.mask_spec +
                    " values=" + to_string(g.c.values));
      const auto part = run_case(g.c, g.impls, 1);
      rs.insert(rs.end(), part.begin(), part.end());
    }
    progress.done();

    // Skips by (impl, reason): one line each, before the table.
    Json header = {{"command", "suite"}, {"threads", max_threads()}, {"skipped", Json::array()}};
    for (const Skips& k : skipped)
      header["skipped"].push_back({{"impl", k.impl}, {"runs", k.runs}, {"reason", k.reason}});
    if (!s->run.json)
      for (const Skips& k : skipped)
        std::printf("skipped: %s on %d problem x dtype runs: %s\n", k.impl.c_str(), k.runs, k.reason.c_str());
    // BURSTLAB_REQUIRE_GPU=1 (GPU machines): a skipped implementation is a failure, not a pass.
    size_t skips = 0;
    for (const Skips& k : skipped) skips += static_cast<size_t>(k.runs);
    const bool skips_fail = env::flag("BURSTLAB_REQUIRE_GPU") && skips > 0;
    if (skips_fail && !s->run.json)
      std::printf("BURSTLAB_REQUIRE_GPU=1: %zu skipped runs count as failures\n", skips);
    header["skips_fail"] = skips_fail;
    const int rc = report(rs, s->run, true, header);
    return skips_fail ? kExitFail : rc;
  }};
}

}  // namespace burstlab::tools
