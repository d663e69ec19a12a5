// cuda/v3_fwd.cu — variant 3 forward: Hopper warpgroup MMA (wgmma, sm_90a), fp32 accumulation.
// Spec §4.1 (eq. 4.1-4.4), §6.1 (blocks over global positions), §4.3 (fold into a running
// partial). One CTA = (b, h, Br = 64 WGS query rows): WGS warpgroups of 4 warps, each owning 64
// rows. Q stays in shared memory for the whole CTA; K/V tiles of BC keys are double-buffered
// (cp.async by every thread into the 128-byte-swizzled layout of wgmma.cuh). Per key tile:
//   S = Q K^T     wgmma m64nBCk16, A = Q and B = K from shared memory (descriptors, K-major);
//   softmax       online, base 2, in registers (the accumulator layout is mma.sync's, so the
//                 row statistics and masks are v2's);
//   O += P V      wgmma m64nDk16, A = P from registers (rounded to the storage dtype, the u_P
//                 term of spec §9.1), B = V from shared memory (MN-major: transposed).
// Masks exactly as v2: the CTA's row intervals (eq. 3.4) bound the key tiles visited; tiles
// visible everywhere skip the predicate; block-sparse tiles with no visible bit are skipped;
// indexed positions predicate every tile.
// Limits: bf16/fp16, d in {64, 128}, the alignment rules of v2, a device of compute capability
// 9.0 (sm_90a code). The API's dispatcher checks all of these before choosing v3.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "detail.cuh"
#include "epilogue.cuh"
#include "softmax.cuh"
#include "tile_mask.cuh"
#include "wgmma.cuh"

