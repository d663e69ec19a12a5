// layer/layer.hpp — one transformer layer (attention + MLP, spec §11.1) and where its backward
// finds the activations it needs: kept from the forward, or recomputed (§11.2). Four placements:
//   none      everything the backward reads is kept
//   layer     only the layer's input x (gradient checkpointing at the layer boundary, HF style):
//             the backward reruns the whole forward, the attention forward included
//   remat     x and the attention's output A, LSE (DistFlashAttn §3.3, rematerialization-aware):
//             the backward reruns the projections and the MLP, never the attention forward
//   sequence  x and A, LSE of the kept query segments (BurstEngine §3.2, sequence-level selective):
//             the backward reruns the attention forward of the other segments' rows only
// Gradients are bitwise equal under every placement (§11.2): a recomputed tensor is the same
// function of the same inputs, computed the same way (see layer.cpp on determinism).
//
// The attention inside is any implementation with the AttentionOps signature: cpu/ (tiled),
// reference/ (naive, the fp64 oracle) or, in tools/, a distributed session on SimComm.
// Activations are row-major with one row per token (b, i): x, h, y (B, N, D); u, g (B, N, F);
// Q, A (B, N, H_q d), K, V (B, N, H_kv d), i.e. the BSHD layout of §1.2; LSE (B, H_q, N).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "cpu.hpp"

