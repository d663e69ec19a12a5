// burstlab/block_split.hpp — one block of attention (spec §6.1) over positions that form a few
// arithmetic progressions, as blocks over contiguous positions merged in place (eq. 4.5); its
// backward as the sum of theirs (§6.2).
//
// Kernels skip invisible tiles, and drop the per-element predicate inside full ones, only when
// the key positions are contiguous; a block whose keys are indexed runs every tile through the
// predicate. The blocks that the schedules build from zigzag and striped partitions (gathered
// shards, grid rows and columns) are a few progressions each side: stride 1 runs (zigzag,
// contiguous) or stride-G progressions (striped). A pair of stride-1 runs is a block over
// contiguous global positions under the block's own mask. A pair of progressions of one stride
// s > 1 under a band (eq. 3.4) is a band again in LOCAL indices, i -> a + s i, j -> c + s j:
//   key j visible from row i  <=>  max(0, i + L) <= j < min(n_k, i + R),
//   L = ceil((a + off - left - c) / s),  R = ceil((a + off + right + 1 - c) / s),  off = N_k - N_q,
// which `BlockPart` states as a problem of its own (N_q', N_k', band edges) over positions 0..n.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

// Local rows [at, at + n) of positions p, and of a (B, H, N, d) or (B, H, N) view along N (same
// strides, no copy).
inline Positions slice_positions(Positions p, int64_t at, int64_t n) {
  return p.index ? Positions{0, n, p.index + at} : contiguous(p.start + at, n);
}
template <class T>
View4<T> slice_rows(View4<T> v, int64_t at, int64_t n) {
  v.data += at * v.stride[2];
  v.dim[2] = n;
  return v;
}
template <class T>
View3<T> slice_rows(View3<T> v, int64_t at, int64_t n) {
  v.data += at * v.stride[2];
  v.dim[2] = n;
  return v;
}

// A maximal arithmetic progression of positions in storage order: local rows [at, at + n) hold
// positions pos + stride * r (stride 1 for a lone position).
struct Progression {
  int64_t at = 0, pos = 0, stride = 1, n = 0;
};
std::vector<Progression> progressions(Positions p);

// Rows [q_at, q_at + q_n) by keys [k_at, k_at + k_n) of the block.
struct BlockPart {
  int64_t q_at = 0, q_n = 0, k_at = 0, k_n = 0;
  bool hidden = false;  // no visible pair: nothing to add (a local one's mask then hides every pair)
  bool local = false;   // mask is a band over local positions (a problem of mask.N_q x mask.N_k); else
                        // the block's own mask over global positions
  MaskParams mask;
  Positions q_pos, k_pos;  // contiguous
};

// The parts of the block (q, k) under mask m, ordered by query progression, then key
// progression; empty when the block does not split: a side with more than kMaxProgressions or
// fewer than kMinRows rows per progression on average (not worth a launch each), strides that
// differ, or stride > 1 with a document or block-sparse mask (not a band in local indices).
constexpr size_t kMaxProgressions = 32;
constexpr int64_t kMinRows = 128;
// Those two limits. The built-in engines run indexed positions themselves, so a block splits for
// them only into a few long progressions; an engine that runs contiguous positions only (an
// engine plug-in such as cuDNN's) splits at any size: kAnySplit.
struct SplitLimits {
  size_t max_progressions = kMaxProgressions;
  int64_t min_rows = kMinRows;
};
constexpr SplitLimits kAnySplit{SIZE_MAX, 1};
std::vector<BlockPart> split_block(const MaskParams& m, Positions q, Positions k, SplitLimits limits = {});

// The problem a part runs as: p itself for a global part; for a local part, p with N_q, N_k and
// the band of part.mask (validate() accepts it).
Problem part_problem(const Problem& p, const BlockPart& part);

// A forward block (§6.1) by its parts, when it splits: run(pp, mask, q_pos, k_pos, Q, K, V, O,
// LSE, accumulate) computes the part's rows of Q, O, LSE (slices along N) against its keys of K,
// V as the problem pp, merging into the rows' (O, LSE) when accumulate (eq. 4.5). Each query
// progression's visible parts run in order, the first with the caller's accumulate; one with none
// visible and nothing to accumulate into runs once over its first (hidden) part, over contiguous
// positions like every part, which gives its rows the identity (O = 0, LSE = -inf). Returns
// false, having run nothing, when the block does not split.
template <class T, class A, class Run>
bool forward_parts(const Problem& p, const MaskParams& m, Positions q, Positions k, View4<const T> Q,
                   View4<const T> K, View4<const T> V, View4<T> O, View3<A> LSE, bool accumulate, Run&& run,
                   SplitLimits limits = {}) {
  const std::vector<BlockPart> parts = split_block(m, q, k, limits);
  const auto go = [&](const Problem& pp, const MaskParams& mm, Positions qp, Positions kp, const BlockPart& b,
                      bool acc) {
    run(pp, mm, qp, kp, slice_rows(Q, b.q_at, b.q_n), slice_rows(K, b.k_at, b.k_n), slice_rows(V, b.k_at, b.k_n),
        slice_rows(O, b.q_at, b.q_n), slice_rows(LSE, b.q_at, b.q_n), acc);
  };
  for (size_t first = 0; first < parts.size();) {
    size_t end = first;
    while (end < parts.size() && parts[end].q_at == parts[first].q_at) ++end;
    bool acc = accumulate;
    for (size_t x = first; x < end; ++x) {
      const BlockPart& b = parts[x];
      if (b.hidden) continue;
      go(part_problem(p, b), b.mask, b.q_pos, b.k_pos, b, acc);
      acc = true;
    }
    const BlockPart& a = parts[first];  // hidden: the engine writes the identity over its positions
    if (!acc) go(part_problem(p, a), a.mask, a.q_pos, a.k_pos, a, false);
    first = end;
  }
  return !parts.empty();
}

// A backward block (§6.2) by its parts, when it splits: run(pp, mask, q_pos, k_pos, Q, K, V, dO,
// LSE, D, dQ, dK, dV) adds the part's terms to its query rows of dQ and its key rows of dK, dV
// (slices along N) given the rows' LSE and D. The gradients are sums over (i, j) pairs (eq. 5.3-
// 5.6), so the visible parts add up to the block's; hidden parts add nothing. Returns false,
// having run nothing, when the block does not split.
template <class T, class A, class Run>
bool backward_parts(const Problem& p, const MaskParams& m, Positions q, Positions k, View4<const T> Q,
                    View4<const T> K, View4<const T> V, View4<const T> dO, View3<const A> LSE, View3<const A> D,
                    View4<A> dQ, View4<A> dK, View4<A> dV, Run&& run, SplitLimits limits = {}) {
  const std::vector<BlockPart> parts = split_block(m, q, k, limits);
  for (const BlockPart& b : parts) {
    if (b.hidden) continue;
    run(part_problem(p, b), b.mask, b.q_pos, b.k_pos, slice_rows(Q, b.q_at, b.q_n), slice_rows(K, b.k_at, b.k_n),
        slice_rows(V, b.k_at, b.k_n), slice_rows(dO, b.q_at, b.q_n), slice_rows(LSE, b.q_at, b.q_n),
        slice_rows(D, b.q_at, b.q_n), slice_rows(dQ, b.q_at, b.q_n), slice_rows(dK, b.k_at, b.k_n),
        slice_rows(dV, b.k_at, b.k_n));
  }
  return !parts.empty();
}

}  // namespace burstlab
