// distributed/shard_ops.hpp — engine-side helpers the collective schedules share (baselines,
// attention2d, distflash): BHSD views and row offsets, a rank's output allocation, D at home
// (5.1), and host-staged copies and sums (engine-agnostic, fixed order: bitwise reproducible).
// Internal to the layer: only its .cpp files include it.
#pragma once

#include <cstdint>
#include <vector>

#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "engine.hpp"
#include "partition.hpp"
#include "ring.hpp"

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

// b holds n elements afterwards (reallocated only when absent or of another size).
template <class T>
void ensure(Engine<T>& e, Buffer<T>& b, int64_t n) {
  if (!b.data || b.n != n) b = e.alloc(n);
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

// eq. (5.1) at home: D = rowsum(dO o O), (B, H_q, n_q); D travels instead of O.
template <class T>
Buffer<T> home_D(Engine<T>& e, const Problem& p, const Shard<T>& x) {
  const int64_t B = p.B, Hq = p.H_q, n = x.n_q, d = p.d;
  Buffer<T> D = e.alloc(B * Hq * n);
  e.compute_D(as_const(bhsd<T>(x.O.data, B, Hq, n, d)), as_const(bhsd<T>(x.dO.data, B, Hq, n, d)),
              view3<T>(D.data, B, Hq, n));
  return D;
}

// dst <- src (n elements) through `host` staging: a rank's own piece of a collective.
template <class T>
void host_copy(Engine<T>& e, std::vector<T>& host, T* dst, const T* src, int64_t n) {
  host.resize(static_cast<size_t>(n));
  e.download(host.data(), src, n);
  e.upload(dst, host.data(), n);
}

// acc += in (n elements), through the host.
template <class T>
void host_add(Engine<T>& e, T* acc, const T* in, int64_t n) {
  std::vector<T> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  e.download(a.data(), acc, n);
  e.download(b.data(), in, n);
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  e.upload(acc, a.data(), n);
}

// dst (piece) <- sum of the K pieces of stage (K, piece), in piece order 0, 1, ..., K-1: the
// reduction of a sum reduce-scatter, bitwise reproducible.
template <class T>
void host_sum_pieces(Engine<T>& e, const T* stage, int64_t K, int64_t piece, T* dst) {
  std::vector<T> all(static_cast<size_t>(K * piece)), sum(static_cast<size_t>(piece));
  e.download(all.data(), stage, K * piece);
  for (int64_t i = 0; i < piece; ++i) {
    T acc = all[i];
    for (int64_t k = 1; k < K; ++k) acc += all[k * piece + i];
    sum[i] = acc;
  }
  e.upload(dst, sum.data(), piece);
}

}  // namespace burstlab::dist
