// cuda/detail.cuh — internals shared by the kernel variants: the device's element types, kernel
// arguments, dtype conversions, warp reductions. Not installed; include only from cuda/*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "burstlab/env.hpp"  // the tuning knobs (BURSTLAB_V*_CFG ...), read once each into a static
#include "burstlab/lmhead.hpp"
#include "burstlab/merge.hpp"
#include "cuda.hpp"

namespace burstlab::cuda::detail {

// ---- the device's element types
// The entry points take the contract's storage types (storage.hpp); the kernels compute on CUDA's
// types with the same bits. device_t<T> maps one onto the other (double and float map to
// themselves), and as_device is the one place a pointer or view changes its element type.
using bf16 = __nv_bfloat16;
using f16 = __half;
template <class T> struct Device { using type = T; };
template <> struct Device<bf16_t> { using type = bf16; };
template <> struct Device<f16_t> { using type = f16; };
template <class T> struct Device<const T> { using type = const typename Device<T>::type; };
template <class T> using device_t = typename Device<T>::type;
static_assert(sizeof(bf16_t) == sizeof(bf16) && alignof(bf16_t) == alignof(bf16), "bf16_t has bf16's bits");
static_assert(sizeof(f16_t) == sizeof(f16) && alignof(f16_t) == alignof(f16), "f16_t has f16's bits");

template <class T> device_t<T>* as_device(T* p) { return reinterpret_cast<device_t<T>*>(p); }
template <class T> View4<device_t<T>> as_device(const View4<T>& v) {
  View4<device_t<T>> r;
  r.data = as_device(v.data);
  for (int a = 0; a < 4; ++a) { r.dim[a] = v.dim[a]; r.stride[a] = v.stride[a]; }
  return r;
}
template <class T> View2<device_t<T>> as_device(const View2<T>& v) {
  View2<device_t<T>> r;
  r.data = as_device(v.data);
  for (int a = 0; a < 2; ++a) { r.dim[a] = v.dim[a]; r.stride[a] = v.stride[a]; }
  return r;
}

// Arguments of a forward launch (whole problem or block; spec §6.1). Q/K/V/O are LOCAL views
// (n = q_pos.n / k_pos.n rows); positions and mask are global.
template <class T>
struct FwdArgs {
  using A = acc_t<T>;
  View4<const T> Q, K, V;  // (B, H_q, nq, d), (B, H_kv, nk, d) x2
  View4<T> O;              // (B, H_q, nq, d)
  View3<A> LSE;            // (B, H_q, nq)
  MaskParams mask;         // device arrays
  Positions qp, kp;        // global positions (index: device)
  int64_t B, Hq, Hkv, group, nq, nk, d;
  A scale;
  bool accumulate;         // fold into the running (O, LSE) with the merge (4.5)-(4.7)
};

// Arguments of a backward launch. G: gradient storage (T for the whole backward, A for blocks).
template <class T, class G>
struct BwdArgs {
  using A = acc_t<T>;
  View4<const T> Q, K, V, dO;
  View3<const A> LSE, D;
  View4<G> dQ, dK, dV;
  MaskParams mask;
  Positions qp, kp;
  int64_t B, Hq, Hkv, group, nq, nk, d;
  A scale;
  bool accumulate;         // += (backward_block) instead of =
};

// ---- dtype conversions (device)
template <class A> __device__ __forceinline__ A to_acc(double x) { return static_cast<A>(x); }
template <class A> __device__ __forceinline__ A to_acc(float x) { return static_cast<A>(x); }
template <class A> __device__ __forceinline__ A to_acc(bf16 x) { return static_cast<A>(__bfloat162float(x)); }
template <class A> __device__ __forceinline__ A to_acc(f16 x) { return static_cast<A>(__half2float(x)); }

template <class T> struct Store;
template <> struct Store<double> { __device__ static double from(double x) { return x; } };
template <> struct Store<float> { __device__ static float from(float x) { return x; } };
template <> struct Store<bf16> { __device__ static bf16 from(float x) { return __float2bfloat16_rn(x); } };
template <> struct Store<f16> { __device__ static f16 from(float x) { return __float2half_rn(x); } };
template <class T, class A> __device__ __forceinline__ T from_acc(A x) { return Store<T>::from(x); }

template <class A> __device__ __forceinline__ A neg_inf() { return -static_cast<A>(INFINITY); }

template <class A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Visible keys of global row ig in LOCAL key indices [*lo, *hi) when k_pos is contiguous
// (eq. 3.4 clipped to this block's keys); block bits are not included. Host too (v4_forward's
// choice of shape samples rows).
__host__ __device__ __forceinline__ void local_range(const MaskParams& m, int64_t ig, const Positions& kp,
                                            int64_t nk, int64_t* lo, int64_t* hi) {
  int64_t a, b;
  row_range(m, ig, &a, &b);
  a -= kp.start;
  b -= kp.start;
  a = a < 0 ? 0 : (a > nk ? nk : a);
  b = b < 0 ? 0 : (b > nk ? nk : b);
  if (b < a) b = a;
  *lo = a;
  *hi = b;
}
__device__ __forceinline__ bool block_bit(const MaskParams& m, int64_t ig, int64_t jg) {
  return !m.block || m.block[(ig / m.block_q) * m.n_block_k + jg / m.block_k];
}

// ---- launchers (defined in v1.cu, v2_fwd.cu, api.cu)
template <class T> void v1_forward(const FwdArgs<T>& a, cudaStream_t s);
template <class T, class G> void v1_backward(const BwdArgs<T, G>& a, cudaStream_t s);
template <class T> void launch_compute_D(View4<const T> O, View4<const T> dO, View3<acc_t<T>> D,
                                         cudaStream_t s);
template <class T> void launch_merge(View4<T> O_a, View3<acc_t<T>> L_a, View4<const T> O_b,
                                     View3<const acc_t<T>> L_b, cudaStream_t s);
// v2, v3, v4 exist for bf16 and fp16 with d in {64, 128}; which calls each runs: variants.hpp.
template <class T> void v2_forward(const FwdArgs<T>& a, cudaStream_t s);
template <class T> void v2_backward(const BwdArgs<T, T>& a, cudaStream_t s);
// v3 (sm_90a wgmma) has v2's limits plus a compute capability 9.0 device.
template <class T> void v3_forward(const FwdArgs<T>& a, cudaStream_t s);
template <class T> void v3_backward(const BwdArgs<T, T>& a, cudaStream_t s);
// v4 (warp-specialized: TMA producer, wgmma consumers; sm_90a): v3's limits and views the copy
// engine can describe, and for the forward no block mask; returns false with *why set (nothing
// launched) when a call does not qualify.
template <class T> bool v4_forward(const FwdArgs<T>& a, cudaStream_t s, const char** why);
// v4's backward runs two deterministic passes, or with dq_acc (fp32 scratch of v4_dq_acc_floats
// elements) one pass that adds dQ's partial sums atomically (not bitwise repeatable). G = T: the
// whole backward (gradients written); G = float: backward_block (gradients accumulated, contiguous
// key positions only).
template <class T, class G>
bool v4_backward(const BwdArgs<T, G>& a, float* dq_acc, cudaStream_t s, const char** why);
size_t v4_dq_acc_floats(int64_t B, int64_t Hq, int64_t nq, int64_t d);
// v5's backward: v4's one pass (dq_acc of v4_dq_acc_floats elements) with P^T and dS^T read from
// shared memory by dV's and dK's products; whole backward only, no deterministic mode; false
// with *why (nothing launched) as v4.
template <class T> bool v5_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why);
// v6's backward: v5 at d = 64 with the consumer warpgroups taking turns at the tensor cores (dQ_part
// one tile late through a ring of dS^T slots); as v5 otherwise.
template <class T> bool v6_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why);
// v14's backward: v5 with dQ_part's bulk add issued by a store thread per consumer warpgroup.
template <class T> bool v14_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why);

// Largest dynamic shared memory a block may opt into on the current device.
int max_dynamic_smem();
// Raise a kernel's dynamic shared-memory limit when it needs more than 48 KB.
void allow_smem(const void* kernel, size_t bytes);

}  // namespace burstlab::cuda::detail
