// cuda/v4_fwd.cu — variant 4 forward: v3's wgmma forward, warp-specialized (FA3's structure).
// Spec §4.1 (eq. 4.1-4.4), §6.1 (blocks over global positions), §4.3 (fold into a running
// partial). One CTA = (b, h, Br = 64 WGS query rows) and 1 + WGS warpgroups:
//   producer  warpgroup 0 gives its registers back (setmaxnreg) and one thread issues every
//             copy: Q once, then K and V tiles of BC keys into a ring of STAGES buffers, by the
//             bulk tensor copy engine (TMA, tma.cuh), straight into wgmma's 128-byte swizzle;
//   consumers warpgroups 1..WGS, 64 query rows each, run v3's per-tile math (S = Q K^T, the
//             online softmax of softmax.cuh, O += P V overlapped with the next tile's softmax)
//             and never meet at a CTA barrier: each waits on the mbarrier that says its tile has
//             landed and releases the buffer with an arrival once its wgmma has read it.
// The loads thus run ahead of the math on their own, the consumers hold no load addresses (up to
// 240 registers each for the accumulators), and the two warpgroups drift in and out of phase,
// which overlaps one's softmax with the other's products.
// Limits: v3's (bf16/fp16, d in {64, 128}, 16-byte aligned views with strides in multiples of 8
// elements, a compute capability 9.0 device), and no block-sparse mask: the tile sequence must be
// known to the producer without a CTA-wide vote (v3 runs those). v4_forward returns false when it
// cannot run a call; the dispatcher (api.cu) then runs v3 or reports why.
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "detail.cuh"
#include "epilogue.cuh"
#include "softmax.cuh"
#include "tile_mask.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace burstlab::cuda::detail {

