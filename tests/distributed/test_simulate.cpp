// The alpha-beta simulator (spec §7.10): replaying the schedules with Table 1's accounting gives
// BurstEngine Table 1's closed forms exactly; the executed schedules, overlap and the
// collectives behave as the model says.
#include <gtest/gtest.h>

#include <cmath>

#include "burstlab/error.hpp"
#include "double_ring.hpp"
#include "simulate.hpp"
#include "testutil.hpp"

using namespace burstlab;
using namespace burstlab::dist;

namespace {
// Unit roundoff of IEEE double, round to nearest: |fl(x) - x| <= kUnitRoundoff |x|.
constexpr double kUnitRoundoff = 0x1p-53;
// a and b are equal in exact arithmetic on the same input doubles (link times, FLOP counts, the
// rate) and each is built from them by sums, maxima, products and quotients of non-negative
// numbers, so each is within gamma_k = k u / (1 - k u) (relative) of that exact value, k its
// longest chain of roundings (Higham, Accuracy and Stability of Numerical Algorithms, 3.1, 4.2).
// `roundings` = k_a + k_b <= 72 here, so k u < 1e-14 and |a - b| <= 2 roundings u max(|a|, |b|)
// holds with the second-order terms covered by the factor 2.
void expect_close(double a, double b, int roundings, const std::string& what) {
  EXPECT_LE(std::abs(a - b), 2 * roundings * kUnitRoundoff * std::max(std::abs(a), std::abs(b)))
      << what << ": " << a << " vs " << b << " (" << roundings << " roundings)";
}
struct SimCase {
  Problem p;
  Partition part;
  MaskData mask;
};
SimCase setup(int G, int64_t n, const char* mask, int64_t H = 4) {
  SimCase s;
  s.p = testutil::make_problem(2, H, H, G * n, G * n, 16, mask, 1);  // H_q = H_kv: one P for every tensor
  s.part = make_partition(PartitionKind::Zigzag, G * n, G);
  s.mask = compile_mask(s.p);
  return s;
}
}  // namespace

TEST(Simulator, ReproducesBurstEngineTable1) {
  for (auto [M, K] : {std::pair<int, int>{2, 4}, {4, 8}, {3, 2}, {2, 1}, {8, 8}})
    for (const char* preset : {"a800-32", "a100-roce"}) {
      const int G = M * K;
      const SimCase s = setup(G, 6, "causal");
      Cluster c = cluster_preset(preset);
      c.nodes = M;
      c.gpus_per_node = K;
      const int64_t eb = 2, P = s.p.B * s.p.H_q * 6 * s.p.d * eb;  // one tensor's shard (Table 1's P)
      const double Ti = c.intra.time(double(P)), Te = c.inter.time(double(P));
      auto comm = [&](const Schedule& f, const Schedule& b, SimSpec spec) {
        spec.table1 = true;
        return simulate_schedule(f, s.p, s.part, s.part, c, eb, spec).comm_s +
               simulate_schedule(b, s.p, s.part, s.part, c, eb, spec).comm_s;
      };
      const std::string at = std::string(preset) + " " + std::to_string(M) + "x" + std::to_string(K);
      // Roundings: every replayed message time is the double Ti or Te itself (same bytes P, same
      // LinkCost::time). A time passes <= 3 per-rank sums (ring backward: 4 sends a step) then
      // G - 1 step sums (lockstep), or G - 1 per-tensor step sums, <= 4 tensor sums (5 items),
      // over + ser (topology-aware); then forward + backward: <= G + 5. The closed forms round
      // <= 3 times (N T, 5 or 6 x, one inner and one outer sum; 2 x and 4 x are exact).
      const int k_table1 = G + 8;
      // RingAttention: flat ring, lockstep.
      const Schedule rf = make_schedule(Algo::Ring, Phase::Forward, s.p, s.mask, s.part, s.part);
      const Schedule rb = make_schedule(Algo::Ring, Phase::Backward, s.p, s.mask, s.part, s.part);
      SimSpec lock;
      expect_close(comm(rf, rb, lock), table1_ring(G, Ti, Te), k_table1, "ring " + at);
      // DoubleRing (LoongTrain): double ring, ring traffic, gradients not overlapped.
      const Schedule df = make_double_ring_schedule(Algo::Ring, Phase::Forward, s.p, s.mask, s.part, s.part, K);
      const Schedule db = make_double_ring_schedule(Algo::Ring, Phase::Backward, s.p, s.mask, s.part, s.part, K);
      SimSpec topo;
      topo.model = CommModel::TopologyAware;
      topo.double_ring = true;
      topo.overlap_grads = false;
      expect_close(comm(df, db, topo), table1_double_ring(G, M, Ti, Te), k_table1, "double ring " + at);
      // BurstAttention: double ring, burst traffic, gradients overlapped.
      const Schedule bf = make_double_ring_schedule(Algo::Burst, Phase::Forward, s.p, s.mask, s.part, s.part, K);
      const Schedule bb = make_double_ring_schedule(Algo::Burst, Phase::Backward, s.p, s.mask, s.part, s.part, K);
      topo.overlap_grads = true;
      expect_close(comm(bf, bb, topo), table1_burst(G, M, Ti, Te), k_table1, "burst " + at);
      if (M > 1 && K > 1 && Te > Ti) {  // the orderings Table 1 implies when inter-node links are slower
        EXPECT_LT(table1_burst(G, M, Ti, Te), table1_double_ring(G, M, Ti, Te)) << at;
        EXPECT_LT(table1_double_ring(G, M, Ti, Te), table1_ring(G, Ti, Te)) << at;
      }
    }
}

