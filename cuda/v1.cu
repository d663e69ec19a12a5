// cuda/v1.cu — variant 1: plain CUDA cores, one warp per row (forward, dQ) or per key (dK, dV).
// Spec §4.1 (online softmax, eq. 4.1-4.4), §5 (eq. 5.1-5.7), §6 (blocks over global positions).
// The GPU baseline and the fallback for what v2 does not cover: any d (<= 1024), every dtype
// (fp64 accumulates in fp64, fp32/bf16/fp16 in fp32), every mask, GQA, any strides, indexed
// positions. No shared state between warps, no atomics: deterministic and race-free by design.
// Each lane owns elements k = lane, lane + 32, ... of the d-vectors; those live in shared memory
// (a private slice per warp) so any d works without register arrays.
#include <algorithm>

#include "detail.cuh"

namespace burstlab::cuda::detail {
namespace {

constexpr int kWarps = 4;  // rows (or keys) per block

// ------------------------------------------------------------------ forward, eq. (4.1)-(4.4)
template <class T>
__global__ void __launch_bounds__(kWarps * 32) v1_forward_kernel(FwdArgs<T> a) {
  using A = acc_t<T>;
  extern __shared__ unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarps + warp;  // local row
  if (r >= a.nq) return;
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / a.group, d = a.d;
  A* q = reinterpret_cast<A*>(smem_raw) + warp * 2 * d;  // (d) this row's query
  A* o = q + d;                                          // (d) unnormalized accumulator O~
  const T* qrow = a.Q.row(b, h, r);
  for (int64_t k = lane; k < d; k += 32) {
    q[k] = to_acc<A>(qrow[k * a.Q.stride[3]]);
    o[k] = A(0);
  }
  const int64_t ig = a.qp[r];
  int64_t j0 = 0, j1 = a.nk;  // local keys to visit
  int64_t lo = 0, hi = 0;     // global visible interval of row ig (eq. 3.4)
  row_range(a.mask, ig, &lo, &hi);
  if (!a.kp.index) local_range(a.mask, ig, a.kp, a.nk, &j0, &j1);
  A m = neg_inf<A>(), l = A(0);
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t jg = a.kp[j];
    if (jg < lo || jg >= hi || !block_bit(a.mask, ig, jg)) continue;  // warp-uniform
    const T* krow = a.K.row(b, hk, j);
    A s = A(0);
    for (int64_t k = lane; k < d; k += 32) s += q[k] * to_acc<A>(krow[k * a.K.stride[3]]);
    s = warp_sum(s) * a.scale;                               // S_ij (2.1)
    const A m_new = s > m ? s : m;                           // (4.1)
    const A alpha = m == neg_inf<A>() ? A(0) : exp(m - m_new);  // never (-inf) - (-inf)
    const A p = exp(s - m_new);
    l = alpha * l + p;                                       // (4.2)
    const T* vrow = a.V.row(b, hk, j);
    for (int64_t k = lane; k < d; k += 32) o[k] = alpha * o[k] + p * to_acc<A>(vrow[k * a.V.stride[3]]);  // (4.3)
    m = m_new;
  }
  // (4.4); rows with no visible key: (0, -inf)
  const A L = l > A(0) ? m + log(l) : neg_inf<A>();
  const A inv = l > A(0) ? A(1) / l : A(0);
  T* orow = a.O.row(b, h, r);
  A* Lp = &a.LSE(b, h, r);
  if (!a.accumulate) {
    for (int64_t k = lane; k < d; k += 32) orow[k * a.O.stride[3]] = from_acc<T, A>(o[k] * inv);
    if (lane == 0) *Lp = L;
    return;
  }
  // Fold into the running (O, LSE): the merge (4.5)-(4.7) with this partial as side b.
  A w_a, w_b, L_new;
  merge_weights<A>(*Lp, L, &w_a, &w_b, &L_new);
  for (int64_t k = lane; k < d; k += 32) {
    const A old = to_acc<A>(orow[k * a.O.stride[3]]);
    const A mine = o[k] * inv;
    // w == 0 terms are skipped so a NaN-free identity side never meets 0 * (garbage).
    const A v = (w_a != A(0) ? w_a * old : A(0)) + (w_b != A(0) ? w_b * mine : A(0));
    orow[k * a.O.stride[3]] = from_acc<T, A>(v);
  }
  __syncwarp();
  if (lane == 0) *Lp = L_new;
}

// ------------------------------------------------------------------ backward: dQ, eq. (5.2)-(5.6)
// One warp per (b, h, row): dQ_i = scale sum_j dS_ij K_j over the row's visible keys.
template <class T, class G>
__global__ void __launch_bounds__(kWarps * 32) v1_dq_kernel(BwdArgs<T, G> a) {
  using A = acc_t<T>;
  extern __shared__ unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarps + warp;
  if (r >= a.nq) return;
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / a.group, d = a.d;
  A* q = reinterpret_cast<A*>(smem_raw) + warp * 3 * d;
  A* dO = q + d;
  A* dq = dO + d;
  const T* qrow = a.Q.row(b, h, r);
  const T* dorow = a.dO.row(b, h, r);
  for (int64_t k = lane; k < d; k += 32) {
    q[k] = to_acc<A>(qrow[k * a.Q.stride[3]]);
    dO[k] = to_acc<A>(dorow[k * a.dO.stride[3]]);
    dq[k] = A(0);
  }
  const A lse = a.LSE(b, h, r), Di = a.D(b, h, r);
  const int64_t ig = a.qp[r];
  int64_t j0 = 0, j1 = a.nk, lo = 0, hi = 0;
  row_range(a.mask, ig, &lo, &hi);
  if (!a.kp.index) local_range(a.mask, ig, a.kp, a.nk, &j0, &j1);
  if (lse == neg_inf<A>()) j1 = j0;  // empty row (globally): P = 0, no contribution (§2.3)
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t jg = a.kp[j];
    if (jg < lo || jg >= hi || !block_bit(a.mask, ig, jg)) continue;
    const T* krow = a.K.row(b, hk, j);
    const T* vrow = a.V.row(b, hk, j);
    A s = A(0), dp = A(0);
    for (int64_t k = lane; k < d; k += 32) {
      s += q[k] * to_acc<A>(krow[k * a.K.stride[3]]);
      dp += dO[k] * to_acc<A>(vrow[k * a.V.stride[3]]);  // (5.4)
    }
    s = warp_sum(s) * a.scale;
    dp = warp_sum(dp);
    const A p = exp(s - lse);    // (5.2)
    const A ds = p * (dp - Di);  // (5.5)
    for (int64_t k = lane; k < d; k += 32) dq[k] += ds * to_acc<A>(krow[k * a.K.stride[3]]);
  }
  G* out = a.dQ.row(b, h, r);
  for (int64_t k = lane; k < d; k += 32) {  // (5.6)
    const A v = a.scale * dq[k];
    G& x = out[k * a.dQ.stride[3]];
    x = a.accumulate ? from_acc<G, A>(to_acc<A>(x) + v) : from_acc<G, A>(v);
  }
}

