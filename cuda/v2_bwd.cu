// cuda/v2_bwd.cu — variant 2 backward: bf16/fp16 tensor cores, FlashAttention-2 style with the
// dQ pass split from the dK/dV pass (spec §5, eq. 5.1-5.7; §5.3 tiled backward).
//   D      (5.1) by the v1 compute_D kernel (memory-bound, one warp per row).
//   dQ     one CTA per (b, h, 64 query rows), one warp per 16 rows, key tiles of 64 double-
//          buffered in shared memory: S = Q K^T, dP = dO V^T, P = exp(S - LSE) (5.2),
//          dS = P (dP - D) (5.5), dQ += dS K (5.6).
//   dK,dV  one CTA per (b, kv-head, 64 keys), one warp per 16 keys; loops over the group's
//          q-heads and the query tiles that see the key tile (double-buffered Q, dO, LSE, D):
//          S^T = K Q^T, dP^T = V dO^T, dV += P^T dO (5.3), dK += dS^T Q (5.7).
// Every output element is written by exactly one thread with a fixed summation order and no
// atomics: the result is bitwise repeatable (the `deterministic` option costs nothing). S and
// dP are recomputed in both passes (7 matrix products instead of FA2's 5). P and dS are rounded
// to the storage dtype before their products (u_P, spec §9.1). Masks as in v2 forward: tiles
// outside every row's interval are skipped, fully visible tiles run without the predicate.
// Limits: whole-problem backward only (backward_block runs v1), d in {64, 128}, the alignment
// rules of v2 forward for Q, K, V, O, dO, dQ, dK, dV.
#include <climits>
#include <cstdint>

#include "detail.cuh"
#include "mma.cuh"
#include "epilogue.cuh"
#include "tile_mask.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace v2;

constexpr int kW = 4;             // warps per CTA
constexpr int kThreads = 32 * kW;
constexpr int kRows = 16 * kW;    // dQ: query rows per CTA; dKdV: keys per CTA
constexpr int kBc = 64;           // dQ: keys per tile