namespace {

using v2::kLog2e;

// WGS consumer warpgroups (Br = 64 WGS), BC keys per tile, STAGES K/V buffers; register budgets
// per thread after setmaxnreg (producer, consumer): 128 P + 128 WGS C <= 65536 / kCtas. With one
// consumer warpgroup two CTAs share a multiprocessor, so that one's loads and epilogue overlap
// the other's math (short sequences, where each CTA has few key tiles).
template <int D, int WGS, int BC, int STAGES>
struct Cfg4 {
  static constexpr int kD = D, kWgs = WGS, kBc = BC, kBr = 64 * WGS, kStages = STAGES;
  static constexpr int kThreads = 128 * (WGS + 1), kWarps = 4 * (WGS + 1), kCtas = WGS == 1 ? 2 : 1;
  static constexpr int kRegP = WGS == 3 ? 32 : 24, kRegC = WGS == 3 ? 160 : WGS == 2 ? 240 : 232;
  static_assert(128 * kRegP + 128 * WGS * kRegC <= 65536 / kCtas, "register budgets exceed the file");
  // Q, STAGES x (K, V), one zeroed V-sized tile, plus 1 KB to align the first tile to 1024 bytes.
  static constexpr size_t smem_bytes(size_t elem) {
    return size_t(kBr + (2 * STAGES + 1) * kBc) * D * elem + 1024;
  }
};

struct Bars {
  uint64_t q;
  uint64_t k_full[4], k_empty[4], v_full[4], v_empty[4];
};

// KIDX: key positions are indexed (a.kp.index), so every tile runs the general predicate; its
// code is kept out of the common kernel, where its temporaries would spill the accumulators.
template <class T, class C, bool KIDX>
__global__ void __launch_bounds__(C::kThreads, C::kCtas)
    v4_fwd_kernel(const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mK,
                  const __grid_constant__ CUtensorMap mV, FwdArgs<T> a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::kD, kBc = C::kBc, kBr = C::kBr, kS = C::kStages, kWarps = C::kWarps;
  constexpr int kPanels = D / 64;
  constexpr uint32_t kTileBytes = kBc * D * sizeof(T);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));  // (Br, D) sw128
  T* sK = sQ + kBr * D;         // S x (Bc, D) sw128
  T* sV = sK + kS * kBc * D;    // S x (Bc, D) sw128
  T* sZ = sV + kS * kBc * D;    // (Bc, D) zeros: the V of "tile -1" (P = 0 there)
  __shared__ Bars bars;
  __shared__ int red[4][kWarps];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wg = warp / 4 - 1;   // consumer warpgroup (-1: producer)
  const int wrow = (warp - 4) * 16;  // a consumer warp's first row in the CTA
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBr, h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
  const int64_t nq = a.nq, nk = a.nk;

  if (tid == 0) {
    tma::init(&bars.q, 1);
    for (int s = 0; s < kS; ++s) {
      tma::init(&bars.k_full[s], 1);
      tma::init(&bars.v_full[s], 1);
      tma::init(&bars.k_empty[s], 4 * C::kWgs);  // one arrival per consumer warp
      tma::init(&bars.v_empty[s], 4 * C::kWgs);
    }
    tma::fence_init();
  }
  for (int e = tid; e < kBc * D / 8; e += C::kThreads) reinterpret_cast<uint4*>(sZ)[e] = make_uint4(0u, 0u, 0u, 0u);
  v3::fence_proxy_async();  // the zeros are read by wgmma

  // ---- mask facts of a consumer thread's rows g, g + 8 (eq. 3.4) and the CTA's key hull
  // (tile_mask.cuh); the barrier inside also publishes the barrier inits and the zeros.
  constexpr bool kidx = KIDX;
  int llo[2], lhi[2];
  const tiles::Hull hull = tiles::fwd_rows<kWarps>(a, q0 + wrow + g, kidx, wg >= 0, red, llo, lhi);
  // Without a block mask every key tile of the hull is visited (tile_mask.cuh's fwd_tile).
  const int t_begin = hull.lo < hull.hi ? hull.lo / kBc : 0;
  const int t_end = hull.lo < hull.hi ? (hull.hi + kBc - 1) / kBc : 0;

  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<C::kRegP>();
    if (warp == 0 && lane == 0) {
      tma::prefetch_map(&mQ);
      tma::prefetch_map(&mK);
      tma::prefetch_map(&mV);
      tma::arrive_expect(&bars.q, kBr * D * sizeof(T));
#pragma unroll
      for (int p = 0; p < kPanels; ++p)
        tma::load_4d(sQ + p * kBr * 64, &mQ, 64 * p, int(q0), int(h), int(b), &bars.q);
      int st = 0;
      uint32_t ph = 0;
      for (int t = t_begin; t < t_end; ++t) {
        tma::wait(&bars.k_empty[st], ph ^ 1);
        tma::arrive_expect(&bars.k_full[st], kTileBytes);
#pragma unroll
        for (int p = 0; p < kPanels; ++p)
          tma::load_4d(sK + st * kBc * D + p * kBc * 64, &mK, 64 * p, t * kBc, int(hk), int(b), &bars.k_full[st]);
        tma::wait(&bars.v_empty[st], ph ^ 1);
        tma::arrive_expect(&bars.v_full[st], kTileBytes);
#pragma unroll
        for (int p = 0; p < kPanels; ++p)
          tma::load_4d(sV + st * kBc * D + p * kBc * 64, &mV, 64 * p, t * kBc, int(hk), int(b), &bars.v_full[st]);
        if (++st == kS) { st = 0; ph ^= 1; }
      }
    }
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<C::kRegC>();
  const bool has_block = false;  // v4_forward never launches with a block mask
  auto pred = [&](int ri, int jl) -> bool {
    return tiles::fwd_visible(a, kidx, has_block, llo[ri], lhi[ri], q0 + wrow + g + 8 * ri, jl);
  };
  constexpr bool band_only = !KIDX;
  float acc[D / 2];  // O~ (4.3): wgmma accumulator, my 2 rows x D/4 columns
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};  // (4.1)-(4.2), base 2
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const float c2 = sl2 > 0.f ? sl2 : 1.f;
  // P_{i-1} as wgmma A fragments; before the first tile P = 0 against the zeroed tile, so the
  // P V product is issued unconditionally (every wgmma stays out of data-dependent branches).
  uint32_t pa[kBc / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
  const uint64_t dQ0 = v3::desc_k_base<kBr>(sQ, wg * 64);  // my warpgroup's 64 rows of Q
  tma::wait(&bars.q, 0);

  // Iteration i: S_i = Q K_{tau_i}^T, then O += P_{i-1} V_{tau_{i-1}} while S_i's softmax runs.
  // (st, ph): stage and parity of tile i; (pst, pph): of tile i - 1.
  int st = 0, pst = 0;
  uint32_t ph = 0, pph = 0;
  const T* pV = sZ;
  for (int t = t_begin; t < t_end; ++t) {
    const int j0 = t * kBc;
    const bool full = hull.full_lo <= j0 && j0 + kBc <= hull.full_hi;
    tma::wait(&bars.k_full[st], ph);
    if (pV != sZ) tma::wait(&bars.v_full[pst], pph);
    float s[kBc / 2];  // S = Q K^T (2.1), unscaled
    const uint64_t dQ = v3::opaque(dQ0), dK = v3::opaque(v3::desc_k_base<kBc>(sK + st * kBc * D, 0));
    const uint64_t dV = v3::opaque(v3::desc_mn_base<kBc>(pV));
    v3::pin(acc);
    v3::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      v3::Wgmma<T>::template ss<kBc, 0>(s, v3::desc_k_step<kBr>(dQ, kk), v3::desc_k_step<kBc>(dK, kk), kk);
    v3::commit();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      v3::Wgmma<T>::template rs<D, 1>(acc, pa[kk], v3::desc_mn_step(dV, kk), 1);
    v3::commit();
    v3::wait<1>();  // S done: K_{tau_i} may be refilled
    v3::pin(s);
    if (lane == 0) tma::arrive(&bars.k_empty[st]);

    softmax::mask_tile<kBc>(s, sl2, full, band_only, j0, t4, llo, lhi, pred);
    float alpha[2];
    softmax::online<kBc>(s, c2, m_r, l_r, alpha);
    v3::wait<0>();  // P_{i-1} V done: V_{tau_{i-1}} may be refilled, O rescaled, pa refilled
    v3::pin(acc);
    v3::pin(pa);
    if (pV != sZ && lane == 0) tma::arrive(&bars.v_empty[pst]);
    softmax::rescale_pack<T, D, kBc>(acc, pa, s, alpha);
    pV = sV + st * kBc * D;
    pst = st;
    pph = ph;
    if (++st == kS) { st = 0; ph ^= 1; }
  }
  {  // the last P V (against the zeroed tile when no key tile was visited)
    if (pV != sZ) tma::wait(&bars.v_full[pst], pph);
    v3::pv_product<T, D, kBc>(acc, pa, pV);
  }

  // ---- epilogue (4.4), or the merge (4.5)-(4.7) into the running partial (epilogue.cuh)
  epilogue::forward_rows<T, D>(a, b, h, q0 + wrow + g, acc, m_r, l_r, t4);
#else
  __trap();  // built without sm_90a: the dispatcher never launches v4 then
#endif
}

