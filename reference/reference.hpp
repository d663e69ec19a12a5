// reference/ — naive attention that materializes S and P (spec §2 forward, §5 backward).
// reference<double> is THE oracle; reference<float> exists to measure what a naive fp32
// implementation achieves. Every mask kind (§3) and GQA (§1.3, no K/V copies: Eigen maps over
// the strided views).
#pragma once

#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab::reference {

// eq. (2.1)-(2.4).  Q (B, H_q, N_q, d); K, V (B, H_kv, N_k, d)  ->  O (B, H_q, N_q, d),
// LSE (B, H_q, N_q). Empty rows: O = 0, LSE = -inf (§2.3).
template <class T>
void forward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
             View3<T> LSE);

// eq. (5.1)-(5.7). Inputs as forward plus O, dO (B, H_q, N_q, d) and LSE (B, H_q, N_q) ->
// dQ (B, H_q, N_q, d), dK, dV (B, H_kv, N_k, d); dK, dV of a kv-head sum over its group.
// Outputs are overwritten (not accumulated).
template <class T>
void backward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
              View4<const T> O, View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK,
              View4<T> dV);

}  // namespace burstlab::reference
