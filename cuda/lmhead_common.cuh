// cuda/lmhead_common.cuh — what the LM head variants (lmhead_v1.cu, lmhead_v2.cu; spec §10) share:
// stream-ordered scratch, the label check on the device, the scaling of dz, the row reductions and
// the loss sum. Kernels here are `static`: each variant's translation unit has its own copy.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "burstlab/error.hpp"
#include "cuda_lmhead.hpp"
#include "detail.cuh"

namespace burstlab::cuda::detail::lmhead {

constexpr int kRowThreads = 256;

enum class Mode { Forward, Backward, Fused };

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Stream-ordered device scratch, freed in stream order.
template <class U>
struct Scratch {
  U* p = nullptr;
  cudaStream_t s = nullptr;
  Scratch(size_t n, cudaStream_t st) : s(st) {
    if (n) BURSTLAB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p), n * sizeof(U), s));
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (p) cudaFreeAsync(p, s);  // no throw from a destructor path
  }
};

// Sum or max over the CTA, the same fixed order in every thread; red: one float per warp.
__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kRowThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();  // red is written again by the next reduction
  return r;
}

// Counts the rows that count and finds the first label outside [0, V) (its index, else ~0).
static __global__ void labels_kernel(const int64_t* y, int64_t N, int64_t V, int64_t ignore_index,
                                     unsigned long long* counted, unsigned long long* first_bad) {
  unsigned long long n = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = y[i];
    if (v == ignore_index) continue;
    if (v < 0 || v >= V) atomicMin(first_bad, static_cast<unsigned long long>(i));
    else ++n;
  }
  if (n) atomicAdd(counted, n);
}

// sum_i loss_rows[i] by one CTA, a fixed order: thread t sums rows t, t + 1024, ... in order.
static __global__ void __launch_bounds__(1024) loss_sum_kernel(const float* rows, int64_t N, float* sum) {
  __shared__ float part[1024];
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < N; i += 1024) s += rows[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = 512; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *sum = part[0];
}

template <class T>
void validate_call(const LmHeadProblem& p, const View2<const T>& H, const View2<const T>& W, const int64_t* y,
                   const float* LSE, const char* lse_name) {
  validate(p);
  validate_view2("H", H.dim, H.data, p.N, "N", p.d, "d");
  validate_view2("W", W.dim, W.data, p.V, "V", p.d, "d");
  if (!y) fail("y (null) must point to N (", p.N, ") labels on the device");
  if (!LSE) fail(lse_name, " (null) must point to N (", p.N, ") floats on the device");
  const std::string why = lmhead_unsupported<T>(p, H, W);
  if (!why.empty()) fail(why);
}

// The weights of a call, once the labels are checked: w of eq. (10.4) and dz's scale. dz is
// stored as dz 2^-e with c 2^-e = g w 2^-e in [0.5, 1): with c = 1/n_R its entries would otherwise
// sit near 1/n_R, below fp16's normal range at a few thousand rows, where rounding to T loses the
// relative precision u_P that (10.19) assumes. The products that read dz multiply by `undo` = 2^e.
struct Weights {
  int64_t n_R = 0;
  double w = 0;
  float c = 0, undo = 1;
};

// Every label valid (else an Error naming the first bad one), n_R, w and the scaled c.
inline Weights check_labels(const LmHeadProblem& p, const int64_t* y, double g, cudaStream_t s) {
  Scratch<unsigned long long> cnt(2, s);
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(cnt.p, 0, sizeof(unsigned long long), s));
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(cnt.p + 1, 0xff, sizeof(unsigned long long), s));
  const int lgrid = static_cast<int>(std::min<int64_t>((p.N + 255) / 256, 1024));
  labels_kernel<<<lgrid, 256, 0, s>>>(y, p.N, p.V, p.ignore_index, cnt.p, cnt.p + 1);
  BURSTLAB_CUDA_LAUNCH_CHECK("lmhead labels_kernel");
  unsigned long long host_cnt[2];
  BURSTLAB_CUDA_CHECK(cudaMemcpyAsync(host_cnt, cnt.p, sizeof host_cnt, cudaMemcpyDeviceToHost, s));
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  if (host_cnt[1] != ~0ull) {
    int64_t bad = 0;
    BURSTLAB_CUDA_CHECK(cudaMemcpy(&bad, y + host_cnt[1], sizeof bad, cudaMemcpyDeviceToHost));
    fail("y[", host_cnt[1], "] (", bad, ") must be in [0, V) = [0, ", p.V, ") or equal ignore_index (",
         p.ignore_index, ")");
  }
  Weights r;
  r.n_R = static_cast<int64_t>(host_cnt[0]);
  r.w = loss_weight(p, r.n_R);
  int e = 0;
  const double c = g * r.w;
  if (c != 0 && std::isfinite(c)) std::frexp(c, &e);
  r.c = static_cast<float>(std::ldexp(c, -e));
  r.undo = static_cast<float>(std::ldexp(1.0, e));
  return r;
}

