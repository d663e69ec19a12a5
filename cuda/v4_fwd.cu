// cuda/v4_fwd.cu — variant 4 forward: v3's wgmma forward, warp-specialized (FA3's structure) on a
// persistent grid. Spec §4.1 (eq. 4.1-4.4), §6.1 (blocks over global positions), §4.3 (fold
// into a running partial). As many CTAs as fit on the device; each loops over work items (query
// tile of Br = 64 WGS rows, head h, batch b) and has 1 + WGS warpgroups:
//   producer  warpgroup 0 gives its registers back (setmaxnreg); its warp 0 works out each
//             item's key tiles and posts them to the consumers, and one thread issues every
//             copy: the item's Q, then K and V tiles of BC keys into a ring of STAGES buffers, by
//             the bulk tensor copy engine (TMA, tma.cuh), straight into wgmma's 128-byte swizzle;
//   consumers warpgroups 1..WGS, 64 query rows each, run v3's per-tile math (S = Q K^T, the
//             online softmax of softmax.cuh, O += P V overlapped with the next tile's softmax),
//             with a lagging max (softmax::online_lazy: O~ is rescaled only when a row's max
//             grows by more than 2^8, spec §4.1), and never meet at a CTA barrier: each waits on
//             the mbarrier that says its tile has landed and releases the buffer with an
//             arrival once its wgmma has read it.
// The loads thus run ahead of the math on their own, across items too, the consumers hold no
// load addresses (up to 232 registers each for the accumulators), and the warpgroups drift in
// and out of phase, which overlaps one's softmax with another's products.
// Limits: v3's (bf16/fp16, d in {64, 128}, 16-byte aligned views with strides in multiples of 8
// elements, a compute capability 9.0 device), and no block-sparse mask: the tile sequence must be
// known to the producer without a CTA-wide vote (v3 runs those). v4_forward returns false when it
// cannot run a call; the dispatcher (api.cu) then runs v3 or reports why.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "detail.cuh"
#include "epilogue.cuh"
#include "softmax.cuh"
#include "tile_mask.cuh"
#include "tile_scheduler.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace burstlab::cuda::detail {

