// cuda/api.cu — host entry points of the CUDA layer: validation (spec §1.4) before any launch,
// dispatch over the variant table (variants.hpp) to its launchers, device masks.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "detail.cuh"

namespace burstlab::cuda {

void check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::ostringstream os;
  os << expr << " failed at " << file << ":" << line << ": " << cudaGetErrorName(e) << " ("
     << cudaGetErrorString(e) << ")";
  throw CudaError(os.str());
}

bool gpu_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) {
      // Without a driver the runtime says "CUDA driver version is insufficient for CUDA runtime
      // version", which reads as an old driver: say what is missing, the runtime's text after it.
      // cudaDriverGetVersion gives 0 when no driver is installed.
      const std::string raw = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
      int drv = 0, rt = 0;
      cudaDriverGetVersion(&drv);
      cudaRuntimeGetVersion(&rt);
      std::ostringstream os;
      if (e == cudaErrorInsufficientDriver && drv == 0)
        os << "no NVIDIA GPU or driver found (" << raw << ")";
      else if (e == cudaErrorInsufficientDriver)
        os << "the NVIDIA driver supports CUDA " << drv / 1000 << "." << (drv % 1000) / 10
           << ", older than this build's runtime " << rt / 1000 << "." << (rt % 1000) / 10 << " (" << raw << ")";
      else if (e == cudaErrorNoDevice)
        os << "no NVIDIA GPU found (" << raw << ")";
      else
        os << raw;
      *why = os.str();
    }
    cudaGetLastError();  // clear the sticky-free error state
    return false;
  }
  if (n == 0) {
    if (why) *why = "no NVIDIA GPU found (cudaGetDeviceCount: 0 devices)";
    return false;
  }
  return true;
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  BURSTLAB_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  int drv = 0, rt = 0;
  BURSTLAB_CUDA_CHECK(cudaDriverGetVersion(&drv));
  BURSTLAB_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  std::ostringstream os;
  os << p.name << ", sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, "
     << (p.totalGlobalMem >> 30) << " GiB, CUDA driver " << drv / 1000 << "." << (drv % 1000) / 10
     << ", runtime " << rt / 1000 << "." << (rt % 1000) / 10;
  return os.str();
}

int compute_capability() {
  int dev = 0, major = 0, minor = 0;
  const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  if (!ok) {
    cudaGetLastError();  // clear the sticky-free error state
    return 0;
  }
  return major * 10 + minor;
}

bool variant_available(Variant v, std::string* why) {
  return v == Variant::Auto || runs_on(variant_info(v), compute_capability(), why);
}

DeviceMask::DeviceMask(const MaskData& m) {
  if (!m.doc.empty()) {
    doc_ = DeviceBuffer<RowDoc>(m.doc.size());
    doc_.upload(m.doc.data(), m.doc.size());
  }
  if (!m.block.empty()) {
    block_ = DeviceBuffer<uint8_t>(m.block.size());
    block_.upload(m.block.data(), m.block.size());
  }
  params_ = m.params_with(doc_.data(), block_.data());
}

namespace detail {

int max_dynamic_smem() {
  int dev = 0, v = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  BURSTLAB_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return v;
}

void allow_smem(const void* kernel, size_t bytes) {
  if (bytes <= 40 * 1024) return;  // headroom for the kernels' static shared memory
  const int cap = max_dynamic_smem();
  if (bytes > size_t(cap)) fail("d needs ", bytes, " bytes of shared memory; the device allows ", cap);
  BURSTLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
}

}  // namespace detail

