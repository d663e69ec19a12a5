// cpu/ — tiled online-softmax attention on a CPU: LAO (spec §4 forward, §5.3 backward).
// FlashAttention-2 style: never materializes more than a (Br x Bc) tile of S/P; forward carries
// running (m, l, O) per row; backward recomputes P from LSE with D precomputed. Any tile sizes
// Br, Bc >= 1. fp32 (accumulating in fp32) and fp64. OpenMP over (b, h, tile).
#pragma once

#include <cstdint>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab::cpu {

// Defaults measured on one AVX-512 core (fp32, N = 4096, d = 64 and 128): 128 x 128 keeps the
// (Br x Bc) tile of S/P (64 KiB fp32) in L2 and gives Eigen's GEMMs enough work per call; 64 x 64
// was 10-20% slower, 256 x 256 slower still (cpu/README.md).
struct Tiles {
  int64_t Br = 128;  // query rows per tile
  int64_t Bc = 128;  // keys per tile
};
void validate_tiles(const Tiles& t);  // "Br (0) must be >= 1"

// Whole problem, eq. (4.1)-(4.4). Shapes as reference::forward. Empty rows: O = 0, LSE = -inf.
template <class T>
void forward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
             View3<T> LSE, Tiles tiles = {});

// One block (§6.1): the queries at global positions q_pos against the keys at global positions
// k_pos; the mask is evaluated on those global positions.  Q (B, H_q, q_pos.n, d);
// K, V (B, H_kv, k_pos.n, d)  ->  the partial O (B, H_q, q_pos.n, d), LSE (B, H_q, q_pos.n)
// over just these keys (rows with no visible key here: O = 0, LSE = -inf: the merge identity).
template <class T>
void forward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                   View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O, View3<T> LSE,
                   Tiles tiles = {});

// eq. (5.1): D_i = sum_k dO_ik O_ik.  O, dO (B, H_q, N, d) -> D (B, H_q, N).
template <class T>
void compute_D(View4<const T> O, View4<const T> dO, View3<T> D);

// Whole problem backward, eq. (5.2)-(5.7). Outputs overwritten.
template <class T>
void backward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
              View4<const T> O, View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK,
              View4<T> dV, Tiles tiles = {});

// One block of the backward (§6.2): rows at q_pos (with their dO, LSE, D) against keys at k_pos.
// ACCUMULATES: dQ += (this block's contribution), dK += ..., dV += ... (dK, dV group-summed).
// LSE and D are the GLOBAL row statistics (over all keys), so blocks compose by addition.
template <class T>
void backward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                    View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                    View3<const T> LSE, View3<const T> D, View4<T> dQ, View4<T> dK, View4<T> dV,
                    Tiles tiles = {});

}  // namespace burstlab::cpu
