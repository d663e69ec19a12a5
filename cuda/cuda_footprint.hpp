// cuda/cuda_footprint.hpp — the device memory of this layer's calls (burstlab/footprint.hpp's words;
// every part is marked device). Host C++ without CUDA headers, built with the variant table
// (burstlab_cuda_variants), so the tool and its tests estimate a run without a GPU. Each formula
// cites the allocation in api.cu it mirrors; the LM head's is lmhead_workspace_bytes
// (cuda_lmhead.hpp).
#pragma once

#include <vector>

#include "burstlab/footprint.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "variants.hpp"

namespace burstlab::cuda {

// The Call (variants.hpp) of a whole forward or backward on contiguous device tensors (no view
// rule to ask): what decides which rows may run it.
Call whole_call(const Problem& p, Dtype dtype, Pass pass, bool deterministic);
// The tensors a whole forward (backward) call reads and writes, on the device: Q, K, V, O (and
// dO, dQ, dK, dV) in the storage dtype, LSE (B, H_q, N_q) in the accumulator type (lse_t).
std::vector<MemPart> call_arguments(const Problem& p, Dtype dtype, bool backward);
// What forward() and backward() (api.cu) allocate beyond their arguments when variant v runs the
// call (Auto: the most over the rows of the table that support it): the mask on the device
// (DeviceMask); for the backward D (B, H_q, N_q) in the accumulator type, and the fp32 dQ
// accumulator of v4's one-pass mode, v5 and v6 (v4_dq_acc_floats: B H_q d per 64-row tile).
std::vector<MemPart> forward_workspace(const Problem& p, Dtype dtype, Variant v);
std::vector<MemPart> backward_workspace(const Problem& p, Dtype dtype, Variant v, bool deterministic);
// One engine backward_block over n_q rows (cuda_engine.cu -> api.cu): v4's fp32 dQ accumulator
// when it runs one pass; the fallback row v1 allocates nothing. Bytes.
int64_t block_call_bytes(const Problem& p, int64_t n_q, Dtype dtype, Variant v, bool deterministic);

}  // namespace burstlab::cuda
