// tools/gather.hpp — a distributed run's outputs, from the ranks' shards into the global layout.
// distributed.cpp's runner (every transport) hands `run` what this returns.
#pragma once

#include "burstlab/tensor.hpp"
#include "session.hpp"

namespace burstlab::tools {

// A distributed run's outputs gathered from the ranks' shards (dist::gather) into global fp64
// tensors, BHSD: O, dQ (B, H_q, N_q, d), LSE (B, H_q, N_q), dK, dV (B, H_kv, N_k, d); a pass not
// asked for stays empty. `run` checks these against the full oracle, or with --check-rows with
// check_sampled_forward / check_sampled_backward (reference/rows.hpp, spec §9.11).
struct GatheredOutputs {
  Tensor4<double> O, dQ, dK, dV;
  Tensor3<double> LSE;
};
template <class T>
GatheredOutputs gather_outputs(const dist::DistResult<T>& res, bool forward, bool backward);

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
