// cuda/v2_fwd.cu — variant 2 forward: bf16/fp16 tensor cores, FlashAttention-2 style.
// Spec §4.1 (eq. 4.1-4.4), §6.1 (blocks over global positions), §4.3 (fold into a running
// partial). One CTA = (b, h, Br query rows); each warp owns MT m16 row tiles; key tiles of
// Bc = 64, double-buffered in shared memory (cp.async: the next tile loads during this one);
// S = Q K^T and O += P V with mma.sync m16n8k16 (fp32 accumulation), fragments through
// ldmatrix (.trans for V) from XOR-swizzled shared memory (conflict-free). P is rounded to the
// storage dtype before P V (the u_P term of spec §9.1). Online softmax in base 2 on fp32.
// Masks: the CTA's row intervals (eq. 3.4) give the range of key tiles to visit; tiles outside
// every row's interval are never loaded; tiles inside every row's interval (and all-ones in
// the block bitmap) run without the predicate; the rest evaluate visible() per element.
// Block-sparse tiles with no visible bit are skipped. Indexed positions: every tile predicated.
// Limits: d in {64, 128}; Q/K/V/O with unit d-stride, other strides multiples of 8 elements and
// 16-byte aligned data (checked on the host; otherwise v1 runs).
#include <climits>
#include <cstdint>
#include <type_traits>

#include "detail.cuh"
#include "mma.cuh"
#include "epilogue.cuh"
#include "tile_mask.cuh"

namespace burstlab::cuda::detail {

namespace {

using namespace v2;

// Tile configuration: WARPS warps of MT m16 row tiles each (Br = 16 MT WARPS rows), BC keys per
// tile; Q fragments stay in registers when QREG, else are re-read from shared memory per tile.
template <int D, int MT, int WARPS, int BC, bool QREG>
struct Cfg {
  static constexpr int kD = D, kMT = MT, kWarps = WARPS, kBc = BC, kBr = 16 * MT * WARPS;
  static constexpr int kThreads = 32 * WARPS;
  static constexpr bool kQReg = QREG;
  static constexpr size_t smem_bytes(size_t elem) { return size_t(kBr + 4 * kBc) * D * elem; }
};

template <class T, class C>
__global__ void __launch_bounds__(C::kThreads, 1) v2_fwd_kernel(FwdArgs<T> a) {
  constexpr int D = C::kD, MT = C::kMT, kWarps = C::kWarps, kBc = C::kBc, kBr = C::kBr;
  constexpr int kThreads = C::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (Br, D)
  T* sK = sQ + kBr * D;                    // 2 x [(Bc, D) K, (Bc, D) V]
  __shared__ int red[4][kWarps];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int64_t q0 = int64_t(blockIdx.x) * kBr, h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
  const int64_t nq = a.nq, nk = a.nk;
  const T* Qg = a.Q.row(b, h, q0);
  const T* Kg = a.K.row(b, hk, 0);
  const T* Vg = a.V.row(b, hk, 0);
  const int64_t ks = a.K.stride[2], vs = a.V.stride[2];
  const int wrow = warp * 16 * MT;  // first tile row of my warp; m-tile mt covers wrow + 16 mt ..

  load_tile<T, kBr, D, kThreads>(sQ, Qg, a.Q.stride[2], static_cast<int>(nq - q0 < kBr ? nq - q0 : kBr), tid);
  cp_async_commit();

  // ---- mask facts of my rows (g and g + 8 of each m-tile): the local key interval [llo, lhi)
  // when keys are contiguous (eq. 3.4); kept as int32 to spare registers (nk < 2^31, checked).
  // The CTA's hull of key tiles and tile classes: tile_mask.cuh (shared with v3).
  const bool kidx = a.kp.index != nullptr;
  int llo[MT][2], lhi[MT][2];
  int my_hlo = INT_MAX, my_hhi = INT_MIN, my_flo = INT_MIN, my_fhi = INT_MAX;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int64_t r = q0 + wrow + mt * 16 + g + 8 * ri;
      int64_t lo = 0, hi = nk;
      if (!kidx && r < nq) local_range(a.mask, a.qp[r], a.kp, nk, &lo, &hi);
      llo[mt][ri] = static_cast<int>(lo);
      lhi[mt][ri] = static_cast<int>(hi);
      if (r < nq) tiles::add_row(lo, hi, &my_hlo, &my_hhi, &my_flo, &my_fhi);
    }
  tiles::Hull hull = tiles::cta_hull<kWarps>(my_hlo, my_hhi, my_flo, my_fhi, red);
  if (kidx) { hull.full_lo = INT_MAX; hull.full_hi = INT_MIN; }  // indexed keys: predicate everywhere
  const int t_begin = hull.lo < hull.hi ? static_cast<int>(hull.lo / kBc) : 0;
  const int t_end = hull.lo < hull.hi ? static_cast<int>((hull.hi + kBc - 1) / kBc) : 0;
  const bool has_block = a.mask.block != nullptr;
  const bool block_rect = has_block && !kidx && a.qp.index == nullptr;  // cells form a rectangle
  const int64_t i_first = a.qp.start + q0, i_last = a.qp.start + (nq - q0 < kBr ? nq : q0 + kBr);

