// reference/tolerance.hpp — THE tolerance rule (spec §9), implemented once.
// Every comparison of a layer in precision p against the fp64 oracle goes through here: tests,
// the `burstlab` tool, and later layers. The bound is per element and derived from unit
// roundoffs and magnitudes that the oracle computes alongside its result (eq. 9.2-9.9).
#pragma once

#include <cstdint>
#include <string>

#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

// The oracle's answer for one problem (fp64, computed on the candidate's rounded inputs) and the
// per-element bounds for a candidate of storage dtype `dtype`.
struct ForwardBounds {
  Tensor4<double> O;    // (B, H_q, N_q, d)
  Tensor3<double> LSE;  // (B, H_q, N_q)
};
struct BackwardBounds {
  Tensor4<double> dQ;  // (B, H_q, N_q, d)
  Tensor4<double> dK;  // (B, H_kv, N_k, d)
  Tensor4<double> dV;  // (B, H_kv, N_k, d)
};

// eq. (9.4)-(9.5). Q, K, V are the candidate's inputs exactly (upcast to double).
ForwardBounds forward_bounds(const Problem& p, Dtype dtype, View4<const double> Q,
                             View4<const double> K, View4<const double> V);
// eq. (9.6)-(9.9). dO as the candidate got it; O, LSE: the oracle's forward outputs.
BackwardBounds backward_bounds(const Problem& p, Dtype dtype, View4<const double> Q,
                               View4<const double> K, View4<const double> V,
                               View4<const double> O, View4<const double> dO,
                               View3<const double> LSE);

// Result of comparing one tensor (§9.3). err/bound = max over elements of |got - want| / bound;
// pass iff wrong == 0. Non-finite values are compared position by position: the candidate must
// be the same infinity where the oracle is infinite, and NaN anywhere is wrong.
struct Metrics {
  std::string tensor;       // "O", "LSE", "dQ", ...
  double max_abs = 0;       // max |got - want| over finite pairs
  double max_rel = 0;       // max |got - want| / |want| over finite pairs with want != 0
  double err_bound = 0;     // max |got - want| / bound (inf when a non-finite mismatch exists)
  int64_t wrong = 0;        // elements outside their bound or non-finite mismatches
  int64_t checked = 0;      // elements compared
  std::string first_wrong;  // "(b=0, h=1, i=7, k=3): got 0.5 want 0.25 bound 1e-6", or ""
  bool pass() const { return wrong == 0; }
};

template <class T>
Metrics compare(const char* name, View4<const T> got, View4<const double> want,
                View4<const double> bound);
template <class T>
Metrics compare(const char* name, View3<const T> got, View3<const double> want,
                View3<const double> bound);

// Worst of several (max of each column, sum of wrong and checked); name "all" unless given.
Metrics combine(const Metrics* ms, int n, const char* name = "all");

// The pieces of the rule that the row-sampled check (rows.hpp, §9.11) shares with the full one.
// The constants of §9.1 for a candidate of storage dtype s.
struct RuleConstants {
  double u_s, u_a, u_P, tiny_s, tiny_a;
  double gamma(double n) const { return gamma_n(n, u_a); }
};
RuleConstants rule_constants(Dtype s);
// The one safety factor of §9.4: every bound is first order in u, and doubled.
constexpr double kRuleSafety = 2.0;
// eq. (9.2): eta_i for a row of logit magnitude a_i (eq. 9.1).
inline double rule_eta(const RuleConstants& c, int64_t d, int64_t N_k, double a_i) {
  return 2 * c.gamma(double(d) + 2) * a_i + c.gamma(10.0 * double(N_k) + 16) + c.u_P;
}
// One element of §9.3 into m; idx holds `rank` coordinates (b, h, i[, k]) for first_wrong, named
// by `names` when given (the LM head's (i, k), (j, k), §10.8).
void compare_element(Metrics& m, double got, double want, double bound, const int64_t* idx, int rank,
                     const char* const* names = nullptr);

}  // namespace burstlab