namespace {

using v2::kLog2e;

// WGS consumer warpgroups (Br = 64 WGS), BC keys per tile, STAGES K/V buffers. Register budgets
// per thread after setmaxnreg (producer P, consumer C): the launch gives every thread R registers
// (what __launch_bounds__ allows); setmaxnreg.inc waits until the registers the producer gave
// back suffice, so P + WGS C <= (WGS + 1) R, or the consumers wait forever. The producer needs
// 40 not to spill (it works out every row's key interval); with 3 consumer warpgroups of 160 it
// gets 32 (ptxas: 24 bytes of spills there, none in the consumers). With one consumer
// warpgroup CTAS = 2 or 3 CTAs share a multiprocessor, so that one's loads, first and last tile
// and epilogue overlap the others' math (short sequences, where each item has few key tiles);
// 3 fit in the register file with BC = 64 and 120 registers (and in shared memory with 3
// stages: 3 x 66.5 KB).
template <int D, int WGS, int BC, int STAGES, int CTAS = WGS == 1 ? 2 : 1>
struct Cfg4 {
  static constexpr int kD = D, kWgs = WGS, kBc = BC, kBr = 64 * WGS, kStages = STAGES;
  static constexpr int kThreads = 128 * (WGS + 1), kCtas = CTAS;
  static constexpr int kRegLaunch = (65536 / (kThreads * kCtas)) & ~7;
  static constexpr int kRegP = WGS == 3 ? 32 : 40;
  static constexpr int kRegC = CTAS == 3 ? 120 : WGS == 3 ? 160 : WGS == 2 ? 232 : 216;
  static_assert(kRegP + WGS * kRegC <= (WGS + 1) * kRegLaunch, "consumers would wait for registers forever");
  // 2 x Q (the next item's lands during this one), STAGES x (K, V), plus 1 KB to align the
  // first tile to 1024 bytes.
  static constexpr size_t smem_bytes(size_t elem) {
    return size_t(2 * kBr + 2 * STAGES * kBc) * D * elem + 1024;
  }
};

struct Bars {
  uint64_t q_full[2], q_empty[2];
  uint64_t k_full[4], k_empty[4], v_full[4], v_empty[4];
  uint64_t item_full[2], item_empty[2];
};

// One work item: query tile qt of head h, batch b, and the key tiles [t_begin, t_end) its rows
// visit, with the keys [full_lo, full_hi) every row sees; qt < 0 ends the CTA's loop.
struct Item {
  int qt, h, b, t_begin, t_end, full_lo, full_hi, pad;
};

// Persistent: gridDim.x CTAs take the items in the order of tile_scheduler.cuh (a (b, h)'s
// longest tiles first; a tail whose (b, h) take turns); a CTA's next item comes from *next by a
// fetch-and-add sent two tiles before the item's last load. The producer warp works out each
// item's tile range (its own hull, no CTA barrier) and every row's key interval, and hands them
// to the consumers through a two-slot mailbox (so a consumer warp does no mask arithmetic per
// item), then loads the item's Q into one of two buffers (free once the consumers finished the
// item two back) and its K/V tiles into the ring, which runs on across items: the next item's
// loads overlap this one's last tiles and epilogue.
// KIDX: key positions are indexed (a.kp.index), so every tile runs the general predicate; its
// code is kept out of the common kernel, where its temporaries would spill the accumulators.
template <class T, class C, bool KIDX>
__global__ void __launch_bounds__(C::kThreads, C::kCtas)
    v4_fwd_kernel(const __grid_constant__ CUtensorMap mQ, const __grid_constant__ CUtensorMap mK,
                  const __grid_constant__ CUtensorMap mV, FwdArgs<T> a, int n_items, int* next, int n_tail) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::kD, kBc = C::kBc, kBr = C::kBr, kS = C::kStages;
  constexpr int kPanels = D / 64;
  constexpr uint32_t kTileBytes = kBc * D * sizeof(T);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));  // 2 x (Br, D) sw128
  T* sK = sQ + 2 * kBr * D;     // S x (Bc, D) sw128
  T* sV = sK + kS * kBc * D;    // S x (Bc, D) sw128
  __shared__ Bars bars;
  __shared__ Item mail[2];
  __shared__ int2 mail_rows[2][kBr];  // each row's local key interval [lo, hi) (eq. 3.4)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int wg = warp / 4 - 1;       // consumer warpgroup (-1: producer)
  const int wrow = (warp - 4) * 16;  // a consumer warp's first row in the item
  const int nqt = static_cast<int>((a.nq + kBr - 1) / kBr);

  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      tma::init(&bars.q_full[s], 1);
      tma::init(&bars.q_empty[s], 4 * C::kWgs);  // one arrival per consumer warp
      tma::init(&bars.item_full[s], 32);  // every producer lane wrote its rows
      tma::init(&bars.item_empty[s], 128 * C::kWgs);  // every consumer thread read its copy
    }
    for (int s = 0; s < kS; ++s) {
      tma::init(&bars.k_full[s], 1);
      tma::init(&bars.v_full[s], 1);
      tma::init(&bars.k_empty[s], 4 * C::kWgs);
      tma::init(&bars.v_empty[s], 4 * C::kWgs);
    }
    tma::fence_init();
  }
  __syncthreads();  // publishes the barrier inits
  constexpr bool kidx = KIDX;

  if (wg < 0) {  // ---------------------------------------------------------------- producer
    tma::regs_dec<C::kRegP>();
    if (warp != 0) return;
    if (lane == 0) {
      tma::prefetch_map(&mQ);
      tma::prefetch_map(&mK);
      tma::prefetch_map(&mV);
    }
    auto fetch = [&] { return sched::fetch_item(n_items, next); };
    const sched::TileOrder order = sched::tile_order(static_cast<int>(a.Hq * a.B), nqt, n_tail);
    int item = blockIdx.x, st = 0;
    uint32_t ph = 0;
    for (int n = 0;; ++n) {
      Item it{-1, 0, 0, 0, 0, 0, 0, 0};
      // The slot's last reader, item n - 2, read it at its start: no wait in practice.
      tma::wait(&bars.item_empty[n & 1], ((n >> 1) & 1) ^ 1);
      if (item < n_items) {
        const sched::Tile tl = sched::tile_of(order, item);
        it.qt = tl.qt;
        it.h = tl.bh % static_cast<int>(a.Hq);
        it.b = tl.bh / static_cast<int>(a.Hq);
        const tiles::Hull hull = tiles::fwd_rows_warp<kBr>(a, int64_t(it.qt) * kBr, kidx, mail_rows[n & 1]);
        // Without a block mask every key tile of the hull is visited (tile_mask.cuh's fwd_tile).
        it.t_begin = hull.lo < hull.hi ? hull.lo / kBc : 0;
        it.t_end = hull.lo < hull.hi ? (hull.hi + kBc - 1) / kBc : 0;
        it.full_lo = hull.full_lo;
        it.full_hi = hull.full_hi;
      }
      if (lane == 0) mail[n & 1] = it;
      tma::arrive(&bars.item_full[n & 1]);
      int fetched = 0;
      if (lane == 0) {
        if (it.qt >= 0) {
          const int64_t hk = it.h / a.group;
          const int qb = n & 1;
          tma::wait(&bars.q_empty[qb], ((n >> 1) & 1) ^ 1);
          tma::arrive_expect(&bars.q_full[qb], kBr * D * sizeof(T));
#pragma unroll
          for (int p = 0; p < kPanels; ++p)
            tma::load_4d(sQ + qb * kBr * D + p * kBr * 64, &mQ, 64 * p, it.qt * kBr, it.h, it.b, &bars.q_full[qb]);
          // The next item is fetched two tiles before this one's last load: late enough that a
          // long item does not hold a claim on it, early enough to hide the atomic's latency.
          bool sent = false;
          for (int t = it.t_begin; t < it.t_end; ++t) {
            if (t == it.t_end - 2) { fetched = fetch(); sent = true; }
            tma::wait(&bars.k_empty[st], ph ^ 1);
            tma::arrive_expect(&bars.k_full[st], kTileBytes);
#pragma unroll
            for (int p = 0; p < kPanels; ++p)
              tma::load_4d(sK + st * kBc * D + p * kBc * 64, &mK, 64 * p, t * kBc, int(hk), it.b, &bars.k_full[st]);
            tma::wait(&bars.v_empty[st], ph ^ 1);
            tma::arrive_expect(&bars.v_full[st], kTileBytes);
#pragma unroll
            for (int p = 0; p < kPanels; ++p)
              tma::load_4d(sV + st * kBc * D + p * kBc * 64, &mV, 64 * p, t * kBc, int(hk), it.b, &bars.v_full[st]);
            if (++st == kS) { st = 0; ph ^= 1; }
          }
          if (!sent) fetched = fetch();
        }
      }
      if (it.qt < 0) break;
      item = __shfl_sync(0xffffffffu, fetched, 0);
    }
    return;
  }

  // ------------------------------------------------------------------------------ consumers
  tma::regs_inc<C::kRegC>();
  const bool has_block = false;  // v4_forward never launches with a block mask
  constexpr bool band_only = !KIDX;
  const float sl2 = static_cast<float>(a.scale) * kLog2e;
  const float c2 = sl2 > 0.f ? sl2 : 1.f;
  // Descriptors of the first Q buffer and K, V stage; the others lie a whole number of 16-byte
  // units further (the descriptor's address field), so a tile's is one add, not a shared-window
  // conversion per tile.
  const uint64_t dQb = v3::desc_k_base<kBr>(sQ, wg * 64);  // my 64 rows of Q
  const uint64_t dKb = v3::desc_k_base<kBc>(sK, 0), dVb = v3::desc_mn_base<kBc>(sV);
  constexpr uint64_t kQStep = uint64_t(kBr) * D * sizeof(T) / 16, kStageStep = uint64_t(kBc) * D * sizeof(T) / 16;
  // (st, ph): stage and parity of the ring's next tile; it runs on across items.
  int st = 0;
  uint32_t ph = 0;
  for (int n = 0;; ++n) {
    tma::wait(&bars.item_full[n & 1], (n >> 1) & 1);
    const Item it = mail[n & 1];
    // mask facts of my rows g, g + 8 (eq. 3.4): local key intervals [llo, lhi), from the producer
    int llo[2], lhi[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int2 iv = mail_rows[n & 1][wrow + g + 8 * ri];
      llo[ri] = iv.x;
      lhi[ri] = iv.y;
    }
    tma::arrive(&bars.item_empty[n & 1]);
    if (it.qt < 0) break;
    const int64_t q0 = int64_t(it.qt) * kBr, h = it.h, b = it.b;
    auto pred = [&](int ri, int jl) -> bool {
      return tiles::fwd_visible(a, kidx, has_block, llo[ri], lhi[ri], q0 + wrow + g + 8 * ri, jl);
    };
    float acc[D / 2];  // O~ (4.3): wgmma accumulator, my 2 rows x D/4 columns
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};  // (4.1)-(4.2), base 2
    uint32_t pa[kBc / 16][4];  // P_{i-1} as wgmma A fragments
    const uint64_t dQ0 = dQb + (n & 1) * kQStep;
    tma::wait(&bars.q_full[n & 1], (n >> 1) & 1);

    // Tile i: S_i = Q K_{tau_i}^T, then O += P_{i-1} V_{tau_{i-1}} while S_i's softmax runs; the
    // first tile has no P V (a separate instantiation, so no wgmma sits in a data-dependent
    // branch). (pst, pph): stage and parity of tile i - 1.
    int pst = 0;
    uint32_t pph = 0;
    auto tile = [&](int t, auto first) {
      constexpr bool kFirst = decltype(first)::value;
      const int j0 = t * kBc;
      const bool full = it.full_lo <= j0 && j0 + kBc <= it.full_hi;
      tma::wait(&bars.k_full[st], ph);
      if (!kFirst) tma::wait(&bars.v_full[pst], pph);
      float s[kBc / 2];  // S = Q K^T (2.1), unscaled
      const uint64_t dQ = v3::opaque(dQ0), dK = v3::opaque(dKb + st * kStageStep);
      v3::pin(acc);
      v3::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        v3::Wgmma<T>::template ss<kBc, 0>(s, v3::desc_k_step<kBr>(dQ, kk), v3::desc_k_step<kBc>(dK, kk), kk);
      v3::commit();
      if constexpr (!kFirst) {
        const uint64_t dV = v3::opaque(dVb + pst * kStageStep);
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk)
          v3::Wgmma<T>::template rs<D, 1>(acc, pa[kk], v3::desc_mn_step(dV, kk), 1);
        v3::commit();
        v3::wait<1>();  // S done: K_{tau_i} may be refilled
      } else {
        v3::wait<0>();
      }
      v3::pin(s);
      if (lane == 0) tma::arrive(&bars.k_empty[st]);

      softmax::mask_tile<kBc>(s, sl2, full, band_only, j0, t4, llo, lhi, pred);
      float alpha[2];
      const bool moved = softmax::online_lazy<kBc>(s, c2, m_r, l_r, alpha);
      if constexpr (!kFirst) {
        v3::wait<0>();  // P_{i-1} V done: V_{tau_{i-1}} may be refilled, O rescaled, pa refilled
        v3::pin(acc);
        v3::pin(pa);
        if (lane == 0) tma::arrive(&bars.v_empty[pst]);
        if (moved) softmax::rescale<D>(acc, alpha);  // the first tile's O~ is still 0
      }
      v3::pack_a<T, kBc>(pa, s);
      pst = st;
      pph = ph;
      if (++st == kS) { st = 0; ph ^= 1; }
    };
    if (it.t_begin < it.t_end) {
      tile(it.t_begin, std::true_type{});
      for (int t = it.t_begin + 1; t < it.t_end; ++t) tile(t, std::false_type{});
    }
    if (lane == 0) tma::arrive(&bars.q_empty[n & 1]);  // every S of this item is done
    if (it.t_begin < it.t_end) {  // the last P V
      tma::wait(&bars.v_full[pst], pph);
      v3::pv_product<T, D, kBc>(acc, pa, sV + pst * kBc * D);
      if (lane == 0) tma::arrive(&bars.v_empty[pst]);
    }

    // ---- epilogue (4.4), or the merge (4.5)-(4.7) into the running partial (epilogue.cuh)
    epilogue::forward_rows<T, D>(a, b, h, q0 + wrow + g, acc, m_r, l_r, t4);
  }
