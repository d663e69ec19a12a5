// distributed/simulate.cpp — spec §7.10.
#include "simulate.hpp"

#include <algorithm>
#include <string>

#include "burstlab/error.hpp"
#include "burstlab/names.hpp"

namespace burstlab::dist {

namespace {
std::vector<Cluster> make_presets() {
  // Bandwidths per direction from the papers' setups; alpha and the FLOP rate are assumptions
  // (alpha: typical NCCL small-message latency; FLOPs: ~50% of the 312 TFLOP/s bf16 peak).
  auto make = [](const char* name, const char* note, int nodes, int gpn, double a_in, double bw_in, double a_out,
                 double bw_out) {
    Cluster c;
    c.name = name;
    c.note = note;
    c.nodes = nodes;
    c.gpus_per_node = gpn;
    c.intra = {a_in, bw_in};
    c.inter = {a_out, bw_out};
    c.flops_per_s = 156e12;
    return c;
  };
  // The machines this project measures on: one host of 2, 4 or 8 GPUs over NVLink (the same
  // per-GPU figures). FLOP rates: burstlab's CUDA kernels (auto: v4 forward and backward at
  // d = 128, what the engine's blocks run) on the whole problem on ONE GPU of that kind: B = 1,
  // H = 32, N = 32K, d = 128, bf16, causal and unmasked apart, counted as (7.17) over visible
  // pairs. Nothing is fitted to a distributed run.
  // Links: ASSUMED, none measured in this repository: 450 GB/s per direction (the 900 GB/s
  // bidirectional NVLink 4 of the H100 SXM / H200 data sheets) and 10 us a message; on these
  // shapes the compute hides them (docs/performance-gpu.md, "The simulator against measurement").
  auto tflops_32k = [](double f_phase, bool causal, double ms) {  // B = 1, H = 32, N = 32K, d = 128
    const double N = 32768, pairs = causal ? N * (N + 1) / 2 : N * N;
    return f_phase * 128 * 32 * pairs / (ms * 1e-3);
  };
  auto nvlink = [&](const char* name, const char* note, int gpus, const double (&F)[4]) {
    Cluster c = make(name, note, 1, gpus, 10e-6, 450e9, 0, 0);
    c.flops_per_s = F[0];
    c.flops_per_s_backward = F[1];
    c.flops_per_s_full = F[2];
    c.flops_per_s_backward_full = F[3];
    return c;
  };
  // H100 80GB HBM3 (SXM): plugins/cudnn/README.md, the one-GPU table's "burstlab cuda" column
  // (`run --repeat 5`, best of 5; 2026-11-27): causal lines 43-44 (12.40 ms fwd, 48.64 ms bwd:
  // 709.4, 452.1 TFLOP/s), unmasked lines 46-47 (25.59, 86.55 ms: 687.5, 508.2 TFLOP/s).
  const double h100[4] = {tflops_32k(4, true, 12.40), tflops_32k(10, true, 48.64), tflops_32k(4, false, 25.59),
                          tflops_32k(10, false, 86.55)};
  // H200: docs/logs/seam-32k-final.csv (burstlab-seam-bench's "one kernel" column t_whole_ms,
  // median of 3; 2026-11-25), causal lines 3-4 (12.743, 51.540 ms: 690.3, 426.7 TFLOP/s),
  // unmasked lines 7-8 (29.123, 92.664 ms: 604.1, 474.6 TFLOP/s).
  const double h200[4] = {tflops_32k(4, true, 12.743), tflops_32k(10, true, 51.540), tflops_32k(4, false, 29.123),
                          tflops_32k(10, false, 92.664)};
  auto noted = [](const char* kind, const char* gpu, int g) {
    return "1 node x " + std::to_string(g) + " " + kind +
           ", NVLink (assumed 450 GB/s, 10 us); FLOP/s measured on one " + gpu;
  };
  std::vector<Cluster> v = {
      make("a100-pcie", "1 node x 8 A100 PCIe 4.0 x16 (32 GB/s)", 1, 8, 10e-6, 32e9, 10e-6, 32e9),
      make("a100-roce", "4 nodes x 8 A100, NVLink 300 GB/s, 600 Gb/s RoCE per node (75 GB/s shared by 8 GPUs)", 4,
           8, 5e-6, 300e9, 15e-6, 75e9 / 8),
      make("a800-32", "4 nodes x 8 A800, NVLink 400 GB/s, 8 x 200 Gb/s IB per node (25 GB/s per GPU)", 4, 8, 5e-6,
           200e9, 10e-6, 25e9),
      make("a800-64", "8 nodes x 8 A800, NVLink 400 GB/s, 8 x 200 Gb/s IB per node (25 GB/s per GPU)", 8, 8, 5e-6,
           200e9, 10e-6, 25e9),
  };
  for (int g : {2, 4, 8})
    v.push_back(nvlink(("h100-x" + std::to_string(g)).c_str(), noted("H100 SXM", "H100", g).c_str(), g, h100));
  for (int g : {2, 4, 8})
    v.push_back(nvlink(("h200-x" + std::to_string(g)).c_str(), noted("H200", "H200", g).c_str(), g, h200));
  return v;
}
}  // namespace

const std::vector<Cluster>& cluster_presets() {
  static const std::vector<Cluster> presets = make_presets();
  return presets;
}

Cluster cluster_preset(const std::string& name) { return find_named(cluster_presets(), name, "preset"); }

double flops_per_pair(Phase phase, int64_t d) { return (phase == Phase::Backward ? 10.0 : 4.0) * double(d); }
double flops_rate(const Cluster& c, Phase phase, const Problem& p) {
  const bool bwd = phase == Phase::Backward;
  const double full = bwd ? c.flops_per_s_backward_full : c.flops_per_s_full;
  if (is_full(p.mask) && full > 0) return full;
  return bwd && c.flops_per_s_backward > 0 ? c.flops_per_s_backward : c.flops_per_s;
}

namespace {
int mod(int a, int m) { return ((a % m) + m) % m; }
bool inter(const Cluster& c, int a, int b) { return a / c.gpus_per_node != b / c.gpus_per_node; }
// The executors' element widths for storage elements of eb bytes: Q, K, V, O, dO in T (eb bytes),
// LSE, D and the gradients in acc_t<T>, fp32 for 16- and 32-bit T and fp64 for fp64 (the closed
// forms' ElemBytes). Table 1 prices every tensor alike: not used there.
ElemBytes widths(int64_t eb) { return ElemBytes(eb, std::max<int64_t>(eb, 4)); }
void check_cluster(const Cluster& c, int G) {
  if (c.gpus_per_node < 1 || c.nodes < 1 || c.nodes * c.gpus_per_node != G)
    fail("cluster nodes x gpus_per_node (", c.nodes, " x ", c.gpus_per_node, ") must equal the world size G (", G,
         ")");
  if (c.nodes > 1 && c.inter.bytes_per_s <= 0)
    fail("cluster ", c.name, " has no inter-node bandwidth (a one-node preset): give one (--inter-gbs) for ",
         c.nodes, " nodes");
  if (c.intra.bytes_per_s <= 0 || c.inter.bytes_per_s < 0 || c.flops_per_s <= 0 || c.flops_per_s_backward < 0 ||
      c.flops_per_s_full < 0 || c.flops_per_s_backward_full < 0)
    fail("cluster bandwidths and flops_per_s must be > 0 (the other FLOP rates >= 0)");
}
}  // namespace

Prediction simulate_schedule(const Schedule& s, const Problem& p, const Partition& qp, const Partition& kp,
                             const Cluster& c, int64_t eb, const SimSpec& spec) {
  const int G = s.G, K = c.gpus_per_node, M = c.nodes;
  check_cluster(c, G);
  const auto& items = travelling_items(s.algo, s.phase);
  const double fpp = flops_per_pair(s.phase, p.d) * double(p.B * p.H_q);
  Prediction out;
  out.step_s.assign(G, 0.0);
  std::vector<double> comp(G, 0.0), serial(G, 0.0);                 // per rank totals
  std::vector<std::vector<double>> intra_t(G), inter_t(G);          // [rank][item] time sums
  std::vector<int64_t> b_in(G, 0), b_out(G, 0);
  double lock_comm = 0, lock_total = 0;
  for (int r = 0; r < G; ++r) {
    intra_t[r].assign(items.size(), 0.0);
    inter_t[r].assign(items.size(), 0.0);
  }
  for (int t = 0; t < G; ++t) {
    double step_comp = 0, step_comm = 0, step_before = 0, step_after = 0;
    for (int r = 0; r < G; ++r) {
      const RankStep& st = s.steps[r][t];
      int64_t pairs = 0;
      for (const BlockTask& b : st.blocks) pairs += b.visible;
      const double ct = fpp * double(pairs) / flops_rate(c, s.phase, p);
      comp[r] += ct;
      step_comp = std::max(step_comp, ct);
      // Messages: (item, peer, bytes).
      struct Msg { int item, peer; int64_t bytes; bool after; };
      std::vector<Msg> msgs;
      for (const Message& m : st.sends)
        msgs.push_back({m.item, m.peer, m.elems * (spec.table1 ? eb : widths(eb).of(items[m.item])), m.after_compute});
      // Table 1 counts N = G moves of every tensor, the executor G - 1: the hop it saves is
      // priced here, the gradients' first (kept home) and the read-only tensors' return.
      auto table1_hop = [&](bool accumulated, int peer) {
        for (int i = 0; i < static_cast<int>(items.size()); ++i) {
          if (items[i].accumulated != accumulated) continue;
          const int shard = accumulated ? r : items[i].q_side ? st.q_shard : st.k_shard;
          msgs.push_back({i, peer, item_elems(items[i], p, qp, kp, shard) * eb, accumulated});
        }
      };
      if (spec.table1 && G > 1) {
        const int n = r / K, g = r % K, ring_peer = mod(r + 1, G);
        if (t == 0)
          table1_hop(true, spec.double_ring ? (K == 1 ? mod(n + 1, M) * K + mod(g + 1, K) : n * K + mod(g + 1, K))
                                            : ring_peer);
        if (t == G - 1) table1_hop(false, spec.double_ring ? mod(n + 1, M) * K + mod(g + 1, K) : ring_peer);
      }
      double rank_comm = 0, rank_before = 0, rank_after = 0;
      for (const Msg& m : msgs) {
        if (spec.table1 && items[m.item].per_row) continue;  // Table 1 leaves D, LSE out
        const bool x = inter(c, r, m.peer);
        const double tt = (x ? c.inter : c.intra).time(double(m.bytes));
        (x ? b_out : b_in)[r] += m.bytes;
        (x ? inter_t : intra_t)[r][m.item] += tt;
        rank_comm += tt;
        (m.after ? rank_after : rank_before) += tt;
      }
      step_comm = std::max(step_comm, rank_comm);
      step_before = std::max(step_before, rank_before);
      step_after = std::max(step_after, rank_after);
    }
    lock_comm += step_comm;
    // Traffic posted before a step's compute (read-only shards, the previous step's partial
    // sums) hides under it; traffic posted after it (the last partial sums, home) does not.
    const double step =
        spec.overlap ? std::max(step_comp, step_before) + step_after : step_comp + step_comm;
    lock_total += step;
    out.step_s[t] = spec.model == CommModel::Lockstep ? step : step_comp;
  }
  for (int r = 0; r < G; ++r) {
    out.compute_s = std::max(out.compute_s, comp[r]);
    out.bytes_intra = std::max(out.bytes_intra, b_in[r]);
    out.bytes_inter = std::max(out.bytes_inter, b_out[r]);
  }
  if (spec.model == CommModel::Lockstep) {
    out.comm_s = lock_comm;
    out.total_s = lock_total;
  } else {
    // Separate railways: per tensor max(intra, inter); gradients serialize unless overlapped.
    for (int r = 0; r < G; ++r) {
      double over = 0, ser = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].accumulated && !spec.overlap_grads) ser += intra_t[r][i] + inter_t[r][i];
        else over += std::max(intra_t[r][i], inter_t[r][i]);
      }
      out.comm_s = std::max(out.comm_s, over + ser);
      const double total = spec.overlap ? std::max(comp[r], over) + ser : comp[r] + over + ser;
      out.total_s = std::max(out.total_s, total);
    }
  }
  out.exposed_comm_s = std::max(0.0, out.total_s - out.compute_s);
  return out;
}

