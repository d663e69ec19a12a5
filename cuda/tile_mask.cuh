// cuda/tile_mask.cuh — which key tiles (query tiles) a CTA visits and which of them need the
// per-element predicate, shared by the tensor-core variants (v2, v3). Spec §3: masks are
// predicates on global positions; eq. 3.4 gives each query row's visible key interval, the
// block bitmap refines it. Internal; include from .cu only.
#pragma once

#include <climits>
#include <cstdint>

#include "detail.cuh"
#include "mma.cuh"

namespace burstlab::cuda::detail::tiles {

// The CTA's key facts from every thread's rows (local key indices): the hull [lo, hi) of keys
// any row sees, and [full_lo, full_hi), the keys every row sees. Each thread passes the facts of
// its own rows (empty: INT_MAX, INT_MIN, INT_MIN, INT_MAX); a block-wide barrier inside.
struct Hull {
  int lo, hi, full_lo, full_hi;
};
// The facts reduced over a warp (every lane gets the result; no barrier).
__device__ __forceinline__ Hull warp_hull(Hull h) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    h.lo = min(h.lo, __shfl_xor_sync(0xffffffffu, h.lo, o));
    h.hi = max(h.hi, __shfl_xor_sync(0xffffffffu, h.hi, o));
    h.full_lo = max(h.full_lo, __shfl_xor_sync(0xffffffffu, h.full_lo, o));
    h.full_hi = min(h.full_hi, __shfl_xor_sync(0xffffffffu, h.full_hi, o));
  }
  return h;
}
template <int kWarps>
__device__ __forceinline__ Hull cta_hull(int hlo, int hhi, int flo, int fhi, int (&red)[4][kWarps]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Hull w = warp_hull(Hull{hlo, hhi, flo, fhi});
  if (lane == 0) { red[0][warp] = w.lo; red[1][warp] = w.hi; red[2][warp] = w.full_lo; red[3][warp] = w.full_hi; }
  __syncthreads();
  Hull h{INT_MAX, INT_MIN, INT_MIN, INT_MAX};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    h.lo = min(h.lo, red[0][w]); h.hi = max(h.hi, red[1][w]);
    h.full_lo = max(h.full_lo, red[2][w]); h.full_hi = min(h.full_hi, red[3][w]);
  }
  return h;
}

// Adds one row's local interval [lo, hi) to a thread's facts (rows past nq are not passed).
__device__ __forceinline__ void add_row(int64_t lo, int64_t hi, int* hlo, int* hhi, int* flo, int* fhi) {
  if (lo < hi) { *hlo = min(*hlo, int(lo)); *hhi = max(*hhi, int(hi)); }
  *flo = max(*flo, int(lo));
  *fhi = min(*fhi, int(hi));
}

// Forward: the local key interval [lo, hi) of row r (eq. 3.4; all keys when the keys are
// indexed, kidx, and for rows past nq, which are never stored).
template <class T>
__device__ __forceinline__ int2 fwd_row_interval(const FwdArgs<T>& a, int64_t r, bool kidx) {
  int64_t lo = 0, hi = a.nk;
  if (!kidx && r < a.nq) local_range(a.mask, a.qp[r], a.kp, a.nk, &lo, &hi);
  return make_int2(static_cast<int>(lo), static_cast<int>(hi));
}

// Forward: the local key intervals [llo, lhi) of a thread's rows r0, r0 + 8.
template <class T>
__device__ __forceinline__ void fwd_row_intervals(const FwdArgs<T>& a, int64_t r0, bool kidx, int (&llo)[2],
                                                  int (&lhi)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int2 iv = fwd_row_interval(a, r0 + 8 * ri, kidx);
    llo[ri] = iv.x;
    lhi[ri] = iv.y;
  }
}

// Forward: fwd_row_intervals and the CTA's hull over every thread (a block-wide barrier inside).
template <int kWarps, class T>
__device__ __forceinline__ Hull fwd_rows(const FwdArgs<T>& a, int64_t r0, bool kidx, int (&red)[4][kWarps],
                                         int (&llo)[2], int (&lhi)[2]) {
  fwd_row_intervals(a, r0, kidx, llo, lhi);
  int hlo = INT_MAX, hhi = INT_MIN, flo = INT_MIN, fhi = INT_MAX;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri)
    if (r0 + 8 * ri < a.nq) add_row(llo[ri], lhi[ri], &hlo, &hhi, &flo, &fhi);
  Hull hull = cta_hull<kWarps>(hlo, hhi, flo, fhi, red);
  if (kidx) { hull.full_lo = INT_MAX; hull.full_hi = INT_MIN; }  // indexed keys: predicate everywhere
  return hull;
}

