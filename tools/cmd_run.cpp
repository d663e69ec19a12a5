// tools/cmd_run.cpp — `burstlab run`: one problem, chosen implementations, checked against the
// fp64 oracle (spec §9) and timed. Verify before you time: every row carries its correctness
// columns, and any failing row makes the exit code non-zero.
#include <algorithm>
#include <memory>

#include "burstlab/error.hpp"
#include "cmd_lmhead.hpp"
#include "common.hpp"
#include "distributed.hpp"  // --algo: down into the schedules
#include "resources.hpp"

namespace burstlab::tools {
namespace {

// What to do instead when the case does not fit: each alternative is estimated, and only those
// that fit are named, with `run`'s own flags.
std::string run_advice(const Case& cs, const std::vector<const Impl*>& impls, int threads, const MemAvailable& avail) {
  const int64_t budget = advice_budget(avail);  // every suggestion keeps headroom
  auto fits = [&](const Case& c, int t) { return case_need(c, impls, t).bytes <= budget; };
  std::vector<std::string> ways;
  if (threads > 1 && fits(cs, 1)) ways.push_back("--threads 1");
  auto names = [](const std::vector<const Impl*>& ms) {
    std::string n;
    for (const Impl* m : ms) n += (n.empty() ? "" : ",") + m->name;
    return n;
  };
  // The implementations that fit on their own next to the oracle of case c.
  auto fitting = [&](const Case& c) {
    std::vector<const Impl*> keep;
    for (const Impl* m : impls)
      if (case_need(c, {m}, threads).bytes <= budget) keep.push_back(m);
    return keep;
  };
  if (cs.check_rows == 0) {  // the row-sampled oracle instead of the full one (spec §9.11)
    Case sampled = cs;
    sampled.check_rows = 64;
    const std::vector<const Impl*> keep = fitting(sampled);
    if (keep.size() == impls.size()) ways.push_back("--check-rows 64");
    else if (!keep.empty()) ways.push_back("--check-rows 64 --impl " + names(keep));
  } else {
    const std::vector<const Impl*> keep = fitting(cs);
    if (!keep.empty() && keep.size() < impls.size()) ways.push_back("--impl " + names(keep));
  }
  Case fwd_only = cs;
  fwd_only.pass = parse_pass("fwd");
  if (cs.pass.bwd) {
    if (fits(fwd_only, threads)) ways.push_back("--pass fwd");
    else if (threads > 1 && fits(fwd_only, 1)) ways.push_back("--pass fwd --threads 1");
  }
  const int64_t n = largest_fitting_length(cs.p.N_q, cs.p.N_k, [&](int64_t nq, int64_t nk) {
    Case c = cs;
    c.p.N_q = nq;  // the estimate reads the lengths; the mask arrays keep their (larger) size
    c.p.N_k = nk;
    return fits(c, threads);
  });
  if (n > 0) {
    std::string lens;
    if (n < cs.p.N_q) lens += "--nq " + std::to_string(n);
    if (n < cs.p.N_k) lens += std::string(lens.empty() ? "" : " ") + "--nk " + std::to_string(n);
    ways.push_back(lens);
  }
  std::string s = fits_with(ways);
  if (ways.empty()) s = "it does not fit even with --nq 1 --nk 1: use fewer heads or a smaller batch (--hq, --hkv, -B) or -d";
  const bool oracle = case_need(cs, {}, threads).bytes >= case_need(cs, impls, threads).bytes;
  if (oracle && cs.check_rows == 0) s += " (the fp64 oracle checks every --impl, so it runs whatever --impl is)";
  return s;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  struct State {
    ShapeFlags shape;
    RunFlags run;
    int repeat = 1;
    LmHeadFlags lm;  // --op lmhead-ce (cmd_lmhead.hpp)
  };
  auto s = std::make_shared<State>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "Run implementations on one seeded problem, check them against the fp64 oracle, time them");
  add_shape_flags(sub, s->shape, false);
  add_dtype_flag(sub, s->run);
  add_layout_flag(sub, s->run);
  add_values_flag(sub, s->run);
  add_impl_flag(sub, s->run);
  add_pass_flag(sub, s->run);
  add_tile_flags(sub, s->run);
  add_threads_flag(sub, s->run);
  int_range(sub->add_option("--repeat", s->repeat, "timed runs per pass; the best is reported")->capture_default_str(),
            "repeat", 1, kMaxRepeat);
  int_range(sub->add_option("--check-rows", s->run.check_rows,
                            "check K sampled query rows (O, LSE, dQ) and K key columns (dK, dV) with the row-sampled "
                            "fp64 oracle (spec §9.11) instead of the full one (0): no N_q x N_k buffer, for huge N")
                ->capture_default_str(),
            "check-rows", 0, kMaxExtent, ">= 1, or 0 for the full oracle");
  add_json_flag(sub, s->run);
  sub->add_flag("-v,--verbose", s->run.verbose, "also print one row per tensor (O, LSE, dQ, dK, dV)");
  add_lmhead_flags(sub, s->lm);
  const std::shared_ptr<DistRun> dist = add_distributed_flags(*sub);  // last: see distributed.hpp
  sub->footer(
      "Every output element is compared with the fp64 oracle under its derived bound (spec §9):\n"
      "err/bound <= 1 everywhere means PASS. One row per impl x pass, its numbers the worst over\n"
      "its tensors (-v: one row per tensor too). Exit 0 only when every row passes; 1 on a failed\n"
      "check; 2 on bad input (nothing printed on stdout), or when the problem would not fit in\n"
      "memory: the bytes of the inputs, of the fp64 oracle (N_q x N_k fp64 per (b, h) and thread)\n"
      "and of each impl are estimated first and compared with MemAvailable (or the cgroup limit, or\n"
      "`ulimit -v` less what is mapped, or BURSTLAB_MEMORY_AVAILABLE=<bytes>; under mpirun the host's\n"
      "memory is shared by its processes); the message says which flags make it fit. Also 2: a\n"
      "--scale whose logits overflow fp64 (spec §1.4), refused before computing with the largest\n"
      "|scale| allowed.\n"
      "--check-rows K replaces the full oracle by the row-sampled one (spec §9.11): K rows (b, h, i) get\n"
      "O, LSE, dQ exactly from the inputs; K key columns get dK, dV from the inputs and the run's own\n"
      "LSE and O (a check of the backward given the forward). No N_q x N_k buffer: N = 200K runs.\n\n"
      "Examples:\n"
      "  burstlab run                                   reference and cpu, fp32, GQA 4/2, 113 x 203\n"
      "  burstlab run --impl cpu --dtype fp64 --mask causal --nq 1023 --nk 1023 -d 128\n"
      "  burstlab run --mask causal+document:3+block:64x64@0.5 --values large --pass bwd -v\n"
      "  burstlab run --impl cpu --br 17 --bc 33 --threads 1 --repeat 5 --json\n"
      "  burstlab run --impl cpu --hq 1 --hkv 1 -d 16 --nq 200000 --nk 200000 --mask causal --check-rows 64\n"
      "  burstlab run --impl cpu --algo ring,burst --single --world 4 --partition zigzag --mask causal\n"
      "  burstlab run --impl cuda --algo burst --transport nccl --world 2 --dtype bf16 --mask causal --partition zigzag\n"
      "  mpirun -np 2 burstlab run --impl cuda --algo ring,burst --transport nccl --single --dtype bf16 --repeat 5\n"
      "  burstlab run --op lmhead-ce --vocab 32000 --nq 512 -d 256 --label-smoothing 0.1 --dtype bf16 --impl cpu\n"
      "Mask grammar: parts joined by '+': none | causal | window:L,R | document[:n] |\n"
      "block[:BQxBK[@density]]. Rows: one per impl x pass, numbers = worst over its tensors.\n"
      "--op lmhead-ce: the fused LM head + cross-entropy (spec §10): N = B x nq rows, -d hidden size,\n"
      "--vocab V; rows fwd (L, LSE), bwd (dH, dW), fused (one call); --pass both = all three.");

