// cuda/v5_bwd.cu — variant 5: the backward (spec §5, eq. 5.1-5.7; §5.3) in one pass, as v4's
// one-pass mode (the same CTA, producer, row facts and dQ scratch: bwd_ws.cuh), with two ideas:
//   - P^T and dS^T go to shared memory (dS^T already does, for dQ_part = dS K), and
//     dV += P^T dO (5.3) and dK += dS^T Q (5.7) read them there (both operands in shared
//     memory) instead of from registers: the 32 registers of their A fragments are free once
//     they are stored;
//   - with those registers, the next tile's S^T = K Q^T and dP^T = V dO^T are issued before
//     this tile's dQ_part block is written out: the block's stores, its barriers and its bulk
//     atomic add run while the tensor cores compute the next products.
// The second needs the registers the first frees and more: at d = 128 dV, dK and dQ_part's
// accumulators leave too few (ptxas serializes every product), so it exists at d = 64 only, where
// it was measured slower (docs/performance-gpu.md): the default runs the first idea alone. Each
// configuration is a knob (BURSTLAB_V5_CFG, bf16, benchmark only): 0 shared-memory operands (the
// default), 1 both ideas (d = 64; d = 128: as 0), 2 the next products early with P^T and dS^T
// from registers (d = 64; d = 128: as 3), 3 neither (v4's one-pass order in this kernel).
// CTA = (b, kv-head, 128 keys); per visited (q-head, 64-row query tile), in order:
//   wait S^T, dP^T; P^T = 2^(S^T c - LSE) (5.2) and dS^T = P^T (dP^T - D) (5.5) in registers,
//   rounded to T into shared memory; barrier 1 (both warpgroups' dS^T); dV, dK (5.3, 5.7) and
//   dQ_part = dS K over the CTA's 128 keys (5.6; half of d per warpgroup) issued; wait for dV,
//   dK (the stage released), then dQ_part; dQ_part to dq_acc; the next tile's S^T, dP^T issued
//   (knobs 1, 2: before the wait for dV, dK and dQ_part).
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

template <int D, bool SS>
constexpr size_t v5_smem(size_t elem) {
  return size_t(2 * kRows + 2 * kStages * kBQ) * D * elem  // K, V; the ring's Q, dO
         + 2 * kRows * kBQ * elem                          // 2 x dS^T
         + (SS ? kRows * kBQ * elem : 0)                   // P^T
         + 2 * 32 * D * sizeof(float)                      // 2 x dQ_part block
         + kStages * sizeof(RowStats<kBQ>) + 1024;
}

// One tile's math after its S^T and dP^T are waited for: P^T (5.2) and dS^T (5.5) from them,
// rounded to T into shared memory (dS^T: buffer cS, read by both warpgroups; SS: P^T too); dV, dK
// (5.3, 5.7) and dQ_part = dS K (5.6) issued and committed, not waited for. With SS the products
// read P^T and dS^T from shared memory; else from the A fragments pa, sa, which the caller keeps
// until they end.
template <class T, int D, bool BLOCK, bool SS>
__device__ __forceinline__ void tile_products(float (&s)[kBQ / 2], float (&dp)[kBQ / 2], float (&dv)[D / 2],
                                              float (&dk)[D / 2], float (&dq)[D / 4], uint32_t (&pa)[kBQ / 16][4],
                                              uint32_t (&sa)[kBQ / 16][4], const RowStats<kBQ>& R,
                                              const BwdArgs<T, T>& a, const T* cQ, const T* cO, T* cS, T* sP,
                                              const T* kB, int64_t i0, int64_t j0, int wg, int krow, int g, int t4,
                                              float sl2) {
  constexpr int BQ = kBQ, kN = D / 2;
  dkdv_p<T, T, BQ, BLOCK, false>(s, R, R.full, a, i0, j0, krow, g, t4, sl2);  // P^T (5.2)
  v3::pack_a<T, BQ>(pa, s);
  dkdv_ds<BQ>(dp, s, R, t4);  // dS^T (5.5)
  v3::pack_a<T, BQ>(sa, dp);
  store_a_tile<T, BQ>(cS, sa, krow, g, t4);
  if constexpr (SS) store_a_tile<T, BQ>(sP, pa, krow, g, t4);  // my previous dV has read it (waited for)
  v3::fence_proxy_async();
  const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
  if constexpr (!SS) v3::dvdk_products<T, D, BQ>(dv, dk, pa, sa, dOt, dQt);
  tma::bar_sync(1, 256);  // both warpgroups' dS^T (and P^T) stored
  if constexpr (SS) {
    const uint64_t dPa = v3::opaque(v3::desc_k_base<kRows>(sP, wg * 64));
    const uint64_t dSa = v3::opaque(v3::desc_k_base<kRows>(cS, wg * 64));
    v3::fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      v3::Wgmma<T>::template ss<D, 1>(dv, v3::desc_k_step<kRows>(dPa, kk), v3::desc_mn_step(dOt, kk), 1);  // dV += P^T dO
      v3::Wgmma<T>::template ss<D, 1>(dk, v3::desc_k_step<kRows>(dSa, kk), v3::desc_mn_step(dQt, kk), 1);  // dK += dS^T Q
    }
    v3::commit();
  }
  const uint64_t dA = v3::opaque(v3::desc_mn_base<kRows>(cS));
  const uint64_t dB = v3::opaque(v3::desc_mn_base<kRows>(kB));
  v3::Wgmma<T>::template ss0<kN, 1, 1>(dq, dA, dB);
