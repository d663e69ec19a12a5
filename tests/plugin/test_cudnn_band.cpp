// tests/plugin/test_cudnn_band.cpp — plugins/cudnn/band.hpp on the host: the part of a block that
// cuDNN runs, under cuDNN's band, covers exactly the block's visible pairs (eq. 3.4), for random
// bands, block offsets and shapes, and the bounds are ones cuDNN accepts.
#include <gtest/gtest.h>

#include <random>

#include "band.hpp"
#include "burstlab/mask.hpp"

namespace burstlab::cudnn_plugin {
namespace {

MaskParams band_mask(int64_t N_q, int64_t N_k, int64_t left, int64_t right) {
  MaskParams m;
  m.N_q = N_q, m.N_k = N_k, m.left = left, m.right = right;
  return m;
}

// cuDNN's predicate on the cut block's local (i, j).
bool cudnn_sees(const Band& b, int64_t i, int64_t j) {
  if (b.none) return true;
  const int64_t diagonal = b.bottom_right ? i + b.k_n - b.q_n : i;
  return (b.right_bound < 0 || j <= diagonal + b.right_bound) && (b.left_bound < 0 || j > diagonal - b.left_bound);
}

// Every (i, j) of the block: visible under burstlab's mask iff inside the cut and seen by cuDNN.
// Returns the kind of block: 0 declined, 1 hidden, 2 every pair visible, 3 top-left, 4 bottom-right.
int expect_exact(const MaskParams& m, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  const Band b = band_of(m, q0, nq, k0, nk);
  SCOPED_TRACE(::testing::Message() << "N_q " << m.N_q << " N_k " << m.N_k << " left " << m.left << " right " << m.right
                                    << " block rows " << q0 << "+" << nq << " keys " << k0 << "+" << nk << " -> rows "
                                    << b.q_at << "+" << b.q_n << " keys " << b.k_at << "+" << b.k_n << " bounds "
                                    << b.left_bound << ", " << b.right_bound << (b.bottom_right ? " bottom-right" : ""));
  if (!b.declined.empty()) {
    EXPECT_GE(m.left, 0) << b.declined;  // only a window's cut can be taller than wide
    return 0;
  }
  if (b.hidden) {
    EXPECT_EQ(count_visible(m, q0, q0 + nq, k0, k0 + nk), 0);
    return 1;
  }
  EXPECT_GE(b.q_at, 0);
  EXPECT_LE(b.q_at + b.q_n, nq);
  EXPECT_GE(b.k_at, 0);
  EXPECT_LE(b.k_at + b.k_n, nk);
  EXPECT_GT(b.q_n, 0);
  EXPECT_GT(b.k_n, 0);
  if (!b.none && m.right >= 0) {
    EXPECT_GE(b.right_bound, 0);
  }
  if (!b.none && m.left >= 0) {
    EXPECT_GE(b.left_bound, 1);
    EXPECT_LE(b.q_n, b.k_n);
  }
  if (b.bottom_right) {
    EXPECT_LE(b.q_n, b.k_n);
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t j = 0; j < nk; ++j) {
      const bool inside = i >= b.q_at && i < b.q_at + b.q_n && j >= b.k_at && j < b.k_at + b.k_n;
      const bool seen = inside && cudnn_sees(b, i - b.q_at, j - b.k_at);
      wrong += seen != visible(m, q0 + i, k0 + j);
    }
  EXPECT_EQ(wrong, 0);
  return b.none ? 2 : b.bottom_right ? 4 : 3;
}

TEST(CudnnBand, CutBlockRunsExactlyTheVisiblePairs) {
  std::mt19937_64 rng(7);
  const auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int kinds[5] = {0, 0, 0, 0, 0};
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t N_q = pick(1, 70), N_k = pick(1, 70);
    const int64_t left = pick(0, 3) == 0 ? -1 : pick(0, 24), right = pick(0, 3) == 0 ? -1 : pick(0, 24);
    const int64_t q0 = pick(0, N_q - 1), k0 = pick(0, N_k - 1);
    ++kinds[expect_exact(band_mask(N_q, N_k, left, right), q0, pick(1, N_q - q0), k0, pick(1, N_k - k0))];
  }
  for (int kind = 0; kind < 5; ++kind) EXPECT_GE(kinds[kind], 40) << "kind " << kind << " (see expect_exact)";
}

// The blocks cuDNN declined before the cut (seen on 2 GPUs under ring, allgather and usp), and a
// causal problem with more queries than keys whose first rows see no key.
TEST(CudnnBand, BlocksOnceDeclined) {
  const MaskParams causal_lt = band_mask(36, 75, -1, 0);  // rows 0..17, keys 38..74: offset 1
  expect_exact(causal_lt, 0, 18, 38, 37);
  const Band shifted = band_of(causal_lt, 0, 18, 38, 37);  // top-left, right bound = offset
  EXPECT_FALSE(shifted.none);
  EXPECT_EQ(shifted.k_n, 19);  // keys 38 + 19.. are seen by no row: cut, which aligns the band
  EXPECT_TRUE(shifted.bottom_right);  // bottom-right in the 18 x 19 rest
  EXPECT_EQ(shifted.right_bound, 0);
  expect_exact(band_mask(96, 96, 60, 0), 48, 48, 0, 48);  // window below the diagonal: offset 48
  expect_exact(band_mask(96, 96, 60, 4), 0, 48, 48, 48);  // window above: rows that see nothing cut
  const Band tall = band_of(band_mask(1500, 1000, -1, 0), 0, 1500, 0, 1000);  // N_q > N_k causal
  EXPECT_EQ(tall.q_at, 500);
  EXPECT_EQ(tall.q_n, 1000);
  EXPECT_FALSE(tall.bottom_right);
  EXPECT_EQ(tall.right_bound, 0);
  expect_exact(band_mask(150, 100, -1, 0), 0, 150, 0, 100);
}

}  // namespace
}  // namespace burstlab::cudnn_plugin
