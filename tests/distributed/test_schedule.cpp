// Schedules as data (spec §7.2, §7.5): coverage, balance, closed-form bytes, traces.
#include <gtest/gtest.h>

#include "burstlab/problem.hpp"
#include "harness.hpp"
#include "partition.hpp"
#include "schedule.hpp"
#include "testutil.hpp"

using namespace burstlab;
using namespace burstlab::dist;

namespace {
const PartitionKind kKinds[] = {PartitionKind::Contiguous, PartitionKind::Zigzag, PartitionKind::Striped};
const char* kMasks[] = {"none", "causal", "window:6,2", "document:3", "block:8x8@0.5", "causal+document:2",
                        "window:-1,0+block:4x8@0.6"};

std::string tag(Algo a, Phase ph, PartitionKind k, int G, const Problem& p) {
  return to_string(a) + " " + to_string(ph) + " " + to_string(k) + " G=" + std::to_string(G) + " " +
         shape_string(p) + " mask " + describe(p.mask);
}
}  // namespace

TEST(Schedule, EveryVisiblePairComputedExactlyOnce) {
  for (const char* mask : kMasks)
    for (auto [Nq, Nk] : {std::pair<int64_t, int64_t>{37, 37}, {41, 29}, {23, 50}}) {
      const Problem p = testutil::make_problem(1, 2, 1, Nq, Nk, 4, mask, 5);
      const MaskData md = compile_mask(p);
      const MaskParams m = md.params();
      for (PartitionKind kind : kKinds)
        for (int G = 1; G <= 8; ++G) {
          if (Nq < 2 * G || Nk < 2 * G) continue;
          const Partition qp = make_partition(kind, Nq, G, "N_q"), kp = make_partition(kind, Nk, G, "N_k");
          for (Algo a : {Algo::Ring, Algo::Burst})
            for (Phase ph : {Phase::Forward, Phase::Backward}) {
              SCOPED_TRACE(tag(a, ph, kind, G, p));
              const Schedule s = make_schedule(a, ph, p, md, qp, kp);
              std::vector<int> cover(Nq * Nk, 0);
              int64_t sum = 0;
              for (int r = 0; r < G; ++r)
                for (int t = 0; t < G; ++t) {
                  const RankStep& st = s.steps[r][t];
                  for (const BlockTask& b : st.blocks) {
                    EXPECT_GT(b.visible, 0);
                    sum += b.visible;
                    const Chunk &qc = qp.chunks[b.q_chunk], &kc = kp.chunks[b.k_chunk];
                    // The home side of the block is this rank's own shard.
                    EXPECT_EQ(ph == Phase::Backward && a == Algo::Burst ? kc.rank : qc.rank, r);
                    for (int64_t x = 0; x < qc.n; ++x)
                      for (int64_t y = 0; y < kc.n; ++y) ++cover[qc.global(x) * Nk + kc.global(y)];
                  }
                  for (const BlockTask& b : st.skipped) {
                    const Chunk &qc = qp.chunks[b.q_chunk], &kc = kp.chunks[b.k_chunk];
                    for (int64_t x = 0; x < qc.n; ++x)
                      for (int64_t y = 0; y < kc.n; ++y)
                        ASSERT_FALSE(visible(m, qc.global(x), kc.global(y))) << "skipped a visible pair";
                  }
                }
              EXPECT_EQ(sum, visible_pairs(p));
              for (int64_t i = 0; i < Nq; ++i)
                for (int64_t j = 0; j < Nk; ++j)
                  // visible: exactly once; hidden (inside a computed block): at most once
                  ASSERT_TRUE(visible(m, i, j) ? cover[i * Nk + j] == 1 : cover[i * Nk + j] <= 1)
                      << "pair (" << i << ", " << j << ") covered " << cover[i * Nk + j] << " times";
            }
        }
    }
}

TEST(Schedule, CausalBalance) {
  // N divisible by 2G, N_q = N_k, causal. Zigzag: every rank the same blocks AND the same visible
  // pairs. Striped: every rank the same number of (triangular) blocks; pairs differ by exactly
  // the diagonal: P (r + 1) + G P (P - 1) / 2 with P = N / G (§7.6). Contiguous: rank r computes
  // r + 1 blocks, so work grows with r.
  for (int G = 1; G <= 8; ++G) {
    const int64_t N = 2 * G * 6, P = N / G;
    const Problem p = testutil::make_problem(1, 1, 1, N, N, 4, "causal");
    const MaskData md = compile_mask(p);
    for (PartitionKind kind : kKinds) {
      const Partition part = make_partition(kind, N, G);
      for (Algo a : {Algo::Ring, Algo::Burst})
        for (Phase ph : {Phase::Forward, Phase::Backward}) {
          SCOPED_TRACE(tag(a, ph, kind, G, p));
          const Schedule s = make_schedule(a, ph, p, md, part, part);
          for (int r = 0; r < G; ++r) {
            const Work w = work(s, r), w0 = work(s, 0);
            switch (kind) {
              case PartitionKind::Zigzag:
                EXPECT_EQ(w.blocks, 2 * G + 1);
                EXPECT_EQ(w.pairs, w0.pairs);
                EXPECT_EQ(w.pairs * G, visible_pairs(p));
                break;
              case PartitionKind::Striped:
                EXPECT_EQ(w.blocks, G);
                // Forward and ring backward count by query shard; burst backward by key shard
                // (keys r + mG are seen by N - r - mG queries).
                if (a == Algo::Burst && ph == Phase::Backward) {
                  EXPECT_EQ(w.pairs, P * N - P * r - G * P * (P - 1) / 2);
                } else {
                  EXPECT_EQ(w.pairs, P * (r + 1) + G * P * (P - 1) / 2);
                }
                break;
              case PartitionKind::Contiguous:
                // Ring and burst forward: rank r's queries see shards 0..r. Burst backward: rank r's
                // keys are seen by shards r..G-1.
                EXPECT_EQ(w.blocks, (a == Algo::Burst && ph == Phase::Backward) ? G - r : r + 1);
                if (G > 1 && r > 0) {
                  if (a == Algo::Burst && ph == Phase::Backward) {
                    EXPECT_LT(w.pairs, work(s, r - 1).pairs);
                  } else {
                    EXPECT_GT(w.pairs, work(s, r - 1).pairs);
                  }
                }
                break;
            }
          }
        }
    }
  }
}