namespace {

using detail::as_device;
using detail::BwdArgs;
using detail::device_t;
using detail::FwdArgs;

void check_gpu_limits(const Problem& p) {
  int64_t max_d = 0;  // the largest d a variant runs (v1's: it keeps d-vectors in shared memory)
  for (const VariantInfo& v : variants()) max_d = std::max(max_d, v.d_max);
  if (p.d > max_d) fail("d (", p.d, ") must be <= ", max_d, " on the CUDA layer");
  if (p.B > 65535) fail("B (", p.B, ") must be <= 65535 on the CUDA layer (grid z)");
  if (p.H_q > 65535) fail("H_q (", p.H_q, ") must be <= 65535 on the CUDA layer (grid y)");
}

void check_positions(const char* name, const Positions& pos, int64_t N) {
  if (pos.n < 0) fail(name, ".n (", pos.n, ") must be >= 0");
  if (!pos.index && (pos.start < 0 || pos.start + pos.n > N))
    fail(name, " [", pos.start, ", ", pos.start + pos.n, ") must lie in [0, ", N, ")");
}

void check_mask_params(const Problem& p, const MaskParams& m) {
  if (m.N_q != p.N_q) fail("mask.N_q (", m.N_q, ") must equal N_q (", p.N_q, ")");
  if (m.N_k != p.N_k) fail("mask.N_k (", m.N_k, ") must equal N_k (", p.N_k, ")");
  if (has_document(p.mask) != (m.doc != nullptr))
    fail("mask.doc (", m.doc ? "set" : "null", ") must match the Problem's document mask");
  if (has_block(p.mask) != (m.block != nullptr))
    fail("mask.block (", m.block ? "set" : "null", ") must match the Problem's block mask");
}

// merge / compute_D: views shaped like another view.
template <class T>
void check_v4(const char* name, const View4<T>& v, int64_t B, int64_t H, int64_t N, int64_t d) {
  const int64_t e[4] = {B, H, N, d};
  validate_view(name, v.dim, v.data, 4, e);
}
template <class T>
void check_v3(const char* name, const View3<T>& v, int64_t B, int64_t H, int64_t N) {
  int64_t e[3] = {B, H, N};
  validate_view(name, v.dim, v.data, 3, e);
}

// What every launch's arguments hold besides the tensors: mask, positions, sizes, scale.
template <class T, class Args>
void set_problem(Args& a, const Problem& p, const MaskParams& mask, Positions qp, Positions kp, bool accumulate) {
  a.mask = mask; a.qp = qp; a.kp = kp;
  a.B = p.B; a.Hq = p.H_q; a.Hkv = p.H_kv; a.group = group_size(p);
  a.nq = qp.n; a.nk = kp.n; a.d = p.d;
  a.scale = static_cast<acc_t<T>>(scale_of(p));
  a.accumulate = accumulate;
}

// A launch's arguments over the device's element types (device_t).
template <class T>
FwdArgs<device_t<T>> fwd_args(const Problem& p, const MaskParams& mask, Positions qp, Positions kp,
                              View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                              View3<acc_t<T>> LSE, bool accumulate) {
  FwdArgs<device_t<T>> a;
  a.Q = as_device(Q); a.K = as_device(K); a.V = as_device(V); a.O = as_device(O); a.LSE = LSE;
  set_problem<T>(a, p, mask, qp, kp, accumulate);
  return a;
}

template <class T, class G>
BwdArgs<device_t<T>, device_t<G>> bwd_args(const Problem& p, const MaskParams& mask, Positions qp, Positions kp,
                                           View4<const T> Q, View4<const T> K, View4<const T> V,
                                           View4<const T> dO, View3<const acc_t<T>> LSE, View3<const acc_t<T>> D,
                                           View4<G> dQ, View4<G> dK, View4<G> dV, bool accumulate) {
  BwdArgs<device_t<T>, device_t<G>> a;
  a.Q = as_device(Q); a.K = as_device(K); a.V = as_device(V); a.dO = as_device(dO); a.LSE = LSE; a.D = D;
  a.dQ = as_device(dQ); a.dK = as_device(dK); a.dV = as_device(dV);
  set_problem<T>(a, p, mask, qp, kp, accumulate);
  return a;
}

// Scratch in stream order (cudaMallocAsync: pooled by the driver, no device-wide synchronization
// per call as cudaMalloc/cudaFree have); freed in stream order after the kernels that use it.
template <class X>
class StreamScratch {
 public:
  StreamScratch(size_t n, cudaStream_t s) : s_(s) {
    if (n) BURSTLAB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(X), s));
  }
  ~StreamScratch() {
    if (p_) cudaFreeAsync(p_, s_);  // no throw from a destructor path
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  X* data() const { return p_; }

 private:
  X* p_ = nullptr;
  cudaStream_t s_;
};

