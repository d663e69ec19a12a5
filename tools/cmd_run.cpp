// tools/cmd_run.cpp — `burstlab run`: one problem, chosen implementations, checked against the
// fp64 oracle (spec §9) and timed. Verify before you time: every row carries its correctness
// columns, and any failing row makes the exit code non-zero.
#include <memory>

#include "burstlab/error.hpp"
#include "common.hpp"

namespace burstlab::tools {

Command add_run_command(CLI::App& app, RunHooks& hooks) {
  struct State {
    ShapeFlags shape;
    RunFlags run;
    int repeat = 1;
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
  sub->add_option("--repeat", s->repeat, "timed runs per pass; the best is reported")->capture_default_str();
  add_json_flag(sub, s->run);
  sub->add_flag("-v,--verbose", s->run.verbose, "also print one row per tensor (O, LSE, dQ, dK, dV)");
  sub->footer(
      "Every output element is compared with the fp64 oracle under its derived bound (spec §9):\n"
      "err/bound <= 1 everywhere means PASS. One row per impl x pass, its numbers the worst over\n"
      "its tensors (-v: one row per tensor too). Exit 0 only when every row passes; 1 on a failed\n"
      "check; 2 on bad input (nothing printed on stdout).\n\n"
      "Examples:\n"
      "  burstlab run                                   reference and cpu, fp32, GQA 4/2, 113 x 203\n"
      "  burstlab run --impl cpu --dtype fp64 --mask causal --nq 1023 --nk 1023 -d 128\n"
      "  burstlab run --mask causal+document:3+block:64x64@0.5 --values large --pass bwd -v\n"
      "  burstlab run --impl cpu --br 17 --bc 33 --threads 1 --repeat 5 --json\n"
      "Mask grammar: parts joined by '+': none | causal | window:L,R | document[:n] |\n"
      "block[:BQxBK[@density]]. Rows: one per impl x pass, numbers = worst over its tensors.");

  Command c;
  c.app = sub;
  c.run = [s, &hooks]() -> int {
    const ShapeFlags& f = s->shape;
    const RunFlags& r = s->run;
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
    if (r.Br < 0) fail("br (", r.Br, ") must be >= 1, or 0 for the implementation's default");
    if (r.Bc < 0) fail("bc (", r.Bc, ") must be >= 1, or 0 for the implementation's default");
    cs.opt.Br = r.Br;
    cs.opt.Bc = r.Bc;
    if (s->repeat < 1) fail("repeat (", s->repeat, ") must be >= 1");
    apply_threads(r.threads);
    std::vector<const Impl*> impls = find_impls(r.impl);
    std::vector<Impl> wrapped;  // owns what hooks.wrap_impls made (distributed schedules)
    if (hooks.wrap_impls) {
      wrapped = hooks.wrap_impls(impls);
      impls.clear();
      for (const Impl& m : wrapped) impls.push_back(&m);
    }
    for (const Impl* m : impls) check_impl(*m, p, cs.dtype, cs.opt, cs.pass.bwd);

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
    if (!r.json)
      std::printf("burstlab run: %s mask=%s dtype=%s layout=%s values=%s seed=%llu threads=%d repeat=%d\n",
                  shape_string(p).c_str(), describe(p.mask).c_str(), to_string(cs.dtype).c_str(),
                  to_string(cs.layout).c_str(), to_string(cs.values).c_str(),
                  static_cast<unsigned long long>(f.seed), max_threads(), s->repeat);
    const bool extra_ok = hooks.after_run ? hooks.after_run(header, r.json) : true;  // distributed/
    const int rc = report(rs, r, false, header);
    return extra_ok ? rc : kExitFail;
  };
  return c;
}

}  // namespace burstlab::tools
