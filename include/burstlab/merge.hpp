// burstlab/merge.hpp — the merge of partial results (spec §4.3, eq. 4.5-4.7).
// A partial is (O, LSE) over a subset of keys, O already normalized. The identity is
// (O = 0, LSE = -inf). The merge never evaluates (-inf) - (-inf): an empty side is skipped.
// It is commutative exactly (symmetric formulas) and associative up to rounding; that is what
// makes tiling, ring order and 2D reductions interchangeable.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "burstlab/hd.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

// Weights of the merge (eq. 4.5): L = logaddexp(L_a, L_b), w_a = e^(L_a - L), w_b = e^(L_b - L).
template <class A>
BURSTLAB_HD void merge_weights(A L_a, A L_b, A* w_a, A* w_b, A* L) {
  using std::exp;
  using std::log;
  const A ninf = -std::numeric_limits<A>::infinity();
  if (L_b == ninf) { *w_a = L_a == ninf ? A(0) : A(1); *w_b = A(0); *L = L_a; return; }
  if (L_a == ninf) { *w_a = A(0); *w_b = A(1); *L = L_b; return; }
  const A m = L_a > L_b ? L_a : L_b;
  const A e_a = exp(L_a - m), e_b = exp(L_b - m);  // one of them is exactly 1
  const A s = e_a + e_b;
  *L = m + log(s);
  *w_a = e_a / s;
  *w_b = e_b / s;
}

// One row: (o_a, L_a) <- (o_a, L_a) (+) (o_b, L_b). o_a, o_b: (d) with element strides.
template <class T, class A>
BURSTLAB_HD void merge_row(T* o_a, int64_t sa, A* L_a, const T* o_b, int64_t sb, A L_b, int64_t d) {
  using std::fma;
  A w_a, w_b, L;
  merge_weights(*L_a, L_b, &w_a, &w_b, &L);
  for (int64_t k = 0; k < d; ++k) {
    const A x = static_cast<A>(o_a[k * sa]), y = static_cast<A>(o_b[k * sb]);
    // An explicit FMA in a canonical order (larger weight first, ties by value) keeps the merge
    // bitwise commutative whatever the compiler contracts (-march=native and nvcc fuse
    // w_a x + w_b y into an FMA, which is not symmetric in its operands).
    const bool a_first = w_a > w_b || (w_a == w_b && x >= y);
    o_a[k * sa] = static_cast<T>(a_first ? fma(w_a, x, w_b * y) : fma(w_b, y, w_a * x));
  }
  *L_a = L;
}

// Whole partials: (O_a, LSE_a) <- (O_a, LSE_a) (+) (O_b, LSE_b); O (B, H, N, d), LSE (B, H, N).
template <class T>
void merge(View4<T> O_a, View3<T> LSE_a, View4<const T> O_b, View3<const T> LSE_b) {
  for (int64_t b = 0; b < O_a.dim[0]; ++b)
    for (int64_t h = 0; h < O_a.dim[1]; ++h)
      for (int64_t i = 0; i < O_a.dim[2]; ++i)
        merge_row<T, T>(O_a.row(b, h, i), O_a.stride[3], &LSE_a(b, h, i), O_b.row(b, h, i),
                        O_b.stride[3], LSE_b(b, h, i), O_a.dim[3]);
}

}  // namespace burstlab