  // Next visited tile from t; *full when no element of it needs the predicate. CTA-uniform
  // (barriers inside when a block mask is present: every thread calls it with the same t).
  auto next_tile = [&](int t, bool* full) -> int {
    while (t < t_end && !tiles::fwd_tile<kThreads>(a.mask, a.kp, nk, int64_t(t) * kBc, int64_t(t + 1) * kBc,
                                                   block_rect, has_block, i_first, i_last, hull, full))
      ++t;
    return t;
  };
  // visible(row of (mt, ri), local key jl); only partial tiles call it.
  auto pred = [&](int mt, int ri, int jl) -> bool {
    return tiles::fwd_visible(a, kidx, has_block, llo[mt][ri], lhi[mt][ri], q0 + wrow + mt * 16 + g + 8 * ri, jl);
  };
  auto rows_in = [&](int64_t j0) { return static_cast<int>(nk - j0 < kBc ? nk - j0 : kBc); };

  cp_async_wait<0>();
  __syncthreads();
  // A fragments of my rows of Q: kept in registers (QREG) or re-read per tile.
  uint32_t qf[C::kQReg ? MT : 1][C::kQReg ? D / 16 : 1][4];
  auto q_frag = [&](int mt, int kk, uint32_t* r) {
    ldsm_x4(r, sQ + swz<D>(wrow + mt * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * kk + (lane >> 4)));
  };
  if constexpr (C::kQReg) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) q_frag(mt, kk, qf[mt][kk]);
  }

  float acc[MT][D / 8][4];  // O~ (4.3): my rows x D, mma C layout
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
  float m_r[MT][2], l_r[MT][2];  // running max (base 2) and thread-partial sum (4.1)-(4.2)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) { m_r[mt][0] = m_r[mt][1] = -INFINITY; l_r[mt][0] = l_r[mt][1] = 0.f; }
  const float sl2 = static_cast<float>(a.scale) * kLog2e;

  // Double-buffered K/V: the loads of the next visited tile are issued before this tile's math
  // and have a whole iteration to land (one CTA per SM, so nothing else hides their latency).
  bool full = false;
  int t = next_tile(t_begin, &full);
  int buf = 0;
  if (t < t_end) {
    load_tile<T, kBc, D, kThreads>(sK, Kg + int64_t(t) * kBc * ks, ks, rows_in(int64_t(t) * kBc), tid);
    load_tile<T, kBc, D, kThreads>(sK + kBc * D, Vg + int64_t(t) * kBc * vs, vs, rows_in(int64_t(t) * kBc), tid);
  }
  cp_async_commit();
  while (t < t_end) {
    const int64_t j0 = int64_t(t) * kBc;
    bool full_next = false;
    const int tn = next_tile(t + 1, &full_next);
    T* const cK = sK + buf * (2 * kBc * D);  // this tile's K, V
    T* const cV = cK + kBc * D;
    if (tn < t_end) {
      T* const nK = sK + (buf ^ 1) * (2 * kBc * D);
      load_tile<T, kBc, D, kThreads>(nK, Kg + int64_t(tn) * kBc * ks, ks, rows_in(int64_t(tn) * kBc), tid);
      load_tile<T, kBc, D, kThreads>(nK + kBc * D, Vg + int64_t(tn) * kBc * vs, vs, rows_in(int64_t(tn) * kBc), tid);
    }
    cp_async_commit();
    cp_async_wait<1>();  // tile t landed (tile tn may still be in flight)
    __syncthreads();

    float s[MT][kBc / 8][4];  // S = Q K^T (2.1), unscaled
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < kBc / 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qr[MT][4];
      if constexpr (!C::kQReg) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) q_frag(mt, kk, qr[mt]);
      }