// ------------------------------------------------------------------ dQ
template <class T, int D>
__global__ void __launch_bounds__(kThreads) v2_bwd_dq_kernel(BwdArgs<T, T> a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (Br, D)
  T* sdO = sQ + kRows * D;                 // (Br, D)
  T* sKV = sdO + kRows * D;                // 2 x [(Bc, D) K, (Bc, D) V]
  __shared__ int red[4][kW];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int64_t q0 = int64_t(blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
  const int64_t nq = a.nq, nk = a.nk;
  const int nvq = static_cast<int>(nq - q0 < kRows ? nq - q0 : kRows);
  load_tile<T, kRows, D, kThreads>(sQ, a.Q.row(b, h, q0), a.Q.stride[2], nvq, tid);
  load_tile<T, kRows, D, kThreads>(sdO, a.dO.row(b, h, q0), a.dO.stride[2], nvq, tid);
  cp_async_commit();
  const T* Kg = a.K.row(b, hk, 0);
  const T* Vg = a.V.row(b, hk, 0);
  const int64_t ks = a.K.stride[2], vs = a.V.stride[2];
  const float sl2 = static_cast<float>(a.scale) * kLog2e;

  // my rows g, g + 8: interval (3.4), LSE in base 2, D (tile_mask.cuh)
  tiles::BwdRows rows;
  const tiles::Hull hull = tiles::bwd_rows<kW>(a, b, h, q0 + warp * 16 + g, red, &rows);
  const int(&llo)[2] = rows.llo;
  const int(&lhi)[2] = rows.lhi;
  const float(&L2)[2] = rows.L2;
  const float(&Dr)[2] = rows.D;
  const bool has_block = a.mask.block != nullptr;
  const int t_begin = hull.lo < hull.hi ? hull.lo / kBc : 0;
  const int t_end = hull.lo < hull.hi ? (hull.hi + kBc - 1) / kBc : 0;
  auto rows_in = [&](int64_t j0) { return static_cast<int>(nk - j0 < kBc ? nk - j0 : kBc); };
  auto pred = [&](int ri, int jl) -> bool {
    if (jl < llo[ri] || jl >= lhi[ri]) return false;  // includes jl >= nk and rows past nq
    if (!has_block) return true;
    return block_bit(a.mask, a.qp[q0 + warp * 16 + g + 8 * ri], a.kp.start + jl);
  };

  float acc[D / 8][4];  // dQ / scale, my 16 rows x D
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  int t = t_begin, buf = 0;
  if (t < t_end) {
    load_tile<T, kBc, D, kThreads>(sKV, Kg + int64_t(t) * kBc * ks, ks, rows_in(int64_t(t) * kBc), tid);
    load_tile<T, kBc, D, kThreads>(sKV + kBc * D, Vg + int64_t(t) * kBc * vs, vs, rows_in(int64_t(t) * kBc), tid);
  }
  cp_async_commit();
  for (; t < t_end; ++t) {
    const int j0 = t * kBc;
    const bool full = !has_block && hull.full_lo <= j0 && j0 + kBc <= hull.full_hi;
    T* const cK = sKV + buf * (2 * kBc * D);
    T* const cV = cK + kBc * D;
    if (t + 1 < t_end) {
      T* const nK = sKV + (buf ^ 1) * (2 * kBc * D);
      const int64_t jn = int64_t(t + 1) * kBc;
      load_tile<T, kBc, D, kThreads>(nK, Kg + jn * ks, ks, rows_in(jn), tid);
      load_tile<T, kBc, D, kThreads>(nK + kBc * D, Vg + jn * vs, vs, rows_in(jn), tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    float s[kBc / 8][4], dp[kBc / 8][4];  // S = Q K^T, dP = dO V^T (5.4)
#pragma unroll
    for (int i = 0; i < kBc / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], da[4];
      const int arow = warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), acol = 2 * kk + (lane >> 4);
      ldsm_x4(qa, sQ + swz<D>(arow, acol));
      ldsm_x4(da, sdO + swz<D>(arow, acol));
#pragma unroll
      for (int np = 0; np < kBc / 16; ++np) {
        const int brow = np * 16 + (lane & 7) + 8 * (lane >> 4), bcol = 2 * kk + ((lane >> 3) & 1);
        uint32_t kb[4], vb[4];
        ldsm_x4(kb, cK + swz<D>(brow, bcol));
        ldsm_x4(vb, cV + swz<D>(brow, bcol));
        Mma<T>::run(s[2 * np], qa, kb[0], kb[1]);
        Mma<T>::run(s[2 * np + 1], qa, kb[2], kb[3]);
        Mma<T>::run(dp[2 * np], da, vb[0], vb[1]);
        Mma<T>::run(dp[2 * np + 1], da, vb[2], vb[3]);
      }
    }
    // dS = P (dP - D), P = 2^(S scale log2e - LSE log2e) on visible pairs, else 0
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ri = e >> 1, jl = j0 + nt * 8 + 2 * t4 + (e & 1);
        const float p = (full || pred(ri, jl)) ? ex2(s[nt][e] * sl2 - L2[ri]) : 0.f;
        s[nt][e] = p * (dp[nt][e] - Dr[ri]);
      }
    // dQ += dS K: B[k = key][n = d] = K[key][d] through ldmatrix.trans
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dpi = 0; dpi < D / 16; ++dpi) {
        uint32_t kb[4];
        ldsm_x4_t(kb, cK + swz<D>(kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * dpi + (lane >> 4)));
        Mma<T>::run(acc[2 * dpi], pa, kb[0], kb[1]);
        Mma<T>::run(acc[2 * dpi + 1], pa, kb[2], kb[3]);
      }
    }
    __syncthreads();
    buf ^= 1;
  }
  cp_async_wait<0>();
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t r = q0 + warp * 16 + g + 8 * ri;
    if (r < nq) epilogue::store_row<T, D>(a.dQ.row(b, h, r), &acc[0][0], ri, t4, static_cast<float>(a.scale));
  }
}

