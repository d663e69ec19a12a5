// cpu/cpu_lmhead.hpp — the fused LM head + cross-entropy on a CPU (spec §10.5): tiles of Br rows,
// vocabulary tiles of Bv with the online log-sum-exp (eq. 10.10); never an N x V buffer.
// Storage T in {double, float, bf16_t, f16_t}; accumulation acc_t<T> (fp64 for fp64, else fp32):
// the loss and LSE are returned in acc_t<T>, dH and dW stored in T. OpenMP over vocabulary tiles.
#pragma once

#include <cstdint>

#include "burstlab/lmhead.hpp"
#include "burstlab/storage.hpp"

namespace burstlab::cpu {

// Br x V accumulators hold a row tile's logits (BurstEngine Algorithm 3: no recomputation in the
// fused call); Bv is the GEMM width and the unit of work of a thread. Defaults: cpu/README.md.
struct LmHeadTiles {
  int64_t Br = 256;  // rows per tile
  int64_t Bv = 512;  // vocabulary entries per tile
};
void validate_tiles(const LmHeadTiles& t);  // "Bv (0) must be >= 1"

// eq. (10.1)-(10.4). H (N, d), W (V, d), y (N)  ->  LSE (N); returns L.
template <class T>
acc_t<T> lmhead_forward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y,
                        acc_t<T>* LSE, LmHeadTiles tiles = {});

// eq. (10.5)-(10.9) from the forward's LSE (N): recomputes the logits. dH (N, d), dW (V, d) overwritten.
template <class T>
void lmhead_backward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y,
                     const acc_t<T>* LSE, double g, View2<T> dH, View2<T> dW, LmHeadTiles tiles = {});

// The fused call (§10.4): L, LSE, dH, dW at once for the incoming gradient g; each logit computed
// once. Outputs overwritten; returns L.
template <class T>
acc_t<T> lmhead_fused(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g,
                      acc_t<T>* LSE, View2<T> dH, View2<T> dW, LmHeadTiles tiles = {});

// Bytes of workspace a fused (or, backward = false, forward) call allocates beyond its arguments,
// on `threads` OpenMP threads, Eigen's GEMM packing included as a bound: the tools' memory
// estimates (held against the measured heap peak in tests/tools/test_resources.cpp).
int64_t lmhead_workspace_bytes(const LmHeadProblem& p, Dtype dtype, bool backward, LmHeadTiles tiles, int threads);

}  // namespace burstlab::cpu
