// cuda/cuda_lmhead.hpp — the fused LM head + cross-entropy on an NVIDIA GPU (spec §10), over
// DEVICE memory: H, W, y, LSE, dH, dW are device pointers. bf16/fp16 storage, fp32 accumulation
// on tensor cores (mma.sync m16n8k16, cuda/lmhead_v1.cu). Rows are processed in chunks of
// `chunk_rows`: the chunk's logits (chunk_rows x V, fp32) are computed once, their log-sum-exp,
// losses and dz follow in one row pass, and dH = dz W, dW += dz^T H are two more tensor-core
// products (BurstEngine Algorithm 3 with a chunk of rows as the tile: no recomputation in the
// fused call). Memory beyond the arguments: lmhead_workspace_bytes. Never N x V.
// Every entry point validates on the host (burstlab::Error naming the field and value; labels are
// checked on the device, the first bad one named); CUDA errors throw CudaError.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "burstlab/lmhead.hpp"
#include "cuda.hpp"

namespace burstlab::cuda {

struct LmHeadOptions {
  int64_t chunk_rows = 0;  // rows of H per chunk; 0: as many as keep the chunk buffers near 1 GiB
  cudaStream_t stream = nullptr;
};

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

// The rows per chunk a call uses, and the device bytes it allocates (all live at once: the
// chunk's fp32 logits, its dz in T, the per-row losses, an fp32 dW accumulator for the backward).
int64_t lmhead_chunk_rows(const LmHeadProblem& p, const LmHeadOptions& opt);
int64_t lmhead_workspace_bytes(const LmHeadProblem& p, bool backward, const LmHeadOptions& opt);

}  // namespace burstlab::cuda
