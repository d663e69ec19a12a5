// cuda/epilogue.cuh — writing the tensor-core variants' (v2, v3) accumulators to global memory.
// Both hold a warp's m16 rows in the mma/wgmma accumulator layout: thread (g = lane / 4,
// t4 = lane % 4) has rows g and g + 8, and acc[4 i + 2 ri + e] is row g + 8 ri, column
// 8 i + 2 t4 + e. Internal; include from .cu only.
#pragma once

#include <cstdint>

#include "mma.cuh"

namespace burstlab::cuda::detail::epilogue {

// row[8 i + 2 t4 + e] = s acc[4 i + 2 ri + e] in the storage dtype, for i < D / 8 (one row ri).
template <class T, int D>
__device__ __forceinline__ void store_row(T* row, const float* acc, int ri, int t4, float s) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
    *reinterpret_cast<uint32_t*>(row + i * 8 + 2 * t4) =
        v2::Mma<T>::pack(s * acc[4 * i + 2 * ri], s * acc[4 * i + 2 * ri + 1]);
}

// row[8 i + 2 t4 + e] += s acc[4 i + 2 ri + e] in fp32 (a backward block's contribution, §6.2),
// one 8-byte read-modify-write per pair (the tensor-core paths ask 16-byte aligned rows).
template <int D>
__device__ __forceinline__ void accumulate_row(float* row, const float* acc, int ri, int t4, float s) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    float2* p = reinterpret_cast<float2*>(row + i * 8 + 2 * t4);
    float2 v = *p;
    v.x += s * acc[4 * i + 2 * ri];
    v.y += s * acc[4 * i + 2 * ri + 1];
    *p = v;
  }
}

// Forward epilogue of one m16 row tile (eq. 4.4): O = O~ / l, LSE = m ln 2 + ln l (base-2 running
// max m, thread-partial sums l summed over the quad here); empty rows (0, -inf). With
// a.accumulate, the merge (4.5)-(4.7) into the running (O, LSE) instead. r0: global-local row
// index of the thread's row g (row g + 8 is r0 + 8).
template <class T, int D>
__device__ __forceinline__ void forward_rows(const FwdArgs<T>& a, int64_t b, int64_t h, int64_t r0,
                                             const float* acc, const float* m_r, const float* l_r, int t4) {
  float L[2], inv[2], Lold[2] = {0.f, 0.f};
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float l = l_r[ri];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    L[ri] = l > 0.f ? m_r[ri] * v2::kLn2 + logf(l) : -INFINITY;
    inv[ri] = l > 0.f ? 1.f / l : 0.f;
    const int64_t r = r0 + 8 * ri;
    if (a.accumulate && r < a.nq) Lold[ri] = a.LSE(b, h, r);
  }
  __syncwarp();  // all reads of the old LSE before any write
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t r = r0 + 8 * ri;
    if (r >= a.nq) continue;
    T* orow = a.O.row(b, h, r);
    if (!a.accumulate) {
      store_row<T, D>(orow, acc, ri, t4, inv[ri]);
      if (t4 == 0) a.LSE(b, h, r) = L[ri];
      continue;
    }
    float wa = 0.f, wb = 1.f, Lnew = L[ri];
    merge_weights<float>(Lold[ri], L[ri], &wa, &wb, &Lnew);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t4);
      const float2 old = v2::Mma<T>::unpack(*dst);
      const float x0 = acc[4 * i + 2 * ri] * inv[ri], x1 = acc[4 * i + 2 * ri + 1] * inv[ri];
      *dst = v2::Mma<T>::pack((wa != 0.f ? wa * old.x : 0.f) + (wb != 0.f ? wb * x0 : 0.f),
                              (wa != 0.f ? wa * old.y : 0.f) + (wb != 0.f ? wb * x1 : 0.f));
    }
    if (t4 == 0) a.LSE(b, h, r) = Lnew;
  }
}

// Backward dK/dV rows of one m16 key tile, keys j0 and j0 + 8 (keys past nk are not written):
// dK = scale dk (eq. 5.7 without the scale), dV = dv (eq. 5.3), stored in T (keys local =
// global); ACC: added onto fp32 gradients that accumulate (backward_block, §6.2; keys LOCAL to
// the block).
template <class T, int D, bool ACC = false, class A>
__device__ __forceinline__ void write_dkdv(const A& a, int64_t b, int64_t hk, int64_t j0, const float* dk,
                                           const float* dv, int t4) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t j = j0 + 8 * ri;
    if (j >= a.nk) continue;
    if constexpr (ACC) {
      accumulate_row<D>(a.dK.row(b, hk, j), dk, ri, t4, static_cast<float>(a.scale));
      accumulate_row<D>(a.dV.row(b, hk, j), dv, ri, t4, 1.f);
    } else {
      store_row<T, D>(a.dK.row(b, hk, j), dk, ri, t4, static_cast<float>(a.scale));
      store_row<T, D>(a.dV.row(b, hk, j), dv, ri, t4, 1.f);
    }
  }
}

}  // namespace burstlab::cuda::detail::epilogue
