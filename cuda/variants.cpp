// cuda/variants.cpp — the variant table (variants.hpp) and dispatch over it.
#include "variants.hpp"

#include <algorithm>
#include <sstream>

#include "burstlab/error.hpp"

namespace burstlab::cuda {

namespace {

// Preference order: auto runs the first row that supports a call (at a d of its auto_d). v14 is
// auto's backward at d = 64 only: there it measured 0.958-1.108x v5, five runs by turns on one
// H200 (35 of 40 above 1; medians 1.001-1.034x); at d = 128 slower than v4
// (docs/performance-gpu.md). v5, and v6 (measured slower than
// v5 and v4 on every shape it runs), come after v4, whose calls they decline alike, so auto
// never runs them; they stay for study by name.
std::vector<VariantInfo> make_table() {
  const std::vector<Dtype> tc = {Dtype::BF16, Dtype::F16};
  const std::vector<Pass> all = {Pass::Forward, Pass::ForwardBlock, Pass::Backward, Pass::BackwardBlock};
  std::vector<VariantInfo> t;
  t.push_back({Variant::V14, "v14", "v14_bwd.cu, bwd_ss.cuh, bwd_ws.cuh",
               "v5 with dQ_part's bulk atomic add issued by a store thread per consumer warpgroup",
               {Pass::Backward}, tc, {64, 128}, 128, 31,
               /*block_sparse_forward=*/false, /*deterministic_indexed_keys=*/true, Determinism::Never,
               /*aligned_views=*/true, /*cc=*/90, "sm_90a", /*may_decline=*/true, /*auto_d=*/{64}});
  t.push_back({Variant::V4, "v4", "v4_fwd.cu, v4_bwd.cu, fwd_ws.cuh, tile_scheduler.cuh, tma.cuh, tma.cu, softmax.cuh",
               "v3's math warp-specialized: a TMA producer warp, an mbarrier ring, setmaxnreg consumers; "
               "persistent forward; one-pass backward with atomic dQ sums",
               all, tc, {64, 128}, 128, 31,
               /*block_sparse_forward=*/false, /*deterministic_indexed_keys=*/false, Determinism::OnRequest,
               /*aligned_views=*/true, /*cc=*/90, "sm_90a", /*may_decline=*/true, /*auto_d=*/{}});
  t.push_back({Variant::V6, "v6", "v6_bwd.cu, bwd_ws.cuh",
               "v5 at d = 64 with the two consumer warpgroups taking turns at the tensor cores "
               "(dQ_part one tile late through a ring of dS^T slots)",
               {Pass::Backward}, tc, {64}, 64, 31,
               /*block_sparse_forward=*/false, /*deterministic_indexed_keys=*/true, Determinism::Never,
               /*aligned_views=*/true, /*cc=*/90, "sm_90a", /*may_decline=*/true, /*auto_d=*/{}});
  t.push_back({Variant::V5, "v5", "v5_bwd.cu, bwd_ss.cuh, bwd_ws.cuh",
               "v4's one-pass backward with P^T and dS^T read from shared memory by dV's and dK's products",
               {Pass::Backward}, tc, {64, 128}, 128, 31,
               /*block_sparse_forward=*/false, /*deterministic_indexed_keys=*/true, Determinism::Never,
               /*aligned_views=*/true, /*cc=*/90, "sm_90a", /*may_decline=*/true, /*auto_d=*/{}});
  t.push_back({Variant::V3, "v3", "v3_fwd.cu, v3_bwd.cu, wgmma.cuh, wgmma_ops.inc",
               "Hopper warpgroup MMA (wgmma) with cp.async loads; two-pass backward",
               {Pass::Forward, Pass::ForwardBlock, Pass::Backward}, tc, {64, 128}, 128, 31,
               true, true, Determinism::Always, true, 90, "sm_90a", false, {}});
  t.push_back({Variant::V2, "v2", "v2_fwd.cu, v2_bwd.cu, mma.cuh",
               "mma.sync tensor cores, FlashAttention-2 style; two-pass backward",
               {Pass::Forward, Pass::ForwardBlock, Pass::Backward}, tc, {64, 128}, 128, 31,
               true, true, Determinism::Always, true, 0, "", false, {}});
  t.push_back({Variant::V1, "v1", "v1.cu",
               "plain CUDA cores, a warp per row, no atomics: the baseline and the fallback",
               all, {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16}, {}, 1024, 63,
               true, true, Determinism::Always, false, 0, "", false, {}});
  return t;
}

template <class X>
bool has(const std::vector<X>& xs, X x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

std::string d_rule(const VariantInfo& v) {
  std::ostringstream os;
  if (v.d_values.empty()) {
    os << "d <= " << v.d_max;
  } else {
    os << "d in {";
    for (size_t i = 0; i < v.d_values.size(); ++i) os << (i ? ", " : "") << v.d_values[i];
    os << "}";
  }
  return os.str();
}

// Whether auto takes row v at head dimension d (its auto_d; empty: every d it runs).
bool auto_takes(const VariantInfo& v, int64_t d) { return v.auto_d.empty() || has(v.auto_d, d); }

std::string auto_d_rule(const VariantInfo& v) {
  std::string s;
  for (int64_t d : v.auto_d) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "d in {" + s + "}";
}

std::string dtype_rule(const VariantInfo& v, const char* sep) {
  std::string s;
  for (Dtype t : v.dtypes) s += (s.empty() ? "" : sep) + to_string(t);
  return s;
}

std::string cc_string(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

bool forward_pass(Pass p) { return p == Pass::Forward || p == Pass::ForwardBlock; }
bool block_pass(Pass p) { return p == Pass::ForwardBlock || p == Pass::BackwardBlock; }

}  // namespace

const char* to_string(Pass p) {
  switch (p) {
    case Pass::Forward: return "forward";
    case Pass::ForwardBlock: return "forward_block";
    case Pass::Backward: return "backward";
    case Pass::BackwardBlock: return "backward_block";
  }
  return "?";
}

const std::vector<VariantInfo>& variants() {
  static const std::vector<VariantInfo> t = make_table();
  return t;
}

const VariantInfo& variant_info(Variant v) {
  for (const VariantInfo& i : variants())
    if (i.id == v) return i;
  fail("variant (", static_cast<int>(v), ") must be one of ", variant_names());
}

std::vector<const VariantInfo*> variants_by_number() {
  std::vector<const VariantInfo*> r;
  for (const VariantInfo& i : variants()) r.push_back(&i);
  std::sort(r.begin(), r.end(), [](const VariantInfo* a, const VariantInfo* b) { return a->id < b->id; });
  return r;
}

std::string to_string(Variant v) {
  if (v == Variant::Auto) return "auto";
  for (const VariantInfo& i : variants())
    if (i.id == v) return i.name;
  return "v" + std::to_string(static_cast<int>(v)) + "?";
}

Variant parse_variant(const std::string& s) {
  if (s == "auto") return Variant::Auto;
  for (const VariantInfo& i : variants())
    if (s == i.name || s == i.name + 1) return i.id;  // "v4" or "4"
  fail("variant (", s, ") must be one of ", variant_names());
}

std::string variant_names() {
  std::string s = "auto";
  for (const VariantInfo* i : variants_by_number()) s += std::string(", ") + i->name;
  return s;
}

const char* aligned_view_rule(uintptr_t data, const int64_t* stride) {
  if (data % 16 != 0) return "16-byte aligned data";
  if (stride[3] != 1) return "unit stride along d";
  for (int a = 0; a < 3; ++a)
    if (stride[a] % 8 != 0) return "strides that are multiples of 8 elements";
  return nullptr;
}

bool runs_on(const VariantInfo& v, int cc, std::string* why) {
  if (v.cc == 0 || v.cc == cc) return true;
  if (why)
    *why = std::string(v.name) + " needs a compute capability " + cc_string(v.cc) + " GPU (" + v.arch +
           " code: H100/H200); " + (cc ? "this one is " + cc_string(cc) : std::string("no GPU found"));
  return false;
}

bool supports(const VariantInfo& v, const Call& c, int cc, std::string* why) {
  const auto no = [&](const std::string& s) {
    if (why) *why = v.name + s;
    return false;
  };
  if (!has(v.passes, c.pass)) return no(std::string(" has no ") + to_string(c.pass));
  if (!has(v.dtypes, c.dtype)) return no(" is " + dtype_rule(v, "/") + " only");
  if (v.d_values.empty() ? c.d < 1 || c.d > v.d_max : !has(v.d_values, c.d)) return no(" needs " + d_rule(v));
  if (v.len_log2 < 63) {
    const int64_t lim = int64_t(1) << v.len_log2;
    const bool blk = block_pass(c.pass);
    if (c.N_q >= lim || c.N_k >= lim || (blk && (c.n_q >= lim || c.n_k >= lim)))
      return no(std::string(" needs N_q, N_k") + (blk ? ", q_pos.n, k_pos.n" : "") + " < 2^" +
                std::to_string(v.len_log2));
  }
  if (c.deterministic && v.determinism == Determinism::Never)
    return no(" has no deterministic mode (dQ's partial sums are added in a varying order)");
  if (c.pass == Pass::BackwardBlock && c.k_indexed && c.deterministic && !v.deterministic_indexed_keys)
    return no("'s deterministic backward_block needs contiguous key positions");
  if (v.aligned_views)
    for (const ViewDesc& x : c.views)
      if (const char* w = aligned_view_rule(x.data, x.stride)) return no(std::string(" needs ") + w + " (" + x.name + ")");
  if (!runs_on(v, cc, why)) return false;
  if (forward_pass(c.pass) && c.block_sparse && !v.block_sparse_forward)
    return no(" has no block-sparse masks in the forward");
  return true;
}

Variant choose_variant(const Call& c, int cc, Variant requested, std::string* passed_over) {
  if (requested != Variant::Auto) {
    const VariantInfo& v = variant_info(requested);
    std::string why;
    if (!supports(v, c, cc, &why)) fail("variant (", v.name, ") cannot run this ", to_string(c.pass), ": ", why);
    if (passed_over) passed_over->clear();
    return requested;
  }
  std::string skipped;
  for (const VariantInfo& v : variants()) {
    std::string why;
    if (supports(v, c, cc, &why)) {
      if (auto_takes(v, c.d)) {
        if (passed_over) *passed_over = skipped;
        return v.id;
      }
      why = std::string(v.name) + " is auto's choice at " + auto_d_rule(v) + " only (by name at d = " +
            std::to_string(c.d) + ")";
    }
    if (has(v.passes, c.pass)) skipped += (skipped.empty() ? "" : "; ") + why;  // rows without the pass: not candidates
  }
  fail("variant (auto): no variant runs this ", to_string(c.pass), ": ", skipped);
}

std::vector<Variant> launch_order(const Call& c, int cc, Variant requested) {
  std::vector<Variant> r = {choose_variant(c, cc, requested)};
  if (requested != Variant::Auto) return r;
  bool after = false;
  for (const VariantInfo& v : variants()) {
    if (after && supports(v, c, cc) && auto_takes(v, c.d)) r.push_back(v.id);
    after = after || v.id == r.front();
  }
  return r;
}

std::string capability_table() {
  std::ostringstream os;
  os << "| order | # | entry points | dtypes | d | lengths | block-sparse masks | indexed positions | "
        "backward bitwise repeatable | device | views |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  int order = 0;
  for (const VariantInfo& v : variants()) {
    std::string passes;
    for (Pass p : v.passes) passes += (passes.empty() ? "" : ", ") + std::string(to_string(p));
    const bool fwd = has(v.passes, Pass::Forward) || has(v.passes, Pass::ForwardBlock);
    const bool bwd = has(v.passes, Pass::Backward) || has(v.passes, Pass::BackwardBlock);
    const std::string blocks = v.block_sparse_forward || !fwd ? "yes" : bwd ? "backward only" : "no";
    const std::string indexed = has(v.passes, Pass::BackwardBlock) && !v.deterministic_indexed_keys
                                    ? "yes; `backward_block`'s keys: not with `deterministic`"
                                    : "yes";
    const std::string det = !bwd                                     ? "-"
                            : v.determinism == Determinism::Always    ? "always"
                            : v.determinism == Determinism::OnRequest ? "with `deterministic`"
                                                                      : "never";
    const std::string dev = v.cc ? "compute capability " + cc_string(v.cc) + " (" + v.arch + ")" : "any";
    std::string views = v.aligned_views ? "16-byte aligned, unit d-stride, other strides multiples of 8" : "any strides";
    if (v.may_decline) views += "; the copy engine must describe them (else auto runs the next row)";
    os << "| " << ++order << " | " << v.name << " | " << passes << " | " << dtype_rule(v, ", ") << " | "
       << (v.d_values.empty() ? "1.." + std::to_string(v.d_max) : d_rule(v).substr(5))
       << (v.auto_d.empty() ? "" : " (auto: " + auto_d_rule(v).substr(5) + ")") << " | "
       << (v.len_log2 < 63 ? "< 2^" + std::to_string(v.len_log2) : std::string("any")) << " | " << blocks << " | "
       << indexed << " | " << det << " | " << dev << " | " << views << " |\n";
  }
  return os.str();
}

}  // namespace burstlab::cuda