namespace {
// A collective phase: rank r sends msgs (peer, bytes) in rounds that cannot start before the
// previous one ended; each round costs max(sum intra, sum inter) (separate railways).
struct Round {
  std::vector<std::pair<int, int64_t>> msgs;
};
Prediction collective(const std::vector<std::vector<Round>>& rounds, const std::vector<double>& comp,
                      const Cluster& c) {
  Prediction out;
  const int G = static_cast<int>(rounds.size());
  for (int r = 0; r < G; ++r) {
    double comm = 0;
    int64_t bi = 0, bo = 0;
    for (const Round& rd : rounds[r]) {
      double ti = 0, to = 0;
      for (const auto& [peer, bytes] : rd.msgs) {
        if (inter(c, r, peer)) { to += c.inter.time(double(bytes)); bo += bytes; }
        else { ti += c.intra.time(double(bytes)); bi += bytes; }
      }
      comm += std::max(ti, to);
    }
    out.comm_s = std::max(out.comm_s, comm);
    out.compute_s = std::max(out.compute_s, comp[r]);
    out.total_s = std::max(out.total_s, comp[r] + comm);  // the collective must finish first
    out.bytes_intra = std::max(out.bytes_intra, bi);
    out.bytes_inter = std::max(out.bytes_inter, bo);
  }
  out.step_s = {out.total_s};
  out.exposed_comm_s = std::max(0.0, out.total_s - out.compute_s);
  return out;
}
// One all-to-all pair of a head-sharded schedule (Ulysses over the world, USP inside a group),
// one message per tensor: rank r sends peer s its nq, nk rows of the Hq, Hkv heads s holds (out,
// sequence -> heads) and later the rows of shard s of its own heads (back, heads -> sequence).
void head_messages(Phase phase, const Problem& p, int64_t Hq, int64_t Hkv, int64_t eb, int s, int64_t nq, int64_t nk,
                   int64_t nqs, int64_t nks, std::vector<std::pair<int, int64_t>>& out,
                   std::vector<std::pair<int, int64_t>>& back) {
  const int64_t B = p.B, d = p.d, t = eb, a = widths(eb).a;
  out.push_back({s, B * Hq * nq * d * t});   // Q
  out.push_back({s, B * Hkv * nk * d * t});  // K
  out.push_back({s, B * Hkv * nk * d * t});  // V
  if (phase == Phase::Forward) {
    back.push_back({s, B * Hq * nqs * d * t});  // O
    back.push_back({s, B * Hq * nqs * a});      // LSE
  } else {
    out.push_back({s, B * Hq * nq * d * t});     // dO
    out.push_back({s, B * Hq * nq * a});         // LSE
    out.push_back({s, B * Hq * nq * a});         // D
    back.push_back({s, B * Hq * nqs * d * a});   // dQ
    back.push_back({s, B * Hkv * nks * d * a});  // dK
    back.push_back({s, B * Hkv * nks * d * a});  // dV
  }
}

int64_t all_pairs(const MaskData& mask, const Partition& qp, const Partition& kp, int r_q) {
  int64_t pairs = 0;
  const MaskParams m = mask.params();
  for (int qc : qp.rank_chunks[r_q])
    for (const Chunk& kc : kp.chunks) pairs += visible_in(m, qp.chunks[qc], kc);
  return pairs;
}
}  // namespace

