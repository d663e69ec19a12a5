// reference/reference_footprint.cpp — see reference_footprint.hpp.
#include "reference_footprint.hpp"

#include <Eigen/Core>

namespace burstlab::reference {
namespace {

using Sizes = Elements;

template <class T>
int64_t packing(int64_t a, int64_t b, int64_t c) {
  return gemm_packing_bytes(int64_t(sizeof(T)), a, b, c, [](int64_t& kc, int64_t& mc, int64_t& nc) {
    Eigen::internal::computeProductBlockingSizes<T, T>(kc, mc, nc, Eigen::Index(1));
  });
}
// Eigen parallelizes a product itself when the region around it is serial: every thread counts.
MemPart packing_part(Dtype t, const Problem& p, int threads) {
  const int64_t n = std::max(threads, 1);
  const int64_t per = t == Dtype::F64 ? packing<double>(p.N_q, p.N_k, p.d) : packing<float>(p.N_q, p.N_k, p.d);
  return {"Eigen GEMM packing buffers x " + threads_text(n), bytes_mul(per, n)};
}

// forward<T>, per thread: P = S (N_q, N_k) and Ob (N_q, d).
int64_t fwd_per_thread(const Problem& p, int64_t s) {
  return bytes_mul(s, bytes_sum({bytes_prod({p.N_q, p.N_k}), bytes_prod({p.N_q, p.d})}));
}
// backward<T>, per thread: P and dS (N_q, N_k); dK_acc, dV_acc (N_k, d); dQb (N_q, d); D (N_q).
int64_t bwd_per_thread(const Problem& p, int64_t s) {
  return bytes_mul(s, bytes_sum({bytes_prod({2, p.N_q, p.N_k}), bytes_prod({2, p.N_k, p.d}), bytes_prod({p.N_q, p.d}), p.N_q}));
}
// forward_bounds (tolerance.cpp), per thread: row_facts' P and A (N_q, N_k), LSE and eta (N_q),
// empty (N_q bytes); o_bound_raw's |V| (N_k, d) and PV (N_q, d).
int64_t fwd_bounds_per_thread(const Problem& p) {
  return bytes_sum({bytes_mul(8, bytes_sum({bytes_prod({2, p.N_q, p.N_k}), bytes_prod({p.N_k, p.d}),
                                            bytes_prod({p.N_q, p.d}), bytes_prod({2, p.N_q})})),
                    p.N_q});
}
// backward_bounds, per thread: P, dP, |dO||V|^T, E, |dS|, W (N_q, N_k) (row_facts' A while P is
// made: fewer); |K|, |V|, three sums (N_k, d); |Q|, |dO|, |O|, boundO, bq and its two
// temporaries (N_q, d); LSE, eta (N_q); key_seen (N_k bytes), empty (N_q bytes).
int64_t bwd_bounds_per_thread(const Problem& p) {
  return bytes_sum({bytes_mul(8, bytes_sum({bytes_prod({6, p.N_q, p.N_k}), bytes_prod({5, p.N_k, p.d}),
                                            bytes_prod({7, p.N_q, p.d}), bytes_prod({2, p.N_q})})),
                    p.N_k, p.N_q});
}
MemPart O_LSE(const Problem& p, const char* what) {
  const Sizes z(p);
  return {what, bytes_mul(8, bytes_add(z.Eq, z.Er))};
}
MemPart grads(const Problem& p, const char* what) {
  const Sizes z(p);
  return {what, bytes_mul(8, bytes_add(z.Eq, bytes_mul(2, z.Ek)))};
}

}  // namespace

int64_t region_threads(const Problem& p, int64_t items, int threads) {
  // worth_threads: parallel only for items > 1 and B H_q N_q N_k d >= 2^16
  const bool parallel =
      items > 1 && double(p.B) * double(p.H_q) * double(p.N_q) * double(p.N_k) * double(p.d) >= 65536.0;
  return parallel ? std::max<int64_t>(1, std::min<int64_t>(threads, items)) : 1;
}

MemPart forward_workspace(const Problem& p, Dtype dtype, int threads) {
  return per_thread("forward S/P, N_q x N_k " + to_string(dtype) + " per (b, h)", fwd_per_thread(p, bytes_of(dtype)),
                    region_threads(p, bytes_mul(p.B, p.H_q), threads));
}
MemPart backward_workspace(const Problem& p, Dtype dtype, int threads) {
  return per_thread("backward P and dS, 2 N_q x N_k " + to_string(dtype) + " per (b, kv-head)",
                    bwd_per_thread(p, bytes_of(dtype)), region_threads(p, bytes_mul(p.B, p.H_kv), threads));
}
std::vector<MemPart> call_overhead(const Problem& p, Dtype dtype, int threads) {
  return {compiled_mask_part(p), packing_part(dtype, p, threads), small_allocations()};
}

std::vector<MemPart> oracle_kept(const Problem& p, bool backward) {
  const Sizes z(p);
  std::vector<MemPart> out = {{"the oracle's O, LSE and their §9 bounds in fp64", bytes_mul(16, bytes_add(z.Eq, z.Er))}};
  if (backward)
    out.push_back({"the oracle's dQ, dK, dV and their §9 bounds in fp64", bytes_mul(16, bytes_add(z.Eq, bytes_mul(2, z.Ek)))});
  return out;
}

std::vector<MemPart> forward_bounds_parts(const Problem& p, int threads) {
  std::vector<MemPart> parts = call_overhead(p, Dtype::F64, threads);
  parts.push_back(O_LSE(p, "the §9 bounds of O, LSE in fp64"));
  parts.push_back(per_thread("the §9 forward bounds hold 2 N_q x N_k fp64 per (b, h)", fwd_bounds_per_thread(p),
                             region_threads(p, bytes_mul(p.B, p.H_q), threads)));
  return parts;
}
std::vector<MemPart> backward_bounds_parts(const Problem& p, int threads) {
  std::vector<MemPart> parts = call_overhead(p, Dtype::F64, threads);
  parts.push_back(O_LSE(p, "the §9 bounds of O, LSE in fp64"));
  parts.push_back(grads(p, "the §9 bounds of dQ, dK, dV in fp64"));
  parts.push_back(per_thread("the §9 backward bounds hold 6 N_q x N_k fp64 per (b, kv-head)", bwd_bounds_per_thread(p),
                             region_threads(p, bytes_mul(p.B, p.H_kv), threads)));
  return parts;
}

MemNeed oracle_need(const Problem& p, bool backward, int threads) {
  const MemPart out = O_LSE(p, "the oracle's O, LSE in fp64");
  auto with = [&](std::vector<MemPart> parts, std::initializer_list<MemPart> more) {
    parts.insert(parts.end(), more.begin(), more.end());
    return parts;
  };
  const MemPart fwd = per_thread("reference<fp64> materializes S/P, N_q x N_k fp64 per (b, h)", fwd_per_thread(p, 8),
                                 region_threads(p, bytes_mul(p.B, p.H_q), threads));
  MemNeed n = make_need("the fp64 oracle's forward (reference<fp64>)", with(call_overhead(p, Dtype::F64, threads), {out, fwd}));
  n = peak_of(n, make_need("the fp64 oracle's §9 forward bounds", with(forward_bounds_parts(p, threads), {out})));
  if (backward) {
    const MemPart g = grads(p, "the oracle's dQ, dK, dV in fp64");
    const MemPart bwd = per_thread("reference<fp64> backward holds P and dS, 2 N_q x N_k fp64 per (b, kv-head)",
                                   bwd_per_thread(p, 8), region_threads(p, bytes_mul(p.B, p.H_kv), threads));
    n = peak_of(n, make_need("the fp64 oracle's backward (reference<fp64>)",
                             with(call_overhead(p, Dtype::F64, threads), {out, O_LSE(p, "the §9 bounds of O, LSE in fp64"), g, bwd})));
    n = peak_of(n, make_need("the fp64 oracle's §9 backward bounds", with(backward_bounds_parts(p, threads), {out, g})));
  }
  return n;
}

std::vector<MemPart> sampled_oracle_kept(const Problem& p, int64_t K, bool backward) {
  // RowOracle: O, dQ and their bounds (K, d), LSE and its bound (K); ColumnOracle: dK, dV and
  // their bounds (K, d); the sample's coordinates (3 int64 per row and column).
  const int64_t rows = bytes_mul(8, bytes_mul(K, bytes_sum({bytes_prod({backward ? 4 : 2, p.d}), 2 + 3})));
  const int64_t cols = backward ? bytes_mul(8, bytes_mul(K, bytes_sum({bytes_prod({4, p.d}), 3}))) : 0;
  return {{"the sampled rows' and columns' oracle and §9 bounds in fp64", bytes_add(rows, cols)}};
}

MemNeed sampled_oracle_need(const Problem& p, int64_t K, bool backward, int threads) {
  std::vector<MemPart> parts = sampled_oracle_kept(p, K, backward);
  // choose_sample: row_sees, key_seen (1 byte each), the key cover (int64, N_k + 1), the list of
  // rows or keys that see nothing (int64, up to N).
  parts.push_back({"the mask's visibility of every row and key",
                   bytes_sum({p.N_q, p.N_k, bytes_mul(8, p.N_k + 1), bytes_mul(8, std::max(p.N_q, p.N_k))})});
  parts.push_back(compiled_mask_part(p));
  // row_oracle: a row's visible keys (int64), S and P (fp64), N_k each, per thread.
  parts.push_back(per_thread("a sampled row's keys, logits and P, 3 N_k x 8 bytes", bytes_mul(24, p.N_k),
                             std::max<int64_t>(1, std::min<int64_t>(threads, K))));
  // column_oracle: D_i and sum |dO_ik||O_ik| of the run, fp64, for at most every q-head.
  if (backward) parts.push_back({"D of the run and its magnitude for the sampled columns' q-heads", bytes_mul(16, Sizes(p).Er)});
  parts.push_back(small_allocations());
  return make_need("the row-sampled fp64 oracle", parts);
}

std::vector<MemPart> lmhead_workspace(const LmHeadProblem& p, Dtype t) {
  // z (N, V) in T, and Eigen's dH, dW temporaries before they are stored.
  return {{"reference: the N x V logits", bytes_mul(bytes_of(t), bytes_mul(p.N, p.V))},
          {"reference: dH, dW temporaries", bytes_mul(bytes_of(t), bytes_mul(p.N + p.V, p.d))}};
}

MemNeed lmhead_oracle_need(const LmHeadProblem& p, bool backward) {
  const int64_t Nd = bytes_mul(p.N, p.d), Vd = bytes_mul(p.V, p.d);
  std::vector<MemPart> parts = {{"inputs H, W in fp64 and labels", bytes_mul(8, bytes_add(bytes_add(Nd, Vd), p.N))},
                                {"oracle: LSE and its bound", bytes_mul(16, p.N)},
                                {"oracle: the N x V fp64 logits", bytes_mul(8, bytes_mul(p.N, p.V))}};
  if (backward) {
    parts.push_back({"oracle: dH, dW and their bounds, fp64", bytes_mul(32, bytes_add(Nd, Vd))});
    parts.push_back({"oracle: Eigen's dH, dW temporaries", bytes_mul(8, bytes_add(Nd, Vd))});
  }
  return make_need("running the fp64 oracle", parts);
}

MemNeed lmhead_bounds_need(const LmHeadProblem& p, bool backward) {
  const int64_t Vd = bytes_mul(p.V, p.d), chunk = std::min<int64_t>(256, p.N);
  // z and a (chunk x V), and for the backward E and |dz|+ too; |W|, and for the backward two V x d sums.
  return make_need("computing the §10.8 bounds",
                   {{"bounds: (chunk x V) fp64 matrices", bytes_mul(backward ? 32 : 16, bytes_mul(chunk, p.V))},
                    {"bounds: |W| and the V x d sums", bytes_mul(backward ? 24 : 8, Vd)}});
}

}  // namespace burstlab::reference
