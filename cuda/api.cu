// cuda/api.cu — host entry points of the CUDA layer: validation (spec §1.4) before any launch,
// dispatch to the numbered variants (cuda/README.md), device masks.
#include <cstdio>
#include <cstdlib>
#include <sstream>

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
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error state
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device";
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

std::string to_string(Variant v) {
  switch (v) {
    case Variant::Auto: return "auto";
    case Variant::V1: return "v1";
    case Variant::V2: return "v2";
    case Variant::V3: return "v3";
    case Variant::V4: return "v4";
  }
  return "?";
}
Variant parse_variant(const std::string& s) {
  if (s == "auto") return Variant::Auto;
  if (s == "v1" || s == "1") return Variant::V1;
  if (s == "v2" || s == "2") return Variant::V2;
  if (s == "v3" || s == "3") return Variant::V3;
  if (s == "v4" || s == "4") return Variant::V4;
  fail("variant (", s, ") must be one of auto, v1, v2, v3, v4");
}

bool variant_available(Variant v, std::string* why) {
  if (v != Variant::V3 && v != Variant::V4) return true;
  const char* w = nullptr;
  if (detail::v3_device_ok(&w)) return true;
  if (why) *why = w;
  return false;
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

int env_int(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : 0;
}

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

using detail::BwdArgs;
using detail::FwdArgs;

constexpr int64_t kMaxD = 1024;  // v1 keeps 2-4 d-vectors per warp in shared memory

void check_gpu_limits(const Problem& p) {
  if (p.d > kMaxD) fail("d (", p.d, ") must be <= ", kMaxD, " on the CUDA layer");
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

template <class T>
FwdArgs<T> fwd_args(const Problem& p, const MaskParams& mask, Positions qp, Positions kp,
                    View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                    View3<lse_t<T>> LSE, bool accumulate) {
  FwdArgs<T> a;
  a.Q = Q; a.K = K; a.V = V; a.O = O; a.LSE = LSE;
  a.mask = mask; a.qp = qp; a.kp = kp;
  a.B = p.B; a.Hq = p.H_q; a.Hkv = p.H_kv; a.group = group_size(p);
  a.nq = qp.n; a.nk = kp.n; a.d = p.d;
  a.scale = static_cast<lse_t<T>>(scale_of(p));
  a.accumulate = accumulate;
  return a;
}

template <class T, class G>
BwdArgs<T, G> bwd_args(const Problem& p, const MaskParams& mask, Positions qp, Positions kp,
                       View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                       View3<const lse_t<T>> LSE, View3<const lse_t<T>> D, View4<G> dQ, View4<G> dK,
                       View4<G> dV, bool accumulate) {
  BwdArgs<T, G> a;
  a.Q = Q; a.K = K; a.V = V; a.dO = dO; a.LSE = LSE; a.D = D;
  a.dQ = dQ; a.dK = dK; a.dV = dV;
  a.mask = mask; a.qp = qp; a.kp = kp;
  a.B = p.B; a.Hq = p.H_q; a.Hkv = p.H_kv; a.group = group_size(p);
  a.nq = qp.n; a.nk = kp.n; a.d = p.d;
  a.scale = static_cast<lse_t<T>>(scale_of(p));
  a.accumulate = accumulate;
  return a;
}

template <class T>
bool v2_capable(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                std::string* why) {
  if (!(std::is_same<T, bf16>::value || std::is_same<T, f16>::value)) {
    if (why) *why = "v2 is bf16/fp16 only";
    return false;
  }
  if (p.N_q >= (int64_t(1) << 31) || p.N_k >= (int64_t(1) << 31)) {
    if (why) *why = "v2 needs N_q, N_k < 2^31";
    return false;
  }
  const void* ptrs[4] = {Q.data, K.data, V.data, O.data};
  const int64_t* strides[4] = {Q.stride, K.stride, V.stride, O.stride};
  const char* w = nullptr;
  if (!detail::v2_forward_ok_common(p.d, ptrs, strides, 4, &w)) {
    if (why) *why = w;
    return false;
  }
  return true;
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

template <class T>
void run_forward(const FwdArgs<T>& a, Variant v, bool strict, cudaStream_t s) {
  if constexpr (std::is_same<T, bf16>::value || std::is_same<T, f16>::value) {
    if (v == Variant::V4) {  // v3 runs what v4's copies cannot describe, unless v4 was asked for
      const char* why = nullptr;
      if (detail::v4_forward<T>(a, s, &why)) return;
      if (strict) fail("variant (v4) cannot run this call: ", why);
      v = Variant::V3;
    }
    if (v == Variant::V3) return detail::v3_forward<T>(a, s);
    if (v == Variant::V2) return detail::v2_forward<T>(a, s);
  }
  detail::v1_forward<T>(a, s);
}

}  // namespace

template <class T>
Variant forward_variant(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
                        View4<T> O, Variant requested, std::string* why_not_v2) {
  std::string why;
  const bool ok = v2_capable<T>(p, Q, K, V, O, &why);
  const char* why3 = nullptr;
  const bool ok3 = ok && detail::v3_device_ok(&why3);
  if (why_not_v2) *why_not_v2 = why;
  if (requested == Variant::V1) return Variant::V1;
  if (requested == Variant::V2) {
    if (!ok) fail("variant (v2) cannot run this call: ", why);
    return Variant::V2;
  }
  if (requested == Variant::V3) {
    if (!ok3) fail("variant (v3) cannot run this call: ", ok ? std::string(why3) : why);
    return Variant::V3;
  }
  const bool ok4 = ok3 && !has_block(p.mask);
  if (requested == Variant::V4) {
    if (!ok4)
      fail("variant (v4) cannot run this call: ",
           !ok ? why : !ok3 ? std::string(why3) : std::string("v4 has no block-sparse masks (v3 runs them)"));
    return Variant::V4;
  }
  return ok4 ? Variant::V4 : ok3 ? Variant::V3 : ok ? Variant::V2 : Variant::V1;
}

template <class T>
Variant backward_variant(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
                         View4<const T> O, View4<const T> dO, View4<T> dQ, View4<T> dK, View4<T> dV,
                         Variant requested, std::string* why_not_v2) {
  std::string why;
  bool ok = v2_capable<T>(p, Q, K, V, dQ, &why);
  if (ok) {
    const void* ptrs[5] = {O.data, dO.data, dK.data, dV.data, dQ.data};
    const int64_t* strides[5] = {O.stride, dO.stride, dK.stride, dV.stride, dQ.stride};
    const char* w = nullptr;
    ok = detail::v2_forward_ok_common(p.d, ptrs, strides, 5, &w);
    if (!ok) why = w;
  }
  if (why_not_v2) *why_not_v2 = why;
  if (requested == Variant::V1) return Variant::V1;
  if (requested == Variant::V2 && !ok) fail("variant (v2) cannot run this backward: ", why);
  const char* why3 = nullptr;
  const bool ok3 = ok && detail::v3_device_ok(&why3);
  if ((requested == Variant::V3 || requested == Variant::V4) && !ok3)
    fail("variant (", to_string(requested), ") cannot run this backward: ", ok ? std::string(why3) : why);
  if (requested == Variant::V2 || requested == Variant::V3) return requested;
  return ok3 ? Variant::V4 : ok ? Variant::V2 : Variant::V1;  // auto, v4 (block masks included)
}

template <class T>
Variant backward_block_variant(const Problem& p, Positions q_pos, Positions k_pos, View4<const T> Q,
                               View4<const T> K, View4<const T> V, View4<const T> dO, View4<lse_t<T>> dQ,
                               View4<lse_t<T>> dK, View4<lse_t<T>> dV, Variant requested,
                               bool deterministic, std::string* why_not_v4) {
  std::string why;
  const char* w = nullptr;
  const void* ptrs[7] = {Q.data, K.data, V.data, dO.data, dQ.data, dK.data, dV.data};
  const int64_t* strides[7] = {Q.stride, K.stride, V.stride, dO.stride, dQ.stride, dK.stride, dV.stride};
  if (!(std::is_same<T, bf16>::value || std::is_same<T, f16>::value)) why = "v4 is bf16/fp16 only";
  else if (p.N_q >= (int64_t(1) << 31) || p.N_k >= (int64_t(1) << 31) || q_pos.n >= (int64_t(1) << 31) ||
           k_pos.n >= (int64_t(1) << 31))
    why = "v4 needs N_q, N_k, q_pos.n, k_pos.n < 2^31";
  else if (k_pos.index && deterministic) why = "v4's deterministic backward_block needs contiguous key positions";
  else if (!detail::v2_forward_ok_common(p.d, ptrs, strides, 7, &w)) why = w;  // the fp32 gradients too
  else if (!detail::v3_device_ok(&w)) why = w;
  if (why_not_v4) *why_not_v4 = why;
  if (requested == Variant::V2 || requested == Variant::V3)
    fail("variant (", to_string(requested), ") has no backward_block; use auto, v1 or v4");
  if (requested == Variant::V1) return Variant::V1;
  if (requested == Variant::V4 && !why.empty()) fail("variant (v4) cannot run this backward_block: ", why);
  return why.empty() ? Variant::V4 : Variant::V1;
}

template <class T>
void forward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
             View3<lse_t<T>> LSE, const Options& opt) {
  validate_forward_views(p, Q, K, V, O, LSE);
  check_gpu_limits(p);
  const Variant v = forward_variant<T>(p, Q, K, V, O, opt.variant);
  const MaskData md = compile_mask(p);
  const DeviceMask dm(md);
  const FwdArgs<T> a = fwd_args<T>(p, dm.params(), contiguous(0, p.N_q), contiguous(0, p.N_k), Q,
                                   K, V, O, LSE, false);
  run_forward<T>(a, v, opt.variant == Variant::V4, opt.stream);
  // dm's device arrays are freed on return: wait for the kernel that reads them.
  if (md.doc.size() || md.block.size()) BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(opt.stream));
}

