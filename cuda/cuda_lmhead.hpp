// cuda/cuda_lmhead.hpp — the fused LM head + cross-entropy on an NVIDIA GPU (spec §10), over
// DEVICE memory: H, W, y, LSE, dH, dW are device pointers. bf16/fp16 storage, fp32 accumulation
// on tensor cores. Rows are processed in chunks of `chunk_rows`: the chunk's logits (chunk_rows x
// V, fp32) are computed once, their log-sum-exp, losses and dz follow in one row pass, and
// dH = dz W, dW += dz^T H are two more products (BurstEngine Algorithm 3 with a chunk of rows as
// the tile: no recomputation in the fused call). Never N x V. Numbered variants (cuda/README.md):
//   v1  own mma.sync product kernel, dz in its own buffer, dW summed in an fp32 (V, d) accumulator
//   v2  the three products by cuBLAS (the row pass reads each logit once for max and sum)
//   v3  v2 with dz written over its chunk's logits and dW summed in the storage type across chunks
//       (no fp32 accumulator: one rounding of dW per chunk, counted by lmhead_dW_roundings)
// Every entry point validates on the host (burstlab::Error naming the field and value; labels are
// checked on the device, the first bad one named); CUDA and cuBLAS errors throw CudaError.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "burstlab/lmhead.hpp"
#include "cuda.hpp"

namespace burstlab::cuda {

struct LmHeadOptions {
  int variant = 0;         // 1, 2, 3; 0: the first of 3, 2, 1 that supports the call
  int64_t chunk_rows = 0;  // rows of H per chunk; 0: the variant's default (lmhead_chunk_rows)
  cudaStream_t stream = nullptr;
};

// The variant a call with these outputs runs (dH, dW: empty views for a forward), or an Error
// naming `variant` when an explicit one cannot run them. v2, v3 write dH and dW through cuBLAS:
// unit column stride, row stride >= d.
template <class T>
int lmhead_variant(const LmHeadProblem& p, View2<T> dH, View2<T> dW, const LmHeadOptions& opt);

// Why this call cannot run here (empty when it can): storage type, d % 8, unit column stride,
// row strides multiple of 8 elements, 16-byte aligned H and W, V within the grid's limit.
template <class T>
std::string lmhead_unsupported(const LmHeadProblem& p, View2<const T> H, View2<const T> W);

// eq. (10.1)-(10.4). H (N, d), W (V, d), y (N) int64  ->  LSE (N) fp32; returns L (synchronizes).
template <class T>
float lmhead_forward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, float* LSE,
                     LmHeadOptions opt = {});
// eq. (10.5)-(10.9) from the forward's LSE: recomputes the logits. dH (N, d), dW (V, d) overwritten.
// Synchronizes the stream before returning.
template <class T>
void lmhead_backward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y,
                     const float* LSE, double g, View2<T> dH, View2<T> dW, LmHeadOptions opt = {});
// The fused call: L, LSE, dH, dW at once for the incoming gradient g; returns L.
template <class T>
float lmhead_fused(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g,
                   float* LSE, View2<T> dH, View2<T> dW, LmHeadOptions opt = {});

// For a variant (1, 2, 3; not 0): the rows per chunk a call uses (default: about 1 GiB of chunk
// buffers for v1, v2, 512 MiB for v3), the device bytes it allocates from the stream-ordered pool
// (all live at once: the chunk's fp32 logits, dz in T for v1, v2, the per-row losses, an fp32 dW
// accumulator for v1, v2's backward, cuBLAS's workspace for v2, v3), and how often a partial sum of
// dW is rounded to T (v3: once per chunk; the §10.8 bound of dW grows with it).
int64_t lmhead_chunk_rows(const LmHeadProblem& p, int variant, const LmHeadOptions& opt);
int64_t lmhead_workspace_bytes(const LmHeadProblem& p, int variant, bool backward, const LmHeadOptions& opt);
int64_t lmhead_dW_roundings(const LmHeadProblem& p, int variant, const LmHeadOptions& opt);

// The high-water mark of the current device's default stream-ordered pool (what cudaMallocAsync
// hands out, hence every workspace above): reset before a call, read after it, it is the call's
// measured peak of device workspace.
void reset_pool_peak();
int64_t pool_peak_bytes();

}  // namespace burstlab::cuda