// Forward, one warp alone (v4's producer): the hull of query rows [r0, r0 + ROWS) (local), each
// lane taking every 32nd row; no barrier. Same facts as fwd_rows' hull. Also stores every row's
// interval (fwd_row_interval) in rows[0, ROWS), so that the consumers need not work them out
// again.
template <int ROWS, class T>
__device__ __forceinline__ Hull fwd_rows_warp(const FwdArgs<T>& a, int64_t r0, bool kidx, int2* rows) {
  int hlo = INT_MAX, hhi = INT_MIN, flo = INT_MIN, fhi = INT_MAX;
  const int lane = threadIdx.x % 32;
#pragma unroll 1
  for (int u = 0; u < ROWS / 32; ++u) {
    const int64_t r = r0 + u * 32 + lane;
    const int2 iv = fwd_row_interval(a, r, kidx);
    rows[u * 32 + lane] = iv;
    if (r < a.nq) add_row(iv.x, iv.y, &hlo, &hhi, &flo, &fhi);
  }
  Hull hull = warp_hull(Hull{hlo, hhi, flo, fhi});
  if (kidx) { hull.full_lo = INT_MAX; hull.full_hi = INT_MIN; }
  return hull;
}

// Forward: does key tile [j0, j1) (local) meet any visible block cell of the CTA's query rows
// [i_first, i_last) (global), and are all those cells visible? CTA-uniform: barriers inside when
// block_rect (contiguous positions with a block mask), so every thread calls it with the same
// tile. Sets *full when, in addition, every row's interval covers the tile.
template <int kThreads>
__device__ __forceinline__ bool fwd_tile(const MaskParams& m, const Positions& kp, int64_t nk, int64_t j0,
                                         int64_t j1, bool block_rect, bool has_block, int64_t i_first,
                                         int64_t i_last, const Hull& hull, bool* full) {
  bool any = true, all = !has_block;
  if (block_rect) {
    const int64_t jg0 = kp.start + j0, jg1 = kp.start + (j1 < nk ? j1 : nk);
    const int64_t br0 = i_first / m.block_q, br1 = (i_last - 1) / m.block_q;
    const int64_t bc0 = jg0 / m.block_k, bc1 = (jg1 - 1) / m.block_k;
    const int64_t nc = bc1 - bc0 + 1, cells = (br1 - br0 + 1) * nc;
    int an = 0, al = 1;
    for (int64_t c = threadIdx.x; c < cells; c += kThreads) {
      const int bit = m.block[(br0 + c / nc) * m.n_block_k + bc0 + c % nc] != 0;
      an |= bit;
      al &= bit;
    }
    any = __syncthreads_or(an) != 0;
    all = __syncthreads_and(al) != 0;
  }
  *full = all && hull.full_lo <= j0 && j1 <= hull.full_hi;
  return any;
}

// Forward, general predicate: is local key jl visible from local query row r, whose local key
// interval is [llo, lhi) when keys are contiguous (kidx: keys indexed, the interval is unused)?
template <class T>
__device__ __forceinline__ bool fwd_visible(const FwdArgs<T>& a, bool kidx, bool has_block, int llo,
                                            int lhi, int64_t r, int jl) {
  if (jl >= a.nk) return false;
  if (!kidx) {
    if (jl < llo || jl >= lhi) return false;
    if (!has_block) return true;
  }
  if (r >= a.nq) return false;
  const int64_t ig = a.qp[r];
  const int64_t jg = a.kp[jl];
  if (kidx) {
    int64_t lo, hi;
    row_range(a.mask, ig, &lo, &hi);
    if (jg < lo || jg >= hi) return false;
  }
  return block_bit(a.mask, ig, jg);
}

// dQ pass: the facts of the thread's rows r0 and r0 + 8 (local query rows): local key interval
// [llo, lhi) (eq. 3.4; empty past nq), LSE in base 2 (+inf past nq: P = 2^-inf = 0) and D (5.1);
// returns the CTA's hull over all threads (a block-wide barrier inside).
struct BwdRows {
  int llo[2], lhi[2];
  float L2[2], D[2];
};
template <int kWarps, class T, class G>
__device__ __forceinline__ Hull bwd_rows(const BwdArgs<T, G>& a, int64_t b, int64_t h, int64_t r0,
                                         int (&red)[4][kWarps], BwdRows* rows) {
  int hlo = INT_MAX, hhi = INT_MIN, flo = INT_MIN, fhi = INT_MAX;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t r = r0 + 8 * ri;
    int64_t lo = 0, hi = 0;
    rows->L2[ri] = INFINITY;
    rows->D[ri] = 0.f;
    if (r < a.nq) {
      local_range(a.mask, a.qp[r], a.kp, a.nk, &lo, &hi);
      rows->L2[ri] = static_cast<float>(a.LSE(b, h, r)) * v2::kLog2e;
      rows->D[ri] = static_cast<float>(a.D(b, h, r));
      add_row(lo, hi, &hlo, &hhi, &flo, &fhi);
    }
    rows->llo[ri] = int(lo);
    rows->lhi[ri] = int(hi);
  }
  return cta_hull<kWarps>(hlo, hhi, flo, fhi, red);
}

