// cuda/ — LAO on an NVIDIA GPU: tiled online-softmax attention (spec §4 forward, §5.3 backward,
// §6 blocks over global positions). Mirrors cpu/cpu.hpp, over DEVICE memory: every View4/View3
// data pointer, Positions::index, and the arrays of a MaskParams passed to a *_block entry point
// must be device-accessible. The numbered kernel variants (v1 the plain CUDA-core baseline and
// fallback; v2-v4 on tensor cores), what each runs and which `auto` prefers: one table,
// variants.hpp (cuda/README.md shows it).
// Storage types: the contract's double, float, bf16_t, f16_t (burstlab/storage.hpp). Accumulation
// (and LSE / D storage) is acc_t<T>: fp64 for double, fp32 for the others (spec §9.1). The kernels
// see bf16_t and f16_t as CUDA's __nv_bfloat16 and __half (device_t, detail.cuh).
// Every entry point validates on the host before launch and throws burstlab::Error naming the
// field and value; CUDA errors throw CudaError with the failing call and file:line.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "burstlab/error.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/storage.hpp"
#include "burstlab/tensor.hpp"
#include "variants.hpp"

namespace burstlab::cuda {

// ---------------------------------------------------------------- errors
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws CudaError("<expr> failed at file:line: <cudaGetErrorString>") unless e == cudaSuccess.
void check(cudaError_t e, const char* expr, const char* file, int line);
#define BURSTLAB_CUDA_CHECK(expr) ::burstlab::cuda::check((expr), #expr, __FILE__, __LINE__)
// After a launch: the launch error (cudaGetLastError), with the kernel's name.
#define BURSTLAB_CUDA_LAUNCH_CHECK(name) \
  ::burstlab::cuda::check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

// True when a CUDA device can be used; otherwise false and *why says why (no throw).
bool gpu_available(std::string* why = nullptr);
// "NVIDIA H200, sm_90, 132 SMs, driver 13.0, runtime 13.0"
std::string device_description(int device = 0);

// ---------------------------------------------------------------- device memory
// Owning device buffer (cudaMalloc / cudaFree). Move-only.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n) BURSTLAB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { reset(); p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (p_) cudaFree(p_);  // no throw from a destructor path
    p_ = nullptr; n_ = 0;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  void upload(const T* host, size_t n) {
    if (n > n_) fail("upload of ", n, " elements into a DeviceBuffer of ", n_);
    if (n) BURSTLAB_CUDA_CHECK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(T* host, size_t n) const {
    if (n > n_) fail("download of ", n, " elements from a DeviceBuffer of ", n_);
    if (n) BURSTLAB_CUDA_CHECK(cudaMemcpy(host, p_, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  // Every byte 0xff: NaN in fp64, fp32, bf16 and fp16 (spec §9.3 poisoning).
  void poison() {
    if (n_) BURSTLAB_CUDA_CHECK(cudaMemset(p_, 0xff, n_ * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A compiled mask (compile_mask) with its doc / block arrays on the device. params() is what
// the *_block entry points take.
class DeviceMask {
 public:
  DeviceMask() = default;
  explicit DeviceMask(const MaskData& m);
  const MaskParams& params() const { return params_; }

 private:
  DeviceBuffer<RowDoc> doc_;
  DeviceBuffer<uint8_t> block_;
  MaskParams params_;
};

// ---------------------------------------------------------------- options
// The current device's compute capability as 10 major + minor (90 for 9.0); 0 without a device.
int compute_capability();

// Whether the current device can run variant v at all (the table's device rule: v3 and v4 are
// sm_90a code, compute capability 9.0 only); Auto: true. Says why not in *why. Whether a given
// call qualifies: forward_variant and its siblings.
bool variant_available(Variant v, std::string* why = nullptr);

struct Options {
  Variant variant = Variant::Auto;  // Auto: the first variant in preference order that supports the call
  bool deterministic = false;       // backward: bitwise repeatable (variants.hpp's Determinism)
  cudaStream_t stream = nullptr;
};

// Which variant a forward (or forward_block: the same rules) call runs on the current device:
// choose_variant (variants.hpp) over the call's dtype, d, lengths, mask and views Q, K, V, O.
// `passed_over` says why auto passed over the rows before its choice. Throws Error when
// `requested` is a variant that cannot run the call, naming it and the reason. A row that
// may_decline (v4: views the copy engine cannot describe) can still decline at launch: auto then
// runs the next supporting row (v3); an explicit request throws.
template <class T>
Variant forward_variant(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
                        View4<T> O, Variant requested, std::string* passed_over = nullptr);
// The same for `backward` (with Options::deterministic), over the views Q, K, V, O, dO, dQ, dK, dV.
template <class T>
Variant backward_variant(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
                         View4<const T> O, View4<const T> dO, View4<T> dQ, View4<T> dK, View4<T> dV,
                         Variant requested, bool deterministic, std::string* passed_over = nullptr);
// The same for `backward_block` (with Options::deterministic and the positions), over the views
// Q, K, V, dO and the accumulator-precision dQ, dK, dV.
template <class T>
Variant backward_block_variant(const Problem& p, Positions q_pos, Positions k_pos, View4<const T> Q,
                               View4<const T> K, View4<const T> V, View4<const T> dO, View4<acc_t<T>> dQ,
                               View4<acc_t<T>> dK, View4<acc_t<T>> dV, Variant requested,
                               bool deterministic, std::string* passed_over = nullptr);

// ---------------------------------------------------------------- forward
// Whole problem, eq. (4.1)-(4.4). Q (B, H_q, N_q, d); K, V (B, H_kv, N_k, d) -> O (B, H_q, N_q, d),
// LSE (B, H_q, N_q). Empty rows: O = 0, LSE = -inf. The mask is compiled and copied to the
// device per call (nothing to copy for band-only masks).
template <class T>
void forward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
             View3<acc_t<T>> LSE, const Options& opt = {});

// One block (§6.1): queries at global positions q_pos against keys at global positions k_pos;
// `mask` is a device MaskParams (DeviceMask::params()). Q (B, H_q, q_pos.n, d);
// K, V (B, H_kv, k_pos.n, d); O (B, H_q, q_pos.n, d); LSE (B, H_q, q_pos.n).
// accumulate = false: writes the partial (O, LSE) over these keys (rows with no visible key:
// (0, -inf), the merge identity). accumulate = true: folds the partial into the running
// (O, LSE) already there with the merge (4.5)-(4.7).
template <class T>
void forward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                   View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                   View3<acc_t<T>> LSE, bool accumulate, const Options& opt = {});

// The merge as a kernel (4.5)-(4.7): (O_a, LSE_a) <- (O_a, LSE_a) (+) (O_b, LSE_b).
// O (B, H, N, d), LSE (B, H, N).
template <class T>
void merge(View4<T> O_a, View3<acc_t<T>> LSE_a, View4<const T> O_b, View3<const acc_t<T>> LSE_b,
           const Options& opt = {});

// ---------------------------------------------------------------- backward
// eq. (5.1): D_i = sum_k dO_ik O_ik.  O, dO (B, H, N, d) -> D (B, H, N).
template <class T>
void compute_D(View4<const T> O, View4<const T> dO, View3<acc_t<T>> D, const Options& opt = {});

// Whole problem, eq. (5.1)-(5.7). O, LSE: this layer's own forward outputs. Outputs overwritten.
// dQ (B, H_q, N_q, d); dK, dV (B, H_kv, N_k, d).
template <class T>
void backward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
              View4<const T> O, View4<const T> dO, View3<const acc_t<T>> LSE, View4<T> dQ,
              View4<T> dK, View4<T> dV, const Options& opt = {});

// One block of the backward (§6.2): rows at q_pos against keys at k_pos, with the GLOBAL LSE and
// D of the rows. ACCUMULATES into accumulator-precision gradients: dQ += ..., dK += ...,
// dV += ... (dK, dV group-summed), so blocks compose by addition. Runs backward_block_variant's
// choice; opt.deterministic as for backward.
template <class T>
void backward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                    View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                    View3<const acc_t<T>> LSE, View3<const acc_t<T>> D, View4<acc_t<T>> dQ,
                    View4<acc_t<T>> dK, View4<acc_t<T>> dV, const Options& opt = {});

// ---------------------------------------------------------------- metrics on the GPU (Thrust)
// Over n elements of device arrays of a storage type: the count of non-finite elements of `a`,
// and max |a - b| over pairs where both are finite.
template <class T> int64_t count_nonfinite(const T* a, size_t n);
template <class T> double max_abs_diff(const T* a, const T* b, size_t n);
template <class T> double max_abs(const T* a, size_t n);

}  // namespace burstlab::cuda
