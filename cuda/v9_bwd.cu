// cuda/v9_bwd.cu — variant 9: v4's one-pass backward (spec §5, eq. 5.1-5.7; §5.3, §6.2) with its
// dK/dV CTAs taken longest first (LPT). The kernel is v4's one-pass dK/dV kernel (v4_bwd.cu:
// CTA = (b, kv-head, 128 keys), producer and row facts of bwd_ws.cuh, dQ_part = dS K added by the
// copy engine's bulk atomic add into fp32 scratch, then the convert kernel); only the map from
// blockIdx.x to (b, kv-head, key tile) differs: bwd_scheduler.cuh, whose order the launcher
// computes from the mask's band (causal, window, none), the positions and the device's resident
// CTAs. Within a pair its key tiles come in decreasing work (for causal masks that is v4's order,
// key tile 0 first); the last pairs, about two waves of the grid, take turns, all their heaviest
// tiles first, so that the grid ends on light tiles. Masks whose every tile has the same work
// (none), document masks and indexed positions keep v4's order.
// G = T: the whole backward; G = float: backward_block (the caller's LSE and D, gradients added;
// contiguous or indexed keys, KIDX), as v4's one-pass mode. No deterministic mode (dQ's sums
// arrive in a varying order). Limits: v4's one-pass mode's; v9_backward returns false (nothing
// launched) where v4 would decline.
// Tuning knob (benchmark and tests): BURSTLAB_V9_TAIL = 0 (default: the tail above), n > 0 (the
// last n pairs take turns; n >= B H_kv: every pair, tile rank by tile rank), -1 (no tail).
#include <climits>
#include <cstdint>
#include <type_traits>

#include "bwd_scheduler.cuh"
#include "bwd_ws.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

// The CTA's pair and keys: item blockIdx.x of the order o.
template <class T, class G>
__device__ __forceinline__ DkdvCta lpt_cta(const BwdArgs<T, G>& a, const sched::KeyOrder& o) {
  const sched::KeyItem item = sched::key_item(o, static_cast<int>(blockIdx.x));
  DkdvCta c;
  c.hk = item.pair % a.Hkv;
  c.b = item.pair / a.Hkv;
  c.j0 = int64_t(item.kt) * kRows;
  c.jend = c.j0 + (a.nk - c.j0 < kRows ? a.nk - c.j0 : kRows);
  c.nqt = static_cast<int>((a.nq + kBQ - 1) / kBQ);
  c.n_it = static_cast<int>(a.group) * c.nqt;
  return c;
}

constexpr size_t v9_smem(int d, size_t elem) {
  return size_t(2 * kRows + 2 * kStages * kBQ) * d * elem + kStages * sizeof(RowStats<kBQ>) +
         2 * kRows * kBQ * elem + 2 * 32 * d * sizeof(float) + 1024;
}

