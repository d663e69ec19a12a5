// cuda/lmhead_v1.cu — the fused LM head + cross-entropy on tensor cores (spec §10; the API and
// its contract: cuda_lmhead.hpp). Per chunk of Nc rows, on one stream:
//   1. Z = H_rows W^T                (eq. 10.1)  tensor-core product, fp32 (Nc, Vp) buffer
//   2. one CTA per row: max, sum of exp, LSE (10.2), the row's loss (10.3) and, for the backward,
//      dz (10.7) rounded to T into an (Nc, Vp) buffer whose padding columns are zeros
//   3. dH_rows = dz W                (eq. 10.8)  stored in T
//   4. dW_acc += dz^T H_rows         (eq. 10.9)  an fp32 (V, d) accumulator, converted at the end
// One product kernel serves 1, 3 and 4: C(m, n) = sum_k A(m, k) B(n, k) with A and B each stored
// k-contiguous or transposed (ldmatrix .trans), 128 x 128 x 64 CTA tiles, 8 warps of 64 x 32,
// mma.sync m16n8k16 with fp32 accumulation, operands double-buffered by cp.async in cuda/mma.cuh's
// XOR-swizzled layout (the fragment addressing of v2's S = Q K^T and O += P V, plus A transposed).
// Deterministic: no atomics in the arithmetic; the loss is summed by one CTA in a fixed order.
#include "cuda_lmhead.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "burstlab/error.hpp"
#include "detail.cuh"
#include "lmhead_common.cuh"
#include "mma.cuh"

namespace burstlab::cuda {
namespace detail::lmhead {

using v2::cp_async16;
using v2::cp_async_commit;
using v2::cp_async_wait;
using v2::ldsm_x4;
using v2::ldsm_x4_t;
using v2::Mma;
using v2::swz;

constexpr int kBM = 128, kBN = 128, kBK = 64, kThreads = 256;
constexpr int kTile = kBM * kBK;  // elements of one operand tile (kBN == kBM)
constexpr size_t kSmemBytes = size_t(2) * 2 * kTile * 2;  // 2 stages x 2 operands x 16-bit: 64 KiB

// One operand of C(m, n) = sum_k A(m, k) B(n, k) as STORED: element (r, c) at p[r * ld + c];
// rows >= `rows` and 16-byte chunks reaching past `cols` (a multiple of 8) are read as zeros.
template <class T>
struct Operand {
  const T* p;
  int64_t ld, rows, cols;
};

enum class Epi { StoreF32, StoreT, AddF32 };
template <class T>
struct Out {
  float* f = nullptr;  // StoreF32, AddF32: (M, N) with row stride ldf
  int64_t ldf = 0;
  View2<T> t;          // StoreT
  float alpha = 1.f;   // every product is multiplied by it (a power of two: exact)
};

// A ROWS x COLS tile of the stored matrix at (r0, c0) into shared memory (swz<COLS>).
template <class T, int ROWS, int COLS>
__device__ __forceinline__ void stage(T* s, const Operand<T>& o, int64_t r0, int64_t c0, int tid) {
  constexpr int CH = COLS / 8;
#pragma unroll
  for (int i = tid; i < ROWS * CH; i += kThreads) {
    const int r = i / CH, c = i % CH;
    const int64_t gr = r0 + r, gc = c0 + 8 * c;
    const bool ok = gr < o.rows && gc + 8 <= o.cols;
    cp_async16(s + swz<COLS>(r, c), ok ? o.p + gr * o.ld + gc : o.p, ok ? 16 : 0);
  }
}

// AT: A stored (K, M) (k-major), else (M, K). BT: B stored (K, N), else (N, K).
template <class T, bool AT, bool BT, Epi E>
__global__ void __launch_bounds__(kThreads) gemm_kernel(Operand<T> A, Operand<T> B, int64_t M, int64_t N, int64_t K,
                                                        Out<T> out) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sbase = reinterpret_cast<T*>(smem_raw);  // stage s: A at s * 2 kTile, B after it
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, 64 x 32 of C each
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;

  auto load = [&](int st, int64_t k0) {
    T* sA = sbase + st * 2 * kTile;
    T* sB = sA + kTile;
    if constexpr (AT) stage<T, kBK, kBM>(sA, A, k0, m0, tid);
    else stage<T, kBM, kBK>(sA, A, m0, k0, tid);
    if constexpr (BT) stage<T, kBK, kBN>(sB, B, k0, n0, tid);
    else stage<T, kBN, kBK>(sB, B, n0, k0, tid);
    cp_async_commit();
  };

  float acc[4][4][4];  // [m16 tile][n8 tile][mma C fragment]
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

