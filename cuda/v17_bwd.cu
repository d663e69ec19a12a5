// cuda/v17_bwd.cu — variant 17: v4's one-pass backward (spec §5, eq. 5.1-5.7; §5.3) with dQ_part
// one tile late, so that the two consumer warpgroups are no longer held in step.
// In v4 each warpgroup forms dQ_part = dS K (5.6) over all the CTA's 128 keys for half of d, so it
// needs both warpgroups' dS^T of the tile and they meet at a barrier every tile: both compute P^T and
// dS^T at the same moment while the tensor cores idle. Here dQ_part of tile n - 1 is issued in
// iteration n beside dV and dK of tile n, from a 2-slot ring of dS^T tiles with mbarriers (v6's:
// dsFull[slot][w], warpgroup w stored its half; dsEmpty[slot], both warpgroups' dQ_part read it), so
// a warpgroup waits for the other only when that one is a whole tile behind. v6 added turns at the
// tensor cores and the next tile's S^T and dP^T to the batch, which fit at d = 64 only; v17 has
// neither, keeps v4's register operands for dV and dK, and runs d = 64 and 128.
// Per iteration n of warpgroup w (tile n in ring stage st):
//   S^T = K Q^T, dP^T = V dO^T issued and waited for; P^T (5.2), dS^T (5.5) in registers; dS^T into
//   slot n % 2 (after its dsEmpty); arrive dsFull; dV += P^T dO, dK += dS^T Q (A from registers);
//   dQ_part of tile n - 1 (after both halves' dsFull); wait for dV, dK (stage released), then
//   dQ_part (slot released, its block to dq_acc). Nothing is in flight across the loop's back edge
//   (ptxas would serialize every product), and the product of iteration 0 reads slot 1 before
//   anything is there and is discarded (a product under a branch makes ptxas serialize them all).
// dQ's sums arrive in a varying order: no deterministic mode (auto runs v4 then). Whole backward
// only. Limits: v4's; v17_backward returns false (nothing launched) otherwise.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "bwd_ws.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

struct DsRing {
  uint64_t full[2][kWgs];  // slot s, half w stored (128 arrivals: warpgroup w's threads)
  uint64_t empty[2];       // slot s read by both warpgroups' dQ_part (256 arrivals)
};

