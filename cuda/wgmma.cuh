// cuda/wgmma.cuh — Hopper (sm_90a) tensor-core building blocks of the v3 kernels: warpgroup MMA
// (wgmma.mma_async) with fp32 accumulators, shared-memory matrix descriptors over the 128-byte
// swizzle, and the tile layout and loader that produce that swizzle. Internal; include from .cu
// files compiled for sm_90a only (cuda/CMakeLists.txt).
//
// Shared-memory tile layout ("sw128"): a (ROWS, D) tile of 16-bit elements is stored as D/64
// panels of (ROWS, 64), each row 128 bytes; 16-byte chunk c of row r sits at chunk c ^ (r % 8)
// of that row. Panels start on 1024-byte boundaries, so this is exactly the hardware's 128B
// swizzle and wgmma reads it through a descriptor with no base offset.
//   K-major operand (Q or K as the B of S = Q K^T): 8-row groups 1024 bytes apart (SBO), the
//   k16 step advances the start address 32 bytes inside a panel, then to the next panel.
//   MN-major operand (V as the B of O = P V, transposed): N = d runs along the panel rows
//   (64 elements), the next 64 columns of d are one panel further (LBO = ROWS * 128 bytes), K =
//   key index steps 8 rows per SBO = 1024 bytes, and the k16 step advances 16 rows = 2048 bytes.
#pragma once

#include <cstdint>

#include "mma.cuh"
#include "tile_mask.cuh"

