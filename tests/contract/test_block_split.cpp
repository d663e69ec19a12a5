// A block over position progressions as contiguous blocks (block_split.hpp, spec §6.1, eq. 3.4):
// for zigzag and striped shards, gathered shards and grid rows, ragged lengths, N_q != N_k both
// ways, causal, windows on either side and none, every (row, key) pair of every part is checked
// against the mask on the original global positions, and the parts must tile the block exactly.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "burstlab/block_split.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"

namespace burstlab {
namespace {

// Positions of G shards of [0, N): zigzag (2G chunks, shard r holds chunks r and 2G-1-r),
// striped (shard r holds r, r + G, ...), contiguous; ragged when G does not divide N.
std::vector<std::vector<int64_t>> shards(const std::string& kind, int64_t N, int G) {
  std::vector<std::vector<int64_t>> s(G);
  if (kind == "striped") {
    for (int64_t i = 0; i < N; ++i) s[i % G].push_back(i);
    return s;
  }
  const int C = kind == "zigzag" ? 2 * G : G;
  for (int c = 0; c < C; ++c) {
    const int r = kind == "zigzag" && c >= G ? 2 * G - 1 - c : c % G;
    for (int64_t i = N * c / C; i < N * (c + 1) / C; ++i) s[r].push_back(i);
  }
  return s;
}
std::vector<int64_t> concat(const std::vector<std::vector<int64_t>>& s, const std::vector<int>& ranks) {
  std::vector<int64_t> v;
  for (int r : ranks) v.insert(v.end(), s[r].begin(), s[r].end());
  return v;
}

MaskParams band(int64_t N_q, int64_t N_k, int64_t left, int64_t right) {
  MaskParams m;
  m.N_q = N_q;
  m.N_k = N_k;
  m.left = left;
  m.right = right;
  return m;
}

// Every pair of every part against the mask on global positions; the parts cover each pair once.
void expect_exact(const MaskParams& m, const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                  const std::vector<BlockPart>& parts, const std::string& what) {
  const Positions qp{0, int64_t(q.size()), q.data()}, kp{0, int64_t(k.size()), k.data()};
  std::vector<int> covered(q.size() * k.size(), 0);
  int64_t wrong = 0;
  for (const BlockPart& b : parts) {
    if (b.local) {  // the part's own problem is valid and compiles to the same band
      Problem p;
      p.N_q = 1; p.N_k = 1;
      const Problem pp = part_problem(p, b);
      ASSERT_NO_THROW(validate(pp)) << what;
      const MaskData md = compile_mask(pp);
      EXPECT_EQ(md.base.left, b.mask.left) << what;
      EXPECT_EQ(md.base.right, b.mask.right) << what;
      EXPECT_EQ(md.base.N_q, b.mask.N_q) << what;
      EXPECT_LE(b.q_pos.start + b.q_n, b.mask.N_q) << what;
      EXPECT_LE(b.k_pos.start + b.k_n, b.mask.N_k) << what;
    }
    for (int64_t r = 0; r < b.q_n; ++r)
      for (int64_t c = 0; c < b.k_n; ++c) {
        const int64_t i = b.q_at + r, j = b.k_at + c;
        ++covered[size_t(i) * k.size() + size_t(j)];
        const bool want = visible(m, qp[i], kp[j]);
        const bool got = !b.hidden && visible(b.mask, b.q_pos[r], b.k_pos[c]);
        wrong += want != got;
      }
  }
  EXPECT_EQ(wrong, 0) << what;
  for (size_t x = 0; x < covered.size(); ++x)
    if (covered[x] != 1) {
      ADD_FAILURE() << what << ": pair (" << x / k.size() << ", " << x % k.size() << ") covered " << covered[x]
                    << " times";
      break;
    }
}

TEST(BlockSplit, Progressions) {
  const std::vector<int64_t> v = {4, 5, 6, 10, 12, 14, 3, 7};
  const std::vector<Progression> g = progressions(Positions{0, int64_t(v.size()), v.data()});
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].pos, 4); EXPECT_EQ(g[0].stride, 1); EXPECT_EQ(g[0].n, 3); EXPECT_EQ(g[0].at, 0);
  EXPECT_EQ(g[1].pos, 10); EXPECT_EQ(g[1].stride, 2); EXPECT_EQ(g[1].n, 3); EXPECT_EQ(g[1].at, 3);
  EXPECT_EQ(g[2].pos, 3); EXPECT_EQ(g[2].stride, 4); EXPECT_EQ(g[2].n, 2); EXPECT_EQ(g[2].at, 6);
  const std::vector<Progression> c = progressions(contiguous(7, 300));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].pos, 7); EXPECT_EQ(c[0].n, 300); EXPECT_EQ(c[0].stride, 1);
}