#else
  __trap();  // built without sm_90a: the dispatcher never launches v4 then
#endif
}

// Tuning knob: BURSTLAB_V4_GRID = 0 (default: as many CTAs as fit on the device at once), n > 0
// (at most n CTAs: the tests' way to make few CTAs loop over many items), -1 (one CTA per item,
// as a non-persistent launch; for the benchmark's comparison).
int v4_grid_knob() {
  static const int v = env_int("BURSTLAB_V4_GRID");
  return v;
}

// Tuning knob: BURSTLAB_V4_TAIL = 0 (default: a tail of about two waves of the grid), n > 0 (the
// last n (b, h)), -1 (none: (b, h) order throughout; for the benchmark's comparison).
int v4_tail_knob() {
  static const int v = env_int("BURSTLAB_V4_TAIL");
  return v;
}

template <class T, class C, bool KIDX = false>
bool launch(const FwdArgs<T>& a, cudaStream_t s, const char** why) {
  constexpr bool bf = std::is_same<T, bf16>::value;
  const int64_t items = (a.nq + C::kBr - 1) / C::kBr * a.Hq * a.B;
  if (items > INT_MAX / 2) { *why = "v4 forward: more than 2^30 query tiles"; return false; }
  CUtensorMap mQ, mK, mV;
  if (!tma::encode_4d(&mQ, a.Q.data, a.Q.dim, a.Q.stride, bf, C::kBr, why) ||
      !tma::encode_4d(&mK, a.K.data, a.K.dim, a.K.stride, bf, C::kBc, why) ||
      !tma::encode_4d(&mV, a.V.data, a.V.dim, a.V.stride, bf, C::kBc, why))
    return false;
  const size_t smem = C::smem_bytes(sizeof(T));
  auto kernel = &v4_fwd_kernel<T, C, KIDX>;
  allow_smem(reinterpret_cast<const void*>(kernel), smem);
  int dev = 0, sms = 0, per_sm = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  BURSTLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BURSTLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::kThreads, smem));
  const int64_t grid = sched::grid_size(items, sms, per_sm, v4_grid_knob());
  // The fetch-and-add counter, zeroed in stream order; not needed when every item has a CTA.
  int* next = nullptr;
  if (grid < items) {
    BURSTLAB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&next), sizeof(int), s));
    BURSTLAB_CUDA_CHECK(cudaMemsetAsync(next, 0, sizeof(int), s));
  }
  // The tail's (b, h): enough for two waves of the grid (tile_scheduler.cuh).
  const int64_t n_tail = sched::tail_size(grid, (a.nq + C::kBr - 1) / C::kBr, a.B * a.Hq, v4_tail_knob());
  kernel<<<static_cast<unsigned>(grid), C::kThreads, smem, s>>>(mQ, mK, mV, a, static_cast<int>(items), next,
                                                                 static_cast<int>(n_tail));
  const cudaError_t launched = cudaGetLastError();
  if (next) BURSTLAB_CUDA_CHECK(cudaFreeAsync(next, s));
  ::burstlab::cuda::check(launched, "launch of v4_fwd_kernel", __FILE__, __LINE__);
  return true;
}

