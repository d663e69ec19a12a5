// cuda/lmhead_v2.cu — LM head variants 2 and 3 (spec §10; the API: cuda_lmhead.hpp): the three
// products by cuBLAS (cublasGemmEx, 16-bit operands, fp32 compute, reduced-precision reductions
// disallowed so the accumulation is the u_a of §10.8), v1's chunk loop around them. Per chunk of
// Nc rows, on one stream:
//   1. Z = H_rows W^T                 (eq. 10.1)  fp32 (Nc, Vp)
//   2. one CTA per row: m and s of eq. (10.2) in ONE read of the row (a running (m, s) per thread,
//      combined across the CTA), LSE, the loss (10.3), then dz (10.7) rounded to T
//   3. dH_rows = 2^e dz W             (eq. 10.8)  stored in T
//   4. dW += 2^e dz^T H_rows          (eq. 10.9)
// v2 keeps v1's buffers: dz in its own (Nc, Vp) buffer, dW summed in an fp32 (V, d) accumulator.
// v3 writes dz over the chunk's own logits (row i's 16-bit dz in the first half of its fp32 row,
// read by cuBLAS with a row stride of 2 Vp elements) and lets cuBLAS sum dW in T (beta = 1 from
// the second chunk on): its workspace is the logits chunk alone, and dW is rounded to T once per
// chunk (lmhead_dW_roundings; the §10.8 bound of dW counts them).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

#include "burstlab/error.hpp"
#include "cuda_lmhead.hpp"
#include "detail.cuh"
#include "lmhead_common.cuh"

