// distributed/shard_ops.hpp — engine-side helpers the collective schedules share (baselines,
// attention2d, distflash): BHSD views and row offsets, a rank's output allocation, D at home
// (5.1), and sums of pieces in a fixed order (bitwise reproducible).
// Internal to the layer: only its .cpp files include it.
#pragma once

#include <cstdint>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "partition.hpp"
#include "ring.hpp"

// M(T) for each storage type of the contract: the explicit instantiations of the schedules.
#define BURSTLAB_FOR_EACH_STORAGE(M) M(float) M(double) M(bf16_t) M(f16_t)

namespace burstlab::dist {

template <class T>
View4<T> bhsd(T* data, int64_t B, int64_t H, int64_t n, int64_t d) {
  return view4(data, Layout::BHSD, B, H, n, d);
}

// Element offset of row `off` of (b, h) in a BHSD buffer (B, H, L, w): rows of one (b, h) are
// contiguous, so a run of rows is one message.
inline int64_t at(int64_t b, int64_t h, int64_t off, int64_t H, int64_t L, int64_t w) {
  return ((b * H + h) * L + off) * w;
}

// Rank r's local lengths n_q, n_k, and its forward outputs O (B, H_q, n_q, d), LSE (B, H_q, n_q).
template <class T>
void prepare_forward(Engine<T>& e, const Problem& p, const Partition& qp, const Partition& kp, int r, Shard<T>& x) {
  x.n_q = qp.local_size(r);
  x.n_k = kp.local_size(r);
  ensure(e, x.O, p.B * p.H_q * x.n_q * p.d);
  ensure(e, x.LSE, p.B * p.H_q * x.n_q);
}

// Rank r's local lengths, and its backward outputs dQ (B, H_q, n_q, d), dK, dV (B, H_kv, n_k, d).
template <class T>
void prepare_backward(Engine<T>& e, const Problem& p, const Partition& qp, const Partition& kp, int r, Shard<T>& x) {
  x.n_q = qp.local_size(r);
  x.n_k = kp.local_size(r);
  ensure(e, x.dQ, p.B * p.H_q * x.n_q * p.d);
  ensure(e, x.dK, p.B * p.H_kv * x.n_k * p.d);
  ensure(e, x.dV, p.B * p.H_kv * x.n_k * p.d);
}

// eq. (5.1) at home: D = rowsum(dO o O), (B, H_q, n_q); D travels instead of O, so the engine
// has finished it on return (the transport may read it next).
template <class T>
Buffer<acc_t<T>> home_D(Engine<T>& e, const Problem& p, const Shard<T>& x) {
  const int64_t B = p.B, Hq = p.H_q, n = x.n_q, d = p.d;
  Buffer<acc_t<T>> D = alloc<acc_t<T>>(e, B * Hq * n);
  e.compute_D(as_const(bhsd<T>(x.O.data, B, Hq, n, d)), as_const(bhsd<T>(x.dO.data, B, Hq, n, d)),
              view3<acc_t<T>>(D.data, B, Hq, n));
  e.synchronize();
  return D;
}

// dst (piece) <- sum of the K pieces of stage (K, piece), in piece order 0, 1, ..., K-1: the
// reduction of a sum reduce-scatter, bitwise reproducible.
template <class U, class T>
void sum_pieces(Engine<T>& e, const U* stage, int64_t K, int64_t piece, U* dst) {
  copy(e, dst, stage, piece);
  for (int64_t k = 1; k < K; ++k) add(e, dst, stage + k * piece, piece);
}

}  // namespace burstlab::dist
