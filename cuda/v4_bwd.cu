// cuda/v4_bwd.cu — variant 4 backward (spec §5, eq. 5.1-5.7; §5.3), warp-specialized like the
// v4 forward: warpgroup 0 is the producer (registers given back by setmaxnreg), warpgroups 1
// and 2 consume, 64 rows or 64 keys each, and never meet at a CTA barrier (the one-pass mode's
// dS hand-off aside): tiles arrive in an mbarrier ring, filled by the copy engine (TMA, tma.cuh)
// in wgmma's 128-byte swizzle.
//   D      (5.1) by compute_D (v1.cu; one 16-byte chunk per lane for these views).
//   dQ     (deterministic mode) CTA = (b, h, 128 query rows); Q and dO copied once; K and V
//          tiles of BC keys in a ring. Per tile: S = Q K^T and dP = dO V^T (wgmma,
//          shared-memory operands), P = 2^(S c - LSE) (5.2), dS = P (dP - D) (5.5) in
//          registers, dQ += dS K (5.6).
//   dK,dV  CTA = (b, kv-head, 128 keys); K and V copied once; the (q-head of the group, query
//          tile of BQ rows) pairs that see the keys stream through the ring: Q and dO by the
//          copy engine, and with them the tile's index and each row's LSE log2(e), D and
//          visible key interval (eq. 3.4), staged by producer warp 1 (the consumers never
//          evaluate the mask to find their tiles). Per tile: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO (5.3),
//          dK += dS^T Q (5.7); in the default (one-pass) mode also dQ's partial sums (see
//          v4_bwd_dkdv_kernel's FUSED), added atomically into fp32 scratch, then converted.
// Deterministic mode: the two passes write every output element from one thread in a fixed
// order, no atomics: bitwise repeatable. One-pass mode: dQ's sums arrive in a varying order.
// G: the gradients' type. G = T (backward): dQ, dK, dV written in the storage dtype. G = float
// (backward_block, §6.2): the same kernels over a block of rows at q_pos against keys at k_pos
// (contiguous or indexed; indexed keys in the one-pass mode only), with the caller's global LSE
// and D, ADD their contributions into fp32 dQ, dK, dV (each element read and written by one
// thread; dQ's one-pass sums go through the scratch as above, then dQ += scale sum).
// P and dS are rounded to the storage dtype before their products (u_P, spec §9.1).
// BLOCK: the mask has a block-sparse part, whose bit joins the per-element predicate of partial
// tiles (kept out of the common kernels, where its code would spill the accumulators).
// Limits: v3's (bf16/fp16, d in {64, 128}, 16-byte aligned views with strides in multiples of 8
// elements, compute capability 9.0), views the copy engine can describe, and for blocks in the
// deterministic mode contiguous key positions; v4_backward returns false (nothing launched)
// otherwise and the dispatcher runs v3 (backward) or v1 (backward_block).
#include <climits>
#include <cstdint>
#include <type_traits>

#include "bwd_ws.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