Prediction simulate_ulysses(Phase phase, const Problem& p, const MaskData& mask, const Partition& qp,
                            const Partition& kp, const Cluster& c, int64_t eb) {
  const int G = qp.G;
  check_cluster(c, G);
  if (p.H_q % G || p.H_kv % G) fail("ulysses needs H_q and H_kv multiples of G (", G, ")");
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G;
  int64_t pairs = 0;
  for (int r = 0; r < G; ++r) pairs += all_pairs(mask, qp, kp, r);
  const double ct = flops_per_pair(phase, d) * double(B * Hg) * double(pairs) / flops_rate(c, phase, p);
  std::vector<std::vector<Round>> rounds(G, std::vector<Round>(2));
  for (int r = 0; r < G; ++r)
    for (int s = 0; s < G; ++s) {
      if (s == r) continue;
      head_messages(phase, p, Hg, Hkvg, eb, s, qp.local_size(r), kp.local_size(r), qp.local_size(s),
                    kp.local_size(s), rounds[r][0].msgs, rounds[r][1].msgs);
    }
  return collective(rounds, std::vector<double>(G, ct), c);
}

Prediction simulate_allgather(Phase phase, const Problem& p, const MaskData& mask, const Partition& qp,
                              const Partition& kp, const Cluster& c, int64_t eb) {
  const int G = qp.G;
  check_cluster(c, G);
  const int64_t kv = p.B * p.H_kv * p.d * eb, dkv = p.B * p.H_kv * p.d * widths(eb).a;
  std::vector<double> comp(G);
  std::vector<std::vector<Round>> rounds(G, std::vector<Round>(phase == Phase::Backward ? 2 : 1));
  for (int r = 0; r < G; ++r) {
    comp[r] = flops_per_pair(phase, p.d) * double(p.B * p.H_q) * double(all_pairs(mask, qp, kp, r)) / flops_rate(c, phase, p);
    for (int s = 0; s < G; ++s) {
      if (s == r) continue;
      rounds[r][0].msgs.push_back({s, kv * kp.local_size(r)});  // K
      rounds[r][0].msgs.push_back({s, kv * kp.local_size(r)});  // V
      if (phase == Phase::Backward) {
        rounds[r][1].msgs.push_back({s, dkv * kp.local_size(s)});  // dK partial of s's rows
        rounds[r][1].msgs.push_back({s, dkv * kp.local_size(s)});  // dV
      }
    }
  }
  return collective(rounds, comp, c);
}

