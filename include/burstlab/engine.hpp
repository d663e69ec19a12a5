// burstlab/engine.hpp — the Engine: a layer's local block compute behind one interface
// (spec §7.3). Distributed schedules call an Engine for every local computation and memory
// operation and a Communicator for every transfer; they never know which engine runs (cpu/
// provides one over host memory, cuda/ one over device memory).
//
// Types (spec §9.1): T stores Q, K, V, O, dO (fp64, fp32, bf16_t, f16_t); A = acc_t<T> holds
// what must not be rounded to 16 bits between steps: LSE, D and the partial gradients dQ, dK, dV.
// Memory: every pointer an engine takes is in engine memory (allocated by it) unless named
// `host`. Between the first upload and the last download, a schedule touches engine memory
// only through engine calls (copy, fill, add, merge) and the transport.
// Ordering: engine calls issued by one thread run in issue order; synchronize() makes them
// visible to the transport (a CUDA stream sync; the CPU engine runs calls to completion).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/storage.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

// An engine-owned allocation of n elements of U.
template <class U>
struct Buffer {
  U* data = nullptr;
  int64_t n = 0;
  std::shared_ptr<void> hold;  // keeps the allocation alive
};

// A compiled mask (compile_mask) placed in engine memory once per problem: params' doc and
// block arrays point into engine memory; every block call of the problem reuses it.
struct PreparedMask {
  MaskParams params;
  std::shared_ptr<void> hold;
};

template <class T>
class Engine {
 public:
  using A = acc_t<T>;
  virtual ~Engine() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"

  // ---- memory, in bytes or in elements of a named dtype (typed wrappers below)
  virtual std::shared_ptr<void> allocate(int64_t bytes) = 0;  // contents unspecified
  virtual void upload(void* dst, const void* host, int64_t bytes) = 0;
  virtual void download(void* host, const void* src, int64_t bytes) = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  // `rows` copies of `bytes` each, row i from src + i src_pitch to dst + i dst_pitch (pitches in
  // bytes, >= bytes; the rows do not overlap): the (b, h) row blocks of a collective in one call,
  // where a GPU engine pays a launch per copy. The default copies row by row.
  virtual void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t bytes,
                         int64_t rows) {
    for (int64_t i = 0; i < rows; ++i)
      copy(static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch, bytes);
  }
  virtual void fill(void* dst, int64_t n, Dtype t, double value) = 0;  // value rounded to t
  // acc[i] += in[i] for i < n, elementwise in dtype t (a sum in a fixed order is a sequence of
  // add calls: bitwise reproducible).
  virtual void add(void* acc, const void* in, int64_t n, Dtype t) = 0;
  // Every earlier call of this thread has completed (its results are readable by the transport
  // and by other threads).
  virtual void synchronize() {}

  // ---- the mask, once per problem
  virtual PreparedMask prepare(const MaskData& mask) = 0;

  // ---- compute over GLOBAL positions (spec §6.1)
  // Forward of one block: Q (B, H_q, q.n, d); K, V (B, H_kv, k.n, d). accumulate = false:
  // O (B, H_q, q.n, d), LSE (B, H_q, q.n) get the partial over keys k (rows without a visible
  // key: (0, -inf), the merge identity). accumulate = true: the partial is merged into the
  // (O, LSE) already there, eq. (4.5)-(4.7).
  virtual void forward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k,
                             View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                             View3<A> LSE, bool accumulate) = 0;
  // (O, LSE) <- (O, LSE) (+) (O_part, LSE_part), eq. (4.5)-(4.7). O (B, H, n, d), LSE (B, H, n).
  virtual void merge(View4<T> O, View3<A> LSE, View4<const T> O_part, View3<const A> LSE_part) = 0;
  // eq. (5.1): D = rowsum(dO o O). O, dO (B, H_q, n, d) -> D (B, H_q, n).
  virtual void compute_D(View4<const T> O, View4<const T> dO, View3<A> D) = 0;
  // Backward of one block (§6.2) with the GLOBAL LSE and D of the rows; ACCUMULATES into
  // dQ (B, H_q, q.n, d) and dK, dV (B, H_kv, k.n, d) (group-summed), so blocks compose by addition.
  virtual void backward_block(const Problem& p, const PreparedMask& mask, Positions q, Positions k,
                              View4<const T> Q, View4<const T> K, View4<const T> V,
                              View4<const T> dO, View3<const A> LSE, View3<const A> D,
                              View4<A> dQ, View4<A> dK, View4<A> dV) = 0;
};

// ---- typed memory helpers (the only way schedules name element types)
template <class U, class T>
Buffer<U> alloc(Engine<T>& e, int64_t n) {
  Buffer<U> b;
  b.hold = e.allocate(static_cast<int64_t>(sizeof(U)) * (n > 0 ? n : 1));
  b.data = static_cast<U*>(b.hold.get());
  b.n = n;
  return b;
}
// b holds n elements afterwards (reallocated only when absent or of another size).
template <class U, class T>
void ensure(Engine<T>& e, Buffer<U>& b, int64_t n) {
  if (!b.data || b.n != n) b = alloc<U>(e, n);
}
template <class U, class T>
void fill(Engine<T>& e, U* dst, int64_t n, double value) {
  e.fill(dst, n, dtype_of<U>(), value);
}
template <class U, class T>
void copy(Engine<T>& e, U* dst, const U* src, int64_t n) {
  e.copy(dst, src, n * static_cast<int64_t>(sizeof(U)));
}
template <class U, class T>
void add(Engine<T>& e, U* acc, const U* in, int64_t n) {
  e.add(acc, in, n, dtype_of<U>());
}
template <class U, class T>
void upload(Engine<T>& e, U* dst, const U* host, int64_t n) {
  e.upload(dst, host, n * static_cast<int64_t>(sizeof(U)));
}
template <class U, class T>
void download(Engine<T>& e, U* host, const U* src, int64_t n) {
  e.download(host, src, n * static_cast<int64_t>(sizeof(U)));
}

}  // namespace burstlab
