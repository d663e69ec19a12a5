// cuda/lmhead_api.cu — the LM head's entry points (cuda_lmhead.hpp): host validation, the choice
// of variant, each variant's chunk size, workspace and dW roundings in one place, the dispatch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "burstlab/error.hpp"
#include "cuda_lmhead.hpp"
#include "lmhead_common.cuh"

namespace burstlab::cuda {
namespace {

// Preference order of `variant = 0`: the first that supports the call.
constexpr int kPreference[] = {3, 2, 1};

void check_variant_number(int v, bool allow_auto) {
  if (v == 0 && allow_auto) return;
  if (v < 1 || v > 3)
    fail("variant (", v, ") must be ", allow_auto ? "0 (the first that supports the call), " : "", "1, 2 or 3 for the cuda LM head");
}

// v2, v3 hand dH and dW to cuBLAS as column-major (d, rows) matrices.
template <class T>
std::string cublas_outputs_unsupported(const LmHeadProblem& p, const View2<T>& dH, const View2<T>& dW) {
  const View2<T>* views[2] = {&dH, &dW};
  const char* names[2] = {"dH", "dW"};
  for (int k = 0; k < 2; ++k) {
    const View2<T>& v = *views[k];
    if (!v.data) continue;  // a forward: no outputs
    if (v.stride[1] != 1) return std::string(names[k]) + ".stride[1] (" + std::to_string(v.stride[1]) + ") must be 1";
    if (v.dim[0] > 1 && v.stride[0] < p.d)
      return std::string(names[k]) + ".stride[0] (" + std::to_string(v.stride[0]) + ") must be >= d (" +
             std::to_string(p.d) + ")";
  }
  return "";
}

template <class T>
int choose(const LmHeadProblem& p, View2<T> dH, View2<T> dW, const LmHeadOptions& opt) {
  check_variant_number(opt.variant, true);
  const std::string why = cublas_outputs_unsupported(p, dH, dW);
  if (opt.variant == 0) {
    for (int v : kPreference)
      if (v == 1 || why.empty()) return v;
  }
  if (opt.variant != 1 && !why.empty())
    fail("variant (", opt.variant, ") writes dH and dW through cuBLAS: ", why, "; variant 1 runs such views");
  return opt.variant;
}

template <class T>
float dispatch(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g,
               detail::lmhead::Mode mode, const float* LSE_in, float* LSE_out, View2<T> dH, View2<T> dW,
               const LmHeadOptions& opt) {
  using detail::as_device;
  using D = detail::device_t<T>;
  const int v = choose(p, dH, dW, opt);
  if (v == 1)
    return detail::lmhead::run_v1<D>(p, as_device(H), as_device(W), y, g, mode, LSE_in, LSE_out, as_device(dH),
                                     as_device(dW), opt);
  return detail::lmhead::run_v2<D>(p, as_device(H), as_device(W), y, g, mode, LSE_in, LSE_out, as_device(dH),
                                   as_device(dW), opt, v == 3);
}

template <class T>
void validate_outputs(const LmHeadProblem& p, double g, const View2<T>& dH, const View2<T>& dW) {
  if (!std::isfinite(g)) fail("g (", g, ") must be finite");
  validate_view2("dH", dH.dim, dH.data, p.N, "N", p.d, "d");
  validate_view2("dW", dW.dim, dW.data, p.V, "V", p.d, "d");
}

}  // namespace

template <class T>
int lmhead_variant(const LmHeadProblem& p, View2<T> dH, View2<T> dW, const LmHeadOptions& opt) {
  return choose(p, dH, dW, opt);
}

int64_t lmhead_chunk_rows(const LmHeadProblem& p, int variant, const LmHeadOptions& opt) {
  validate(p);
  check_variant_number(variant, false);
  if (opt.chunk_rows < 0) fail("chunk_rows (", opt.chunk_rows, ") must be >= 1, or 0 for the default");
  if (opt.chunk_rows > 0) return std::min(opt.chunk_rows, p.N);
  // v1, v2: about 1 GiB of chunk buffers (fp32 logits + 16-bit dz per row); v3: 512 MiB of logits
  // (dz lives in them). Multiples of 128 rows (v1's CTA tile).
  const int64_t Vp = detail::lmhead::round_up(p.V, 8);
  const int64_t per_row = variant == 3 ? Vp * 4 : Vp * 6, budget = variant == 3 ? int64_t(1) << 29 : int64_t(1) << 30;
  const int64_t rows = std::max<int64_t>(128, budget / per_row / 128 * 128);
  return std::min(rows, p.N);
}

int64_t lmhead_workspace_bytes(const LmHeadProblem& p, int variant, bool backward, const LmHeadOptions& opt) {
  const int64_t Nc = lmhead_chunk_rows(p, variant, opt), Vp = detail::lmhead::round_up(p.V, 8);
  int64_t b = 2 * 8 + Nc * Vp * 4 + p.N * 4 + 4;  // label counters, logits, row losses, the sum
  if (backward && variant != 3) b += Nc * Vp * 2 + p.V * p.d * 4;  // dz (16-bit), the fp32 dW accumulator
  if (variant != 1) b += detail::lmhead::kCublasWorkspace;
  return b;
}

int64_t lmhead_dW_roundings(const LmHeadProblem& p, int variant, const LmHeadOptions& opt) {
  if (variant != 3) return 1;
  const int64_t Nc = lmhead_chunk_rows(p, variant, opt);
  return (p.N + Nc - 1) / Nc;
}

void reset_pool_peak() {
  int dev = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool;
  BURSTLAB_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  unsigned long long zero = 0;  // the attribute is a cuuint64_t
  BURSTLAB_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

int64_t pool_peak_bytes() {
  int dev = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool;
  BURSTLAB_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  unsigned long long high = 0;
  BURSTLAB_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  return static_cast<int64_t>(high);
}

template <class T>
float lmhead_forward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, float* LSE,
                     LmHeadOptions opt) {
  detail::lmhead::validate_call(p, H, W, y, LSE, "LSE");
  return dispatch<T>(p, H, W, y, 0.0, detail::lmhead::Mode::Forward, nullptr, LSE, View2<T>(), View2<T>(), opt);
}

template <class T>
void lmhead_backward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y,
                     const float* LSE, double g, View2<T> dH, View2<T> dW, LmHeadOptions opt) {
  detail::lmhead::validate_call(p, H, W, y, LSE, "LSE");
  validate_outputs(p, g, dH, dW);
  dispatch<T>(p, H, W, y, g, detail::lmhead::Mode::Backward, LSE, nullptr, dH, dW, opt);
}

template <class T>
float lmhead_fused(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g,
                   float* LSE, View2<T> dH, View2<T> dW, LmHeadOptions opt) {
  detail::lmhead::validate_call(p, H, W, y, LSE, "LSE");
  validate_outputs(p, g, dH, dW);
  return dispatch<T>(p, H, W, y, g, detail::lmhead::Mode::Fused, nullptr, LSE, dH, dW, opt);
}

#define BURSTLAB_CUDA_LMHEAD_INSTANTIATE(T)                                                                        \
  template int lmhead_variant<T>(const LmHeadProblem&, View2<T>, View2<T>, const LmHeadOptions&);                 \
  template float lmhead_forward<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*, float*,   \
                                   LmHeadOptions);                                                                 \
  template void lmhead_backward<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*,          \
                                   const float*, double, View2<T>, View2<T>, LmHeadOptions);                      \
  template float lmhead_fused<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*, double,    \
                                 float*, View2<T>, View2<T>, LmHeadOptions);

BURSTLAB_CUDA_LMHEAD_INSTANTIATE(bf16_t)
BURSTLAB_CUDA_LMHEAD_INSTANTIATE(f16_t)

}  // namespace burstlab::cuda