Prediction simulate_attention2d(Phase phase, const Problem& p, const MaskData& mask, const Grid& g,
                                const Partition& qp, const Partition& kp, const Cluster& c, int64_t eb) {
  const int G = qp.G;
  check_cluster(c, G);
  check_attention2d(g, G, qp, kp);
  const bool bwd = phase == Phase::Backward;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv;
  const MaskParams m = mask.params();
  std::vector<double> comp(G);
  std::vector<std::vector<Round>> rounds(G, std::vector<Round>(bwd ? 4 : 3));
  for (int r = 0; r < G; ++r) {
    const int i = g.row(r), j = g.col(r), rt = g.row_major(r);
    int holder = r;
    for (int q = 0; q < G; ++q) if (g.row_major(q) == r) holder = q;
    int64_t pairs = 0;
    for (int jj = 0; jj < g.p_c; ++jj)
      for (int ii = 0; ii < g.p_r; ++ii)
        pairs += visible_in(m, qp.chunks[g.rank(i, jj)], kp.chunks[g.row_major(g.rank(ii, j))]);
    comp[r] = flops_per_pair(phase, d) * double(B * Hq) * double(pairs) / flops_rate(c, phase, p);
    const int64_t a = widths(eb).a, kv = B * Hkv * d * eb, dkv = B * Hkv * d * a;
    if (rt != r) for (int k = 0; k < 2; ++k) rounds[r][0].msgs.push_back({holder, kv * kp.local_size(r)});  // K, V
    for (int jj = 0; jj < g.p_c; ++jj) {
      const int s = g.rank(i, jj);
      if (s == r) continue;
      rounds[r][1].msgs.push_back({s, B * Hq * d * eb * qp.local_size(r)});  // Q
      if (bwd) {
        rounds[r][1].msgs.push_back({s, B * Hq * d * eb * qp.local_size(r)});  // dO
        rounds[r][1].msgs.push_back({s, 2 * B * Hq * a * qp.local_size(r)});  // LSE, D
      }
      rounds[r][2].msgs.push_back({s, B * Hq * (bwd ? d * a : d * eb + a) * qp.local_size(s)});  // (O, LSE) or dQ
    }
    for (int ii = 0; ii < g.p_r; ++ii) {
      const int s = g.rank(ii, j);
      if (s == r) continue;
      for (int k = 0; k < 2; ++k) rounds[r][1].msgs.push_back({s, kv * kp.local_size(rt)});  // K, V
      if (bwd) for (int k = 0; k < 2; ++k) rounds[r][2].msgs.push_back({s, dkv * kp.local_size(g.row_major(s))});  // dK, dV
    }
    if (bwd && rt != r) for (int k = 0; k < 2; ++k) rounds[r][3].msgs.push_back({rt, dkv * kp.local_size(rt)});
  }
  return collective(rounds, comp, c);
}

