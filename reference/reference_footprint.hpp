// reference/reference_footprint.hpp — the host memory this layer allocates (burstlab/footprint.hpp's
// words): the naive kernels' per-thread S and P, the fp64 oracle of run_oracle with its §9
// bounds, the row-sampled oracle (rows.hpp) and the LM head's oracle (lmhead_check.hpp). Each
// formula cites the allocations it mirrors; tests/tools/test_resources.cpp holds them against
// measured heap peaks.
#pragma once

#include <cstdint>
#include <vector>

#include "burstlab/footprint.hpp"
#include "burstlab/lmhead.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"

namespace burstlab::reference {

// OpenMP threads a region of `items` work items runs on: min(threads, items), or 1 when the
// layer keeps it serial (reference.cpp and tolerance.cpp: worth_threads).
int64_t region_threads(const Problem& p, int64_t items, int threads);

// reference::forward<T> / backward<T> (reference.cpp) on `threads` OpenMP threads, beyond their
// arguments: per (b, h) or (b, kv-head) and thread the materialized S/P (and dS), the compiled
// mask and Eigen's GEMM packing.
MemPart forward_workspace(const Problem& p, Dtype dtype, int threads);
MemPart backward_workspace(const Problem& p, Dtype dtype, int threads);
std::vector<MemPart> call_overhead(const Problem& p, Dtype dtype, int threads);  // mask, packing, small

// run_oracle (harness.cpp): what it returns and keeps for the comparisons (O, LSE and dQ, dK, dV
// in fp64 with their §9 bounds), and its peak: reference<double>, then forward_bounds and
// backward_bounds (tolerance.cpp), each with its per-thread N_q x N_k workspace.
std::vector<MemPart> oracle_kept(const Problem& p, bool backward);
MemNeed oracle_need(const Problem& p, bool backward, int threads);
// forward_bounds / backward_bounds alone (check_candidate): their outputs and workspaces.
std::vector<MemPart> forward_bounds_parts(const Problem& p, int threads);
std::vector<MemPart> backward_bounds_parts(const Problem& p, int threads);

// The row-sampled oracle (rows.cpp, spec §9.11) on K rows and K columns: no N_q x N_k buffer; the
// mask's row and key visibility, D of the run for the sampled columns' q-heads, a row's logits
// per thread, and what it keeps (K rows and columns with their bounds).
std::vector<MemPart> sampled_oracle_kept(const Problem& p, int64_t K, bool backward);
MemNeed sampled_oracle_need(const Problem& p, int64_t K, bool backward, int threads);

// The LM head (spec §10). lmhead_forward<T> / lmhead_backward<T> (reference_lmhead.cpp): the
// N x V logits and Eigen's dH, dW temporaries in T. The oracle (lmhead_check.cpp): the fp64
// inputs, reference<double>'s logits and the outputs with their §10.8 bounds; the bounds alone
// hold (256 x V) chunks and V x d sums.
std::vector<MemPart> lmhead_workspace(const LmHeadProblem& p, Dtype dtype);
MemNeed lmhead_oracle_need(const LmHeadProblem& p, bool backward);
MemNeed lmhead_bounds_need(const LmHeadProblem& p, bool backward);

}  // namespace burstlab::reference
