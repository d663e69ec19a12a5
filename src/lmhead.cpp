// The LM head + cross-entropy contract's host functions: validation (spec §10.6), the loss
// weight (eq. 10.4), FLOPs (eq. 10.11).
#include "burstlab/lmhead.hpp"

#include <cmath>
#include <sstream>

namespace burstlab {
namespace {
constexpr int64_t kMaxElems = int64_t(1) << 48;  // as §1.4: index products far from overflow
}

std::string to_string(Reduction r) { return r == Reduction::Sum ? "sum" : "mean"; }
Reduction parse_reduction(const std::string& s) {
  if (s == "mean") return Reduction::Mean;
  if (s == "sum") return Reduction::Sum;
  fail("reduction (", s, ") must be mean or sum");
}

void validate(const LmHeadProblem& p) {
  if (p.N < 1) fail("N (", p.N, ") must be >= 1");
  if (p.d < 1) fail("d (", p.d, ") must be >= 1");
  if (p.V < 1) fail("V (", p.V, ") must be >= 1");
  if (!std::isfinite(p.label_smoothing) || p.label_smoothing < 0 || p.label_smoothing > 1)
    fail("label_smoothing (", p.label_smoothing, ") must be in [0, 1]");
  if (!std::isfinite(p.z_loss) || p.z_loss < 0) fail("z_loss (", p.z_loss, ") must be finite and >= 0");
  if (p.reduction != Reduction::Mean && p.reduction != Reduction::Sum)
    fail("reduction (", static_cast<int>(p.reduction), ") must be mean or sum");
  if (p.N > kMaxElems / p.d) fail("H (N x d = ", p.N, " x ", p.d, ") exceeds 2^48 elements");
  if (p.V > kMaxElems / p.d) fail("W (V x d = ", p.V, " x ", p.d, ") exceeds 2^48 elements");
}

void validate_labels(const LmHeadProblem& p, const int64_t* y) {
  validate(p);
  if (!y) fail("y (null) must point to N (", p.N, ") labels");
  for (int64_t i = 0; i < p.N; ++i)
    if (y[i] != p.ignore_index && (y[i] < 0 || y[i] >= p.V))
      fail("y[", i, "] (", y[i], ") must be in [0, V) = [0, ", p.V, ") or equal ignore_index (", p.ignore_index, ")");
}

void validate_view2(const char* name, const int64_t* dim, const void* data, int64_t rows, const char* rows_name,
                    int64_t cols, const char* cols_name) {
  if (!data) fail(name, " (null) must point to data");
  if (dim[0] != rows) fail(name, ".dim[0] (", dim[0], ") must equal ", rows_name, " (", rows, ")");
  if (dim[1] != cols) fail(name, ".dim[1] (", dim[1], ") must equal ", cols_name, " (", cols, ")");
}

int64_t counted_rows(const LmHeadProblem& p, const int64_t* y) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.N; ++i) n += y[i] != p.ignore_index;
  return n;
}

double loss_weight(const LmHeadProblem& p, int64_t n_R) {
  if (p.reduction == Reduction::Sum) return 1.0;
  return n_R > 0 ? 1.0 / double(n_R) : 0.0;  // all ignored: L = 0, zero gradients (§10.3)
}

double lmhead_forward_flops(const LmHeadProblem& p) { return 2.0 * double(p.N) * double(p.V) * double(p.d); }
double lmhead_backward_flops(const LmHeadProblem& p) { return 2 * lmhead_forward_flops(p); }

std::string shape_string(const LmHeadProblem& p) {
  std::ostringstream os;
  os << "N=" << p.N << " d=" << p.d << " V=" << p.V << " eps=" << p.label_smoothing << " lambda=" << p.z_loss
     << " reduction=" << to_string(p.reduction) << " ignore_index=" << p.ignore_index;
  return os.str();
}

}  // namespace burstlab
