// check/case.hpp — case files and the checker (docs/conformance.md).
// A case is a directory:
//   case.json                 metadata (shape, layout, dtype, scale, the full mask, seed, ...)
//   q.npy k.npy v.npy dO.npy  inputs in the case's dtype and layout: BHSD (B, H, N, d) or
//                             BSHD (B, N, H, d); q/dO have H_q heads and N_q rows, k/v H_kv and N_k
//   expected/                 written by `burstlab oracle`: O dQ dK dV (layout as the inputs),
//                             LSE (B, H_q, N_q), all fp64 (the oracle, spec §2, §5)
// A candidate is a directory with O.npy and optionally LSE.npy, dQ.npy, dK.npy, dV.npy, in the
// case's layout, in its own dtype, plus an optional candidate.json stating its conventions.
// The checker converts those conventions into the spec's (natural-log LSE, -inf on empty rows,
// §2.3) and compares with the §9 rule for the candidate's dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "harness.hpp"
#include "tolerance.hpp"

namespace burstlab::check {

struct CaseMeta {
  std::string name;
  Problem p;                     // shape, scale (always explicit in the file), full mask
  Layout layout = Layout::BHSD;  // of q, k, v, dO and of O, dQ, dK, dV
  Dtype dtype = Dtype::F32;      // of the input files; the candidate reads them as they are
  Values values = Values::Normal;
  uint64_t seed = 1;
  std::string mask_spec;         // how the mask was generated (make_mask grammar); informative
  bool backward = true;          // dO.npy present; the oracle writes dQ, dK, dV
};

// JSON text of the metadata, and its strict parser: unknown keys, missing keys, wrong types and
// invalid problems (validate(), spec §1.4) throw Error naming `where` (the file) and the field.
std::string case_json(const CaseMeta& m);
CaseMeta parse_case_json(const std::string& text, const std::string& where);
// The "mask" object of case.json alone (the MaskSpec fields of spec §3, every one required), and
// its strict parser (errors name `where` and the field). Sizes are checked later by validate().
std::string mask_json(const MaskSpec& m);
MaskSpec parse_mask_json(const std::string& text, const std::string& where);

struct CaseData {
  CaseMeta meta;
  Inputs in;  // rounded to meta.dtype, held in fp64, in meta.layout
};

// Generates the inputs of a case from its metadata (make_inputs, deterministic in seed).
CaseData make_case(const CaseMeta& m);
void write_case(const std::string& dir, const CaseData& c);  // creates dir
// Validates shapes against case.json and the values (require_valid_inputs, spec §1.4).
CaseData read_case(const std::string& dir);

// spec §1.4, the inputs' values, checked before any computing. Every element of Q, K, V (and dO
// when `backward`) finite: otherwise Error "<where>: q.npy holds nan at (b=0, h=1, i=5, k=3)"
// (`names`: the four tensors' names, e.g. {"q.npy", "k.npy", "v.npy", "dO.npy"}). And the logits
// representable in fp64: max(1, |scale|) * max over (b, h) of sum_k max_i |Q_ik| max_j |K_jk|
// (a bound of eq. 9.1's a_i over every row; the oracle forms Q K^T before scaling) at most
// kMaxLogit; otherwise Error naming the bound and the largest |scale| these inputs allow.
// `scale_name` is how the caller's user sets the scale ("--scale", "case.json's scale").
constexpr double kMaxLogit = 8.98846567431158e307;  // DBL_MAX / 2: a difference of two logits is finite too
void require_valid_inputs(const Problem& p, const Inputs& in, bool backward, const std::string& where,
                          const char* const names[4], const std::string& scale_name);
// The bound above, for messages and tests.
double logit_bound(const Problem& p, const Inputs& in);

// The oracle's own results must be finite where the spec defines them (every O, dQ, dK, dV, an
// LSE but -inf on empty rows, every §9 bound): Error naming the tensor, the first coordinates and
// the value otherwise (inputs too large for the rule's fp64 arithmetic), never a silent NaN that
// judges nothing. `what` names the step ("the fp64 oracle", "the check's §9 bounds").
void require_finite_oracle(const Problem& p, const Oracle& o, bool backward, const std::string& what,
                           const std::string& scale_name);
void require_finite_bounds(const Problem& p, const ForwardBounds* fb, const BackwardBounds* bb, const std::string& what,
                           const std::string& scale_name);

// Expected outputs in fp64 (the oracle on the case's inputs).
struct Expected {
  Tensor4<double> O;    // (B, H_q, N_q, d)
  Tensor3<double> LSE;  // (B, H_q, N_q)
  Tensor4<double> dQ, dK, dV;  // empty unless meta.backward
};
Expected compute_expected(const CaseData& c);
void write_expected(const std::string& dir, const CaseData& c, const Expected& e);  // dir/expected/
Expected read_expected(const std::string& dir, const CaseMeta& m);
bool has_expected(const std::string& dir);

// How a candidate writes LSE (spec §2.3: other systems differ; the checker converts).
struct Conventions {
  bool empty_lse_pos_inf = false;  // empty rows hold +inf instead of -inf
  bool lse_log2 = false;           // LSE in log2 units (log2 sum 2^(S log2 e)); natural = log2 * ln 2
};
// Parses candidate.json: {"lse_empty": "-inf"|"+inf", "lse_base": "e"|"2", "dtype": "...",
// "layout": "BHSD"|"BSHD"} (every key optional, no other key allowed).
struct CandidateMeta {
  Conventions conv;
  std::string dtype;   // "" = from O.npy
  std::string layout;  // "" = the case's
};
CandidateMeta parse_candidate_json(const std::string& text, const std::string& where);

struct Candidate {
  Dtype dtype = Dtype::F32;  // O.npy's element type unless overridden
  Layout layout = Layout::BHSD;
  Tensor4<double> O, dQ, dK, dV;  // empty when absent
  Tensor3<double> LSE;            // empty when absent; already converted to the spec's convention
  bool has_O = false, has_LSE = false, has_dQ = false, has_dK = false, has_dV = false;
};
// Reads dir/{O,LSE,dQ,dK,dV}.npy (+ candidate.json); shapes are checked against the case.
Candidate read_candidate(const std::string& dir, const CaseMeta& m, const CandidateMeta& over);
// Applies the conventions to an LSE tensor in place (+inf -> -inf, log2 -> natural).
void convert_lse(Tensor3<double>& LSE, const Conventions& conv);

// One listed mismatch as numbers: coordinates (b, h, i|j, k), or (b, h, i) for LSE (rank 3).
struct Mismatch {
  int64_t index[4] = {0, 0, 0, 0};
  int rank = 4;
  double got = 0, want = 0, bound = 0;
};
// One tensor's verdict: the §9.3 metrics plus the first mismatches with coordinates.
struct TensorCheck {
  Metrics m;
  std::vector<std::string> mismatches;  // "(b=0, h=1, i=7, k=3): got .. want .. bound .." (<= max_list)
  std::vector<Mismatch> where;          // the same mismatches, as numbers
  bool missing = false;                 // the candidate has no such file: counts as a failure
  bool pass() const { return !missing && m.pass(); }
};
struct CheckResult {
  std::string case_name;
  Dtype dtype = Dtype::F32;  // the precision whose bound was applied
  std::vector<TensorCheck> tensors;
  bool pass() const;
  double worst_err_bound() const;  // inf when a tensor is missing
};
// Bounds (eq. 9.3-9.9) are recomputed for `dtype` from the case's inputs and the oracle's O, LSE.
// Tensors the candidate lacks are reported missing (LSE and, for backward cases, dQ dK dV).
// require_backward = false skips the gradients when the candidate wrote none of them.
CheckResult check_candidate(const CaseData& c, const Expected& e, const Candidate& cand, Dtype dtype,
                            int max_list = 5);

// Human-readable table (one row per tensor, then the mismatch lines) and JSON text.
std::string format_check(const CheckResult& r);
std::string check_json(const CheckResult& r);  // one JSON object

// The curated conformance suite (deterministic seeds): every mask kind, GQA/MQA, ragged,
// N_q != N_k both ways, fully masked rows, large logits, ties, d in {1, 3, 64, 128} (and 256 in
// the full set), BSHD and BHSD. quick: a subset for CI.
std::vector<CaseMeta> suite(bool quick, Dtype dtype);

}  // namespace burstlab::check