namespace burstlab::cuda::detail {

namespace {

using v2::cp_async_commit;
using v2::cp_async_wait;
using v2::kLog2e;

// WGS warpgroups (Br = 64 WGS query rows), BC keys per tile, MINB CTAs per SM (register cap).
template <int D, int WGS, int BC, int MINB>
struct Cfg3 {
  static constexpr int kD = D, kBc = BC, kBr = 64 * WGS, kThreads = 128 * WGS, kMinBlocks = MINB;
  static constexpr int kWarps = 4 * WGS;
  // Q + 2 x (K, V), plus 1 KB to align the first tile to the swizzle pattern (1024 bytes).
  static constexpr size_t smem_bytes(size_t elem) { return size_t(kBr + 4 * kBc) * D * elem + 1024; }
};

template <class T, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) v3_fwd_kernel(FwdArgs<T> a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::kD, kWarps = C::kWarps, kBc = C::kBc, kBr = C::kBr, kThreads = C::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));  // (Br, D) sw128
  T* sK = sQ + kBr * D;  // 2 x [(Bc, D) K, (Bc, D) V], sw128
  __shared__ int red[4][kWarps];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wg = warp / 4;
  // Query tiles in reverse: under causal masks the last tiles have the most keys, so they start
  // first and the short ones fill the tail of the grid.
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBr, h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
  const int64_t nq = a.nq, nk = a.nk;
  const T* Kg = a.K.row(b, hk, 0);
  const T* Vg = a.V.row(b, hk, 0);
  const int64_t ks = a.K.stride[2], vs = a.V.stride[2];
  const int wrow = warp * 16;  // my warp's first row in the CTA (= wgmma's row of warp w % 4 in WG wg)

  v3::load_sw128<T, kBr, D, kThreads>(sQ, a.Q.row(b, h, q0), a.Q.stride[2],
                                      static_cast<int>(nq - q0 < kBr ? nq - q0 : kBr), tid);
  cp_async_commit();

  // ---- mask facts of my rows g, g + 8: local key interval [llo, lhi) (eq. 3.4); the CTA's hull
  // of key tiles and the keys every row sees (tile_mask.cuh, shared with v2).
  const bool kidx = a.kp.index != nullptr;
  int llo[2], lhi[2];
  const tiles::Hull hull = tiles::fwd_rows<kWarps>(a, q0 + wrow + g, kidx, red, llo, lhi);
  const int t_begin = hull.lo < hull.hi ? static_cast<int>(hull.lo / kBc) : 0;
  const int t_end = hull.lo < hull.hi ? static_cast<int>((hull.hi + kBc - 1) / kBc) : 0;
  const bool has_block = a.mask.block != nullptr;
  const bool block_rect = has_block && !kidx && a.qp.index == nullptr;
  const int64_t i_first = a.qp.start + q0, i_last = a.qp.start + (nq - q0 < kBr ? nq : q0 + kBr);
  // Next visited tile from t (CTA-uniform; barriers inside when a block mask is present).
  auto next_tile = [&](int t, bool* full) -> int {
    while (t < t_end && !tiles::fwd_tile<kThreads>(a.mask, a.kp, nk, int64_t(t) * kBc, int64_t(t + 1) * kBc,
                                                   block_rect, has_block, i_first, i_last, hull, full))
      ++t;
    return t;
  };
  auto pred = [&](int ri, int jl) -> bool {
    return tiles::fwd_visible(a, kidx, has_block, llo[ri], lhi[ri], q0 + wrow + g + 8 * ri, jl);
  };
  auto rows_in = [&](int64_t j0) { return static_cast<int>(nk - j0 < kBc ? nk - j0 : kBc); };

  float acc[D / 2];  // O~ (4.3): wgmma accumulator, my 2 rows x D/4 columns
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};  // (4.1)-(4.2), base 2
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const float c2 = sl2 > 0.f ? sl2 : 1.f;  // multiplier folded into the exponent (see softmax)
  // Visibility is the row interval [llo, lhi) alone (lhi <= nk; rows past nq are never stored).
  const bool band_only = !kidx && !has_block;

  // Key tiles in visit order tau_0, tau_1, ...; K and V each double-buffered. Iteration i
  // issues S_i = Q K_{tau_i}^T and O += P_{i-1} V_{tau_{i-1}} back to back, so the tensor cores
  // run the P V product while this warpgroup does the softmax of S_i (FA3's intra-warpgroup
  // overlap). Loads issued in iteration i: K_{tau_{i+1}} and V_{tau_i} (one iteration ahead of use).
  T* const sV = sK + 2 * kBc * D;  // V buffers follow the two K buffers
  const uint64_t dQ0 = v3::desc_k_base<kBr>(sQ, wg * 64);  // my warpgroup's 64 rows of Q
  bool full = false;
  int t = next_tile(t_begin, &full);
  if (t < t_end)
    v3::load_sw128<T, kBc, D, kThreads>(sK, Kg + int64_t(t) * kBc * ks, ks, rows_in(int64_t(t) * kBc), tid);
  cp_async_commit();
  // P_{i-1} as wgmma A fragments (m16n8k16 A layout per warp), rounded to T. Before the first
  // tile it is P = 0 against a zeroed V buffer: the P V product is then issued unconditionally
  // (exactly +0), which keeps every wgmma out of data-dependent branches (ptxas serializes
  // wgmma that it cannot prove warpgroup-uniform).
  uint32_t pa[kBc / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
  for (int e = tid; e < kBc * D / 8; e += kThreads)
    reinterpret_cast<uint4*>(sV + kBc * D)[e] = make_uint4(0u, 0u, 0u, 0u);
  int i = 0;
  for (; t < t_end; ++i) {
    const int64_t j0 = int64_t(t) * kBc;
    bool full_next = false;
    const int tn = next_tile(t + 1, &full_next);
    T* const cK = sK + (i & 1) * (kBc * D);
    T* const pV = sV + ((i + 1) & 1) * (kBc * D);  // V of tau_{i-1}
    if (tn < t_end)
      v3::load_sw128<T, kBc, D, kThreads>(sK + ((i + 1) & 1) * (kBc * D), Kg + int64_t(tn) * kBc * ks, ks,
                                          rows_in(int64_t(tn) * kBc), tid);
    v3::load_sw128<T, kBc, D, kThreads>(sV + (i & 1) * (kBc * D), Vg + j0 * vs, vs, rows_in(j0), tid);
    cp_async_commit();
    cp_async_wait<1>();       // K_{tau_i} and V_{tau_{i-1}} (and Q) landed
    v3::fence_proxy_async();  // ... and are visible to wgmma's async proxy
    __syncthreads();

    float s[kBc / 2];  // S = Q K^T (2.1), unscaled; s[4 nt + e] is v2's s[nt][e]
    const uint64_t dQ = v3::opaque(dQ0), dK = v3::opaque(v3::desc_k_base<kBc>(cK, 0));
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
    v3::wait<1>();  // S done; P V may still run
    v3::pin(s);

    // ---- online softmax (4.1)-(4.3) in base 2 (softmax.cuh, shared with v4)
    softmax::mask_tile<kBc>(s, sl2, full, band_only, static_cast<int>(j0), t4, llo, lhi, pred);
    float alpha[2];
    softmax::online<kBc>(s, c2, m_r, l_r, alpha);
    v3::wait<0>();  // P_{i-1} V done: O may be rescaled and pa refilled
    v3::pin(acc);
    v3::pin(pa);
    softmax::rescale_pack<T, D, kBc>(acc, pa, s, alpha);
    __syncthreads();  // every warpgroup is done with K_{tau_i} and V_{tau_{i-1}} before refills
    t = tn;
    full = full_next;
  }
  cp_async_wait<0>();
  {  // the last P V: V of the last visited tile (iteration i - 1's buffer; the zeroed one if none)
    v3::fence_proxy_async();
    __syncthreads();
    v3::pv_product<T, D, kBc>(acc, pa, sV + ((i + 1) & 1) * (kBc * D));
  }

  // ---- epilogue (4.4), or the merge (4.5)-(4.7) into the running partial (epilogue.cuh)
  epilogue::forward_rows<T, D>(a, b, h, q0 + wrow + g, acc, m_r, l_r, t4);
#else
  __trap();  // built without sm_90a: the dispatcher never launches v3 then
#endif
}

