// distributed/attention2d.hpp — Attention2D, non-overlapped (Attention2D-NO; spec §7.11).
// P = p_r x p_c ranks as a grid, rank p = i + j p_r is (row i, column j) (column-major). Inputs
// arrive cyclically (the striped partition: rank p holds tokens = p mod P). Forward:
//   1. transpose K, V to the row-major cyclic distribution: rank (i, j) gets the tokens
//      = i p_c + j mod P (point to point);
//   2. all-gather Q within grid row i  -> queries = i mod p_r;
//      all-gather K, V within column j -> keys    = j mod p_c;
//   3. one forward_block (§6.1): every (query, key) pair lies on exactly one rank;
//   4. reduce-scatter the partial (O, LSE) within the row, the merge (4.5) as the reduction,
//      in member order j = 0, 1, ... (bitwise reproducible): rank p ends with its own queries.
// Backward: D at home (5.1); transpose K, V; gather Q, dO, LSE, D in rows and K, V in columns;
// one backward_block (§6.2); reduce-scatter (sum) dQ in rows and dK, dV in columns; transpose
// dK, dV back. Any p_r x p_c (square, rectangular, P prime as 1 x P); causal and every other
// mask work through global positions.
#pragma once

#include <cstdint>
#include <string>

#include "burstlab/engine.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"

namespace burstlab::dist {

struct Grid {
  int p_r = 1, p_c = 1;
  int size() const { return p_r * p_c; }
  int row(int p) const { return p % p_r; }
  int col(int p) const { return p / p_r; }
  int rank(int i, int j) const { return i + j * p_r; }
  int row_major(int p) const { return row(p) * p_c + col(p); }  // the K, V shard rank p holds after the transpose
};
// Throws Error unless p_r, p_c >= 1, p_r p_c == G and the partitions are striped (cyclic).
void check_attention2d(const Grid& g, int G, const Partition& qp, const Partition& kp);
// The most square grid: p_r = the largest divisor of G with p_r <= sqrt(G).
Grid default_grid(int G);
Grid parse_grid(const std::string& s);  // "RxC"

// One pass of Attention2D-NO, or (overlapped) of Attention2D-O (spec §7.13): the same result
// with ring collectives overlapped with compute. Phase A: K, V travel the column ring (each block kept: the column gather) while the rank
// computes its own queries against each arriving block; phase B: the row's query blocks travel
// the row ring (double-buffered) while each rank computes them against its gathered K, V, and
// their partial (O, LSE) (backward: dQ) accumulate along the same ring until they reach their
// owner (a ring reduce-scatter, the merge in ring order); backward phase C reduce-scatters
// dK, dV in the column and transposes them back, as the non-overlapped variant.
template <class T>
void run_attention2d(bool overlapped, Phase phase, Communicator& comm, Engine<T>& engine, const Problem& p,
                     const PreparedMask& mask, const Grid& g, const Partition& qp, const Partition& kp,
                     Shard<T>& shard);

// Closed form (spec eq. 7.22-7.23; overlapped: 7.26): bytes rank r sends or receives in one phase.
int64_t attention2d_bytes(Phase phase, const Problem& p, const Grid& g, const Partition& qp, const Partition& kp,
                          int r, bool sent, ElemBytes elem_bytes, bool overlapped = false);

}  // namespace burstlab::dist