template <class T>
void forward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                   View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                   View3<lse_t<T>> LSE, bool accumulate, const Options& opt) {
  validate(p);
  check_gpu_limits(p);
  check_mask_params(p, mask);
  check_positions("q_pos", q_pos, p.N_q);
  check_positions("k_pos", k_pos, p.N_k);
  validate_block_forward_views(p, q_pos.n, k_pos.n, Q, K, V, O, LSE);
  const Variant v = forward_variant<T>(p, Q, K, V, O, opt.variant);
  run_forward<T>(fwd_args<T>(p, mask, q_pos, k_pos, Q, K, V, O, LSE, accumulate), v,
                 opt.variant == Variant::V4, opt.stream);
}

template <class T>
void merge(View4<T> O_a, View3<lse_t<T>> LSE_a, View4<const T> O_b, View3<const lse_t<T>> LSE_b,
           const Options& opt) {
  validate_view("O_a", O_a.dim, O_a.data, 4, O_a.dim);
  check_v4("O_b", O_b, O_a.dim[0], O_a.dim[1], O_a.dim[2], O_a.dim[3]);
  check_v3("LSE_a", LSE_a, O_a.dim[0], O_a.dim[1], O_a.dim[2]);
  check_v3("LSE_b", LSE_b, O_a.dim[0], O_a.dim[1], O_a.dim[2]);
  if (O_a.dim[0] > 65535 || O_a.dim[1] > 65535) fail("O_a.dim[0..1] must be <= 65535");
  detail::launch_merge<T>(O_a, LSE_a, O_b, LSE_b, opt.stream);
}

