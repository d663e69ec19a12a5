// cuda/v10_bwd.cu — variant 10: v9's backward (v4's one-pass dK/dV kernel, the key tiles in v9's
// LPT order, bwd_scheduler.cuh) on a persistent grid (spec §5.3, §6.2): as many CTAs as fit on
// the device at once, each looping over work items (pair, key tile) handed out in the order's
// index order by a fetch-and-add (sched::fetch_item), instead of one CTA per item.
// What persistence overlaps: the ring of Q/dO stages and their row facts runs on across items,
// so the next item's first query tiles load while this one's last tiles compute; the next item's
// K and V are copied as soon as both consumer warpgroups have read the stage that ends this item
// (their last products of K and V are then complete), so that copy overlaps the item's dK/dV
// stores and its last dQ block. K/V have one buffer: a second does not fit beside the ring at
// d = 128 (about 199 KB of shared memory already).
// Per item the producer posts its tiles' stages, then an end stage (it = -1) carrying the item, on
// which the consumers write dK, dV and zero their accumulators; after the last item a stage with
// it = -2 ends the CTA. Every stage carries its item (b, kv-head, key tile), so the consumers never
// decode an item. Producer warp 0 fetches each item and hands it to warp 1 through a two-slot
// mailbox (named barrier 4 over the two warps).
// G = T: the whole backward; G = float: backward_block (indexed keys in their own instantiation),
// as v9. No deterministic mode. Limits: v4's one-pass mode's and more than 2^30 items;
// v10_backward returns false (nothing launched) otherwise. Knobs (benchmark and tests):
// BURSTLAB_V9_TAIL (the order's tail, as v9) and BURSTLAB_V10_GRID (n > 0: at most n CTAs, so that
// few CTAs loop over many items; 0: as many as fit).
#include <climits>
#include <cstdint>
#include <type_traits>

#include "bwd_scheduler.cuh"
#include "bwd_ws.cuh"
#include "tile_scheduler.cuh"