  const int64_t nk = (K + kBK - 1) / kBK;
  if (nk > 0) load(0, 0);
  for (int64_t kt = 0; kt < nk; ++kt) {
    if (kt + 1 < nk) {
      load(static_cast<int>((kt + 1) & 1), (kt + 1) * kBK);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* sA = sbase + (kt & 1) * 2 * kTile;
    const T* sB = sA + kTile;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int mr = wm * 64 + mt * 16;
        if constexpr (AT)  // stored (k, m): 8x8 blocks transposed into the row-major A fragment
          ldsm_x4_t(af[mt], sA + swz<kBM>(kk * 16 + 8 * (lane >> 4) + (lane & 7), (mr >> 3) + ((lane >> 3) & 1)));
        else
          ldsm_x4(af[mt], sA + swz<kBK>(mr + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * kk + (lane >> 4)));
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int nc = wn * 32 + np * 16;
        uint32_t bf[4];
        if constexpr (BT)  // stored (k, n): as v2's V in O += P V
          ldsm_x4_t(bf, sB + swz<kBN>(kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), (nc >> 3) + (lane >> 4)));
        else  // stored (n, k): as v2's K in S = Q K^T
          ldsm_x4(bf, sB + swz<kBK>(nc + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          Mma<T>::run(acc[mt][2 * np], af[mt], bf[0], bf[1]);
          Mma<T>::run(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // the stage just read is the one the next iteration's load overwrites
  }

#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = m0 + wm * 64 + mt * 16 + g + 8 * (e >> 1);
        const int64_t col = n0 + wn * 32 + nt * 8 + 2 * t4 + (e & 1);
        if (row >= M || col >= N) continue;
        const float v = acc[mt][nt][e] * out.alpha;
        if constexpr (E == Epi::StoreF32) out.f[row * out.ldf + col] = v;
        else if constexpr (E == Epi::AddF32) out.f[row * out.ldf + col] += v;
        else out.t(row, col) = Store<T>::from(v);
      }
}

template <class T, bool AT, bool BT, Epi E>
void gemm(const Operand<T>& A, const Operand<T>& B, int64_t M, int64_t N, int64_t K, const Out<T>& out,
          cudaStream_t s) {
  if (M <= 0 || N <= 0) return;
  auto* k = gemm_kernel<T, AT, BT, E>;
  BURSTLAB_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
  const dim3 grid(static_cast<unsigned>((M + kBM - 1) / kBM), static_cast<unsigned>((N + kBN - 1) / kBN));
  k<<<grid, kThreads, kSmemBytes, s>>>(A, B, M, N, K, out);
  BURSTLAB_CUDA_LAUNCH_CHECK("lmhead gemm_kernel");
}

template <class T>
struct RowArgs : RowFacts {
  const float* Z;            // (rows, Vp) logits of the chunk
  int64_t ldz;
  T* dz;                     // (rows, Vp) or null (forward only)
};

// One CTA per row of the chunk: eq. (10.2)-(10.3), then (10.6)-(10.7).
template <class T>
__global__ void __launch_bounds__(kRowThreads) row_kernel(RowArgs<T> a) {
  __shared__ float red[kRowThreads / 32];
  const int tid = threadIdx.x;
  const Row row = row_of(a);
  const float* z = a.Z + row.i * a.ldz;
  float L;
  if (!a.LSE_in) {
    float m = -INFINITY;
    for (int64_t j = tid; j < a.V; j += kRowThreads) m = fmaxf(m, z[j]);
    m = block_reduce(m, red, true);
    float s = 0.f;
    for (int64_t j = tid; j < a.V; j += kRowThreads) s += expf(z[j] - m);
    s = block_reduce(s, red, false);
    L = m + logf(s);
    float zs = 0.f;
    if (a.eps_on) {
      for (int64_t j = tid; j < a.V; j += kRowThreads) zs += z[j];
      zs = block_reduce(zs, red, false);
    }
    store_row_stats(a, row, L, z, zs);
  } else {
    L = a.LSE_in[row.gi];
  }
  if (!a.dz) return;
  T* out = a.dz + row.i * a.Vp;
  const float c = row.counted ? a.c : 0.f;
  const float q = c * (1.f + 2.f * a.lam * L);
  for (int64_t j = tid; j < a.Vp; j += kRowThreads) {
    float v = 0.f;  // ignored rows and the padding columns: exact zeros
    if (row.counted && j < a.V) {
      v = q * expf(z[j] - L) - c * a.smooth;
      if (j == row.yi) v -= c * a.keep;
    }
    out[j] = Store<T>::from(v);
  }
}

template <class T>
float run_v1(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g, Mode mode,
             const float* LSE_in, float* LSE_out, View2<T> dH, View2<T> dW, const LmHeadOptions& opt) {
  const cudaStream_t s = opt.stream;
  const bool bwd = mode != Mode::Forward, partials = mode != Mode::Backward;
  const int64_t N = p.N, d = p.d, V = p.V, Vp = round_up(V, 8);
  const int64_t Nc = lmhead_chunk_rows(p, 1, opt);

  const Weights wt = check_labels(p, y, g, s);

  Scratch<float> Z(static_cast<size_t>(Nc * Vp), s);                   // (Nc, Vp)
  Scratch<T> dz(bwd ? static_cast<size_t>(Nc * Vp) : 0, s);           // (Nc, Vp)
  Scratch<float> loss_rows(partials ? static_cast<size_t>(N) : 0, s);  // (N)
  Scratch<float> dW_acc(bwd ? static_cast<size_t>(V * d) : 0, s);      // (V, d)
  if (bwd) BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dW_acc.p, 0, size_t(V * d) * sizeof(float), s));

