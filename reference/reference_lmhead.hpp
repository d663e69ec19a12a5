// reference/reference_lmhead.hpp — the naive LM head + cross-entropy (spec §10.2-§10.4): materializes the
// (N, V) logits. lmhead_forward<double> / lmhead_backward<double> are THE oracle of the operator;
// <float> measures what a naive fp32 implementation achieves.
#pragma once

#include <cstdint>

#include "burstlab/lmhead.hpp"

namespace burstlab::reference {

// eq. (10.1)-(10.4). H (N, d), W (V, d), y (N)  ->  LSE (N) (every row); returns L.
template <class T>
T lmhead_forward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, T* LSE);

// eq. (10.5)-(10.9). LSE (N) from the forward, g = dL  ->  dH (N, d), dW (V, d), overwritten.
template <class T>
void lmhead_backward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y,
                     const T* LSE, T g, View2<T> dH, View2<T> dW);

}  // namespace burstlab::reference
