// reference/fill.hpp — make_inputs' tensors filled side by side with the values of one serial pass
// (spec §9.5). The serial definition: Q, K, V, dO in that order, each from its own stream, every
// element drawn (and redrawn while it rounds to 0) in logical order, all four drawing normals
// through ONE std::normal_distribution, whose cached second value of a pair carries from the end
// of one tensor to the start of the next. Here each tensor is filled alone, with a distribution of
// its own, recording what the carry needs; stitch() then gives each tensor the value it would
// have had after its predecessor, so the result is bit for bit the serial one. Internal to the
// layer (harness.cpp; tests/reference/test_inputs.cpp checks it against the serial pass).
#pragma once

#include <cstdint>
#include <random>

#include "burstlab/precision.hpp"
#include "burstlab/storage.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab::reference {

// The shared distribution's cached value between two tensors.
struct Carry {
  bool available = false;
  double value = 0;
};

// What a tensor filled alone records: its normal draws S_0, S_1, ... counted, the count when its
// last element began (all but one filled) and at the end, and the draws at those two counts (the
// distribution's cached value at that point, when the count is odd).
struct Filled {
  int64_t k_all = 0;
  int64_t k_but_one = 0;
  double s_but_one = 0;  // S_{k_but_one}: the first draw of the last element
  double s_next = 0;     // S_{k_all}: the draw after the fill
};

// Fills t in logical order (b, h, n, k) with round_to(dtype, draw(rng, normal)), redrawn while it
// is 0. draw calls normal exactly once per call, or never (then no carry passes through t). E is
// any storage type that holds dtype's values exactly (storage.hpp): each value is stored unchanged.
template <class E, class Draw>
Filled fill_alone(Tensor4<E>& t, Dtype dtype, std::mt19937_64 rng, Draw draw) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Filled f;
  int64_t mark = -1;
  auto normal = [&](std::mt19937_64& r) {
    const double x = nd(r);
    if (f.k_all == mark) f.s_but_one = x;
    ++f.k_all;
    return x;
  };
  View4<E> v = t.view();
  const int64_t last = t.B * t.H * t.N * t.d - 1;
  int64_t i = 0;
  for (int64_t b = 0; b < t.B; ++b)
    for (int64_t h = 0; h < t.H; ++h)
      for (int64_t n = 0; n < t.N; ++n)
        for (int64_t k = 0; k < t.d; ++k, ++i) {
          if (i == last) f.k_but_one = mark = f.k_all;
          double x;
          do { x = round_to(dtype, draw(rng, normal)); } while (x == 0.0);
          v(b, h, n, k) = from_double<E>(x);
        }
  f.s_next = nd(rng);  // the cached value when k_all is odd (no engine draw then)
  return f;
}

// t as the serial pass leaves it when the tensor before it left `in`; returns what t leaves.
// With a carried value c, the serial pass's first draw of t is c: when c rounds to a non-zero x,
// t is x followed by all but the last of its values filled alone, and the draws of t's own stream
// stop at k_but_one; when c rounds to 0 it is redrawn, and t is as filled alone.
template <class E, class Draw>
Carry stitch(Tensor4<E>& t, Dtype dtype, const Filled& f, Carry in, Draw draw) {
  if (f.k_all == 0) return in;  // t draws no normal: the cached value waits for the next tensor
  if (in.available) {
    std::mt19937_64 untouched;  // the draw's normal returns the carried value, no engine draw
    auto carried = [&](std::mt19937_64&) { return in.value; };
    const double x = round_to(dtype, draw(untouched, carried));
    if (x != 0.0) {
      View4<E> v = t.view();
      E carry = from_double<E>(x);  // shift every element one place on in logical order
      for (int64_t b = 0; b < t.B; ++b)
        for (int64_t h = 0; h < t.H; ++h)
          for (int64_t n = 0; n < t.N; ++n)
            for (int64_t k = 0; k < t.d; ++k) std::swap(carry, v(b, h, n, k));
      return f.k_but_one % 2 ? Carry{true, f.s_but_one} : Carry{};
    }
  }
  return f.k_all % 2 ? Carry{true, f.s_next} : Carry{};
}

}  // namespace burstlab::reference
