// cuda/fwd_ws.cuh — the warp-specialized persistent forward (v4_fwd.cu) apart from its consumers,
// for any variant that brings other consumers (spec §4.1, §6.1): the CTA shapes and their register
// budgets, the mbarriers and the two-slot item mailbox, the producer warp (work items in
// tile_scheduler.cuh's order, every row's key interval, the TMA copies of Q and of the K/V ring),
// and the host side: the grid, the knobs, the choice of shape. Internal; include from
// .cu files compiled for sm_90a only. Its names have internal linkage (an anonymous namespace):
// each file that includes it gets its own copy of the kernels.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "detail.cuh"
#include "fwd_shape.hpp"
#include "tile_mask.cuh"
#include "tile_scheduler.cuh"
#include "tma.cuh"

namespace burstlab::cuda::detail {
namespace {
namespace fwd_ws {

// WGS consumer warpgroups (Br = 64 WGS), BC keys per tile, STAGES K/V buffers. Register budgets
// per thread after setmaxnreg (producer P, consumer C): the launch gives every thread R registers
// (what __launch_bounds__ allows); setmaxnreg.inc waits until the registers the producer gave
// back suffice, so P + WGS C <= (WGS + 1) R, or the consumers wait forever. The producer needs
// 40 not to spill (it works out every row's key interval); with 3 consumer warpgroups of 160 it
// gets 32 (ptxas: 24 bytes of spills there, none in the consumers). With one consumer
// warpgroup CTAS = 2 or 3 CTAs share a multiprocessor, so that one's loads, first and last tile
// and epilogue overlap the others' math (short sequences, where each item has few key tiles);
// 3 fit in the register file with BC = 64 and 120 registers (and in shared memory with 3
// stages: 3 x 66.5 KB). QBUF Q buffers: 2 let the next item's Q land during this one; 176-key
// tiles at d = 128 leave room for one (its load then waits for this item's last S).
template <int D, int WGS, int BC, int STAGES, int CTAS = WGS == 1 ? 2 : 1, int QBUF = 2>
struct Cfg {
  static constexpr int kD = D, kWgs = WGS, kBc = BC, kBr = 64 * WGS, kStages = STAGES, kQBuf = QBUF;
  static constexpr int kThreads = 128 * (WGS + 1), kCtas = CTAS;
  static constexpr int kRegLaunch = (65536 / (kThreads * kCtas)) & ~7;
  static constexpr int kRegP = WGS == 3 ? 32 : 40;
  static constexpr int kRegC = CTAS == 3 ? 120 : WGS == 3 ? 160 : WGS == 2 ? 232 : 216;
  static_assert(kRegP + WGS * kRegC <= (WGS + 1) * kRegLaunch, "consumers would wait for registers forever");
  // QBUF x Q, STAGES x (K, V), plus 1 KB to align the first tile to 1024 bytes.
  static constexpr size_t smem_bytes(size_t elem) {
    return size_t(QBUF * kBr + 2 * STAGES * kBc) * D * elem + 1024;
  }
  // Item n's Q buffer, and the parity of that buffer's barrier phase for item n.
  __device__ static int q_slot(int n) { return QBUF == 2 ? n & 1 : 0; }
  __device__ static uint32_t q_parity(int n) { return QBUF == 2 ? (n >> 1) & 1 : n & 1; }
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

// Thread 0 initializes the barriers; the caller's __syncthreads publishes them. q_arrivals: each
// consumer warp's arrivals on q_empty per item (2 when O also leaves through the Q buffer).
template <class C>
__device__ __forceinline__ void init_bars(Bars& bars, int q_arrivals = 1) {
  for (int s = 0; s < 2; ++s) {
    tma::init(&bars.q_full[s], 1);
    tma::init(&bars.q_empty[s], 4 * C::kWgs * q_arrivals);  // one arrival per consumer warp (or two)
    tma::init(&bars.item_full[s], 32);  // every producer lane wrote its rows
    tma::init(&bars.item_empty[s], 128 * C::kWgs);  // every consumer thread read its copy
  }
  for (int s = 0; s < C::kStages; ++s) {
    tma::init(&bars.k_full[s], 1);
    tma::init(&bars.v_full[s], 1);
    tma::init(&bars.k_empty[s], 4 * C::kWgs);
    tma::init(&bars.v_empty[s], 4 * C::kWgs);
  }
  tma::fence_init();
}

// The producer warp (warp 0; the rest of warpgroup 0 has returned), with the kernel's static
// shared memory: the barriers, the two-slot mailbox, each row's local key interval [lo, hi)
// (eq. 3.4) per slot. Persistent: gridDim.x CTAs
// take the items in the order of tile_scheduler.cuh (a (b, h)'s longest tiles first; a tail
// whose (b, h) take turns); a CTA's next item comes from *next by a fetch-and-add sent two tiles
// before the item's last load. The warp works out each item's tile range (its own hull, no CTA
// barrier) and every row's key interval, and hands them to the consumers through the two-slot
// mailbox (so a consumer warp does no mask arithmetic per item), then lane 0 loads the item's
// Q into one of QBUF buffers (free once the consumers finished the item QBUF back) and its K/V
// tiles into the ring, which runs on across items: the next item's loads overlap this one's
// last tiles and epilogue. The last item posted has qt < 0.
// KIDX: key positions are indexed (a.kp.index), so every tile runs the general predicate.
template <class T, class C, bool KIDX>
__device__ __forceinline__ void producer(const CUtensorMap* mQ, const CUtensorMap* mK, const CUtensorMap* mV,
                                         const FwdArgs<T>& a, int n_items, int* next, int n_tail,
                                         Bars& bars, Item* mail, int2 (*mail_rows)[C::kBr], T* sQ, T* sK,
                                         T* sV) {
  constexpr int D = C::kD, kBc = C::kBc, kBr = C::kBr, kS = C::kStages;
  constexpr int kPanels = D / 64;
  constexpr uint32_t kTileBytes = kBc * D * sizeof(T);
  const int lane = threadIdx.x % 32;
  const int nqt = static_cast<int>((a.nq + kBr - 1) / kBr);
  if (lane == 0) {
    tma::prefetch_map(mQ);
    tma::prefetch_map(mK);
    tma::prefetch_map(mV);
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
      const tiles::Hull hull = tiles::fwd_rows_warp<kBr>(a, int64_t(it.qt) * kBr, KIDX, mail_rows[n & 1]);
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
        const int qb = C::q_slot(n);
        tma::wait(&bars.q_empty[qb], C::q_parity(n) ^ 1);
        tma::arrive_expect(&bars.q_full[qb], kBr * D * sizeof(T));
#pragma unroll
        for (int p = 0; p < kPanels; ++p)
          tma::load_4d(sQ + qb * kBr * D + p * kBr * 64, mQ, 64 * p, it.qt * kBr, it.h, it.b, &bars.q_full[qb]);
        // The next item is fetched two tiles before this one's last load: late enough that a
        // long item does not hold a claim on it, early enough to hide the atomic's latency.
        bool sent = false;
        for (int t = it.t_begin; t < it.t_end; ++t) {
          if (t == it.t_end - 2) { fetched = fetch(); sent = true; }
          tma::wait(&bars.k_empty[st], ph ^ 1);
          tma::arrive_expect(&bars.k_full[st], kTileBytes);
#pragma unroll
          for (int p = 0; p < kPanels; ++p)
            tma::load_4d(sK + st * kBc * D + p * kBc * 64, mK, 64 * p, t * kBc, int(hk), it.b, &bars.k_full[st]);
          tma::wait(&bars.v_empty[st], ph ^ 1);
          tma::arrive_expect(&bars.v_full[st], kTileBytes);
#pragma unroll
          for (int p = 0; p < kPanels; ++p)
            tma::load_4d(sV + st * kBc * D + p * kBc * 64, mV, 64 * p, t * kBc, int(hk), it.b, &bars.v_full[st]);
          if (++st == kS) { st = 0; ph ^= 1; }
        }
        if (!sent) fetched = fetch();
      }
    }
    if (it.qt < 0) break;
    item = __shfl_sync(0xffffffffu, fetched, 0);
  }
}

// ---- host side

// Tuning knob: BURSTLAB_V4_GRID = 0 (default: as many CTAs as fit on the device at once), n > 0
// (at most n CTAs: the tests' way to make few CTAs loop over many items), -1 (one CTA per item,
// as a non-persistent launch; for the benchmark's comparison). Both persistent forwards read it.
int grid_knob() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V4_GRID"));
  return v;
}

// Tuning knob: BURSTLAB_V4_TAIL = 0 (default: a tail of about two waves of the grid), n > 0 (the
// last n (b, h)), -1 (none: (b, h) order throughout; for the benchmark's comparison).
int tail_knob() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V4_TAIL"));
  return v;
}