// ------------------------------------------------------------------ dK, dV
template <class T, int D, int BQ>
__global__ void __launch_bounds__(kThreads) v2_bwd_dkdv_kernel(BwdArgs<T, T> a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (Bk, D)
  T* sV = sK + kRows * D;                  // (Bk, D)
  T* sQO = sV + kRows * D;                 // 2 x [(BQ, D) Q, (BQ, D) dO]
  float* sLD = reinterpret_cast<float*>(sQO + 4 * BQ * D);  // 2 x [(BQ) LSE log2e, (BQ) D]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int64_t j0 = int64_t(blockIdx.x) * kRows, hk = blockIdx.y, b = blockIdx.z;
  const int64_t nq = a.nq, nk = a.nk, G = a.group;
  const int nvk = static_cast<int>(nk - j0 < kRows ? nk - j0 : kRows);
  load_tile<T, kRows, D, kThreads>(sK, a.K.row(b, hk, j0), a.K.stride[2], nvk, tid);
  load_tile<T, kRows, D, kThreads>(sV, a.V.row(b, hk, j0), a.V.stride[2], nvk, tid);
  cp_async_commit();
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const int64_t jend = j0 + nvk;  // keys [j0, jend) of this CTA (global = local here)
  const bool has_block = a.mask.block != nullptr;
  const int nqt = static_cast<int>((nq + BQ - 1) / BQ);
  const int n_it = static_cast<int>(G) * nqt;  // (q-head of the group, query tile)

  // Does query tile qt see any key of this CTA; are all its pairs visible (tile_mask.cuh)?
  auto classify = [&](int qt, bool* full) -> bool {
    return tiles::bwd_q_tile<BQ, kRows>(a, qt, j0, jend, has_block, full);
  };
  auto next_it = [&](int it, bool* full) -> int {
    while (it < n_it && !classify(it % nqt, full)) ++it;
    return it;
  };
  auto load_q = [&](int it, int bufi) {
    const int64_t h = hk * G + it / nqt, i0 = int64_t(it % nqt) * BQ;
    const int nv = static_cast<int>(nq - i0 < BQ ? nq - i0 : BQ);
    T* dst = sQO + bufi * (2 * BQ * D);
    load_tile<T, BQ, D, kThreads>(dst, a.Q.row(b, h, i0), a.Q.stride[2], nv, tid);
    load_tile<T, BQ, D, kThreads>(dst + BQ * D, a.dO.row(b, h, i0), a.dO.stride[2], nv, tid);
    tiles::stage_row_stats<BQ, kThreads>(sLD + bufi * (2 * BQ), a, b, h, i0, nv);
  };

  float dk[D / 8][4], dv[D / 8][4];  // my 16 keys x D
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
  const int krow = warp * 16;
  bool full = false;
  int it = next_it(0, &full), buf = 0;
  if (it < n_it) load_q(it, 0);
  cp_async_commit();
  while (it < n_it) {
    bool full_next = false;
    const int itn = next_it(it + 1, &full_next);
    if (itn < n_it) load_q(itn, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* cQ = sQO + buf * (2 * BQ * D);
    const T* cO = cQ + BQ * D;
    const float* cL = sLD + buf * (2 * BQ);
    const float* cD = cL + BQ;
    const int64_t i0 = int64_t(it % nqt) * BQ;

    float s[BQ / 8][4], dp[BQ / 8][4];  // S^T = K Q^T, dP^T = V dO^T: my 16 keys x BQ rows
#pragma unroll
    for (int i = 0; i < BQ / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      const int arow = krow + (lane & 7) + 8 * ((lane >> 3) & 1), acol = 2 * kk + (lane >> 4);
      ldsm_x4(ka, sK + swz<D>(arow, acol));
      ldsm_x4(va, sV + swz<D>(arow, acol));
#pragma unroll
      for (int np = 0; np < BQ / 16; ++np) {
        const int brow = np * 16 + (lane & 7) + 8 * (lane >> 4), bcol = 2 * kk + ((lane >> 3) & 1);
        uint32_t qb[4], ob[4];
        ldsm_x4(qb, cQ + swz<D>(brow, bcol));
        ldsm_x4(ob, cO + swz<D>(brow, bcol));
        Mma<T>::run(s[2 * np], ka, qb[0], qb[1]);
        Mma<T>::run(s[2 * np + 1], ka, qb[2], qb[3]);
        Mma<T>::run(dp[2 * np], va, ob[0], ob[1]);
        Mma<T>::run(dp[2 * np + 1], va, ob[2], ob[3]);
      }
    }
    // P^T and dS^T; element (key krow + g + 8 (e >> 1), row nt * 8 + 2 t4 + (e & 1))
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int il = nt * 8 + 2 * t4 + (e & 1);
        const int64_t jg = j0 + krow + g + 8 * (e >> 1), ig = i0 + il;
        bool vis = full;
        if (!vis) vis = ig < nq && jg < nk && visible(a.mask, a.qp[ig], a.kp.start + jg);
        const float p = vis ? ex2(s[nt][e] * sl2 - cL[il]) : 0.f;
        s[nt][e] = p;                        // P^T
        dp[nt][e] = p * (dp[nt][e] - cD[il]);  // dS^T (5.5)
      }
    // dV += P^T dO, dK += dS^T Q: B[k = row][n = d] through ldmatrix.trans
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      uint32_t pa[4], sa[4];
      pa[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      sa[0] = Mma<T>::pack(dp[2 * kk][0], dp[2 * kk][1]);
      sa[1] = Mma<T>::pack(dp[2 * kk][2], dp[2 * kk][3]);
      sa[2] = Mma<T>::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      sa[3] = Mma<T>::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int dpi = 0; dpi < D / 16; ++dpi) {
        const int brow = kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), bcol = 2 * dpi + (lane >> 4);
        uint32_t ob[4], qb[4];
        ldsm_x4_t(ob, cO + swz<D>(brow, bcol));
        ldsm_x4_t(qb, cQ + swz<D>(brow, bcol));
        Mma<T>::run(dv[2 * dpi], pa, ob[0], ob[1]);
        Mma<T>::run(dv[2 * dpi + 1], pa, ob[2], ob[3]);
        Mma<T>::run(dk[2 * dpi], sa, qb[0], qb[1]);
        Mma<T>::run(dk[2 * dpi + 1], sa, qb[2], qb[3]);
      }
    }
    __syncthreads();
    buf ^= 1;
    it = itn;
    full = full_next;
  }
  cp_async_wait<0>();
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t j = j0 + krow + g + 8 * ri;
    if (j >= nk) continue;
    epilogue::store_row<T, D>(a.dK.row(b, hk, j), &dk[0][0], ri, t4, static_cast<float>(a.scale));
    epilogue::store_row<T, D>(a.dV.row(b, hk, j), &dv[0][0], ri, t4, 1.f);
  }
}