template <class T, class C>
void launch(const FwdArgs<T>& a, cudaStream_t s) {
  const size_t smem = C::smem_bytes(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(&v3_fwd_kernel<T, C>), smem);
  const dim3 grid(static_cast<unsigned>((a.nq + C::kBr - 1) / C::kBr), static_cast<unsigned>(a.Hq),
                  static_cast<unsigned>(a.B));
  v3_fwd_kernel<T, C><<<grid, C::kThreads, smem, s>>>(a);
  BURSTLAB_CUDA_LAUNCH_CHECK("v3_fwd_kernel");
}

}  // namespace

// Tuning knob for the benchmark only: BURSTLAB_V3_CFG = 0 (default), 1, 2 (cuda/README.md).
int v3_tuning_cfg() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V3_CFG"));
  return v;
}

template <class T>
void v3_forward(const FwdArgs<T>& a, cudaStream_t s) {
  if (a.nq == 0) return;
  const int cfg = std::is_same<T, bf16>::value ? v3_tuning_cfg() : 0;  // tuning: bf16 only
  if (a.d == 64) {
    if (cfg == 1) launch<T, Cfg3<64, 2, 64, 2>>(a, s);
    else if (cfg == 2) launch<T, Cfg3<64, 3, 64, 1>>(a, s);
    else launch<T, Cfg3<64, 2, 128, 1>>(a, s);
  } else if (a.d == 128) {
    if (cfg == 1) launch<T, Cfg3<128, 2, 64, 2>>(a, s);
    else if (cfg == 2) launch<T, Cfg3<128, 3, 64, 1>>(a, s);
    else launch<T, Cfg3<128, 2, 128, 1>>(a, s);
  } else {
    fail("d (", a.d, ") must be 64 or 128 for v3");
  }
}

template void v3_forward<bf16>(const FwdArgs<bf16>&, cudaStream_t);
template void v3_forward<f16>(const FwdArgs<f16>&, cudaStream_t);

}  // namespace burstlab::cuda::detail
