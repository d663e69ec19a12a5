// cuda/v5_bwd.cu — variant 5: the backward (spec §5, eq. 5.1-5.7; §5.3) in one pass, as v4's
// one-pass mode (the same CTA, producer, row facts and dQ scratch: bwd_ws.cuh), with P^T and dS^T
// in shared memory (dS^T already goes there, for dQ_part = dS K): dV += P^T dO (5.3) and
// dK += dS^T Q (5.7) read both operands there instead of registers, so the 32 registers of their
// A fragments are free once stored (ptxas: 4 bytes of spill at d = 128 against v4's 36).
// Measured and dropped (docs/performance-gpu.md, knobs of commit 2f8fbd9): issuing the next tile's
// S^T and dP^T before a tile's dQ block leaves, with those registers; it fits at d = 64 only (at
// d = 128 ptxas serializes every product) and was slower there.
// CTA = (b, kv-head, 128 keys); per visited (q-head, 64-row query tile), in order:
//   S^T = K Q^T, dP^T = V dO^T issued and waited for; P^T = 2^(S^T c - LSE) (5.2) and
//   dS^T = P^T (dP^T - D) (5.5) in registers, rounded to T into shared memory; barrier 1 (both
//   warpgroups' dS^T); dV, dK and dQ_part = dS K over the CTA's 128 keys (5.6; half of d per
//   warpgroup) issued; wait for dV, dK (the stage released), then dQ_part; dQ_part to dq_acc.
// dQ's sums arrive in a varying order: not bitwise repeatable, so v5 has no deterministic mode
// (auto runs v4's two passes then). Whole backward only (backward_block runs v4).
// Limits: v4's (bf16/fp16, d in {64, 128}, views the copy engine can describe, compute
// capability 9.0); v5_backward returns false (nothing launched) otherwise.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "bwd_ws.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

template <class T, int D, bool BLOCK>
__global__ void __launch_bounds__(kThreads, 1)
    v5_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                  const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, T> a,
                  float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages, BQ = kBQ, kN = D / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const OnePassSmem<T> sm = one_pass_smem<T, D>(smem_raw);
  __shared__ RingBars<S> bars;
  // warp through a shuffle, so that ptxas knows it is warp-uniform (measured faster: cuda/README.md)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / 32, 0), lane = tid % 32, g = lane >> 2,
            t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const DkdvCta cta = dkdv_cta<BQ>(a);
  const int64_t hk = cta.hk, b = cta.b, j0 = cta.j0, group = a.group;
  const int nqt = cta.nqt;
  if (tid == 0) init_dkdv_bars(bars);
  __syncthreads();
  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP>();
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
    dq_block_add<D>(dq, sm.sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
    dsb ^= 1;
    if (++st == S) { st = 0; ph ^= 1; }
    tma::wait(&bars.full[st], ph);
    it = sm.sR[st].it;
  }
  if (wtid == 0) tma::bulk_wait();  // the last block is read before the CTA exits
  epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
#else
  __trap();
#endif
}

template <class T, int D, bool BLOCK>
void launch_v5(const CUtensorMap (&m)[4], const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s) {
  auto k = &v5_bwd_kernel<T, D, BLOCK>;
  constexpr size_t smem = one_pass_smem_bytes<D>(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  const int64_t ctas = (a.nk + kRows - 1) / kRows * a.Hkv * a.B;  // 1-d: see dkdv_cta
  if (ctas > INT_MAX) fail("v5 backward: ", ctas, " CTAs exceed the grid limit");
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("v5_bwd_kernel");
}

template <class T, int D>
bool launch_bwd(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  CUtensorMap m[4];
  if (!one_pass_maps(a, m, why)) return false;
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  if (a.mask.block) launch_v5<T, D, true>(m, a, dq_acc, s);
  else launch_v5<T, D, false>(m, a, dq_acc, s);
  launch_dq_convert<T, T, D>(a, dq_acc, s);
  return true;
}

}  // namespace

template <class T>
bool v5_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != 64 && a.d != 128) { *why = "v5 needs d in {64, 128}"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    v3_backward<T>(a, s);        // v3 writes the zeros
    return true;
  }
  return a.d == 64 ? launch_bwd<T, 64>(a, dq_acc, s, why) : launch_bwd<T, 128>(a, dq_acc, s, why);
}

template bool v5_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v5_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