TEST(Simulator, ExecutedSchedulesAndOverlap) {
  const int M = 2, K = 4, G = 8;
  const SimCase s = setup(G, 8, "causal", 8);
  Cluster c = cluster_preset("a800-32");
  c.nodes = M;
  c.gpus_per_node = K;
  c.flops_per_s = 1e9;  // slow compute: overlap hides all communication
  const Schedule f = make_schedule(Algo::Burst, Phase::Forward, s.p, s.mask, s.part, s.part);
  SimSpec spec;
  const Prediction with = simulate_schedule(f, s.p, s.part, s.part, c, 2, spec);
  spec.overlap = false;
  const Prediction without = simulate_schedule(f, s.p, s.part, s.part, c, 2, spec);
  // Zigzag balances causal work: every rank computes the same pairs, N^2/2 + N/2 over G.
  const double N = double(G * 8), pairs = (N * N + N) / 2 / G;
  // Roundings: per step 1024 pairs / 1e9 (the product is an exact integer) once, 7 step sums;
  // the closed form once.
  expect_close(with.compute_s, 4.0 * 16 * 2 * 8 * pairs / 1e9, 1 + 7 + 1, "compute");
  EXPECT_GT(with.comm_s, 0);
  // Both sides add the same per-step doubles (compute, message times). Without overlap: K + V,
  // compute + comm, 7 step sums (9); with: 7 compute step sums; K + V and 7 comm step sums; the
  // final + (9).
  expect_close(without.total_s, with.compute_s + with.comm_s, 9 + 9, "no overlap = compute + comm");
  EXPECT_LT(with.total_s, without.total_s);
  EXPECT_GE(with.total_s, with.compute_s);
  // Executed forward: K, V of a (B, H, n, d) shard make G - 1 hops. In the flat ring ranks 3
  // and 7 send every hop across nodes, the others never: max per class = all G - 1 hops.
  const int64_t P = 2 * 8 * 8 * 16 * 2;
  EXPECT_EQ(with.bytes_intra, 2 * P * (G - 1));
  EXPECT_EQ(with.bytes_inter, 2 * P * (G - 1));
  // The double ring: every rank G - M intra and M - 1 inter hops.
  const Schedule df = make_double_ring_schedule(Algo::Burst, Phase::Forward, s.p, s.mask, s.part, s.part, K);
  SimSpec topo;
  topo.model = CommModel::TopologyAware;
  const Prediction dr = simulate_schedule(df, s.p, s.part, s.part, c, 2, topo);
  EXPECT_EQ(dr.bytes_intra, 2 * P * (G - M));
  EXPECT_EQ(dr.bytes_inter, 2 * P * (M - 1));
  // Slow links, fast compute: no-overlap and overlap differ by exactly the hidden compute.
  c.flops_per_s = 1e18;
  spec.overlap = true;
  const Prediction fast = simulate_schedule(f, s.p, s.part, s.part, c, 2, spec);
  EXPECT_GE(fast.total_s, fast.comm_s);  // comm bound: only the last step's compute shows
  // Exactly: every step but the last lasts its sends (comm >> compute at 1e18 FLOP/s) and the last
  // sends nothing (K, V stop after G - 1 hops), so lockstep's total and comm add the same doubles
  // in the same order and differ by the last step's compute alone, added once: bitwise equal.
  EXPECT_EQ(fast.total_s, fast.comm_s + fast.step_s.back());
  EXPECT_GT(fast.step_s.back(), 0);
  EXPECT_LE(fast.step_s.back(), fast.compute_s);  // a rounded sum of non-negative terms is >= each
  // Collectives never overlap: total = compute + comm.
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    const Prediction u = simulate_ulysses(ph, s.p, s.mask, s.part, s.part, c, 2);
    const Prediction a = simulate_allgather(ph, s.p, s.mask, s.part, s.part, c, 2);
    EXPECT_GT(u.comm_s, 0);
    EXPECT_GT(a.comm_s, 0);
    // Exactly: every rank has the same compute x, and x + c rounds monotonically in c, so the
    // max over ranks of fl(x + comm_r) is fl(x + max comm_r) bitwise.
    EXPECT_EQ(u.total_s, u.compute_s + u.comm_s) << "ulysses";
  }
  EXPECT_THROW(cluster_preset("nope"), Error);
  c.nodes = 3;
  EXPECT_THROW(simulate_schedule(f, s.p, s.part, s.part, c, 2, spec), Error);
}