// ---- dispatch: a call's description for the table (variants.hpp), and the launchers

// D: a device element type (the launchers' template argument).
template <class D>
constexpr bool kTensorCore = std::is_same<D, detail::bf16>::value || std::is_same<D, detail::f16>::value;

template <class X>
ViewDesc desc(const char* name, const View4<X>& v) {
  return {name, reinterpret_cast<uintptr_t>(v.data), {v.stride[0], v.stride[1], v.stride[2], v.stride[3]}};
}

template <class T>
Call call_of(Pass pass, const Problem& p, Positions q_pos, Positions k_pos, bool deterministic,
             std::vector<ViewDesc> views) {
  Call c;
  c.pass = pass;
  c.dtype = dtype_of<T>();
  c.d = p.d;
  c.N_q = p.N_q;
  c.N_k = p.N_k;
  c.n_q = q_pos.n;
  c.n_k = k_pos.n;
  c.block_sparse = has_block(p.mask);
  c.q_indexed = q_pos.index != nullptr;
  c.k_indexed = k_pos.index != nullptr;
  c.deterministic = deterministic;
  c.views = std::move(views);
  return c;
}

template <class T>
Call forward_call(Pass pass, const Problem& p, Positions q_pos, Positions k_pos, View4<const T> Q,
                  View4<const T> K, View4<const T> V, View4<T> O) {
  return call_of<T>(pass, p, q_pos, k_pos, false, {desc("Q", Q), desc("K", K), desc("V", V), desc("O", O)});
}

template <class T>
Call backward_call(const Problem& p, bool deterministic, View4<const T> Q, View4<const T> K, View4<const T> V,
                   View4<const T> O, View4<const T> dO, View4<T> dQ, View4<T> dK, View4<T> dV) {
  return call_of<T>(Pass::Backward, p, contiguous(0, p.N_q), contiguous(0, p.N_k), deterministic,
                    {desc("Q", Q), desc("K", K), desc("V", V), desc("O", O), desc("dO", dO), desc("dQ", dQ),
                     desc("dK", dK), desc("dV", dV)});
}

template <class T>
Call backward_block_call(const Problem& p, Positions q_pos, Positions k_pos, bool deterministic,
                         View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                         View4<acc_t<T>> dQ, View4<acc_t<T>> dK, View4<acc_t<T>> dV) {
  return call_of<T>(Pass::BackwardBlock, p, q_pos, k_pos, deterministic,
                    {desc("Q", Q), desc("K", K), desc("V", V), desc("dO", dO), desc("dQ", dQ), desc("dK", dK),
                     desc("dV", dV)});
}

// The launchers, over a device element type: one case per variant of the table that runs the
// entry point. Each returns false,
// with *why, when it declines a call the table admitted (v4: views the copy engine cannot
// describe; nothing is launched then).
template <class T>
bool launch_forward(Variant v, const FwdArgs<T>& a, cudaStream_t s, const char** why) {
  if constexpr (kTensorCore<T>) {
    switch (v) {
      case Variant::V4: return detail::v4_forward<T>(a, s, why);
      case Variant::V3: detail::v3_forward<T>(a, s); return true;
      case Variant::V2: detail::v2_forward<T>(a, s); return true;
      default: break;
    }
  }
  if (v != Variant::V1) fail("variant (", to_string(v), ") has no forward launcher for this dtype");
  detail::v1_forward<T>(a, s);
  return true;
}

