// cuda/v6_bwd.cu — variant 6: the one-pass backward (spec §5, eq. 5.1-5.7; §5.3) with its two
// consumer warpgroups taking turns at the tensor cores (FA3's ping-pong), so that one's P^T and
// dS^T (5.2, 5.5) are computed while the other's products run. v5's CTA, producer, row facts and
// shared-memory operands (bwd_ws.cuh); d = 64 only (the registers below do not fit at d = 128).
// What keeps v4/v5's warpgroups in step is dQ_part = dS K (5.6): each warpgroup takes half of d
// over all 128 keys, so it needs both warpgroups' dS^T of the tile, and they meet at a barrier every
// tile. Here dQ_part of tile n is formed one tile later, during tile n + 1: the dS^T tiles go
// through a 2-slot ring with mbarriers (dsFull[slot][w]: warpgroup w stored its half; dsEmpty[slot]:
// both warpgroups' dQ_part read the slot), which by then is ready, so neither waits for the other.
// The turns: warpgroup w issues its products only in its turn (named barrier 4 + w, passed on by the
// other with bar.arrive), in one batch: dV += P^T dO and dK += dS^T Q of tile n (5.3, 5.7),
// dQ_part of tile n - 1, and S^T = K Q^T, dP^T = V dO^T of tile n + 1; then its P^T and dS^T of
// tile n + 1 run while the other warpgroup's batch occupies the tensor cores.
// Per iteration n of warpgroup w (tile n in ring stage st):
//   P^T, dS^T from S^T, dP^T (issued in iteration n - 1); dS^T into slot n % 2 (after dsEmpty),
//   P^T into w's P^T tile; arrive dsFull; wait for stage n + 1's copies; [turn] dV, dK of n,
//   dQ_part of n - 1 (after dsFull of the other half), S^T, dP^T of n + 1 [pass the turn]; wait for
//   all but the last two; release stage n and slot (n - 1) % 2; dQ_part's block to dq_acc; wait for
//   the rest (nothing in flight across the loop's back edge: ptxas would serialize every product).
// Measured slower than v5 (0.90-0.98x on H200, docs/performance-gpu.md); the likely reason, not
// measured apart: at d = 64 a tile's P^T and dS^T take longer than its products, so the other's
// batch ends before them and the tensor cores wait anyway, while the two warpgroups no longer
// compute P^T and dS^T at the same time. Run by name only (the table puts it after v4).
// dQ's sums arrive in a varying order: no deterministic mode (auto runs v4 then). Whole backward
// only. Limits: v5's and d = 64; v6_backward returns false (nothing launched) otherwise.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "bwd_ws.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

constexpr int kD = 64;

struct DsBars {
  uint64_t full[2][kWgs];  // slot s, half w stored (128 arrivals: warpgroup w's threads)
  uint64_t empty[2];       // slot s read by both warpgroups' dQ_part (256 arrivals)
};

