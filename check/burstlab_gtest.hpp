// check/burstlab_gtest.hpp — GoogleTest helper: a candidate's outputs against the fp64 oracle
// under the spec's §9 rule for the candidate's dtype (header-only; link GTest yourself).
//
//   const auto c = burstlab::check::make_case(meta);           // or read_case("cases/01_...")
//   const auto want = burstlab::check::compute_expected(c);    // or read_expected(dir, c.meta)
//   burstlab::check::Candidate got = ...;                      // your kernel's O, LSE, dQ, dK, dV
//   BURSTLAB_EXPECT_CONFORMS(c, want, got, burstlab::Dtype::BF16);
//
// On failure the message is the checker's table: per tensor max_abs, max_rel, err/bound, #wrong
// and the first mismatches with their (b, h, i|j, k) coordinates.
#pragma once

#include <gtest/gtest.h>

#include "case.hpp"

namespace burstlab::check {

inline ::testing::AssertionResult conforms_format(const char* e_case, const char* /*e_want*/, const char* e_got,
                                                  const char* e_dtype, const CaseData& c, const Expected& want,
                                                  const Candidate& got, Dtype dtype) {
  const CheckResult r = check_candidate(c, want, got, dtype);
  if (r.pass()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << e_got << " does not match the oracle on " << e_case << " under the §9 bound for "
                                       << e_dtype << ":\n" << format_check(r);
}

}  // namespace burstlab::check

#define BURSTLAB_EXPECT_CONFORMS(case_data, expected, candidate, dtype) \
  EXPECT_PRED_FORMAT4(::burstlab::check::conforms_format, case_data, expected, candidate, dtype)
#define BURSTLAB_ASSERT_CONFORMS(case_data, expected, candidate, dtype) \
  ASSERT_PRED_FORMAT4(::burstlab::check::conforms_format, case_data, expected, candidate, dtype)
