// cuda/bwd_ss.cuh — the kernel of v5 and v14 (spec §5, eq. 5.1-5.7; §5.3): v4's one-pass backward
// with P^T and dS^T in shared memory, read there by dV's and dK's products (v5_bwd.cu says how and
// why), and, with STORE, v14's dQ store threads (v14_bwd.cu). Internal, like bwd_ws.cuh: include
// from .cu files compiled for sm_90a only; each gets its own copy of the kernels.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "bwd_ws.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

// The hand-off of consumer warpgroup w's dQ_part block: full (128 arrivals: the consumers, after
// their stores) and empty (1: the store thread, once the copy engine has read the block), and the
// block's offset in dq_acc (< 0: no more blocks).
struct DqHandOff {
  uint64_t full[2], empty[2];
  int64_t off[2];
};

// Store thread w: adds each block qs (fp32 (64, d/2)) of consumer warpgroup w into dq_acc.
template <int D>
__device__ __forceinline__ void dq_store(const float* qs, DqHandOff& h, float* dq_acc, int w) {
  constexpr uint32_t kBytes = D / 2 * 64 * sizeof(float);
  tma::arrive(&h.empty[w]);  // the block starts free
  for (uint32_t ph = 0;; ph ^= 1) {
    tma::wait(&h.full[w], ph);
    const int64_t o = h.off[w];
    if (o < 0) break;
    tma::reduce_add_f32(dq_acc + o, qs, kBytes);
    tma::bulk_commit();
    tma::bulk_wait_read();
    tma::arrive(&h.empty[w]);
  }
  tma::bulk_wait();  // the last add is done before the CTA exits
}

// The consumer side: waits for my block to be free (phase *ph of empty), stores dq there
// (conflict-free 16-byte stores) with its offset o in dq_acc, and passes it on without waiting.
template <int D>
__device__ __forceinline__ void dq_hand_off(const float (&dq)[D / 4], float* qs, DqHandOff& h, int64_t o, int wg,
                                            int wtid, uint32_t* ph) {
  constexpr int kN = D / 2;
  tma::wait(&h.empty[wg], *ph);
  *ph ^= 1;
#pragma unroll
  for (int c = 0; c < kN / 8; ++c)
    reinterpret_cast<float4*>(qs)[c * 128 + wtid] = make_float4(dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3]);
  v3::fence_proxy_async();
  if (wtid == 0) h.off[wg] = o;
  tma::arrive(&h.full[wg]);
}

// Tells my store thread that no block follows.
__device__ __forceinline__ void dq_end(DqHandOff& h, int wg, int wtid, uint32_t* ph) {
  tma::wait(&h.empty[wg], *ph);
  *ph ^= 1;
  if (wtid == 0) h.off[wg] = -1;
  tma::arrive(&h.full[wg]);
}