// The backward's partial sums (spec §7.3): posted before a step's compute from step 2 on, they
// hide under it like the read-only shards; only the last hop home, after the compute of step
// G - 1, is exposed (one fp32 dK and dV shard for ring, one dQ shard for burst), whatever G.
TEST(Simulator, PartialSumsHideUnderTheComputeButTheLastHop) {
  for (int G : {3, 4, 6}) {
    const SimCase s = setup(G, 8, "causal", 8);
    Cluster c = cluster_preset("a800-32");
    c.nodes = 1;
    c.gpus_per_node = G;
    c.flops_per_s = 1e9;  // slow compute: everything posted before a compute hides under it
    for (Algo a : {Algo::Ring, Algo::Burst}) {
      const Schedule b = make_schedule(a, Phase::Backward, s.p, s.mask, s.part, s.part);
      for (int r = 0; r < G; ++r)
        for (int t = 0; t < G; ++t) {
          int sums = 0, after = 0;
          for (const Message& m : b.steps[r][t].sends) {
            const bool acc = travelling_items(a, Phase::Backward)[m.item].accumulated;
            after += m.after_compute ? 1 : 0;
            sums += acc && !m.after_compute ? 1 : 0;
          }
          EXPECT_EQ(after, t == G - 1 ? (a == Algo::Ring ? 2 : 1) : 0) << G << " " << r << " " << t;
          EXPECT_EQ(sums, t >= 2 ? (a == Algo::Ring ? 2 : 1) : 0) << G << " " << r << " " << t;
        }
      const Prediction x = simulate_schedule(b, s.p, s.part, s.part, c, 2, SimSpec{});
      const double shard = 2.0 * 8 * 8 * 16 * 4;  // B H n d in fp32
      const double last = (a == Algo::Ring ? 2 : 1) * c.intra.time(shard);
      // total - compute: a total's few roundings relative to a much smaller difference.
      EXPECT_NEAR(x.exposed_comm_s, last, 1e-9 * x.total_s) << to_string(a) << " G=" << G;
      EXPECT_GT(x.comm_s, 2 * last) << to_string(a) << " G=" << G;  // the rest was hidden
    }
  }
}

