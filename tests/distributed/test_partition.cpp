// Partitions (spec §7.1): bijection global <-> (rank, local), chunk shapes, errors.
#include <gtest/gtest.h>

#include <set>

#include "burstlab/error.hpp"
#include "partition.hpp"

using namespace burstlab;
using namespace burstlab::dist;

namespace {
const PartitionKind kKinds[] = {PartitionKind::Contiguous, PartitionKind::Zigzag, PartitionKind::Striped};
}

TEST(Partition, BijectionAndChunkShapes) {
  for (PartitionKind kind : kKinds)
    for (int G = 1; G <= 8; ++G)
      for (int64_t N : {int64_t(2 * G), int64_t(2 * G + 1), int64_t(17), int64_t(113), int64_t(203)}) {
        if (N < 2 * G) continue;
        SCOPED_TRACE(to_string(kind) + " G=" + std::to_string(G) + " N=" + std::to_string(N));
        const Partition p = make_partition(kind, N, G);
        // Every global position is held exactly once, and the maps invert each other.
        std::vector<int> seen(N, 0);
        int64_t total = 0;
        for (int r = 0; r < G; ++r) {
          total += p.local_size(r);
          for (int64_t l = 0; l < p.local_size(r); ++l) {
            const int64_t i = p.positions[r][l];
            ASSERT_GE(i, 0);
            ASSERT_LT(i, N);
            ++seen[i];
            EXPECT_EQ(p.owner_of[i], r);
            EXPECT_EQ(p.local_of[i], l);
          }
        }
        EXPECT_EQ(total, N);
        for (int64_t i = 0; i < N; ++i) EXPECT_EQ(seen[i], 1) << "position " << i;
        // Chunks: non-empty, sizes within one of each other, local runs consistent with positions.
        int64_t lo = N, hi = 0;
        for (const Chunk& c : p.chunks) {
          EXPECT_GE(c.n, 1);
          lo = std::min(lo, c.n);
          hi = std::max(hi, c.n);
          for (int64_t k = 0; k < c.n; ++k) EXPECT_EQ(p.positions[c.rank][c.local_start + k], c.global(k));
          const Positions pos = p.chunk_positions(c.id);
          ASSERT_EQ(pos.n, c.n);
          for (int64_t k = 0; k < c.n; ++k) EXPECT_EQ(pos[k], c.global(k));
        }
        EXPECT_LE(hi - lo, 1);
        if (kind == PartitionKind::Zigzag) {
          ASSERT_EQ(static_cast<int>(p.chunks.size()), 2 * G);
          for (int r = 0; r < G; ++r) EXPECT_EQ(p.rank_chunks[r], (std::vector<int>{r, 2 * G - 1 - r}));
        } else {
          ASSERT_EQ(static_cast<int>(p.chunks.size()), G);
        }
        if (kind == PartitionKind::Striped) {
          for (int r = 0; r < G; ++r)
            for (int64_t l = 0; l < p.local_size(r); ++l) EXPECT_EQ(p.positions[r][l], r + l * G);
        }
        if (kind == PartitionKind::Contiguous) {
          for (int r = 0; r < G; ++r) EXPECT_EQ(p.positions[r][0], r * N / G);
        }
      }
}

TEST(Partition, LengthsThatCannotBeSplitAreClearErrors) {
  try {
    make_partition(PartitionKind::Zigzag, 7, 4, "N_q");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("N_q (7)"), std::string::npos) << m;
    EXPECT_NE(m.find("zigzag"), std::string::npos) << m;
    EXPECT_NE(m.find("N_q >= 8"), std::string::npos) << m;
  }
  EXPECT_THROW(make_partition(PartitionKind::Contiguous, 2, 3), Error);
  EXPECT_THROW(make_partition(PartitionKind::Striped, 4, 5), Error);
  EXPECT_THROW(make_partition(PartitionKind::Contiguous, 10, 0), Error);
  EXPECT_NO_THROW(make_partition(PartitionKind::Striped, 5, 5));
  EXPECT_NO_THROW(make_partition(PartitionKind::Zigzag, 8, 4));
  EXPECT_THROW(parse_partition("zig"), Error);
  EXPECT_EQ(parse_partition("striped"), PartitionKind::Striped);
}
