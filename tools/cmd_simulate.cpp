// tools/cmd_simulate.cpp — `burstlab simulate`: predicted time of every schedule on a cluster
// under the alpha-beta model of spec §7.10, and BurstEngine Table 1 next to the replay.
#include "cmd_simulate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/env.hpp"
#include "common.hpp"
#include "cpu_engine.hpp"
#include "algorithm.hpp"
#include "double_ring.hpp"
#include "schedule.hpp"
#include "simulate.hpp"
#include "table.hpp"

namespace burstlab::tools {

namespace {

struct SimFlags {
  std::string algos = "ring,burst,double-ring,burst-double-ring,ulysses,allgather,attention2d,distflash,usp";
  std::string preset = "a800-32";
  int nodes = 0, gpus_per_node = 0;  // 0: the preset's
  int64_t seq = 65536, B = 1, H_q = 32, H_kv = 32, d = 128;
  std::string mask = "causal", partition = "zigzag";
  int elem_bytes = 2;
  double intra_gbs = 0, inter_gbs = 0, intra_us = -1, inter_us = -1, tflops = 0, tflops_bwd = 0;
  std::string flops;  // "measured": time the CPU engine (measure_cpu_rate) instead of the preset's rate
  bool json = false;
  bool steps = false;  // also print the predicted time of every step (overlapped model)
};

// The CPU engine's attention FLOP rate (spec §7.10's F) on a representative block: one full
// (unmasked) 512 x 512 block of one head at the simulated d, fp32, through Engine::forward_block
// and Engine::backward_block (what a ring step runs), FLOPs counted as (7.17): 4 d (forward),
// 10 d (backward) per pair. Each pass is repeated until ~100 ms have elapsed (at least twice).
struct MeasuredRate {
  double fwd = 0, bwd = 0;  // FLOP/s
  int64_t n = 0, d = 0;
  int reps_fwd = 0, reps_bwd = 0;
};
MeasuredRate measure_cpu_rate(int64_t d) {
  MeasuredRate m;
  m.n = 512;
  m.d = d;
  const int64_t n = m.n;
  const Problem p = make_problem(1, 1, 1, n, n, d, "none", 1, nullptr);
  auto engine = cpu::make_engine<float>(cpu::Tiles{});
  const PreparedMask md = engine->prepare(compile_mask(p));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto rnd = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = u(gen);
    return v;
  };
  std::vector<float> Q = rnd(n * d), K = rnd(n * d), V = rnd(n * d), dO = rnd(n * d);  // (1, 1, n, d)
  std::vector<float> O(n * d), LSE(n), D(n), dQ(n * d), dK(n * d), dV(n * d);        // (1, 1, n, d), (1, 1, n)
  auto v4 = [&](float* x) { return view4(x, Layout::BHSD, 1, 1, n, d); };
  auto c4 = [&](float* x) { return as_const(v4(x)); };
  auto v3 = [&](float* x) { return view3(x, 1, 1, n); };
  const Positions pos = contiguous(0, n);
  const double pairs = double(n) * double(n);
  auto timed = [](auto&& body, int& reps) {
    const auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    for (reps = 0; reps < 2 || s < 0.1; ++reps) {
      body();
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return s / reps;
  };
  const double tf = timed([&] { engine->forward_block(p, md, pos, pos, c4(Q.data()), c4(K.data()), c4(V.data()),
                                                      v4(O.data()), v3(LSE.data()), false); },
                          m.reps_fwd);
  engine->compute_D(c4(O.data()), c4(dO.data()), v3(D.data()));
  const double tb = timed(
      [&] {
        engine->backward_block(p, md, pos, pos, c4(Q.data()), c4(K.data()), c4(V.data()), c4(dO.data()),
                               as_const(v3(LSE.data())), as_const(v3(D.data())), v4(dQ.data()),
                               v4(dK.data()), v4(dV.data()));
      },
      m.reps_bwd);
  m.fwd = dist::flops_per_pair(dist::Phase::Forward, d) * pairs / tf;
  m.bwd = dist::flops_per_pair(dist::Phase::Backward, d) * pairs / tb;
  return m;
}

// The simulator's rows: every algorithm of the table with a model, under its name; the double
// ring twice, as the two systems BurstEngine Table 1 compares: `double-ring` is LoongTrain's
// DoubleRing (ring traffic, gradients not overlapped), `burst-double-ring` BurstEngine's (burst
// traffic, gradients overlapped).
struct SimAlgo {
  std::string name;
  const dist::Algorithm* algo;
  dist::Algo base;
};
std::vector<SimAlgo> sim_algos() {
  std::vector<SimAlgo> out;
  for (const dist::Algorithm& a : dist::algorithms()) {
    if (!a.simulate) continue;
    const bool two_level = a.node_rings;
    out.push_back({a.name, &a, two_level ? dist::Algo::Ring : dist::Algo::Burst});
    if (two_level) out.push_back({std::string("burst-") + a.name, &a, dist::Algo::Burst});
  }
  return out;
}
const SimAlgo& find_sim_algo(const std::vector<SimAlgo>& all, const std::string& name) {
  std::string names;
  for (const SimAlgo& a : all) {
    if (a.name == name) return a;
    names += (names.empty() ? "" : ", ") + a.name;
  }
  fail("algo (", name, ") must be one of ", names);
}

int run_simulate(const SimFlags& f) {
  dist::Cluster c = dist::cluster_preset(f.preset);
  if (f.nodes > 0) c.nodes = f.nodes;
  if (f.gpus_per_node > 0) c.gpus_per_node = f.gpus_per_node;
  if (f.intra_gbs > 0) c.intra.bytes_per_s = f.intra_gbs * 1e9;
  if (f.inter_gbs > 0) c.inter.bytes_per_s = f.inter_gbs * 1e9;
  if (f.intra_us >= 0) c.intra.alpha_s = f.intra_us * 1e-6;
  if (f.inter_us >= 0) c.inter.alpha_s = f.inter_us * 1e-6;
  if (c.nodes > 1 && c.inter.bytes_per_s <= 0)
    fail("nodes (", c.nodes, ") > 1 needs an inter-node bandwidth: the preset ", c.name,
         " is one node and has none; give --inter-gbs (and --inter-us)");
  // A rate given replaces the preset's whole table (per phase and mask class): --tflops prices
  // every phase unless --tflops-bwd prices the backward.
  if (f.tflops > 0) {
    c.flops_per_s = f.tflops * 1e12;
    c.flops_per_s_backward = c.flops_per_s_full = c.flops_per_s_backward_full = 0;
  }
  if (f.tflops_bwd > 0) {
    c.flops_per_s_backward = f.tflops_bwd * 1e12;
    c.flops_per_s_backward_full = 0;
  }
  if (!f.flops.empty() && f.flops != "measured") fail("flops (", f.flops, ") must be 'measured'");
  if (f.flops == "measured") {
    if (f.tflops > 0) fail("flops (measured) and tflops (", f.tflops, ") both set the compute rate: give one");
    if (f.tflops_bwd > 0)
      fail("flops (measured) and tflops-bwd (", f.tflops_bwd, ") both set the compute rate: give one");
    const MeasuredRate m = measure_cpu_rate(f.d);
    c.flops_per_s = m.fwd;
    c.flops_per_s_backward = m.bwd;
    c.flops_per_s_full = c.flops_per_s_backward_full = 0;
    if (!f.json)
      std::printf("measured cpu engine (fp32, one %lld x %lld block, d=%lld, no mask): forward %.2f GFLOP/s (%d reps), "
                "backward %.2f GFLOP/s (%d reps)\n",
                static_cast<long long>(m.n), static_cast<long long>(m.n), static_cast<long long>(m.d), m.fwd / 1e9,
                m.reps_fwd, m.bwd / 1e9, m.reps_bwd);
  }
  if (f.elem_bytes < 1) fail("elem-bytes (", f.elem_bytes, ") must be >= 1");
  if (int64_t(c.nodes) * c.gpus_per_node > kMaxWorld)
    fail("world (nodes x gpus-per-node = ", c.nodes, " x ", c.gpus_per_node, " = ", int64_t(c.nodes) * c.gpus_per_node,
         ") must be <= ", kMaxWorld);
  const int G = c.nodes * c.gpus_per_node, K = c.gpus_per_node;
  const Problem p = make_problem(f.B, f.H_q, f.H_kv, f.seq, f.seq, f.d, f.mask, 1, nullptr);
  const MaskData md = compile_mask(p);
  const dist::Partition part = dist::make_partition(dist::parse_partition(f.partition), f.seq, G, "seq");
  const int64_t eb = f.elem_bytes;

  Table t;
  t.columns = {{"algo", "algo", true},         {"phase", "phase", true},   {"compute_ms", "compute(ms)"},
               {"comm_ms", "comm(ms)"},        {"total_ms", "total(ms)"},  {"exposed_ms", "exposed(ms)"},
               {"serial_ms", "no-overlap(ms)"}, {"intra_MB", "intra(MB)"}, {"inter_MB", "inter(MB)"}};
  std::vector<std::string> step_lines;  // --steps
  std::vector<std::string> not_run;     // algorithms whose requirements the problem misses
  const std::vector<SimAlgo> all = sim_algos();
  for (const std::string& a : split_commas(f.algos)) {
    const SimAlgo& sa = find_sim_algo(all, a);
    dist::AlgoOptions o;
    o.algo = sa.algo->name;
    o.partition = sa.algo->partition.value_or(part.kind);
    o.world = G;
    o.gpus_per_node = K;
    o.base = sa.base;
    const dist::Phase phases[2] = {dist::Phase::Forward, dist::Phase::Backward};
    dist::Prediction with[2], without[2];  // per phase: with and without overlap
    try {
      const dist::Plan plan = dist::make_plan(p, o);
      for (int k = 0; k < 2; ++k) {
        with[k] = sa.algo->simulate(plan, phases[k], c, eb, true);
        without[k] = sa.algo->simulate(plan, phases[k], c, eb, false);
      }
    } catch (const Error& e) {  // requirements the problem or the cluster misses
      not_run.push_back(a + ": " + e.what());
      for (dist::Phase ph : phases)
        t.add({text(a), text(dist::to_string(ph)), text("not run"), missing(), missing(), missing(), missing(),
               missing(), missing()});
      continue;
    }
    for (int k = 0; k < 2; ++k) {
      const dist::Phase ph = phases[k];
      if (f.steps) {
        std::string line = a + " " + dist::to_string(ph) + " (" + std::to_string(with[k].step_s.size()) + " steps, ms):";
        for (double x : with[k].step_s) line += format(" %.3f", x * 1e3);
        step_lines.push_back(line);
      }
      const dist::Prediction& x = with[k];
      t.add({text(a), text(dist::to_string(ph)), number(x.compute_s * 1e3, "%.3f"), number(x.comm_s * 1e3, "%.3f"),
             number(x.total_s * 1e3, "%.3f"), number(x.exposed_comm_s * 1e3, "%.3f"),
             number(without[k].total_s * 1e3, "%.3f"), number(double(x.bytes_intra) / 1e6, "%.2f"),
             number(double(x.bytes_inter) / 1e6, "%.2f")});
    }
  }
  // BurstEngine Table 1 (fwd + bwd communication time) next to the schedules' replay with the
  // paper's accounting (every tensor G moves, D and LSE left out; needs H_q = H_kv so one P).
  Table t1;
  t1.columns = {{"method", "method", true}, {"table1_ms", "Table 1(ms)"}, {"replay_ms", "replay(ms)"},
                {"match", "match", true}};
  bool all_match = true;
  // BURSTLAB_TEST_BROKEN_TABLE1=1 moves every closed form by one part in 1e6: tests/tools uses it
  // to show that a mismatch prints NO and FAIL and exits 1.
  const bool broken = env::flag("BURSTLAB_TEST_BROKEN_TABLE1");
  auto row = [&](const char* name, double closed, double replayed) {
    if (broken) closed *= 1 + 1e-6;
    const bool ok = std::abs(closed - replayed) <= 1e-12 * std::max(std::abs(closed), std::abs(replayed));
    all_match = all_match && ok;
    t1.add({text(name), number(closed * 1e3, "%.4f"), number(replayed * 1e3, "%.4f"), text(ok ? "yes" : "NO")});
  };
  // Table 1's N_inter = M counts the inter-node hops of a ring over M nodes; with one node there
  // are none (the wrap-around hop is intra-node), so its expressions do not apply.
  const bool one_p = p.H_q == p.H_kv && f.seq % G == 0 && c.nodes >= 2;
  if (one_p) {
    const double P = double(p.B * p.H_q * (f.seq / G) * p.d * eb);
    const double Ti = c.intra.time(P), Te = c.inter.time(P);
    auto replay = [&](dist::Algo base, bool dbl, bool grads) {
      dist::SimSpec spec;
      spec.table1 = true;
      if (dbl) {
        spec.model = dist::CommModel::TopologyAware;
        spec.double_ring = true;
        spec.overlap_grads = grads;
      }
      double total = 0;
      for (dist::Phase ph : {dist::Phase::Forward, dist::Phase::Backward}) {
        const dist::Schedule s = dbl ? dist::make_double_ring_schedule(base, ph, p, md, part, part, K)
                                     : dist::make_schedule(base, ph, p, md, part, part);
        total += dist::simulate_schedule(s, p, part, part, c, eb, spec).comm_s;
      }
      return total;
    };
    row("RingAttention", dist::table1_ring(G, Ti, Te), replay(dist::Algo::Ring, false, false));
    row("DoubleRing", dist::table1_double_ring(G, c.nodes, Ti, Te), replay(dist::Algo::Ring, true, false));
    row("BurstAttention", dist::table1_burst(G, c.nodes, Ti, Te), replay(dist::Algo::Burst, true, true));
  }
  if (f.json) {
    Json j = {{"cluster", c.name}, {"nodes", c.nodes}, {"gpus_per_node", K},
              {"flops_per_s", {{"forward", dist::flops_rate(c, dist::Phase::Forward, p)},
                               {"backward", dist::flops_rate(c, dist::Phase::Backward, p)}}},
              {"rows", t.json()}};
    if (f.flops == "measured")
      j["measured_flops_per_s"] = {{"forward", c.flops_per_s}, {"backward", c.flops_per_s_backward}};
    if (one_p) j["table1"] = t1.json();
    if (!not_run.empty()) j["not_run"] = not_run;
    std::printf("%s\n", j.dump(2).c_str());
    return all_match ? kExitPass : kExitFail;
  }
  // The rates that price this problem (its mask class picks the preset's causal or unmasked ones).
  const double F_fwd = dist::flops_rate(c, dist::Phase::Forward, p);
  const double F_bwd = dist::flops_rate(c, dist::Phase::Backward, p);
  const std::string inter_text =
      c.inter.bytes_per_s > 0 ? format("inter %.1f GB/s + %.1f us", c.inter.bytes_per_s / 1e9, c.inter.alpha_s * 1e6)
                              : "inter none (one node)";
  const std::string rate_text =
      F_fwd == F_bwd ? format("%.4g TFLOP/s per GPU", F_fwd / 1e12)
                     : format("%.4g TFLOP/s per GPU forward, %.4g backward", F_fwd / 1e12, F_bwd / 1e12);
  std::printf("burstlab simulate: %s (%s)\n  %d nodes x %d GPUs; intra %.0f GB/s + %.1f us, %s, %s%s\n"
              "  %s, mask %s, partition %s, %d-byte elements\n\n",
              c.name.c_str(), c.note.c_str(), c.nodes, K, c.intra.bytes_per_s / 1e9, c.intra.alpha_s * 1e6,
              inter_text.c_str(), rate_text.c_str(), f.flops == "measured" ? " (measured)" : "",
              shape_string(p).c_str(), describe(p.mask).c_str(), f.partition.c_str(), f.elem_bytes);
  t.print(stdout);
  for (const std::string& l : not_run) std::printf("not run: %s\n", l.c_str());
  std::printf("\nper GPU, busiest rank; total = with compute/communication overlap (the ring family's last gradient\n"
              "hop, home after the last step's compute, is not overlapped); exposed = total - compute; intra/inter = bytes\n"
              "sent per link class (max over ranks), LSE, D and gradients in fp32 (fp64 at --elem-bytes 8). Model: spec §7.10.\n");
  if (f.steps) {
    const std::vector<std::string> step_names = split_commas(f.algos);
    bool groups = false;  // a Ulysses-in-groups algorithm among them (usp)
    for (const SimAlgo& a : sim_algos())
      groups = groups || (a.algo->ulysses_groups && std::count(step_names.begin(), step_names.end(), a.name));
    std::printf("\npredicted time per step, spec §7.10 (ring, burst, distflash: the slowest rank's step with overlap;\n"
                "double rings: compute per step, their communication is priced per tensor over the whole phase;\n"
                "ulysses, allgather, attention2d: one entry, the phase%s):\n",
                groups ? ";\nusp: the all-to-all in, the ring's steps, the all-to-all back" : "");
    for (const std::string& l : step_lines) std::printf("  %s\n", l.c_str());
  }
  if (one_p) {
    std::printf("\nBurstEngine Table 1 (forward + backward communication, N = G = %d rounds, N_inter = %d):\n", G,
                c.nodes);
    t1.print(stdout);
    if (!all_match) std::printf("FAIL: the replay differs from Table 1\n");
  } else {
    std::printf("\n(Table 1 not compared: it needs H_q = H_kv and seq %% G == 0 (one message size P) and at least\n"
                " 2 nodes (its N_inter = M inter-node hops; one node has none))\n");
  }
  return all_match ? kExitPass : kExitFail;
}

}  // namespace

Command add_simulate_command(CLI::App& app) {
  auto f = std::make_shared<SimFlags>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "Predict the time of each distributed schedule on a cluster (alpha-beta model, spec §7.10)");
  std::string algos;
  for (const SimAlgo& a : sim_algos()) algos += (algos.empty() ? "" : ", ") + a.name;
  sub->add_option("--algo", f->algos,
                  "comma-separated: " + algos + " (double-ring: LoongTrain's, the traffic of `run --algo double-ring --ring "
                  "ring`, modelled with its gradients not overlapped; burst-double-ring: BurstEngine's, the traffic of "
                  "run's default --ring burst, gradients overlapped; usp: Ulysses groups of "
                  "--gpus-per-node ranks; attention2d: the striped partition and the most square grid; distflash: the "
                  "contiguous partition)")
      ->capture_default_str();
  std::string presets;
  for (const dist::Cluster& c : dist::cluster_presets()) presets += "\n  " + c.name + ": " + c.note;
  sub->add_option("--preset", f->preset, "the cluster:" + presets)->capture_default_str();
  int_flag(sub, "--nodes", f->nodes, "nodes M (0 = the preset's)", "nodes", 0, kMaxWorld, ">= 1 (0 = the preset's)");
  int_flag(sub, "--gpus-per-node", f->gpus_per_node, "GPUs per node K (0 = the preset's)", "gpus-per-node", 0,
           kMaxWorld, ">= 1 (0 = the preset's)");
  // Lower bounds are validate()'s; upper bounds here.
  extent_flag(sub, "--seq", f->seq, "sequence length N", "seq");
  extent_flag(sub, "-B,-b,--batch", f->B, "batch B", "B");
  extent_flag(sub, "--hq", f->H_q, "query heads H_q", "H_q");
  extent_flag(sub, "--hkv", f->H_kv, "key/value heads H_kv", "H_kv");
  extent_flag(sub, "-d", f->d, "head dimension", "d");
  sub->add_option("--mask", f->mask, "mask spec (docs/spec.md §3)")->capture_default_str();
  sub->add_option("--partition", f->partition, "contiguous | zigzag | striped")->capture_default_str();
  int_flag(sub, "--elem-bytes", f->elem_bytes, "bytes per element (2 = bf16)", "elem-bytes", 1, 64);
  // The overrides: a value given is used, so it must be one the model can use.
  const double most = std::numeric_limits<double>::max();
  real_range(sub->add_option("--intra-gbs", f->intra_gbs, "override intra-node bandwidth (GB/s)"), "intra-gbs", 0, most,
             true);
  real_range(sub->add_option("--inter-gbs", f->inter_gbs, "override inter-node bandwidth per GPU (GB/s)"), "inter-gbs", 0,
             most, true);
  real_range(sub->add_option("--intra-us", f->intra_us, "override intra-node latency (us)"), "intra-us", 0, most);
  real_range(sub->add_option("--inter-us", f->inter_us, "override inter-node latency (us)"), "inter-us", 0, most);
  real_range(sub->add_option("--tflops", f->tflops,
                             "override the attention TFLOP/s per GPU: every phase and mask (the backward's too "
                             "unless --tflops-bwd)"),
             "tflops", 0, most, true);
  real_range(sub->add_option("--tflops-bwd", f->tflops_bwd, "override the backward's TFLOP/s per GPU (every mask)"),
             "tflops-bwd", 0, most, true);
  sub->add_option("--flops", f->flops,
                  "measured: time the CPU engine's forward/backward on one 512 x 512 block (~0.2 s), print and use "
                  "those rates");
  sub->add_flag("--json", f->json, "JSON instead of tables");
  sub->add_flag("--steps", f->steps, "also print the predicted time of every step of every schedule");
  sub->footer(
      "Which preset: the papers' clusters (a100-pcie, a100-roce, a800-32, a800-64) to compare schedules\n"
      "as BurstEngine does: bandwidths from the papers, the latencies and the 156 TFLOP/s rate are\n"
      "assumptions. The machines burstlab measures on (h100-x2/-x4/-x8, h200-x2/-x4/-x8: one host over\n"
      "NVLink) to predict a `burstlab run --transport nccl` there: forward and backward rates measured\n"
      "on ONE GPU of that kind by burstlab's CUDA kernels on the whole problem (bf16, H = 32,\n"
      "d = 128, N = 32K; causal and unmasked apart: H100 plugins/cudnn/README.md's one-GPU table,\n"
      "H200 docs/logs/seam-32k-final.csv); the link (450 GB/s, 10 us) is ASSUMED from the NVLink 4\n"
      "data sheet, none has been measured. How close they come: docs/performance-gpu.md,\n"
      "\"The simulator against measurement\". For another d or kernel give --tflops and --tflops-bwd.\n"
      "Nothing runs: the schedules are replayed as data.\n\n"
      "Examples:\n"
      "  burstlab simulate --preset h100-x2 --seq 32768 --algo ring,burst      # 2x H100, causal zigzag\n"
      "  burstlab simulate --preset h100-x2 --seq 131072 --mask none --partition contiguous\n"
      "  burstlab simulate --preset a800-32 --seq 1048576 --hq 32 --hkv 32\n"
      "  burstlab simulate --preset a100-pcie --algo ring,burst,ulysses --seq 131072 --hq 32 --hkv 8");
  return {sub, [f] { return run_simulate(*f); }};  // 1: Table 1 and the replay differ
}

}  // namespace burstlab::tools
