// burstlab/footprint.hpp — the words each layer's memory estimate is written in: a buffer (what it
// holds, its bytes, host or device), the buffers live together at one step of a run, and byte
// arithmetic that saturates instead of overflowing. Each layer says what it allocates in its own
// footprint file (reference/reference_footprint.hpp, cpu/cpu_footprint.hpp,
// cuda/cuda_footprint.hpp); the tool adds its own copies and compares the sum with what the
// machine has (tools/resources.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/storage.hpp"  // bytes_of

namespace burstlab {

// Counts saturate at kTooMany instead of overflowing int64 (which would be UB): such a problem
// needs "more than 9.2 EB" and is refused like any other that does not fit.
constexpr int64_t kTooMany = std::numeric_limits<int64_t>::max();
inline int64_t bytes_mul(int64_t a, int64_t b) {  // a, b >= 0
  if (a < 0 || b < 0) fail("byte count (", a, " x ", b, ") must not be negative");
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kTooMany : r;
}
inline int64_t bytes_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kTooMany : r;
}
inline int64_t bytes_sum(std::initializer_list<int64_t> xs) {
  int64_t s = 0;
  for (int64_t x : xs) s = bytes_add(s, x);
  return s;
}
inline int64_t bytes_prod(std::initializer_list<int64_t> xs) {
  int64_t s = 1;
  for (int64_t x : xs) s = bytes_mul(s, x);
  return s;
}
// SI units: "320.0 GB", "512 bytes", "more than 9.2 EB".
inline std::string format_bytes(int64_t bytes) {
  if (bytes == kTooMany) return "more than 9.2 EB";
  if (bytes < 1000) return std::to_string(bytes) + " bytes";
  static const char* units[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  double x = double(bytes) / 1000.0;
  int u = 0;
  while (x >= 999.95 && u < 5) {  // 999.95 would print as "1000.0"
    x /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", x, units[u]);
  return buf;
}

// Element counts of a problem's tensors: Eq = B H_q N_q d (Q, O, dO, dQ), Ek = B H_kv N_k d (K,
// V, dK, dV), Er = B H_q N_q (LSE, D).
struct Elements {
  int64_t Eq, Ek, Er;
  explicit Elements(const Problem& p)
      : Eq(bytes_prod({p.B, p.H_q, p.N_q, p.d})), Ek(bytes_prod({p.B, p.H_kv, p.N_k, p.d})), Er(bytes_prod({p.B, p.H_q, p.N_q})) {}
};

// One buffer, or buffers of one kind: what they hold and their bytes; device: in GPU memory.
struct MemPart {
  std::string what;
  int64_t bytes = 0;
  bool device = false;
};
// The peak of a run: the step at which it is reached, the parts live then (largest first), the
// sum of the host parts (bytes) and of the device parts (device_bytes).
struct MemNeed {
  std::string step;
  std::vector<MemPart> parts;
  int64_t bytes = 0;
  int64_t device_bytes = 0;
};
inline MemNeed make_need(std::string step, std::vector<MemPart> parts) {  // sorts the parts, sums them
  MemNeed n;
  n.step = std::move(step);
  parts.erase(std::remove_if(parts.begin(), parts.end(), [](const MemPart& x) { return x.bytes == 0; }), parts.end());
  std::stable_sort(parts.begin(), parts.end(), [](const MemPart& a, const MemPart& b) { return a.bytes > b.bytes; });
  for (const MemPart& x : parts) (x.device ? n.device_bytes : n.bytes) = bytes_add(x.device ? n.device_bytes : n.bytes, x.bytes);
  n.parts = std::move(parts);
  return n;
}
inline const MemNeed& peak_of(const MemNeed& a, const MemNeed& b) { return b.bytes > a.bytes ? b : a; }  // a on ties
// The largest of parts that are live one at a time (a pass, then its fetch, ...).
inline const MemPart& largest(const std::vector<MemPart>& ps) {
  return *std::max_element(ps.begin(), ps.end(), [](const MemPart& a, const MemPart& b) { return a.bytes < b.bytes; });
}
inline std::string threads_text(int64_t n) { return n == 1 ? "1 thread" : std::to_string(n) + " threads"; }
// "what, <per> per thread x <n> threads", bytes = per x threads.
inline MemPart per_thread(const std::string& what, int64_t per, int64_t threads) {
  return {what + ", " + format_bytes(per) + " per thread x " + threads_text(threads), bytes_mul(per, threads)};
}

// Closures, vector headers, malloc's rounding of many small blocks: a fixed allowance.
inline MemPart small_allocations() { return {"small allocations (closures, plans' headers)", 64 * 1024}; }

// compile_mask (mask.hpp), once per layer call: a RowDoc per query for a document mask, a copy
// of the block bitmap.
inline MemPart compiled_mask_part(const Problem& p, bool device = false) {
  int64_t b = static_cast<int64_t>(p.mask.block_mask.size());
  if (has_document(p.mask)) b = bytes_add(b, bytes_mul(p.N_q, int64_t(sizeof(RowDoc))));
  return {device ? "the mask on the device (document rows, block bits)" : "compiled mask (per layer call)", b, device};
}

// Eigen's GEMM packs a kc x mc block of the left operand and a kc x nc block of the right one
// (gemm_blocking_space; on the heap above 128 KiB), sized by computeProductBlockingSizes from the
// cache sizes of this machine. The largest over the products of a step: every product there
// multiplies two of (a, b, c) over the third, either way round. blocking(kc, mc, nc) is
// Eigen::internal::computeProductBlockingSizes<T, T> of the layer that links Eigen.
template <class Blocking>
int64_t gemm_packing_bytes(int64_t elem_bytes, int64_t a, int64_t b, int64_t c, Blocking blocking) {
  const int64_t dims[3] = {a, b, c};
  int64_t most = 0;
  for (int k = 0; k < 3; ++k)
    for (int m = 0; m < 3; ++m) {
      if (m == k) continue;
      int64_t kc = dims[k], mc = dims[m], nc = dims[3 - k - m];
      blocking(kc, mc, nc);
      most = std::max(most, bytes_mul(elem_bytes, bytes_add(bytes_mul(kc, mc), bytes_mul(kc, nc))));
    }
  return most;
}

}  // namespace burstlab
