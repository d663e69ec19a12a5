// reference/harness.hpp — what every check of a layer against the oracle needs (spec §9.4):
// seeded random inputs (never zeros; adversarial value modes), generated masks, poisoning, and
// the oracle's result with its per-element bounds. Tests, `burstlab run` and benchmarks share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/any_tensor.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "tolerance.hpp"

namespace burstlab {

// Value distributions (spec §9.5).
enum class Values {
  Normal,     // Q, K, V, dO ~ N(0, 1)
  Large,      // logits of magnitude >= 1e3: Q, K ~ N(0, 1) scaled so |scale q.k| reaches ~1e3+
  Ties,       // Q, K drawn from {-1, 0.5, 1} (exact in every dtype): many equal logits
  WideV,      // V, dO elements span 1e-6 .. 1e6 in magnitude (random sign)
};
std::string to_string(Values v);
Values parse_values(const std::string& s);  // "normal|large|ties|widev"
// The factor on Q's and K's N(0, 1) draws: c = 2 sqrt(1e3 / (|scale| sqrt(d))) for Large (with
// scale 0, the default scale's magnitude), 1 otherwise.
double qk_multiplier(const Problem& p, Values values);

// Generated inputs, already rounded to `dtype` and held exactly in its storage type (bf16_t,
// f16_t, float, double: any_tensor.hpp), so the oracle, reading them widened to fp64, sees exactly
// what the candidate sees. Q, dO (B, H_q, N_q, d); K, V (B, H_kv, N_k, d), in `layout`. A case
// file's or a caller's inputs may lie in another storage type that holds them exactly.
struct Inputs {
  Dtype dtype = Dtype::F64;
  AnyTensor4 Q, K, V, dO;
};
Inputs make_inputs(const Problem& p, Layout layout, Dtype dtype, uint64_t seed,
                   Values values = Values::Normal);
// The same inputs held in fp64 (for readers of Tensor4<double>), widened one tensor at a time.
Inputs as_fp64(Inputs in);

// Element-wise conversion (double -> T; an input of any storage type through its fp64 value),
// keeping the layout.
template <class T>
Tensor4<T> convert(const Tensor4<double>& x);
template <class T>
Tensor4<T> convert(const AnyTensor4& x) { return x.as<T>(); }
template <class T>
Tensor3<T> convert(const Tensor3<double>& x);
template <class T>
Tensor4<double> to_double(const Tensor4<T>& x);
template <class T>
Tensor3<double> to_double(const Tensor3<T>& x);

// Fills with NaN so that any element a layer forgets to write fails the comparison (spec §9.3).
template <class T>
void poison(Tensor4<T>& x);
template <class T>
void poison(Tensor3<T>& x);

// Mask kinds the tools and tests generate. `spec` is a '+'-joined list of:
//   none | causal | window:L,R (L or R may be -1) | document[:n_docs] | block[:BQxBK[@density]]
// Documents get random boundaries (some documents empty on the query or the key side, so fully
// masked rows exist); block masks get random bits with at least one all-zero block row when
// there are two or more block rows. Deterministic in `seed`. Throws Error naming "mask" on a bad
// spec, e.g. "mask (causl) has unknown part 'causl'; parts: none, causal, window:L,R, ...".
MaskSpec make_mask(const std::string& spec, int64_t N_q, int64_t N_k, uint64_t seed);

// The oracle (reference<double>) on the inputs, plus the bounds of §9 for a candidate of
// inputs.dtype. Inputs held narrower than fp64 are widened to fp64 copies first (the full oracle
// is for problems small enough for it). backward = false leaves the gradient tensors and bounds
// empty.
struct Oracle {
  Tensor4<double> O;        // (B, H_q, N_q, d)
  Tensor3<double> LSE;      // (B, H_q, N_q)
  Tensor4<double> dQ, dK, dV;
  ForwardBounds fwd;
  BackwardBounds bwd;
};
Oracle run_oracle(const Problem& p, const Inputs& in, bool backward);

// Compare a candidate's outputs (any T, any layout) with the oracle; one Metrics per tensor:
// O, LSE (forward) and dQ, dK, dV (when given, i.e. non-null).
template <class T>
std::vector<Metrics> check_forward(const Oracle& want, const Tensor4<T>& O, const Tensor3<T>& LSE);
template <class T>
std::vector<Metrics> check_backward(const Oracle& want, const Tensor4<T>& dQ,
                                    const Tensor4<T>& dK, const Tensor4<T>& dV);

}  // namespace burstlab
