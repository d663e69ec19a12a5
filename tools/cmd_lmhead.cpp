// tools/cmd_lmhead.cpp — see cmd_lmhead.hpp. The LM head's implementations are entries of the
// one registry (impls.hpp, impls_lmhead.cpp) with op = lmhead-ce; a run is a Case checked by
// run_case and printed by report, as attention's.
#include "cmd_lmhead.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "burstlab/error.hpp"
#include "burstlab/lmhead.hpp"
#include "memcount.hpp"
#include "resources.hpp"

namespace burstlab::tools {
namespace {

LmHeadProblem make_lmhead_problem(const ShapeFlags& s, int64_t d, const LmHeadFlags& f) {
  if (s.B < 1) fail("B (", s.B, ") must be >= 1");
  if (s.N_q < 1) fail("nq (", s.N_q, ") must be >= 1");
  LmHeadProblem p;
  if (__builtin_mul_overflow(s.B, s.N_q, &p.N)) fail("N = B x nq (", s.B, " x ", s.N_q, ") overflows int64");
  p.d = d;
  if (f.V < 1) fail("vocab (", f.V, ") must be >= 1: --op lmhead-ce needs --vocab V");
  p.V = f.V;
  p.ignore_index = f.ignore_index;
  p.label_smoothing = f.eps;
  p.z_loss = f.z_loss;
  p.reduction = parse_reduction(f.reduction);
  validate(p);
  return p;
}


// The case of `run` and `bench` for one -d, every flag validated (nothing printed yet).
Case lmhead_case(const ShapeFlags& s, int64_t d, const RunFlags& r, const LmHeadFlags& f, const std::string& pass) {
  Case c;
  c.op = Operator::LmHeadCe;
  c.lm = make_lmhead_problem(s, d, f);
  c.dtype = parse_dtype(r.dtype);
  c.values = parse_values(r.values);
  if (c.values == Values::WideV) fail("values (widev) does not apply to --op lmhead-ce; use normal, large or ties");
  c.seed = s.seed;
  c.ignored = f.ignored;
  c.pass = parse_pass(pass, Operator::LmHeadCe);
  c.opt.Br = r.Br;
  c.opt.Bv = f.Bv;
  return c;
}

}  // namespace

void add_lmhead_flags(CLI::App* sub, LmHeadFlags& f) {
  sub->add_option("--op", f.op, "operator: attention | lmhead-ce (the fused LM head + cross-entropy, spec §10)")
      ->capture_default_str();
  int_range(sub->add_option("--vocab", f.V, "lmhead-ce: vocabulary size V (required); rows N = B x nq, hidden size -d"),
            "vocab", 1, kMaxExtent);
  int_flag(sub, "--ignore-index", f.ignore_index, "lmhead-ce: the label of rows that do not count", "ignore-index",
           std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  real_range(sub->add_option("--ignore-fraction", f.ignored, "lmhead-ce: fraction of rows labelled ignore-index (seeded)")
                 ->capture_default_str(),
             "ignore-fraction", 0, 1);
  // The names validate(LmHeadProblem) uses for these fields.
  real_range(sub->add_option("--label-smoothing", f.eps, "lmhead-ce: label smoothing eps in [0, 1]")->capture_default_str(),
             "label_smoothing", 0, 1);
  real_range(sub->add_option("--z-loss", f.z_loss, "lmhead-ce: z-loss weight lambda >= 0")->capture_default_str(),
             "z_loss", 0, std::numeric_limits<double>::max());
  sub->add_option("--reduction", f.reduction, "lmhead-ce: mean | sum")->capture_default_str();
  int_flag(sub, "--bv", f.Bv, "lmhead-ce: vocabulary entries per tile Bv (0 = the implementation's default)", "bv", 0,
           kMaxExtent, ">= 1, or 0 for the implementation's default");
}

bool lmhead_selected(const CLI::App* sub, const LmHeadFlags& f) {
  const bool lm = parse_operator(f.op) == Operator::LmHeadCe;
  static const std::set<std::string> lm_only = {"--vocab", "--ignore-index", "--ignore-fraction", "--label-smoothing",
                                                "--z-loss", "--reduction", "--bv"};
  static const std::set<std::string> shared = {"--batch", "--nq",      "--head-dim", "--seed",   "--dtype",
                                               "--values", "--impl",   "--pass",     "--br",     "--threads",
                                               "--repeat", "--reps",   "--verify",   "--json",   "--verbose",
                                               "--help",   "--op"};
  for (const CLI::Option* o : sub->get_options()) {
    if (o->count() == 0) continue;
    const std::string n = o->get_name();
    if (lm && !shared.count(n) && !lm_only.count(n))
      fail(n, " does not apply to --op lmhead-ce (its shape: N = B x nq rows, hidden size -d, --vocab V)");
    if (!lm && lm_only.count(n)) fail(n, " applies to --op lmhead-ce only");
  }
  return lm;
}

namespace {
// "it fits with --nq X" (and --pass fwd), or what else to shrink.
std::string lmhead_advice(const ShapeFlags& s, const LmHeadProblem& p,
                          const std::function<bool(const LmHeadProblem&, bool backward)>& fits, bool backward) {
  std::vector<std::string> ways;
  if (backward && fits(p, false)) ways.push_back("--pass fwd");
  const int64_t n = largest_fitting_length(s.N_q, s.N_q, [&](int64_t nq, int64_t) {
    LmHeadProblem q = p;
    q.N = s.B * nq;
    return fits(q, backward);
  });
  if (n > 0 && n < s.N_q) ways.push_back("--nq " + std::to_string(n));
  const std::string out = fits_with(ways);
  return out.empty() ? "use a smaller --vocab or -d" : out + " (the fp64 oracle holds N x V fp64 logits)";
}
}  // namespace

int run_lmhead(const ShapeFlags& s, const RunFlags& r, const LmHeadFlags& f, int repeat) {
  // Validate everything before printing anything.
  const Case c = lmhead_case(s, s.d.at(0), r, f, r.pass);
  const LmHeadProblem& p = c.lm;
  const cpu::LmHeadTiles tiles = lmhead_tiles(c.opt);
  apply_threads(r.threads);
  const std::vector<const Impl*> impls = find_impls(r.impl, Operator::LmHeadCe);
  for (const Impl* m : impls) check_impl(*m, p, c.dtype);
  const int threads = max_threads();
  const MemAvailable avail = memory_available();
  auto fits = [&](const LmHeadProblem& q, bool bwd) {  // for the advice: with headroom
    Case x = c;
    x.lm = q;
    x.pass = bwd ? c.pass : parse_pass("fwd", Operator::LmHeadCe);
    return case_need(x, impls, threads).bytes <= advice_budget(avail);
  };
  require_memory(case_need(c, impls, threads), avail, [&] { return lmhead_advice(s, p, fits, c.pass.backward()); });

  const std::vector<Result> rs = run_case(c, impls, repeat);
  const Json header = {{"command", "run"}, {"op", "lmhead-ce"},   {"shape", shape_string(p)},
                       {"dtype", to_string(c.dtype)}, {"values", to_string(c.values)}, {"ignore_fraction", f.ignored},
                       {"seed", s.seed},     {"threads", threads},  {"repeat", repeat},
                       {"Br", tiles.Br},     {"Bv", tiles.Bv}};
  if (!r.json)
    std::printf("burstlab run --op lmhead-ce: %s dtype=%s values=%s ignore-fraction=%g seed=%llu threads=%d "
                "repeat=%d Br=%lld Bv=%lld (cpu tiles)\n",
                shape_string(p).c_str(), to_string(c.dtype).c_str(), to_string(c.values).c_str(), f.ignored,
                static_cast<unsigned long long>(s.seed), threads, repeat, static_cast<long long>(tiles.Br),
                static_cast<long long>(tiles.Bv));
  return report(rs, r, false, header);
}

int bench_lmhead(const ShapeFlags& s, const RunFlags& r, const LmHeadFlags& f, int reps, const std::string& verify) {
  // ---- validate everything first
  if (s.d.empty()) fail("d (none) needs at least one value");
  std::vector<Case> cases;  // the timed problems; verified on the forward and the fused call
  for (int64_t d : s.d) cases.push_back(lmhead_case(s, d, r, f, "fwd"));
  const Dtype dtype = cases[0].dtype;
  const Values values = cases[0].values;
  const cpu::LmHeadTiles tiles = lmhead_tiles(cases[0].opt);
  if (verify != "auto" && verify != "same" && verify != "reduced")
    fail("verify (", verify, ") must be auto, same or reduced");
  const std::vector<const Impl*> impls = find_impls(r.impl, Operator::LmHeadCe);
  for (const Impl* m : impls)
    for (const Case& c : cases) check_impl(*m, c.lm, dtype);
  const int threads = r.threads > 0 ? r.threads : max_threads();
  apply_threads(threads);

  // The fp64 oracle on the timed shape when N V d <= 2^30 (seconds on 2 cores); above, on the first
  // 256 rows' worth of N (same V and d: the vocabulary tiling is what the check is about).
  constexpr double kSameShapeMax = double(1 << 30);
  constexpr int64_t kReducedN = 256;
  std::vector<Case> checks;
  std::vector<std::string> check_shape;
  for (const Case& c : cases) {
    const LmHeadProblem& p = c.lm;
    const bool same = verify == "same" || (verify == "auto" && double(p.N) * double(p.V) * double(p.d) <= kSameShapeMax);
    Case q = c;
    q.pass = {true, false, true};
    if (!same) q.lm.N = std::min(p.N, kReducedN);
    checks.push_back(q);
    check_shape.push_back(same ? "the timed shape" : "N reduced to " + std::to_string(q.lm.N));
  }
  const MemAvailable avail = memory_available();
  auto need = [&](const Case& timed, const Case& checked) {
    Case x = checked;
    x.pass = {false, false, true};
    MemNeed n = case_need(x, impls, threads);
    for (const Impl* m : impls) {
      std::vector<MemPart> parts = m->lmhead.footprint(timed.lm, dtype, timed.opt, threads);
      parts.push_back({"inputs H, W in fp64", bytes_mul(8, bytes_mul(timed.lm.N + timed.lm.V, timed.lm.d))});
      n = peak_of(n, make_need("timing impl " + m->name + " (" + to_string(dtype) + ")", parts));
    }
    return n;
  };
  MemNeed total;
  for (size_t k = 0; k < cases.size(); ++k) total = peak_of(total, need(cases[k], checks[k]));
  require_memory(total, avail, [&] {
    auto fits = [&](const LmHeadProblem& q, bool) {
      Case t = cases[0], c = cases[0];
      t.lm = c.lm = q;
      if (c.lm.N > kReducedN && verify != "same") c.lm.N = kReducedN;
      return need(t, c).bytes <= advice_budget(avail);
    };
    return lmhead_advice(s, cases.front().lm, fits, false);
  });

  // ---- verify before timing: the forward and the fused call, as timed
  std::vector<Result> checked;
  Progress progress(static_cast<int>(2 * cases.size()));
  if (!verified(checks, impls, r, {{"command", "bench"}, {"op", "lmhead-ce"}}, progress, checked)) return kExitFail;

  // ---- time, and count the heap of the timed calls: one row per (d, impl, fwd | fused)
  Table t;
  t.columns = {{"d", "d", false},          {"impl", "impl", true},           {"pass", "pass", true},
               {"time_ms", "best(ms)", false}, {"gflops", "GFLOP/s", false},  {"peak_extra_heap_mib", "peak heap(MiB)", false},
               {"speedup_vs_reference", "x ref speed", false}, {"heap_vs_reference", "x ref heap", false},
               {"device_extra_mib", "device peak(MiB)", false}, {"device_model_mib", "device model(MiB)", false}};
  // Bytes in MiB; a negative count (not measured) is '-', as is a NaN ratio (no reference row yet).
  const auto mib = [](int64_t b) { return b < 0 ? missing() : number(double(b) / 1048576.0, "%.1f"); };
  const auto ratio = [](double x, const char* fmt) { return std::isnan(x) ? missing() : number(x, fmt); };
  const bool counting = heap_counting();
  for (const Case& c : cases) {
    const LmHeadProblem& p = c.lm;
    progress.step("time " + shape_string(p));
    const LmHeadInputs in = make_lmhead_inputs(p, dtype, s.seed, values, f.ignored);
    double ref_ms[2] = {NAN, NAN}, ref_extra[2] = {NAN, NAN};
    for (const Impl* m : impls) {
      const Runner run = m->lmhead.prepare(p, in, 1.0, c.opt);
      for (int k = 0; k < 2; ++k) {
        const std::function<double()>& call = k == 0 ? run.forward : run.fused;
        if (reps > 1) call();  // warm-up
        double best = std::numeric_limits<double>::infinity();
        int64_t extra = -1, device = -1;  // peak extra heap, measured device workspace peak (a GPU layer)
        for (int rep = 0; rep < reps; ++rep) {
          heap_reset_peak();
          const int64_t base = heap_live();
          best = std::min(best, call());
          if (counting) extra = std::max(extra, heap_peak() - base);
          if (run.device_peak) device = std::max(device, run.device_peak());
        }
        const double flops = k == 0 ? lmhead_forward_flops(p) : lmhead_forward_flops(p) + lmhead_backward_flops(p);
        // What the layer says it allocates (lmhead_workspace_bytes).
        const int64_t model = m->lmhead.device_bytes ? m->lmhead.device_bytes(p, c.opt, k == 1) : -1;
        if (m->name == "reference") {
          ref_ms[k] = best;
          ref_extra[k] = counting ? double(extra) : NAN;
        }
        t.add({integer(p.d), text(m->name), text(k == 0 ? "fwd" : "fused"), number(best, "%.1f"),
               number(flops / (best * 1e-3) / 1e9, "%.2f"), mib(extra), ratio(ref_ms[k] / best, "%.2f"),
               ratio(counting ? double(extra) / ref_extra[k] : NAN, "%.4f"), mib(device), mib(model)});
      }
    }
  }
  progress.done();

  if (r.json) {
    Json j = {{"command", "bench"}, {"op", "lmhead-ce"}, {"dtype", to_string(dtype)}, {"reps", reps},
              {"threads", threads}, {"Br", tiles.Br}, {"Bv", tiles.Bv}, {"verified", true},
              {"heap_counted", counting}};
    j["problems"] = Json::array();
    for (const Case& c : cases) j["problems"].push_back(shape_string(c.lm));
    j["verify_shape"] = check_shape;
    j["verify"] = Json::array();
    for (const Result& x : checked) j["verify"].push_back(result_json(x));
    j["rows"] = t.json();
    std::printf("%s\n", j.dump(2).c_str());
    return kExitPass;
  }
  std::printf("burstlab bench --op lmhead-ce: %s, values=%s, threads=%d, Br=%lld Bv=%lld (cpu tiles), %s\n",
              to_string(dtype).c_str(), to_string(values).c_str(), threads, static_cast<long long>(tiles.Br),
              static_cast<long long>(tiles.Bv),
              reps > 1 ? format("best of %d after one warm-up", reps).c_str() : "one timed run, no warm-up");
  for (size_t k = 0; k < cases.size(); ++k)
    std::printf("  problem %s: verified against the fp64 oracle on %s\n", shape_string(cases[k].lm).c_str(),
                check_shape[k].c_str());
  result_table(checked, false, false).print(stdout);
  std::printf("\n");
  t.print(stdout);
  std::printf("\n");
  if (!counting) std::printf("peak extra heap: not measured (malloc interposition not in effect)\n");
  for (const Case& c : cases)
    std::printf("d=%lld: one N x V fp32 buffer is %.1f MiB; H is %.1f MiB and W %.1f MiB in %s\n",
                static_cast<long long>(c.lm.d), double(c.lm.N) * double(c.lm.V) * 4 / 1048576.0,
                double(c.lm.N) * double(c.lm.d) * double(bytes_of(dtype)) / 1048576.0,
                double(c.lm.V) * double(c.lm.d) * double(bytes_of(dtype)) / 1048576.0, to_string(dtype).c_str());
  return kExitPass;
}

}  // namespace burstlab::tools
