// cuda/v14_bwd.cu — variant 14: v5's one-pass backward (spec §5, eq. 5.1-5.7; §5.3; P^T and dS^T
// read from shared memory by dV's and dK's products) with dQ_part's bulk atomic add issued by a
// store thread of the producer warpgroup (lane 0 of warp 2 + w for consumer warpgroup w;
// FlashAttention-3's dQ writer) instead of a consumer thread. Per tile a consumer warpgroup waits on
// mbarrier dq_empty[w] until its fp32 block is free, stores dQ_part there with the block's offset in
// dq_acc, and arrives on dq_full[w] without waiting; the store thread waits on dq_full[w], issues the
// add, waits until the copy engine has read the block and arrives on dq_empty[w]. v5 syncs the
// warpgroup's 128 threads twice per tile and one of them issues the add. (Variant 13 passed the
// block with named barriers; racecheck could not follow bar.arrive, cuda/README.md.)
// Otherwise as v5: whole backward only; no deterministic mode; v5's limits (v14_backward returns
// false, nothing launched, where v5 would). The kernel, v5's with STORE: bwd_ss.cuh.
#include "bwd_ss.cuh"

namespace burstlab::cuda::detail {

template <class T>
bool v14_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  return ss_backward<T, true>(a, dq_acc, s, why);
}

template bool v14_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v14_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