template <class T, class C>
bool launch(const FwdArgs<T>& a, cudaStream_t s, const char** why) {
  constexpr bool bf = std::is_same<T, bf16>::value;
  CUtensorMap mQ, mK, mV;
  if (!tma::encode_4d(&mQ, a.Q.data, a.Q.dim, a.Q.stride, bf, C::kBr, why) ||
      !tma::encode_4d(&mK, a.K.data, a.K.dim, a.K.stride, bf, C::kBc, why) ||
      !tma::encode_4d(&mV, a.V.data, a.V.dim, a.V.stride, bf, C::kBc, why))
    return false;
  const size_t smem = C::smem_bytes(sizeof(T));
  const bool kidx = a.kp.index != nullptr;
  auto kernel = kidx ? &v4_fwd_kernel<T, C, true> : &v4_fwd_kernel<T, C, false>;
  allow_smem(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid(static_cast<unsigned>((a.nq + C::kBr - 1) / C::kBr), static_cast<unsigned>(a.Hq),
                  static_cast<unsigned>(a.B));
  kernel<<<grid, C::kThreads, smem, s>>>(mQ, mK, mV, a);
  BURSTLAB_CUDA_LAUNCH_CHECK("v4_fwd_kernel");
  return true;
}

// Tuning knob for the benchmark only: BURSTLAB_V4_CFG = 0 (default), 1, 2, 3, 4 (cuda/README.md).
int v4_tuning_cfg() {
  static const int v = [] {
    const char* e = std::getenv("BURSTLAB_V4_CFG");
    return e ? std::atoi(e) : 0;
  }();
  return v;
}

// Do the query rows see at most `limit` keys on average? Estimated from 64 evenly spaced rows
// (eq. 3.4 on the host); false when the mask or the positions live in device arrays (document
// masks, indexed positions), which the host cannot read.
template <class T>
bool few_keys_per_row(const FwdArgs<T>& a, int64_t limit) {
  if (a.mask.doc != nullptr || a.qp.index != nullptr || a.kp.index != nullptr) return false;
  int64_t sum = 0;
  constexpr int kSamples = 64;
  for (int k = 0; k < kSamples; ++k) {
    int64_t lo, hi;
    local_range(a.mask, a.qp[(a.nq - 1) * k / (kSamples - 1)], a.kp, a.nk, &lo, &hi);
    sum += hi - lo;
  }
  return sum <= limit * kSamples;
}

}  // namespace