namespace burstlab::cuda::detail::v3 {

using v2::cp_async16;
using v2::smem_u32;

// Element offset of 16-byte chunk c (of D/8) of row r in a sw128 (ROWS, D) tile.
template <int ROWS>
__device__ __forceinline__ int sw128(int r, int c) {
  return (c >> 3) * (ROWS * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

// ROWS x D tile from global rows [0, nvalid) (row stride in elements) into a sw128 tile; rows
// >= nvalid are zero-filled (cp.async with src-size 0 reads nothing). Each thread copies one
// fixed chunk column of every RSTEP-th row: RSTEP is a multiple of 8, so the swizzle of its
// chunk is the same in every row it copies and its addresses advance by constants (few live
// registers across the main loop, which holds the accumulators).
template <class T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_sw128(T* s, const T* g, int64_t rstride, int nvalid, int tid) {
  constexpr int CH = D / 8;
  constexpr int RSTEP = NT / CH;
  static_assert(NT % CH == 0 && RSTEP % 8 == 0, "load_sw128: thread count must cover whole 8-row groups");
  const int r0 = tid / CH, c = tid % CH;
  T* const dst = s + sw128<ROWS>(r0, c);
  const T* src = g + r0 * rstride + c * 8;
#pragma unroll
  for (int k = 0; k * RSTEP < ROWS; ++k) {
    const int r = r0 + k * RSTEP;
    if (r < ROWS) {
      const bool ok = r < nvalid;
      cp_async16(dst + k * RSTEP * 64, ok ? src : g, ok ? 16 : 0);
    }
    src += RSTEP * rstride;
  }
}

// Matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading and stride
// byte offsets (all >> 4), swizzle mode 1 = 128B in bits 62-63; base offset 0 (1024-aligned).
__device__ __forceinline__ uint64_t desc(const void* p, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t a = smem_u32(p);
  return uint64_t((a & 0x3FFFF) >> 4) | (uint64_t(lbo_bytes >> 4) << 16) |
         (uint64_t(sbo_bytes >> 4) << 32) | (uint64_t(1) << 62);
}
// Descriptors of a K-major sw128 tile (Q, K: 8-row groups 1024 bytes apart) whose first row is
// `row0`, and of an MN-major one (V, transposed B: panels ROWS x 128 bytes apart).
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_base(const void* tile, int row0) {
  return desc(static_cast<const char*>(tile) + row0 * 128, 16, 1024);
}
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_base(const void* tile) {
  return desc(tile, ROWS * 128, 1024);
}
// The k16 step kk: K-major advances 32 bytes inside a 128-byte panel row, then a panel; MN-major
// advances 16 rows (2048 bytes). Start addresses are in 16-byte units in the low bits.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_step(uint64_t base, int kk) {
  return base + uint64_t(((kk >> 2) * (ROWS * 128) + (kk & 3) * 32) >> 4);
}
__device__ __forceinline__ uint64_t desc_mn_step(uint64_t base, int kk) { return base + uint64_t(kk * 128); }
// Hides a value from the optimizer so that per-step descriptors are formed next to their use
// rather than hoisted out of the main loop (16 live 64-bit registers each otherwise).
__device__ __forceinline__ uint64_t opaque(uint64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Generic-proxy writes (cp.async, st.shared) made visible to the async proxy (wgmma reads).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator accesses across wgmma issue/wait points.
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

#include "wgmma_ops.inc"

// Packs accumulator columns 16 kk .. 16 kk + 15 of x (the m64nN layout, N/2 per thread) as wgmma
// A fragments (the m16n8k16 A layout per warp), rounded to the storage dtype T.
template <class T, int N>
__device__ __forceinline__ void pack_a(uint32_t (&pa)[N / 16][4], const float* x) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    pa[kk][0] = v2::Mma<T>::pack(x[8 * kk + 0], x[8 * kk + 1]);
    pa[kk][1] = v2::Mma<T>::pack(x[8 * kk + 2], x[8 * kk + 3]);
    pa[kk][2] = v2::Mma<T>::pack(x[8 * kk + 4], x[8 * kk + 5]);
    pa[kk][3] = v2::Mma<T>::pack(x[8 * kk + 6], x[8 * kk + 7]);
  }
}

// Wgmma<T>::ss<N, TRANS_B, TRANS_A>(d, desc_a, desc_b, acc): d (64 x N per warpgroup, N/2 per
// thread) = (acc ? d : 0) + A B, A (M-major when TRANS_A) and B from shared memory; ss0: d = A B
// with d written only (not read: registers that other code wrote before stay out of the product's
// inputs); rs: A from registers (4 x b32 per thread, the m16n8k16 A layout per warp).
template <class T> struct Wgmma;
template <> struct Wgmma<bf16> {
  template <int N, int TB, int TA = 0> __device__ static void ss(float* d, uint64_t a, uint64_t b, int acc) {
    if constexpr (N == 32) mma_ss_bf16_n32<TB, TA>(d, a, b, acc);
    else if constexpr (N == 64) mma_ss_bf16_n64<TB, TA>(d, a, b, acc);
    else if constexpr (N == 176) mma_ss_bf16_n176<TB, TA>(d, a, b, acc);
    else {
      static_assert(N == 128, "wgmma_ops.inc has N in {32, 64, 128, 176}");
      mma_ss_bf16_n128<TB, TA>(d, a, b, acc);
    }
  }
  template <int N, int TB, int TA = 0> __device__ static void ss0(float* d, uint64_t a, uint64_t b) {
    if constexpr (N == 32) mma_ss0_bf16_n32<TB, TA>(d, a, b);
    else if constexpr (N == 64) mma_ss0_bf16_n64<TB, TA>(d, a, b);
    else if constexpr (N == 176) mma_ss0_bf16_n176<TB, TA>(d, a, b);
    else {
      static_assert(N == 128, "wgmma_ops.inc has N in {32, 64, 128, 176}");
      mma_ss0_bf16_n128<TB, TA>(d, a, b);
    }
  }
  template <int N, int TB> __device__ static void rs(float* d, const uint32_t* a, uint64_t b, int acc) {
    if constexpr (N == 32) mma_rs_bf16_n32<TB>(d, a, b, acc);
    else if constexpr (N == 64) mma_rs_bf16_n64<TB>(d, a, b, acc);
    else if constexpr (N == 176) mma_rs_bf16_n176<TB>(d, a, b, acc);
    else {
      static_assert(N == 128, "wgmma_ops.inc has N in {32, 64, 128, 176}");
      mma_rs_bf16_n128<TB>(d, a, b, acc);
    }
  }
};
template <> struct Wgmma<f16> {
  template <int N, int TB, int TA = 0> __device__ static void ss(float* d, uint64_t a, uint64_t b, int acc) {
    if constexpr (N == 32) mma_ss_f16_n32<TB, TA>(d, a, b, acc);
    else if constexpr (N == 64) mma_ss_f16_n64<TB, TA>(d, a, b, acc);
    else if constexpr (N == 176) mma_ss_f16_n176<TB, TA>(d, a, b, acc);
    else {
      static_assert(N == 128, "wgmma_ops.inc has N in {32, 64, 128, 176}");
      mma_ss_f16_n128<TB, TA>(d, a, b, acc);
    }
  }
  template <int N, int TB, int TA = 0> __device__ static void ss0(float* d, uint64_t a, uint64_t b) {
    if constexpr (N == 32) mma_ss0_f16_n32<TB, TA>(d, a, b);
    else if constexpr (N == 64) mma_ss0_f16_n64<TB, TA>(d, a, b);
    else if constexpr (N == 176) mma_ss0_f16_n176<TB, TA>(d, a, b);
    else {
      static_assert(N == 128, "wgmma_ops.inc has N in {32, 64, 128, 176}");
      mma_ss0_f16_n128<TB, TA>(d, a, b);
    }
  }
  template <int N, int TB> __device__ static void rs(float* d, const uint32_t* a, uint64_t b, int acc) {
    if constexpr (N == 32) mma_rs_f16_n32<TB>(d, a, b, acc);
    else if constexpr (N == 64) mma_rs_f16_n64<TB>(d, a, b, acc);
    else if constexpr (N == 176) mma_rs_f16_n176<TB>(d, a, b, acc);
    else {
      static_assert(N == 128, "wgmma_ops.inc has N in {32, 64, 128, 176}");
      mma_rs_f16_n128<TB>(d, a, b, acc);
    }
  }
};

// The backward's paired products S = A B^T and S2 = A2 B2^T (S and dP, or S^T and dP^T): all four
// operands K-major sw128 in shared memory (A tiles of ROWS_A rows, B tiles of N rows), issued
// together over the D/16 k16 steps, then waited for.
template <class T, int D, int ROWS_A, int N>
__device__ __forceinline__ void two_products(float (&s)[N / 2], float (&s2)[N / 2], uint64_t a, uint64_t b,
                                             uint64_t a2, uint64_t b2) {
  fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    Wgmma<T>::template ss<N, 0>(s, desc_k_step<ROWS_A>(a, kk), desc_k_step<N>(b, kk), kk);
    Wgmma<T>::template ss<N, 0>(s2, desc_k_step<ROWS_A>(a2, kk), desc_k_step<N>(b2, kk), kk);
  }
  commit();
  wait<0>();
  pin(s);
  pin(s2);
}