// ------------------------------------------------------------------ backward: dK, dV, eq. (5.3), (5.7)
// One warp per (b, kv-head, key): sums over the group's q-heads and every row that sees the key.
template <class T, class G>
__global__ void __launch_bounds__(kWarps * 32) v1_dkdv_kernel(BwdArgs<T, G> a) {
  using A = acc_t<T>;
  extern __shared__ unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = int64_t(blockIdx.x) * kWarps + warp;
  if (j >= a.nk) return;
  const int64_t hk = blockIdx.y, b = blockIdx.z, d = a.d;
  A* kk = reinterpret_cast<A*>(smem_raw) + warp * 4 * d;
  A* vv = kk + d;
  A* dk = vv + d;
  A* dv = dk + d;
  const T* krow = a.K.row(b, hk, j);
  const T* vrow = a.V.row(b, hk, j);
  for (int64_t k = lane; k < d; k += 32) {
    kk[k] = to_acc<A>(krow[k * a.K.stride[3]]);
    vv[k] = to_acc<A>(vrow[k * a.V.stride[3]]);
    dk[k] = A(0);
    dv[k] = A(0);
  }
  const int64_t jg = a.kp[j];
  for (int64_t h = hk * a.group; h < (hk + 1) * a.group; ++h) {
    for (int64_t r = 0; r < a.nq; ++r) {
      const int64_t ig = a.qp[r];
      if (!visible(a.mask, ig, jg)) continue;  // warp-uniform
      const A lse = a.LSE(b, h, r);
      if (lse == neg_inf<A>()) continue;       // cannot happen for a visible pair; be safe
      const T* qrow = a.Q.row(b, h, r);
      const T* dorow = a.dO.row(b, h, r);
      A s = A(0), dp = A(0);
      for (int64_t k = lane; k < d; k += 32) {
        s += to_acc<A>(qrow[k * a.Q.stride[3]]) * kk[k];
        dp += to_acc<A>(dorow[k * a.dO.stride[3]]) * vv[k];
      }
      s = warp_sum(s) * a.scale;
      dp = warp_sum(dp);
      const A p = exp(s - lse);
      const A ds = p * (dp - a.D(b, h, r));
      for (int64_t k = lane; k < d; k += 32) {
        dv[k] += p * to_acc<A>(dorow[k * a.dO.stride[3]]);  // (5.3)
        dk[k] += ds * to_acc<A>(qrow[k * a.Q.stride[3]]);   // (5.7)
      }
    }
  }
  G* dkrow = a.dK.row(b, hk, j);
  G* dvrow = a.dV.row(b, hk, j);
  for (int64_t k = lane; k < d; k += 32) {
    const A vk = a.scale * dk[k], vv_ = dv[k];
    G& xk = dkrow[k * a.dK.stride[3]];
    G& xv = dvrow[k * a.dV.stride[3]];
    xk = a.accumulate ? from_acc<G, A>(to_acc<A>(xk) + vk) : from_acc<G, A>(vk);
    xv = a.accumulate ? from_acc<G, A>(to_acc<A>(xv) + vv_) : from_acc<G, A>(vv_);
  }
}

