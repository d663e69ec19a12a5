// plugins/cudnn/cudnn_kernels.cu — the small kernels the cuDNN plug-in needs beside cuDNN
// (cudnn_kernels.hpp): the forward's packed output copied into strided rows, a stand-in O whose
// row sums with dO are the caller's D, and the widening accumulation of cuDNN's 16-bit block
// gradients into burstlab's fp32 ones.
#include "cudnn_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace burstlab::cudnn_plugin {
namespace {

__device__ int64_t at4(const burstlab_view4& v, int64_t b, int64_t h, int64_t n, int64_t k) {
  return b * v.stride[0] + h * v.stride[1] + n * v.stride[2] + k * v.stride[3];
}

// One warp per row (b, h, n): s = sum_k dO_k^2 (fp32), c = D / s, O'_k = c dO_k rounded to T,
// so that sum_k dO_k O'_k = D up to one rounding of each O'_k (|D| <= |dO| |O|, so |O'| <= |O|).
template <class T>
__global__ void surrogate_kernel(burstlab_view4 dO, burstlab_view3 D, burstlab_view4 O, int64_t rows) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t N = dO.dim[2], H = dO.dim[1], d = dO.dim[3];
  const int64_t n = row % N, h = (row / N) % H, b = row / (N * H);
  const T* g = static_cast<const T*>(dO.data);
  float s = 0.f;
  for (int64_t k = lane; k < d; k += 32) {
    const float x = float(g[at4(dO, b, h, n, k)]);
    s += x * x;
  }
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float Dv = static_cast<const float*>(D.data)[b * D.stride[0] + h * D.stride[1] + n * D.stride[2]];
  const float c = s > 0.f ? Dv / s : 0.f;
  T* out = static_cast<T*>(O.data);
  for (int64_t k = lane; k < d; k += 32) out[at4(O, b, h, n, k)] = T(c * float(g[at4(dO, b, h, n, k)]));
}

template <class T>
__global__ void accumulate_kernel(burstlab_view4 acc, burstlab_view4 in, int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t d = in.dim[3], N = in.dim[2], H = in.dim[1];
  const int64_t k = i % d, n = (i / d) % N, h = (i / (d * N)) % H, b = i / (d * N * H);
  static_cast<float*>(acc.data)[at4(acc, b, h, n, k)] += float(static_cast<const T*>(in.data)[at4(in, b, h, n, k)]);
}

// One thread per element of O; the first of each row (k = 0) also copies the row's LSE.
template <class T>
__global__ void copy_rows_kernel(burstlab_view4 O, burstlab_view4 Op, burstlab_view3 L, burstlab_view3 Lp,
                                 int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t d = O.dim[3], N = O.dim[2], H = O.dim[1];
  const int64_t k = i % d, n = (i / d) % N, h = (i / (d * N)) % H, b = i / (d * N * H);
  static_cast<T*>(O.data)[at4(O, b, h, n, k)] = static_cast<const T*>(Op.data)[at4(Op, b, h, n, k)];
  if (k == 0)
    static_cast<float*>(L.data)[b * L.stride[0] + h * L.stride[1] + n * L.stride[2]] =
        static_cast<const float*>(Lp.data)[b * Lp.stride[0] + h * Lp.stride[1] + n * Lp.stride[2]];
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

void surrogate_O(burstlab_dtype t, const burstlab_view4& dO, const burstlab_view3& D, const burstlab_view4& O,
                 cudaStream_t s) {
  const int64_t rows = dO.dim[0] * dO.dim[1] * dO.dim[2];
  if (rows == 0) return;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((rows * 32 + threads - 1) / threads);
  if (t == BURSTLAB_BF16) surrogate_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(dO, D, O, rows);
  else surrogate_kernel<__half><<<blocks, threads, 0, s>>>(dO, D, O, rows);
  check(cudaGetLastError(), "surrogate_O launch");
}

void copy_rows(burstlab_dtype t, const burstlab_view4& O, const burstlab_view4& O_packed, const burstlab_view3& LSE,
               const burstlab_view3& LSE_packed, cudaStream_t s) {
  const int64_t total = O.dim[0] * O.dim[1] * O.dim[2] * O.dim[3];
  if (total == 0) return;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((total + threads - 1) / threads);
  if (t == BURSTLAB_BF16) copy_rows_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(O, O_packed, LSE, LSE_packed, total);
  else copy_rows_kernel<__half><<<blocks, threads, 0, s>>>(O, O_packed, LSE, LSE_packed, total);
  check(cudaGetLastError(), "copy_rows launch");
}

void accumulate(burstlab_dtype t, const burstlab_view4& acc, const burstlab_view4& in, cudaStream_t s) {
  const int64_t total = in.dim[0] * in.dim[1] * in.dim[2] * in.dim[3];
  if (total == 0) return;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((total + threads - 1) / threads);
  if (t == BURSTLAB_BF16) accumulate_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(acc, in, total);
  else accumulate_kernel<__half><<<blocks, threads, 0, s>>>(acc, in, total);
  check(cudaGetLastError(), "accumulate launch");
}

}  // namespace burstlab::cudnn_plugin