// The collective-style replays move exactly the executed bytes: on one node every byte is intra,
// and the busiest rank's bytes equal the closed forms (7.22)-(7.23), (7.25).
TEST(Simulator, Attention2DAndDistFlashReplayTheClosedFormBytes) {
  for (int G : {4, 5, 6}) {
    const Problem p = testutil::make_problem(1, 4, 2, 10 * G + 3, 10 * G + 3, 8, "causal", 1);
    const MaskData md = compile_mask(p);
    Cluster c = cluster_preset("a100-pcie");
    c.nodes = 1;
    c.gpus_per_node = G;
    const Partition cyc = make_partition(PartitionKind::Striped, p.N_q, G);
    const Partition con = make_partition(PartitionKind::Contiguous, p.N_q, G);
    for (Phase ph : {Phase::Forward, Phase::Backward}) {
      int64_t a2 = 0, fl = 0;
      for (int r = 0; r < G; ++r) {
        // elem-bytes 2: bf16 with fp32 LSE, D and gradients, the executors' widths.
        a2 = std::max(a2, attention2d_bytes(ph, p, default_grid(G), cyc, cyc, r, true, ElemBytes(2, 4)));
        fl = std::max(fl, distflash_bytes(ph, p, con, con, r, true, ElemBytes(2, 4)));
      }
      const Prediction x = simulate_attention2d(ph, p, md, default_grid(G), cyc, cyc, c, 2);
      const Prediction y = simulate_distflash(ph, p, md, con, con, c, 2);
      EXPECT_EQ(x.bytes_intra, a2) << G;
      EXPECT_EQ(x.bytes_inter, 0);
      EXPECT_EQ(y.bytes_intra, fl) << G;
      EXPECT_GT(x.comm_s, 0);
      EXPECT_GE(y.total_s, y.compute_s);
    }
  }
}

// A separately measured backward rate (`burstlab simulate --flops measured`) prices only the
// backward: halving it doubles every backward model's compute (7.17), the forward is unchanged.
TEST(Simulator, BackwardRatePricesOnlyTheBackward) {
  const int G = 4;
  const SimCase s = setup(G, 6, "causal");
  Cluster c = cluster_preset("a100-pcie");
  c.nodes = 1;
  c.gpus_per_node = G;
  c.flops_per_s = 3e12;
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    const Schedule sch = make_schedule(Algo::Burst, ph, s.p, s.mask, s.part, s.part);
    Cluster slow = c;
    slow.flops_per_s_backward = c.flops_per_s / 2;
    // Exactly: halving the rate is a power-of-two scaling, which commutes with every rounding of
    // the quotients and their sums (these times are far from overflow and underflow): compute doubles bitwise.
    const double k = ph == Phase::Backward ? 2.0 : 1.0;
    EXPECT_EQ(simulate_schedule(sch, s.p, s.part, s.part, slow, 2, SimSpec{}).compute_s,
              k * simulate_schedule(sch, s.p, s.part, s.part, c, 2, SimSpec{}).compute_s) << "ring family";
    EXPECT_EQ(simulate_ulysses(ph, s.p, s.mask, s.part, s.part, slow, 2).compute_s,
              k * simulate_ulysses(ph, s.p, s.mask, s.part, s.part, c, 2).compute_s) << "ulysses";
    EXPECT_EQ(simulate_allgather(ph, s.p, s.mask, s.part, s.part, slow, 2).compute_s,
              k * simulate_allgather(ph, s.p, s.mask, s.part, s.part, c, 2).compute_s) << "allgather";
  }
  c.flops_per_s_backward = -1;
  EXPECT_THROW(simulate_ulysses(Phase::Forward, s.p, s.mask, s.part, s.part, c, 2), Error);
}