// ------------------------------------------------------------------ D, eq. (5.1), and the merge
template <class T>
__global__ void __launch_bounds__(kWarps * 32) compute_D_kernel(View4<const T> O, View4<const T> dO,
                                                                View3<acc_t<T>> D) {
  using A = acc_t<T>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarps + warp;
  if (r >= O.dim[2]) return;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const T* o = O.row(b, h, r);
  const T* g = dO.row(b, h, r);
  A s = A(0);
  for (int64_t k = lane; k < O.dim[3]; k += 32)
    s += to_acc<A>(o[k * O.stride[3]]) * to_acc<A>(g[k * dO.stride[3]]);
  s = warp_sum(s);
  if (lane == 0) D(b, h, r) = s;
}

// The same D for 16-bit storage whose rows are 16-byte aligned with unit d-stride (every view the
// tensor-core backward accepts): TPR = d / 8 threads per row, one 16-byte chunk of O and of dO
// each, summed across the TPR lanes. The one-warp-per-row kernel above moved 27% of the DRAM
// bandwidth on H200 (ncu, d = 64), one 2-byte load per lane at a time.
template <class T, int TPR>
__global__ void __launch_bounds__(256) compute_D_vec_kernel(View4<const T> O, View4<const T> dO,
                                                            View3<acc_t<T>> D) {
  using A = acc_t<T>;
  const int sub = threadIdx.x % TPR;
  const int64_t r = int64_t(blockIdx.x) * (256 / TPR) + threadIdx.x / TPR;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  A s = A(0);
  if (r < O.dim[2]) {
    const uint4 o = reinterpret_cast<const uint4*>(O.row(b, h, r))[sub];
    const uint4 g = reinterpret_cast<const uint4*>(dO.row(b, h, r))[sub];
    const T* ov = reinterpret_cast<const T*>(&o);
    const T* gv = reinterpret_cast<const T*>(&g);
#pragma unroll
    for (int k = 0; k < 8; ++k) s += to_acc<A>(ov[k]) * to_acc<A>(gv[k]);
  }
#pragma unroll
  for (int off = TPR / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (r < O.dim[2] && sub == 0) D(b, h, r) = s;
}

// One warp per row: the lanes read and write consecutive elements of the row (coalesced), and
// each computes the row's weights.
template <class T>
__global__ void __launch_bounds__(128) merge_kernel(View4<T> O_a, View3<acc_t<T>> L_a,
                                                    View4<const T> O_b, View3<const acc_t<T>> L_b) {
  using A = acc_t<T>;
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= O_a.dim[2]) return;
  const int lane = threadIdx.x % 32;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  A w_a, w_b, L;
  merge_weights<A>(L_a(b, h, r), L_b(b, h, r), &w_a, &w_b, &L);  // (4.5)-(4.6)
  T* oa = O_a.row(b, h, r);
  const T* ob = O_b.row(b, h, r);
  for (int64_t k = lane; k < O_a.dim[3]; k += 32) {  // (4.7); an empty side is skipped, not multiplied
    const A x = w_a != A(0) ? w_a * to_acc<A>(oa[k * O_a.stride[3]]) : A(0);
    const A y = w_b != A(0) ? w_b * to_acc<A>(ob[k * O_b.stride[3]]) : A(0);
    oa[k * O_a.stride[3]] = from_acc<T, A>(x + y);
  }
  __syncwarp();  // every lane has read the row's LSE
  if (lane == 0) L_a(b, h, r) = L;
}

inline dim3 rows_grid(int64_t n, int64_t H, int64_t B, int per) {
  return dim3(static_cast<unsigned>((n + per - 1) / per), static_cast<unsigned>(H),
              static_cast<unsigned>(B));
}

}  // namespace