template <class T, int D, int BQ>
void launch_bwd(const BwdArgs<T, T>& a, cudaStream_t s) {
  if (a.nq > 0) {
    const size_t smem = size_t(2 * kRows + 4 * kBc) * D * sizeof(T);
    allow_smem(reinterpret_cast<const void*>(&v2_bwd_dq_kernel<T, D>), smem);
    const dim3 grid(static_cast<unsigned>((a.nq + kRows - 1) / kRows), static_cast<unsigned>(a.Hq),
                    static_cast<unsigned>(a.B));
    v2_bwd_dq_kernel<T, D><<<grid, kThreads, smem, s>>>(a);
    BURSTLAB_CUDA_LAUNCH_CHECK("v2_bwd_dq_kernel");
  }
  if (a.nk > 0) {
    const size_t smem = size_t(2 * kRows + 4 * BQ) * D * sizeof(T) + 4 * BQ * sizeof(float);
    allow_smem(reinterpret_cast<const void*>(&v2_bwd_dkdv_kernel<T, D, BQ>), smem);
    const dim3 grid(static_cast<unsigned>((a.nk + kRows - 1) / kRows), static_cast<unsigned>(a.Hkv),
                    static_cast<unsigned>(a.B));
    v2_bwd_dkdv_kernel<T, D, BQ><<<grid, kThreads, smem, s>>>(a);
    BURSTLAB_CUDA_LAUNCH_CHECK("v2_bwd_dkdv_kernel");
  }
}

}  // namespace

template <class T>
void v2_backward(const BwdArgs<T, T>& a, cudaStream_t s) {
  if (a.d == 64) launch_bwd<T, 64, 64>(a, s);
  else if (a.d == 128) launch_bwd<T, 128, 32>(a, s);
  else fail("d (", a.d, ") must be 64 or 128 for v2");
}

template void v2_backward<bf16>(const BwdArgs<bf16, bf16>&, cudaStream_t);
template void v2_backward<f16>(const BwdArgs<f16, f16>&, cudaStream_t);

}  // namespace burstlab::cuda::detail
