// Mask semantics (spec §3) against brute-force expectations written straight from the equations:
// band bottom-right alignment (3.1) for N_q < N_k and N_q > N_k, per-document alignment (3.3) with
// documents of different q/k lengths, the block mask (3.5), and count_visible / any_visible.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "harness.hpp"

namespace burstlab {
namespace {

// eq. (3.1) directly: diag = i + (N_k - N_q); left <= -1 / right <= -1 mean unbounded.
bool band_brute(int64_t i, int64_t j, int64_t N_q, int64_t N_k, int64_t left, int64_t right) {
  const int64_t diag = i + (N_k - N_q);
  if (left >= 0 && j < diag - left) return false;
  if (right >= 0 && j > diag + right) return false;
  return true;
}

// eq. (3.2)-(3.3) and (3.5) directly from the MaskSpec (not through RowDoc / row_range).
bool visible_brute(const MaskSpec& m, int64_t N_q, int64_t N_k, int64_t i, int64_t j) {
  const int64_t left = band_left(m), right = band_right(m);
  if (has_document(m)) {
    const int32_t s = m.q_segment[i];
    if (m.k_segment[j] != s) return false;
    int64_t q0 = 0, nq = 0, k0 = 0, nk = 0;
    for (int64_t x = 0; x < N_q; ++x)
      if (m.q_segment[x] == s) { if (nq == 0) q0 = x; ++nq; }
    for (int64_t x = 0; x < N_k; ++x)
      if (m.k_segment[x] == s) { if (nk == 0) k0 = x; ++nk; }
    if (!band_brute(i - q0, j - k0, nq, nk, left, right)) return false;
  } else if (!band_brute(i, j, N_q, N_k, left, right)) {
    return false;
  }
  if (has_block(m)) {
    const int64_t nbk = (N_k + m.block_k - 1) / m.block_k;
    if (!m.block_mask[(i / m.block_q) * nbk + j / m.block_k]) return false;
  }
  return true;
}

void expect_matches_brute(const MaskSpec& m, int64_t N_q, int64_t N_k, const std::string& what) {
  Problem p;
  p.N_q = N_q; p.N_k = N_k; p.mask = m;
  const MaskData md = compile_mask(p);
  const MaskParams mp = md.params();
  int64_t n = 0;
  for (int64_t i = 0; i < N_q; ++i)
    for (int64_t j = 0; j < N_k; ++j) {
      const bool want = visible_brute(m, N_q, N_k, i, j);
      n += want;
      ASSERT_EQ(visible(mp, i, j), want) << what << " i=" << i << " j=" << j << " N_q=" << N_q << " N_k=" << N_k;
    }
  EXPECT_EQ(visible_pairs(p), n) << what;
}

TEST(Mask, SpecExamples) {
  // §3.1 pictures: causal 3x5, causal 5x3, window(1,0) 4x4.
  auto pic = [](int64_t N_q, int64_t N_k, MaskSpec m) {
    Problem p;
    p.N_q = N_q; p.N_k = N_k; p.mask = m;
    const MaskData md = compile_mask(p);
    std::string s;
    for (int64_t i = 0; i < N_q; ++i) {
      for (int64_t j = 0; j < N_k; ++j) s += visible(md.params(), i, j) ? 'x' : '.';
      s += '\n';
    }
    return s;
  };
  MaskSpec causal;
  causal.causal = true;
  EXPECT_EQ(pic(3, 5, causal), "xxx..\nxxxx.\nxxxxx\n");
  EXPECT_EQ(pic(5, 3, causal), "...\n...\nx..\nxx.\nxxx\n");
  MaskSpec w;
  w.window_left = 1; w.window_right = 0;
  EXPECT_EQ(pic(4, 4, w), "x...\nxx..\n.xx.\n..xx\n");
  // §3.4: causal, document A (3 queries, 2 keys), document B (2 queries, 3 keys).
  MaskSpec d;
  d.causal = true;
  d.q_segment = {0, 0, 0, 1, 1};
  d.k_segment = {0, 0, 1, 1, 1};
  EXPECT_EQ(pic(5, 5, d), ".....\nx....\nxx...\n..xx.\n..xxx\n");
}

TEST(Mask, BandBottomRightAlignment) {
  for (auto [N_q, N_k] : {std::pair<int64_t, int64_t>{3, 11}, {11, 3}, {7, 7}, {1, 9}, {9, 1}, {1, 1}})
    for (int64_t left : {-1, 0, 1, 3, 20})
      for (int64_t right : {-1, 0, 2, 20})
        for (bool causal : {false, true}) {
          MaskSpec m;
          m.causal = causal; m.window_left = left; m.window_right = right;
          expect_matches_brute(m, N_q, N_k, describe(m));
        }
}

TEST(Mask, DocumentsWithDifferentLengths) {
  // Documents: 0 (3 q, 5 k), 1 (4 q, 1 k), 2 (0 q, 2 k), 3 (2 q, 0 k: empty rows), 4 (1 q, 3 k).
  MaskSpec base;
  base.q_segment = {0, 0, 0, 1, 1, 1, 1, 3, 3, 4};
  base.k_segment = {0, 0, 0, 0, 0, 1, 2, 2, 4, 4, 4};
  for (int64_t left : {-1, 0, 2})
    for (int64_t right : {-1, 0, 1})
      for (bool causal : {false, true}) {
        MaskSpec m = base;
        m.causal = causal; m.window_left = left; m.window_right = right;
        expect_matches_brute(m, 10, 11, describe(m));
      }
  // The document-3 rows are empty whatever the band.
  Problem p;
  p.N_q = 10; p.N_k = 11; p.mask = base;
  const MaskData md = compile_mask(p);
  EXPECT_FALSE(any_visible(md.params(), 7, 9, 0, 11));
}

TEST(Mask, Block) {
  MaskSpec m;
  m.block_q = 3; m.block_k = 4;  // 7 x 10 -> 3 x 3 blocks, ragged last ones
  m.block_mask = {1, 0, 1, 0, 0, 0, 1, 1, 0};
  expect_matches_brute(m, 7, 10, "block");
  m.causal = true;
  expect_matches_brute(m, 7, 10, "block+causal");
  m.q_segment = {0, 0, 0, 1, 1, 1, 1};
  m.k_segment = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  expect_matches_brute(m, 7, 10, "block+causal+doc");
}

// Random generated masks (make_mask) against the brute force, and count_visible / any_visible
// against brute-force counts on random rectangles.
TEST(Mask, RandomMasksAndRectangles) {
  std::mt19937_64 rng(12345);
  const char* specs[] = {"none", "causal", "window:2,1", "window:-1,3", "document:3", "block:2x3@0.6",
                         "causal+document:4", "window:3,0+block:3x2", "causal+document:2+block:2x2@0.7",
                         "window:1,1+document:5+block:1x3@0.5"};
  for (int rep = 0; rep < 12; ++rep)
    for (const char* spec : specs) {
      const int64_t N_q = std::uniform_int_distribution<int64_t>(1, 19)(rng);
      const int64_t N_k = std::uniform_int_distribution<int64_t>(1, 19)(rng);
      const MaskSpec m = make_mask(spec, N_q, N_k, rng());
      expect_matches_brute(m, N_q, N_k, spec);
      Problem p;
      p.N_q = N_q; p.N_k = N_k; p.mask = m;
      const MaskData md = compile_mask(p);
      const MaskParams mp = md.params();
      for (int r = 0; r < 20; ++r) {
        int64_t i0 = std::uniform_int_distribution<int64_t>(0, N_q)(rng), i1 = std::uniform_int_distribution<int64_t>(0, N_q)(rng);
        int64_t j0 = std::uniform_int_distribution<int64_t>(0, N_k)(rng), j1 = std::uniform_int_distribution<int64_t>(0, N_k)(rng);
        if (i0 > i1) std::swap(i0, i1);
        if (j0 > j1) std::swap(j0, j1);
        int64_t n = 0;
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < j1; ++j) n += visible_brute(m, N_q, N_k, i, j);
        ASSERT_EQ(count_visible(mp, i0, i1, j0, j1), n) << spec << " [" << i0 << "," << i1 << ")x[" << j0 << "," << j1 << ")";
        ASSERT_EQ(any_visible(mp, i0, i1, j0, j1), n > 0) << spec;
      }
    }
}

TEST(Mask, FlopsCountVisiblePairs) {
  Problem p;
  p.B = 2; p.H_q = 4; p.H_kv = 2; p.N_q = 3; p.N_k = 5; p.d = 8;
  p.mask.causal = true;  // 3 + 4 + 5 = 12 visible pairs
  EXPECT_EQ(visible_pairs(p), 12);
  EXPECT_DOUBLE_EQ(forward_flops(p), 4.0 * 2 * 4 * 12 * 8);
  EXPECT_DOUBLE_EQ(backward_flops(p), 2.5 * forward_flops(p));
}

}  // namespace
}  // namespace burstlab