// ------------------------------------------------------------------ dQ
template <class T, class G, int D, int BC, bool BLOCK>
__global__ void __launch_bounds__(kThreads, 1)
    v4_bwd_dq_kernel(const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO,
                     const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                     BwdArgs<T, G> a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr uint32_t kTile = BC * D * sizeof(T);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(align1024(smem_raw));  // (128, D) sw128
  T* sdO = sQ + kRows * D;                             // (128, D)
  T* sKV = sdO + kRows * D;                            // S x [(BC, D) K, (BC, D) V]
  __shared__ RingBars<kStages> bars;
  __shared__ int red[4][kWarps];
  // warp through a shuffle, so that ptxas knows it is warp-uniform (measured faster: cuda/README.md)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / 32, 0), lane = tid % 32, g = lane >> 2,
            t4 = lane & 3;
  const int wg = warp / 4 - 1, wrow = (warp - 4) * 16;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z,
                hk = h / a.group;
  const int64_t nq = a.nq;
  if (tid == 0) {
    tma::init(&bars.once, 1);
    for (int s = 0; s < kStages; ++s) {
      tma::init(&bars.full[s], 1);
      tma::init(&bars.empty[s], 4 * kWgs);
    }
    tma::fence_init();
  }
  // my rows g, g + 8: interval (3.4), LSE in base 2, D (tile_mask.cuh); producer threads pass
  // rows past nq (no facts). The barrier inside also publishes the barrier inits.
  tiles::BwdRows rows;
  const tiles::Hull hull = tiles::bwd_rows<kWarps>(a, b, h, wg >= 0 ? q0 + wrow + g : nq, red, &rows);
  const int t_begin = hull.lo < hull.hi ? hull.lo / BC : 0;
  const int t_end = hull.lo < hull.hi ? (hull.hi + BC - 1) / BC : 0;
  if (kAcc<T, G> && t_begin == t_end) return;  // a block whose rows see none of its keys adds 0

  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP>();
    if (warp == 0 && lane == 0) {
      tma::arrive_expect(&bars.once, 2 * kRows * D * sizeof(T));
      load_tile<kRows, D>(sQ, &mQ, int(q0), int(h), int(b), &bars.once);
      load_tile<kRows, D>(sdO, &mdO, int(q0), int(h), int(b), &bars.once);
      int st = 0;
      uint32_t ph = 0;
      for (int t = t_begin; t < t_end; ++t) {
        tma::wait(&bars.empty[st], ph ^ 1);
        tma::arrive_expect(&bars.full[st], 2 * kTile);
        T* dst = sKV + st * (2 * BC * D);
        load_tile<BC, D>(dst, &mK, t * BC, int(hk), int(b), &bars.full[st]);
        load_tile<BC, D>(dst + BC * D, &mV, t * BC, int(hk), int(b), &bars.full[st]);
        if (++st == kStages) { st = 0; ph ^= 1; }
      }
    }
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<kRegC>();
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  float acc[D / 2];  // dQ / scale: my 2 rows x D/4 columns (wgmma accumulator)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  const uint64_t dQd0 = v3::desc_k_base<kRows>(sQ, wg * 64), dOd0 = v3::desc_k_base<kRows>(sdO, wg * 64);
  tma::wait(&bars.once, 0);
  int st = 0;
  uint32_t ph = 0;
  for (int t = t_begin; t < t_end; ++t) {
    const int j0 = t * BC;
    const bool full = !BLOCK && hull.full_lo <= j0 && j0 + BC <= hull.full_hi;
    const T* cK = sKV + st * (2 * BC * D);
    const T* cV = cK + BC * D;
    tma::wait(&bars.full[st], ph);

    v3::dq_tile<T, D, kRows, BC>(acc, dQd0, dOd0, cK, cV, rows, full, BLOCK, j0, t4, sl2, a, q0 + wrow + g);
    if (lane == 0) tma::arrive(&bars.empty[st]);
    if (++st == kStages) { st = 0; ph ^= 1; }
  }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t r = q0 + wrow + g + 8 * ri;
    if (r >= nq) continue;
    if constexpr (kAcc<T, G>) epilogue::accumulate_row<D>(a.dQ.row(b, h, r), acc, ri, t4, static_cast<float>(a.scale));
    else epilogue::store_row<T, D>(a.dQ.row(b, h, r), acc, ri, t4, static_cast<float>(a.scale));
  }
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ dK, dV
// The dK/dV pass: query tiles of BQ rows. KIDX: indexed key positions (a block's keys; the one-pass
// mode only), in their own instantiation so that the contiguous kernels keep their registers: the
// producer bounds the CTA's keys by their global hull and stages global row intervals, each
// consumer thread tests its keys' global positions. FUSED (the non-deterministic mode): the pass
// also forms dQ's partial sums over the CTA's keys, dQ_part = dS K (5.6), so that no dQ pass
// recomputes S and dP. Each consumer warpgroup writes its dS^T to shared memory (the M-major A of
// that product), then takes half of dQ_part's columns over all 128 keys (a 64 x d/2 block: both
// warpgroups' dS^T, hence a barrier across them per tile). The block goes through shared memory to
// dq_acc by the copy engine's element-wise atomic add (layout: dq_acc_index), and dq_convert
// writes dQ. The order of those adds varies from run to run, hence not bitwise repeatable.
// (Measured and dropped, docs/performance-gpu.md: each warpgroup adding dS K over its own keys, no
// barrier but twice the atomic traffic; S^T and dP^T waited for apart; 3 or 4 stages.)
template <int D, int BQ, bool FUSED>
constexpr size_t dkdv_smem(size_t elem) {
  return size_t(2 * kRows + 2 * kStages * BQ) * D * elem + kStages * sizeof(RowStats<BQ>) +
         (FUSED ? 2 * kRows * BQ * elem + 2 * 32 * D * sizeof(float) : 0) + 1024;
}

