// cuda/v15_bwd.cu — variant 15: v14's one-pass backward (spec §5, eq. 5.1-5.7; §5.3) at d = 64
// with 128-row query tiles, FlashAttention-3's tile for this head dimension. A dK/dV CTA still
// holds 128 keys (64 per consumer warpgroup), but each stage of the ring brings 128 query rows of
// Q and dO: S^T and dP^T are m64n128 products, dV += P^T dO and dK += dS^T Q run over 128 rows,
// and dQ_part is two m64n32 products per warpgroup (query rows 0-63 and 64-127, the two panels of
// the dS^T tile), handed to the store thread as two of v14's fp32 blocks (dq_acc keeps its
// 64-row blocks, so dq_convert is shared). Half as many tiles per CTA pay the per-tile work that
// is not a product: the ring's barriers, the mask test, the dS^T barrier, the hand-offs, the
// descriptors. Shared memory: 213 KiB (v14: 131 KiB); d = 128 would not fit. Otherwise as v14: whole
// backward only; no deterministic mode.
#include "bwd_ss.cuh"

namespace burstlab::cuda::detail {
namespace {

constexpr int kD15 = 64, kBQ15 = 128;

template <class T, bool BLOCK>
__global__ void __launch_bounds__(kThreads, 1)
    v15_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                   const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO,
                   BwdArgs<T, T> a, float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = kD15, S = kStages, BQ = kBQ15, kN = D / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const OnePassSmem<T, BQ> sm = one_pass_smem<T, D, BQ>(smem_raw);
  __shared__ RingBars<S> bars;
  __shared__ DqHandOff hand;
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / 32, 0), lane = tid % 32, g = lane >> 2,
            t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const DkdvCta cta = dkdv_cta<BQ>(a);
  const int64_t hk = cta.hk, b = cta.b, j0 = cta.j0, group = a.group;
  const int nqt = cta.nqt;
  if (tid == 0) {
    for (int w = 0; w < 2; ++w) {
      tma::init(&hand.full[w], 128);
      tma::init(&hand.empty[w], 1);
    }
    init_dkdv_bars(bars);  // its fence_init covers these too
  }
  __syncthreads();
  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP>();
    if (warp >= 2) {
      if (lane == 0) dq_store<D>(sm.sdQ + (warp - 2) * (kN * 64), hand, dq_acc, warp - 2);
      return;
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
  const int64_t nq64 = (a.nq + 63) / 64;  // dq_acc's 64-row blocks per (b, h)
  int dsb = 0;                            // dS^T buffer
  uint32_t dq_ph = 0;                     // the phase of my dq_empty
  float dk[D / 2], dv[D / 2];             // my 2 keys x D/4 columns (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sm.sK, wg * 64), dVd0 = v3::desc_k_base<kRows>(sm.sV, wg * 64);
  const T* kB = sm.sK + wg * kN;  // dQ_part's B: my d/2 columns of K, 64 bytes into the swizzled rows
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
    issue_sdp<T, D, BQ>(s, dp, dKd0, dVd0, cQ, cO);
    v3::wait<0>();
    v3::pin(s);
    v3::pin(dp);
    float dq[2][kN / 2];  // dQ_part: query rows 64 hq .. 64 hq + 63 x my d/2 columns, over all 128 keys
    {
      dkdv_p<T, T, BQ, BLOCK, false>(s, R, R.full, a, int64_t(it % nqt) * BQ, j0, krow, g, t4, sl2);  // P^T (5.2)
      dkdv_ds<BQ>(dp, s, R, t4);  // dS^T (5.5), before P^T is packed: s and dp die as they are packed
      uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
      v3::pack_a<T, BQ>(pa, s);
      store_a_tile<T, BQ>(sm.sP, pa, krow, g, t4);  // my previous dV has read it (waited for)
      v3::pack_a<T, BQ>(sa, dp);
      store_a_tile<T, BQ>(cS, sa, krow, g, t4);
      v3::fence_proxy_async();
      const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
      tma::bar_sync(1, 256);  // both warpgroups' dS^T and P^T stored
      const uint64_t dPa = v3::opaque(v3::desc_k_base<kRows>(sm.sP, wg * 64));
      const uint64_t dSa = v3::opaque(v3::desc_k_base<kRows>(cS, wg * 64));
      issue_dvdk_ss<T, D, BQ>(dv, dk, dPa, dSa, dOt, dQt);
      issue_dq_part<T, D>(dq[0], cS, kB);                 // query rows 0-63: panel 0 of the dS^T tile
      issue_dq_part<T, D>(dq[1], cS + kRows * 64, kB);    // rows 64-127: panel 1
    }
    v3::wait<2>();  // dV, dK done: the stage may be refilled while dQ_part runs
    v3::pin(dk);
    v3::pin(dv);
    tma::arrive(&bars.empty[st]);  // release: my reads of the stage and its row facts before it
    const int64_t h = hk * group + it / nqt, q64 = 2 * int64_t(it % nqt);
    v3::wait<1>();
    v3::pin(dq[0]);
    dq_hand_off<D>(dq[0], sm.sdQ + wg * (kN * 64), hand, dq_acc_index(a, b, h, q64, wg), wg, wtid, &dq_ph);
    v3::wait<0>();
    v3::pin(dq[1]);
    if (q64 + 1 < nq64)  // the tile's second half holds rows below nq
      dq_hand_off<D>(dq[1], sm.sdQ + wg * (kN * 64), hand, dq_acc_index(a, b, h, q64 + 1, wg), wg, wtid, &dq_ph);
    dsb ^= 1;
    if (++st == S) { st = 0; ph ^= 1; }
    tma::wait(&bars.full[st], ph);
    it = sm.sR[st].it;
  }
  dq_end(hand, wg, wtid, &dq_ph);
  epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
#else
  __trap();
#endif
}

template <class T, bool BLOCK>
void launch_v15(const CUtensorMap (&m)[4], const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s) {
  auto k = &v15_bwd_kernel<T, BLOCK>;
  constexpr size_t smem = one_pass_smem_bytes<kD15, kBQ15>(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  const int64_t ctas = (a.nk + kRows - 1) / kRows * a.Hkv * a.B;  // 1-d: see dkdv_cta
  if (ctas > INT_MAX) fail("v15 backward: ", ctas, " CTAs exceed the grid limit");
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("v15_bwd_kernel");
}

}  // namespace

template <class T>
bool v15_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != kD15) { *why = "v15 needs d = 64"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    v3_backward<T>(a, s);        // v3 writes the zeros
    return true;
  }
  CUtensorMap m[4];
  if (!one_pass_maps<kBQ15>(a, m, why)) return false;
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  if (a.mask.block) launch_v15<T, true>(m, a, dq_acc, s);
  else launch_v15<T, false>(m, a, dq_acc, s);
  launch_dq_convert<T, T, kD15>(a, dq_acc, s);
  return true;
}

template bool v15_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v15_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