#pragma unroll
      for (int np = 0; np < kBc / 16; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, cK + swz<D>(np * 16 + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t* qa;
          if constexpr (C::kQReg) qa = qf[mt][kk]; else qa = qr[mt];
          Mma<T>::run(s[mt][2 * np], qa, kb[0], kb[1]);
          Mma<T>::run(s[mt][2 * np + 1], qa, kb[2], kb[3]);
        }
      }
    }
    // ---- online softmax (4.1)-(4.3) in base 2: x = S * scale * log2(e); masked x = -inf.
    // The predicate runs only in partial tiles (one branch per tile, not per element).
    if (full) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= sl2;
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[mt][nt][e] = pred(mt, e >> 1, static_cast<int>(j0) + nt * 8 + 2 * t4 + (e & 1))
                               ? s[mt][nt][e] * sl2 : -INFINITY;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * ri], s[mt][nt][2 * ri + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_r[mt][ri], mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // never (-inf) - (-inf)
        const float alpha = ex2(m_r[mt][ri] - m_use);        // 0 when m = -inf
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = ex2(s[mt][nt][2 * ri + e] - m_use);
            s[mt][nt][2 * ri + e] = p;
            sum += p;
          }
        }
        l_r[mt][ri] = l_r[mt][ri] * alpha + sum;  // thread-partial; quad-summed at the end
        m_r[mt][ri] = m_new;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) { acc[mt][i][2 * ri] *= alpha; acc[mt][i][2 * ri + 1] *= alpha; }
      }

#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t pa[MT][4];  // P as A fragments, rounded to T
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldsm_x4_t(vb, cV + swz<D>(kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * dp + (lane >> 4)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::run(acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
          Mma<T>::run(acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before it is refilled
    buf ^= 1;
    t = tn;
    full = full_next;
  }
  cp_async_wait<0>();

  // ---- epilogue (4.4), or the merge (4.5)-(4.7) into the running partial (epilogue.cuh)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    epilogue::forward_rows<T, D>(a, b, h, q0 + wrow + mt * 16 + g, &acc[mt][0][0], m_r[mt], l_r[mt], t4);
}

template <class T, class C>
void launch(const FwdArgs<T>& a, cudaStream_t s) {
  const size_t smem = C::smem_bytes(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(&v2_fwd_kernel<T, C>), smem);
  const dim3 grid(static_cast<unsigned>((a.nq + C::kBr - 1) / C::kBr), static_cast<unsigned>(a.Hq),
                  static_cast<unsigned>(a.B));
  v2_fwd_kernel<T, C><<<grid, C::kThreads, smem, s>>>(a);
  BURSTLAB_CUDA_LAUNCH_CHECK("v2_fwd_kernel");
}

// Tuning knob for the benchmark only: BURSTLAB_V2_CFG = 0 (default), 1, 2, 3 picks one of the
// compiled configurations (see cuda/README.md).
int tuning_cfg() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V2_CFG"));
  return v;
}

}  // namespace

template <class T>
void v2_forward(const FwdArgs<T>& a, cudaStream_t s) {
  if (a.nq == 0) return;
  const int cfg = std::is_same<T, bf16>::value ? tuning_cfg() : 0;  // tuning: bf16 only
  // Defaults measured on an H200 (docs/performance-gpu.md): d = 64 runs two m16 row tiles per
  // warp (Br = 128, 4 warps, Q re-read from shared memory); d = 128 one per warp (8 warps, Q in
  // registers). The others stay compiled for BURSTLAB_V2_CFG (bf16 only).
  if (a.d == 64) {
    if (cfg == 1) launch<T, Cfg<64, 2, 4, 64, true>>(a, s);
    else if (cfg == 2) launch<T, Cfg<64, 1, 8, 64, true>>(a, s);
    else if (cfg == 3) launch<T, Cfg<64, 1, 4, 64, true>>(a, s);
    else launch<T, Cfg<64, 2, 4, 64, false>>(a, s);
  } else if (a.d == 128) {
    if (cfg == 1) launch<T, Cfg<128, 2, 4, 64, false>>(a, s);
    else if (cfg == 2) launch<T, Cfg<128, 2, 4, 32, false>>(a, s);
    else if (cfg == 3) launch<T, Cfg<128, 1, 4, 64, true>>(a, s);
    else launch<T, Cfg<128, 1, 8, 64, true>>(a, s);
  } else {
    fail("d (", a.d, ") must be 64 or 128 for v2");
  }
}

template void v2_forward<bf16>(const FwdArgs<bf16>&, cudaStream_t);
template void v2_forward<f16>(const FwdArgs<f16>&, cudaStream_t);

}  // namespace burstlab::cuda::detail
