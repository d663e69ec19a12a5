// cuda/v15_bwd.cu — variant 15: v14's one-pass backward (spec §5, eq. 5.1-5.7; §5.3) at d = 64
// with 128-row query tiles, FlashAttention-3's tile for this head dimension. A dK/dV CTA still
// holds 128 keys (64 per consumer warpgroup), but each stage of the ring brings 128 query rows of
// Q and dO: S^T and dP^T are m64n128 products, dV += P^T dO and dK += dS^T Q run over 128 rows,
// and dQ_part is two m64n32 products per warpgroup (query rows 0-63 and 64-127, the two panels of
// the dS^T tile), handed to the store thread as two of v14's fp32 blocks (dq_acc keeps its
// 64-row blocks, so dq_convert is shared). Half as many tiles per CTA pay the per-tile work that
// is not a product: the ring's barriers, the mask test, the dS^T barrier, the hand-offs, the
// descriptors. Shared memory: 213 KiB (v14: 131 KiB); d = 128 would not fit. Otherwise as v14:
// whole backward only; no deterministic mode. The kernel, v5's with STORE and BQ = 128: bwd_ss.cuh.
#include "bwd_ss.cuh"

namespace burstlab::cuda::detail {

template <class T>
bool v15_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  return ss_backward<T, true, 128>(a, dq_acc, s, why);
}

template bool v15_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v15_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
