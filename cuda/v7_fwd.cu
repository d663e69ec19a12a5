// cuda/v7_fwd.cu — variant 7 forward: v4's persistent warp-specialized forward (fwd_ws.cuh: the
// same producer, shapes and host side) whose consumers run across item boundaries as one
// pipeline. Spec §4.1 (eq. 4.1-4.4), §6.1, §4.3. In v4 a consumer warpgroup ends an item with
// its last O += P V alone, then the epilogue, then the next item's first S = Q K^T and softmax
// alone: about one tile of products and softmax that overlap nothing, per item, which weighs
// where items have few key tiles (short sequences, causal rows near the diagonal). Here the
// item's last P V is issued with the next item's first S = Q K^T, and runs while that tile's
// softmax does (as P V and softmax overlap inside an item); its epilogue (4.4) follows, once
// the product is done, and the accumulator starts over for the new item. What is left per item
// is the epilogue itself. Limits, knobs and the choice of shape: v4's (fwd_ws.cuh).
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

// The kernel: fwd_ws.cuh's producer, and consumers that carry an item's last P V into the next.
template <class T, class C, bool KIDX>
__global__ void __launch_bounds__(C::kThreads, C::kCtas)
    v7_fwd_kernel(const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mK,
                  const __grid_constant__ CUtensorMap mV, FwdArgs<T> a, int n_items, int* next, int n_tail) {
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

  if (tid == 0) init_bars<C>(bars);
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
  const bool has_block = false;  // v7_forward never launches with a block mask
  constexpr bool band_only = !KIDX;
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const float c2 = sl2 > 0.f ? sl2 : 1.f;
  // Descriptors of the first Q buffer and K, V stage; the others lie a whole number of 16-byte
  // units further (the descriptor's address field), so a tile's is one add, not a shared-window
  // conversion per tile.
  const uint64_t dQb = v3::desc_k_base<kBr>(sQ, wg * 64);  // my 64 rows of Q
  const uint64_t dKb = v3::desc_k_base<kBc>(sK, 0), dVb = v3::desc_mn_base<kBc>(sV);
  constexpr uint64_t kQStep = uint64_t(kBr) * D * sizeof(T) / 16, kStageStep = uint64_t(kBc) * D * sizeof(T) / 16;
  // (st, ph): stage and parity of the ring's next tile, (pst, pph) of the tile before; both run
  // on across items.
  int st = 0, pst = 0;
  uint32_t ph = 0, pph = 0;
  float acc[D / 2];  // O~ (4.3): wgmma accumulator, my 2 rows x D/4 columns
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};  // (4.1)-(4.2), base 2
  uint32_t pa[kBc / 16][4];  // P_{i-1} as wgmma A fragments
  // The pending item: its tiles are done but for the last P V (pa, V of stage pst), and its
  // epilogue; its batch, head and first row of mine, and (copied from m_r, l_r once the next
  // item starts) its rows' final max and sum.
  bool pending = false;
  float pm[2] = {0.f, 0.f}, pl[2] = {0.f, 0.f};
  int64_t pb = 0, phd = 0, pr0 = 0;
  // The pending item's last P V with nothing to overlap, and its epilogue: before an item with no
  // visible key, or at the end; m_r, l_r are still the pending item's then.
  auto finish_alone = [&] {
    tma::wait(&bars.v_full[pst], pph);
    v3::pv_product<T, D, kBc>(acc, pa, sV + pst * kBc * D);
    if (lane == 0) tma::arrive(&bars.v_empty[pst]);
    epilogue::forward_rows<T, D>(a, pb, phd, pr0, acc, m_r, l_r, t4);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    pending = false;
  };
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
    if (it.qt < 0) {
      if (pending) finish_alone();
      break;
    }
    const int64_t q0 = int64_t(it.qt) * kBr, h = it.h, b = it.b;
    auto pred = [&](int ri, int jl) -> bool {
      return tiles::fwd_visible(a, kidx, has_block, llo[ri], lhi[ri], q0 + wrow + g + 8 * ri, jl);
    };
    if (it.t_begin >= it.t_end) {  // no key is visible: the pending item first, then empty rows
      if (pending) finish_alone();
      tma::wait(&bars.q_full[C::q_slot(n)], C::q_parity(n));
      if (lane == 0) tma::arrive(&bars.q_empty[C::q_slot(n)]);
      const float m0[2] = {-INFINITY, -INFINITY}, l0[2] = {0.f, 0.f};
      epilogue::forward_rows<T, D>(a, b, h, q0 + wrow + g, acc, m0, l0, t4);  // acc is 0 here
      continue;
    }
    if (pending) {  // its final (m, l); this item's start over
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        pm[ri] = m_r[ri];
        pl[ri] = l_r[ri];
      }
    }
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      m_r[ri] = -INFINITY;
      l_r[ri] = 0.f;
    }
    const uint64_t dQ0 = dQb + C::q_slot(n) * kQStep;
    tma::wait(&bars.q_full[C::q_slot(n)], C::q_parity(n));

    // Tile i: S_i = Q K_{tau_i}^T, then O += P_{i-1} V_{tau_{i-1}} while S_i's softmax runs. The
    // modes are separate instantiations, so no wgmma sits in a data-dependent branch:
    //   kStart   the first tile with nothing pending: no P V;
    //   kHandoff the first tile with an item pending: P_{i-1} V is that item's last, and once it
    //            is done the accumulator holds that item's O~, which the epilogue writes;
    //   kSteady  the others: O rescaled by alpha (lagging max) after P V.
    enum : int { kStart, kHandoff, kSteady };
    auto tile = [&](int t, auto mode) {
      constexpr int kMode = decltype(mode)::value;
      const int j0 = t * kBc;
      const bool full = it.full_lo <= j0 && j0 + kBc <= it.full_hi;
      tma::wait(&bars.k_full[st], ph);
      if (kMode != kStart) tma::wait(&bars.v_full[pst], pph);
      float s[kBc / 2];  // S = Q K^T (2.1), unscaled
      const uint64_t dQ = v3::opaque(dQ0), dK = v3::opaque(dKb + st * kStageStep);
      v3::pin(acc);
      v3::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        v3::Wgmma<T>::template ss<kBc, 0>(s, v3::desc_k_step<kBr>(dQ, kk), v3::desc_k_step<kBc>(dK, kk), kk);
      v3::commit();
      if constexpr (kMode != kStart) {
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
      if constexpr (kMode != kStart) {
        v3::wait<0>();  // P_{i-1} V done: V_{tau_{i-1}} may be refilled, O final or rescaled, pa refilled
        v3::pin(acc);
        v3::pin(pa);
        if (lane == 0) tma::arrive(&bars.v_empty[pst]);
        if constexpr (kMode == kHandoff) {
          // ---- the pending item's epilogue (4.4), or its merge (4.5)-(4.7) (epilogue.cuh)
          epilogue::forward_rows<T, D>(a, pb, phd, pr0, acc, pm, pl, t4);
#pragma unroll
          for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
        } else {
          if (moved) softmax::rescale<D>(acc, alpha);
        }
      }
      v3::pack_a<T, kBc>(pa, s);
      pst = st;
      pph = ph;
      if (++st == kS) { st = 0; ph ^= 1; }
    };
    if (pending)
      tile(it.t_begin, std::integral_constant<int, kHandoff>{});
    else
      tile(it.t_begin, std::integral_constant<int, kStart>{});
    for (int t = it.t_begin + 1; t < it.t_end; ++t) tile(t, std::integral_constant<int, kSteady>{});
    if (lane == 0) tma::arrive(&bars.q_empty[C::q_slot(n)]);  // every S of this item is done
    pending = true;
    pb = b;
    phd = h;
    pr0 = q0 + wrow + g;
  }
#else
  __trap();  // built without sm_90a: the dispatcher never launches v7 then
#endif
}

}  // namespace

template <class T>
bool v7_forward(const FwdArgs<T>& a, cudaStream_t s, const char** why) {
  if (a.mask.block != nullptr) { *why = "v7 has no block-sparse masks (v3 runs them)"; return false; }
  if (a.d != 64 && a.d != 128) { *why = "v7 needs d in {64, 128}"; return false; }
  if (a.nq == 0) return true;
  if (a.nk == 0) {  // no keys, nothing to copy (a map needs N >= 1): v3 writes the empty rows
    v3_forward<T>(a, s);
    return true;
  }
  return dispatch(a, [&](auto cfg, auto kidx) {
    using C = decltype(cfg);
    return launch<T, C>(&v7_fwd_kernel<T, C, decltype(kidx)::value>, "launch of v7_fwd_kernel", a, s, why);
  });
}

template bool v7_forward<bf16>(const FwdArgs<bf16>&, cudaStream_t, const char**);
template bool v7_forward<f16>(const FwdArgs<f16>&, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
