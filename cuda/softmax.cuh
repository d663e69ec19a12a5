// cuda/softmax.cuh — one key tile of the forward's online softmax (spec eq. 4.1-4.3) on a warp's
// S tile held in the mma/wgmma accumulator layout, shared by the wgmma forwards (v3, v4).
// Thread (g = lane / 4, t4 = lane % 4) holds rows g and g + 8 (ri = 0, 1) of its warp's m16
// rows; s[4 nt + 2 ri + e] is row g + 8 ri, key 8 nt + 2 t4 + e of the tile. Base 2 throughout:
// x = S scale log2(e); the running max m_r is in that unit. Internal; include from .cu only.
#pragma once

#include <cstdint>

#include "mma.cuh"
#include "wgmma.cuh"

namespace burstlab::cuda::detail::softmax {

// Masks the unscaled S of the key tile starting at local key j0 in place (-inf where not visible).
// A non-positive scale is applied here first, so that -inf stays -inf (eq. 4.1 then needs no
// fold; a uniform, rare branch). full: every key of the tile is visible to every row (no
// predicate). band_only: visibility is the row interval [llo, lhi) alone (causal, windows,
// documents on contiguous keys); else pred(ri, jl) decides.
template <int BC, class Pred>
__device__ __forceinline__ void mask_tile(float (&s)[BC / 2], float sl2, bool full, bool band_only, int j0, int t4,
                                          const int (&llo)[2], const int (&lhi)[2], Pred pred) {
  if (!(sl2 > 0.f)) {
#pragma unroll
    for (int e = 0; e < BC / 2; ++e) s[e] *= sl2;
  }
  if (full) return;
  if (band_only) {
    const int c0 = j0 + 2 * t4;
#pragma unroll
    for (int e = 0; e < BC / 2; ++e) {
      const int jl = c0 + (e >> 2) * 8 + (e & 1), ri = (e >> 1) & 1;
      s[e] = (jl >= llo[ri] && jl < lhi[ri]) ? s[e] : -INFINITY;
    }
  } else {
#pragma unroll
    for (int e = 0; e < BC / 2; ++e)
      s[e] = pred((e >> 1) & 1, j0 + (e >> 2) * 8 + 2 * t4 + (e & 1)) ? s[e] : -INFINITY;
  }
}

// Row ri's max over the tile (the quad's four threads hold a row), unscaled.
template <int BC>
__device__ __forceinline__ float row_max(const float (&s)[BC / 2], int ri) {
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < BC / 8; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * ri], s[4 * nt + 2 * ri + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

// Row ri's P~ = 2^(S c2 - m_use) in place; returns the thread's part of its sum.
template <int BC>
__device__ __forceinline__ float row_exp(float (&s)[BC / 2], int ri, float c2, float m_use) {
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = v2::ex2(fmaf(s[4 * nt + 2 * ri + e], c2, -m_use));
      s[4 * nt + 2 * ri + e] = p;
      sum += p;
    }
  return sum;
}

// The online update (4.1)-(4.3) of rows g, g + 8: s becomes P~ = 2^(S c2 - m_new) (the scale is
// folded into ex2's FMA; max commutes with it since c2 > 0), m_r the new running max, l_r the
// thread-partial row sums (quad-summed in the epilogue), alpha the factor O~ must be scaled by.
template <int BC>
__device__ __forceinline__ void online(float (&s)[BC / 2], float c2, float (&m_r)[2], float (&l_r)[2],
                                       float (&alpha)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const float m_new = fmaxf(m_r[ri], row_max<BC>(s, ri) * c2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // never (-inf) - (-inf)
    alpha[ri] = v2::ex2(m_r[ri] - m_use);                  // 0 when m = -inf
    l_r[ri] = l_r[ri] * alpha[ri] + row_exp<BC>(s, ri, c2, m_use);
    m_r[ri] = m_new;
  }
}

// The same update with a lagging reference (FlashAttention-4's conditional rescaling; spec §4.1):
// m_r moves only when some row of the warp meets a tile max above m_r + kLag, so most tiles skip
// the rescaling of O~ and l and its two exponentials. P~ = 2^(x - m_r) then lies in [0, 2^kLag]
// instead of [0, 1], which changes no relative rounding (spec §9.2). Returns whether the warp
// moved its references (warp-uniform); only then must O~ be scaled by alpha.
constexpr float kLag = 8.f;
template <int BC>
__device__ __forceinline__ bool online_lazy(float (&s)[BC / 2], float c2, float (&m_r)[2], float (&l_r)[2],
                                            float (&alpha)[2]) {
  float mx[2];
  bool above = false;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    mx[ri] = row_max<BC>(s, ri) * c2;
    above = above || mx[ri] > m_r[ri] + kLag;  // always when m_r = -inf and the row sees a key
  }
  const bool moved = __any_sync(0xffffffffu, above);
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const float m_new = moved ? fmaxf(m_r[ri], mx[ri]) : m_r[ri];
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // never (-inf) - (-inf)
    const float sum = row_exp<BC>(s, ri, c2, m_use);
    if (moved) {
      alpha[ri] = v2::ex2(m_r[ri] - m_use);  // 0 when m = -inf
      l_r[ri] = l_r[ri] * alpha[ri] + sum;
    } else {
      l_r[ri] += sum;
    }
    m_r[ri] = m_new;
  }
  return moved;
}

// O~ *= alpha (eq. 4.3).
template <int D>
__device__ __forceinline__ void rescale(float (&acc)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[4 * c + e] *= alpha[e >> 1];
}

// O~ *= alpha (eq. 4.3) and P~ packed into wgmma A fragments (the m16n8k16 A layout per warp),
// rounded to the storage dtype T (the u_P term of spec §9.1).
template <class T, int D, int BC>
__device__ __forceinline__ void rescale_pack(float (&acc)[D / 2], uint32_t (&pa)[BC / 16][4], const float (&s)[BC / 2],
                                             const float (&alpha)[2]) {
  rescale<D>(acc, alpha);
  v3::pack_a<T, BC>(pa, s);
}

}  // namespace burstlab::cuda::detail::softmax
