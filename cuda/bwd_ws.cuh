// cuda/bwd_ws.cuh — the pieces that the warp-specialized backward variants (v4_bwd.cu,
// bwd_ss.cuh for v5 and v14, v6_bwd.cu) share (spec §5.3, §6.2): the CTA shape (one producer and two consumer warpgroups,
// 128 keys per dK/dV CTA), the mbarrier ring's bars and the row facts staged per query tile, the
// dK/dV pass's producer, the consumers' P^T and dS^T (5.2, 5.5) in registers, the one-pass dQ
// scratch (its block order, the bulk atomic add of a block, the convert kernel). Internal;
// include from .cu files compiled for sm_90a only. Its names have internal linkage (an anonymous
// namespace): each file that includes it gets its own copy of the kernels.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "detail.cuh"
#include "epilogue.cuh"
#include "tile_mask.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace burstlab::cuda::detail {
namespace {
namespace bwd_ws {

using v2::ex2;
using v2::kLog2e;

constexpr int kWgs = 2;                  // consumer warpgroups
constexpr int kThreads = 128 * (kWgs + 1);
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64 * kWgs;         // dQ: query rows per CTA; dK/dV: keys per CTA
constexpr int kStages = 2;
constexpr int kBQ = 64;  // the one-pass kernels' query rows per tile: one wgmma M of a dQ_part block
constexpr int kRegP = 40, kRegC = 232;   // setmaxnreg budgets: 128 P + 256 C <= 65536

// The first 1024-byte boundary at or after p, by an offset from p: the result stays a pointer into
// shared memory as far as the compiler knows (an integer round trip would make its loads generic).
__device__ __forceinline__ unsigned char* align1024(unsigned char* p) {
  return p + ((1024u - (v2::smem_u32(p) & 1023u)) & 1023u);
}

// Gradients of type G: storage T, written (backward); or fp32, accumulated (backward_block).
template <class T, class G>
constexpr bool kAcc = !std::is_same<G, T>::value;

// Copies a (ROWS, D) tile: D/64 boxes of (64, ROWS), one per sw128 panel.
template <int ROWS, int D, class T>
__device__ __forceinline__ void load_tile(T* dst, const CUtensorMap* m, int row, int h, int b, uint64_t* bar) {
#pragma unroll
  for (int p = 0; p < D / 64; ++p) tma::load_4d(dst + p * ROWS * 64, m, 64 * p, row, h, b, bar);
}

// dq_acc (fp32) holds, per (b, h, 64-row query tile qt, column half w), one 64 x d/2 block in
// the order the consumer threads of warpgroup w hold it: float (c 128 + t) 4 + e is thread t's
// accumulator element 4 c + e (wgmma's m64n(d/2) layout: rows 16 (t / 32) + (t % 32) / 4 +
// 8 (e / 2), column d/2 w + 8 c + 2 (t % 4) + e % 2).
template <class T, class G>
__device__ __forceinline__ int64_t dq_acc_index(const BwdArgs<T, G>& a, int64_t b, int64_t h, int64_t qt, int w) {
  const int64_t nqt = (a.nq + 63) / 64;
  return (((b * a.Hq + h) * nqt + qt) * 2 + w) * (32 * a.d);
}

// dQ = scale dq_acc (G = T), or dQ += scale dq_acc (G = float: a block's contribution), back from
// the block order above into the dQ view. Grid (blocks, 1, 1) over (b, h, qt); 256 threads. A
// tile's two column halves are contiguous in dq_acc (64 d floats, read with coalesced 16-byte
// loads); they are put back in row order in shared memory, and each thread writes 8 consecutive
// elements of a row with one 16-byte store (the tensor-core backward's views are 16-byte aligned).
// Storing straight from the fragment order (4-byte stores of 8 rows per warp instruction) moved 32%
// of the DRAM bandwidth on H200 (ncu, d = 64).
template <class T, class G, int D>
__global__ void __launch_bounds__(256) dq_convert(BwdArgs<T, G> a, const float* dq_acc) {
  __shared__ float tile[64][D + 4];  // (64 rows, d); +4: row starts on different banks
  const int tid = threadIdx.x;
  const int64_t nqt = (a.nq + 63) / 64;
  const int64_t qt = blockIdx.x % nqt, bh = blockIdx.x / nqt, h = bh % a.Hq, b = bh / a.Hq;
  const float4* src = reinterpret_cast<const float4*>(dq_acc + dq_acc_index(a, b, h, qt, 0));
  for (int i = tid; i < 16 * D; i += 256) {  // float4 i: half w, then (c 128 + t) as in dq_acc_index
    const int w = i / (8 * D), q = i % (8 * D), c = q / 128, t = q % 128;
    const int r0 = 16 * (t / 32) + (t % 32) / 4, col = (D / 2) * w + 8 * c + 2 * (t % 4);
    const float4 v = src[i];
    tile[r0][col] = v.x;
    tile[r0][col + 1] = v.y;
    tile[r0 + 8][col] = v.z;
    tile[r0 + 8][col + 1] = v.w;
  }
  __syncthreads();
  const float sc = static_cast<float>(a.scale);
  for (int j = tid; j < 8 * D; j += 256) {  // 16-byte chunk j: row j / (d/8), columns 8 (j % (d/8)) ..
    const int row = j / (D / 8), c8 = 8 * (j % (D / 8));
    const int64_t r = qt * 64 + row;
    if (r >= a.nq) continue;
    const float* x = &tile[row][c8];
    if constexpr (std::is_same<G, float>::value) {  // fp32 rows: 32-byte aligned (8-element strides)
      float4* y = reinterpret_cast<float4*>(a.dQ.row(b, h, r) + c8);
      float4 u = y[0], w = y[1];
      u.x += sc * x[0]; u.y += sc * x[1]; u.z += sc * x[2]; u.w += sc * x[3];
      w.x += sc * x[4]; w.y += sc * x[5]; w.z += sc * x[6]; w.w += sc * x[7];
      y[0] = u;
      y[1] = w;
    } else {
      uint4 o;
      o.x = v2::Mma<T>::pack(sc * x[0], sc * x[1]);
      o.y = v2::Mma<T>::pack(sc * x[2], sc * x[3]);
      o.z = v2::Mma<T>::pack(sc * x[4], sc * x[5]);
      o.w = v2::Mma<T>::pack(sc * x[6], sc * x[7]);
      *reinterpret_cast<uint4*>(a.dQ.row(b, h, r) + c8) = o;
    }
  }
}

template <class T, class G, int D>
void launch_dq_convert(const BwdArgs<T, G>& a, const float* dq_acc, cudaStream_t s) {
  const int64_t blocks = a.B * a.Hq * ((a.nq + 63) / 64);
  dq_convert<T, G, D><<<static_cast<unsigned>(blocks), 256, 0, s>>>(a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("dq_convert");
}

// The one-pass kernels' tensor maps: K, V in boxes of 128 keys (kRows), Q, dO in boxes of kBQ
// query rows. False with *why when the copy engine cannot describe a view (nothing launched).
template <class T, class G>
bool one_pass_maps(const BwdArgs<T, G>& a, CUtensorMap (&m)[4], const char** why) {
  constexpr bool bf = std::is_same<T, bf16>::value;
  return tma::encode_4d(&m[0], a.K.data, a.K.dim, a.K.stride, bf, kRows, why) &&
         tma::encode_4d(&m[1], a.V.data, a.V.dim, a.V.stride, bf, kRows, why) &&
         tma::encode_4d(&m[2], a.Q.data, a.Q.dim, a.Q.stride, bf, kBQ, why) &&
         tma::encode_4d(&m[3], a.dO.data, a.dO.dim, a.dO.stride, bf, kBQ, why);
}

template <int S>
struct RingBars {
  uint64_t once;  // the tiles copied once per CTA
  uint64_t full[S], empty[S];
};

// One stage's facts, staged by producer warp 1: the visited (q-head, query tile) index `it` (-1:
// the sequence has ended), whether every pair of the tile and the CTA's keys is visible, and per
// query row LSE log2(e) (+inf past nq: P = 0), D and the visible key interval [lo, hi) (eq. 3.4;
// empty past nq): local key indices, or with indexed keys (KIDX) global positions, which the
// consumers compare with their keys' positions.
template <int BQ>
struct RowStats {
  float L2[BQ], D[BQ];
  int lo[BQ], hi[BQ];
  int it, full;
};

// A dK/dV CTA's keys. 1-d grid, key blocks of one (b, kv-head) pair consecutive: the CTAs that run
// at once share the pair's Q and dO tiles in L2 (interleaving pairs to start long causal CTAs first
// lost more in L2 than it gained, docs/performance-gpu.md).
struct DkdvCta {
  int64_t b, hk, j0, jend;  // local keys [j0, jend), global kp[j]
  int nqt, n_it;            // query tiles of BQ rows; visited-tile candidates (q-head of the group, tile)
};

template <int BQ, class T, class G>
__device__ __forceinline__ DkdvCta dkdv_cta(const BwdArgs<T, G>& a) {
  DkdvCta c;
  const int64_t nkb = (a.nk + kRows - 1) / kRows, pair = blockIdx.x / nkb;
  c.hk = pair % a.Hkv;
  c.b = pair / a.Hkv;
  c.j0 = (blockIdx.x % nkb) * kRows;
  c.jend = c.j0 + (a.nk - c.j0 < kRows ? a.nk - c.j0 : kRows);
  c.nqt = static_cast<int>((a.nq + BQ - 1) / BQ);
  c.n_it = static_cast<int>(a.group) * c.nqt;
  return c;
}

// full: the copies' arrival + each lane of warp 1 after its row-fact stores; empty: each consumer
// thread after its last read of the stage. Every thread that touches the stage's row facts
// arrives itself, so each hand-off is a release/acquire pair of that thread.
template <int S>
__device__ __forceinline__ void init_dkdv_bars(RingBars<S>& bars) {
  tma::init(&bars.once, 1);
  for (int s = 0; s < S; ++s) {
    tma::init(&bars.full[s], 1 + 32);
    tma::init(&bars.empty[s], 128 * kWgs);
  }
  tma::fence_init();
}

// The dK/dV pass's producer warps 0 and 1 (the others return at once). Warp 0 copies K and V once
// and the visited tiles' Q and dO into the ring; both walk the sequence (bwd_q_tile and
// bwd_q_tile_hull are warp-uniform and need no barrier); warp 1 hands each tile's index on with its
// row facts, then a last stage with it = -1, so the consumers never evaluate the masks per tile.
// KIDX: the producer bounds the CTA's keys by their global hull and stages global row intervals.
template <class T, class G, int D, int BQ, int S, bool BLOCK, bool KIDX>
__device__ __forceinline__ void dkdv_producer(const BwdArgs<T, G>& a, const DkdvCta& c, const CUtensorMap* mK,
                                              const CUtensorMap* mV, const CUtensorMap* mQ, const CUtensorMap* mdO,
                                              T* sK, T* sV, T* sQO, RowStats<BQ>* sR, RingBars<S>& bars, int warp,
                                              int lane) {
  constexpr uint32_t kTile = BQ * D * sizeof(T);
  if (warp > 1) return;
  if (warp == 0 && lane == 0) {
    tma::arrive_expect(&bars.once, 2 * kRows * D * sizeof(T));
    load_tile<kRows, D>(sK, mK, int(c.j0), int(c.hk), int(c.b), &bars.once);
    load_tile<kRows, D>(sV, mV, int(c.j0), int(c.hk), int(c.b), &bars.once);
  }
  int kg0 = 0, kg1 = 0;  // KIDX: the global hull of the CTA's keys (positions < 2^31)
  if constexpr (KIDX) {
    int64_t g0, g1;
    tiles::key_hull_warp(a, c.j0, c.jend, &g0, &g1);
    kg0 = static_cast<int>(g0);
    kg1 = static_cast<int>(g1);
  }
  int st = 0;
  uint32_t ph = 0;
  bool full = false;
  for (int it = 0;; ++it) {
    if constexpr (KIDX)
      while (it < c.n_it && !tiles::bwd_q_tile_hull<BQ>(a, it % c.nqt, kg0, kg1, c.jend - c.j0 == kRows, BLOCK, &full)) ++it;
    else
      while (it < c.n_it && !tiles::bwd_q_tile<BQ, kRows>(a, it % c.nqt, c.j0, c.jend, BLOCK, &full)) ++it;
    const bool end = it >= c.n_it;
    const int64_t h = c.hk * a.group + it / c.nqt, i0 = int64_t(it % c.nqt) * BQ;
    tma::wait(&bars.empty[st], ph ^ 1);
    if (warp == 0) {
      if (lane == 0) {
        if (end) {
          tma::arrive(&bars.full[st]);
        } else {
          tma::arrive_expect(&bars.full[st], 2 * kTile);
          T* dst = sQO + st * (2 * BQ * D);
          load_tile<BQ, D>(dst, mQ, int(i0), int(h), int(c.b), &bars.full[st]);
          load_tile<BQ, D>(dst + BQ * D, mdO, int(i0), int(h), int(c.b), &bars.full[st]);
        }
      }
    } else {
      RowStats<BQ>& R = sR[st];
      if (lane == 0) {
        R.it = end ? -1 : it;
        R.full = full;
      }
      for (int i = lane; i < BQ && !end; i += 32) {
        const int64_t r = i0 + i;
        int64_t lo = 0, hi = 0;
        float L2 = INFINITY, Dv = 0.f;
        if (r < a.nq) {
          if constexpr (KIDX) row_range(a.mask, a.qp[r], &lo, &hi);
          else local_range(a.mask, a.qp[r], a.kp, a.nk, &lo, &hi);
          L2 = static_cast<float>(a.LSE(c.b, h, r)) * kLog2e;
          Dv = static_cast<float>(a.D(c.b, h, r));
        }
        R.L2[i] = L2;
        R.D[i] = Dv;
        R.lo[i] = static_cast<int>(lo);
        R.hi[i] = static_cast<int>(hi);
      }
      tma::arrive(&bars.full[st]);  // release: my stores above before it
    }
    if (end) break;
    if (++st == S) { st = 0; ph ^= 1; }
  }
}

// P^T (5.2) in s, from S^T = K Q^T: my keys x BQ rows, element e at key krow + g + 8 ((e >> 1) & 1),
// row 8 (e >> 2) + 2 t4 + (e & 1). Full tiles (the common case) test nothing; partial ones test
// each pair against the row's staged interval (local keys, or KIDX: global positions) and, BLOCK,
// its block bit.
template <class T, class G, int BQ, bool BLOCK, bool KIDX>
__device__ __forceinline__ void dkdv_p(float (&s)[BQ / 2], const RowStats<BQ>& R, bool full, const BwdArgs<T, G>& a,
                                       int64_t i0, int64_t j0, int krow, int g, int t4, float sl2) {
  if (full) {
#pragma unroll
    for (int e = 0; e < BQ / 2; ++e) s[e] = ex2(fmaf(s[e], sl2, -R.L2[(e >> 2) * 8 + 2 * t4 + (e & 1)]));
  } else if constexpr (KIDX) {
    int jg[2];  // my keys' global positions; -1 past nk (never visible)
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int64_t j = j0 + krow + g + 8 * ri;
      jg[ri] = j < a.nk ? static_cast<int>(a.kp.index[j]) : -1;
    }
#pragma unroll
    for (int e = 0; e < BQ / 2; ++e) {
      const int il = (e >> 2) * 8 + 2 * t4 + (e & 1), jk = jg[(e >> 1) & 1];
      bool vis = (jk >= R.lo[il]) & (jk < R.hi[il]);  // global; empty past nq
      if (BLOCK && vis) vis = block_bit(a.mask, a.qp[i0 + il], jk);
      s[e] = vis ? ex2(fmaf(s[e], sl2, -R.L2[il])) : 0.f;
    }
  } else {
#pragma unroll
    for (int e = 0; e < BQ / 2; ++e) {
      const int il = (e >> 2) * 8 + 2 * t4 + (e & 1);
      const int jl = static_cast<int>(j0) + krow + g + 8 * ((e >> 1) & 1);
      bool vis = (jl >= R.lo[il]) & (jl < R.hi[il]);  // local; empty past nq; hi <= nk
      if (BLOCK && vis) vis = block_bit(a.mask, a.qp[i0 + il], a.kp.start + jl);
      s[e] = vis ? ex2(fmaf(s[e], sl2, -R.L2[il])) : 0.f;
    }
  }
}

// dS^T = P^T o (dP^T - D) (5.5) in dp, element by element as in dkdv_p.
template <int BQ>
__device__ __forceinline__ void dkdv_ds(float (&dp)[BQ / 2], const float (&p)[BQ / 2], const RowStats<BQ>& R, int t4) {
#pragma unroll
  for (int e = 0; e < BQ / 2; ++e) {
    const int il = (e >> 2) * 8 + 2 * t4 + (e & 1);
    dp[e] = p[e] * (dp[e] - R.D[il]);
  }
}

// Writes the A fragments x (my keys krow + g (+8), BQ query columns, rounded to T) into a
// (kRows keys, BQ) sw128 tile: the K-major A of dK += dS^T Q (or dV += P^T dO) and the M-major A of
// dQ_part = dS K.
template <class T, int BQ>
__device__ __forceinline__ void store_a_tile(T* tile, const uint32_t (&x)[BQ / 16][4], int krow, int g, int t4) {
#pragma unroll
  for (int kk = 0; kk < BQ / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = krow + g + 8 * (j & 1), c = 16 * kk + 8 * (j >> 1) + 2 * t4;
      *reinterpret_cast<uint32_t*>(tile + v3::sw128<kRows>(r, c >> 3) + (c & 7)) = x[kk][j];
    }
}

// S^T = K Q^T and dP^T = V dO^T of one stage (my warpgroup's 64 keys x kBQ rows), issued and
// committed, not waited for.
template <class T, int D>
__device__ __forceinline__ void issue_sdp(float (&s)[kBQ / 2], float (&dp)[kBQ / 2], uint64_t dKd0, uint64_t dVd0,
                                          const T* cQ, const T* cO) {
  const uint64_t dKd = v3::opaque(dKd0), dVd = v3::opaque(dVd0);
  const uint64_t dQb = v3::opaque(v3::desc_k_base<kBQ>(cQ, 0)), dOb = v3::opaque(v3::desc_k_base<kBQ>(cO, 0));
  v3::fence();
  // The first k16 step writes s and dp without reading them (ss0): where they are carried across
  // tiles (v6) they hold the last tile's P^T and dS^T, and a product that read them would wait for
  // those instructions (ptxas C7515).
  v3::Wgmma<T>::template ss0<kBQ, 0>(s, dKd, dQb);
  v3::Wgmma<T>::template ss0<kBQ, 0>(dp, dVd, dOb);
#pragma unroll
  for (int kk = 1; kk < D / 16; ++kk) {
    v3::Wgmma<T>::template ss<kBQ, 0>(s, v3::desc_k_step<kRows>(dKd, kk), v3::desc_k_step<kBQ>(dQb, kk), 1);
    v3::Wgmma<T>::template ss<kBQ, 0>(dp, v3::desc_k_step<kRows>(dVd, kk), v3::desc_k_step<kBQ>(dOb, kk), 1);
  }
  v3::commit();
}

// The one-pass kernels' (v5, v6) shared memory, from the first 1024-byte boundary of the dynamic
// buffer: K and V (kRows, D); the ring's S stages of [Q, dO] (kBQ, D); two dS^T tiles (kRows keys,
// kBQ) (v5: a double buffer; v6: the ring's slots); P^T (kRows keys, kBQ); two fp32 dQ_part
// blocks (64, D/2); the S stages' row facts. Tiles are sw128, each 1024-aligned.
template <class T>
struct OnePassSmem {
  T *sK, *sV, *sQO, *sdS, *sP;
  float* sdQ;
  RowStats<kBQ>* sR;
};

template <class T, int D>
__device__ __forceinline__ OnePassSmem<T> one_pass_smem(unsigned char* raw) {
  OnePassSmem<T> m;
  m.sK = reinterpret_cast<T*>(align1024(raw));
  m.sV = m.sK + kRows * D;
  m.sQO = m.sV + kRows * D;
  m.sdS = m.sQO + kStages * 2 * kBQ * D;
  m.sP = m.sdS + 2 * kRows * kBQ;
  m.sdQ = reinterpret_cast<float*>(m.sP + kRows * kBQ);
  m.sR = reinterpret_cast<RowStats<kBQ>*>(m.sdQ + 2 * 32 * D);
  return m;
}

template <int D>
constexpr size_t one_pass_smem_bytes(size_t elem) {
  return size_t(2 * kRows + 2 * kStages * kBQ) * D * elem + 2 * kRows * kBQ * elem + kRows * kBQ * elem +
         2 * 32 * D * sizeof(float) + kStages * sizeof(RowStats<kBQ>) + 1024;
}

// dV += P^T dO (5.3) and dK += dS^T Q (5.7), both A operands from shared memory (descriptors dPa,
// dSa of my warpgroup's 64 keys of P^T and dS^T), dO and Q transposed (dOt, dQt); issued and
// committed, not waited for.
template <class T, int D>
__device__ __forceinline__ void issue_dvdk_ss(float (&dv)[D / 2], float (&dk)[D / 2], uint64_t dPa, uint64_t dSa,
                                              uint64_t dOt, uint64_t dQt) {
  v3::fence();
#pragma unroll
  for (int kk = 0; kk < kBQ / 16; ++kk) {
    v3::Wgmma<T>::template ss<D, 1>(dv, v3::desc_k_step<kRows>(dPa, kk), v3::desc_mn_step(dOt, kk), 1);  // dV += P^T dO
    v3::Wgmma<T>::template ss<D, 1>(dk, v3::desc_k_step<kRows>(dSa, kk), v3::desc_mn_step(dQt, kk), 1);  // dK += dS^T Q
  }
  v3::commit();
}

// dQ_part = dS K (5.6): 64 query rows x my d/2 columns over all kRows keys, from the dS^T tile cS
// (M-major) and my columns kB of K; issued and committed, not waited for. The first k16 step
// writes dq without reading it (ss0).
template <class T, int D>
__device__ __forceinline__ void issue_dq_part(float (&dq)[D / 4], const T* cS, const T* kB) {
  constexpr int kN = D / 2;
  const uint64_t dA = v3::opaque(v3::desc_mn_base<kRows>(cS)), dB = v3::opaque(v3::desc_mn_base<kRows>(kB));
  v3::Wgmma<T>::template ss0<kN, 1, 1>(dq, dA, dB);
#pragma unroll
  for (int kk = 1; kk < kRows / 16; ++kk)
    v3::Wgmma<T>::template ss<kN, 1, 1>(dq, v3::desc_mn_step(dA, kk), v3::desc_mn_step(dB, kk), 1);
  v3::commit();
}

// dQ_part (64 query rows x d/2 columns of warpgroup wg, fragment order) to its shared-memory block
// (conflict-free 16-byte stores), then one bulk atomic add of the block into dq_acc at dst. The
// named barrier 2 + wg (its 128 threads) orders the previous block's read, the stores and the add.
template <int D>
__device__ __forceinline__ void dq_block_add(const float (&dq)[D / 4], float* qs, float* dst, int wg, int wtid) {
  constexpr int kN = D / 2;
  if (wtid == 0) tma::bulk_wait_read();  // my previous block has been read
  tma::bar_sync(2 + wg, 128);
#pragma unroll
  for (int c = 0; c < kN / 8; ++c)
    reinterpret_cast<float4*>(qs)[c * 128 + wtid] = make_float4(dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3]);
  v3::fence_proxy_async();
  tma::bar_sync(2 + wg, 128);
  if (wtid == 0) {
    tma::reduce_add_f32(dst, qs, kN * 64 * sizeof(float));
    tma::bulk_commit();
  }
}

}  // namespace bwd_ws
}  // namespace
}  // namespace burstlab::cuda::detail