// L = w sum_i l_i (eq. 10.4), in the accumulation type as cpu/; synchronizes the stream.
inline float loss_of(const float* loss_rows, int64_t N, double w, cudaStream_t s) {
  Scratch<float> sum(1, s);
  loss_sum_kernel<<<1, 1024, 0, s>>>(loss_rows, N, sum.p);
  BURSTLAB_CUDA_LAUNCH_CHECK("lmhead loss_sum_kernel");
  float total = 0.f;
  BURSTLAB_CUDA_CHECK(cudaMemcpyAsync(&total, sum.p, sizeof total, cudaMemcpyDeviceToHost, s));
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  return static_cast<float>(w) * total;
}

// What both variants' row kernels know of every row: the labels and the loss's constants
// (eq. 10.2-10.7); r0 is set per chunk.
struct RowFacts {
  const int64_t* y;            // (N) global labels
  int64_t r0, V, Vp, ignore_index;
  float smooth, keep, lam, c;  // eps / V, 1 - eps, lambda, the dz scale (Weights::c)
  bool eps_on;
  const float* LSE_in;         // given (separate backward), or null: computed here
  float* LSE_out;              // (N)
  float* loss_rows;            // (N): l_i, 0 on ignored rows
};
inline void set_row_facts(RowFacts& a, const LmHeadProblem& p, const int64_t* y, int64_t Vp, float c, bool partials,
                          const float* LSE_in, float* LSE_out, float* loss_rows) {
  a.y = y;
  a.V = p.V;
  a.Vp = Vp;
  a.ignore_index = p.ignore_index;
  a.smooth = static_cast<float>(p.label_smoothing / double(p.V));
  a.keep = static_cast<float>(1.0 - p.label_smoothing);
  a.lam = static_cast<float>(p.z_loss);
  a.c = c;
  a.eps_on = p.label_smoothing != 0;
  a.LSE_in = partials ? nullptr : LSE_in;
  a.LSE_out = LSE_out;
  a.loss_rows = loss_rows;
}

// A row kernel's row (one CTA per row of the chunk): its index in the chunk, its global index,
// its label, and whether it counts (not ignore_index).
struct Row {
  int64_t i, gi, yi;
  bool counted;
};
__device__ __forceinline__ Row row_of(const RowFacts& a) {
  const int64_t i = blockIdx.x, gi = a.r0 + i, yi = a.y[gi];
  return {i, gi, yi, yi != a.ignore_index};
}
// Thread 0 writes the row's LSE and its loss term l_i (eq. 10.3-10.5; 0 on ignored rows) from L,
// the row's logits z and their sum zs.
__device__ __forceinline__ void store_row_stats(const RowFacts& a, const Row& r, float L, const float* z, float zs) {
  if (threadIdx.x != 0) return;
  a.LSE_out[r.gi] = L;
  a.loss_rows[r.gi] = r.counted ? L - a.keep * z[r.yi] - a.smooth * zs + a.lam * L * L : 0.f;
}

// dW (V, d) in T from its fp32 accumulator acc (V, d), on stream s.
template <class T>
static __global__ void store_dw_kernel(const float* acc, int64_t V, int64_t d, View2<T> dW) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < V * d; e += int64_t(gridDim.x) * blockDim.x)
    dW(e / d, e % d) = Store<T>::from(acc[e]);
}
template <class T>
void store_dw(const float* acc, int64_t V, int64_t d, View2<T> dW, cudaStream_t s) {
  const int grid = static_cast<int>(std::min<int64_t>((V * d + 255) / 256, 65535));
  store_dw_kernel<T><<<grid, 256, 0, s>>>(acc, V, d, dW);
  BURSTLAB_CUDA_LAUNCH_CHECK("lmhead store_dw_kernel");
}

// The variants' chunk loops (lmhead_v1.cu; lmhead_v2.cu: v2, or v3 with in_place). Arguments
// validated by the caller; synchronize the stream before returning.
template <class T>
float run_v1(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g, Mode mode,
             const float* LSE_in, float* LSE_out, View2<T> dH, View2<T> dW, const LmHeadOptions& opt);
template <class T>
float run_v2(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g, Mode mode,
             const float* LSE_in, float* LSE_out, View2<T> dH, View2<T> dW, const LmHeadOptions& opt, bool in_place);
extern const int64_t kCublasWorkspace;

}  // namespace burstlab::cuda::detail::lmhead