// The schedules' blocks: a shard's queries against gathered keys (all-gather), gathered against
// gathered (Ulysses), a grid row against a grid column (Attention2D), shard against shard (rings).
TEST(BlockSplit, SchedulesBlocksMatchTheMaskExactly) {
  std::mt19937_64 gen(20261126);
  int checked_local = 0, checked_global = 0, hidden = 0;
  const std::vector<std::pair<int64_t, int64_t>> lengths = {{1024, 1024}, {1031, 1031}, {700, 1300}, {1300, 700}};
  for (const std::string kind : {"zigzag", "striped", "contiguous"})
    for (int G : {2, 3, 4})
      for (auto [N_q, N_k] : lengths) {
        const auto sq = shards(kind, N_q, G), sk = shards(kind, N_k, G);
        std::vector<int> all(G);
        for (int r = 0; r < G; ++r) all[r] = r;
        const int r = int(gen() % G), r2 = int(gen() % G);
        const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> blocks = {
            {sq[r], concat(sk, all)}, {concat(sq, all), concat(sk, all)}, {sq[r], sk[r2]},
            {concat(sq, {0, G - 1}), concat(sk, {r2})}};
        // causal; sliding windows on one side, both sides, narrower than G; none
        const std::vector<std::pair<int64_t, int64_t>> bands = {
            {-1, 0}, {int64_t(gen() % 300), 0}, {-1, int64_t(gen() % 200)}, {int64_t(gen() % 50), int64_t(gen() % 50)},
            {1, 0}, {0, 0}, {-1, -1}};
        for (const auto& [q, k] : blocks)
          for (auto [left, right] : bands) {
            const MaskParams m = band(N_q, N_k, left, right);
            const std::vector<BlockPart> parts =
                split_block(m, Positions{0, int64_t(q.size()), q.data()}, Positions{0, int64_t(k.size()), k.data()});
            const std::string what = kind + " G=" + std::to_string(G) + " N_q=" + std::to_string(N_q) +
                                     " N_k=" + std::to_string(N_k) + " band(" + std::to_string(left) + "," +
                                     std::to_string(right) + ") q.n=" + std::to_string(q.size()) +
                                     " k.n=" + std::to_string(k.size());
            if (parts.empty()) continue;  // declined (checked below where it must split)
            expect_exact(m, q, k, parts, what);
            for (const BlockPart& b : parts) (b.hidden ? hidden : b.local ? checked_local : checked_global) += 1;
          }
      }
  // The sweep must exercise every kind of part, or it proves nothing.
  EXPECT_GT(checked_local, 100);
  EXPECT_GT(checked_global, 100);
  EXPECT_GT(hidden, 20);
}

TEST(BlockSplit, SplitsWhatTheSchedulesBuild) {
  const auto zq = shards("zigzag", 4096, 2), sq = shards("striped", 4096, 4);
  const std::vector<int64_t> zk = concat(zq, {0, 1}), sk = concat(sq, {0, 1, 2, 3});
  const MaskParams causal = band(4096, 4096, -1, 0);
  // zigzag gathered, chunks 0 3 | 1 2: 3 runs of stride 1 (chunks 1 and 2 meet) against the shard's 2
  EXPECT_EQ(split_block(causal, Positions{0, 2048, zq[0].data()}, Positions{0, 4096, zk.data()}).size(), 6u);
  // striped gathered: 4 progressions of stride 4 against the shard's 1
  EXPECT_EQ(split_block(causal, Positions{0, 1024, sq[1].data()}, Positions{0, 4096, sk.data()}).size(), 4u);
}

TEST(BlockSplit, DeclinesWhatItCannotExpress) {
  const auto sq = shards("striped", 4096, 4), s2 = shards("striped", 4096, 2);
  const MaskParams causal = band(4096, 4096, -1, 0);
  // strides 4 and 2 differ
  EXPECT_TRUE(split_block(causal, Positions{0, 1024, sq[0].data()}, Positions{0, 2048, s2[1].data()}).empty());
  // too short a progression on average (fewer than kMinRows rows), too many progressions
  const std::vector<int64_t> short_q = {0, 1, 2, 10, 11, 12};
  EXPECT_TRUE(split_block(causal, Positions{0, 6, short_q.data()}, contiguous(0, 4096)).empty());
  std::vector<int64_t> many;
  for (int64_t c = 0; c < 64; ++c)
    for (int64_t i = 0; i < 128; ++i) many.push_back((63 - c) * 128 + i);
  EXPECT_TRUE(split_block(causal, contiguous(0, 4096), Positions{0, int64_t(many.size()), many.data()}).empty());
  // stride > 1 under a document or block-sparse mask: not a band in local indices
  MaskParams doc = causal;
  const RowDoc rd{};
  doc.doc = &rd;
  EXPECT_TRUE(split_block(doc, Positions{0, 1024, sq[0].data()}, Positions{0, 1024, sq[1].data()}).empty());
  MaskParams blk = causal;
  const uint8_t cell = 1;
  blk.block = &cell;
  EXPECT_TRUE(split_block(blk, Positions{0, 1024, sq[0].data()}, Positions{0, 1024, sq[1].data()}).empty());
  // stride-1 runs keep the block's own mask, document included
  const auto zq = shards("zigzag", 4096, 2);
  const std::vector<BlockPart> parts = split_block(doc, Positions{0, 2048, zq[0].data()}, contiguous(0, 4096));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_FALSE(parts[0].local);
  EXPECT_EQ(parts[0].mask.doc, &rd);
}

}  // namespace
}  // namespace burstlab