namespace burstlab::cuda::detail {
namespace {

using namespace bwd_ws;

// A stage's row facts (bwd_ws's RowStats; it = -1: the item ends, -2: the CTA ends) and its item.
struct Stage {
  RowStats<kBQ> r;
  int b, hk, kt;  // the item: batch, kv-head, key tile
};

struct Bars {
  uint64_t kv_full, kv_empty;  // K, V of the current item: copied / read by every consumer thread
  uint64_t full[kStages], empty[kStages];
};

// setmaxnreg budgets: the producer's item loop needs more than v4's 40 registers (ptxas spills);
// at d = 64 the consumers can give 16 each (56 + 2 x 216 <= 3 x 168, what setmaxnreg can grant at
// launch: bwd_ws's 40 / 232 use it all).
template <int D>
constexpr int kRegP10 = D == 64 ? 56 : kRegP;
template <int D>
constexpr int kRegC10 = D == 64 ? 216 : kRegC;
static_assert(kRegP10<64> + kWgs * kRegC10<64> <= (kWgs + 1) * 168 &&
                  kRegP10<128> + kWgs * kRegC10<128> <= (kWgs + 1) * 168,
              "consumers would wait for registers forever");

constexpr size_t v10_smem(int d, size_t elem) {
  return size_t(2 * kRows + 2 * kStages * kBQ) * d * elem + kStages * sizeof(Stage) + 2 * kRows * kBQ * elem +
         2 * 32 * d * sizeof(float) + 1024;
}

// Producer warps 0 and 1 (the other two return at once): per item, K and V once the consumers have
// released the last item's, then its visited tiles' Q and dO with their row facts, then the end
// stage; a last stage with it = -2. The ring (st, ph) runs on across items.
template <class T, class G, int D, bool BLOCK, bool KIDX>
__device__ __forceinline__ void producer(const BwdArgs<T, G>& a, const sched::KeyOrder& o, int n_items, int* next,
                                         const CUtensorMap* mK, const CUtensorMap* mV, const CUtensorMap* mQ,
                                         const CUtensorMap* mdO, T* sK, T* sV, T* sQO, Stage* sS, Bars& bars, int warp,
                                         int lane) {
  constexpr int BQ = kBQ, S = kStages;
  constexpr uint32_t kTile = BQ * D * sizeof(T);
  __shared__ int mailbox[2];
  if (warp > 1) return;
  // Few live registers (the producer runs on kRegP10): the item as (pair, key tile), the rest derived
  // where used; one parity for the mailbox slot and the K/V barriers (both turn once per item).
  const int nqt = static_cast<int>((a.nq + BQ - 1) / BQ), n_it = static_cast<int>(a.group) * nqt;
  int st = 0, item = static_cast<int>(blockIdx.x);
  uint32_t ph = 0, par = 0;
  for (;; par ^= 1) {
    // Warp 0's lane 0 holds the item; both warps read it after barrier 4 (two slots: warp 0
    // writes a slot again only after the barrier that follows warp 1's read of it).
    if (warp == 0 && lane == 0) mailbox[par] = item;
    __syncwarp();  // bar.sync is .aligned: the warp converged (lane 0 alone fetched, waited, copied)
    tma::bar_sync(4, 64);
    item = mailbox[par];
    const bool last = item >= n_items;
    int pair = 0, kt = 0;
    if (!last) {
      const sched::KeyItem k = sched::key_item(o, item);
      pair = k.pair;
      kt = k.kt;
      if (warp == 0 && lane == 0) {
        tma::wait(&bars.kv_empty, par ^ 1);  // the consumers have read the last item's K and V
        tma::arrive_expect(&bars.kv_full, 2 * kRows * D * sizeof(T));
        load_tile<kRows, D>(sK, mK, kt * kRows, int(pair % a.Hkv), int(pair / a.Hkv), &bars.kv_full);
        load_tile<kRows, D>(sV, mV, kt * kRows, int(pair % a.Hkv), int(pair / a.Hkv), &bars.kv_full);
      }
    }
    const auto j0 = [&] { return int64_t(kt) * kRows; };  // the item's keys [j0, jend)
    const auto jend = [&] { return a.nk - j0() < kRows ? a.nk : j0() + kRows; };
    int kg0 = 0, kg1 = 0;  // KIDX: the global hull of the item's keys (positions < 2^31)
    if constexpr (KIDX) {
      if (!last) {
        int64_t g0, g1;
        tiles::key_hull_warp(a, j0(), jend(), &g0, &g1);
        kg0 = static_cast<int>(g0);
        kg1 = static_cast<int>(g1);
      }
    }
    bool full = false;
    for (int it = 0;; ++it) {
      if (!last) {
        if constexpr (KIDX)
          while (it < n_it && !tiles::bwd_q_tile_hull<BQ>(a, it % nqt, kg0, kg1, jend() - j0() == kRows, BLOCK, &full))
            ++it;
        else
          while (it < n_it && !tiles::bwd_q_tile<BQ, kRows>(a, it % nqt, j0(), jend(), BLOCK, &full)) ++it;
      }
      const bool end = last || it >= n_it;
      tma::wait(&bars.empty[st], ph ^ 1);
      const int b = pair / static_cast<int>(a.Hkv);
      const int64_t h = int64_t(pair % a.Hkv) * a.group + it / nqt, i0 = int64_t(it % nqt) * BQ;
      if (warp == 0) {
        if (lane == 0) {
          if (end) {
            tma::arrive(&bars.full[st]);
          } else {
            tma::arrive_expect(&bars.full[st], 2 * kTile);
            T* dst = sQO + st * (2 * BQ * D);
            load_tile<BQ, D>(dst, mQ, int(i0), int(h), b, &bars.full[st]);
            load_tile<BQ, D>(dst + BQ * D, mdO, int(i0), int(h), b, &bars.full[st]);
          }
        }
      } else {
        Stage& R = sS[st];
        if (lane == 0) {
          R.r.it = last ? -2 : end ? -1 : it;
          R.r.full = full;
          R.b = b;
          R.hk = static_cast<int>(pair % a.Hkv);
          R.kt = kt;
        }
        for (int i = lane; i < BQ && !end; i += 32) {
          const int64_t r = i0 + i;
          int64_t lo = 0, hi = 0;
          float L2 = INFINITY, Dv = 0.f;
          if (r < a.nq) {
            if constexpr (KIDX) row_range(a.mask, a.qp[r], &lo, &hi);
            else local_range(a.mask, a.qp[r], a.kp, a.nk, &lo, &hi);
            L2 = static_cast<float>(a.LSE(b, h, r)) * kLog2e;
            Dv = static_cast<float>(a.D(b, h, r));
          }
          R.r.L2[i] = L2;
          R.r.D[i] = Dv;
          R.r.lo[i] = static_cast<int>(lo);
          R.r.hi[i] = static_cast<int>(hi);
        }
        tma::arrive(&bars.full[st]);  // release: my stores above before it
      }
      if (++st == S) { st = 0; ph ^= 1; }
      if (end) break;
    }
    if (last) return;
    if (warp == 0 && lane == 0) item = sched::fetch_item(n_items, next);
  }
}

template <class T, class G, int D, bool BLOCK, bool KIDX>
__global__ void __launch_bounds__(kThreads, 1)
    v10_bwd_kernel(const __grid_constant__ CUtensorMap mK, const __grid_constant__ CUtensorMap mV,
                   const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mdO, BwdArgs<T, G> a,
                   float* dq_acc, const sched::KeyOrder o, int n_items, int* next) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = kStages, BQ = kBQ;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(align1024(smem_raw));  // (128, D) sw128
  T* sV = sK + kRows * D;                              // (128, D)
  T* sQO = sV + kRows * D;                             // S x [(BQ, D) Q, (BQ, D) dO]
  T* sdS = sQO + S * 2 * BQ * D;                       // 2 x (128 keys, BQ) dS^T, sw128 (1024-aligned)
  float* sdQ = reinterpret_cast<float*>(sdS + 2 * kRows * BQ);  // 2 x (64, d/2) dQ_part
  Stage* sS = reinterpret_cast<Stage*>(sdQ + 2 * 32 * D);       // S x facts
  __shared__ Bars bars;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wg = warp / 4 - 1;
  const int nqt = static_cast<int>((a.nq + BQ - 1) / BQ);
  const int64_t group = a.group;
  if (tid == 0) {
    tma::init(&bars.kv_full, 1);
    tma::init(&bars.kv_empty, 128 * kWgs);
    for (int s = 0; s < S; ++s) {
      tma::init(&bars.full[s], 1 + 32);
      tma::init(&bars.empty[s], 128 * kWgs);
    }
    tma::fence_init();
  }
  __syncthreads();
  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<kRegP10<D>>();
    producer<T, G, D, BLOCK, KIDX>(a, o, n_items, next, &mK, &mV, &mQ, &mdO, sK, sV, sQO, sS, bars, warp, lane);
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<kRegC10<D>>();
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const int krow = (warp - 4) * 16;       // my warp's first key in the CTA
  const int wtid = tid - 128 * (wg + 1);  // my thread in the warpgroup
  int dsb = 0;                            // dS^T buffer
  bool seen = false;                      // the item visited some query tile (G = float: else nothing to add)
  bool kv_wait = true;                    // the item's K and V not yet waited for
  float dk[D / 2], dv[D / 2];             // my 2 keys x D/4 columns (wgmma accumulators)
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint64_t dKd0 = v3::desc_k_base<kRows>(sK, wg * 64), dVd0 = v3::desc_k_base<kRows>(sV, wg * 64);
  int st = 0;
  uint32_t ph = 0, kvph = 0;
  for (;;) {
    const Stage& R = sS[st];
    tma::wait(&bars.full[st], ph);
    const int it = R.r.it;
    if (it == -2) break;
    // Every item's K and V are waited for, a tile-less one's too: its copy must have landed
    // before the next item's may be issued into the same buffer.
    if (kv_wait) {
      tma::wait(&bars.kv_full, kvph);
      kvph ^= 1;
      kv_wait = false;
    }
    const int64_t b = R.b, hk = R.hk, j0 = int64_t(R.kt) * kRows;
    if (it < 0) {  // the item ends: my last reads of K and V are complete (each tile waits for its products)
      tma::arrive(&bars.kv_empty);
      if constexpr (kAcc<T, G>) {
        if (seen) epilogue::write_dkdv<T, D, true>(a, b, hk, j0 + krow + g, dk, dv, t4);
      } else {
        epilogue::write_dkdv<T, D>(a, b, hk, j0 + krow + g, dk, dv, t4);
      }
#pragma unroll
      for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
      seen = false;
      kv_wait = true;
      tma::arrive(&bars.empty[st]);  // release: my reads of the stage's item before it
      if (++st == S) { st = 0; ph ^= 1; }
      continue;
    }
    seen = true;
    const bool full = R.r.full;
    const int64_t i0 = int64_t(it % nqt) * BQ;
    const T* cQ = sQO + st * (2 * BQ * D);
    const T* cO = cQ + BQ * D;

    float s[BQ / 2], dp[BQ / 2];  // S^T = K Q^T, dP^T = V dO^T: my keys x BQ rows
    const uint64_t dKd = v3::opaque(dKd0), dVd = v3::opaque(dVd0);
    const uint64_t dQb = v3::opaque(v3::desc_k_base<BQ>(cQ, 0)), dOb = v3::opaque(v3::desc_k_base<BQ>(cO, 0));
    const uint64_t dOt = v3::opaque(v3::desc_mn_base<BQ>(cO)), dQt = v3::opaque(v3::desc_mn_base<BQ>(cQ));
    v3::pin(dk);
    v3::pin(dv);
    v3::two_products<T, D, kRows, BQ>(s, dp, dKd, dQb, dVd, dOb);
    dkdv_p<T, G, BQ, BLOCK, KIDX>(s, R.r, full, a, i0, j0, krow, g, t4, sl2);  // P^T (5.2)
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
    v3::pack_a<T, BQ>(pa, s);
    dkdv_ds<BQ>(dp, s, R.r, t4);  // dS^T (5.5)
    v3::pack_a<T, BQ>(sa, dp);
    T* const cS = sdS + dsb * (kRows * BQ);
    // dS^T (key rows, query columns) as stored, rounded to T (v4's loop, as in v9).
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = krow + g + 8 * (j & 1), c = 16 * kk + 8 * (j >> 1) + 2 * t4;
        *reinterpret_cast<uint32_t*>(cS + v3::sw128<kRows>(r, c >> 3) + (c & 7)) = sa[kk][j];
      }
    v3::fence_proxy_async();
    v3::dvdk_products<T, D, BQ>(dv, dk, pa, sa, dOt, dQt);
    // dQ_part (64 query rows x my d/2 columns) = dS K over all 128 keys (barrier 1: both
    // warpgroups' dS^T), as v4.
    constexpr int kN = D / 2;
    float dq[kN / 2];
    tma::bar_sync(1, 256);
    const T* kB = D == 128 ? sK + wg * kRows * 64 : sK + wg * kN;
    const uint64_t dA = v3::opaque(v3::desc_mn_base<kRows>(cS));
    const uint64_t dB = v3::opaque(v3::desc_mn_base<kRows>(kB));
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
      v3::Wgmma<T>::template ss<kN, 1, 1>(dq, v3::desc_mn_step(dA, kk), v3::desc_mn_step(dB, kk), kk);
    v3::commit();
    v3::wait<1>();  // dV, dK done: Q and dO of this stage may be refilled while dQ_part runs
    v3::pin(dk);
    v3::pin(dv);
    v3::pin(pa);
    v3::pin(sa);
    tma::arrive(&bars.empty[st]);  // release: my reads of the row facts before it
    v3::wait<0>();
    v3::pin(dq);
    const int64_t h = hk * group + it / nqt, qt = it % nqt;
    dq_block_add<D>(dq, sdQ + wg * (kN * 64), dq_acc + dq_acc_index(a, b, h, qt, wg), wg, wtid);
    dsb ^= 1;
    if (++st == S) { st = 0; ph ^= 1; }
  }
  if (wtid == 0) tma::bulk_wait();  // the last block is read before the CTA exits
#else
  __trap();
#endif
}