// The dQ pass's step over one key tile (v3 and v4's deterministic mode): S = Q K^T and
// dP = dO V^T (5.4) from shared memory, dS = P (dP - D) (5.5, tile_mask.cuh's dq_pass_ds) in
// registers, then acc += dS K (5.6, K transposed), waited for. dQd0, dOd0: the warpgroup's Q and
// dO descriptors (tiles of ROWS rows); cK, cV: the (BC, D) key and value tiles; r0: the thread's
// first local query row.
template <class T, int D, int ROWS, int BC, class G>
__device__ __forceinline__ void dq_tile(float (&acc)[D / 2], uint64_t dQd0, uint64_t dOd0, const T* cK, const T* cV,
                                        const tiles::BwdRows& rows, bool full, bool block, int j0, int t4, float sl2,
                                        const BwdArgs<T, G>& a, int64_t r0) {
  float s[BC / 2], dp[BC / 2];  // S, dP: my 2 rows x BC/4 keys
  const uint64_t dQd = opaque(dQd0), dOd = opaque(dOd0);
  const uint64_t dK = opaque(desc_k_base<BC>(cK, 0)), dV = opaque(desc_k_base<BC>(cV, 0));
  pin(acc);
  two_products<T, D, ROWS, BC>(s, dp, dQd, dK, dOd, dV);
  tiles::dq_pass_ds<BC>(s, dp, rows, full, block, j0, t4, sl2, a, r0);  // dS (5.5)
  uint32_t da[BC / 16][4];  // dS as A fragments, rounded to T
  pack_a<T, BC>(da, s);
  const uint64_t dKt = opaque(desc_mn_base<BC>(cK));
  fence();
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) Wgmma<T>::template rs<D, 1>(acc, da[kk], desc_mn_step(dKt, kk), 1);  // dQ += dS K
  commit();
  wait<0>();
  pin(acc);
  pin(da);
}

// The dK/dV pass's products, issued and committed (not waited for): dV += P^T dO (5.3) and
// dK += dS^T Q (5.7), P^T and dS^T from registers (pa, sa), dO and Q transposed (MN-major).
template <class T, int D, int BQ>
__device__ __forceinline__ void dvdk_products(float (&dv)[D / 2], float (&dk)[D / 2], const uint32_t (&pa)[BQ / 16][4],
                                              const uint32_t (&sa)[BQ / 16][4], uint64_t dOt, uint64_t dQt) {
  fence();
#pragma unroll
  for (int kk = 0; kk < BQ / 16; ++kk) {
    Wgmma<T>::template rs<D, 1>(dv, pa[kk], desc_mn_step(dOt, kk), 1);  // dV += P^T dO
    Wgmma<T>::template rs<D, 1>(dk, sa[kk], desc_mn_step(dQt, kk), 1);  // dK += dS^T Q
  }
  commit();
}

// The forward's last O += P V (P from registers, V of BC keys transposed in shared memory), waited for.
template <class T, int D, int BC>
__device__ __forceinline__ void pv_product(float (&acc)[D / 2], uint32_t (&pa)[BC / 16][4], const void* v) {
  const uint64_t dV = opaque(desc_mn_base<BC>(v));
  pin(acc);
  fence();
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) Wgmma<T>::template rs<D, 1>(acc, pa[kk], desc_mn_step(dV, kk), 1);
  commit();
  wait<0>();
  pin(acc);
  pin(pa);
}

}  // namespace burstlab::cuda::detail::v3