namespace burstlab::layer {

struct Shape {
  Problem p;      // the attention: B, H_q, H_kv, N_q = N_k = N, d, scale, mask
  int64_t D = 1;  // model width: x, h, y (B, N, D)
  int64_t F = 1;  // MLP width: u, g (B, N, F)
};
// validate(p), then N_k == N_q, D >= 1, F >= 1; throws Error naming the field and its value.
void validate(const Shape& s);
inline int64_t tokens(const Shape& s) { return s.p.B * s.p.N_q; }  // rows of every activation

template <class T>
struct Weights {
  std::vector<T> Wq;  // (D, H_q d)
  std::vector<T> Wk;  // (D, H_kv d)
  std::vector<T> Wv;  // (D, H_kv d)
  std::vector<T> Wo;  // (H_q d, D)
  std::vector<T> W1;  // (D, F)
  std::vector<T> W2;  // (F, D)
};
// Sizes against the shape: "Wo has 12 elements; (H_q d, D) = (8, 4) needs 32".
template <class T>
void validate_weights(const Shape& s, const Weights<T>& w);
// Seeded N(0, 1 / fan_in) weights, generated in double and rounded to T (so a float and a double
// layer of one seed hold the same values up to that rounding).
template <class T>
Weights<T> make_weights(const Shape& s, uint64_t seed);
// Seeded N(0, 1) values (an input x or an output gradient dy), generated as make_weights does.
template <class T>
std::vector<T> make_values(int64_t n, uint64_t seed);

enum class Placement { None, Layer, Remat, Sequence };
std::string to_string(Placement x);                 // "none", "layer", "remat", "sequence"
Placement parse_placement(const std::string& s);    // throws Error naming "placement"

struct Checkpointing {
  Placement placement = Placement::None;
  // sequence only: the query rows split into segments [bounds[k], bounds[k + 1]) with
  // bounds[0] = 0 and bounds.back() = N; keep[k] = 1: segment k's A and LSE are kept,
  // 0: they are recomputed in the backward (§11.3).
  std::vector<int64_t> bounds;
  std::vector<uint8_t> keep;
};
// The attention forward of segments [a, b) must replay the forward's own rows: a and b multiples
// of min(row_quantum, N), or b = N (layer.cpp). Throws Error naming the field and its value.
void validate(const Shape& s, const Checkpointing& c, int64_t row_quantum);

// §11.3: the segments [bounds[k], bounds[k + 1]), the costliest to recompute (most visible pairs,
// eq. 8.1; later segment first on ties) kept while at most keep_rows rows are kept.
Checkpointing sequence_checkpointing(const Problem& p, const std::vector<int64_t>& bounds, int64_t keep_rows);
// [0, rows, 2 rows, ..., N]: segments of `rows` rows, the last one shorter.
std::vector<int64_t> segment_bounds(int64_t N, int64_t rows);
// Visible (i, j) pairs of the query rows [a, b) against every key, per (b, h) (§11.3's cost).
int64_t rows_pairs(const Problem& p, int64_t a, int64_t b);

// The attention a layer calls. Views as in §1.2 (the layer passes BSHD views of its activations).
template <class T>
struct AttentionOps {
  std::string name;
  // eq. (2.1)-(2.4): Q (B, H_q, N, d); K, V (B, H_kv, N, d) -> O (B, H_q, N, d), LSE (B, H_q, N).
  std::function<void(const Problem&, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                     View3<T> LSE)>
      forward;
  // The query rows [rows.start, rows.start + rows.n) against every key (§6.1): Q, O
  // (B, H_q, rows.n, d), LSE (B, H_q, rows.n). Empty when the implementation has none.
  std::function<void(const Problem&, Positions rows, View4<const T> Q, View4<const T> K, View4<const T> V,
                     View4<T> O, View3<T> LSE)>
      forward_rows;
  // forward_rows over [a, b) equals rows [a, b) of forward bitwise when a and b are multiples of
  // min(row_quantum, N) or b = N.
  int64_t row_quantum = 1;
  // eq. (5.1)-(5.7), outputs overwritten: dQ (B, H_q, N, d), dK, dV (B, H_kv, N, d).
  std::function<void(const Problem&, View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> O,
                     View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK, View4<T> dV)>
      backward;
};
// cpu/ (tiled; forward_rows = forward_block over the rows, row_quantum = tiles.Br).
template <class T>
AttentionOps<T> cpu_attention(cpu::Tiles tiles = {});
// reference/ (naive; no forward_rows: the sequence placement needs a block forward).
template <class T>
AttentionOps<T> reference_attention();

// What one forward + backward did (§11.2's columns).
struct Counters {
  int64_t attention_forwards = 0;   // whole-sequence attention forwards
  int64_t row_forwards = 0;         // attention forwards of a subset of the query rows
  int64_t forward_rows = 0;         // query rows those forwards computed, per (b, h)
  int64_t forward_pairs = 0;        // visible (i, j) pairs those forwards computed, per (b, h)
  int64_t attention_backwards = 0;
  int64_t saved_bytes = 0;          // activations kept from the forward for the backward
};

// What the forward keeps for the backward (§11.2); empty vectors are not kept.
template <class T>
struct Saved {
  Checkpointing ckpt;
  std::vector<T> x;        // (B, N, D)
  std::vector<T> Q, K, V;  // (B, N, H_q d), (B, N, H_kv d), (B, N, H_kv d)           none
  std::vector<T> A;        // (B, N, H_q d); sequence: (B, n_keep, H_q d), kept rows in order
  std::vector<T> LSE;      // (B, H_q, N);   sequence: (B, H_q, n_keep)
  std::vector<T> h, u, g;  // (B, N, D), (B, N, F), (B, N, F)                            none
  int64_t bytes() const;
};

template <class T>
struct Grads {
  std::vector<T> dx;                        // (B, N, D)
  std::vector<T> dWq, dWk, dWv, dWo, dW1, dW2;  // shaped as the weights
};

// eq. (11.1)-(11.5): y (B, N, D) from x (B, N, D); keeps in `saved` what `ckpt` says.
template <class T>
std::vector<T> forward(const Shape& s, const Weights<T>& w, const std::vector<T>& x, const Checkpointing& ckpt,
                       const AttentionOps<T>& attn, Saved<T>& saved, Counters& count);
// eq. (11.6)-(11.9) from dy (B, N, D), recomputing what saved.ckpt did not keep.
template <class T>
Grads<T> backward(const Shape& s, const Weights<T>& w, const Saved<T>& saved, const std::vector<T>& dy,
                  const AttentionOps<T>& attn, Counters& count);

// Bytes the forward keeps under a placement (eq. 11.10), elements of `elem_bytes` bytes;
// n_keep: the kept rows of the sequence placement.
int64_t saved_bytes(const Shape& s, Placement placement, int64_t n_keep, int64_t elem_bytes);

}  // namespace burstlab::layer
