// cuda/v16_bwd.cu — variant 16: the one-pass backward (spec §5, eq. 5.1-5.7; §5.3) with the two
// consumer warpgroups on different query tiles instead of different keys, so that they never meet
// at a barrier per tile.
// v4, v5 and v14 give each warpgroup 64 of a CTA's 128 keys; dQ_part = dS K needs both halves of
// dS^T, so the warpgroups wait for each other every tile and compute P^T and dS^T at the same
// moment while the tensor cores idle (ncu: tensor pipe 50% busy against cuDNN's 64%,
// docs/performance-gpu.md). Here a CTA holds 64 keys (b, kv-head, one wgmma M), which both
// warpgroups share; the visited (q-head, 64-row query tile) pairs go to them by turns (stage k of
// the ring to warpgroup k % 2), and each forms a whole tile alone:
//   S^T = K Q^T, dP^T = V dO^T (shared-memory operands), P^T (5.2) and dS^T (5.5) in registers,
//   dV += P^T dO (5.3) and dK += dS^T Q (5.7) with A from registers, dS^T through shared memory
//   (a barrier of the warpgroup's own 128 threads) for dQ_part = dS K over the 64 keys (5.6, d
//   columns in products of N = 64), written over the stage's Q and dO once dV and dK are done.
// A store thread per warpgroup (lane 0 of the producer's warp 2 + w) adds that fp32 block into
// dq_acc by the copy engine's bulk atomic add and then frees the stage, so the block needs no
// shared memory of its own. Each warpgroup's dK and dV cover its own query tiles: at the end
// warpgroup 1's dV and warpgroup 0's dK cross over through K's and V's tiles, and each writes one.
// The cost: a CTA's Q and dO tiles serve 64 keys (v4: 128), twice the L2 reads per product.
// Whole backward only (backward_block runs v4); no deterministic mode (dQ's sums arrive in a
// varying order); v4's limits (v16_backward returns false, nothing launched, where v4 would).
#include <climits>
#include <cstdint>

#include "bwd_ws.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

constexpr int kKeys = 64;  // keys per CTA
// Ring stages: even, so that warpgroup w always takes the stages of parity w; 2 (d = 128) or 4
// (d = 64) per warpgroup, what shared memory holds.
template <int D>
constexpr int kStages16 = D == 128 ? 4 : 8;

// Shared memory from the first 1024-byte boundary: K, V (64, D); S stages of [Q, dO] (64, D), each
// later the fp32 dQ_part block (64 x D floats, the same bytes); per warpgroup two dS^T tiles (64
// keys, 64 rows); the stages' row facts. Tiles sw128.
template <int D>
constexpr size_t v16_smem_bytes(size_t elem) {
  return size_t(2 * kKeys + 2 * kStages16<D> * kBQ) * D * elem + 4 * kKeys * kBQ * elem +
         kStages16<D> * sizeof(RowStats<kBQ>) + 1024;
}

// dQ_part = dS K over the CTA's 64 keys, columns [64 n, 64 n + 64) (5.6): A = dS from the dS^T tile
// cS (M-major), B = K's panel n (N-major); issued and committed.
template <class T>
__device__ __forceinline__ void issue_dq64(float (&dq)[32], const T* cS, const T* kB) {
  const uint64_t dA = v3::opaque(v3::desc_mn_base<kKeys>(cS)), dB = v3::opaque(v3::desc_mn_base<kKeys>(kB));
  v3::fence();
  v3::Wgmma<T>::template ss0<64, 1, 1>(dq, dA, dB);
#pragma unroll
  for (int kk = 1; kk < kKeys / 16; ++kk)
    v3::Wgmma<T>::template ss<64, 1, 1>(dq, v3::desc_mn_step(dA, kk), v3::desc_mn_step(dB, kk), 1);
  v3::commit();
}

// Columns [64 n, 64 n + 64) of dQ_part into the block qs in dq_acc's order (bwd_ws.cuh's
// dq_acc_index: thread t's float4 c at c 128 + t), 16-byte stores without bank conflicts.
__device__ __forceinline__ void put_dq64(const float (&dq)[32], float* qs, int n, int wtid) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
    reinterpret_cast<float4*>(qs)[(8 * n + c) * 128 + wtid] =
        make_float4(dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3]);
}

// The store thread of warpgroup w: per stage w, w + 2, ... (off[st] < 0: the warpgroup is done)
// adds the block written over the stage into dq_acc, waits until the copy engine has read it, and
// frees the stage for the producer.
template <class T, int D, int S>
__device__ __forceinline__ void dq_store16(const T* sQO, uint64_t (&full)[S], const int64_t (&off)[S],
                                           RingBars<S>& bars, float* dq_acc, int w) {
  int st = w;
  uint32_t ph = 0;
  for (;;) {
    tma::wait(&full[st], ph);
    const int64_t o = off[st];
    if (o < 0) break;
    tma::reduce_add_f32(dq_acc + o, reinterpret_cast<const float*>(sQO + st * (2 * kBQ * D)),
                        64 * D * sizeof(float));
    tma::bulk_commit();
    tma::bulk_wait_read();
    tma::arrive(&bars.empty[st]);
    if ((st += 2) >= S) { st -= S; ph ^= 1; }
  }
  tma::bulk_wait();  // the last add is done before the CTA exits
}

