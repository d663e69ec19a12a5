// cpu/cpu_footprint.hpp — the host memory this layer allocates (burstlab/footprint.hpp's words): the
// Scratch of tiles every OpenMP thread of a call makes (cpu.cpp), the mask Plan, D of the
// backward, and Eigen's GEMM packing of the tile products. The LM head's workspace is
// lmhead_workspace_bytes (cpu_lmhead.hpp). tests/tools/test_resources.cpp holds these against
// measured heap peaks.
#pragma once

#include <vector>

#include "burstlab/footprint.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "cpu.hpp"  // Tiles

namespace burstlab::cpu {

// forward<T> / backward<T> on `threads` OpenMP threads, beyond their arguments: every thread's
// Scratch at tiles (clamped to N_q, N_k), the mask plan and compiled mask (the backward: and D,
// (B, H_q, N_q) in T). Eigen's packing of the Br x Bc x d tile products per thread comes apart
// (packing), as it is live through both.
MemPart forward_workspace(const Problem& p, Dtype dtype, Tiles tiles, int threads);
MemPart backward_workspace(const Problem& p, Dtype dtype, Tiles tiles, int threads);
MemPart packing(const Problem& p, Dtype dtype, Tiles tiles, int threads);
// One engine call (forward_block, backward_block: cpu_engine.cpp) on one thread of `threads`:
// its Scratch and packing, bytes per calling thread.
int64_t block_call_bytes(const Problem& p, Dtype dtype, Tiles tiles, int threads);

}  // namespace burstlab::cpu