  return {sub, [s, sub, dist]() -> int {
    const ShapeFlags& f = s->shape;
    const RunFlags& r = s->run;
    if (lmhead_selected(sub, s->lm)) return run_lmhead(f, r, s->lm, s->repeat);
    // Validate everything before printing anything.
    const double* scale = *f.scale_opt ? &f.scale : nullptr;
    const Problem p = make_problem(f.B, f.H_q, f.H_kv, f.N_q, f.N_k, f.d.at(0), f.mask, f.seed, scale);
    Case cs;
    cs.p = p;
    cs.mask_spec = f.mask;
    cs.dtype = parse_dtype(r.dtype);
    cs.layout = parse_layout(r.layout);
    cs.values = parse_values(r.values);
    cs.seed = f.seed;
    cs.pass = parse_pass(r.pass);
    cs.opt.Br = r.Br;
    cs.opt.Bc = r.Bc;
    cs.check_rows = r.check_rows;
    apply_threads(r.threads);
    std::vector<const Impl*> impls = find_impls(r.impl);
    const std::vector<Impl> wrapped = distributed_impls(dist, impls);  // owns the --algo implementations
    impls.clear();
    for (const Impl& m : wrapped) impls.push_back(&m);
    for (const Impl* m : impls) check_impl(*m, p, cs.dtype, cs.opt, cs.pass.bwd);
    // Refuse what does not fit before allocating anything (resources.hpp).
    const int threads = max_threads();
    const MemAvailable avail = memory_available();
    require_memory(case_need(cs, impls, threads), avail, [&] { return run_advice(cs, impls, threads, avail); });
    require_device_memory(cs, impls, threads);

    const std::vector<Result> rs = run_case(cs, impls, s->repeat);
    Json header = Json::object();
    header["command"] = "run";
    header["shape"] = shape_string(p);
    header["mask"] = describe(p.mask);
    header["mask_spec"] = f.mask;
    header["dtype"] = to_string(cs.dtype);
    header["layout"] = to_string(cs.layout);
    header["values"] = to_string(cs.values);
    header["seed"] = f.seed;
    header["threads"] = max_threads();
    header["repeat"] = s->repeat;
    // The sampled check's population: rows (b, h, i) and columns (b, kv-head, j).
    const int64_t all_rows = p.B * p.H_q * p.N_q, all_cols = p.B * p.H_kv * p.N_k;
    const int64_t n_rows = std::min(cs.check_rows, all_rows), n_cols = std::min(cs.check_rows, all_cols);
    Json check = Json::object();
    check["oracle"] = cs.check_rows > 0 ? "sampled" : "full";
    if (cs.check_rows > 0) {
      check["rows"] = n_rows;
      check["rows_of"] = all_rows;
      check["columns"] = cs.pass.bwd ? n_cols : 0;
      check["columns_of"] = all_cols;
    }
    header["check"] = check;
    if (!r.json) {
      std::printf("burstlab run: %s mask=%s dtype=%s layout=%s values=%s seed=%llu threads=%d repeat=%d\n",
                  shape_string(p).c_str(), describe(p.mask).c_str(), to_string(cs.dtype).c_str(),
                  to_string(cs.layout).c_str(), to_string(cs.values).c_str(),
                  static_cast<unsigned long long>(f.seed), max_threads(), s->repeat);
      if (cs.check_rows > 0)
        std::printf("check (spec §9.11): rows sampled: %lld of %lld (B H_q N_q = %lld x %lld x %lld), columns: %lld of "
                    "%lld (B H_kv N_k)%s\n",
                    static_cast<long long>(n_rows), static_cast<long long>(all_rows), static_cast<long long>(p.B),
                    static_cast<long long>(p.H_q), static_cast<long long>(p.N_q),
                    static_cast<long long>(cs.pass.bwd ? n_cols : 0), static_cast<long long>(all_cols),
                    cs.pass.bwd ? "; dK, dV from the run's own LSE and O" : "");
    }
    const bool extra_ok = distributed_report(*dist, header, r.json, rs);
    const int rc = report(rs, r, false, header);
    return extra_ok ? rc : kExitFail;
  }};
}

}  // namespace burstlab::tools
