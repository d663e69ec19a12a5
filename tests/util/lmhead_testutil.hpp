// tests/util/lmhead_testutil.hpp — what the LM head tests (reference/, cpu/, cuda/) share: the
// problem in one call, the sweep's option sets, the worst err/bound table, an Error's message.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/lmhead.hpp"
#include "lmhead_check.hpp"
#include "tolerance.hpp"

namespace burstlab::testutil {

inline LmHeadProblem lmhead_problem(int64_t N, int64_t d, int64_t V, double eps = 0, double lambda = 0,
                                    Reduction red = Reduction::Mean) {
  LmHeadProblem p;
  p.N = N; p.d = d; p.V = V;
  p.label_smoothing = eps;
  p.z_loss = lambda;
  p.reduction = red;
  return p;
}

// A sweep's cases on one (N, d, V): every value mode x three option sets (opt 0: neither
// smoothing nor z-loss, mean; 1: smoothing 0.1, z-loss 1e-4, sum; 2: smoothing 0.3, mean, half
// the labels ignored), inputs in `dtype` seeded seed, seed + 1, ... (seed is advanced).
// Calls f(p, in, v, opt).
template <class F>
void for_each_lmhead_case(int64_t N, int64_t d, int64_t V, Dtype dtype, uint64_t& seed, F&& f) {
  for (Values v : {Values::Normal, Values::Large, Values::Ties})
    for (int opt = 0; opt < 3; ++opt) {
      const LmHeadProblem p = opt == 0 ? lmhead_problem(N, d, V)
                              : opt == 1 ? lmhead_problem(N, d, V, 0.1, 1e-4, Reduction::Sum)
                                         : lmhead_problem(N, d, V, 0.3, 0.0, Reduction::Mean);
      const LmHeadInputs in = make_lmhead_inputs(p, dtype, seed++, v, opt == 2 ? 0.5 : 0.1);
      f(p, in, v, opt);
    }
}

// The worst err/bound per dtype and tensor over a sweep, printed at its end.
struct WorstErrBound {
  std::map<std::string, double> w;
  void add(Dtype t, const std::vector<Metrics>& ms) {
    for (const Metrics& m : ms) {
      double& x = w[to_string(t) + " " + m.tensor];
      x = std::max(x, m.err_bound);
    }
  }
  void print(const char* what) const {
    std::printf("  %s, worst err/bound per dtype and tensor:\n", what);
    for (const auto& [k, x] : w) std::printf("    %-10s %.2e\n", k.c_str(), x);
  }
};

}  // namespace burstlab::testutil