  RowArgs<T> ra;
  ra.Z = Z.p;
  ra.ldz = Vp;
  ra.dz = bwd ? dz.p : nullptr;
  set_row_facts(ra, p, y, Vp, wt.c, partials, LSE_in, LSE_out, loss_rows.p);
  const float undo = wt.undo;

  const Operand<T> Wk{W.data, W.stride[0], V, d};  // W stored (V, d)
  for (int64_t r0 = 0; r0 < N; r0 += Nc) {
    const int64_t rows = std::min(Nc, N - r0);
    const Operand<T> Hc{H.data + r0 * H.stride[0], H.stride[0], rows, d};  // (rows, d)
    Out<T> zout;
    zout.f = Z.p;
    zout.ldf = Vp;
    gemm<T, false, false, Epi::StoreF32>(Hc, Wk, rows, V, d, zout, s);  // eq. (10.1)
    ra.r0 = r0;
    row_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(ra);
    BURSTLAB_CUDA_LAUNCH_CHECK("lmhead row_kernel");
    if (!bwd) continue;
    const Operand<T> dzo{dz.p, Vp, rows, Vp};  // dz stored (rows, Vp)
    Out<T> ho;
    ho.t = dH;
    ho.t.data = dH.data + r0 * dH.stride[0];
    ho.t.dim[0] = rows;
    ho.alpha = undo;
    gemm<T, false, true, Epi::StoreT>(dzo, Wk, rows, d, Vp, ho, s);  // eq. (10.8): dH = dz W
    Out<T> wo;
    wo.f = dW_acc.p;
    wo.ldf = d;
    wo.alpha = undo;
    gemm<T, true, true, Epi::AddF32>(dzo, Hc, V, d, rows, wo, s);  // eq. (10.9): dW += dz^T H
  }
  if (bwd) store_dw(dW_acc.p, V, d, dW, s);
  const float L = partials ? loss_of(loss_rows.p, N, wt.w, s) : 0.f;
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  return L;
}

#define BURSTLAB_LMHEAD_V1(T)                                                                                  \
  template float run_v1<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*, double, Mode,   \
                           const float*, float*, View2<T>, View2<T>, const LmHeadOptions&);
BURSTLAB_LMHEAD_V1(bf16)
BURSTLAB_LMHEAD_V1(f16)

}  // namespace detail::lmhead

template <class T>
std::string lmhead_unsupported(const LmHeadProblem& p, View2<const T> H, View2<const T> W) {
  if constexpr (!(std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>)) {
    return "the cuda LM head runs bf16 and fp16 storage only";
  } else {
    if (p.d % 8) return "d (" + std::to_string(p.d) + ") must be a multiple of 8 for the cuda LM head";
    const View2<const T>* views[2] = {&H, &W};
    const char* names[2] = {"H", "W"};
    for (int k = 0; k < 2; ++k) {
      const View2<const T>& v = *views[k];
      const std::string n = names[k];
      if (v.stride[1] != 1) return n + ".stride[1] (" + std::to_string(v.stride[1]) + ") must be 1 for the cuda LM head";
      if (v.dim[0] > 1 && v.stride[0] % 8)
        return n + ".stride[0] (" + std::to_string(v.stride[0]) + ") must be a multiple of 8 for the cuda LM head";
      if (reinterpret_cast<uintptr_t>(v.data) % 16) return n + ".data must be 16-byte aligned for the cuda LM head";
    }
    if ((p.V + detail::lmhead::kBN - 1) / detail::lmhead::kBN > 65535)
      return "V (" + std::to_string(p.V) + ") must be at most " + std::to_string(65535LL * detail::lmhead::kBN) +
             " for the cuda LM head";
    return "";
  }
}

template std::string lmhead_unsupported<bf16_t>(const LmHeadProblem&, View2<const bf16_t>, View2<const bf16_t>);
template std::string lmhead_unsupported<f16_t>(const LmHeadProblem&, View2<const f16_t>, View2<const f16_t>);
template std::string lmhead_unsupported<float>(const LmHeadProblem&, View2<const float>, View2<const float>);

}  // namespace burstlab::cuda