// v2 and v3 are deterministic by construction (two passes, no atomics); so is v4 with
// opt.deterministic, else it runs one pass that adds dQ's partial sums atomically into fp32 scratch;
// v5, v6 and v14 always run that one pass (the table admits no deterministic call for them).
template <class T>
bool launch_backward(Variant v, const BwdArgs<T, T>& a, const Options& opt, const char** why) {
  if constexpr (kTensorCore<T>) {
    switch (v) {
      case Variant::V5:
      case Variant::V6:
      case Variant::V14: {
        StreamScratch<float> dq_acc(detail::v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d), opt.stream);
        return v == Variant::V5   ? detail::v5_backward<T>(a, dq_acc.data(), opt.stream, why)
               : v == Variant::V6 ? detail::v6_backward<T>(a, dq_acc.data(), opt.stream, why)
                                  : detail::v14_backward<T>(a, dq_acc.data(), opt.stream, why);
      }
      case Variant::V4: {
        StreamScratch<float> dq_acc(opt.deterministic ? 0 : detail::v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d),
                                    opt.stream);
        return detail::v4_backward<T, T>(a, dq_acc.data(), opt.stream, why);
      }
      case Variant::V3: detail::v3_backward<T>(a, opt.stream); return true;
      case Variant::V2: detail::v2_backward<T>(a, opt.stream); return true;
      default: break;
    }
  }
  if (v != Variant::V1) fail("variant (", to_string(v), ") has no backward launcher for this dtype");
  detail::v1_backward<T, T>(a, opt.stream);
  return true;
}

template <class T>
bool launch_backward_block(Variant v, const BwdArgs<T, acc_t<T>>& a, const Options& opt, const char** why) {
  if constexpr (kTensorCore<T>) {
    if (v == Variant::V4) {
      // The one-pass mode (not deterministic) adds dQ's partial sums into fp32 scratch, then
      // dQ += scale sum; the deterministic mode runs the two passes, no scratch.
      const bool one_pass = !opt.deterministic && a.nq > 0 && a.nk > 0;
      StreamScratch<float> dq_acc(one_pass ? detail::v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) : 0, opt.stream);
      return detail::v4_backward<T, acc_t<T>>(a, dq_acc.data(), opt.stream, why);
    }
  }
  if (v != Variant::V1) fail("variant (", to_string(v), ") has no backward_block launcher for this dtype");
  detail::v1_backward<T, acc_t<T>>(a, opt.stream);
  return true;
}

// Runs the first variant of `order` (launch_order) whose launcher accepts the call; when an
// explicitly requested variant declines, throws naming it and why.
template <class F>
void launch_first(const std::vector<Variant>& order, Variant requested, Pass pass, F&& launch) {
  for (Variant v : order) {
    const char* why = nullptr;
    if (launch(v, &why)) return;
    if (requested != Variant::Auto) fail("variant (", to_string(v), ") cannot run this ", to_string(pass), ": ", why);
  }
  fail("variant (auto): every variant that supports this ", to_string(pass), " declined it");
}

}  // namespace

template <class T>
Variant forward_variant(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
                        View4<T> O, Variant requested, std::string* passed_over) {
  const Call c = forward_call<T>(Pass::Forward, p, contiguous(0, p.N_q), contiguous(0, p.N_k), Q, K, V, O);
  return choose_variant(c, compute_capability(), requested, passed_over);
}

template <class T>
Variant backward_variant(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
                         View4<const T> O, View4<const T> dO, View4<T> dQ, View4<T> dK, View4<T> dV,
                         Variant requested, bool deterministic, std::string* passed_over) {
  const Call c = backward_call<T>(p, deterministic, Q, K, V, O, dO, dQ, dK, dV);
  return choose_variant(c, compute_capability(), requested, passed_over);
}

template <class T>
Variant backward_block_variant(const Problem& p, Positions q_pos, Positions k_pos, View4<const T> Q,
                               View4<const T> K, View4<const T> V, View4<const T> dO, View4<acc_t<T>> dQ,
                               View4<acc_t<T>> dK, View4<acc_t<T>> dV, Variant requested,
                               bool deterministic, std::string* passed_over) {
  const Call c = backward_block_call<T>(p, q_pos, k_pos, deterministic, Q, K, V, dO, dQ, dK, dV);
  return choose_variant(c, compute_capability(), requested, passed_over);
}

