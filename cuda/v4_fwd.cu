// cuda/v4_fwd.cu — variant 4 forward: v3's wgmma forward, warp-specialized (FA3's structure) on a
// persistent grid. Spec §4.1 (eq. 4.1-4.4), §6.1 (blocks over global positions), §4.3 (fold
// into a running partial). As many CTAs as fit on the device; each loops over work items (query
// tile of Br = 64 WGS rows, head h, batch b) and has 1 + WGS warpgroups:
//   producer  warpgroup 0 gives its registers back (setmaxnreg); its warp 0 works out each
//             item's key tiles and posts them to the consumers, and one thread issues every
//             copy: the item's Q, then K and V tiles of BC keys into a ring of STAGES buffers, by
//             the bulk tensor copy engine (TMA, tma.cuh), straight into wgmma's 128-byte swizzle
//             (fwd_ws.cuh, with the shapes and the host side);
//   consumers warpgroups 1..WGS, 64 query rows each, run v3's per-tile math (S = Q K^T, the
//             online softmax of softmax.cuh, O += P V overlapped with the next tile's softmax),
//             with a lagging max (softmax::online_lazy: O~ is rescaled only when a row's max
//             grows by more than 2^8, spec §4.1), and never meet at a CTA barrier: each waits on
//             the mbarrier that says its tile has landed and releases the buffer with an
//             arrival once its wgmma has read it.
// The loads thus run ahead of the math on their own, across items too, the consumers hold no
// load addresses (up to 232 registers each for the accumulators), and the warpgroups drift in
// and out of phase, which overlaps one's softmax with another's products.
// Limits: v3's (bf16/fp16, d in {64, 128}, 16-byte aligned views with strides in multiples of 8
// elements, a compute capability 9.0 device), and no block-sparse mask: the tile sequence must be
// known to the producer without a CTA-wide vote (v3 runs those). v4_forward returns false when it
// cannot run a call; the dispatcher (api.cu) then runs v3 or reports why.
#include <cstdint>
#include <type_traits>

#include "detail.cuh"
#include "epilogue.cuh"
#include "fwd_ws.cuh"
#include "softmax.cuh"
#include "tile_mask.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace burstlab::cuda::detail {

namespace {

using v2::kLog2e;

using namespace fwd_ws;

// Epilogue (4.4) of a consumer warp's 16 rows [wrow, wrow + 16) of item (q0, h, b) through shared
// memory: O = O~ / l written into sQ, the item's (Br, D) Q buffer in the sw128 layout the copy
// engine reads (16-byte chunk c of row R at c ^ (R mod 8); thread (g, t4)'s pairs land in 32
// distinct banks), then lane 0 stores them by TMA, one (64, 16) box per 64 columns, and commits
// the bulk group (the caller waits for its reads before the buffer is reused). LSE from registers.
template <class T, class C>
__device__ __forceinline__ void store_o_tma(const CUtensorMap* mO, const FwdArgs<T>& a, T* sQ, int64_t q0, int64_t h,
                                            int64_t b, int wrow, const float* acc, const float* m_r,
                                            const float* l_r, int lane) {
  constexpr int D = C::kD, kBr = C::kBr;
  const int g = lane >> 2, t4 = lane & 3;
  float inv[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float l = l_r[ri];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[ri] = l > 0.f ? 1.f / l : 0.f;
    const int64_t r = q0 + wrow + g + 8 * ri;
    if (t4 == 0 && r < a.nq) a.LSE(b, h, r) = l > 0.f ? m_r[ri] * v2::kLn2 + logf(l) : -INFINITY;
  }
  const uint32_t base = v2::smem_u32(sQ);
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int R = wrow + g + 8 * ri;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {  // columns 8 i + 2 t4 (+1): panel i / 8, chunk i % 8
      const uint32_t x = v2::Mma<T>::pack(inv[ri] * acc[4 * i + 2 * ri], inv[ri] * acc[4 * i + 2 * ri + 1]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(base + (i / 8) * kBr * 128 + R * 128 + (((i % 8) ^ (R & 7)) << 4) +
                                                      4 * t4),
                   "r"(x)
                   : "memory");
    }
  }
  tma::fence_proxy_async();
  __syncwarp();
  if (lane == 0) {
#pragma unroll
    for (int p = 0; p < D / 64; ++p)
      tma::store_4d(mO, 64 * p, static_cast<int>(q0 + wrow), static_cast<int>(h), static_cast<int>(b),
                    sQ + p * kBr * 64 + wrow * 64);
    tma::bulk_commit();
  }
}