template <class T>
void compute_D(View4<const T> O, View4<const T> dO, View3<lse_t<T>> D, const Options& opt) {
  validate_view("O", O.dim, O.data, 4, O.dim);
  check_v4("dO", dO, O.dim[0], O.dim[1], O.dim[2], O.dim[3]);
  check_v3("D", D, O.dim[0], O.dim[1], O.dim[2]);
  if (O.dim[0] > 65535 || O.dim[1] > 65535) fail("O.dim[0..1] must be <= 65535");
  detail::launch_compute_D<T>(O, dO, D, opt.stream);
}

template <class T>
void backward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
              View4<const T> O, View4<const T> dO, View3<const lse_t<T>> LSE, View4<T> dQ,
              View4<T> dK, View4<T> dV, const Options& opt) {
  using A = lse_t<T>;
  validate_backward_views(p, Q, K, V, O, dO, LSE, dQ, dK, dV);
  check_gpu_limits(p);
  const Variant run = backward_variant<T>(p, Q, K, V, O, dO, dQ, dK, dV, opt.variant);
  const MaskData md = compile_mask(p);
  const DeviceMask dm(md);
  StreamScratch<A> Dbuf(size_t(p.B * p.H_q * p.N_q), opt.stream);
  const View3<A> D = view3(Dbuf.data(), p.B, p.H_q, p.N_q);
  // v4's one-pass mode (not deterministic) adds dQ's partial sums into fp32 scratch.
  StreamScratch<float> dq_acc(run == Variant::V4 && !opt.deterministic
                                  ? detail::v4_dq_acc_floats(p.B, p.H_q, p.N_q, p.d) : 0,
                              opt.stream);
  detail::launch_compute_D<T>(O, dO, D, opt.stream);  // (5.1)
  const BwdArgs<T, T> a = bwd_args<T, T>(p, dm.params(), contiguous(0, p.N_q), contiguous(0, p.N_k),
                                         Q, K, V, dO, LSE, as_const(D), dQ, dK, dV, false);
  if constexpr (std::is_same<T, bf16>::value || std::is_same<T, f16>::value) {
    // v2 and v3 are deterministic by construction (two passes, no atomics); so is v4 with
    // opt.deterministic, else it runs one pass with atomic dQ sums.
    switch (run) {
      case Variant::V4: {
        const char* why4 = nullptr;
        if (detail::v4_backward<T, T>(a, dq_acc.data(), opt.stream, &why4)) break;
        if (opt.variant == Variant::V4) fail("variant (v4) cannot run this backward: ", why4);
        detail::v3_backward<T>(a, opt.stream);  // auto: v3 runs views the copy engine cannot describe
        break;
      }
      case Variant::V3: detail::v3_backward<T>(a, opt.stream); break;
      case Variant::V2: detail::v2_backward<T>(a, opt.stream); break;
      default: detail::v1_backward<T, T>(a, opt.stream);
    }
  } else {
    detail::v1_backward<T, T>(a, opt.stream);
  }
  BURSTLAB_CUDA_CHECK(cudaStreamSynchronize(opt.stream));  // D and the mask die here
}

