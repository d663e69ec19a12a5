// cuda/v3_bwd.cu — variant 3 backward: v2's two passes without atomics (spec §5, eq. 5.1-5.7;
// §5.3) on Hopper warpgroup MMA (wgmma, sm_90a). One warpgroup per CTA, 64 rows (dQ pass) or
// 64 keys (dK/dV pass) — wgmma's M — and several CTAs per SM to hide each other's latency.
//   D      (5.1) by the v1 compute_D kernel.
//   dQ     CTA = (b, h, 64 query rows); key tiles of BC double-buffered: S = Q K^T and
//          dP = dO V^T (wgmma, both operands in shared memory, K-major), P = 2^(S c - LSE) (5.2),
//          dS = P (dP - D) (5.5) in registers, dQ += dS K (dS from registers, K transposed)
//          (5.6).
//   dK,dV  CTA = (b, kv-head, 64 keys); loops over the group's q-heads and the query tiles of
//          BQ rows that see the keys (double-buffered Q, dO, LSE, D): S^T = K Q^T, dP^T = V dO^T,
//          dV += P^T dO (5.3), dK += dS^T Q (5.7), the B operands transposed.
// Every output element is written by one thread in a fixed order, no atomics: bitwise
// repeatable. P and dS are rounded to the storage dtype before their products (u_P, spec §9.1).
// Masks exactly as v2 (row intervals bound the tiles, fully visible tiles skip the predicate).
// Limits: whole-problem backward only (backward_block runs v1), bf16/fp16, d in {64, 128},
// v2's alignment rules, a compute capability 9.0 device.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "detail.cuh"
#include "epilogue.cuh"
#include "tile_mask.cuh"
#include "wgmma.cuh"

