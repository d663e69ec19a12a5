// cuda/tile_scheduler.cuh — the order in which v4's persistent forward grid takes its work items
// (v4_fwd.cu). An item is one query tile of one (b, h); there are n_bh nqt of them
// (n_bh = B H_q). Item k of the plain order is (b, h) = k / nqt, rank k % nqt, rank 0 being the
// (b, h)'s LAST query tile: a (b, h)'s longest tiles come first under a causal mask. The tail,
// the items of the last n_tail (b, h), goes by turns among them, all their last tiles first, then
// all the tiles before, so that the kernel ends on short items (largest first, as in LPT
// scheduling) rather than on the long ones of its last (b, h). A CTA's first item is blockIdx.x;
// each next one is gridDim.x plus a fetch-and-add on a counter zeroed before the launch, so the
// items are handed out in index order whatever the CTAs' speeds. Host and device: the host
// sizes the grid and the tail; tests/cuda/test_cuda_variants.cpp checks the order on the CPU.
#pragma once

#include <cstdint>

#include "burstlab/hd.hpp"

namespace burstlab::cuda::sched {

struct TileOrder {
  int nqt;      // query tiles per (b, h)
  int n_tail;   // (b, h) in the tail, 1 .. n_bh
  int bh_tail;  // the tail's first (b, h)
  int tail0;    // the tail's first item
};
BURSTLAB_HD TileOrder tile_order(int n_bh, int nqt, int n_tail) {
  return {nqt, n_tail, n_bh - n_tail, (n_bh - n_tail) * nqt};
}

struct Tile {
  int bh;  // b H_q + h
  int qt;  // query tile
};
// Item k's (b, h) and query tile, 0 <= k < n_bh nqt.
BURSTLAB_HD Tile tile_of(const TileOrder& o, int item) {
  int bh = item / o.nqt, rank = item % o.nqt;  // rank 0: the (b, h)'s last query tile
  if (item >= o.tail0) {  // the tail: its (b, h) by turns, all their last tiles first
    bh = o.bh_tail + (item - o.tail0) % o.n_tail;
    rank = (item - o.tail0) / o.n_tail;
  }
  return {bh, o.nqt - 1 - rank};
}

// CTAs of the persistent grid: as many as fit at once (sms per_sm), at most knob when knob > 0,
// one per item when knob < 0 (a non-persistent launch), never more than there are items.
inline int64_t grid_size(int64_t items, int sms, int per_sm, int knob) {
  int64_t grid = knob < 0 ? items : int64_t(sms) * (per_sm > 0 ? per_sm : 1);
  if (knob > 0 && knob < grid) grid = knob;
  if (grid > items) grid = items;
  return grid;
}

// (b, h) in the tail: enough for about two waves of the grid (knob 0), the last knob (knob > 0),
// or 1 (knob < 0: a tail of one (b, h) is the plain order); at most n_bh.
inline int64_t tail_size(int64_t grid, int64_t nqt, int64_t n_bh, int knob) {
  int64_t n_tail = knob < 0 ? 1 : knob > 0 ? knob : (2 * grid + nqt - 1) / nqt;
  if (n_tail > n_bh) n_tail = n_bh;
  return n_tail;
}

#if defined(__CUDACC__)
// The item after the CTA's current one: gridDim.x + a fetch-and-add on *next, or n_items (the
// end) when the grid covers every item, in which case `next` is never read (it may be null).
__device__ __forceinline__ int fetch_item(int n_items, int* next) {
  return int(gridDim.x) >= n_items ? n_items : int(gridDim.x) + atomicAdd(next, 1);
}
#endif

}  // namespace burstlab::cuda::sched