template <class T>
bool v4_forward(const FwdArgs<T>& a, cudaStream_t s, const char** why) {
  if (a.mask.block != nullptr) { *why = "v4 has no block-sparse masks (v3 runs them)"; return false; }
  if (a.d != 64 && a.d != 128) { *why = "v4 needs d in {64, 128}"; return false; }
  if (a.nq == 0) return true;
  if (a.nk == 0) {  // no keys, nothing to copy (a map needs N >= 1): v3 writes the empty rows
    v3_forward<T>(a, s);
    return true;
  }
  const int cfg = v4_tuning_cfg();
  // Rows that see few keys (short or causal sequences) give each CTA few key tiles, so its loads
  // and epilogue weigh: one consumer warpgroup, two CTAs per multiprocessor. The limits are where
  // that shape measured faster on H200 (docs/performance-gpu.md).
  const bool few = cfg == 0 && few_keys_per_row(a, a.d == 64 ? 1024 : 512);
  if (a.d == 64) {
    if (cfg == 1) return launch<T, Cfg4<64, 2, 128, 2>>(a, s, why);
    if (cfg == 2) return launch<T, Cfg4<64, 3, 128, 3>>(a, s, why);
    if (cfg == 3 || few) return launch<T, Cfg4<64, 1, 128, 2>>(a, s, why);
    return launch<T, Cfg4<64, 3, 128, 2>>(a, s, why);  // also cfg 4: never the few-keys shape
  }
  if (cfg == 1) return launch<T, Cfg4<128, 2, 64, 4>>(a, s, why);
  if (cfg == 3 || few) return launch<T, Cfg4<128, 1, 64, 2>>(a, s, why);
  return launch<T, Cfg4<128, 2, 128, 2>>(a, s, why);
}

template bool v4_forward<bf16>(const FwdArgs<bf16>&, cudaStream_t, const char**);
template bool v4_forward<f16>(const FwdArgs<f16>&, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