#pragma unroll
  for (int kk = 1; kk < kRows / 16; ++kk)
    v3::Wgmma<T>::template ss<kN, 1, 1>(dq, v3::desc_mn_step(dA, kk), v3::desc_mn_step(dB, kk), 1);
  v3::commit();
}

template <class T, int D, bool BLOCK, bool SS, bool PIPE>
__global__ void __launch_bounds__(kThreads, 1)
    v5_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                  const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, T> a,
                  float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages, BQ = kBQ, kN = D / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(align1024(smem_raw));  // (128, D) sw128
  T* sV = sK + kRows * D;                              // (128, D)
  T* sQO = sV + kRows * D;                             // S x [(BQ, D) Q, (BQ, D) dO]
  T* sdS = sQO + S * 2 * BQ * D;                       // 2 x (128 keys, BQ) dS^T, sw128
  T* sP = sdS + 2 * kRows * BQ;                        // SS: (128 keys, BQ) P^T, sw128
  float* sdQ = reinterpret_cast<float*>(sP + (SS ? kRows * BQ : 0));  // 2 x (64, d/2) dQ_part
  RowStats<BQ>* sR = reinterpret_cast<RowStats<BQ>*>(sdQ + 2 * 32 * D);  // S x facts
  __shared__ RingBars<S> bars;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const DkdvCta cta = dkdv_cta<BQ>(a);
  const int64_t hk = cta.hk, b = cta.b, j0 = cta.j0, group = a.group;
  const int nqt = cta.nqt;
  if (tid == 0) init_dkdv_bars(bars);
  __syncthreads();
  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP>();
    dkdv_producer<T, T, D, BQ, S, BLOCK, false>(a, cta, &mK, &mV, &mQ, &mdO, sK, sV, sQO, sR, bars, warp, lane);
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
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sK, wg * 64), dVd0 = v3::desc_k_base<kRows>(sV, wg * 64);
  // dQ_part's B: my d/2 columns of K (panel wg at d = 128; 64 bytes into the swizzled rows at d = 64).
  const T* kB = D == 128 ? sK + wg * kRows * 64 : sK + wg * kN;
  tma::wait(&bars.once, 0);
  int st = 0;
  uint32_t ph = 0;
  tma::wait(&bars.full[st], ph);
  int it = sR[st].it;
  // Every iteration ends with all its products waited for: ptxas serializes every product of a
  // kernel in which some are in flight across the loop's back edge.
  if constexpr (PIPE) {
    // S^T, dP^T: my keys x BQ rows, issued for tile t + 1 during tile t, before its dQ block leaves.
    float s[BQ / 2], dp[BQ / 2];
    if (it >= 0) {
      issue_sdp<T, D>(s, dp, dKd0, dVd0, sQO, sQO + BQ * D);
      v3::wait<0>();
    }
    while (it >= 0) {
      const RowStats<BQ>& R = sR[st];
      const T* cQ = sQO + st * (2 * BQ * D);
      v3::pin(s);
      v3::pin(dp);
      v3::pin(dk);
      v3::pin(dv);
      float dq[kN / 2];  // dQ_part: 64 query rows x my d/2 columns, over all 128 keys
      uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
      tile_products<T, D, BLOCK, SS>(s, dp, dv, dk, dq, pa, sa, R, a, cQ, cQ + BQ * D, sdS + dsb * (kRows * BQ), sP, kB,
                                     int64_t(it % nqt) * BQ, j0, wg, krow, g, t4, sl2);
      int st2 = st + 1;
      uint32_t ph2 = ph;
      if (st2 == S) { st2 = 0; ph2 ^= 1; }
      tma::wait(&bars.full[st2], ph2);
      const int it2 = sR[st2].it;
      if (it2 >= 0) {  // the next tile's products, queued behind dV, dK and dQ_part
        const T* nQ = sQO + st2 * (2 * BQ * D);
        issue_sdp<T, D>(s, dp, dKd0, dVd0, nQ, nQ + BQ * D);
        v3::wait<1>();
      } else {
        v3::wait<0>();
      }
      v3::pin(dk);
      v3::pin(dv);
      v3::pin(dq);
      if constexpr (!SS) {  // read by dV's and dK's products until the wait above
        v3::pin(pa);
        v3::pin(sa);
      }
      tma::arrive(&bars.empty[st]);  // release: my reads of the stage and its row facts before it
      const int64_t h = hk * group + it / nqt, qt = it % nqt;
      dq_block_add<D>(dq, sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
      v3::wait<0>();
      dsb ^= 1;
      st = st2;
      ph = ph2;
      it = it2;
    }
  } else {
    while (it >= 0) {  // v4's order: S^T, dP^T, their wait, the tile's products and their wait, the block
      const RowStats<BQ>& R = sR[st];
      const T* cQ = sQO + st * (2 * BQ * D);
      float s[BQ / 2], dp[BQ / 2];
      v3::pin(dk);
      v3::pin(dv);
      issue_sdp<T, D>(s, dp, dKd0, dVd0, cQ, cQ + BQ * D);
      v3::wait<0>();
      v3::pin(s);
      v3::pin(dp);
      float dq[kN / 2];
      uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
      tile_products<T, D, BLOCK, SS>(s, dp, dv, dk, dq, pa, sa, R, a, cQ, cQ + BQ * D, sdS + dsb * (kRows * BQ), sP, kB,
                                     int64_t(it % nqt) * BQ, j0, wg, krow, g, t4, sl2);
      v3::wait<1>();  // dV, dK done: the stage may be refilled while dQ_part runs
      v3::pin(dk);
      v3::pin(dv);
      if constexpr (!SS) {
        v3::pin(pa);
        v3::pin(sa);
      }
      tma::arrive(&bars.empty[st]);
      v3::wait<0>();
      v3::pin(dq);
      const int64_t h = hk * group + it / nqt, qt = it % nqt;
      dq_block_add<D>(dq, sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
      dsb ^= 1;
      if (++st == S) { st = 0; ph ^= 1; }
      tma::wait(&bars.full[st], ph);
      it = sR[st].it;
    }
  }
  if (wtid == 0) tma::bulk_wait();  // the last block is read before the CTA exits
  epilogue::store_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
#else
  __trap();
#endif
}

// Tuning knob for the benchmark only: BURSTLAB_V5_CFG = 0 (default) .. 3 (the file's comment).
int v5_cfg() {
  static const int v = env_int("BURSTLAB_V5_CFG");
  return v;
}

template <class T, int D, bool BLOCK, bool SS, bool PIPE>
void launch_v5(const CUtensorMap (&m)[4], const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s) {
  auto k = &v5_bwd_kernel<T, D, BLOCK, SS, PIPE>;
  constexpr size_t smem = v5_smem<D, SS>(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  const int64_t ctas = (a.nk + kRows - 1) / kRows * a.Hkv * a.B;  // 1-d: see dkdv_cta
  if (ctas > INT_MAX) fail("v5 backward: ", ctas, " CTAs exceed the grid limit");
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("v5_bwd_kernel");
}

template <class T, int D>
bool launch_bwd(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  constexpr bool bf = std::is_same<T, bf16>::value;
  // The next products early need 64 more live registers than dV, dK and dQ_part's accumulators
  // leave at d = 128 (ptxas then serializes every product and spills ~660 bytes): d = 64 only.
  // Measured slower there (docs/performance-gpu.md): a knob, not the default.
  constexpr bool kPipe = D == 64;
  CUtensorMap m[4];
  if (!one_pass_maps(a, m, why)) return false;
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  const bool block = a.mask.block != nullptr;
  int cfg = 0;
  if constexpr (bf) cfg = block ? 0 : v5_cfg();  // tuning: bf16 only
  if constexpr (bf) {
    if (cfg == 1) launch_v5<T, D, false, true, kPipe>(m, a, dq_acc, s);
    if (cfg == 2) launch_v5<T, D, false, false, kPipe>(m, a, dq_acc, s);
    if (cfg == 3) launch_v5<T, D, false, false, false>(m, a, dq_acc, s);
  }
  if (cfg < 1 || cfg > 3) {
    if (block) launch_v5<T, D, true, true, false>(m, a, dq_acc, s);
    else launch_v5<T, D, false, true, false>(m, a, dq_acc, s);
  }
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
