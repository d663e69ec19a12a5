// tools/cmd_bench.cpp — `burstlab bench`: forward and backward FLOP rates (spec §8 convention)
// of reference and cpu in fp32, on one thread and on all threads, next to an Eigen SGEMM rate
// measured in the same run, with the performance goals of the cpu layer as columns. Verify
// before you time: each implementation is first checked against the fp64 oracle; a failing one
// gets no speed printed and the exit code is 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include <Eigen/Core>

#include "burstlab/error.hpp"
#include "cmd_lmhead.hpp"
#include "common.hpp"
#include "memcount.hpp"
#include "resources.hpp"

namespace burstlab::tools {
namespace {

// The cpu layer's goals (one thread, fp32): forward >= 1.8x reference and >= 0.55x SGEMM;
// backward >= 0.35x SGEMM.
constexpr double kFwdVsRef = 1.8, kFwdVsGemm = 0.55, kBwdVsGemm = 0.35;
// The fp64 oracle (and its bounds) on the full shape when B H_q visible_pairs d is at most this
// (~1-3 s on 2 cores); above it, --verify auto checks on a reduced shape.
constexpr double kOracleSameShapeMax = double(1 << 30);
constexpr int64_t kReducedN = 1024;

double sgemm_gflops(int64_t n, int reps) {
  Eigen::MatrixXf A = Eigen::MatrixXf::Random(n, n), Bm = Eigen::MatrixXf::Random(n, n), C(n, n);
  const std::function<double()> once = timed([&] { C.noalias() = A * Bm; });
  once();  // warm-up
  const double ms = best_of(once, reps);
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e9;
}

// The timing loop's peak: the inputs of one problem and one prepared implementation (its
// forward and backward on `threads` threads); the SGEMM's three n x n fp32 matrices come before.
MemNeed timing_need(const Problem& p, Dtype dtype, const ImplOptions& opt, const std::vector<const Impl*>& impls,
                    int threads, int64_t gemm_n) {
  MemNeed n = make_need("the Eigen SGEMM", {{"SGEMM's 3 n x n fp32 matrices (--gemm-n)",
                                            bytes_mul(12, bytes_mul(gemm_n, gemm_n))}});
  for (const Impl* m : impls) {
    if (!m->footprint) continue;
    std::vector<MemPart> parts = inputs_footprint(p, dtype);
    for (MemPart x : m->footprint(p, dtype, opt, true, threads)) {
      x.what = "impl " + m->name + ": " + x.what;
      parts.push_back(x);
    }
    n = peak_of(n, make_need("timing impl " + m->name + " (" + to_string(dtype) + ")", parts));
  }
  return n;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  struct State {
    ShapeFlags shape;
    RunFlags run;
    int reps = 3;
    int64_t gemm_n = 2048;
    std::string verify = "auto";
    LmHeadFlags lm;  // --op lmhead-ce (cmd_lmhead.hpp)
  };
  auto s = std::make_shared<State>();
  s->shape.H_q = s->shape.H_kv = 1;
  s->shape.N_q = s->shape.N_k = 4096;
  s->shape.d = {64, 128};
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Measure GFLOP/s of reference and cpu (--dtype, default fp32; 1 and all threads) against Eigen SGEMM");
  add_shape_flags(sub, s->shape, true);
  add_dtype_flag(sub, s->run);
  add_values_flag(sub, s->run);
  add_impl_flag(sub, s->run);
  add_tile_flags(sub, s->run);
  int_flag(sub, "--threads", s->run.threads, "the 'all threads' setting (0 = OMP_NUM_THREADS or every core)", "threads",
           0, kMaxThreads, ">= 1, or 0 for all");
  int_flag(sub, "--reps", s->reps, "timed runs per measurement (best is kept), after one warm-up", "reps", 1, kMaxRepeat);
  // n^2 elements per matrix: validate()'s 2^48 per tensor.
  int_flag(sub, "--gemm-n", s->gemm_n, "SGEMM size n (n x n times n x n)", "gemm-n", 1, int64_t(1) << 24);
  sub->add_option("--verify", s->verify,
                  "auto | same | reduced: check on the timed shape, or on N <= 1024 (auto: same when "
                  "B*H_q*visible_pairs*d <= 2^30)")
      ->capture_default_str();
  add_json_flag(sub, s->run);
  add_lmhead_flags(sub, s->lm);
  sub->footer(
      "Each implementation is checked against the fp64 oracle first; a failure prints no speed\n"
      "and exits 1. Then forward and backward are timed (best of --reps after a warm-up) on one\n"
      "thread and on all threads, next to an Eigen SGEMM measured in the same run, with the ratios\n"
      "cpu/reference and cpu/SGEMM, the cpu layer's goals (one thread: fwd >= 1.8x reference and\n"
      ">= 0.55x SGEMM, bwd >= 0.35x SGEMM) and the peak extra heap of the cpu forward.\n\n"
      "Examples:\n"
      "  burstlab bench                               N = 4096, d = 64 and 128, no mask\n"
      "  burstlab bench -d 128 --mask causal --reps 5\n"
      "  burstlab bench --nq 2048 --nk 2048 --threads 2 --json\n"
      "Goals are judged on one thread; 'met'/'NOT met' is informational (exit 0). A failed check\n"
      "exits 1 and prints no speed. A problem whose verification or timing would not fit in memory\n"
      "(estimated first, against MemAvailable, the cgroup limit or BURSTLAB_MEMORY_AVAILABLE=<bytes>)\n"
      "exits 2 before allocating, naming the flags that make it fit (e.g. --verify reduced).\n"
      "--op lmhead-ce --vocab V: the fused LM head + cross-entropy (spec §10), N = B x nq rows, -d hidden\n"
      "size: verified (on N <= 256 rows when N V d > 2^30), then the forward and the fused call of each\n"
      "impl timed with the peak extra heap of the timed calls; one run and no warm-up with --reps 1.\n"
      "  burstlab bench --op lmhead-ce --vocab 32768 --nq 8192 -d 1024 --reps 1");

  return {sub, [s, sub]() -> int {
    const ShapeFlags& f = s->shape;
    const RunFlags& r = s->run;
    if (lmhead_selected(sub, s->lm)) return bench_lmhead(f, r, s->lm, s->reps, s->verify);
    // ---- validate everything first
    const double* scale = *f.scale_opt ? &f.scale : nullptr;
    if (f.d.empty()) fail("d (none) needs at least one value");
    std::vector<Problem> problems;
    for (int64_t d : f.d) problems.push_back(make_problem(f.B, f.H_q, f.H_kv, f.N_q, f.N_k, d, f.mask, f.seed, scale));
    const Dtype dtype = parse_dtype(r.dtype);
    const Values values = parse_values(r.values);
    if (s->verify != "auto" && s->verify != "same" && s->verify != "reduced")
      fail("verify (", s->verify, ") must be auto, same or reduced");
    const ImplOptions opt{r.Br, r.Bc};
    const std::vector<const Impl*> impls = find_impls(r.impl);
    for (const Problem& p : problems)
      for (const Impl* m : impls) check_impl(*m, p, dtype, opt, true);
    const int all_threads = r.threads > 0 ? r.threads : max_threads();
    std::vector<int> thread_settings = {1};
    if (all_threads > 1) thread_settings.push_back(all_threads);

    // ---- the verification cases, and the memory both steps need (refused before allocating)
    std::vector<Case> cases;
    std::vector<std::string> verify_shape;
    for (const Problem& full : problems) {
      const double work = double(full.B) * full.H_q * double(visible_pairs(full)) * full.d;
      const bool same = s->verify == "same" || (s->verify == "auto" && work <= kOracleSameShapeMax);
      Case cs;
      cs.p = same ? full
                  : make_problem(full.B, full.H_q, full.H_kv, std::min(full.N_q, kReducedN),
                                 std::min(full.N_k, kReducedN), full.d, f.mask, f.seed, scale);
      cs.mask_spec = f.mask;
      cs.dtype = dtype;
      cs.values = values;
      cs.seed = f.seed;
      cs.opt = opt;
      cases.push_back(cs);
      verify_shape.push_back(same ? "same shape" : "reduced shape " + shape_string(cs.p));
    }
    // The peak of verification and timing under other flags (estimates only: resized copies of
    // the problems, the estimate reads their sizes). cap: --nq and --nk at most cap.
    auto resized = [](const Problem& full, int64_t nq, int64_t nk) {
      Problem q = full;
      q.N_q = nq;
      q.N_k = nk;
      return q;
    };
    auto need_of = [&](const std::string& verify, const std::vector<const Impl*>& ms, int threads, int64_t gemm_n,
                       int64_t cap) {
      MemNeed n;
      for (size_t k = 0; k < problems.size(); ++k) {
        const Problem& full = problems[k];
        const Problem q = resized(full, std::min(full.N_q, cap), std::min(full.N_k, cap));
        const Problem reduced = resized(full, std::min(q.N_q, kReducedN), std::min(q.N_k, kReducedN));
        n = peak_of(n, timing_need(q, dtype, opt, ms, threads, gemm_n));
        Case cs = cases[k];
        auto add = [&](const Problem& v) {
          cs.p = v;
          n = peak_of(n, case_need(cs, ms, threads));
        };
        if (verify == "same") add(q);
        else if (verify == "reduced") add(reduced);
        else if (cap >= std::max(full.N_q, full.N_k)) add(cases[k].p);  // auto, as decided above
        else { add(q); add(reduced); }                                  // auto on a smaller shape: either
      }
      return n;
    };
    const MemAvailable avail = memory_available();
    const int64_t no_cap = std::numeric_limits<int64_t>::max();
    require_memory(need_of(s->verify, impls, all_threads, s->gemm_n, no_cap), avail, [&] {
      // Alternatives with bench's own flags, fewest changes first; only those that fit (with
      // headroom) are named.
      const int64_t budget = advice_budget(avail);
      std::vector<std::string> verifies = {s->verify};
      if (s->verify != "reduced") verifies.push_back("reduced");
      std::vector<std::vector<const Impl*>> impl_sets = {impls};
      if (impls.size() > 1)
        for (const Impl* m : impls) impl_sets.push_back({m});
      std::vector<int> thread_counts = {all_threads};
      if (all_threads > 1) thread_counts.push_back(1);
      std::vector<int64_t> gemm_sizes = {s->gemm_n};
      if (s->gemm_n > 1024) gemm_sizes.push_back(1024);
      struct Way {
        int changed;  // bits: 1 verify, 2 impl, 4 threads, 8 gemm-n
        size_t impl;
        std::string flags;
      };
      std::vector<Way> found;
      for (size_t v = 0; v < verifies.size(); ++v)
        for (size_t i = 0; i < impl_sets.size(); ++i)
          for (size_t t = 0; t < thread_counts.size(); ++t)
            for (size_t g = 0; g < gemm_sizes.size(); ++g) {
              const int changed = (v > 0) | (i > 0) << 1 | (t > 0) << 2 | (g > 0) << 3;
              if (changed == 0 ||
                  need_of(verifies[v], impl_sets[i], thread_counts[t], gemm_sizes[g], no_cap).bytes > budget)
                continue;
              std::string flags;
              auto add = [&](bool on, const std::string& flag) {
                if (on) flags += (flags.empty() ? "" : " ") + flag;
              };
              add(v > 0, "--verify reduced");
              add(i > 0, i > 0 ? "--impl " + impl_sets[i][0]->name : "");
              add(t > 0, "--threads 1");
              add(g > 0, "--gemm-n 1024");
              found.push_back({changed, i, flags});
            }
      std::stable_sort(found.begin(), found.end(), [](const Way& x, const Way& y) {
        return __builtin_popcount(x.changed) < __builtin_popcount(y.changed);
      });
      std::vector<std::string> ways;
      std::vector<Way> named;
      for (const Way& w : found) {
        bool covered = false;  // it adds flags to a way already named: nothing new
        for (const Way& o : named)
          covered = covered || ((o.changed & w.changed) == o.changed && (!(o.changed & 2) || o.impl == w.impl));
        if (covered || named.size() == 3) continue;
        named.push_back(w);
        ways.push_back(w.flags);
      }
      int64_t N_max = 0;
      for (const Problem& full : problems) N_max = std::max({N_max, full.N_q, full.N_k});
      const int64_t n = largest_fitting_length(N_max, N_max, [&](int64_t c, int64_t) {
        return need_of(s->verify, impls, all_threads, s->gemm_n, c).bytes <= budget;
      });
      if (n > 0) ways.push_back("--nq " + std::to_string(n) + " --nk " + std::to_string(n) + " (at most)");
      const std::string out = fits_with(ways);
      return out.empty() ? "use fewer heads or a smaller batch (--hq, --hkv, -B) or -d" : out;
    });
    for (size_t k = 0; k < problems.size(); ++k) {  // a GPU layer's device memory, on the timed shapes
      Case timed = cases[k];
      timed.p = problems[k];
      require_device_memory(timed, impls, all_threads);
    }

    // ---- verify before timing (all threads, the same tiles as timed)
    apply_threads(all_threads);
    std::vector<Result> checked;
    Progress progress(static_cast<int>(problems.size() + thread_settings.size()));
    if (!verified(cases, impls, r, {{"command", "bench"}}, progress, checked)) return kExitFail;

    // ---- time
    std::vector<std::vector<Cell>> rows;       // the table's rows below the SGEMM's
    std::vector<std::pair<int, double>> gemm;  // (threads, GFLOP/s)
    Json memory = Json::array();
    std::vector<std::string> memory_lines;
    const bool counting = heap_counting();
    for (int threads : thread_settings) {
      apply_threads(threads);
      progress.step("time SGEMM " + std::to_string(s->gemm_n) + "^3 and " + std::to_string(problems.size()) +
                    " problem(s), threads=" + std::to_string(threads));
      const double g = sgemm_gflops(s->gemm_n, s->reps);
      gemm.push_back({threads, g});
      for (const Problem& p : problems) {
        const Inputs in = make_inputs(p, Layout::BHSD, dtype, f.seed, values);
        double ref_rate[2] = {NAN, NAN};
        for (const Impl* m : impls) {
          Runner run = m->prepare(p, in, opt);
          run.forward();  // warm-up
          const double fwd_ms = best_of(run.forward, s->reps);
          if (m->name == "cpu" && counting) {
            heap_reset_peak();
            const int64_t base = heap_live();
            run.forward();
            const int64_t extra = heap_peak() - base;
            const double nd = double(p.B) * p.H_q * p.N_q * p.d * sizeof(float);
            const double nn = double(p.N_q) * p.N_k * sizeof(float);
            memory.push_back({{"impl", m->name}, {"d", p.d}, {"threads", threads}, {"peak_extra_bytes", extra},
                              {"q_tensor_bytes", nd}, {"one_nxn_fp32_bytes", nn}});
            memory_lines.push_back(format(
                "cpu forward peak extra heap, d=%lld threads=%d: %.1f KiB = %.3f x the Q tensor (%.1f KiB); "
                "one N_q x N_k fp32 buffer would be %.1f KiB",
                static_cast<long long>(p.d), threads, extra / 1024.0, extra / nd, nd / 1024.0, nn / 1024.0));
          }
          run.backward();  // warm-up
          const double bwd_ms = best_of(run.backward, s->reps);
          const double rates[2] = {forward_flops(p) / (fwd_ms * 1e-3) / 1e9,
                                   backward_flops(p) / (bwd_ms * 1e-3) / 1e9};
          for (int k = 0; k < 2; ++k) {
            const double vs_gemm = rates[k] / g;
            if (m->name == "reference") ref_rate[k] = rates[k];
            const double vs_ref = rates[k] / ref_rate[k];  // NaN until reference ran (list it first)
            std::string goal, met;                          // the cpu layer's, on one thread
            if (m->name == "cpu" && threads == 1 && k == 0) {
              goal = format(">=%.2gx ref, >=%.2gx SGEMM", kFwdVsRef, kFwdVsGemm);
              const bool ok = vs_ref >= kFwdVsRef && vs_gemm >= kFwdVsGemm;
              met = std::isnan(vs_ref) ? "n/a (no reference)" : ok ? "met" : "NOT met";
            } else if (m->name == "cpu" && threads == 1) {
              goal = format(">=%.2gx SGEMM", kBwdVsGemm);
              met = vs_gemm >= kBwdVsGemm ? "met" : "NOT met";
            }
            rows.push_back({integer(p.d), integer(threads), text(m->name), text(k ? "bwd" : "fwd"),
                            number(k ? bwd_ms : fwd_ms, "%.2f"), number(rates[k], "%.2f"),
                            std::isnan(vs_ref) ? missing() : number(vs_ref, "%.2f"), number(vs_gemm, "%.2f"),
                            goal.empty() ? missing() : text(goal), met.empty() ? missing() : text(met)});
          }
        }
      }
    }
    progress.done();

    // ---- print
    Table vt = result_table(checked, false, false);
    Table t;
    t.columns = {{"d", "d", false},          {"threads", "threads", false}, {"impl", "impl", true},
                 {"pass", "pass", true},     {"time_ms", "best(ms)", false}, {"gflops", "GFLOP/s", false},
                 {"vs_reference", "x ref", false}, {"vs_sgemm", "x SGEMM", false}, {"goal", "goal (1 thread)", true},
                 {"met", "status", true}};
    for (const auto& [threads, g] : gemm)
      t.add({missing(), integer(threads), text(format("eigen-sgemm %lld^3", static_cast<long long>(s->gemm_n))),
             text("gemm"), missing(), number(g, "%.2f"), missing(), number(1.0, "%.2f"), text(""), text("")});
    for (std::vector<Cell>& row : rows) t.add(std::move(row));
    if (r.json) {
      Json j = {{"command", "bench"}, {"dtype", to_string(dtype)}, {"reps", s->reps}, {"verified", true}};
      j["problems"] = Json::array();
      for (const Problem& p : problems) j["problems"].push_back(shape_string(p) + " mask=" + describe(p.mask));
      j["verify_shape"] = verify_shape;
      j["verify"] = Json::array();
      for (const Result& x : checked) j["verify"].push_back(result_json(x));
      j["sgemm"] = Json::array();
      for (const auto& [threads, g] : gemm) j["sgemm"].push_back({{"threads", threads}, {"n", s->gemm_n}, {"gflops", g}});
      j["rows"] = t.json();
      j["memory"] = memory;
      std::printf("%s\n", j.dump(2).c_str());
      return kExitPass;
    }
    std::printf("burstlab bench: %s, mask=%s, values=%s, best of %d after one warm-up\n", to_string(dtype).c_str(),
                describe(problems[0].mask).c_str(), to_string(values).c_str(), s->reps);
    for (size_t k = 0; k < problems.size(); ++k)
      std::printf("  problem %s: verified against the fp64 oracle on the %s\n", shape_string(problems[k]).c_str(),
                  verify_shape[k].c_str());
    vt.print(stdout);
    std::printf("\n");
    t.print(stdout);
    std::printf("\n");
    if (!counting) std::printf("peak extra heap: not measured (malloc interposition not in effect)\n");
    for (const auto& l : memory_lines) std::printf("%s\n", l.c_str());
    return kExitPass;
  }};
}

}  // namespace burstlab::tools