Prediction simulate_distflash(Phase phase, const Problem& p, const MaskData& mask, const Partition& qp,
                              const Partition& kp, const Cluster& c, int64_t eb, bool overlap) {
  const int P = qp.G;
  check_cluster(c, P);
  check_distflash(mask, qp, kp);
  const FlashSchedule s = make_distflash_schedule(P);
  const bool bwd = phase == Phase::Backward;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, a = widths(eb).a;
  const MaskParams m = mask.params();
  Prediction out;
  std::vector<double> comp(P, 0.0);
  std::vector<int64_t> b_in(P, 0), b_out(P, 0);
  for (size_t t = 0; t < s.steps[0].size(); ++t) {
    double step_comp = 0, step_comm = 0;
    for (int r = 0; r < P; ++r) {
      const FlashStep& st = s.steps[r][t];
      std::vector<std::pair<int, int64_t>> msgs;
      if (st.kv_dst >= 0) for (int k = 0; k < 2; ++k) msgs.push_back({st.kv_dst, B * Hkv * d * eb * kp.local_size(r)});
      if (st.q_dst >= 0) msgs.push_back({st.q_dst, B * Hq * (bwd ? 2 * d * eb + 2 * a : d * eb) * qp.local_size(r)});
      double ct = 0;
      if (st.role != FlashRole::Idle) {
        ct = flops_per_pair(phase, d) * double(B * Hq) *
             double(visible_in(m, qp.chunks[st.q], kp.chunks[st.k])) / flops_rate(c, phase, p);
        if (st.role == FlashRole::Helper) msgs.push_back({st.q, B * Hq * (bwd ? d * a : d * eb + a) * qp.local_size(st.q)});
        if (bwd && st.role == FlashRole::Owner && st.k != r)
          for (int k = 0; k < 2; ++k) msgs.push_back({st.k, B * Hkv * d * a * kp.local_size(st.k)});
      }
      comp[r] += ct;
      step_comp = std::max(step_comp, ct);
      double tt = 0;
      for (const auto& [peer, bytes] : msgs) {
        const bool x = inter(c, r, peer);
        tt += (x ? c.inter : c.intra).time(double(bytes));
        (x ? b_out : b_in)[r] += bytes;
      }
      step_comm = std::max(step_comm, tt);
    }
    out.comm_s += step_comm;
    const double step = overlap ? std::max(step_comp, step_comm) : step_comp + step_comm;
    out.step_s.push_back(step);
    out.total_s += step;
  }
  for (int r = 0; r < P; ++r) {
    out.compute_s = std::max(out.compute_s, comp[r]);
    out.bytes_intra = std::max(out.bytes_intra, b_in[r]);
    out.bytes_inter = std::max(out.bytes_inter, b_out[r]);
  }
  out.exposed_comm_s = std::max(0.0, out.total_s - out.compute_s);
  return out;
}