template <class T>
void forward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
             View3<acc_t<T>> LSE, const Options& opt) {
  validate_forward_views(p, Q, K, V, O, LSE);
  check_gpu_limits(p);
  const std::vector<Variant> order = launch_order(
      forward_call<T>(Pass::Forward, p, contiguous(0, p.N_q), contiguous(0, p.N_k), Q, K, V, O),
      compute_capability(), opt.variant);
  const MaskData md = compile_mask(p);
  const DeviceMask dm(md);
  const auto a = fwd_args<T>(p, dm.params(), contiguous(0, p.N_q), contiguous(0, p.N_k), Q, K, V, O, LSE, false);
  launch_first(order, opt.variant, Pass::Forward,
               [&](Variant v, const char** why) { return launch_forward(v, a, opt.stream, why); });
  // dm's device arrays are freed on return: wait for the kernel that reads them.
  if (md.doc.size() || md.block.size()) BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(opt.stream));
}

template <class T>
void forward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                   View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                   View3<acc_t<T>> LSE, bool accumulate, const Options& opt) {
  validate(p);
  check_gpu_limits(p);
  check_mask_params(p, mask);
  check_positions("q_pos", q_pos, p.N_q);
  check_positions("k_pos", k_pos, p.N_k);
  validate_block_forward_views(p, q_pos.n, k_pos.n, Q, K, V, O, LSE);
  const std::vector<Variant> order = launch_order(
      forward_call<T>(Pass::ForwardBlock, p, q_pos, k_pos, Q, K, V, O), compute_capability(), opt.variant);
  const auto a = fwd_args<T>(p, mask, q_pos, k_pos, Q, K, V, O, LSE, accumulate);
  launch_first(order, opt.variant, Pass::ForwardBlock,
               [&](Variant v, const char** why) { return launch_forward(v, a, opt.stream, why); });
}

template <class T>
void merge(View4<T> O_a, View3<acc_t<T>> LSE_a, View4<const T> O_b, View3<const acc_t<T>> LSE_b,
           const Options& opt) {
  validate_view("O_a", O_a.dim, O_a.data, 4, O_a.dim);
  check_v4("O_b", O_b, O_a.dim[0], O_a.dim[1], O_a.dim[2], O_a.dim[3]);
  check_v3("LSE_a", LSE_a, O_a.dim[0], O_a.dim[1], O_a.dim[2]);
  check_v3("LSE_b", LSE_b, O_a.dim[0], O_a.dim[1], O_a.dim[2]);
  if (O_a.dim[0] > 65535 || O_a.dim[1] > 65535) fail("O_a.dim[0..1] must be <= 65535");
  detail::launch_merge<device_t<T>>(as_device(O_a), LSE_a, as_device(O_b), LSE_b, opt.stream);
}

template <class T>
void compute_D(View4<const T> O, View4<const T> dO, View3<acc_t<T>> D, const Options& opt) {
  validate_view("O", O.dim, O.data, 4, O.dim);
  check_v4("dO", dO, O.dim[0], O.dim[1], O.dim[2], O.dim[3]);
  check_v3("D", D, O.dim[0], O.dim[1], O.dim[2]);
  if (O.dim[0] > 65535 || O.dim[1] > 65535) fail("O.dim[0..1] must be <= 65535");
  detail::launch_compute_D<device_t<T>>(as_device(O), as_device(dO), D, opt.stream);
}

template <class T>
void backward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
              View4<const T> O, View4<const T> dO, View3<const acc_t<T>> LSE, View4<T> dQ,
              View4<T> dK, View4<T> dV, const Options& opt) {
  using A = acc_t<T>;
  validate_backward_views(p, Q, K, V, O, dO, LSE, dQ, dK, dV);
  check_gpu_limits(p);
  const std::vector<Variant> order = launch_order(backward_call<T>(p, opt.deterministic, Q, K, V, O, dO, dQ, dK, dV),
                                                  compute_capability(), opt.variant);
  const MaskData md = compile_mask(p);
  const DeviceMask dm(md);
  StreamScratch<A> Dbuf(size_t(p.B * p.H_q * p.N_q), opt.stream);
  const View3<A> D = view3(Dbuf.data(), p.B, p.H_q, p.N_q);
  detail::launch_compute_D<device_t<T>>(as_device(O), as_device(dO), D, opt.stream);  // (5.1)
  const auto a = bwd_args<T, T>(p, dm.params(), contiguous(0, p.N_q), contiguous(0, p.N_k), Q, K, V, dO, LSE,
                                as_const(D), dQ, dK, dV, false);
  launch_first(order, opt.variant, Pass::Backward,
               [&](Variant v, const char** why) { return launch_backward(v, a, opt, why); });
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(opt.stream));  // D and the mask die here
}