namespace burstlab::cuda::detail {
namespace {

using v2::cp_async_commit;
using v2::cp_async_wait;
using v2::ex2;
using v2::kLog2e;
using v2::Mma;

constexpr int kThreads = 128;  // one warpgroup
constexpr int kRows = 64;      // dQ: query rows per CTA; dK/dV: keys per CTA

__device__ __forceinline__ unsigned char* align1024(unsigned char* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}

// ------------------------------------------------------------------ dQ
template <class T, int D, int BC>
__global__ void __launch_bounds__(kThreads, 2) v3_bwd_dq_kernel(BwdArgs<T, T> a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(align1024(smem_raw));  // (64, D) sw128
  T* sdO = sQ + kRows * D;                             // (64, D)
  T* sKV = sdO + kRows * D;                            // 2 x [(BC, D) K, (BC, D) V]
  __shared__ int red[4][4];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z,
                hk = h / a.group;
  const int64_t nq = a.nq, nk = a.nk;
  const int nvq = static_cast<int>(nq - q0 < kRows ? nq - q0 : kRows);
  v3::load_sw128<T, kRows, D, kThreads>(sQ, a.Q.row(b, h, q0), a.Q.stride[2], nvq, tid);
  v3::load_sw128<T, kRows, D, kThreads>(sdO, a.dO.row(b, h, q0), a.dO.stride[2], nvq, tid);
  cp_async_commit();
  const T* Kg = a.K.row(b, hk, 0);
  const T* Vg = a.V.row(b, hk, 0);
  const int64_t ks = a.K.stride[2], vs = a.V.stride[2];
  const float sl2 = static_cast<float>(a.scale) * kLog2e;

  // my rows g, g + 8: interval (3.4), LSE in base 2, D (tile_mask.cuh)
  tiles::BwdRows rows;
  const tiles::Hull hull = tiles::bwd_rows<4>(a, b, h, q0 + warp * 16 + g, red, &rows);
  const bool has_block = a.mask.block != nullptr;
  const int t_begin = hull.lo < hull.hi ? hull.lo / BC : 0;
  const int t_end = hull.lo < hull.hi ? (hull.hi + BC - 1) / BC : 0;
  auto rows_in = [&](int64_t j0) { return static_cast<int>(nk - j0 < BC ? nk - j0 : BC); };

  float acc[D / 2];  // dQ / scale: my 2 rows x D/4 columns (wgmma accumulator)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  const uint64_t dQd0 = v3::desc_k_base<kRows>(sQ, 0), dOd0 = v3::desc_k_base<kRows>(sdO, 0);
  int t = t_begin, buf = 0;
  if (t < t_end) {
    v3::load_sw128<T, BC, D, kThreads>(sKV, Kg + int64_t(t) * BC * ks, ks, rows_in(int64_t(t) * BC), tid);
    v3::load_sw128<T, BC, D, kThreads>(sKV + BC * D, Vg + int64_t(t) * BC * vs, vs, rows_in(int64_t(t) * BC), tid);
  }
  cp_async_commit();
  for (; t < t_end; ++t) {
    const int j0 = t * BC;
    const bool full = !has_block && hull.full_lo <= j0 && j0 + BC <= hull.full_hi;
    T* const cK = sKV + buf * (2 * BC * D);
    T* const cV = cK + BC * D;
    if (t + 1 < t_end) {
      T* const nK = sKV + (buf ^ 1) * (2 * BC * D);
      const int64_t jn = int64_t(t + 1) * BC;
      v3::load_sw128<T, BC, D, kThreads>(nK, Kg + jn * ks, ks, rows_in(jn), tid);
      v3::load_sw128<T, BC, D, kThreads>(nK + BC * D, Vg + jn * vs, vs, rows_in(jn), tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    v3::fence_proxy_async();
    __syncthreads();

    v3::dq_tile<T, D, kRows, BC>(acc, dQd0, dOd0, cK, cV, rows, full, has_block, j0, t4, sl2, a, q0 + warp * 16 + g);
    __syncthreads();
    buf ^= 1;
  }
  cp_async_wait<0>();
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t r = q0 + warp * 16 + g + 8 * ri;
    if (r < nq) epilogue::store_row<T, D>(a.dQ.row(b, h, r), acc, ri, t4, static_cast<float>(a.scale));
  }
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ dK, dV
template <class T, int D, int BQ>
__global__ void __launch_bounds__(kThreads, 2) v3_bwd_dkdv_kernel(BwdArgs<T, T> a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(align1024(smem_raw));  // (64, D) sw128
  T* sV = sK + kRows * D;                              // (64, D)
  T* sQO = sV + kRows * D;                             // 2 x [(BQ, D) Q, (BQ, D) dO]
  float* sLD = reinterpret_cast<float*>(sQO + 4 * BQ * D);  // 2 x [(BQ) LSE log2e, (BQ) D]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int64_t j0 = int64_t(blockIdx.x) * kRows, hk = blockIdx.y, b = blockIdx.z;
  const int64_t nq = a.nq, nk = a.nk, G = a.group;
  const int nvk = static_cast<int>(nk - j0 < kRows ? nk - j0 : kRows);
  v3::load_sw128<T, kRows, D, kThreads>(sK, a.K.row(b, hk, j0), a.K.stride[2], nvk, tid);
  v3::load_sw128<T, kRows, D, kThreads>(sV, a.V.row(b, hk, j0), a.V.stride[2], nvk, tid);
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
    v3::load_sw128<T, BQ, D, kThreads>(dst, a.Q.row(b, h, i0), a.Q.stride[2], nv, tid);
    v3::load_sw128<T, BQ, D, kThreads>(dst + BQ * D, a.dO.row(b, h, i0), a.dO.stride[2], nv, tid);
    tiles::stage_row_stats<BQ, kThreads>(sLD + bufi * (2 * BQ), a, b, h, i0, nv);
  };

  float dk[D / 2], dv[D / 2];  // my 2 keys x D/4 columns (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int krow = warp * 16;
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sK, 0), dVd0 = v3::desc_k_base<kRows>(sV, 0);
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
    v3::fence_proxy_async();
    __syncthreads();
    const T* cQ = sQO + buf * (2 * BQ * D);
    const T* cO = cQ + BQ * D;
    const float* cL = sLD + buf * (2 * BQ);
    const float* cD = cL + BQ;
    const int64_t i0 = int64_t(it % nqt) * BQ;

    float s[BQ / 2], dp[BQ / 2];  // S^T = K Q^T, dP^T = V dO^T: my keys x BQ rows
    const uint64_t dKd = v3::opaque(dKd0), dVd = v3::opaque(dVd0);
    const uint64_t dQb = v3::opaque(v3::desc_k_base<BQ>(cQ, 0)), dOb = v3::opaque(v3::desc_k_base<BQ>(cO, 0));
    v3::pin(dk);
    v3::pin(dv);
    v3::two_products<T, D, kRows, BQ>(s, dp, dKd, dQb, dVd, dOb);
    // P^T and dS^T; element (key krow + g + 8 ((e >> 1) & 1), row 8 (e >> 2) + 2 t4 + (e & 1))
#pragma unroll
    for (int e = 0; e < BQ / 2; ++e) {
      const int il = (e >> 2) * 8 + 2 * t4 + (e & 1);
      const int64_t jg = j0 + krow + g + 8 * ((e >> 1) & 1), ig = i0 + il;
      bool vis = full;
      if (!vis) vis = ig < nq && jg < nk && visible(a.mask, a.qp[ig], a.kp.start + jg);
      const float p = vis ? ex2(fmaf(s[e], sl2, -cL[il])) : 0.f;
      s[e] = p;                      // P^T
      dp[e] = p * (dp[e] - cD[il]);  // dS^T (5.5)
    }
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
    v3::pack_a<T, BQ>(pa, s);
    v3::pack_a<T, BQ>(sa, dp);
    const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
    v3::dvdk_products<T, D, BQ>(dv, dk, pa, sa, dOt, dQt);
    v3::wait<0>();
    v3::pin(dk);
    v3::pin(dv);
    v3::pin(pa);
    v3::pin(sa);
    __syncthreads();
    buf ^= 1;
    it = itn;
    full = full_next;
  }
  cp_async_wait<0>();
  epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
#else
  __trap();
#endif
}

template <class T, int D, int BC, int BQ>
void launch_bwd(const BwdArgs<T, T>& a, cudaStream_t s) {
  if (a.nq > 0) {
    const size_t smem = size_t(2 * kRows + 4 * BC) * D * sizeof(T) + 1024;
    allow_smem(reinterpret_cast<const void*>(&v3_bwd_dq_kernel<T, D, BC>), smem);
    const dim3 grid(static_cast<unsigned>((a.nq + kRows - 1) / kRows), static_cast<unsigned>(a.Hq),
                    static_cast<unsigned>(a.B));
    v3_bwd_dq_kernel<T, D, BC><<<grid, kThreads, smem, s>>>(a);
    BURSTLAB_CUDA_LAUNCH_CHECK("v3_bwd_dq_kernel");
  }
  if (a.nk > 0) {
    const size_t smem = size_t(2 * kRows + 4 * BQ) * D * sizeof(T) + 4 * BQ * sizeof(float) + 1024;
    allow_smem(reinterpret_cast<const void*>(&v3_bwd_dkdv_kernel<T, D, BQ>), smem);
    const dim3 grid(static_cast<unsigned>((a.nk + kRows - 1) / kRows), static_cast<unsigned>(a.Hkv),
                    static_cast<unsigned>(a.B));
    v3_bwd_dkdv_kernel<T, D, BQ><<<grid, kThreads, smem, s>>>(a);
    BURSTLAB_CUDA_LAUNCH_CHECK("v3_bwd_dkdv_kernel");
  }
}

}  // namespace