Prediction simulate_usp(Phase phase, const Problem& p, int u, const Schedule& ring, const Partition& qp,
                        const Partition& kp, const Cluster& c, int64_t eb, bool overlap) {
  const int G = qp.G, K = c.gpus_per_node;
  check_cluster(c, G);
  check_usp(p, G, u);
  if (ring.G != G / u) fail("usp: the ring's schedule has ", ring.G, " ranks, not G/u = ", G / u);
  // The ring's cluster: ring rank g is world rank g u + i for every i, so ring hops cross nodes as
  // the world's do when groups sit inside nodes (K/u ring ranks per node) or span whole ones.
  Cluster rc = c;
  if (K % u == 0) {
    rc.gpus_per_node = K / u;
  } else if (u % K == 0) {
    rc.gpus_per_node = 1;
    rc.nodes = G / u;
  } else {
    fail("usp: the ulysses degree u (", u, ") and gpus_per_node (", K, ") must divide one another");
  }
  const int64_t Hu = p.H_q / u, Hkvu = p.H_kv / u;
  std::vector<std::vector<Round>> in(G, std::vector<Round>(1)), back(G, std::vector<Round>(1));
  for (int r = 0; r < G; ++r)
    for (int j = 0; j < u; ++j) {
      const int s = r / u * u + j;
      if (s == r) continue;
      head_messages(phase, p, Hu, Hkvu, eb, s, qp.local_size(r), kp.local_size(r), qp.local_size(s),
                    kp.local_size(s), in[r][0].msgs, back[r][0].msgs);
    }
  const std::vector<double> none(G, 0.0);
  const Prediction a = collective(in, none, c), b = collective(back, none, c);
  SimSpec spec;
  spec.overlap = overlap;
  const Prediction x = simulate_schedule(ring, usp_head_problem(p, u), usp_group_partition(qp, u),
                                         usp_group_partition(kp, u), rc, eb, spec);
  Prediction out;
  out.step_s.push_back(a.comm_s);
  out.step_s.insert(out.step_s.end(), x.step_s.begin(), x.step_s.end());
  out.step_s.push_back(b.comm_s);
  out.compute_s = x.compute_s;
  out.comm_s = a.comm_s + x.comm_s + b.comm_s;
  out.total_s = a.comm_s + x.total_s + b.comm_s;
  out.exposed_comm_s = std::max(0.0, out.total_s - out.compute_s);
  // Bytes per world rank and link class: its all-to-all messages and its ring rank's sends.
  for (int r = 0; r < G; ++r) {
    int64_t bi = 0, bo = 0;
    for (const auto* rounds : {&in, &back})
      for (const auto& [peer, bytes] : (*rounds)[r][0].msgs) (inter(c, r, peer) ? bo : bi) += bytes;
    const auto& items = travelling_items(ring.algo, ring.phase);
    for (const RankStep& st : ring.steps[r / u])
      for (const Message& m : st.sends)
        (inter(c, r, m.peer * u + r % u) ? bo : bi) += m.elems * widths(eb).of(items[m.item]);
    out.bytes_intra = std::max(out.bytes_intra, bi);
    out.bytes_inter = std::max(out.bytes_inter, bo);
  }
  return out;
}

double table1_ring(int N, double Ti, double Te) { return 6 * std::max(N * Ti, N * Te); }
double table1_double_ring(int N, int Ni, double Ti, double Te) {
  return 4 * std::max((N - Ni) * Ti, Ni * Te) + 2 * ((N - Ni) * Ti + Ni * Te);
}
double table1_burst(int N, int Ni, double Ti, double Te) { return 5 * std::max((N - Ni) * Ti, Ni * Te); }

}  // namespace burstlab::dist
