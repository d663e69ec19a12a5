// burstlab/mask.hpp — masks as predicates on GLOBAL positions (spec §3).
// A mask is the conjunction of up to three parts, each optional:
//   band      (§3.1)  window (left, right) around the bottom-right aligned diagonal; causal = right 0
//   document  (§3.2)  segment ids; band is aligned per document (flash-attn varlen semantics)
//   block     (§3.3)  block-sparse mask over (block_q x block_k) tiles of global positions
// Band and document together make every row's visible keys ONE interval [lo, hi) (§3.4), so the
// device-friendly form, MaskParams, stores per-row document facts and the block bitmap only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/hd.hpp"

namespace burstlab {

// The user-facing description. Plain data; validate() (problem.hpp) checks it against a Problem.
struct MaskSpec {
  bool causal = false;          // same as window_right = 0 (combined with min)
  int64_t window_left = -1;     // keys allowed left of the diagonal; -1 = unbounded
  int64_t window_right = -1;    // keys allowed right of the diagonal; -1 = unbounded
  std::vector<int32_t> q_segment;  // (N_q) document id per query, non-decreasing; empty = none
  std::vector<int32_t> k_segment;  // (N_k) document id per key, non-decreasing; empty = none
  int64_t block_q = 0;             // block-sparse tile height; 0 = no block mask
  int64_t block_k = 0;             // block-sparse tile width
  std::vector<uint8_t> block_mask; // (ceil(N_q/block_q), ceil(N_k/block_k)) row-major, 1 = visible
};

// Effective band edges after `causal`: -1 = unbounded.
int64_t band_left(const MaskSpec& m);
int64_t band_right(const MaskSpec& m);
bool has_band(const MaskSpec& m);
bool has_document(const MaskSpec& m);
bool has_block(const MaskSpec& m);
bool is_full(const MaskSpec& m);  // no part: every (i, j) visible
// Short human name for tables: "none", "causal", "window(128,0)", "doc(3)", "block(64x64,50%)",
// parts joined with '+'.
std::string describe(const MaskSpec& m);

// Per-query document facts (§3.2, eq. 3.3): the query's index inside its document and the
// document's query count, and where the document's keys start and how many there are.
struct RowDoc {
  int64_t i_local;  // i - (first query of its document)
  int64_t n_q;      // queries in the document
  int64_t k_start;  // first key of the document (0 when n_k == 0)
  int64_t n_k;      // keys in the document (0: the row is empty)
};

// Device-usable mask: plain pointers, no ownership. Build with compile_mask().
struct MaskParams {
  int64_t N_q = 0, N_k = 0;
  int64_t left = -1, right = -1;  // band edges, -1 = unbounded
  const RowDoc* doc = nullptr;    // (N_q) or null when no document mask
  const uint8_t* block = nullptr; // (n_block_q, n_block_k) or null
  int64_t block_q = 1, block_k = 1, n_block_k = 0;
};

// Keys visible to query i under band and document (not block), as [*lo, *hi); eq. (3.4).
// Empty when *lo >= *hi.
BURSTLAB_HD void row_range(const MaskParams& m, int64_t i, int64_t* lo, int64_t* hi) {
  int64_t i_loc = i, n_q = m.N_q, k0 = 0, n_k = m.N_k;
  if (m.doc) {
    const RowDoc r = m.doc[i];
    i_loc = r.i_local; n_q = r.n_q; k0 = r.k_start; n_k = r.n_k;
  }
  const int64_t diag = i_loc + (n_k - n_q);  // bottom-right aligned diagonal, local key index
  int64_t a = 0, b = n_k;                    // local [a, b)
  if (m.left >= 0 && diag - m.left > a) a = diag - m.left;
  if (m.right >= 0 && diag + m.right + 1 < b) b = diag + m.right + 1;
  if (b < a) b = a;
  *lo = k0 + a;
  *hi = k0 + b;
}

// The mask predicate on global positions (eq. 3.5): visible(i, j) for 0 <= i < N_q, 0 <= j < N_k.
BURSTLAB_HD bool visible(const MaskParams& m, int64_t i, int64_t j) {
  int64_t lo, hi;
  row_range(m, i, &lo, &hi);
  if (j < lo || j >= hi) return false;
  if (m.block && !m.block[(i / m.block_q) * m.n_block_k + j / m.block_k]) return false;
  return true;
}

// Global positions of a block's rows (spec §6.1): contiguous [start, start + n) when index is
// null, else index[0..n). Distributed partitions (zigzag, striped) hand blocks of scattered
// global positions to the same local kernels; the mask is always evaluated on these.
struct Positions {
  int64_t start = 0;
  int64_t n = 0;
  const int64_t* index = nullptr;  // (n) or null
  BURSTLAB_HD int64_t operator[](int64_t k) const { return index ? index[k] : start + k; }
};
inline Positions contiguous(int64_t start, int64_t n) { return Positions{start, n, nullptr}; }

// Host owner of the arrays MaskParams points into. Copy `doc` and `block` to a device to use
// there (params_with() swaps the pointers).
struct MaskData {
  MaskParams base;              // pointers unset; use params()
  std::vector<RowDoc> doc;      // (N_q) or empty
  std::vector<uint8_t> block;   // (n_block_q * n_block_k) or empty
  MaskParams params() const {
    MaskParams p = base;
    p.doc = doc.empty() ? nullptr : doc.data();
    p.block = block.empty() ? nullptr : block.data();
    return p;
  }
  MaskParams params_with(const RowDoc* doc_ptr, const uint8_t* block_ptr) const {
    MaskParams p = base;
    p.doc = doc.empty() ? nullptr : doc_ptr;
    p.block = block.empty() ? nullptr : block_ptr;
    return p;
  }
};

// Visible (i, j) pairs in the rectangle [i0, i1) x [j0, j1); exact. O(rows * block columns).
int64_t count_visible(const MaskParams& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1);
// True when some (i, j) in the rectangle is visible; exact. Used to skip tiles and blocks.
bool any_visible(const MaskParams& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1);

}  // namespace burstlab
