// cuda/v5_bwd.cu — variant 5: the backward (spec §5, eq. 5.1-5.7; §5.3) in one pass, as v4's
// one-pass mode (the same CTA, producer, row facts and dQ scratch: bwd_ws.cuh), with P^T and dS^T
// in shared memory (dS^T already goes there, for dQ_part = dS K): dV += P^T dO (5.3) and
// dK += dS^T Q (5.7) read both operands there instead of registers, so the 32 registers of their
// A fragments are free once stored (ptxas: 4 bytes of spill at d = 128 against v4's 36).
// Measured and dropped (docs/performance-gpu.md, knobs of commit 2f8fbd9): issuing the next tile's
// S^T and dP^T before a tile's dQ block leaves, with those registers; it fits at d = 64 only (at
// d = 128 ptxas serializes every product) and was slower there.
// CTA = (b, kv-head, 128 keys); per visited (q-head, 64-row query tile), in order:
//   S^T = K Q^T, dP^T = V dO^T issued and waited for; P^T = 2^(S^T c - LSE) (5.2) and
//   dS^T = P^T (dP^T - D) (5.5) in registers, rounded to T into shared memory; barrier 1 (both
//   warpgroups' dS^T); dV, dK and dQ_part = dS K over the CTA's 128 keys (5.6; half of d per
//   warpgroup) issued; wait for dV, dK (the stage released), then dQ_part; dQ_part to dq_acc.
// dQ's sums arrive in a varying order: not bitwise repeatable, so v5 has no deterministic mode
// (auto runs v4's two passes then). Whole backward only (backward_block runs v4).
// Limits: v4's (bf16/fp16, d in {64, 128}, views the copy engine can describe, compute
// capability 9.0); v5_backward returns false (nothing launched) otherwise. The kernel: bwd_ss.cuh.
#include "bwd_ss.cuh"

namespace burstlab::cuda::detail {

template <class T>
bool v5_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  return ss_backward<T, false>(a, dq_acc, s, why);
}

template bool v5_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v5_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
