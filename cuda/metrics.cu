// cuda/metrics.cu — error metrics reduced on the GPU with Thrust (benchmarks check outputs of
// sizes the CPU oracle cannot afford: non-finite counts and max |a - b| against v1).
#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <cmath>

#include "detail.cuh"

namespace burstlab::cuda {
namespace {

template <class T>
struct NonFinite {
  const T* a;
  __device__ int64_t operator()(size_t i) const {
    return isfinite(detail::to_acc<double>(a[i])) ? 0 : 1;
  }
};
template <class T>
struct AbsDiff {
  const T* a;
  const T* b;  // null: |a|
  __device__ double operator()(size_t i) const {
    const double x = detail::to_acc<double>(a[i]);
    const double y = b ? detail::to_acc<double>(b[i]) : 0.0;
    return isfinite(x) && isfinite(y) ? fabs(x - y) : 0.0;
  }
};

}  // namespace

template <class T>
int64_t count_nonfinite(const T* a, size_t n) {
  if (n == 0) return 0;
  thrust::counting_iterator<size_t> first(0);
  using D = detail::device_t<T>;
  const int64_t r = thrust::transform_reduce(thrust::device, first, first + n, NonFinite<D>{detail::as_device(a)},
                                             int64_t(0), thrust::plus<int64_t>());
  BURSTLAB_CUDA_CHECK(cudaGetLastError());
  return r;
}
template <class T>
double max_abs_diff(const T* a, const T* b, size_t n) {
  if (n == 0) return 0;
  thrust::counting_iterator<size_t> first(0);
  using D = detail::device_t<T>;
  const double r = thrust::transform_reduce(thrust::device, first, first + n,
                                            AbsDiff<D>{detail::as_device(a), detail::as_device(b)}, 0.0,
                                            thrust::maximum<double>());
  BURSTLAB_CUDA_CHECK(cudaGetLastError());
  return r;
}
template <class T>
double max_abs(const T* a, size_t n) {
  return max_abs_diff<T>(a, nullptr, n);
}

#define BURSTLAB_METRICS(T)                                    \
  template int64_t count_nonfinite<T>(const T*, size_t);       \
  template double max_abs_diff<T>(const T*, const T*, size_t); \
  template double max_abs<T>(const T*, size_t);
BURSTLAB_METRICS(double)
BURSTLAB_METRICS(float)
BURSTLAB_METRICS(bf16_t)
BURSTLAB_METRICS(f16_t)
#undef BURSTLAB_METRICS

}  // namespace burstlab::cuda
