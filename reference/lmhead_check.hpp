// reference/lmhead_check.hpp — what every check of an LM head + cross-entropy layer against the
// oracle needs (spec §10.8): seeded inputs (never zeros), the oracle (reference<double>) with its
// per-element bounds, and the comparisons of §9.3. Tests, `burstlab run --op lmhead-ce` and the
// benchmark share it.
#pragma once

#include <cstdint>
#include <vector>

#include "burstlab/lmhead.hpp"
#include "burstlab/precision.hpp"
#include "harness.hpp"    // Values
#include "tolerance.hpp"  // Metrics, RuleConstants, compare_element

namespace burstlab {

// Inputs already rounded to `dtype`, stored as double (the oracle sees what the candidate sees).
struct LmHeadInputs {
  Dtype dtype = Dtype::F64;
  Matrix<double> H;        // (N, d)
  Matrix<double> W;        // (V, d)
  std::vector<int64_t> y;  // (N)
};
// Values (spec §9.5, for this operator): Normal  H ~ N(0, 1), W ~ N(0, 1) / sqrt(d), so logits
// ~ N(0, 1); Large  both scaled so logits ~ 1.5e4 N(0, 1) (most reach 1e4); Ties  H, W uniform on
// {-1, 0.5, 1} (exact in every dtype: many equal logits). WideV does not apply (Error).
// Each label is ignore_index with probability `ignored`, else uniform in [0, V).
LmHeadInputs make_lmhead_inputs(const LmHeadProblem& p, Dtype dtype, uint64_t seed, Values values = Values::Normal,
                                double ignored = 0.1);

// The oracle's answer and the bounds of §10.8 for a candidate of storage dtype `dtype`.
struct LmHeadOracle {
  Dtype dtype = Dtype::F64;
  double L = 0, bound_L = 0;              // eq. (10.4), (10.16)
  std::vector<double> LSE, bound_LSE;     // (N)       eq. (10.2), (10.14)
  Matrix<double> dH, bound_dH;            // (N, d)    eq. (10.8), (10.20)   (backward only)
  Matrix<double> dW, bound_dW;            // (V, d)    eq. (10.9), (10.21) with r_W = 1   (backward only)
  Matrix<double> bound_dW_round;          // (V, d)    what each further rounding of dW to s adds (r_W)
};
// bound(dW) of (10.21) for a candidate that rounds partial sums of dW to its storage type r_W
// times (e.g. once per chunk of rows when dW is accumulated in s).
Matrix<double> dW_bound(const LmHeadOracle& o, int64_t r_W);
// reference::lmhead_forward<double> (and _backward with incoming gradient g), then the bounds.
LmHeadOracle lmhead_oracle(const LmHeadProblem& p, const LmHeadInputs& in, double g, bool backward);
// The bounds of §10.8 alone, from the inputs and the oracle's LSE (N); fills bound_* of `out`.
// Chunked over rows: O(chunk V) memory beyond the outputs.
void lmhead_bounds(const LmHeadProblem& p, Dtype dtype, View2<const double> H, View2<const double> W,
                   const int64_t* y, const double* LSE, double g, bool backward, LmHeadOracle& out);

// §9.3 per tensor: "L" (scalar), "LSE" (i), "dH" (i, k), "dW" (j, k).
Metrics compare_loss(double got, double want, double bound);
template <class A>
Metrics compare_lse(const A* got, const std::vector<double>& want, const std::vector<double>& bound) {
  static const char* const names[] = {"i"};
  Metrics m;
  m.tensor = "LSE";
  if (!got) fail("LSE (null) must point to data");
  for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i)
    compare_element(m, static_cast<double>(got[i]), want[i], bound[i], &i, 1, names);
  return m;
}
template <class T>
Metrics compare_matrix(const char* name, const char* row_name, View2<const T> got, const Matrix<double>& want,
                       const Matrix<double>& bound) {
  const char* const names[] = {row_name, "k"};
  validate_view2(name, got.dim, got.data, want.rows, "the oracle's rows", want.cols, "the oracle's columns");
  Metrics m;
  m.tensor = name;
  int64_t idx[2];
  for (idx[0] = 0; idx[0] < want.rows; ++idx[0])
    for (idx[1] = 0; idx[1] < want.cols; ++idx[1]) {
      const size_t e = static_cast<size_t>(idx[0] * want.cols + idx[1]);
      compare_element(m, static_cast<double>(got(idx[0], idx[1])), want.data[e], bound.data[e], idx, 2, names);
    }
  return m;
}
template <class A>
std::vector<Metrics> check_lmhead_forward(const LmHeadOracle& o, A L, const A* LSE) {
  return {compare_loss(static_cast<double>(L), o.L, o.bound_L), compare_lse(LSE, o.LSE, o.bound_LSE)};
}
// r_W: how often the candidate rounds a partial sum of dW to its storage type (10.21).
template <class T>
std::vector<Metrics> check_lmhead_backward(const LmHeadOracle& o, View2<const T> dH, View2<const T> dW,
                                           int64_t r_W = 1) {
  return {compare_matrix("dH", "i", dH, o.dH, o.bound_dH),
          compare_matrix("dW", "j", dW, o.dW, r_W == 1 ? o.bound_dW : dW_bound(o, r_W))};
}

}  // namespace burstlab