template <class T>
void backward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                    View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                    View3<const lse_t<T>> LSE, View3<const lse_t<T>> D, View4<lse_t<T>> dQ,
                    View4<lse_t<T>> dK, View4<lse_t<T>> dV, const Options& opt) {
  using A = lse_t<T>;
  validate(p);
  check_gpu_limits(p);
  check_mask_params(p, mask);
  check_positions("q_pos", q_pos, p.N_q);
  check_positions("k_pos", k_pos, p.N_k);
  validate_block_backward_views(p, q_pos.n, k_pos.n, Q, K, V, dO, LSE, D, dQ, dK, dV);
  const Variant run =
      backward_block_variant<T>(p, q_pos, k_pos, Q, K, V, dO, dQ, dK, dV, opt.variant, opt.deterministic);
  const BwdArgs<T, A> a = bwd_args<T, A>(p, mask, q_pos, k_pos, Q, K, V, dO, LSE, D, dQ, dK, dV, true);
  if constexpr (std::is_same<T, bf16>::value || std::is_same<T, f16>::value) {
    if (run == Variant::V4) {
      // The one-pass mode (not deterministic) adds dQ's partial sums into fp32 scratch, then
      // dQ += scale sum; the deterministic mode runs the two passes, no scratch.
      const bool one_pass = !opt.deterministic && q_pos.n > 0 && k_pos.n > 0;
      StreamScratch<float> dq_acc(one_pass ? detail::v4_dq_acc_floats(p.B, p.H_q, q_pos.n, p.d) : 0, opt.stream);
      const char* why4 = nullptr;
      if (detail::v4_backward<T, A>(a, dq_acc.data(), opt.stream, &why4)) return;
      if (opt.variant == Variant::V4) fail("variant (v4) cannot run this backward_block: ", why4);
      // auto: v1 runs the views the copy engine cannot describe
    }
  }
  detail::v1_backward<T, A>(a, opt.stream);
}

#define BURSTLAB_API(T)                                                                          \
  template Variant forward_variant<T>(const Problem&, View4<const T>, View4<const T>,            \
                                      View4<const T>, View4<T>, Variant, std::string*);          \
  template Variant backward_variant<T>(const Problem&, View4<const T>, View4<const T>,           \
                                       View4<const T>, View4<const T>, View4<const T>, View4<T>, \
                                       View4<T>, View4<T>, Variant, std::string*);               \
  template Variant backward_block_variant<T>(const Problem&, Positions, Positions, View4<const T>, \
                                             View4<const T>, View4<const T>, View4<const T>,     \
                                             View4<lse_t<T>>, View4<lse_t<T>>, View4<lse_t<T>>,  \
                                             Variant, bool, std::string*);                       \
  template void forward<T>(const Problem&, View4<const T>, View4<const T>, View4<const T>,       \
                           View4<T>, View3<lse_t<T>>, const Options&);                           \
  template void forward_block<T>(const Problem&, const MaskParams&, Positions, Positions,        \
                                 View4<const T>, View4<const T>, View4<const T>, View4<T>,       \
                                 View3<lse_t<T>>, bool, const Options&);                         \
  template void merge<T>(View4<T>, View3<lse_t<T>>, View4<const T>, View3<const lse_t<T>>,       \
                         const Options&);                                                        \
  template void compute_D<T>(View4<const T>, View4<const T>, View3<lse_t<T>>, const Options&);   \
  template void backward<T>(const Problem&, View4<const T>, View4<const T>, View4<const T>,      \
                            View4<const T>, View4<const T>, View3<const lse_t<T>>, View4<T>,     \
                            View4<T>, View4<T>, const Options&);                                 \
  template void backward_block<T>(const Problem&, const MaskParams&, Positions, Positions,       \
                                  View4<const T>, View4<const T>, View4<const T>,                \
                                  View4<const T>, View3<const lse_t<T>>, View3<const lse_t<T>>,  \
                                  View4<lse_t<T>>, View4<lse_t<T>>, View4<lse_t<T>>, const Options&);
BURSTLAB_API(double)
BURSTLAB_API(float)
BURSTLAB_API(bf16)
BURSTLAB_API(f16)
#undef BURSTLAB_API

}  // namespace burstlab::cuda
