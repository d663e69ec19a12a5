// cuda/variants.hpp — the numbered CUDA attention variants as one table (cuda/README.md).
// Each row says what a variant runs: entry points, dtypes, d, lengths, masks, positions,
// determinism, device and view rules. `auto` runs the first row, in preference order, that
// supports a call; an explicit variant that cannot run a call is an Error naming it and why.
// Everything here is host C++ without CUDA headers: dispatch is a function of a call's
// description and a compute capability, so it is tested without a GPU
// (tests/cuda/test_cuda_variants.cpp). The launchers, one case per variant and entry point, are
// in api.cu. Adding a variant: a row in variants.cpp, an enum value below, its launcher cases.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/precision.hpp"  // Dtype

namespace burstlab::cuda {

// A variant's number; numbers are never reused (7 to 13 and 15 to 17 were ideas measured and dropped:
// cuda/README.md). Auto: the first in preference order that supports the call.
enum class Variant { Auto = 0, V1 = 1, V2 = 2, V3 = 3, V4 = 4, V5 = 5, V6 = 6, V14 = 14 };

// The entry points of cuda.hpp a variant may implement.
enum class Pass { Forward, ForwardBlock, Backward, BackwardBlock };
const char* to_string(Pass p);  // "forward", "forward_block", "backward", "backward_block"

// A view as dispatch sees it: its name in messages, where its data starts and its strides in
// elements, (B, H, N, d) order.
struct ViewDesc {
  const char* name;
  uintptr_t data;
  int64_t stride[4];
};

// Everything dispatch decides on, read on the host (no device memory).
struct Call {
  Pass pass = Pass::Forward;
  Dtype dtype = Dtype::F32;  // storage
  int64_t d = 0;
  int64_t N_q = 0, N_k = 0;  // the problem's lengths
  int64_t n_q = 0, n_k = 0;  // this call's rows and keys: q_pos.n, k_pos.n (N_q, N_k for whole calls)
  bool block_sparse = false;  // the mask has a block-sparse part
  bool q_indexed = false, k_indexed = false;  // Positions::index set
  bool deterministic = false;                 // Options::deterministic
  std::vector<ViewDesc> views;                // every view the kernels read or write
};

// A backward that is bitwise repeatable always, when Options::deterministic asks for it, or never
// (a call with Options::deterministic is not one it supports: auto runs the next row).
enum class Determinism { Always, OnRequest, Never };

struct VariantInfo {
  Variant id;
  const char* name;     // "v4": Options::variant, --variant, `burstlab run --impl cuda-v4`
  const char* files;    // its sources in cuda/
  const char* summary;  // one line: --help of the impls, README
  std::vector<Pass> passes;
  std::vector<Dtype> dtypes;
  std::vector<int64_t> d_values;  // empty: any d in [1, d_max]
  int64_t d_max;
  int len_log2;  // N_q, N_k, q_pos.n, k_pos.n < 2^len_log2 (63: no limit)
  bool block_sparse_forward;        // forward / forward_block with a block-sparse mask
  bool deterministic_indexed_keys;  // backward_block with indexed k_pos when deterministic
  Determinism determinism;          // of its backward passes
  bool aligned_views;  // every view: 16-byte aligned data, unit d-stride, other strides multiples of 8
  int cc;              // 0: any device; else exactly this compute capability (10 major + minor)
  const char* arch;    // the code it is compiled to when cc is set ("sm_90a")
  bool may_decline;    // its launcher may refuse what the host rules admit (v4: views the copy
                       // engine cannot describe, more than 2^30 query tiles): auto then runs
                       // the next supporting variant
  std::vector<int64_t> auto_d;  // the d at which auto takes it (empty: every d it runs); at the
                                // others it runs by name only (measured slower than a later row)
};

// The table in preference order (fastest first; the last supports every call the layer takes).
const std::vector<VariantInfo>& variants();
// The row of v (not Auto); throws Error naming "variant" for a number not in the table.
const VariantInfo& variant_info(Variant v);
// The table's rows in number order (names, README, sweeps).
std::vector<const VariantInfo*> variants_by_number();

std::string to_string(Variant v);             // "auto", "v1", ...
Variant parse_variant(const std::string& s);  // "auto", "v4" or "4"; throws Error naming "variant"
std::string variant_names();                  // "auto, v1, v2, v3, v4, v5, v6, v14"

// The tensor-core variants' rule for one view: nullptr when it holds, else what is missing
// ("16-byte aligned data", "unit stride along d", "strides that are multiples of 8 elements").
const char* aligned_view_rule(uintptr_t data, const int64_t* stride);

// Whether v runs on a device of compute capability cc (0: no device) at all; why not in *why.
bool runs_on(const VariantInfo& v, int cc, std::string* why = nullptr);
// Whether v runs call c on a device of compute capability cc; says why not in *why
// ("v2 needs d in {64, 128}").
bool supports(const VariantInfo& v, const Call& c, int cc, std::string* why = nullptr);

// The variant that runs c: `requested` when it supports c (else Error "variant (v3) cannot run
// this backward: ..."); for Auto the first row that supports c, and in *passed_over why each row
// before it that has c's entry point did not ("v4 needs ...; v3 needs ...", empty when the first row runs it).
Variant choose_variant(const Call& c, int cc, Variant requested, std::string* passed_over = nullptr);
// What to launch, in order, until a launcher accepts: {requested} (checked as choose_variant
// does), or for Auto every supporting row in preference order (rows after the first are run
// only when one that may_decline declines).
std::vector<Variant> launch_order(const Call& c, int cc, Variant requested);

// The README's capability table (markdown; cuda/README.md holds it verbatim).
std::string capability_table();

}  // namespace burstlab::cuda