// The kernel: fwd_ws.cuh's producer, and v4's consumers. TMA_O: O leaves through the item's Q
// buffer (store_o_tma; launched for shapes with two Q buffers and no merge only), so each consumer
// warp arrives twice on the buffer's q_empty: after the item's last S, as without, and at the next
// item's start, once the store has read it. (Moving the first arrival there instead made ptxas
// keep the loop's descriptors in ordinary registers: about 4x the R2UR per tile, sm_90a.)
template <class T, class C, bool KIDX, bool TMA_O = false>
__global__ void __launch_bounds__(C::kThreads, C::kCtas)
    v4_fwd_kernel(const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mK,
                  const __grid_constant__ CUtensorMap mV, FwdArgs<T> a, int n_items, int* next, int n_tail,
                  const __grid_constant__ CUtensorMap mO) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::kD, kBc = C::kBc, kBr = C::kBr, kS = C::kStages;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));  // 2 x (Br, D) sw128
  T* sK = sQ + C::kQBuf * kBr * D;  // S x (Bc, D) sw128
  T* sV = sK + kS * kBc * D;    // S x (Bc, D) sw128
  __shared__ Bars bars;
  __shared__ Item mail[2];
  __shared__ int2 mail_rows[2][kBr];  // each row's local key interval [lo, hi) (eq. 3.4)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wg = warp / 4 - 1;       // consumer warpgroup (-1: producer)
  const int wrow = (warp - 4) * 16;  // a consumer warp's first row in the item

  if (tid == 0) init_bars<C>(bars, TMA_O ? 2 : 1);
  __syncthreads();  // publishes the barrier inits
  constexpr bool kidx = KIDX;

  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<C::kRegP>();
    if (warp != 0) return;
    producer<T, C, KIDX>(&mQ, &mK, &mV, a, n_items, next, n_tail, bars, mail, mail_rows, sQ, sK, sV);
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<C::kRegC>();
  const bool has_block = false;  // v4_forward never launches with a block mask
  constexpr bool band_only = !KIDX;
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const float c2 = sl2 > 0.f ? sl2 : 1.f;
  // Descriptors of the first Q buffer and K, V stage; the others lie a whole number of 16-byte
  // units further (the descriptor's address field), so a tile's is one add, not a shared-window
  // conversion per tile.
  const uint64_t dQb = v3::desc_k_base<kBr>(sQ, wg * 64);  // my 64 rows of Q
  const uint64_t dKb = v3::desc_k_base<kBc>(sK, 0), dVb = v3::desc_mn_base<kBc>(sV);
  constexpr uint64_t kQStep = uint64_t(kBr) * D * sizeof(T) / 16, kStageStep = uint64_t(kBc) * D * sizeof(T) / 16;
  // (st, ph): stage and parity of the ring's next tile; it runs on across items.
  int st = 0;
  uint32_t ph = 0;
  for (int n = 0;; ++n) {
    tma::wait(&bars.item_full[n & 1], (n >> 1) & 1);
    const Item it = mail[n & 1];
    // mask facts of my rows g, g + 8 (eq. 3.4): local key intervals [llo, lhi), from the producer
    int llo[2], lhi[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int2 iv = mail_rows[n & 1][wrow + g + 8 * ri];
      llo[ri] = iv.x;
      lhi[ri] = iv.y;
    }
    tma::arrive(&bars.item_empty[n & 1]);
    if (TMA_O && n > 0 && lane == 0) {  // TMA_O's second arrival: the previous item's O store has read its buffer
      tma::bulk_wait_read();
      tma::arrive(&bars.q_empty[C::q_slot(n - 1)]);
    }
    if (it.qt < 0) break;
    const int64_t q0 = int64_t(it.qt) * kBr, h = it.h, b = it.b;
    auto pred = [&](int ri, int jl) -> bool {
      return tiles::fwd_visible(a, kidx, has_block, llo[ri], lhi[ri], q0 + wrow + g + 8 * ri, jl);
    };
    float acc[D / 2];  // O~ (4.3): wgmma accumulator, my 2 rows x D/4 columns
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};  // (4.1)-(4.2), base 2
    uint32_t pa[kBc / 16][4];  // P_{i-1} as wgmma A fragments
    const uint64_t dQ0 = dQb + C::q_slot(n) * kQStep;
    tma::wait(&bars.q_full[C::q_slot(n)], C::q_parity(n));

    // Tile i: S_i = Q K_{tau_i}^T, then O += P_{i-1} V_{tau_{i-1}} while S_i's softmax runs; the
    // first tile has no P V (a separate instantiation, so no wgmma sits in a data-dependent
    // branch). (pst, pph): stage and parity of tile i - 1.
    int pst = 0;
    uint32_t pph = 0;
    auto tile = [&](int t, auto first) {
      constexpr bool kFirst = decltype(first)::value;
      const int j0 = t * kBc;
      const bool full = it.full_lo <= j0 && j0 + kBc <= it.full_hi;
      tma::wait(&bars.k_full[st], ph);
      if (!kFirst) tma::wait(&bars.v_full[pst], pph);
      float s[kBc / 2];  // S = Q K^T (2.1), unscaled
      const uint64_t dQ = v3::opaque(dQ0), dK = v3::opaque(dKb + st * kStageStep);
      v3::pin(acc);
      v3::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        v3::Wgmma<T>::template ss<kBc, 0>(s, v3::desc_k_step<kBr>(dQ, kk), v3::desc_k_step<kBc>(dK, kk), kk);
      v3::commit();
      if constexpr (!kFirst) {
        const uint64_t dV = v3::opaque(dVb + pst * kStageStep);
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk)
          v3::Wgmma<T>::template rs<D, 1>(acc, pa[kk], v3::desc_mn_step(dV, kk), 1);
        v3::commit();
        v3::wait<1>();  // S done: K_{tau_i} may be refilled
      } else {
        v3::wait<0>();
      }
      v3::pin(s);
      if (lane == 0) tma::arrive(&bars.k_empty[st]);

      softmax::mask_tile<kBc>(s, sl2, full, band_only, j0, t4, llo, lhi, pred);
      float alpha[2];
      const bool moved = softmax::online_lazy<kBc>(s, c2, m_r, l_r, alpha);
      if constexpr (!kFirst) {
        v3::wait<0>();  // P_{i-1} V done: V_{tau_{i-1}} may be refilled, O rescaled, pa refilled
        v3::pin(acc);
        v3::pin(pa);
        if (lane == 0) tma::arrive(&bars.v_empty[pst]);
        if (moved) softmax::rescale<D>(acc, alpha);  // the first tile's O~ is still 0
      }
      v3::pack_a<T, kBc>(pa, s);
      pst = st;
      pph = ph;
      if (++st == kS) { st = 0; ph ^= 1; }
    };
    if (it.t_begin < it.t_end) {
      tile(it.t_begin, std::true_type{});
      for (int t = it.t_begin + 1; t < it.t_end; ++t) tile(t, std::false_type{});
    }
    if (lane == 0) tma::arrive(&bars.q_empty[C::q_slot(n)]);  // every S of this item is done
    if (it.t_begin < it.t_end) {  // the last P V
      tma::wait(&bars.v_full[pst], pph);
      v3::pv_product<T, D, kBc>(acc, pa, sV + pst * kBc * D);
      if (lane == 0) tma::arrive(&bars.v_empty[pst]);
    }

    // ---- epilogue (4.4), or the merge (4.5)-(4.7) into the running partial (epilogue.cuh)
    if constexpr (TMA_O) {
      store_o_tma<T, C>(&mO, a, sQ + C::q_slot(n) * kBr * D, q0, h, b, wrow, acc, m_r, l_r, lane);
    } else {
      epilogue::forward_rows<T, D>(a, b, h, q0 + wrow + g, acc, m_r, l_r, t4);
    }
  }
#else
  __trap();  // built without sm_90a: the dispatcher never launches v4 then
#endif
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
  return dispatch(a, [&](auto cfg, auto kidx) {
    using C = decltype(cfg);
    constexpr bool kidx_v = decltype(kidx)::value;
    if constexpr (C::kQBuf == 2)
      if (epilogue_knob() == 1 && !a.accumulate &&
          launch<T, C>(&v4_fwd_kernel<T, C, kidx_v, true>, "launch of v4_fwd_kernel", a, s, why, true))
        return true;  // else O has no tensor map: from registers (Q, K or V without one declines there too)
    return launch<T, C>(&v4_fwd_kernel<T, C, kidx_v>, "launch of v4_fwd_kernel", a, s, why);
  });
}

template bool v4_forward<bf16>(const FwdArgs<bf16>&, cudaStream_t, const char**);
template bool v4_forward<f16>(const FwdArgs<f16>&, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