template <class T, class G, int D, bool BLOCK, int BQ, bool FUSED, bool KIDX>
__global__ void __launch_bounds__(kThreads, 1)
    v4_bwd_dkdv_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                       const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO,
                       BwdArgs<T, G> a, float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages;
  static_assert(!FUSED || BQ == 64, "the fused dQ block is one wgmma M = 64 query rows");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(align1024(smem_raw));  // (128, D) sw128
  T* sV = sK + kRows * D;                              // (128, D)
  T* sQO = sV + kRows * D;                             // S x [(BQ, D) Q, (BQ, D) dO]
  T* sdS = sQO + S * 2 * BQ * D;  // FUSED: 2 x (128 keys, BQ) dS^T, sw128 (1024-aligned)
  float* sdQ = reinterpret_cast<float*>(sdS + (FUSED ? 2 * kRows * BQ : 0));  // FUSED: 2 x (64, d/2) dQ_part
  RowStats<BQ>* sR = reinterpret_cast<RowStats<BQ>*>(sdQ + (FUSED ? 2 * 32 * D : 0));  // S x facts
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
    dkdv_producer<T, G, D, BQ, S, BLOCK, KIDX>(a, cta, &mK, &mV, &mQ, &mdO, sK, sV, sQO, sR, bars, warp, lane);
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<kRegC>();
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const int krow = (warp - 4) * 16;  // my warp's first key in the CTA
  const int wtid = tid - 128 * (wg + 1);  // my thread in the warpgroup
  int dsb = 0;                             // FUSED: dS^T buffer
  bool seen = false;                       // some query tile visited (G = float: else nothing to add)
  float dk[D / 2], dv[D / 2];        // my 2 keys x D/4 columns (wgmma accumulators)
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
    if constexpr (FUSED) {  // dS^T (key rows, query columns) as stored, rounded to T
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = krow + g + 8 * (j & 1), c = 16 * kk + 8 * (j >> 1) + 2 * t4;
          *reinterpret_cast<uint32_t*>(cS + v3::sw128<kRows>(r, c >> 3) + (c & 7)) = sa[kk][j];
        }
      v3::fence_proxy_async();
    }
    v3::dvdk_products<T, D, BQ>(dv, dk, pa, sa, dOt, dQt);
    if constexpr (FUSED) {
      // dQ_part (64 query rows x my d/2 columns) = dS K over all 128 keys: both warpgroups'
      // dS^T (barrier 1 over the 256 consumer threads). My columns start d/2 wg elements into
      // K's rows: panel wg at d = 128; 64 bytes into the 128-byte swizzled row at d = 64 (the
      // swizzle is a function of the address, as for the K-major k16 steps).
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
      // dQ_part as one bulk atomic add of the block into dq_acc (bwd_ws.cuh).
      const int64_t h = hk * group + it / nqt, qt = it % nqt;
      dq_block_add<D>(dq, sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
      dsb ^= 1;
    } else {
      v3::wait<0>();
      v3::pin(dk);
      v3::pin(dv);
      v3::pin(pa);
      v3::pin(sa);
      tma::arrive(&bars.empty[st]);  // release: my reads of the row facts before it
    }
    if (++st == S) { st = 0; ph ^= 1; }
  }
  if (FUSED && wtid == 0) tma::bulk_wait();  // the last block is read before the CTA exits
  if constexpr (kAcc<T, G>) {
    if (seen) epilogue::write_dkdv<T, D, true>(a, b, hk, j0 + krow + g, dk, dv, t4);
  } else {
    epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
  }
#else
  __trap();
#endif
}

// The one-pass (fused) dK/dV pass's shape at head dim D; CF overrides it (tuning, bf16 only).
// Tuning knob for the benchmark only: BURSTLAB_V4_BWD_CFG = 0 (default) or 1 (cuda/README.md).
int v4_bwd_cfg() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V4_BWD_CFG"));
  return v;
}