namespace burstlab::cuda {
namespace detail::lmhead {
namespace {

void cublas_check(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")");
}
#define BURSTLAB_CUBLAS_CHECK(expr) cublas_check((expr), #expr, __FILE__, __LINE__)

// One cuBLAS handle per (thread, device), made on first use: a handle is not thread-safe to share,
// and creating one per call costs more than a small product.
cublasHandle_t handle_for_device() {
  struct Handles {
    std::map<int, cublasHandle_t> by_device;
    ~Handles() {
      for (auto& [dev, h] : by_device) cublasDestroy(h);  // errors ignored at thread exit
    }
  };
  thread_local Handles handles;
  int dev = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  auto it = handles.by_device.find(dev);
  if (it != handles.by_device.end()) return it->second;
  cublasHandle_t h = nullptr;
  BURSTLAB_CUBLAS_CHECK(cublasCreate(&h));
  handles.by_device[dev] = h;
  BURSTLAB_CUBLAS_CHECK(
      cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  return h;
}

template <class T>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<T, bf16> ? CUDA_R_16BF : CUDA_R_16F;
}

// Column-major C (m, n) = alpha op(A) op(B) + beta C, fp32 compute: the row-major products of the
// header read as their transposes.
void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha,
          const void* A, cudaDataType_t at, int64_t lda, const void* B, cudaDataType_t bt, int64_t ldb, float beta,
          void* C, cudaDataType_t ct, int64_t ldc) {
  for (int64_t x : {m, n, k, lda, ldb, ldc})
    if (x > INT32_MAX) fail("a cuBLAS dimension or leading dimension (", x, ") exceeds 2^31 - 1; use lmhead variant 1");
  BURSTLAB_CUBLAS_CHECK(cublasGemmEx(h, ta, tb, int(m), int(n), int(k), &alpha, A, at, int(lda), B, bt, int(ldb), &beta, C,
                                     ct, int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct RowArgs2 : RowFacts {  // c: g w 2^-e
  float* Z;                  // (rows, ldz) logits of the chunk; v3 writes dz over them
  int64_t ldz;
  void* dz;                  // (rows, lddz) in T, or null (forward only)
  int64_t lddz;
};

constexpr int kVec = 8;                      // columns per thread per step: two float4 reads, one 16-byte store
constexpr int kStep = kRowThreads * kVec;    // columns per CTA per step

// One CTA per row of the chunk. IN_PLACE: the CTA meets at a barrier between reading a step's
// logits and writing its dz, since dz of columns [j, j + 8) lands on the bytes of logits [j/2, j/2 + 4)
// (earlier steps', or this step's, all read by then).
template <class T, bool IN_PLACE>
__global__ void __launch_bounds__(kRowThreads) row_kernel2(RowArgs2 a) {
  __shared__ float red[kRowThreads / 32];
  const int tid = threadIdx.x;
  const Row row = row_of(a);
  const float* z = a.Z + row.i * a.ldz;
  float L;
  if (!a.LSE_in) {
    float m = -INFINITY, s = 0.f, zs = 0.f;  // this thread's running max and sum of exp(z - m), eq. (10.10)
    for (int64_t j0 = int64_t(tid) * kVec; j0 < a.V; j0 += kStep) {
      const float4 u = *reinterpret_cast<const float4*>(z + j0), w = *reinterpret_cast<const float4*>(z + j0 + 4);
      const float x[kVec] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
      float mx = m;
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (j0 + e < a.V) mx = fmaxf(mx, x[e]);
      s *= expf(m - mx);  // m = -inf only while s = 0
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (j0 + e < a.V) {
          s += expf(x[e] - mx);
          zs += x[e];
        }
      m = mx;
    }
    const float M = block_reduce(m, red, true);
    s = block_reduce(m == -INFINITY ? 0.f : s * expf(m - M), red, false);
    L = M + logf(s);
    if (a.eps_on) zs = block_reduce(zs, red, false);
    store_row_stats(a, row, L, z, zs);
  } else {
    L = a.LSE_in[row.gi];
  }
  if (!a.dz) return;
  T* out = static_cast<T*>(a.dz) + row.i * a.lddz;
  const float c = row.counted ? a.c : 0.f;
  const float q = c * (1.f + 2.f * a.lam * L);
  for (int64_t base = 0; base < a.Vp; base += kStep) {
    const int64_t j0 = base + int64_t(tid) * kVec;
    const bool mine = j0 < a.Vp;  // Vp is a multiple of 8: a thread's 8 columns are all in or all out
    float x[kVec];
    if (mine && row.counted) {
      const float4 u = *reinterpret_cast<const float4*>(z + j0), w = *reinterpret_cast<const float4*>(z + j0 + 4);
      x[0] = u.x; x[1] = u.y; x[2] = u.z; x[3] = u.w; x[4] = w.x; x[5] = w.y; x[6] = w.z; x[7] = w.w;
    }
    if constexpr (IN_PLACE) __syncthreads();
    if (!mine) continue;
    alignas(16) T v[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int64_t j = j0 + e;
      float dzj = 0.f;  // ignored rows and the padding columns: exact zeros
      if (row.counted && j < a.V) {
        dzj = q * expf(x[e] - L) - c * a.smooth;
        if (j == row.yi) dzj -= c * a.keep;
      }
      v[e] = Store<T>::from(dzj);
    }
    *reinterpret_cast<uint4*>(out + j0) = *reinterpret_cast<const uint4*>(v);
  }
}

}  // namespace

extern const int64_t kCublasWorkspace = int64_t(32) << 20;  // cuBLAS's recommendation for Hopper

template <class T>
float run_v2(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g, Mode mode,
             const float* LSE_in, float* LSE_out, View2<T> dH, View2<T> dW, const LmHeadOptions& opt, bool in_place) {
  const cudaStream_t s = opt.stream;
  const bool bwd = mode != Mode::Forward, partials = mode != Mode::Backward;
  const int64_t N = p.N, d = p.d, V = p.V, Vp = round_up(V, 8);
  const int variant = in_place ? 3 : 2;
  const int64_t Nc = lmhead_chunk_rows(p, variant, opt);
  const Weights wt = check_labels(p, y, g, s);

  Scratch<float> Z(static_cast<size_t>(Nc * Vp), s);                         // (Nc, Vp)
  Scratch<T> dz(bwd && !in_place ? static_cast<size_t>(Nc * Vp) : 0, s);     // (Nc, Vp)
  Scratch<float> loss_rows(partials ? static_cast<size_t>(N) : 0, s);        // (N)
  Scratch<float> dW_acc(bwd && !in_place ? static_cast<size_t>(V * d) : 0, s);  // (V, d)
  Scratch<unsigned char> ws(static_cast<size_t>(kCublasWorkspace), s);
  const cublasHandle_t h = handle_for_device();
  BURSTLAB_CUBLAS_CHECK(cublasSetStream(h, s));
  BURSTLAB_CUBLAS_CHECK(cublasSetWorkspace(h, ws.p, static_cast<size_t>(kCublasWorkspace)));

  RowArgs2 ra;
  ra.Z = Z.p;
  ra.ldz = Vp;
  ra.dz = !bwd ? nullptr : in_place ? static_cast<void*>(Z.p) : static_cast<void*>(dz.p);
  ra.lddz = in_place ? 2 * Vp : Vp;
  set_row_facts(ra, p, y, Vp, wt.c, partials, LSE_in, LSE_out, loss_rows.p);

  constexpr cudaDataType_t tt = cuda_type<T>();
  const int64_t ldH = H.stride[0], ldW = W.stride[0];
  for (int64_t r0 = 0; r0 < N; r0 += Nc) {
    const int64_t rows = std::min(Nc, N - r0);
    const T* Hc = H.data + r0 * ldH;  // (rows, d)
    // eq. (10.1): Z^T (V, rows) = W (V, d) . Hc^T (d, rows), column-major
    gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, V, rows, d, 1.f, W.data, tt, ldW, Hc, tt, ldH, 0.f, Z.p, CUDA_R_32F, Vp);
    ra.r0 = r0;
    if (in_place) row_kernel2<T, true><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(ra);
    else row_kernel2<T, false><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(ra);
    BURSTLAB_CUDA_LAUNCH_CHECK("lmhead row_kernel2");
    if (!bwd) continue;
    const void* dzp = ra.dz;
    // eq. (10.8): dH_rows^T (d, rows) = W^T (d, V) . dz^T (V, rows)
    gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, rows, V, wt.undo, W.data, tt, ldW, dzp, tt, ra.lddz, 0.f,
         dH.data + r0 * dH.stride[0], tt, dH.stride[0]);
    // eq. (10.9): dW^T (d, V) += Hc^T (d, rows) . dz (rows, V)
    const float beta = r0 == 0 ? 0.f : 1.f;
    if (in_place)
      gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, V, rows, wt.undo, Hc, tt, ldH, dzp, tt, ra.lddz, beta, dW.data, tt,
           dW.stride[0]);
    else
      gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, V, rows, wt.undo, Hc, tt, ldH, dzp, tt, ra.lddz, beta, dW_acc.p,
           CUDA_R_32F, d);
  }
  if (bwd && !in_place) store_dw(dW_acc.p, V, d, dW, s);
  const float L = partials ? loss_of(loss_rows.p, N, wt.w, s) : 0.f;
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  BURSTLAB_CUBLAS_CHECK(cublasSetWorkspace(h, nullptr, 0));  // ws is freed on return
  return L;
}

#define BURSTLAB_LMHEAD_V2(T)                                                                                  \
  template float run_v2<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*, double, Mode,   \
                           const float*, float*, View2<T>, View2<T>, const LmHeadOptions&, bool);
BURSTLAB_LMHEAD_V2(bf16)
BURSTLAB_LMHEAD_V2(f16)

}  // namespace detail::lmhead
}  // namespace burstlab::cuda
