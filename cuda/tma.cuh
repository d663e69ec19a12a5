// cuda/tma.cuh — Hopper's bulk tensor copy engine (TMA) and shared-memory mbarriers, the
// producer/consumer pipeline of the warp-specialized v4 kernels. Device side: thin PTX wrappers;
// host side: a tensor map over one (B, H, N, d) view whose boxes land in the sw128 layout of
// wgmma.cuh (box = 64 elements of d x ROWS rows, 128-byte swizzle). Internal; include from .cu
// files compiled for sm_90a only.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "mma.cuh"

namespace burstlab::cuda::detail::tma {

using v2::smem_u32;

// ---- mbarriers (PTX ISA "mbarrier"): a phase completes when `count` arrivals and the expected
// transaction bytes have both arrived; waiters test the parity of the phase they need.
__device__ __forceinline__ void init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the inits visible to the async proxy (the copy engine) before any barrier use.
__device__ __forceinline__ void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival that also announces `bytes` of copies completing on this phase.
__device__ __forceinline__ void arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Blocks until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and
// the phase before it (parity 1) counts as completed: producers start by waiting on parity 1.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- copies: box (64, ROWS) of the 4-d map at element coordinates (c_d, c_n, c_h, c_b) into
// shared memory (1024-byte aligned), completing `bar`'s transaction bytes. Out-of-range rows
// (past N) are filled with zeros, and their bytes still count.
__device__ __forceinline__ void load_4d(void* dst, const CUtensorMap* map, int c_d, int c_n, int c_h, int c_b,
                                        uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c_d), "r"(c_n), "r"(c_h), "r"(c_b), "r"(smem_u32(bar))
      : "memory");
}
// The reverse: box (64, ROWS) from shared memory (1024-byte aligned, the same layout) to the map at
// (c_d, c_n, c_h, c_b), as a bulk group of the issuing thread (bulk_commit, bulk_wait_read before
// `src` is overwritten or the CTA exits). Rows past N are not written.
__device__ __forceinline__ void store_4d(const CUtensorMap* map, int c_d, int c_n, int c_h, int c_b, const void* src) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c_d), "r"(c_n), "r"(c_h), "r"(c_b), "r"(smem_u32(src))
               : "memory");
}
// Orders this thread's ordinary shared-memory writes before the copy engine's reads of them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- bulk reduction into global memory: dst[i] += src[i] for `bytes` bytes of fp32 (16-byte
// aligned, a multiple of 16), element-wise atomic; completes as a bulk group of the issuing
// thread, which must wait for the reads before `src` is overwritten (or the CTA exits).
__device__ __forceinline__ void reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Named barrier `id` (1..15; 0 is __syncthreads) over `n` threads (whole warps): bar_sync waits
// until n threads have arrived or synced on it; bar_arrive counts the caller and goes on.
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// ---- warpgroup register budgets (setmaxnreg, sm_90a): the producer gives registers back, the
// consumers take them. Every warp of a warpgroup executes the same one.
template <int N>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// Host: a tensor map over the (B, H, N, d) view (data, dim, stride in elements) of 16-bit
// elements (bf16 when is_bf16, else fp16) with boxes of (64, rows) and the 128-byte swizzle.
// Returns false with *why set when the driver cannot describe the view (the caller falls back).
bool encode_4d(CUtensorMap* map, const void* data, const int64_t* dim, const int64_t* stride, bool is_bf16,
               int rows, const char** why);

}  // namespace burstlab::cuda::detail::tma
