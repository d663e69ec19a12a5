// tests/util/testutil.hpp — small helpers shared by the test folders.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/problem.hpp"
#include "harness.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace burstlab::testutil {

// A Problem in one call; mask from make_mask(mask_spec, N_q, N_k, mask_seed) ("none" = full).
Problem make_problem(int64_t B, int64_t H_q, int64_t H_kv, int64_t N_q, int64_t N_k, int64_t d,
                     const std::string& mask_spec = "none", uint64_t mask_seed = 1);

// One line per Metrics, fixed-width columns: tensor, max_abs, max_rel, err/bound, #wrong/#checked,
// first_wrong.
std::string metrics_header();
std::string format(const Metrics& m);
std::string format(const std::vector<Metrics>& ms);  // header + one line each
void PrintTo(const Metrics& m, std::ostream* os);     // gtest printer

// gtest assertions: every Metrics passes (wrong == 0 and checked > 0); on failure the whole
// table is printed, with `context` (shape, mask, dtype...) first.
::testing::AssertionResult all_pass(const std::vector<Metrics>& ms, const std::string& context = "");
void expect_pass(const std::vector<Metrics>& ms, const std::string& context = "");

// The worst err/bound over ms (for printing typical values).
double worst_err_bound(const std::vector<Metrics>& ms);

// s with every character gtest refuses in a parameterized test's name (all but [A-Za-z0-9]) as '_'.
inline std::string param_name(std::string s) {
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// The test name of a parameter that carries its own (a `name` member), for INSTANTIATE_TEST_SUITE_P.
struct ByName {
  template <class P>
  std::string operator()(const ::testing::TestParamInfo<P>& info) const {
    return info.param.name;
  }
};

// reference<T>'s outputs: the forward, then the backward on that forward's own O and LSE.
template <class T>
struct RefRun {
  Tensor4<T> O, dQ, dK, dV;
  Tensor3<T> LSE;
};
template <class T>
RefRun<T> run_reference(const Problem& p, const Tensor4<T>& Q, const Tensor4<T>& K, const Tensor4<T>& V,
                        const Tensor4<T>& dO) {
  RefRun<T> r;
  r.O = make_tensor4<T>(Q.layout, p.B, p.H_q, p.N_q, p.d);
  r.LSE = make_tensor3<T>(p.B, p.H_q, p.N_q);
  r.dQ = make_tensor4<T>(Q.layout, p.B, p.H_q, p.N_q, p.d);
  r.dK = make_tensor4<T>(K.layout, p.B, p.H_kv, p.N_k, p.d);
  r.dV = make_tensor4<T>(V.layout, p.B, p.H_kv, p.N_k, p.d);
  poison(r.O); poison(r.LSE); poison(r.dQ); poison(r.dK); poison(r.dV);
  reference::forward<T>(p, Q.view(), K.view(), V.view(), r.O.view(), r.LSE.view());
  const Tensor4<T>& O = r.O;
  const Tensor3<T>& L = r.LSE;
  reference::backward<T>(p, Q.view(), K.view(), V.view(), O.view(), dO.view(), L.view(), r.dQ.view(), r.dK.view(),
                         r.dV.view());
  return r;
}

// The message of the Error that f() throws, "no error" when it throws none.
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Concatenation helper: cat(a, b) = a followed by b.
std::vector<Metrics> cat(std::vector<Metrics> a, const std::vector<Metrics>& b);

}  // namespace burstlab::testutil

namespace burstlab {
// So EXPECT_* prints Metrics readably (found by ADL).
void PrintTo(const Metrics& m, std::ostream* os);
}  // namespace burstlab