// v4_bwd_dkdv_kernel's one-pass (FUSED) path, the CTA from lpt_cta.
template <class T, class G, int D, bool BLOCK, bool KIDX>
__global__ void __launch_bounds__(kThreads, 1)
    v9_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                  const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, G> a,
                  float* dq_acc, const sched::KeyOrder o) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages, BQ = kBQ;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(align1024(smem_raw));  // (128, D) sw128
  T* sV = sK + kRows * D;                              // (128, D)
  T* sQO = sV + kRows * D;                             // S x [(BQ, D) Q, (BQ, D) dO]
  T* sdS = sQO + S * 2 * BQ * D;                       // 2 x (128 keys, BQ) dS^T, sw128 (1024-aligned)
  float* sdQ = reinterpret_cast<float*>(sdS + 2 * kRows * BQ);          // 2 x (64, d/2) dQ_part
  RowStats<BQ>* sR = reinterpret_cast<RowStats<BQ>*>(sdQ + 2 * 32 * D);  // S x facts
  __shared__ RingBars<S> bars;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const DkdvCta cta = lpt_cta(a, o);
  const int64_t hk = cta.hk, b = cta.b, j0 = cta.j0, group = a.group;
  const int nqt = cta.nqt;
  if (tid == 0) init_dkdv_bars(bars);
  __syncthreads();
  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP>();
    dkdv_producer<T, G, D, BQ, S, BLOCK, KIDX>(a, cta, &mK, &mV, &mQ, &mdO, sK, sV, sQO, sR, bars, warp, lane);
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<kRegC>();
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const int krow = (warp - 4) * 16;       // my warp's first key in the CTA
  const int wtid = tid - 128 * (wg + 1);  // my thread in the warpgroup
  int dsb = 0;                            // dS^T buffer
  bool seen = false;                      // some query tile visited (G = float: else nothing to add)
  float dk[D / 2], dv[D / 2];             // my 2 keys x D/4 columns (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sK, wg * 64), dVd0 = v3::desc_k_base<kRows>(sV, wg * 64);
  tma::wait(&bars.once, 0);
  int st = 0;
  uint32_t ph = 0;
  for (;;) {
    const RowStats<BQ>& R = sR[st];
    tma::wait(&bars.full[st], ph);
    const int it = R.it;
    if (it < 0) break;
    seen = true;
    const bool full = R.full;
    const int64_t i0 = int64_t(it % nqt) * BQ;
    const T* cQ = sQO + st * (2 * BQ * D);
    const T* cO = cQ + BQ * D;

    float s[BQ / 2], dp[BQ / 2];  // S^T = K Q^T, dP^T = V dO^T: my keys x BQ rows
    const uint64_t dKd = v3::opaque(dKd0), dVd = v3::opaque(dVd0);
    const uint64_t dQb = v3::opaque(v3::desc_k_base<BQ>(cQ, 0)), dOb = v3::opaque(v3::desc_k_base<BQ>(cO, 0));
    const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
    v3::pin(dk);
    v3::pin(dv);
    v3::two_products<T, D, kRows, BQ>(s, dp, dKd, dQb, dVd, dOb);
    dkdv_p<T, G, BQ, BLOCK, KIDX>(s, R, full, a, i0, j0, krow, g, t4, sl2);  // P^T (5.2)
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
    v3::pack_a<T, BQ>(pa, s);
    dkdv_ds<BQ>(dp, s, R, t4);  // dS^T (5.5)
    v3::pack_a<T, BQ>(sa, dp);
    T* const cS = sdS + dsb * (kRows * BQ);
    // dS^T (key rows, query columns) as stored, rounded to T: v4's loop, not bwd_ws's store_a_tile
    // (with which ptxas spills 64 bytes here instead of 28).
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = krow + g + 8 * (j & 1), c = 16 * kk + 8 * (j >> 1) + 2 * t4;
        *reinterpret_cast<uint32_t*>(cS + v3::sw128<kRows>(r, c >> 3) + (c & 7)) = sa[kk][j];
      }
    v3::fence_proxy_async();
    v3::dvdk_products<T, D, BQ>(dv, dk, pa, sa, dOt, dQt);
    // dQ_part (64 query rows x my d/2 columns) = dS K over all 128 keys: both warpgroups' dS^T
    // (barrier 1 over the 256 consumer threads); my columns of K as in v4.
    constexpr int kN = D / 2;
    float dq[kN / 2];
    tma::bar_sync(1, 256);
    const T* kB = D == 128 ? sK + wg * kRows * 64 : sK + wg * kN;
    const uint64_t dA = v3::opaque(v3::desc_mn_base<kRows>(cS));
    const uint64_t dB = v3::opaque(v3::desc_mn_base<kRows>(kB));
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
      v3::Wgmma<T>::template ss<kN, 1, 1>(dq, v3::desc_mn_step(dA, kk), v3::desc_mn_step(dB, kk), kk);
    v3::commit();
    v3::wait<1>();  // dV, dK done: Q and dO of this stage may be refilled while dQ_part runs
    v3::pin(dk);
    v3::pin(dv);
    v3::pin(pa);
    v3::pin(sa);
    tma::arrive(&bars.empty[st]);  // release: my reads of the row facts before it
    v3::wait<0>();
    v3::pin(dq);
    const int64_t h = hk * group + it / nqt, qt = it % nqt;
    dq_block_add<D>(dq, sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
    dsb ^= 1;
    if (++st == S) { st = 0; ph ^= 1; }
  }
  if (wtid == 0) tma::bulk_wait();  // the last block is read before the CTA exits
  if constexpr (kAcc<T, G>) {
    if (seen) epilogue::write_dkdv<T, D, true>(a, b, hk, j0 + krow + g, dk, dv, t4);
  } else {
    epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
  }
#else
  __trap();
#endif
}

// Tuning knob for the benchmark and tests: BURSTLAB_V9_TAIL (the file's header).
int v9_tail_knob() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V9_TAIL"));
  return v;
}

template <class T, class G, int D>
bool launch_bwd(const BwdArgs<T, G>& a, float* dq_acc, cudaStream_t s, const char** why) {
  CUtensorMap m[4];
  if (!one_pass_maps(a, m, why)) return false;
  const int64_t nkb = (a.nk + kRows - 1) / kRows, ctas = nkb * a.Hkv * a.B;
  if (ctas > INT_MAX) fail("v9 backward: ", ctas, " CTAs exceed the grid limit");
  const bool block = a.mask.block != nullptr;
  auto k = block ? &v9_bwd_kernel<T, G, D, true, false> : &v9_bwd_kernel<T, G, D, false, false>;
  if constexpr (kAcc<T, G>)  // only blocks have indexed keys (their own instantiation, as in v4)
    if (a.kp.index) k = block ? &v9_bwd_kernel<T, G, D, true, true> : &v9_bwd_kernel<T, G, D, false, true>;
  constexpr size_t smem = v9_smem(D, sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  int dev = 0, sms = 0, per_sm = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  BURSTLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BURSTLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem));
  // The band's work profile; document masks and indexed positions: no estimate (flat).
  const bool flat = a.mask.doc != nullptr || a.qp.index != nullptr || a.kp.index != nullptr;
  const sched::KeyOrder o =
      sched::key_order(a.nq, a.nk, a.mask.N_q, a.mask.N_k, a.qp.start, a.kp.start, a.mask.left, a.mask.right, flat,
                       kRows, static_cast<int>(a.B * a.Hkv), int64_t(sms) * (per_sm > 0 ? per_sm : 1), v9_tail_knob());
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc, o);
  BURSTLAB_CUDA_LAUNCH_CHECK("v9_bwd_kernel");
  launch_dq_convert<T, G, D>(a, dq_acc, s);
  return true;
}

}  // namespace

template <class T, class G>
bool v9_backward(const BwdArgs<T, G>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != 64 && a.d != 128) { *why = "v9 needs d in {64, 128}"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    if constexpr (!kAcc<T, G>) v3_backward<T>(a, s);  // v3 writes the zeros; a block adds nothing
    return true;
  }
  return a.d == 64 ? launch_bwd<T, G, 64>(a, dq_acc, s, why) : launch_bwd<T, G, 128>(a, dq_acc, s, why);
}

template bool v9_backward<bf16, bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v9_backward<f16, f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);
template bool v9_backward<bf16, float>(const BwdArgs<bf16, float>&, float*, cudaStream_t, const char**);
template bool v9_backward<f16, float>(const BwdArgs<f16, float>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
