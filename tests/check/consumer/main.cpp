// An external kernel's test, written as a user of the installed package would write it.
#include <cmath>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "burstlab_gtest.hpp"  // include/burstlab/check
#include "reference.hpp"       // include/burstlab/reference

using namespace burstlab;

// "My kernel": the naive fp32 reference, fwd + bwd, on the case's inputs.
check::Candidate my_kernel(const check::CaseData& c) {
  const Problem& p = c.meta.p;
  const auto Q = convert<float>(c.in.Q), K = convert<float>(c.in.K), V = convert<float>(c.in.V), dO = convert<float>(c.in.dO);
  auto O = make_tensor4<float>(c.meta.layout, p.B, p.H_q, p.N_q, p.d);
  auto LSE = make_tensor3<float>(p.B, p.H_q, p.N_q);
  reference::forward<float>(p, Q.view(), K.view(), V.view(), O.view(), LSE.view());
  auto dQ = make_tensor4<float>(c.meta.layout, p.B, p.H_q, p.N_q, p.d);
  auto dK = make_tensor4<float>(c.meta.layout, p.B, p.H_kv, p.N_k, p.d);
  auto dV = make_tensor4<float>(c.meta.layout, p.B, p.H_kv, p.N_k, p.d);
  reference::backward<float>(p, Q.view(), K.view(), V.view(), as_const(O.view()), dO.view(), as_const(LSE.view()),
                             dQ.view(), dK.view(), dV.view());
  check::Candidate k;
  k.dtype = Dtype::F32;
  k.layout = c.meta.layout;
  k.O = to_double(O); k.LSE = to_double(LSE); k.dQ = to_double(dQ); k.dK = to_double(dK); k.dV = to_double(dV);
  k.has_O = k.has_LSE = k.has_dQ = k.has_dK = k.has_dV = true;
  return k;
}

TEST(Consumer, KernelConformsOnTheQuickSuite) {
  for (const check::CaseMeta& m : check::suite(true, Dtype::F32)) {
    if (m.p.N_q * m.p.N_k > 10000) continue;  // keep the consumer test short
    const check::CaseData c = check::make_case(m);
    const check::Expected want = check::compute_expected(c);
    BURSTLAB_EXPECT_CONFORMS(c, want, my_kernel(c), Dtype::F32);
  }
}

TEST(Consumer, AWrongKernelFailsWithCoordinates) {
  const check::CaseData c = check::make_case(check::suite(true, Dtype::F32).at(1));
  const check::Expected want = check::compute_expected(c);
  check::Candidate bad = my_kernel(c);
  bad.O.view()(1, 3, 7, 5) += 0.1f;
  EXPECT_NONFATAL_FAILURE(BURSTLAB_EXPECT_CONFORMS(c, want, bad, Dtype::F32), "O (b=1, h=3, i=7, k=5)");
}
