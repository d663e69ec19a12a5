// check/lmhead_case.hpp — case files of the fused LM head + cross-entropy (spec §10,
// docs/conformance.md). A case is a directory:
//   case.json   "format": "burstlab-lmhead-case", "version": 1, "name", "N", "d", "V",
//               "ignore_index", "label_smoothing", "z_loss", "reduction", "g" (the incoming dL),
//               "dtype", "values", "seed", "ignore_fraction", "backward"
//   h.npy (N, d) and w.npy (V, d) in dtype; y.npy (N) int64 labels ('<i8')
//   expected/   written by `burstlab oracle`: L.npy (a 0-d array), LSE.npy (N), dH.npy (N, d),
//               dW.npy (V, d), all fp64 (the oracle, spec §10.2-§10.4)
// A candidate is a directory with L.npy and LSE.npy, and dH.npy, dW.npy for backward cases, each
// in any float dtype (LSE and L as the candidate keeps them: fp32 for 16-bit storage); its dtype
// (whose §10.8 bound applies) is dH.npy's, else LSE.npy's, unless --dtype says otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/lmhead.hpp"
#include "burstlab/precision.hpp"
#include "case.hpp"  // CheckResult, TensorCheck
#include "lmhead_check.hpp"

namespace burstlab::check {

struct LmHeadCaseMeta {
  std::string name;
  LmHeadProblem p;
  double g = 1;               // incoming gradient of the backward
  Dtype dtype = Dtype::F32;   // of h.npy and w.npy
  Values values = Values::Normal;
  uint64_t seed = 1;
  double ignored = 0.1;       // fraction of labels drawn as ignore_index
  bool backward = true;
};

// true when dir/case.json names the format "burstlab-lmhead-case" (read strictly later).
bool is_lmhead_case(const std::string& dir);
std::string lmhead_case_json(const LmHeadCaseMeta& m);
// Strict: unknown, missing or mistyped fields and invalid problems (§10.6) throw Error naming
// `where` and the field.
LmHeadCaseMeta parse_lmhead_case_json(const std::string& text, const std::string& where);

struct LmHeadCaseData {
  LmHeadCaseMeta meta;
  LmHeadInputs in;  // rounded to meta.dtype, stored as double
};
LmHeadCaseData make_lmhead_case(const LmHeadCaseMeta& m);  // make_lmhead_inputs, deterministic in seed
void write_lmhead_case(const std::string& dir, const LmHeadCaseData& c);
LmHeadCaseData read_lmhead_case(const std::string& dir);  // shapes and labels checked against case.json

struct LmHeadExpected {
  double L = 0;
  std::vector<double> LSE;  // (N)
  Matrix<double> dH, dW;    // (N, d), (V, d); empty unless meta.backward
};
LmHeadExpected compute_lmhead_expected(const LmHeadCaseData& c);
void write_lmhead_expected(const std::string& dir, const LmHeadExpected& e);
LmHeadExpected read_lmhead_expected(const std::string& dir, const LmHeadCaseMeta& m);

struct LmHeadCandidate {
  Dtype dtype = Dtype::F32;
  double L = 0;
  std::vector<double> LSE;
  Matrix<double> dH, dW;
  bool has_L = false, has_LSE = false, has_dH = false, has_dW = false;
};
// Reads dir/{L,LSE,dH,dW}.npy; shapes are checked against the case. dtype: "" = from the files.
LmHeadCandidate read_lmhead_candidate(const std::string& dir, const LmHeadCaseMeta& m, const std::string& dtype);

// The §10.8 bounds for `dtype`, recomputed from the case's inputs and the expected LSE; tensors
// L, LSE (and dH, dW for backward cases); a missing file fails. r_W: the candidate's roundings of
// dW to its storage type (10.21).
CheckResult check_lmhead_candidate(const LmHeadCaseData& c, const LmHeadExpected& e, const LmHeadCandidate& cand,
                                   Dtype dtype, int max_list = 5, int64_t r_W = 1);

// The curated LM head suite (fixed seeds): V = 1, ragged N and V, V above a tile, every row
// ignored, label smoothing, z-loss, both reductions, logits ~1e4, ties, one row. quick: CI subset.
std::vector<LmHeadCaseMeta> lmhead_suite(bool quick, Dtype dtype);

}  // namespace burstlab::check