// Tuning knob for the benchmark and tests: BURSTLAB_V4_CFG = 0 (default), 1 .. 5
// (cuda/README.md); every persistent forward reads it.
int tuning_cfg() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V4_CFG"));
  return v;
}

// Tuning knob: BURSTLAB_V4_EPILOGUE = 1 (default: each consumer warp writes its 16 rows of O into
// the item's Q buffer, free after the item's last S, and one lane stores them by the copy engine;
// shapes with two Q buffers, so the buffer is needed again two items later; not for a merge into a
// running partial, which reads the old O), 0 (each consumer thread stores its O values from
// registers, as those other calls always do).
int epilogue_knob() {
  static const int v = static_cast<int>(env::integer("BURSTLAB_V4_EPILOGUE"));
  return v;
}

// Launches kernel (a variant's instantiation for config C) on the persistent grid; false with
// *why when the copy engine cannot describe a view or there are too many query tiles. TMA_O: the
// kernel stores O by the copy engine through the last parameter's map (boxes of 16 rows); else
// that parameter is Q's map, unused.
template <class T, class C, class K>
bool launch(K kernel, const char* kernel_name, const FwdArgs<T>& a, cudaStream_t s, const char** why,
            bool tma_o = false) {
  constexpr bool bf = std::is_same<T, bf16>::value;
  const int64_t items = (a.nq + C::kBr - 1) / C::kBr * a.Hq * a.B;
  if (items > INT_MAX / 2) { *why = "persistent forward: more than 2^30 query tiles"; return false; }
  CUtensorMap mQ, mK, mV;
  if (!tma::encode_4d(&mQ, a.Q.data, a.Q.dim, a.Q.stride, bf, C::kBr, why) ||
      !tma::encode_4d(&mK, a.K.data, a.K.dim, a.K.stride, bf, C::kBc, why) ||
      !tma::encode_4d(&mV, a.V.data, a.V.dim, a.V.stride, bf, C::kBc, why))
    return false;
  CUtensorMap mO = mQ;
  if (tma_o && !tma::encode_4d(&mO, a.O.data, a.O.dim, a.O.stride, bf, 16, why)) return false;
  const size_t smem = C::smem_bytes(sizeof(T));
  allow_smem(reinterpret_cast<const void*>(kernel), smem);
  int dev = 0, sms = 0, per_sm = 0;
  BURSTLAB_CUDA_CHECK(cudaGetDevice(&dev));
  BURSTLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BURSTLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::kThreads, smem));
  const int64_t grid = sched::grid_size(items, sms, per_sm, grid_knob());
  // The fetch-and-add counter, zeroed in stream order; not needed when every item has a CTA.
  int* next = nullptr;
  if (grid < items) {
    BURSTLAB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&next), sizeof(int), s));
    BURSTLAB_CUDA_CHECK(cudaMemsetAsync(next, 0, sizeof(int), s));
  }
  // The tail's (b, h): enough for two waves of the grid (tile_scheduler.cuh).
  const int64_t n_tail = sched::tail_size(grid, (a.nq + C::kBr - 1) / C::kBr, a.B * a.Hq, tail_knob());
  kernel<<<static_cast<unsigned>(grid), C::kThreads, smem, s>>>(mQ, mK, mV, a, static_cast<int>(items), next,
                                                                 static_cast<int>(n_tail), mO);
  const cudaError_t launched = cudaGetLastError();
  if (next) BURSTLAB_CUDA_CHECK(cudaFreeAsync(next, s));
  ::burstlab::cuda::check(launched, kernel_name, __FILE__, __LINE__);
  return true;
}