template <class T, int D, bool BLOCK>
__global__ void __launch_bounds__(kThreads, 1)
    v17_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                   const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, T> a,
                   float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages, BQ = kBQ, kN = D / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const OnePassSmem<T> sm = one_pass_smem<T, D>(smem_raw);  // dS^T tiles: the ring's 2 slots
  __shared__ RingBars<S> bars;
  __shared__ DsRing ds;
  // warp through a shuffle, so that ptxas knows it is warp-uniform (measured faster: cuda/README.md)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / 32, 0), lane = tid % 32, g = lane >> 2,
            t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const DkdvCta cta = dkdv_cta<BQ>(a);
  const int64_t hk = cta.hk, b = cta.b, j0 = cta.j0, group = a.group;
  const int nqt = cta.nqt;
  if (tid == 0) {
    init_dkdv_bars(bars);
    for (int s = 0; s < 2; ++s) {
      for (int w = 0; w < kWgs; ++w) tma::init(&ds.full[s][w], 128);
      tma::init(&ds.empty[s], 128 * kWgs);
    }
    tma::fence_init();
  }
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
  float dk[D / 2], dv[D / 2];             // my 2 keys x D/4 columns (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sm.sK, wg * 64), dVd0 = v3::desc_k_base<kRows>(sm.sV, wg * 64);
  // dQ_part's B: my d/2 columns of K (panel wg at d = 128; 64 bytes into the swizzled rows at d = 64).
  const T* kB = D == 128 ? sm.sK + wg * kRows * 64 : sm.sK + wg * kN;
  // dQ_part of tile m (its query tile `itm`) leaves: slot m % 2 released, the block added.
  auto finish_dq = [&](float (&dq)[kN / 2], int m, int itm) {
    tma::arrive(&ds.empty[m & 1]);
    const int64_t h = hk * group + itm / nqt, qt = itm % nqt;
    dq_block_add<D>(dq, sm.sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
  };
  // The reads of slot m % 2 by dQ_part of tile m (m >= -1) complete phase read_phase(m) of its
  // dsEmpty: slot 1's first phase is tile -1's discarded product.
  auto read_phase = [](int m) { return (m & 1) ? (m >> 1) + 1 : m >> 1; };

  tma::wait(&bars.once, 0);
  int st = 0, n = 0, it_prev = -1;
  uint32_t ph = 0;
  for (;; ++n) {
    tma::wait(&bars.full[st], ph);
    const RowStats<BQ>& R = sm.sR[st];
    const int it = R.it;
    if (it < 0) break;
    const T* cQ = sm.sQO + st * (2 * BQ * D);
    const T* cO = cQ + BQ * D;
    float s[BQ / 2], dp[BQ / 2];  // S^T, dP^T: my keys x BQ rows
    v3::pin(dk);
    v3::pin(dv);
    issue_sdp<T, D>(s, dp, dKd0, dVd0, cQ, cO);
    v3::wait<0>();
    v3::pin(s);
    v3::pin(dp);
    dkdv_p<T, T, BQ, BLOCK, false>(s, R, R.full, a, int64_t(it % nqt) * BQ, j0, krow, g, t4, sl2);  // P^T (5.2)
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
    v3::pack_a<T, BQ>(pa, s);
    dkdv_ds<BQ>(dp, s, R, t4);  // dS^T (5.5)
    v3::pack_a<T, BQ>(sa, dp);
    T* const cS = sm.sdS + (n & 1) * (kRows * BQ);
    // Both dQ_part of tile n - 2 read the slot (tile -1: the discarded product of iteration 0).
    if (n >= 1) tma::wait(&ds.empty[n & 1], read_phase(n - 2) & 1);
    store_a_tile<T, BQ>(cS, sa, krow, g, t4);
    v3::fence_proxy_async();
    tma::arrive(&ds.full[n & 1][wg]);  // release: my dS^T stores (and the proxy fence) before it
    const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
    v3::dvdk_products<T, D, BQ>(dv, dk, pa, sa, dOt, dQt);
    // Both halves of tile n - 1's dS^T (spin loops: kept out of the products' straight line, where
    // ptxas would serialize them, C7520).
    if (n >= 1) {
      const uint32_t q = ((n - 1) >> 1) & 1;
      tma::wait(&ds.full[(n - 1) & 1][0], q);
      tma::wait(&ds.full[(n - 1) & 1][1], q);
    }
    float dq[kN / 2];  // dQ_part of tile n - 1: 64 query rows x my d/2 columns, over all 128 keys
    // Unconditional: in iteration 0 it reads slot 1 before anything is stored there, discarded.
    issue_dq_part<T, D>(dq, sm.sdS + ((n - 1) & 1) * (kRows * BQ), kB);
    v3::wait<1>();  // dV, dK done: the stage may be refilled while dQ_part runs
    v3::pin(dk);
    v3::pin(dv);
    v3::pin(pa);
    v3::pin(sa);
    tma::arrive(&bars.empty[st]);  // release: my reads of the stage and its row facts before it
    v3::wait<0>();
    v3::pin(dq);
    if (n >= 1) finish_dq(dq, n - 1, it_prev);
    else tma::arrive(&ds.empty[1]);  // the discarded product has read slot 1
    it_prev = it;
    if (++st == S) { st = 0; ph ^= 1; }
  }
  if (n >= 1) {  // the last tile's dQ_part
    float dq[kN / 2];
    const uint32_t q = ((n - 1) >> 1) & 1;
    tma::wait(&ds.full[(n - 1) & 1][0], q);
    tma::wait(&ds.full[(n - 1) & 1][1], q);
    v3::fence();
    issue_dq_part<T, D>(dq, sm.sdS + ((n - 1) & 1) * (kRows * BQ), kB);
    v3::wait<0>();
    v3::pin(dq);
    finish_dq(dq, n - 1, it_prev);
  }
  if (wtid == 0) tma::bulk_wait();  // the last block is read before the CTA exits
  epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
#else
  __trap();
#endif
}

template <class T, int D, bool BLOCK>
void launch17(const CUtensorMap (&m)[4], const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s) {
  auto k = &v17_bwd_kernel<T, D, BLOCK>;
  constexpr size_t smem = one_pass_smem_bytes<D>(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  const int64_t ctas = (a.nk + kRows - 1) / kRows * a.Hkv * a.B;  // 1-d: see dkdv_cta
  if (ctas > INT_MAX) fail("v17 backward: ", ctas, " CTAs exceed the grid limit");
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("v17_bwd_kernel");
}

template <class T, int D>
bool launch17_bwd(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  CUtensorMap m[4];
  if (!one_pass_maps(a, m, why)) return false;
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  if (a.mask.block) launch17<T, D, true>(m, a, dq_acc, s);
  else launch17<T, D, false>(m, a, dq_acc, s);
  launch_dq_convert<T, T, D>(a, dq_acc, s);
  return true;
}

}  // namespace

template <class T>
bool v17_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != 64 && a.d != 128) { *why = "v17 needs d in {64, 128}"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    v3_backward<T>(a, s);        // v3 writes the zeros
    return true;
  }
  return a.d == 64 ? launch17_bwd<T, 64>(a, dq_acc, s, why) : launch17_bwd<T, 128>(a, dq_acc, s, why);
}

template bool v17_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v17_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