// USP (§7.14): the all-to-all in each group, the ring across groups, the all-to-all back. Its
// replay moves exactly the executed bytes: the busiest rank's bytes equal (7.27) (one element
// width); on one node every byte is intra; with the groups on 2 nodes the inter-node bytes are
// the ring's alone, on H/u heads.
TEST(Simulator, UspReplaysTheClosedFormBytes) {
  const Problem p = testutil::make_problem(1, 8, 4, 10 * 4 + 3, 10 * 4 + 3, 8, "causal", 1);
  const MaskData md = compile_mask(p);
  const int G = 4;
  const Partition part = make_partition(PartitionKind::Zigzag, p.N_q, G);
  for (int u : {1, 2, 4})
    for (Algo base : {Algo::Ring, Algo::Burst})
      for (Phase ph : {Phase::Forward, Phase::Backward}) {
        const std::string what = "u=" + std::to_string(u) + " " + to_string(base) + " " + to_string(ph);
        const Problem hp = usp_head_problem(p, u);
        const Partition gq = usp_group_partition(part, u);
        const Schedule ring = make_schedule(base, ph, hp, md, gq, gq);
        int64_t closed = 0, ring_closed = 0, a2a_closed = 0;
        for (int r = 0; r < G; ++r) {
          // bf16 (2 bytes) with fp32 accumulators (4), the executor's widths.
          const int64_t all = usp_bytes(base, ph, p, part, part, u, r, true, ElemBytes(2, 4));
          const int64_t ring_part = closed_form_bytes(base, ph, hp, gq, gq, r / u, true, ElemBytes(2, 4));
          closed = std::max(closed, all);
          ring_closed = std::max(ring_closed, ring_part);
          a2a_closed = std::max(a2a_closed, all - ring_part);
        }
        Cluster one = cluster_preset("a100-pcie");
        one.nodes = 1;
        one.gpus_per_node = G;
        const Prediction x = simulate_usp(ph, p, u, ring, part, part, one, 2);
        EXPECT_EQ(x.bytes_intra, closed) << what;
        EXPECT_EQ(x.bytes_inter, 0) << what;
        EXPECT_EQ(x.step_s.size(), ring.steps[0].size() + 2) << what;
        EXPECT_GE(x.total_s, x.compute_s) << what;
        if (u == 2) {  // groups = nodes: only the ring crosses them
          Cluster two = cluster_preset("a800-32");
          two.nodes = 2;
          two.gpus_per_node = 2;
          const Prediction y = simulate_usp(ph, p, u, ring, part, part, two, 2);
          EXPECT_EQ(y.bytes_inter, ring_closed) << what;
          EXPECT_EQ(y.bytes_intra, a2a_closed) << what;
        }
      }
}

// u = 1 is the flat ring (no all-to-all: the same prediction); u = G is Ulysses (a ring of one:
// the same compute and bytes, and the same time up to the order of its sums).
TEST(Simulator, UspOfDegreeOneIsTheRingAndOfDegreeGIsUlysses) {
  const int G = 4;
  const SimCase s = setup(G, 6, "causal");
  Cluster c = cluster_preset("a800-32");
  c.nodes = 2;
  c.gpus_per_node = 2;
  for (Phase ph : {Phase::Forward, Phase::Backward})
    for (bool overlap : {true, false}) {
      const std::string what = to_string(ph) + (overlap ? " overlap" : " no overlap");
      const Schedule ring = make_schedule(Algo::Burst, ph, s.p, s.mask, s.part, s.part);
      SimSpec spec;
      spec.overlap = overlap;
      const Prediction r = simulate_schedule(ring, s.p, s.part, s.part, c, 2, spec);
      const Prediction u1 = simulate_usp(ph, s.p, 1, ring, s.part, s.part, c, 2, overlap);
      EXPECT_EQ(u1.total_s, r.total_s) << what;  // 0 + x + 0 is exact
      EXPECT_EQ(u1.comm_s, r.comm_s) << what;
      EXPECT_EQ(u1.compute_s, r.compute_s) << what;
      EXPECT_EQ(u1.bytes_intra, r.bytes_intra) << what;
      EXPECT_EQ(u1.bytes_inter, r.bytes_inter) << what;

      const Problem hp = usp_head_problem(s.p, G);
      const Partition gp = usp_group_partition(s.part, G);
      const Schedule one = make_schedule(Algo::Burst, ph, hp, s.mask, gp, gp);
      const Prediction uG = simulate_usp(ph, s.p, G, one, s.part, s.part, c, 2, overlap);
      const Prediction uly = simulate_ulysses(ph, s.p, s.mask, s.part, s.part, c, 2);
      EXPECT_EQ(uG.bytes_intra, uly.bytes_intra) << what;
      EXPECT_EQ(uG.bytes_inter, uly.bytes_inter) << what;
      // Sums of the same per-message times and pair counts in other orders: 2 G + 8 roundings each.
      expect_close(uG.compute_s, uly.compute_s, 24, what + " compute");
      expect_close(uG.total_s, uly.total_s, 48, what + " total");
    }
}