TEST(Schedule, BytesEqualClosedForms) {
  for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {3, 1}})
    for (auto [Nq, Nk] : {std::pair<int64_t, int64_t>{113, 113}, {37, 53}, {64, 16}})
      for (PartitionKind kind : kKinds)
        for (int G = 1; G <= 8; ++G) {
          if (Nk < 2 * G) continue;
          const Problem p = testutil::make_problem(2, Hq, Hkv, Nq, Nk, 5, "causal");
          const MaskData md = compile_mask(p);
          const Partition qp = make_partition(kind, Nq, G), kp = make_partition(kind, Nk, G);
          for (Algo a : {Algo::Ring, Algo::Burst})
            for (Phase ph : {Phase::Forward, Phase::Backward}) {
              SCOPED_TRACE(tag(a, ph, kind, G, p));
              const Schedule s = make_schedule(a, ph, p, md, qp, kp);
              for (int64_t eb : {4, 8})
                for (int r = 0; r < G; ++r)
                  for (bool sent : {true, false}) {
                    int64_t steps = 0;
                    for (int t = 0; t < G; ++t) {
                      const int64_t x = schedule_bytes(s, r, sent, eb, t);
                      ASSERT_EQ(x, closed_form_bytes(a, ph, p, qp, kp, r, sent, eb, t)) << "rank " << r << " step " << t;
                      steps += x;
                    }
                    ASSERT_EQ(schedule_bytes(s, r, sent, eb), closed_form_bytes(a, ph, p, qp, kp, r, sent, eb));
                    ASSERT_EQ(steps, closed_form_bytes(a, ph, p, qp, kp, r, sent, eb));
                  }
            }
        }
}

TEST(Schedule, BurstBackwardMovesLessThanRingWithoutGqa) {
  // Per step (2 <= t <= G-2): ring 4 B H d n_k, burst B H (3d + 2) n_q: burst is less when d > 2.
  // The gradients' partial sums make G-1 hops: each rank sends every shard's but its own.
  const int G = 4;
  const Problem p = testutil::make_problem(1, 2, 2, 64, 64, 16, "none");
  const MaskData md = compile_mask(p);
  const Partition part = make_partition(PartitionKind::Contiguous, 64, G);
  for (int r = 0; r < G; ++r) {
    const int64_t ring = closed_form_bytes(Algo::Ring, Phase::Backward, p, part, part, r, true, 8);
    const int64_t burst = closed_form_bytes(Algo::Burst, Phase::Backward, p, part, part, r, true, 8);
    // ring: 2*2*16*(128-16-16) = 6144 elems; burst: 2*(34*(64-16) + 16*(64-16)) = 4800 elems
    EXPECT_EQ(ring, 6144 * 8);
    EXPECT_EQ(burst, 4800 * 8);
    EXPECT_EQ(closed_form_bytes(Algo::Ring, Phase::Forward, p, part, part, r, true, 8), 2 * 2 * 16 * 48 * 8);
  }
}

TEST(Schedule, TraceNamesStepsRanksAndTotals) {
  const Problem p = testutil::make_problem(1, 1, 1, 8, 8, 2, "causal");
  const MaskData md = compile_mask(p);
  const Partition part = make_partition(PartitionKind::Zigzag, 8, 2);
  const Schedule s = make_schedule(Algo::Burst, Phase::Backward, p, md, part, part);
  const std::string t = trace(s, p, part, part, 8);
  for (const char* want : {"burst backward", "step 0", "step 1", "rank 1:", "send Q,dO,D,LSE[shard 0] -> 1",
                           "then send dQ", "closed form", "blocks"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;
  // G = 2 has no partial sum in flight during a compute; G = 3 has one at step 2, the sum of
  // shard r - 1 finished at step 1 (rank 0: shard 2, to rank 1).
  EXPECT_EQ(t.find("send sum"), std::string::npos) << t;
  const Partition p3 = make_partition(PartitionKind::Zigzag, 12, 3);
  const Problem q = testutil::make_problem(1, 1, 1, 12, 12, 2, "causal");
  const std::string t3 = trace(make_schedule(Algo::Ring, Phase::Backward, q, compile_mask(q), p3, p3), q, p3, p3, 8);
  const size_t step2 = t3.find("step 2");
  ASSERT_NE(step2, std::string::npos) << t3;
  EXPECT_NE(t3.find("rank 0: compute", step2), std::string::npos) << t3;
  EXPECT_NE(t3.find("send sum dK,dV[shard 2] -> 1", step2), std::string::npos) << t3;
  EXPECT_NE(t3.find("recv sum dK,dV[shard 1] <- 2", step2), std::string::npos) << t3;
  EXPECT_EQ(t3.substr(0, step2).find("sum "), std::string::npos) << t3;
}
