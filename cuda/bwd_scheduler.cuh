// cuda/bwd_scheduler.cuh — the order in which v9's dK/dV grid takes its CTAs (v9_bwd.cu): an
// item is one key tile of kRows keys of one (b, kv-head) pair, and its work is the number of
// query rows that see some key of the tile (the consumers' loop visits their query tiles).
//
// Under a band mask (spec §3: row i sees keys [diag(i) - left, diag(i) + right], diag(i) = i +
// N_k - N_q) the rows that see key tile t are [u - A, u + B) clipped to [0, n_q), u = kRows t: the
// work rises by kRows rows per tile, stays level on a plateau, then falls by kRows per tile
// (causal: plateau then fall; none: all plateau). A pair's tiles in decreasing work are therefore
// the plateau's, then the tiles beside it taken from both sides by turns, nearest first, the side
// that loses less first: exact LPT on the rows for full tiles (a ragged last tile sees no fewer
// query tiles than the estimate says when the band's right side bounds it; its left side is
// counted from the tile's nominal last key). Document masks and indexed positions (whose work
// this cannot see) keep the plain order, as do masks with no band edge.
//
// Pairs come one after another (consecutive CTAs share the pair's Q and dO in L2: interleaving
// every pair lost more in L2 than it gained, docs/performance-gpu.md), each heaviest first,
// except a tail of the last n_tail pairs that take turns, all their heaviest tiles first, so
// that the grid ends on light items rather than on the heavy first tiles of its last pair.
// Host and device: the launcher computes the order, each CTA maps its blockIdx.x through
// key_item; tests/cuda/test_cuda_variants.cpp checks the mapping on the CPU.
#pragma once

#include <cstdint>

#include "burstlab/hd.hpp"

namespace burstlab::cuda::sched {

struct KeyOrder {
  int nkb;      // key tiles per pair
  int p0, p1;   // the plateau's tiles [p0, p1); 0 <= p0 <= p1 <= nkb
  bool left_first;  // beside the plateau, tile p0 - 1 before tile p1
  int n_pairs;  // B H_kv
  int n_tail;   // pairs in the tail, 1 .. n_pairs (1: the plain order, pair after pair)
  int tail0;    // the tail's first item
};

// "No band edge": a side without a bound (left or right < 0).
constexpr int64_t kUnbounded = int64_t(1) << 61;

BURSTLAB_HD int64_t floor_div(int64_t x, int64_t y) {  // y > 0
  return x >= 0 ? x / y : -((-x + y - 1) / y);
}

// Sets o.p0, o.p1 and o.left_first (o.nkb set) for the band.
BURSTLAB_HD void band_plateau(KeyOrder& o, int64_t n_q, int64_t N_q, int64_t N_k, int64_t q0, int64_t k0,
                              int64_t left, int64_t right, int rows) {
  // Local rows that see some key of the tile at u = rows t: [u - A, u + B) clipped to [0, n_q).
  const int64_t off = N_k - N_q + q0 - k0;
  const int64_t A = right < 0 ? kUnbounded : right + off;
  const int64_t B = left < 0 ? kUnbounded : rows + left - off;
  // The work is largest for u in [U0, U1] (both edges unclipped if A + B <= n_q, else both clipped).
  const int64_t nb = n_q - B;
  const int64_t U0 = A < nb ? A : nb, U1 = A < nb ? nb : A;
  int64_t p0 = U0 <= 0 ? 0 : floor_div(U0 + rows - 1, rows);
  int64_t p1 = U1 >= int64_t(o.nkb) * rows ? o.nkb : floor_div(U1, rows) + 1;
  if (p0 > o.nkb) p0 = o.nkb;
  if (p1 < p0) p1 = p0;
  if (p1 > o.nkb) p1 = o.nkb;
  o.p0 = static_cast<int>(p0);
  o.p1 = static_cast<int>(p1);
  // Rows lost by the nearest tile on each side (when both exist, U0 and U1 are finite).
  if (o.p0 > 0 && o.p1 < o.nkb) o.left_first = U0 - int64_t(o.p0 - 1) * rows <= int64_t(o.p1) * rows - U1;
}

// The order of n_pairs pairs' key tiles of `rows` keys: n_q rows (local i at global q0 + i)
// against n_k keys (local j at global k0 + j) under the band (left, right; -1: unbounded) of a
// problem with lengths N_q, N_k; flat: the work is not a band's (document mask, indexed
// positions), every tile on the plateau. The tail: knob > 0 the last knob pairs, knob < 0 none
// (the plain order), knob = 0 enough pairs for about two waves of `resident` CTAs, none when
// every tile is on the plateau (equal items: nothing to balance, and L2 keeps the plain order).
BURSTLAB_HD KeyOrder key_order(int64_t n_q, int64_t n_k, int64_t N_q, int64_t N_k, int64_t q0, int64_t k0,
                               int64_t left, int64_t right, bool flat, int rows, int n_pairs, int64_t resident,
                               int knob) {
  KeyOrder o;
  o.nkb = static_cast<int>((n_k + rows - 1) / rows);
  o.n_pairs = n_pairs;
  o.p0 = 0;
  o.p1 = o.nkb;
  o.left_first = true;
  if (!flat) band_plateau(o, n_q, N_q, N_k, q0, k0, left, right, rows);
  const bool level = o.p0 == 0 && o.p1 == o.nkb;
  int64_t t = knob < 0 ? 1 : knob > 0 ? knob : level ? 1 : (2 * resident + o.nkb - 1) / o.nkb;
  if (t > n_pairs) t = n_pairs;
  if (t < 1) t = 1;
  o.n_tail = static_cast<int>(t);
  o.tail0 = (n_pairs - o.n_tail) * o.nkb;
  return o;
}

// A pair's tile of rank r (0: the heaviest), 0 <= r < nkb.
BURSTLAB_HD int key_tile_of_rank(const KeyOrder& o, int r) {
  const int np = o.p1 - o.p0;
  if (r < np) return o.p0 + r;
  const int k = r - np, nl = o.p0, nr = o.nkb - o.p1, m = nl < nr ? nl : nr;
  if (k < 2 * m) return ((k & 1) == 0) == o.left_first ? o.p0 - 1 - k / 2 : o.p1 + k / 2;
  return nl > nr ? o.p0 - 1 - (k - m) : o.p1 + (k - m);
}

struct KeyItem {
  int pair;  // b H_kv + kv-head
  int kt;    // key tile
};
// Item k's pair and key tile, 0 <= k < n_pairs nkb.
BURSTLAB_HD KeyItem key_item(const KeyOrder& o, int item) {
  int pair = item / o.nkb, rank = item % o.nkb;
  if (item >= o.tail0) {  // the tail: its pairs by turns, rank by rank
    pair = o.n_pairs - o.n_tail + (item - o.tail0) % o.n_tail;
    rank = (item - o.tail0) / o.n_tail;
  }
  return {pair, key_tile_of_rank(o, rank)};
}

}  // namespace burstlab::cuda::sched