// USP's model needs its groups inside nodes or spanning whole nodes (then every ring hop is
// inter-node).
TEST(Simulator, UspGroupsMustFitTheNodes) {
  const int G = 6;
  const SimCase s = setup(G, 4, "causal", 6);
  Cluster c = cluster_preset("a800-32");
  c.nodes = 2;
  c.gpus_per_node = 3;
  const Problem hp = usp_head_problem(s.p, 2);
  const Partition gp = usp_group_partition(s.part, 2);
  const Schedule ring = make_schedule(Algo::Burst, Phase::Forward, hp, s.mask, gp, gp);
  EXPECT_THROW(simulate_usp(Phase::Forward, s.p, 2, ring, s.part, s.part, c, 2), Error);
  const Problem h6 = usp_head_problem(s.p, 6);
  const Partition g6 = usp_group_partition(s.part, 6);
  const Prediction x = simulate_usp(Phase::Forward, s.p, 6, make_schedule(Algo::Burst, Phase::Forward, h6, s.mask, g6, g6),
                                    s.part, s.part, c, 2);
  EXPECT_GT(x.bytes_inter, 0);  // the all-to-all spans both nodes
}

// The presets of the machines this project measures on: one node of 2, 4 or 8 GPUs, no inter-node
// link, the forward and backward rates per mask class (causal and unmasked measured apart), and
// each phase priced at its own rate: on a causal problem the causal rates, on an unmasked one the
// unmasked rates.
TEST(Simulator, NvlinkPresetsPricePhaseAndMaskApart) {
  for (const char* gpu : {"h100", "h200"})
    for (int g : {2, 4, 8}) {
      const std::string name = std::string(gpu) + "-x" + std::to_string(g);
      const Cluster c = cluster_preset(name);
      EXPECT_EQ(c.nodes, 1) << name;
      EXPECT_EQ(c.gpus_per_node, g) << name;
      EXPECT_EQ(c.inter.bytes_per_s, 0) << name;
      EXPECT_GT(c.flops_per_s_backward, 0) << name;
      EXPECT_GT(c.flops_per_s_full, 0) << name;
      EXPECT_GT(c.flops_per_s_backward_full, 0) << name;
      // The same per-GPU figures on every host size.
      const Cluster two = cluster_preset(std::string(gpu) + "-x2");
      EXPECT_EQ(c.flops_per_s, two.flops_per_s) << name;
      EXPECT_EQ(c.flops_per_s_backward_full, two.flops_per_s_backward_full) << name;
      EXPECT_EQ(c.intra.bytes_per_s, two.intra.bytes_per_s) << name;
      for (const char* mask : {"causal", "none"}) {
        const Problem p = testutil::make_problem(1, 4, 4, 64 * g, 64 * g, 16, mask, 1);
        const bool full = std::string(mask) == "none";
        EXPECT_EQ(flops_rate(c, Phase::Forward, p), full ? c.flops_per_s_full : c.flops_per_s) << name << mask;
        EXPECT_EQ(flops_rate(c, Phase::Backward, p), full ? c.flops_per_s_backward_full : c.flops_per_s_backward)
            << name << mask;
        // Every rank's compute of a ring step is its visible pairs at the phase's rate (7.17).
        const MaskData md = compile_mask(p);
        const Partition part = make_partition(full ? PartitionKind::Contiguous : PartitionKind::Zigzag, p.N_q, g);
        for (Phase ph : {Phase::Forward, Phase::Backward}) {
          const Schedule s = make_schedule(Algo::Burst, ph, p, md, part, part);
          double pairs = 0;  // the busiest rank's
          for (int r = 0; r < g; ++r) {
            double n = 0;
            for (const RankStep& st : s.steps[r])
              for (const BlockTask& b : st.blocks) n += double(b.visible);
            pairs = std::max(pairs, n);
          }
          const double want = flops_per_pair(ph, p.d) * 4 * pairs / flops_rate(c, ph, p);
          // Roundings: per step one product and quotient, g - 1 step sums; the closed form 3.
          expect_close(simulate_schedule(s, p, part, part, c, 2, SimSpec{}).compute_s, want, 2 * g + 5,
                       name + " " + mask + " " + to_string(ph));
        }
      }
      Cluster more = c;
      more.nodes = 2;  // no inter-node link is known for these presets
      const Problem p = testutil::make_problem(1, 4, 4, 64 * g, 64 * g, 16, "causal", 1);
      const Partition part = make_partition(PartitionKind::Zigzag, p.N_q, 2 * g);
      EXPECT_THROW(simulate_schedule(make_schedule(Algo::Ring, Phase::Forward, p, compile_mask(p), part, part), p,
                                     part, part, more, 2, SimSpec{}),
                   Error)
          << name;
    }
}

