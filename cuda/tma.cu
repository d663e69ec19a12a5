// cuda/tma.cu — host side of tma.cuh: tensor maps for the v4 kernels' copies.
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "tma.cuh"

namespace burstlab::cuda::detail::tma {

namespace {
// cuTensorMapEncodeTiled is a driver API: it is looked up through the runtime, so that nothing
// links libcuda (binaries must load on the CI machine, which has no driver).
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}
}  // namespace

bool encode_4d(CUtensorMap* map, const void* data, const int64_t* dim, const int64_t* stride, bool is_bf16,
               int rows, const char** why) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = encoder();
  if (!fn) { *why = "the driver has no cuTensorMapEncodeTiled"; return false; }
  if (stride[3] != 1 || dim[3] % 64 != 0) { *why = "TMA boxes need unit stride along d and d a multiple of 64"; return false; }
  for (int i = 0; i < 3; ++i)
    if (dim[i] < 1 || dim[i] > (int64_t(1) << 31)) { *why = "TMA needs every dimension in [1, 2^31]"; return false; }
  // Innermost first: (d, N, H, B). A dimension of extent 1 is never stepped along; its stride is
  // replaced by a valid one (the driver rejects 0 and strides that are not multiples of 16 bytes).
  const cuuint64_t gdim[4] = {cuuint64_t(dim[3]), cuuint64_t(dim[2]), cuuint64_t(dim[1]), cuuint64_t(dim[0])};
  const int64_t sel[3] = {stride[2], stride[1], stride[0]};
  cuuint64_t gstride[3];
  for (int i = 0; i < 3; ++i) {
    const int64_t s = gdim[i + 1] == 1 ? dim[3] : sel[i];
    if (s <= 0 || (s * 2) % 16 != 0 || s * 2 >= (int64_t(1) << 40)) {
      *why = "TMA needs strides that are positive multiples of 16 bytes";
      return false;
    }
    gstride[i] = cuuint64_t(s * 2);
  }
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1};
  const cuuint32_t estride[4] = {1, 1, 1, 1};
  const CUresult r = fn(map, is_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                        const_cast<void*>(data), gdim, gstride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { *why = "cuTensorMapEncodeTiled rejected the view"; return false; }
  return true;
}

}  // namespace burstlab::cuda::detail::tma