template <class T>
void backward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                    View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                    View3<const acc_t<T>> LSE, View3<const acc_t<T>> D, View4<acc_t<T>> dQ,
                    View4<acc_t<T>> dK, View4<acc_t<T>> dV, const Options& opt) {
  using A = acc_t<T>;
  validate(p);
  check_gpu_limits(p);
  check_mask_params(p, mask);
  check_positions("q_pos", q_pos, p.N_q);
  check_positions("k_pos", k_pos, p.N_k);
  validate_block_backward_views(p, q_pos.n, k_pos.n, Q, K, V, dO, LSE, D, dQ, dK, dV);
  const std::vector<Variant> order = launch_order(
      backward_block_call<T>(p, q_pos, k_pos, opt.deterministic, Q, K, V, dO, dQ, dK, dV), compute_capability(),
      opt.variant);
  const auto a = bwd_args<T, A>(p, mask, q_pos, k_pos, Q, K, V, dO, LSE, D, dQ, dK, dV, true);
  launch_first(order, opt.variant, Pass::BackwardBlock,
               [&](Variant v, const char** why) { return launch_backward_block(v, a, opt, why); });
}

#define BURSTLAB_API(T)                                                                          \
  template Variant forward_variant<T>(const Problem&, View4<const T>, View4<const T>,            \
                                      View4<const T>, View4<T>, Variant, std::string*);          \
  template Variant backward_variant<T>(const Problem&, View4<const T>, View4<const T>,           \
                                       View4<const T>, View4<const T>, View4<const T>, View4<T>, \
                                       View4<T>, View4<T>, Variant, bool, std::string*);         \
  template Variant backward_block_variant<T>(const Problem&, Positions, Positions, View4<const T>, \
                                             View4<const T>, View4<const T>, View4<const T>,     \
                                             View4<acc_t<T>>, View4<acc_t<T>>, View4<acc_t<T>>,  \
                                             Variant, bool, std::string*);                       \
  template void forward<T>(const Problem&, View4<const T>, View4<const T>, View4<const T>,       \
                           View4<T>, View3<acc_t<T>>, const Options&);                           \
  template void forward_block<T>(const Problem&, const MaskParams&, Positions, Positions,        \
                                 View4<const T>, View4<const T>, View4<const T>, View4<T>,       \
                                 View3<acc_t<T>>, bool, const Options&);                         \
  template void merge<T>(View4<T>, View3<acc_t<T>>, View4<const T>, View3<const acc_t<T>>,       \
                         const Options&);                                                        \
  template void compute_D<T>(View4<const T>, View4<const T>, View3<acc_t<T>>, const Options&);   \
  template void backward<T>(const Problem&, View4<const T>, View4<const T>, View4<const T>,      \
                            View4<const T>, View4<const T>, View3<const acc_t<T>>, View4<T>,     \
                            View4<T>, View4<T>, const Options&);                                 \
  template void backward_block<T>(const Problem&, const MaskParams&, Positions, Positions,       \
                                  View4<const T>, View4<const T>, View4<const T>,                \
                                  View4<const T>, View3<const acc_t<T>>, View3<const acc_t<T>>,  \
                                  View4<acc_t<T>>, View4<acc_t<T>>, View4<acc_t<T>>, const Options&);
BURSTLAB_API(double)
BURSTLAB_API(float)
BURSTLAB_API(bf16_t)
BURSTLAB_API(f16_t)
#undef BURSTLAB_API

}  // namespace burstlab::cuda