template <class T, int D, bool BLOCK>
__global__ void __launch_bounds__(kThreads, 1)
    v16_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                   const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, T> a,
                   float* dq_acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages16<D>, BQ = kBQ;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* const sK = reinterpret_cast<T*>(align1024(smem_raw));  // (64, D) sw128
  T* const sV = sK + kKeys * D;                              // (64, D)
  T* const sQO = sV + kKeys * D;                             // S x [(BQ, D) Q, (BQ, D) dO]
  T* const sdS = sQO + S * 2 * BQ * D;                       // 2 warpgroups x 2 x (64 keys, BQ) dS^T
  RowStats<BQ>* const sR = reinterpret_cast<RowStats<BQ>*>(sdS + 4 * kKeys * BQ);  // S x facts
  __shared__ RingBars<S> bars;
  __shared__ uint64_t dq_full[S];  // the consumers' 128 arrivals: the stage holds a dQ_part block
  __shared__ int64_t dq_off[S];    // its offset in dq_acc (< 0: no more blocks)
  // warp through a shuffle, so that ptxas knows it is warp-uniform (measured faster: cuda/README.md)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / 32, 0), lane = tid % 32, g = lane >> 2,
            t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const DkdvCta cta = dkdv_cta<BQ, T, T, kKeys>(a);
  const int64_t hk = cta.hk, b = cta.b, j0 = cta.j0, group = a.group;
  const int nqt = cta.nqt;
  if (tid == 0) {
    tma::init(&bars.once, 1);
    for (int s = 0; s < S; ++s) {
      tma::init(&bars.full[s], 1 + 32);
      tma::init(&bars.empty[s], 1);  // the store thread, once the block over the stage is read
      tma::init(&dq_full[s], 128);
    }
    tma::fence_init();
  }
  __syncthreads();
  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP>();
    if (warp >= 2) {
      if (lane == 0) dq_store16<T, D, S>(sQO, dq_full, dq_off, bars, dq_acc, warp - 2);
      return;
    }
    dkdv_producer<T, T, D, BQ, S, BLOCK, false, kKeys, 2>(a, cta, &mK, &mV, &mQ, &mdO, sK, sV, sQO, sR, bars, warp,
                                                          lane);
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<kRegC>();
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const int krow = (warp % 4) * 16;       // my warp's first key in the CTA
  const int wtid = tid - 128 * (wg + 1);  // my thread in the warpgroup
  T* const myS = sdS + wg * (2 * kKeys * BQ);
  int dsb = 0;                 // my dS^T buffer
  float dk[D / 2], dv[D / 2];  // my 2 keys x D/4 columns over my query tiles (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint64_t dKd0 = v3::desc_k_base<kKeys>(sK, 0), dVd0 = v3::desc_k_base<kKeys>(sV, 0);
  tma::wait(&bars.once, 0);
  int st = wg;
  uint32_t ph = 0;
  for (;;) {
    tma::wait(&bars.full[st], ph);
    const RowStats<BQ>& R = sR[st];
    const int it = R.it;
    T* const cQ = sQO + st * (2 * BQ * D);
    if (it < 0) {
      if (wtid == 0) dq_off[st] = -1;
      tma::arrive(&dq_full[st]);
      break;
    }
    const T* cO = cQ + BQ * D;
    T* const cS = myS + dsb * (kKeys * BQ);
    float s[BQ / 2], dp[BQ / 2];  // S^T, dP^T: my keys x BQ rows
    v3::pin(dk);
    v3::pin(dv);
    issue_sdp<T, D, kKeys>(s, dp, dKd0, dVd0, cQ, cO);
    v3::wait<0>();
    v3::pin(s);
    v3::pin(dp);
    dkdv_p<T, T, BQ, BLOCK, false>(s, R, R.full, a, int64_t(it % nqt) * BQ, j0, krow, g, t4, sl2);  // P^T (5.2)
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
    v3::pack_a<T, BQ>(pa, s);
    dkdv_ds<BQ>(dp, s, R, t4);  // dS^T (5.5)
    v3::pack_a<T, BQ>(sa, dp);
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = krow + g + 8 * (j & 1), c = 16 * kk + 8 * (j >> 1) + 2 * t4;
        *reinterpret_cast<uint32_t*>(cS + v3::sw128<kKeys>(r, c >> 3) + (c & 7)) = sa[kk][j];
      }
    v3::fence_proxy_async();
    const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
    v3::dvdk_products<T, D, BQ>(dv, dk, pa, sa, dOt, dQt);
    tma::bar_sync(2 + wg, 128);  // my warpgroup's dS^T stored
    float dq0[32];               // dQ_part, 64 query rows x columns [0, 64) (and [64, 128): dq1)
    issue_dq64<T>(dq0, cS, sK);
    v3::wait<1>();  // dV, dK done: the stage's Q and dO are read
    v3::pin(dk);
    v3::pin(dv);
    v3::pin(pa);
    v3::pin(sa);
    float* const qs = reinterpret_cast<float*>(cQ);
    if constexpr (D == 128) {
      float dq1[32];
      issue_dq64<T>(dq1, cS, sK + kKeys * 64);
      v3::wait<1>();
      v3::pin(dq0);
      put_dq64(dq0, qs, 0, wtid);
      v3::wait<0>();
      v3::pin(dq1);
      put_dq64(dq1, qs, 1, wtid);
    } else {
      v3::wait<0>();
      v3::pin(dq0);
      put_dq64(dq0, qs, 0, wtid);
    }
    v3::fence_proxy_async();
    const int64_t h = hk * group + it / nqt, qt = it % nqt;
    if (wtid == 0) dq_off[st] = dq_acc_index(a, b, h, qt, 0);
    tma::arrive(&dq_full[st]);  // release: my reads of the row facts and my block's stores before it
    dsb ^= 1;
    if ((st += 2) >= S) { st -= S; ph ^= 1; }
  }
  // dK and dV over all the CTA's query tiles: warpgroup 1's dV to warpgroup 0, 0's dK to 1, through
  // K's and V's tiles (64 D floats, free once both warpgroups' products are done).
  float4* const x = reinterpret_cast<float4*>(sK);
  tma::bar_sync(1, 256);
  if (wg == 1)