// dQ pass, one key tile from local key j0: dS = P (dP - D) in place of s (eq. 5.5), with
// P = 2^(S sl2 - LSE log2(e)) on visible pairs, else 0 (eq. 5.2). Thread rows r0, r0 + 8 (local)
// with facts `rows`; full: no predicate; block: the mask has a block part (its bit is tested).
template <int BC, class T, class G>
__device__ __forceinline__ void dq_pass_ds(float (&s)[BC / 2], const float (&dp)[BC / 2], const BwdRows& rows,
                                           bool full, bool block, int j0, int t4, float sl2,
                                           const BwdArgs<T, G>& a, int64_t r0) {
#pragma unroll
  for (int e = 0; e < BC / 2; ++e) {
    const int ri = (e >> 1) & 1, jl = j0 + (e >> 2) * 8 + 2 * t4 + (e & 1);
    bool vis = full;
    if (!vis) {
      vis = jl >= rows.llo[ri] && jl < rows.lhi[ri];  // includes jl >= nk and rows past nq
      if (block && vis) vis = block_bit(a.mask, a.qp[r0 + 8 * ri], a.kp.start + jl);
    }
    const float p = vis ? v2::ex2(fmaf(s[e], sl2, -rows.L2[ri])) : 0.f;
    s[e] = p * (dp[e] - rows.D[ri]);
  }
}

// dK/dV pass: stages the row statistics of query rows [i0, i0 + BQ) of head h into shared
// memory: l[i] = LSE log2(e) (+inf past nq: P = 0), l[BQ + i] = D.
template <int BQ, int kThreads, class T, class G>
__device__ __forceinline__ void stage_row_stats(float* l, const BwdArgs<T, G>& a, int64_t b, int64_t h,
                                                int64_t i0, int nv) {
  for (int i = threadIdx.x; i < BQ; i += kThreads) {
    const bool ok = i < nv;
    l[i] = ok ? static_cast<float>(a.LSE(b, h, i0 + i)) * v2::kLog2e : INFINITY;
    l[BQ + i] = ok ? static_cast<float>(a.D(b, h, i0 + i)) : 0.f;
  }
}

// dK/dV pass: does query tile qt (BQ rows) see any key of the CTA, whose keys' global positions
// lie in [kg0, kg1), and, when `whole` (the CTA holds all its ROWS keys) and there is no block
// mask, does every row's interval (eq. 3.4) cover [kg0, kg1), so that it sees every key of the
// CTA? With indexed keys the hull may hold positions that are not keys: `any` is then an upper
// bound (the per-element predicate decides), `full` stays exact. Warp-uniform: each warp computes
// it alike, no barrier.
template <int BQ, class T, class G>
__device__ __forceinline__ bool bwd_q_tile_hull(const BwdArgs<T, G>& a, int qt, int64_t kg0, int64_t kg1,
                                                bool whole, bool has_block, bool* full) {
  const int lane = threadIdx.x % 32;
  bool any = false, all = !has_block && whole;
#pragma unroll
  for (int u = 0; u < BQ / 32; ++u) {
    const int64_t i = int64_t(qt) * BQ + u * 32 + lane;
    bool a_ = false, l_ = false;
    if (i < a.nq) {
      int64_t lo, hi;
      row_range(a.mask, a.qp[i], &lo, &hi);
      a_ = lo < kg1 && hi > kg0 && lo < hi;
      l_ = lo <= kg0 && hi >= kg1;
    }
    any = any || __any_sync(0xffffffffu, a_);
    all = all && __all_sync(0xffffffffu, l_);
  }
  *full = all && any;
  return any;
}

// The same for the local keys [j0, jend) of contiguous key positions (global kp.start + j) in a
// CTA of ROWS keys.
template <int BQ, int ROWS, class T, class G>
__device__ __forceinline__ bool bwd_q_tile(const BwdArgs<T, G>& a, int qt, int64_t j0, int64_t jend,
                                           bool has_block, bool* full) {
  return bwd_q_tile_hull<BQ>(a, qt, a.kp.start + j0, a.kp.start + jend, jend - j0 == ROWS, has_block, full);
}

// The global hull [*kg0, *kg1) of the positions of local keys [j0, jend) (jend > j0), reduced
// over one warp (indexed keys: min and max of kp; contiguous: kp.start + [j0, jend)).
template <class T, class G>
__device__ __forceinline__ void key_hull_warp(const BwdArgs<T, G>& a, int64_t j0, int64_t jend, int64_t* kg0,
                                              int64_t* kg1) {
  if (!a.kp.index) {
    *kg0 = a.kp.start + j0;
    *kg1 = a.kp.start + jend;
    return;
  }
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t j = j0 + threadIdx.x % 32; j < jend; j += 32) {
    const int64_t x = a.kp.index[j];
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int64_t l2 = __shfl_xor_sync(0xffffffffu, lo, o), h2 = __shfl_xor_sync(0xffffffffu, hi, o);
    lo = l2 < lo ? l2 : lo;
    hi = h2 > hi ? h2 : hi;
  }
  *kg0 = lo;
  *kg1 = hi + 1;
}

}  // namespace burstlab::cuda::detail::tiles