// Tuning knob for the benchmark only: BURSTLAB_V4_CFG = 0 (default), 1, 2, 3, 4 (cuda/README.md).
int v4_tuning_cfg() {
  static const int v = env_int("BURSTLAB_V4_CFG");
  return v;
}

// Do the query rows see at most `limit` keys on average? Estimated from 64 evenly spaced rows
// (eq. 3.4 on the host); false when the mask or the positions live in device arrays (document
// masks, indexed positions), which the host cannot read.
template <class T>
bool few_keys_per_row(const FwdArgs<T>& a, int64_t limit) {
  if (a.mask.doc != nullptr || a.qp.index != nullptr || a.kp.index != nullptr) return false;
  int64_t sum = 0;
  constexpr int kSamples = 64;
  for (int k = 0; k < kSamples; ++k) {
    int64_t lo, hi;
    local_range(a.mask, a.qp[(a.nq - 1) * k / (kSamples - 1)], a.kp, a.nk, &lo, &hi);
    sum += hi - lo;
  }
  return sum <= limit * kSamples;
}

}  // namespace

template <class T>
bool v4_forward(const FwdArgs<T>& a, cudaStream_t s, const char** why) {
  if (a.mask.block != nullptr) { *why = "v4 has no block-sparse masks (v3 runs them)"; return false; }
  if (a.d != 64 && a.d != 128) { *why = "v4 needs d in {64, 128}"; return false; }
  if (a.nq == 0) return true;
  if (a.nk == 0) {  // no keys, nothing to copy (a map needs N >= 1): v3 writes the empty rows
    v3_forward<T>(a, s);
    return true;
  }
  const int cfg = v4_tuning_cfg();
  const bool kidx = a.kp.index != nullptr;
  // Rows that see few keys (short or causal sequences) give each item few key tiles, so its loads
  // and epilogue weigh: one consumer warpgroup, three (d=64, 64-key tiles) or two (d=128) CTAs
  // per multiprocessor. The limits are where that shape measured faster on H200
  // (docs/performance-gpu.md).
  const bool few = cfg == 0 && few_keys_per_row(a, a.d == 64 ? 1024 : 512);
  // Indexed keys, one shape per d whatever the knob: the general predicate's temporaries spill
  // the other shapes' accumulators (ptxas: 3 x 160 registers 476 bytes, d=128 with Bc = 128 196
  // bytes), not 2 x 240 at d=64 (4 bytes) and Bc = 64 at d=128 (none).
  if (kidx)
    return a.d == 64 ? launch<T, Cfg4<64, 2, 128, 2>, true>(a, s, why)
                     : launch<T, Cfg4<128, 2, 64, 4>, true>(a, s, why);
  if (a.d == 64) {
    if (cfg == 1) return launch<T, Cfg4<64, 2, 128, 2>>(a, s, why);
    if (cfg == 2) return launch<T, Cfg4<64, 3, 128, 3>>(a, s, why);
    if (cfg == 3 || few) return launch<T, Cfg4<64, 1, 64, 3, 3>>(a, s, why);
    return launch<T, Cfg4<64, 3, 128, 2>>(a, s, why);  // also cfg 4: never the few-keys shape
  }
  if (cfg == 1) return launch<T, Cfg4<128, 2, 64, 4>>(a, s, why);
  if (cfg == 3 || few) return launch<T, Cfg4<128, 1, 64, 2>>(a, s, why);
  return launch<T, Cfg4<128, 2, 128, 2>>(a, s, why);
}

template bool v4_forward<bf16>(const FwdArgs<bf16>&, cudaStream_t, const char**);
template bool v4_forward<f16>(const FwdArgs<f16>&, cudaStream_t, const char**);

}  // namespace burstlab::cuda::detail