template <class T>
void v1_forward(const FwdArgs<T>& a, cudaStream_t s) {
  if (a.nq == 0) return;
  const size_t smem = size_t(kWarps) * 2 * a.d * sizeof(acc_t<T>);
  allow_smem(reinterpret_cast<const void*>(&v1_forward_kernel<T>), smem);
  v1_forward_kernel<T><<<rows_grid(a.nq, a.Hq, a.B, kWarps), kWarps * 32, smem, s>>>(a);
  BURSTLAB_CUDA_LAUNCH_CHECK("v1_forward_kernel");
}

template <class T, class G>
void v1_backward(const BwdArgs<T, G>& a, cudaStream_t s) {
  using A = acc_t<T>;
  if (a.nq > 0) {
    const size_t smem = size_t(kWarps) * 3 * a.d * sizeof(A);
    allow_smem(reinterpret_cast<const void*>(&v1_dq_kernel<T, G>), smem);
    v1_dq_kernel<T, G><<<rows_grid(a.nq, a.Hq, a.B, kWarps), kWarps * 32, smem, s>>>(a);
    BURSTLAB_CUDA_LAUNCH_CHECK("v1_dq_kernel");
  }
  if (a.nk > 0) {
    const size_t smem = size_t(kWarps) * 4 * a.d * sizeof(A);
    allow_smem(reinterpret_cast<const void*>(&v1_dkdv_kernel<T, G>), smem);
    v1_dkdv_kernel<T, G><<<rows_grid(a.nk, a.Hkv, a.B, kWarps), kWarps * 32, smem, s>>>(a);
    BURSTLAB_CUDA_LAUNCH_CHECK("v1_dkdv_kernel");
  }
}

template <class T>
void launch_compute_D(View4<const T> O, View4<const T> dO, View3<acc_t<T>> D, cudaStream_t s) {
  if (O.dim[2] == 0) return;
  if constexpr (sizeof(T) == 2) {  // the tensor-core variants' view rules: d, alignment, strides
    const int64_t d = O.dim[3];
    if ((d == 64 || d == 128) && !aligned_view_rule(reinterpret_cast<uintptr_t>(O.data), O.stride) &&
        !aligned_view_rule(reinterpret_cast<uintptr_t>(dO.data), dO.stride)) {
      const int rows = d == 64 ? 32 : 16;  // per block of 256 threads
      const dim3 grid(static_cast<unsigned>((O.dim[2] + rows - 1) / rows), static_cast<unsigned>(O.dim[1]),
                      static_cast<unsigned>(O.dim[0]));
      if (d == 64) compute_D_vec_kernel<T, 8><<<grid, 256, 0, s>>>(O, dO, D);
      else compute_D_vec_kernel<T, 16><<<grid, 256, 0, s>>>(O, dO, D);
      BURSTLAB_CUDA_LAUNCH_CHECK("compute_D_vec_kernel");
      return;
    }
  }
  compute_D_kernel<T><<<rows_grid(O.dim[2], O.dim[1], O.dim[0], kWarps), kWarps * 32, 0, s>>>(O, dO, D);
  BURSTLAB_CUDA_LAUNCH_CHECK("compute_D_kernel");
}

template <class T>
void launch_merge(View4<T> O_a, View3<acc_t<T>> L_a, View4<const T> O_b, View3<const acc_t<T>> L_b,
                  cudaStream_t s) {
  if (O_a.dim[2] == 0) return;
  merge_kernel<T><<<rows_grid(O_a.dim[2], O_a.dim[1], O_a.dim[0], 128 / 32), 128, 0, s>>>(O_a, L_a, O_b, L_b);
  BURSTLAB_CUDA_LAUNCH_CHECK("merge_kernel");
}

#define BURSTLAB_V1(T)                                                                       \
  template void v1_forward<T>(const FwdArgs<T>&, cudaStream_t);                              \
  template void v1_backward<T, T>(const BwdArgs<T, T>&, cudaStream_t);                       \
  template void launch_compute_D<T>(View4<const T>, View4<const T>, View3<acc_t<T>>, cudaStream_t); \
  template void launch_merge<T>(View4<T>, View3<acc_t<T>>, View4<const T>, View3<const acc_t<T>>, \
                                cudaStream_t);
BURSTLAB_V1(double)
BURSTLAB_V1(float)
BURSTLAB_V1(bf16)
BURSTLAB_V1(f16)
template void v1_backward<bf16, float>(const BwdArgs<bf16, float>&, cudaStream_t);
template void v1_backward<f16, float>(const BwdArgs<f16, float>&, cudaStream_t);
#undef BURSTLAB_V1

}  // namespace burstlab::cuda::detail