template <class T, bool BLOCK>
__global__ void __launch_bounds__(kThreads, 1)
    v6_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                  const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, T> a,
                  float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages, BQ = kBQ, D = kD, kN = D / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const OnePassSmem<T> sm = one_pass_smem<T, D>(smem_raw);  // dS^T tiles: the ring's 2 slots
  __shared__ RingBars<S> bars;
  __shared__ DsBars ds;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
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
  const int my_turn = 4 + wg, their_turn = 4 + (1 - wg);
  float dk[D / 2], dv[D / 2];  // my 2 keys x D/4 columns (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sm.sK, wg * 64), dVd0 = v3::desc_k_base<kRows>(sm.sV, wg * 64);
  const T* kB = sm.sK + wg * kN;  // dQ_part's B: my d/2 columns of K (64 bytes into the swizzled rows)
  // dQ_part of tile m from slot m % 2 (both halves; the caller waited for the other's dsFull), issued.
  auto issue_dq = [&](float (&dq)[kN / 2], int m) {
    issue_dq_part<T, D>(dq, sm.sdS + (m & 1) * (kRows * BQ), kB);
  };
  // dQ_part of tile m (its query tile `itm`) leaves: slot m % 2 released, the block added.
  auto finish_dq = [&](float (&dq)[kN / 2], int m, int itm) {
    tma::arrive(&ds.empty[m & 1]);
    const int64_t h = hk * group + itm / nqt, qt = itm % nqt;
    dq_block_add<D>(dq, sm.sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
  };
  // The reads of slot m % 2 by dQ_part of tile m (m >= -1) complete phase read_phase(m) of its
  // dsEmpty: slot 1's first phase is tile -1's discarded product.
  auto read_phase = [](int m) { return (m & 1) ? (m >> 1) + 1 : m >> 1; };
  if (wg == 1) tma::bar_arrive(their_turn, 256);  // warpgroup 0 takes the first turn

  tma::wait(&bars.once, 0);
  int st = 0, n = 0, it_prev = -1;
  uint32_t ph = 0;
  tma::wait(&bars.full[st], ph);
  int it = sm.sR[st].it;
  float s[BQ / 2], dp[BQ / 2];  // S^T, dP^T of tile n (issued in iteration n - 1)
  if (it >= 0) {
    issue_sdp<T, D>(s, dp, dKd0, dVd0, sm.sQO, sm.sQO + BQ * D);
    v3::wait<0>();
  }
  while (it >= 0) {
    const RowStats<BQ>& R = sm.sR[st];
    const T* cQ = sm.sQO + st * (2 * BQ * D);
    const T* cO = cQ + BQ * D;
    v3::pin(s);
    v3::pin(dp);
    v3::pin(dk);
    v3::pin(dv);
    dkdv_p<T, T, BQ, BLOCK, false>(s, R, R.full, a, int64_t(it % nqt) * BQ, j0, krow, g, t4, sl2);  // P^T (5.2)
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
    v3::pack_a<T, BQ>(pa, s);
    dkdv_ds<BQ>(dp, s, R, t4);  // dS^T (5.5)
    v3::pack_a<T, BQ>(sa, dp);
    T* const cS = sm.sdS + (n & 1) * (kRows * BQ);
    // Both dQ_part of tile n - 2 read the slot (tile -1: the discarded product of iteration 0).
    if (n >= 1) tma::wait(&ds.empty[n & 1], read_phase(n - 2) & 1);
    store_a_tile<T, BQ>(cS, sa, krow, g, t4);
    store_a_tile<T, BQ>(sm.sP, pa, krow, g, t4);  // my dV of tile n - 1 has read it (waited for)
    v3::fence_proxy_async();
    tma::arrive(&ds.full[n & 1][wg]);  // release: my dS^T stores (and the proxy fence) before it
    int st2 = st + 1;
    uint32_t ph2 = ph;
    if (st2 == S) { st2 = 0; ph2 ^= 1; }
    tma::wait(&bars.full[st2], ph2);
    const int it2 = sm.sR[st2].it;
    const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
    const uint64_t dPa = v3::opaque(v3::desc_k_base<kRows>(sm.sP, wg * 64));
    const uint64_t dSa = v3::opaque(v3::desc_k_base<kRows>(cS, wg * 64));
    float dq[kN / 2];  // dQ_part of tile n - 1: 64 query rows x my d/2 columns, over all 128 keys
    // The other half of tile n - 1's dS^T (a spin loop: kept out of the products' straight line,
    // where ptxas would serialize them, C7520).
    if (n >= 1) tma::wait(&ds.full[(n - 1) & 1][1 - wg], ((n - 1) >> 1) & 1);
    // ---- my turn (also orders my warpgroup's P^T and dS^T stores before its products)
    tma::bar_sync(my_turn, 256);
    issue_dvdk_ss<T, D>(dv, dk, dPa, dSa, dOt, dQt);
    // Unconditional (a product in a branch makes ptxas serialize all of them, C7520): in
    // iteration 0 it reads slot 1 before anything is stored there, and its result is discarded.
    issue_dq(dq, n - 1);
    if (it2 >= 0) {
      const T* nQ = sm.sQO + st2 * (2 * BQ * D);
      issue_sdp<T, D>(s, dp, dKd0, dVd0, nQ, nQ + BQ * D);
      tma::bar_arrive(their_turn, 256);  // ---- the other warpgroup's turn
      v3::wait<1>();
    } else {
      tma::bar_arrive(their_turn, 256);
      v3::wait<0>();
    }
    v3::pin(dk);
    v3::pin(dv);
    v3::pin(dq);
    tma::arrive(&bars.empty[st]);  // release: my reads of the stage and its row facts before it
    if (n >= 1) finish_dq(dq, n - 1, it_prev);
    else tma::arrive(&ds.empty[1]);  // the discarded product has read slot 1
    v3::wait<0>();
    it_prev = it;
    st = st2;
    ph = ph2;
    it = it2;
    ++n;
  }
  if (n >= 1) {  // the last tile's dQ_part
    float dq[kN / 2];
    tma::wait(&ds.full[(n - 1) & 1][1 - wg], ((n - 1) >> 1) & 1);
    v3::fence();
    issue_dq(dq, n - 1);
    v3::wait<0>();
    v3::pin(dq);
    finish_dq(dq, n - 1, it_prev);
  }
  if (wg == 0) tma::bar_sync(my_turn, 256);  // warpgroup 1's last pass of the turn
  if (wtid == 0) tma::bulk_wait();            // the last block is read before the CTA exits
  epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
#else
  __trap();
#endif
}

template <class T, bool BLOCK>
void launch_v6(const CUtensorMap (&m)[4], const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s) {
  auto k = &v6_bwd_kernel<T, BLOCK>;
  constexpr size_t smem = one_pass_smem_bytes<kD>(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  const int64_t ctas = (a.nk + kRows - 1) / kRows * a.Hkv * a.B;  // 1-d: see dkdv_cta
  if (ctas > INT_MAX) fail("v6 backward: ", ctas, " CTAs exceed the grid limit");
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("v6_bwd_kernel");
}

}  // namespace

template <class T>
bool v6_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != kD) { *why = "v6 needs d = 64"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    v3_backward<T>(a, s);        // v3 writes the zeros
    return true;
  }
  CUtensorMap m[4];
  if (!one_pass_maps(a, m, why)) return false;
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  if (a.mask.block) launch_v6<T, true>(m, a, dq_acc, s);
  else launch_v6<T, false>(m, a, dq_acc, s);
  launch_dq_convert<T, T, kD>(a, dq_acc, s);
  return true;
}

template bool v6_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v6_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