template <class T, class G, int D, int BC, int BQ>
bool launch_bwd(const BwdArgs<T, G>& a, cudaStream_t s, float* dq_acc, const char** why) {
  constexpr bool bf = std::is_same<T, bf16>::value;
  const bool block = a.mask.block != nullptr, fused = dq_acc != nullptr;
  CUtensorMap mQ, mdO, mK, mV;  // the dQ pass's boxes: 128 query rows, BC keys
  if (!fused && (!tma::encode_4d(&mQ, a.Q.data, a.Q.dim, a.Q.stride, bf, kRows, why) ||
                 !tma::encode_4d(&mdO, a.dO.data, a.dO.dim, a.dO.stride, bf, kRows, why) ||
                 !tma::encode_4d(&mK, a.K.data, a.K.dim, a.K.stride, bf, BC, why) ||
                 !tma::encode_4d(&mV, a.V.data, a.V.dim, a.V.stride, bf, BC, why)))
    return false;
  const int bq = fused ? 64 : BQ;
  CUtensorMap nK, nV, nQ, ndO;  // the dK/dV pass's boxes: 128 keys, bq query rows
  if (!tma::encode_4d(&nK, a.K.data, a.K.dim, a.K.stride, bf, kRows, why) ||
      !tma::encode_4d(&nV, a.V.data, a.V.dim, a.V.stride, bf, kRows, why) ||
      !tma::encode_4d(&nQ, a.Q.data, a.Q.dim, a.Q.stride, bf, bq, why) ||
      !tma::encode_4d(&ndO, a.dO.data, a.dO.dim, a.dO.stride, bf, bq, why))
    return false;
  if (!fused) {
    const size_t smem = size_t(2 * kRows + 2 * kStages * BC) * D * sizeof(T) + 1024;
    auto k = block ? &v4_bwd_dq_kernel<T, G, D, BC, true> : &v4_bwd_dq_kernel<T, G, D, BC, false>;
    allow_smem(reinterpret_cast<const void*>(k), smem);
    const dim3 grid(static_cast<unsigned>((a.nq + kRows - 1) / kRows), static_cast<unsigned>(a.Hq),
                    static_cast<unsigned>(a.B));
    k<<<grid, kThreads, smem, s>>>(mQ, mdO, mK, mV, a);
    BURSTLAB_CUDA_LAUNCH_CHECK("v4_bwd_dq_kernel");
  } else {
    BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  }
  auto go = [&](auto k, size_t smem) {
    allow_smem(reinterpret_cast<const void*>(k), smem);
    const int64_t ctas = (a.nk + kRows - 1) / kRows * a.Hkv * a.B;  // 1-d: see the kernel's CTA order
    if (ctas > INT_MAX) fail("v4 backward: ", ctas, " CTAs exceed the grid limit");
    k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(nK, nV, nQ, ndO, a, dq_acc);
    BURSTLAB_CUDA_LAUNCH_CHECK("v4_bwd_dkdv_kernel");
  };
  if (fused) {
    constexpr size_t smem = dkdv_smem<D, 64, true>(sizeof(T));
    bool done = false;
    if constexpr (kAcc<T, G>) {  // only blocks have indexed keys
      if (a.kp.index) {
        if (block) go(&v4_bwd_dkdv_kernel<T, G, D, true, 64, true, true>, smem);
        else go(&v4_bwd_dkdv_kernel<T, G, D, false, 64, true, true>, smem);
        done = true;
      }
    }
    if (!done) {
      if (block) go(&v4_bwd_dkdv_kernel<T, G, D, true, 64, true, false>, smem);
      else go(&v4_bwd_dkdv_kernel<T, G, D, false, 64, true, false>, smem);
    }
    launch_dq_convert<T, G, D>(a, dq_acc, s);
  } else {
    if (block) go(&v4_bwd_dkdv_kernel<T, G, D, true, BQ, false, false>, dkdv_smem<D, BQ, false>(sizeof(T)));
    else go(&v4_bwd_dkdv_kernel<T, G, D, false, BQ, false, false>, dkdv_smem<D, BQ, false>(sizeof(T)));
  }
  return true;
}

}  // namespace

size_t v4_dq_acc_floats(int64_t B, int64_t Hq, int64_t nq, int64_t d) {
  return size_t(B * Hq * ((nq + 63) / 64) * 64 * d);
}

template <class T, class G>
bool v4_backward(const BwdArgs<T, G>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != 64 && a.d != 128) { *why = "v4 needs d in {64, 128}"; return false; }
  // The dQ pass (two-pass mode) finds each row's keys as a local interval: contiguous keys only.
  if (a.kp.index && !dq_acc) { *why = "v4's deterministic backward_block needs contiguous key positions"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    if constexpr (!kAcc<T, G>) v3_backward<T>(a, s);  // v3 writes the zeros; a block adds nothing
    return true;
  }
  // Fused (dq_acc given): the dK/dV pass's query tiles are 64 rows (one dQ block); the tuning
  // configuration changes the two-pass shapes of the whole backward only.
  const int cfg = std::is_same<T, bf16>::value && !kAcc<T, G> ? v4_bwd_cfg() : 0;  // tuning: bf16 only
  if (a.d == 64) {
    if constexpr (!kAcc<T, G>)
      if (cfg == 1) return launch_bwd<T, G, 64, 128, 128>(a, s, dq_acc, why);
    return launch_bwd<T, G, 64, 64, 64>(a, s, dq_acc, why);
  }
  if constexpr (!kAcc<T, G>)
    if (cfg == 1) return launch_bwd<T, G, 128, 128, 64>(a, s, dq_acc, why);
  return launch_bwd<T, G, 128, 64, 64>(a, s, dq_acc, why);
}

template bool v4_backward<bf16, bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v4_backward<f16, f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);
template bool v4_backward<bf16, float>(const BwdArgs<bf16, float>&, float*, cudaStream_t, const char**);
template bool v4_backward<f16, float>(const BwdArgs<f16, float>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