// How many keys the query rows see on average (fwd_shape.hpp's estimate); -1 when the mask or the
// positions live in device arrays (document masks, indexed positions), which the host cannot read.
template <class T>
double keys_per_row(const FwdArgs<T>& a) {
  if (a.mask.doc != nullptr || a.qp.index != nullptr || a.kp.index != nullptr) return -1;
  return fwd_shape::keys_per_row(a.nq, [&](int64_t r) {
    int64_t lo, hi;
    local_range(a.mask, a.qp[r], a.kp, a.nk, &lo, &hi);
    return hi - lo;
  });
}

// The shape for a call, and its launch: go(Cfg<...>{}, std::bool_constant<KIDX>{}) launches the
// variant's kernel for that config. Rows that see few keys (short or causal sequences) give each
// item few key tiles, so its loads and epilogue weigh: one consumer warpgroup, three (d=64,
// 64-key tiles) or two (d=128) CTAs per multiprocessor. Rows that see many keys at d = 128 take
// 176-key tiles (FA3's choice): fewer waits and softmax passes per key, at the price of one Q
// buffer (shared memory), whose load then waits for the item before, and of a ragged last tile,
// which short rows pay for. fwd_shape.hpp chooses; rows the host cannot see take the default.
template <class T, class Go>
bool dispatch(const FwdArgs<T>& a, Go go) {
  const int cfg = tuning_cfg();
  const double keys = cfg == 0 ? keys_per_row(a) : -1;
  const fwd_shape::Shape shape = fwd_shape::choose(a.d, keys);
  const bool few = shape == fwd_shape::Shape::FewKeys, many = shape == fwd_shape::Shape::ManyKeys;
  // Indexed keys, one shape per d whatever the knob: the general predicate's temporaries spill
  // the other shapes' accumulators (ptxas: 3 x 160 registers 476 bytes, d=128 with Bc = 128 196
  // bytes), not 2 x 240 at d=64 (4 bytes) and Bc = 64 at d=128 (none).
  if (a.kp.index != nullptr)
    return a.d == 64 ? go(Cfg<64, 2, 128, 2>{}, std::true_type{}) : go(Cfg<128, 2, 64, 4>{}, std::true_type{});
  const std::false_type band{};
  if (a.d == 64) {
    if (cfg == 1) return go(Cfg<64, 2, 128, 2>{}, band);
    if (cfg == 2) return go(Cfg<64, 3, 128, 3>{}, band);
    if (cfg == 3 || few) return go(Cfg<64, 1, 64, 3, 3>{}, band);
    return go(Cfg<64, 3, 128, 2>{}, band);  // also cfg 4: never the few-keys shape
  }
  if (cfg == 1) return go(Cfg<128, 2, 64, 4>{}, band);
  if (cfg == 5 || many) return go(Cfg<128, 2, 176, 2, 1, 1>{}, band);
  if (cfg == 3 || few) return go(Cfg<128, 1, 64, 2>{}, band);
  return go(Cfg<128, 2, 128, 2>{}, band);  // also cfg 4: neither the few- nor the many-keys shape
}

}  // namespace fwd_ws
}  // namespace
}  // namespace burstlab::cuda::detail
