// cuda/cuda_footprint.cpp — see cuda_footprint.hpp.
#include "cuda_footprint.hpp"

#include <algorithm>

namespace burstlab::cuda {
namespace {

int64_t acc_bytes(Dtype t) { return t == Dtype::F64 ? 8 : 4; }  // lse_t<T>: fp64 for double, else fp32

// v4_dq_acc_floats (v4_bwd.cu): B H_q d floats per query row, rows rounded up to 64-row tiles.
int64_t dq_acc_bytes(const Problem& p, int64_t n_q) {
  return bytes_mul(4, bytes_prod({p.B, p.H_q, (n_q + 63) / 64 * 64, p.d}));
}
bool needs_dq_acc(Variant v, bool deterministic) {
  return v == Variant::V5 || v == Variant::V6 || v == Variant::V14 || (v == Variant::V4 && !deterministic);
}

// The rows that may run the call: v itself, or for Auto every row that supports it on some
// device (the device's capability is not asked: the estimate holds on every GPU).
std::vector<Variant> candidates(const Problem& p, Dtype dtype, Pass pass, Variant v, bool deterministic) {
  if (v != Variant::Auto) return {v};
  const Call c = whole_call(p, dtype, pass, deterministic);
  std::vector<Variant> out;
  for (const VariantInfo& row : variants())
    if (supports(row, c, row.cc)) out.push_back(row.id);
  return out;
}

}  // namespace

Call whole_call(const Problem& p, Dtype dtype, Pass pass, bool deterministic) {
  Call c;
  c.pass = pass;
  c.dtype = dtype;
  c.d = p.d;
  c.N_q = c.n_q = p.N_q;
  c.N_k = c.n_k = p.N_k;
  c.block_sparse = has_block(p.mask);
  c.deterministic = deterministic;
  return c;
}

std::vector<MemPart> call_arguments(const Problem& p, Dtype dtype, bool backward) {
  const int64_t Eq = bytes_prod({p.B, p.H_q, p.N_q, p.d}), Ek = bytes_prod({p.B, p.H_kv, p.N_k, p.d});
  const int64_t s = bytes_of(dtype), n = backward ? 2 : 1;
  const std::string t = to_string(dtype);
  return {{std::string(backward ? "Q, O, dO, dQ" : "Q, O") + " in " + t + " on the device", bytes_mul(s, bytes_mul(2 * n, Eq)), true},
          {std::string(backward ? "K, V, dK, dV" : "K, V") + " in " + t + " on the device", bytes_mul(s, bytes_mul(2 * n, Ek)), true},
          {"LSE in the accumulator type on the device", bytes_mul(acc_bytes(dtype), bytes_prod({p.B, p.H_q, p.N_q})), true}};
}

std::vector<MemPart> forward_workspace(const Problem& p, Dtype, Variant) { return {compiled_mask_part(p, true)}; }

std::vector<MemPart> backward_workspace(const Problem& p, Dtype dtype, Variant v, bool deterministic) {
  std::vector<MemPart> parts = {compiled_mask_part(p, true),
                                {"D in the accumulator type on the device", bytes_mul(acc_bytes(dtype), bytes_prod({p.B, p.H_q, p.N_q})), true}};
  for (Variant row : candidates(p, dtype, Pass::Backward, v, deterministic))
    if (needs_dq_acc(row, deterministic)) {
      parts.push_back({"the fp32 dQ accumulator of " + to_string(row) + "'s one-pass backward", dq_acc_bytes(p, p.N_q), true});
      break;
    }
  return parts;
}

int64_t block_call_bytes(const Problem& p, int64_t n_q, Dtype dtype, Variant v, bool deterministic) {
  for (Variant row : candidates(p, dtype, Pass::BackwardBlock, v, deterministic))
    if (row == Variant::V4 && !deterministic) return dq_acc_bytes(p, n_q);
  return 0;
}

}  // namespace burstlab::cuda