#pragma unroll
    for (int c = 0; c < D / 8; ++c) x[c * 128 + wtid] = make_float4(dv[4 * c], dv[4 * c + 1], dv[4 * c + 2], dv[4 * c + 3]);
  tma::bar_sync(1, 256);
  if (wg == 0)
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      const float4 u = x[c * 128 + wtid];
      dv[4 * c] += u.x, dv[4 * c + 1] += u.y, dv[4 * c + 2] += u.z, dv[4 * c + 3] += u.w;
    }
  tma::bar_sync(1, 256);
  if (wg == 0)
#pragma unroll
    for (int c = 0; c < D / 8; ++c) x[c * 128 + wtid] = make_float4(dk[4 * c], dk[4 * c + 1], dk[4 * c + 2], dk[4 * c + 3]);
  tma::bar_sync(1, 256);
  if (wg == 1)
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      const float4 u = x[c * 128 + wtid];
      dk[4 * c] += u.x, dk[4 * c + 1] += u.y, dk[4 * c + 2] += u.z, dk[4 * c + 3] += u.w;
    }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int64_t j = j0 + krow + g + 8 * ri;
    if (j >= a.nk) continue;
    if (wg == 0) epilogue::store_row<T, D>(a.dV.row(b, hk, j), dv, ri, t4, 1.f);
    else epilogue::store_row<T, D>(a.dK.row(b, hk, j), dk, ri, t4, static_cast<float>(a.scale));
  }
#else
  __trap();
#endif
}

template <class T, int D, bool BLOCK>
void launch16(const CUtensorMap (&m)[4], const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s) {
  auto k = &v16_bwd_kernel<T, D, BLOCK>;
  constexpr size_t smem = v16_smem_bytes<D>(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  const int64_t ctas = (a.nk + kKeys - 1) / kKeys * a.Hkv * a.B;  // 1-d: see dkdv_cta
  if (ctas > INT_MAX) fail("v16 backward: ", ctas, " CTAs exceed the grid limit");
  k<<<static_cast<unsigned>(ctas), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc);
  BURSTLAB_CUDA_LAUNCH_CHECK("v16_bwd_kernel");
}

template <class T, int D>
bool launch16_bwd(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  constexpr bool bf = std::is_same<T, bf16>::value;
  CUtensorMap m[4];  // K, V in boxes of 64 keys; Q, dO of kBQ rows
  if (!tma::encode_4d(&m[0], a.K.data, a.K.dim, a.K.stride, bf, kKeys, why) ||
      !tma::encode_4d(&m[1], a.V.data, a.V.dim, a.V.stride, bf, kKeys, why) ||
      !tma::encode_4d(&m[2], a.Q.data, a.Q.dim, a.Q.stride, bf, kBQ, why) ||
      !tma::encode_4d(&m[3], a.dO.data, a.dO.dim, a.dO.stride, bf, kBQ, why))
    return false;
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  if (a.mask.block) launch16<T, D, true>(m, a, dq_acc, s);
  else launch16<T, D, false>(m, a, dq_acc, s);
  launch_dq_convert<T, T, D>(a, dq_acc, s);
  return true;
}

}  // namespace

template <class T>
bool v16_backward(const BwdArgs<T, T>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != 64 && a.d != 128) { *why = "v16 needs d in {64, 128}"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    v3_backward<T>(a, s);        // v3 writes the zeros
    return true;
  }
  return a.d == 64 ? launch16_bwd<T, 64>(a, dq_acc, s, why) : launch16_bwd<T, 128>(a, dq_acc, s, why);
}

template bool v16_backward<bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v16_backward<f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
