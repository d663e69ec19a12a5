// tests/util/testutil.cpp — see testutil.hpp.
#include "testutil.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace burstlab::testutil {

Problem make_problem(int64_t B, int64_t H_q, int64_t H_kv, int64_t N_q, int64_t N_k, int64_t d,
                     const std::string& mask_spec, uint64_t mask_seed) {
  Problem p;
  p.B = B; p.H_q = H_q; p.H_kv = H_kv; p.N_q = N_q; p.N_k = N_k; p.d = d;
  p.mask = make_mask(mask_spec, N_q, N_k, mask_seed);
  validate(p);
  return p;
}

std::string metrics_header() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-6s %12s %12s %12s %17s  %s", "tensor", "max_abs", "max_rel",
                "err/bound", "#wrong/#checked", "first_wrong");
  return buf;
}

std::string format(const Metrics& m) {
  char buf[512];
  const std::string wc = std::to_string(m.wrong) + "/" + std::to_string(m.checked);
  std::snprintf(buf, sizeof buf, "%-6s %12.3e %12.3e %12.3e %17s  %s", m.tensor.c_str(), m.max_abs,
                m.max_rel, m.err_bound, wc.c_str(), m.first_wrong.c_str());
  return buf;
}

std::string format(const std::vector<Metrics>& ms) {
  std::string s = metrics_header() + "\n";
  for (const Metrics& m : ms) s += format(m) + "\n";
  return s;
}

void PrintTo(const Metrics& m, std::ostream* os) { *os << format(m); }

::testing::AssertionResult all_pass(const std::vector<Metrics>& ms, const std::string& context) {
  bool ok = !ms.empty();
  for (const Metrics& m : ms) ok = ok && m.pass() && m.checked > 0;
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << (context.empty() ? "" : context + "\n")
                                       << (ms.empty() ? "no metrics (nothing compared)\n" : format(ms));
}

void expect_pass(const std::vector<Metrics>& ms, const std::string& context) {
  EXPECT_TRUE(all_pass(ms, context));
}

double worst_err_bound(const std::vector<Metrics>& ms) {
  double w = 0;
  for (const Metrics& m : ms) w = std::max(w, m.err_bound);
  return w;
}

std::vector<Metrics> cat(std::vector<Metrics> a, const std::vector<Metrics>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace burstlab::testutil

namespace burstlab {
void PrintTo(const Metrics& m, std::ostream* os) { testutil::PrintTo(m, os); }
}  // namespace burstlab
