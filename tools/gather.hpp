// tools/gather.hpp — a distributed run's outputs for `run`'s check: every rank's shards in the
// global layout for the full oracle (gather_outputs), or, for the row-sampled check (spec §9.11),
// only what it reads (sampled_forward / sampled_backward). distributed.cpp's runner (every
// transport) hands `run` these.
#pragma once

#include <cstdint>
#include <functional>

#include "burstlab/tensor.hpp"
#include "rows.hpp"
#include "session.hpp"

namespace burstlab::tools {

// A distributed run's outputs gathered from the ranks' shards (dist::gather) into global fp64
// tensors, BHSD: O, dQ (B, H_q, N_q, d), LSE (B, H_q, N_q), dK, dV (B, H_kv, N_k, d); a pass not
// asked for stays empty. `run` checks these against the full oracle (check_rows == 0).
struct GatheredOutputs {
  Tensor4<double> O, dQ, dK, dV;
  Tensor3<double> LSE;
};
template <class T>
GatheredOutputs gather_outputs(const dist::DistResult<T>& res, bool forward, bool backward);

// A held rank's output as the sampled check reads it: n values of `which` from element `at` of
// the rank's BHSD shard over its local length ((B, H, n_local, d); LSE (B, H_q, n_local)),
// widened to fp64 (exact) into out.
using ReadOutput = std::function<void(int r, dist::Output which, int64_t at, int64_t n, double* out)>;
// From the session's engine memory (Session::read_output): a few rows at a time.
template <class T>
ReadOutput session_reader(const dist::Session<T>& s);
// From the host tensors of a DistResult (its held ranks).
template <class T>
ReadOutput result_reader(const dist::DistResult<T>& res);

// What the row-sampled check reads of a distributed run (spec §9.11), assembled on every process
// without a global tensor: each process reads from the ranks it holds the sampled rows and
// columns they own and, for the column check, LSE and D (row_D) of their rows of the sampled
// columns' q-heads, a block of rows at a time; the World all-gathers only those (the sample in
// one call, then one call per (b, q-head) of RunRows: 3 N_q doubles). Collectives: every process
// calls them in the same order. Host memory per process: O(K d + |heads| N_q) doubles.
// Forward: got.O, got.LSE; when run is given, also RunRows of the run's O and LSE with the
// inputs' dO (B, H_q, N_q, d), for the column check of the backward.
void sampled_forward(dist::World& w, const Problem& p, const dist::Partition& qp, const Sample& s,
                     const ReadOutput& read, const AnyView4& dO, SampledOutputs& got, RunRows* run);
// Backward: got.dQ at the rows, got.dK, got.dV at the columns.
void sampled_backward(dist::World& w, const Problem& p, const dist::Partition& qp, const dist::Partition& kp,
                      const Sample& s, const ReadOutput& read, SampledOutputs& got);

// A gathered tensor of any storage type as fp64 (the oracle's type), same layout.
template <class U>
Tensor4<double> widen(const Tensor4<U>& x) {
  Tensor4<double> y = make_tensor4<double>(x.layout, x.B, x.H, x.N, x.d);
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = burstlab::to_double(x.data[i]);
  return y;
}
template <class U>
Tensor3<double> widen(const Tensor3<U>& x) {
  Tensor3<double> y = make_tensor3<double>(x.B, x.H, x.N);
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = burstlab::to_double(x.data[i]);
  return y;
}

}  // namespace burstlab::tools
