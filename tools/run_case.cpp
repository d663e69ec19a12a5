// tools/run_case.cpp — run_case (common.hpp): a case's inputs and oracle once, then each
// implementation's passes timed and compared with it. One loop for both operators; they differ
// only in the inputs they draw, the oracle they run and how a pass's outputs are compared
// (attention: spec §9, the full or the row-sampled oracle; the LM head: spec §10.8).
#include <algorithm>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>

#include "case.hpp"  // check/: the inputs' values (spec §1.4)
#include "common.hpp"
#include "resources.hpp"
#include "rows.hpp"

namespace burstlab::tools {

double best_of(const std::function<double()>& run, int repeat) {
  double best = std::numeric_limits<double>::infinity();
  for (int k = 0; k < repeat; ++k) best = std::min(best, run());
  return best;
}

std::string case_shape(const Case& c) { return c.op == Operator::Attention ? shape_string(c.p) : shape_string(c.lm); }

namespace {

// One operator's side of a case: its inputs and oracle (made when the Checker is), and per
// implementation the prepared run, the bytes that run holds and the comparison of a pass's outputs.
struct Checker {
  std::function<Runner(const Impl&)> prepare;
  std::function<int64_t(const Impl&)> bytes;
  std::function<std::vector<Metrics>(const Runner&, const std::string& pass)> check;
};

Checker attention_checker(const Case& c, int threads) {
  // Each step names itself for the message of an allocation failure (resources.hpp); the
  // subcommands have checked case_need against the memory available before.
  auto in = std::make_shared<Inputs>();
  {
    Allocating step("generating the inputs Q, K, V, dO in " + to_string(c.dtype),
                    make_need("", inputs_footprint(c.p, c.dtype)).bytes);
    *in = make_inputs(c.p, c.layout, c.dtype, c.seed, c.values);
  }
  // Before computing: logits that overflow fp64 would make the oracle NaN (spec §1.4).
  static const char* const names[4] = {"Q", "K", "V", "dO"};
  check::require_valid_inputs(c.p, *in, c.pass.bwd, "", names, "scale (--scale)");
  // The full oracle, or with check_rows the row-sampled one (spec §9.11): only one is computed.
  const bool sampled = c.check_rows > 0;
  auto want = std::make_shared<Oracle>();
  auto sampled_want = std::make_shared<SampledOracle>();
  if (sampled) {
    Allocating step("running the row-sampled fp64 oracle", sampled_oracle_need(c.p, c.check_rows, c.pass.bwd, threads).bytes);
    *sampled_want = sampled_oracle(c.p, *in, c.check_rows, c.seed, c.pass.bwd);
  } else {
    Allocating step("running the fp64 oracle", oracle_need(c.p, c.pass.bwd, threads).bytes);
    *want = run_oracle(c.p, *in, c.pass.bwd);
    check::require_finite_oracle(c.p, *want, c.pass.bwd, "the fp64 oracle", "scale (--scale)");
  }
  // What the sampled column check reads of the run's forward (spec §9.11), kept for its backward.
  struct Kept {
    bool have = false;
    RunRows run;
  };
  auto kept = std::make_shared<Kept>();
  // The run at the sample: from the implementation's own sampled fetch (a distributed run), or
  // from its global outputs.
  auto sampled_forward = [&c, in](const Runner& run, const Sample& s, bool columns, SampledOutputs& got, RunRows& rr) {
    if (run.fetch_sampled_forward) return run.fetch_sampled_forward(s, columns, got, rr);
    Tensor4<double> O;
    Tensor3<double> LSE;
    run.fetch_forward(O, LSE);
    validate_q_side(c.p, "O", as_const(O.view()));
    validate_rows(c.p, "LSE", as_const(LSE.view()));
    got = sampled_outputs(s, c.p.d, as_const(O.view()), as_const(LSE.view()), {}, {}, {});
    if (columns) rr = run_rows(c.p, in->dO.view(), as_const(O.view()), as_const(LSE.view()), s.columns);
  };
  auto sampled_backward = [&c](const Runner& run, const Sample& s, SampledOutputs& got) {
    if (run.fetch_sampled_backward) return run.fetch_sampled_backward(s, got);
    Tensor4<double> dQ, dK, dV;
    run.fetch_backward(dQ, dK, dV);
    validate_q_side(c.p, "dQ", as_const(dQ.view()));
    validate_kv_side(c.p, "dK", as_const(dK.view()));
    validate_kv_side(c.p, "dV", as_const(dV.view()));
    const SampledOutputs g = sampled_outputs(s, c.p.d, {}, {}, as_const(dQ.view()), as_const(dK.view()), as_const(dV.view()));
    got.dQ = g.dQ;
    got.dK = g.dK;
    got.dV = g.dV;
  };
  Checker k;
  k.prepare = [&c, in, kept](const Impl& m) {
    *kept = Kept();
    return m.prepare(c.p, *in, c.opt);
  };
  k.bytes = [&c, threads, sampled](const Impl& m) {
    const Footprint& f = sampled && m.sampled_footprint ? m.sampled_footprint : m.footprint;  // as case_need
    return f ? make_need("", f(c.p, c.dtype, c.opt, c.pass.bwd, threads)).bytes : 0;
  };
  k.check = [&c, want, sampled_want, sampled, kept, in, sampled_forward, sampled_backward](const Runner& run,
                                                                                           const std::string& pass) {
    if (!sampled) {
      if (pass == "fwd") {
        Tensor4<double> O;
        Tensor3<double> LSE;
        run.fetch_forward(O, LSE);
        return check_forward(*want, O, LSE);
      }
      Tensor4<double> dQ, dK, dV;
      run.fetch_backward(dQ, dK, dV);
      return check_backward(*want, dQ, dK, dV);
    }
    const Sample& s = sampled_want->sample;
    const bool keep = c.pass.bwd;
    if (pass == "fwd") {
      SampledOutputs got;
      RunRows rr;
      sampled_forward(run, s, keep, got, rr);
      if (keep) *kept = Kept{true, std::move(rr)};
      return check_sampled_forward(*sampled_want, got);
    }
    if (!kept->have) {
      SampledOutputs unused;
      sampled_forward(run, s, true, unused, kept->run);
      kept->have = true;
    }
    SampledOutputs got;
    sampled_backward(run, s, got);
    return check_sampled_backward(*sampled_want, c.p, *in, kept->run, got);
  };
  return k;
}

Checker lmhead_checker(const Case& c, int threads) {
  constexpr double g = 1.0;  // dL of a loss minimized directly
  auto in = std::make_shared<LmHeadInputs>();
  {
    Allocating step("generating the inputs H, W, y in fp64", 0);
    *in = make_lmhead_inputs(c.lm, c.dtype, c.seed, c.values, c.ignored);
  }
  auto want = std::make_shared<LmHeadOracle>();
  {
    Allocating step("running the fp64 oracle", lmhead_oracle_need(c.lm, c.pass.backward()).bytes);
    *want = lmhead_oracle(c.lm, *in, g, c.pass.backward());
  }
  Checker k;
  k.prepare = [&c, in](const Impl& m) { return m.lmhead.prepare(c.lm, *in, g, c.opt); };
  k.bytes = [&c, threads](const Impl& m) {
    return m.lmhead.footprint ? make_need("", m.lmhead.footprint(c.lm, c.dtype, c.opt, threads)).bytes : 0;
  };
  k.check = [want](const Runner& run, const std::string& pass) {
    std::vector<Metrics> m;
    if (pass != "bwd") {  // fwd, fused: L, LSE
      double L = 0;
      std::vector<double> LSE;
      run.fetch_loss(L, LSE);
      m = check_lmhead_forward(*want, L, LSE.data());
    }
    if (pass != "fwd") {  // bwd, fused: dH, dW
      Matrix<double> dH, dW;
      run.fetch_grads(dH, dW);
      const std::vector<Metrics> b = check_lmhead_backward<double>(*want, dH.view(), dW.view(), run.dW_roundings);
      m.insert(m.end(), b.begin(), b.end());
    }
    return m;
  };
  return k;
}

Result row_of(const Case& c, const Impl& impl, const std::string& pass) {
  Result r;
  r.impl = impl.name;
  r.dtype = c.dtype;
  r.shape = case_shape(c);
  r.values = to_string(c.values);
  r.pass = pass;
  if (c.op == Operator::Attention) {
    r.mask = describe(c.p.mask);
    r.layout = to_string(c.layout);
    r.flops = pass == "fwd" ? forward_flops(c.p) : backward_flops(c.p);
  } else {
    r.mask = "-";
    r.flops = (pass != "bwd" ? lmhead_forward_flops(c.lm) : 0) + (pass != "fwd" ? lmhead_backward_flops(c.lm) : 0);
  }
  return r;
}

const char* pass_words(const std::string& pass) {
  return pass == "fwd" ? "forward" : pass == "bwd" ? "backward" : "fused call";
}

}  // namespace

std::vector<Result> run_case(const Case& c, const std::vector<const Impl*>& impls, int repeat) {
  repeat = std::max(repeat, 1);
  const int threads = max_threads();
  const Checker k = c.op == Operator::Attention ? attention_checker(c, threads) : lmhead_checker(c, threads);
  std::vector<std::string> passes;
  if (c.pass.fwd) passes.push_back("fwd");
  if (c.pass.bwd) passes.push_back("bwd");
  if (c.pass.fused) passes.push_back("fused");
  std::vector<Result> out;
  for (const Impl* impl : impls) {
    size_t n = 0;  // the passes done
    try {
      Allocating step("running impl " + impl->name + " (" + to_string(c.dtype) + ")", k.bytes(*impl));
      const Runner run = k.prepare(*impl);
      for (; n < passes.size(); ++n) {
        const std::string& pass = passes[n];
        Result r = row_of(c, *impl, pass);
        if (pass == "bwd" && !c.pass.fwd) run.forward();  // the backward reads this implementation's own forward
        r.ms = best_of(pass == "fwd" ? run.forward : pass == "bwd" ? run.backward : run.fused, repeat);
        r.tensors = k.check(run, pass);
        r.all = combine(r.tensors.data(), static_cast<int>(r.tensors.size()));
        out.push_back(r);
      }
    } catch (const std::exception& e) {
      // A throw while running fails that row; the impl's later passes are not run.
      const bool oom = dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const std::length_error*>(&e);
      for (size_t m = n; m < passes.size(); ++m) {
        Result r = row_of(c, *impl, passes[m]);
        r.error = m > n ? std::string("not run: the ") + pass_words(passes[n]) + " failed"
                        : oom ? out_of_memory_message(e) : e.what();
        r.all.err_bound = std::numeric_limits<double>::infinity();
        out.push_back(r);
      }
    }
  }
  return out;
}

}  // namespace burstlab::tools
