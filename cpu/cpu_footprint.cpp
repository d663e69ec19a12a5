// cpu/cpu_footprint.cpp — see cpu_footprint.hpp.
#include "cpu_footprint.hpp"

#include <algorithm>
#include <string>

#include <Eigen/Core>

namespace burstlab::cpu {
namespace {

Tiles clamp(const Problem& p, Tiles t) { return {std::min(t.Br, p.N_q), std::min(t.Bc, p.N_k)}; }

// Scratch (cpu.cpp), per thread: qs, qbuf, dob (Br, d); kb, vb (Bc, d); s, dp (Br, Bc); acc
// (max(Br, Bc), d); acc2 (Bc, d); m, l, L, Dr (Br); vis (Br x Bc bytes); 64 bytes of alignment
// slack per buffer.
int64_t scratch_bytes(const Problem& p, Tiles t, int64_t s) {
  const int64_t d = p.d;
  return bytes_sum({bytes_mul(s, bytes_sum({bytes_prod({3, t.Br, d}), bytes_prod({3, t.Bc, d}), bytes_prod({2, t.Br, t.Bc}),
                                            bytes_prod({std::max(t.Br, t.Bc), d}), bytes_prod({4, t.Br})})),
                    bytes_prod({t.Br, t.Bc}), 14 * 64});
}
// Plan: lo, hi, brow (N_q); kpos, bcol (N_k); six per query tile, two per key tile; int64 each.
int64_t plan_bytes(const Problem& p, Tiles t) {
  const int64_t n_qt = (p.N_q + t.Br - 1) / t.Br, n_kt = (p.N_k + t.Bc - 1) / t.Bc;
  return bytes_mul(8, bytes_sum({bytes_prod({3, p.N_q}), bytes_prod({2, p.N_k}), bytes_prod({6, n_qt}), bytes_prod({2, n_kt})}));
}
template <class T>
int64_t packing_bytes(int64_t a, int64_t b, int64_t c) {
  return gemm_packing_bytes(int64_t(sizeof(T)), a, b, c, [](int64_t& kc, int64_t& mc, int64_t& nc) {
    Eigen::internal::computeProductBlockingSizes<T, T>(kc, mc, nc, Eigen::Index(1));
  });
}
int64_t packing_per_thread(const Problem& p, Dtype dtype, Tiles t) {
  return dtype == Dtype::F64 ? packing_bytes<double>(t.Br, t.Bc, p.d) : packing_bytes<float>(t.Br, t.Bc, p.d);
}
std::string tiles_text(Tiles t) { return "(Br " + std::to_string(t.Br) + " x Bc " + std::to_string(t.Bc) + " tiles)"; }

}  // namespace

MemPart forward_workspace(const Problem& p, Dtype dtype, Tiles tiles, int threads) {
  const Tiles t = clamp(p, tiles);
  const int64_t T = std::max(threads, 1);  // `omp parallel` without `if`: every thread makes its Scratch
  return {"forward per-thread tiles " + tiles_text(t) + " x " + threads_text(T) + " and the mask plan",
          bytes_sum({bytes_mul(T, scratch_bytes(p, t, bytes_of(dtype))), plan_bytes(p, t), compiled_mask_part(p).bytes})};
}

MemPart backward_workspace(const Problem& p, Dtype dtype, Tiles tiles, int threads) {
  const Tiles t = clamp(p, tiles);
  const MemPart fwd = forward_workspace(p, dtype, tiles, threads);
  return {"backward D and per-thread tiles " + tiles_text(t) + " x " + threads_text(std::max(threads, 1)),
          bytes_add(fwd.bytes, bytes_mul(bytes_of(dtype), bytes_prod({p.B, p.H_q, p.N_q})))};
}

MemPart packing(const Problem& p, Dtype dtype, Tiles tiles, int threads) {
  const int64_t T = std::max(threads, 1);
  return {"Eigen GEMM packing buffers x " + threads_text(T), bytes_mul(packing_per_thread(p, dtype, clamp(p, tiles)), T)};
}

int64_t block_call_bytes(const Problem& p, Dtype dtype, Tiles tiles, int threads) {
  const Tiles t = clamp(p, tiles);
  return bytes_mul(std::max(threads, 1), bytes_add(scratch_bytes(p, t, bytes_of(dtype)), packing_per_thread(p, dtype, t)));
}

}  // namespace burstlab::cpu
