// tools/resources.cpp — see resources.hpp. Shapes: Eq = B H_q N_q d (Q, O, dO, dQ), Ek = B H_kv
// N_k d (K, V, dK, dV), Er = B H_q N_q (LSE, D).
#include "resources.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include <omp.h>

#include "burstlab/error.hpp"
#include "common.hpp"
#include "cpu.hpp"
#include "cpu_footprint.hpp"
#include "reference_footprint.hpp"

namespace burstlab::tools {

// ---------------------------------------------------------------- the tool's runs
namespace {

using Sizes = Elements;

// The copies host_runner (impls.cpp) keeps: Q, K, V, dO converted to T, and O, dQ, dK, dV, LSE.
MemPart host_copies(const Problem& p, Dtype t) {
  const Sizes z(p);
  return {"its copies of Q, K, V, dO, O, LSE, dQ, dK, dV in " + to_string(t),
          bytes_mul(bytes_of(t), bytes_sum({bytes_mul(4, z.Eq), bytes_mul(4, z.Ek), z.Er}))};
}
// What fetch_forward / fetch_backward return in fp64 (run_case keeps one pass's at a time).
MemPart fetched(const Problem& p, bool backward) {
  const Sizes z(p);
  const int64_t fwd = bytes_mul(8, bytes_add(z.Eq, z.Er)), bwd = bytes_mul(8, bytes_add(z.Eq, bytes_mul(2, z.Ek)));
  return backward && bwd > fwd ? MemPart{"fetched dQ, dK, dV in fp64", bwd} : MemPart{"fetched O, LSE in fp64", fwd};
}

}  // namespace

std::vector<MemPart> inputs_footprint(const Problem& p, Dtype dtype) {
  const Sizes z(p);
  const int64_t mask = bytes_sum({bytes_mul(4, static_cast<int64_t>(p.mask.q_segment.size())),
                                  bytes_mul(4, static_cast<int64_t>(p.mask.k_segment.size())),
                                  static_cast<int64_t>(p.mask.block_mask.size())});
  // The Problem (its mask) is copied by the Case, each prepared run and the layer calls: 4 copies.
  return {{"inputs Q, K, V, dO in " + to_string(dtype),
           bytes_mul(bytes_of(dtype), bytes_add(bytes_mul(2, z.Eq), bytes_mul(2, z.Ek)))},
          {"the mask's segment ids and block bits (4 copies)", bytes_mul(4, mask)}};
}

MemPart inputs_widened(const Problem& p, Dtype dtype, bool backward) {
  const Sizes z(p);
  if (dtype == Dtype::F64) return {"the inputs widened to fp64 (none: held in fp64)", 0};
  return {std::string("the inputs Q, K, V") + (backward ? ", dO" : "") + " widened to fp64 for the oracle",
          bytes_mul(8, bytes_add(bytes_mul(backward ? 2 : 1, z.Eq), bytes_mul(2, z.Ek)))};
}

std::vector<MemPart> reference_footprint(const Problem& p, Dtype dtype, const ImplOptions&, bool backward, int threads) {
  std::vector<MemPart> live = {fetched(p, false), reference::forward_workspace(p, dtype, threads)};
  if (backward) {
    live.push_back(fetched(p, true));
    live.push_back(reference::backward_workspace(p, dtype, threads));
  }
  std::vector<MemPart> parts = {host_copies(p, dtype), largest(live)};  // one at a time: a pass, its fetch, ...
  for (const MemPart& x : reference::call_overhead(p, dtype, threads)) parts.push_back(x);
  return parts;
}

std::vector<MemPart> cpu_footprint(const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward, int threads) {
  const cpu::Tiles t = cpu_tiles(opt);
  std::vector<MemPart> live = {fetched(p, false), cpu::forward_workspace(p, dtype, t, threads)};
  if (backward) {
    live.push_back(fetched(p, true));
    live.push_back(cpu::backward_workspace(p, dtype, t, threads));
  }
  return {host_copies(p, dtype), largest(live), cpu::packing(p, dtype, t, threads), small_allocations()};
}

std::vector<MemPart> cuda_host_footprint(const Problem& p, Dtype dtype, const ImplOptions&, bool backward, int) {
  // cuda_like / cuda_fetch (impls.cpp) stage one tensor at a time in a host vector of T.
  const Sizes z(p);
  return {{"host staging of one tensor in " + to_string(dtype), bytes_mul(bytes_of(dtype), std::max(z.Eq, z.Ek))},
          fetched(p, backward)};
}

EngineFootprint cpu_engine_footprint() {
  EngineFootprint e;
  e.what = "cpu engine tiles and GEMM packing";
  e.block_call = [](const Problem& p, int64_t, Dtype dtype, const ImplOptions& opt, int threads) {
    // Each rank thread runs the engine, whose OpenMP regions make `threads` Scratches each.
    return cpu::block_call_bytes(p, dtype, cpu_tiles(opt), threads);
  };
  return e;
}


Footprint distributed_footprint(int kv_shards, int world, const EngineFootprint& engine, bool sampled,
                                int ranks_per_device) {
  return [kv_shards, world, engine, sampled, ranks_per_device](const Problem& p, Dtype dtype, const ImplOptions& opt,
                                                                bool backward, int threads) {
    const Sizes z(p);
    const int64_t s = bytes_of(dtype), G = std::max(world, 1);
    // The ranks whose shards, blocks and engine share one device (the host: all of them).
    const int64_t k = engine.device && ranks_per_device > 0 ? std::min<int64_t>(ranks_per_device, G) : G;
    const auto share = [&](int64_t all_ranks) { return k == G ? all_ranks : bytes_mul(k, (all_ranks + G - 1) / G); };
    const int64_t kv = bytes_mul(backward ? 4 : 2, z.Ek);                                                   // K, V (dK, dV)
    const int64_t q = bytes_add(bytes_mul(backward ? 4 : 2, z.Eq), bytes_mul(backward ? 2 : 1, z.Er));  // Q, O (dO, dQ), LSE (D)
    const int64_t copies = std::max(kv_shards, 2);
    const bool gathers_kv = kv_shards > 2;  // else a ring, whose backward also holds arriving partial sums
    const int64_t outputs = bytes_sum({bytes_mul(2, z.Eq), z.Er, backward ? bytes_mul(2, z.Ek) : 0});
    const std::string where = !engine.device ? ""
                              : k == G       ? " on the device"
                                             : " on each device (" + std::to_string(k) + " of the " + std::to_string(G) +
                                             " ranks)";
    const int64_t rows = (p.N_q + G - 1) / G;  // a rank's query rows
    std::vector<MemPart> parts = {
        {"the ranks' shards of Q, K, V, dO and their outputs in " + to_string(dtype) + where,
         share(bytes_mul(s, bytes_sum({bytes_mul(2, z.Eq), bytes_mul(2, z.Ek), outputs}))), engine.device},
        {"blocks in flight: " + std::to_string(copies) + " copies of K, V" + (backward ? ", dK, dV" : "") +
             " and 2 of the query-side tensors" +
             (backward && !gathers_kv ? " (and the ring's arriving partial sums of dK, dV or dQ)" : "") + " in " +
             to_string(dtype) + where,
         share(bytes_mul(s, bytes_sum({bytes_mul(copies, kv), bytes_mul(2, q),
                                       backward && !gathers_kv ? std::max(bytes_mul(2, z.Ek), z.Eq) : 0}))),
         engine.device},
        {engine.what + " on " + std::to_string(k) + " rank threads x " + threads_text(std::max(threads, 1)),
         bytes_mul(k, engine.block_call(p, rows, dtype, opt, threads)), engine.device},
        small_allocations()};  // with the sample's K rows and columns of the outputs, when sampled
    if (!sampled) {
      parts.push_back({"downloaded and gathered outputs in " + to_string(dtype), bytes_mul(2, bytes_mul(s, outputs))});
      parts.push_back(fetched(p, backward));
    }
    return parts;
  };
}

namespace {
MemNeed lmhead_case_need(const Case& c, const std::vector<const Impl*>& impls, int threads) {
  const bool backward = c.pass.backward();
  const MemNeed kept = reference::lmhead_oracle_need(c.lm, backward);
  MemNeed n = peak_of(kept, reference::lmhead_bounds_need(c.lm, backward));
  for (const Impl* m : impls) {
    std::vector<MemPart> parts = m->lmhead.footprint(c.lm, c.dtype, c.opt, threads);
    for (const MemPart& k : kept.parts)
      if (k.what.find("logits") == std::string::npos && k.what.find("temporaries") == std::string::npos)
        parts.push_back(k);
    n = peak_of(n, make_need("running impl " + m->name + " (" + to_string(c.dtype) + ")", parts));
  }
  return n;
}
}  // namespace

MemNeed case_need(const Case& c, const std::vector<const Impl*>& impls, int threads) {
  if (c.op == Operator::LmHeadCe) return lmhead_case_need(c, impls, threads);
  const Problem& p = c.p;
  const bool sampled = c.check_rows > 0;
  std::vector<MemPart> base = inputs_footprint(p, c.dtype);
  MemNeed oracle = sampled ? sampled_oracle_need(p, c.check_rows, c.pass.bwd, threads)
                           : oracle_need(p, c.pass.bwd, threads);
  std::vector<MemPart> with_oracle = base;
  if (!sampled) with_oracle.push_back(inputs_widened(p, c.dtype, c.pass.bwd));
  with_oracle.insert(with_oracle.end(), oracle.parts.begin(), oracle.parts.end());
  MemNeed n = make_need(oracle.step, with_oracle);
  const std::vector<MemPart> kept = sampled ? sampled_oracle_kept(p, c.check_rows, c.pass.bwd) : oracle_kept(p, c.pass.bwd);
  base.insert(base.end(), kept.begin(), kept.end());
  if (sampled && c.pass.bwd) {
    // column_oracle runs while the impl's run (and its fetched gradients) is still alive.
    base.push_back({"D of the run and its magnitude for the sampled columns' q-heads", bytes_mul(16, Sizes(p).Er)});
  }
  for (const Impl* m : impls) {
    // A run that hands the sampled check its sample (a distributed one) keeps the rows' LSE for the
    // column check; any other hands over its whole O and LSE in fp64.
    const bool by_sample = sampled && m->sampled_footprint;
    const Footprint& own = by_sample ? m->sampled_footprint : m->footprint;
    if (!own) continue;
    std::vector<MemPart> parts = base;
    if (sampled && c.pass.bwd) {
      const Sizes z(p);
      parts.push_back(by_sample ? MemPart{"the run's LSE in fp64 for the column check", bytes_mul(8, z.Er)}
                                : MemPart{"the candidate's O, LSE in fp64 for the column check",
                                          bytes_mul(8, bytes_add(z.Eq, z.Er))});
    }
    for (MemPart x : own(p, c.dtype, c.opt, c.pass.bwd, threads)) {
      x.what = "impl " + m->name + ": " + x.what;
      parts.push_back(x);
    }
    n = peak_of(n, make_need("impl " + m->name + " (" + to_string(c.dtype) + ")", parts));
  }
  return n;
}

// ---------------------------------------------------------------- what the machine has
MemAvailable memory_available() { return burstlab::memory_available(omp_get_max_threads()); }

void require_device_memory(const Case& c, const std::vector<const Impl*>& impls, int threads) {
  for (const Impl* m : impls) {
    if (!m->device_memory || !m->footprint || c.op != Operator::Attention) continue;
    const MemNeed n = make_need("impl " + m->name + " (" + to_string(c.dtype) + ")",
                                m->footprint(c.p, c.dtype, c.opt, c.pass.bwd, threads));
    if (n.device_bytes > 0) require_memory(n, m->device_memory(), {}, true);
  }
}

// ---------------------------------------------------------------- out of memory anyway
namespace {
struct Step {
  std::string what;
  int64_t bytes = 0;
  bool set = false;
};
Step g_failed;  // the innermost Allocating an exception unwound through (main thread only)
}  // namespace

Allocating::Allocating(std::string what, int64_t bytes, int64_t announce_from)
    : what_(std::move(what)), bytes_(bytes), uncaught_(std::uncaught_exceptions()), announced_(bytes >= announce_from) {
  g_failed.set = false;  // a new step: an earlier failure was handled
  if (announced_) {
    std::fprintf(stderr, "burstlab: %s (estimated %s) ...\n", what_.c_str(), format_bytes(bytes_).c_str());
    std::fflush(stderr);
    t0_ = omp_get_wtime();
  }
}
Allocating::~Allocating() {
  const bool failed = std::uncaught_exceptions() > uncaught_;
  if (failed && !g_failed.set) g_failed = Step{what_, bytes_, true};
  if (announced_) {
    std::fprintf(stderr, "burstlab: %s: %s after %.1f s\n", what_.c_str(), failed ? "failed" : "done", omp_get_wtime() - t0_);
    std::fflush(stderr);
  }
}

std::string out_of_memory_message(const std::exception& e, const std::string& advice) {
  const bool length = dynamic_cast<const std::length_error*>(&e) != nullptr;
  std::string msg = std::string("out of memory (") + (length ? "std::length_error: " : "") + e.what() + ")";
  if (g_failed.set) {
    msg += " while " + g_failed.what;
    if (g_failed.bytes > 0) msg += " (estimated " + format_bytes(g_failed.bytes) + ")";
  }
  g_failed.set = false;
  try {
    const MemAvailable a = memory_available();
    if (a.bytes >= 0) msg += "; " + format_bytes(a.bytes) + " available (" + a.source + ")";
  } catch (const std::exception&) {
  }
  return advice.empty() ? msg : msg + "; " + advice;
}

}  // namespace burstlab::tools