// Tuning knob for the benchmark only: BURSTLAB_V3_BWD_CFG = 0 (default) or 1 (cuda/README.md).
int v3_bwd_cfg() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V3_BWD_CFG"));
  return v;
}

template <class T>
void v3_backward(const BwdArgs<T, T>& a, cudaStream_t s) {
  const int cfg = std::is_same<T, bf16>::value ? v3_bwd_cfg() : 0;  // tuning: bf16 only
  // Defaults measured on an H200 (docs/performance-gpu.md): key tiles of 64 in the dQ pass and
  // query tiles of 64 in the dK/dV pass (d = 64: 113 vs 90 TFLOP/s at N = 8K; d = 128: 157 vs
  // 152); cfg 1 keeps the first shapes (dQ key tiles of 128 at d = 64, dK/dV query tiles of 32
  // at d = 128).
  if (a.d == 64) {
    if (cfg == 1) launch_bwd<T, 64, 128, 64>(a, s);
    else launch_bwd<T, 64, 64, 64>(a, s);
  } else if (a.d == 128) {
    if (cfg == 1) launch_bwd<T, 128, 64, 32>(a, s);
    else launch_bwd<T, 128, 64, 64>(a, s);
  } else {
    fail("d (", a.d, ") must be 64 or 128 for v3");
  }
}

template void v3_backward<bf16>(const BwdArgs<bf16, bf16>&, cudaStream_t);
template void v3_backward<f16>(const BwdArgs<f16, f16>&, cudaStream_t);

}  // namespace burstlab::cuda::detail