// Tuning knobs for the benchmark and tests (the file's header).
int v10_tail_knob() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V9_TAIL"));
  return v;
}
int v10_grid_knob() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V10_GRID"));
  return v;
}

template <class T, class G, int D>
bool launch_bwd(const BwdArgs<T, G>& a, float* dq_acc, cudaStream_t s, const char** why) {
  const int64_t nkb = (a.nk + kRows - 1) / kRows, items = nkb * a.Hkv * a.B;
  if (items > INT_MAX / 2) { *why = "v10 backward: more than 2^30 key tiles"; return false; }
  CUtensorMap m[4];
  if (!one_pass_maps(a, m, why)) return false;
  const bool block = a.mask.block != nullptr;
  auto k = block ? &v10_bwd_kernel<T, G, D, true, false> : &v10_bwd_kernel<T, G, D, false, false>;
  if constexpr (kAcc<T, G>)  // only blocks have indexed keys (their own instantiation, as in v4)
    if (a.kp.index) k = block ? &v10_bwd_kernel<T, G, D, true, true> : &v10_bwd_kernel<T, G, D, false, true>;
  constexpr size_t smem = v10_smem(D, sizeof(T));
  allow_smem(reinterpret_cast<const void*>(k), smem);
  int dev = 0, sms = 0, per_sm = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  BURSTLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BURSTLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem));
  const int64_t grid = sched::grid_size(items, sms, per_sm, v10_grid_knob());
  // The order's tail: about two waves of this grid (bwd_scheduler.cuh).
  const bool flat = a.mask.doc != nullptr || a.qp.index != nullptr || a.kp.index != nullptr;
  const sched::KeyOrder o = sched::key_order(a.nq, a.nk, a.mask.N_q, a.mask.N_k, a.qp.start, a.kp.start, a.mask.left,
                                             a.mask.right, flat, kRows, static_cast<int>(a.B * a.Hkv), grid,
                                             v10_tail_knob());
  BURSTLAB_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, v4_dq_acc_floats(a.B, a.Hq, a.nq, a.d) * sizeof(float), s));
  // The fetch-and-add counter, zeroed in stream order; not read when every item has a CTA.
  int* next = nullptr;
  if (grid < items) {
    BURSTLAB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&next), sizeof(int), s));
    BURSTLAB_CUDA_CHECK(cudaMemsetAsync(next, 0, sizeof(int), s));
  }
  k<<<static_cast<unsigned>(grid), kThreads, smem, s>>>(m[0], m[1], m[2], m[3], a, dq_acc, o, static_cast<int>(items),
                                                         next);
  const cudaError_t launched = cudaGetLastError();
  if (next) BURSTLAB_CUDA_CHECK(cudaFreeAsync(next, s));
  ::burstlab::cuda::check(launched, "v10_bwd_kernel", __FILE__, __LINE__);
  launch_dq_convert<T, G, D>(a, dq_acc, s);
  return true;
}

}  // namespace

template <class T, class G>
bool v10_backward(const BwdArgs<T, G>& a, float* dq_acc, cudaStream_t s, const char** why) {
  if (a.d != 64 && a.d != 128) { *why = "v10 needs d in {64, 128}"; return false; }
  if (a.nq == 0 || a.nk == 0) {  // nothing to copy (a map needs N >= 1)
    if constexpr (!kAcc<T, G>) v3_backward<T>(a, s);  // v3 writes the zeros; a block adds nothing
    return true;
  }
  return a.d == 64 ? launch_bwd<T, G, 64>(a, dq_acc, s, why) : launch_bwd<T, G, 128>(a, dq_acc, s, why);
}

template bool v10_backward<bf16, bf16>(const BwdArgs<bf16, bf16>&, float*, cudaStream_t, const char**);
template bool v10_backward<f16, f16>(const BwdArgs<f16, f16>&, float*, cudaStream_t, const char**);
template bool v10_backward<bf16, float>(const BwdArgs<bf16, float>&, float*, cudaStream_t, const char**);
template bool v10_backward<f16, float>(const BwdArgs<f16, float>&, float*, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
