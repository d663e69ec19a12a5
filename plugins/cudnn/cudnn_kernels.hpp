// plugins/cudnn/cudnn_kernels.hpp — the cuDNN plug-in's own kernels (cudnn_kernels.cu), on stream s.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "burstlab/plugin.h"

namespace burstlab::cudnn_plugin {

// O (B, H_q, n, d) in T <- per row (D / sum_k dO_k^2) dO: a stand-in for the rows' O whose row sums
// with dO are D (eq. 5.1), for a backward that derives D from O. D (B, H_q, n) fp32.
void surrogate_O(burstlab_dtype t, const burstlab_view4& dO, const burstlab_view3& D, const burstlab_view4& O,
                 cudaStream_t s);
// O <- O_packed (T, (B, H, n, d)) and LSE <- LSE_packed (fp32, (B, H, n)): cuDNN's packed forward
// output into the strides of the caller's rows.
void copy_rows(burstlab_dtype t, const burstlab_view4& O, const burstlab_view4& O_packed, const burstlab_view3& LSE,
               const burstlab_view3& LSE_packed, cudaStream_t s);
// acc (fp32) += in (T), elementwise over (B, H, n, d).
void accumulate(burstlab_dtype t, const burstlab_view4& acc, const burstlab_view4& in, cudaStream_t s);

}  // namespace burstlab::cudnn_plugin