// STORE: v14's dQ store threads (the hand-off above); else v5's, a consumer thread adds each block.
template <class T, int D, bool BLOCK, bool STORE>
__global__ void __launch_bounds__(kThreads, 1)
    ss_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                  const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, T> a,
                  float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages, BQ = kBQ, kN = D / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const OnePassSmem<T> sm = one_pass_smem<T, D>(smem_raw);
  __shared__ RingBars<S> bars;
  __shared__ DqHandOff hand;  // STORE only
  // warp through a shuffle, so that ptxas knows it is warp-uniform (measured faster: cuda/README.md)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / 32, 0), lane = tid % 32, g = lane >> 2,
            t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const DkdvCta cta = dkdv_cta<BQ>(a);
  const int64_t hk = cta.hk, b = cta.b, j0 = cta.j0, group = a.group;
  const int nqt = cta.nqt;
  if (tid == 0) {
    if constexpr (STORE) {
      for (int w = 0; w < 2; ++w) {
        tma::init(&hand.full[w], 128);
        tma::init(&hand.empty[w], 1);
      }
    }
    init_dkdv_bars(bars);  // its fence_init covers these too
  }
  __syncthreads();
  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP>();
    if constexpr (STORE) {
      if (warp >= 2) {
        if (lane == 0) dq_store<D>(sm.sdQ + (warp - 2) * (kN * 64), hand, dq_acc, warp - 2);
        return;
      }
    }
    dkdv_producer<T, T, D, BQ, S, BLOCK, false>(a, cta, &mK, &mV, &mQ, &mdO, sm.sK, sm.sV, sm.sQO, sm.sR, bars, warp,
                                                lane);
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<kRegC>();
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const int krow = (warp - 4) * 16;       // my warp's first key in the CTA
  const int wtid = tid - 128 * (wg + 1);  // my thread in the warpgroup
  int dsb = 0;                            // dS^T buffer
  uint32_t dq_ph = 0;                     // STORE: the phase of my dq_empty
  float dk[D / 2], dv[D / 2];             // my 2 keys x D/4 columns (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sm.sK, wg * 64), dVd0 = v3::desc_k_base<kRows>(sm.sV, wg * 64);
  // dQ_part's B: my d/2 columns of K (panel wg at d = 128; 64 bytes into the swizzled rows at d = 64).
  const T* kB = D == 128 ? sm.sK + wg * kRows * 64 : sm.sK + wg * kN;
  tma::wait(&bars.once, 0);
  int st = 0;
  uint32_t ph = 0;
  tma::wait(&bars.full[st], ph);
  int it = sm.sR[st].it;
  while (it >= 0) {
    const RowStats<BQ>& R = sm.sR[st];
    const T* cQ = sm.sQO + st * (2 * BQ * D);
    const T* cO = cQ + BQ * D;
    T* const cS = sm.sdS + dsb * (kRows * BQ);
    float s[BQ / 2], dp[BQ / 2];  // S^T, dP^T: my keys x BQ rows
    v3::pin(dk);
    v3::pin(dv);
    issue_sdp<T, D>(s, dp, dKd0, dVd0, cQ, cO);
    v3::wait<0>();
    v3::pin(s);
    v3::pin(dp);
    float dq[kN / 2];  // dQ_part: 64 query rows x my d/2 columns, over all 128 keys
    {
      dkdv_p<T, T, BQ, BLOCK, false>(s, R, R.full, a, int64_t(it % nqt) * BQ, j0, krow, g, t4, sl2);  // P^T (5.2)
      uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
      v3::pack_a<T, BQ>(pa, s);
      dkdv_ds<BQ>(dp, s, R, t4);  // dS^T (5.5)
      v3::pack_a<T, BQ>(sa, dp);
      store_a_tile<T, BQ>(cS, sa, krow, g, t4);
      store_a_tile<T, BQ>(sm.sP, pa, krow, g, t4);  // my previous dV has read it (waited for)
      v3::fence_proxy_async();
      const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
      tma::bar_sync(1, 256);  // both warpgroups' dS^T and P^T stored
      const uint64_t dPa = v3::opaque(v3::desc_k_base<kRows>(sm.sP, wg * 64));
      const uint64_t dSa = v3::opaque(v3::desc_k_base<kRows>(cS, wg * 64));
      issue_dvdk_ss<T, D>(dv, dk, dPa, dSa, dOt, dQt);
      issue_dq_part<T, D>(dq, cS, kB);
    }
    v3::wait<1>();  // dV, dK done: the stage may be refilled while dQ_part runs
    v3::pin(dk);
    v3::pin(dv);
    tma::arrive(&bars.empty[st]);  // release: my reads of the stage and its row facts before it
    v3::wait<0>();
    v3::pin(dq);
    const int64_t h = hk * group + it / nqt, qt = it % nqt;
    if constexpr (STORE) dq_hand_off<D>(dq, sm.sdQ + wg * (kN * 64), hand, dq_acc_index(a, b, h, qt, wg), wg, wtid, &dq_ph);
    else dq_block_add<D>(dq, sm.sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
    dsb ^= 1;
    if (++st == S) { st = 0; ph ^= 1; }
    tma::wait(&bars.full[st], ph);
    it = sm.sR[st].it;
  }
  if constexpr (STORE) dq_end(hand, wg, wtid, &dq_ph);
  else if (wtid == 0) tma::bulk_wait();  // the last block is read before the CTA exits
  epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
#else
  __trap();
#endif
}

template <class T, int D, bool BLOCK, bool STORE>
void launch_ss(const CUtensorMap (&m)[4], const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s) {
  auto k = &ss_bwd_kernel<T, D, BLOCK, STORE>;
  constexpr size_t smem = one_pass_smem_bytes<D>(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  const int64_t ctas = (a.nk + kRows - 1) / kRows * a.Hkv * a.B;  // 1-d: see dkdv_cta
  if (ctas > INT_MAX) fail(STORE ? "v14" : "v5", " backward: ", ctas, " CTAs exceed the grid limit");
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("ss_bwd_kernel");
}

template <class T, int D, bool STORE>
bool launch_bwd(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  CUtensorMap m[4];
  if (!one_pass_maps(a, m, why)) return false;
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  if (a.mask.block) launch_ss<T, D, true, STORE>(m, a, dq_acc, s);
  else launch_ss<T, D, false, STORE>(m, a, dq_acc, s);
  launch_dq_convert<T, T, D>(a, dq_acc, s);
  return true;
}


// v5's (STORE false) or v14's backward: false, nothing launched, where the call is not theirs.
template <class T, bool STORE>
bool ss_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != 64 && a.d != 128) { *why = STORE ? "v14 needs d in {64, 128}" : "v5 needs d in {64, 128}"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    v3_backward<T>(a, s);        // v3 writes the zeros
    return true;
  }
  return a.d == 64 ? launch_bwd<T, 64, STORE>(a, dq_acc, s, why) : launch_bwd<T, 128, STORE>(a, dq_acc, s, why);
}

}  // namespace
}  // namespace burstlab::cuda::detail
