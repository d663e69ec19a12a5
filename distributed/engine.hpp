// distributed/engine.hpp — the Engine: local block compute behind one interface (spec §7.3).
// Schedules call an Engine for every local computation and a Communicator for every transfer;
// they never know which engine (CPU now, CUDA later) or which transport runs underneath.
// Memory an engine computes on is allocated by the engine (host for the CPU engine, device for
// a CUDA engine); schedules only hold Buffer handles and strided views into them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab::dist {

// An engine-owned allocation of n elements of T.
template <class T>
struct Buffer {
  T* data = nullptr;
  int64_t n = 0;
  std::shared_ptr<void> hold;  // keeps the allocation alive
};

template <class T>
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;

  // ---- memory (engine memory; upload/download move data to and from host memory)
  virtual Buffer<T> alloc(int64_t n) = 0;  // contents unspecified
  virtual void fill(T* dst, int64_t n, T value) = 0;
  virtual void upload(T* dst, const T* host, int64_t n) = 0;
  virtual void download(T* host, const T* src, int64_t n) = 0;
  // Makes every earlier computation visible to the transport (a CUDA stream sync); CPU: no-op.
  virtual void synchronize() {}

  // ---- compute. Positions are GLOBAL (spec §6.1); `mask` is the compiled mask of the problem.
  // Partial forward of one block (§6.1): O (B, H_q, q.n, d), LSE (B, H_q, q.n) overwritten with
  // the result over keys k only (rows without a visible key: O = 0, LSE = -inf).
  virtual void forward_block(const Problem& p, const MaskData& mask, Positions q, Positions k,
                             View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                             View3<T> LSE) = 0;
  // (O, LSE) <- (O, LSE) (+) (O_part, LSE_part), eq. (4.5)-(4.7).
  virtual void merge(View4<T> O, View3<T> LSE, View4<const T> O_part, View3<const T> LSE_part) = 0;
  // eq. (5.1): D = rowsum(dO o O).
  virtual void compute_D(View4<const T> O, View4<const T> dO, View3<T> D) = 0;
  // Backward of one block (§6.2); ACCUMULATES into dQ (B, H_q, q.n, d) and dK, dV
  // (B, H_kv, k.n, d). LSE and D are the global row statistics.
  virtual void backward_block(const Problem& p, const MaskData& mask, Positions q, Positions k,
                              View4<const T> Q, View4<const T> K, View4<const T> V,
                              View4<const T> dO, View3<const T> LSE, View3<const T> D,
                              View4<T> dQ, View4<T> dK, View4<T> dV) = 0;
};

}  // namespace burstlab::dist