// The pinned shape: 2x H100, the 32K causal problem the preset's causal rates were measured on
// (B = 1, H = 32, d = 128, bf16, zigzag). Burst's two ranks each compute half of the visible
// pairs, so each phase's compute is half the one-GPU time the rate came from
// (plugins/cudnn/README.md: 12.40 ms forward, 48.64 ms backward); the transfers, K and V
// (forward; 2 x 128 MiB, one hop) and Q, dO, LSE, D (backward) at the assumed 450 GB/s + 10 us,
// take less than a step's compute and are hidden; the backward's one dQ hop (G = 2), the partial
// sum home after the last step's compute, is not.
TEST(Simulator, H100PairPinnedAt32KCausal) {
  const Cluster c = cluster_preset("h100-x2");
  const int64_t N = 32768;
  const Problem p = testutil::make_problem(1, 32, 32, N, N, 128, "causal", 1);
  const MaskData md = compile_mask(p);
  const Partition part = make_partition(PartitionKind::Zigzag, N, 2);
  const double one_gpu_ms[2] = {12.40, 48.64};
  const Phase phases[2] = {Phase::Forward, Phase::Backward};
  for (int k = 0; k < 2; ++k) {
    const Schedule s = make_schedule(Algo::Burst, phases[k], p, md, part, part);
    const Prediction x = simulate_schedule(s, p, part, part, c, 2, SimSpec{});
    // The rate is the measured time's FLOPs over it, the prediction half those FLOPs over the
    // rate: equal up to a few roundings (well under 1e-12 relative).
    EXPECT_NEAR(x.compute_s * 1e3, one_gpu_ms[k] / 2, 1e-12 * one_gpu_ms[k]) << to_string(phases[k]);
    if (k == 0) {
      EXPECT_EQ(x.total_s, x.compute_s);
      EXPECT_EQ(x.exposed_comm_s, 0);
    } else {
      // At G = 2 dQ makes one hop (fp32: 32 x N/2 x 128 x 4 bytes), the partial sum home, posted
      // after the last step's compute and waited for; a rank's own contribution stays home and
      // the other tensors hide under the compute.
      const double dq = 10e-6 + 32.0 * (N / 2) * 128 * 4 / 450e9;
      expect_close(x.total_s, x.compute_s + dq, 8, "backward total");
      // total - compute: a total's few roundings, relative to a ~40x smaller difference.
      expect_close(x.exposed_comm_s, dq, 8 * 64, "backward exposed");
    }
  }
  // The forward's one hop of K and V: two 128 MiB messages at 450 GB/s + 10 us each.
  const Schedule f = make_schedule(Algo::Burst, Phase::Forward, p, md, part, part);
  const double shard = 32.0 * (N / 2) * 128 * 2;
  expect_close(simulate_schedule(f, p, part, part, c, 2, SimSpec{}).comm_s, 2 * (10e-6 + shard / 450e9), 8,
               "forward comm");
}
