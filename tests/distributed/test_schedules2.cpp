// Ulysses, all-gather CP and the topology-aware double ring (spec §7.7-7.9) on SimComm with the
// CPU engine: every rank's O, LSE, dQ, dK, dV equal the fp64 oracle's slice (§9 rule), and the
// transfer log's bytes per rank (per link class for the double ring) equal the closed forms.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "algorithm.hpp"
#include "baselines.hpp"
#include "burstlab/error.hpp"
#include "cpu_engine.hpp"
#include "dist_testutil.hpp"
#include "double_ring.hpp"
#include "session.hpp"
#include "shard_ops.hpp"

using namespace burstlab;
using namespace burstlab::dist;
using namespace burstlab::dist_testutil;

namespace {

const PartitionKind kKinds[] = {PartitionKind::Contiguous, PartitionKind::Zigzag, PartitionKind::Striped};
const char* kMasks[] = {"none", "causal", "window:5,2", "document:3", "block:8x8@0.5", "causal+document:3",
                        "window:-1,0+block:4x8@0.6"};

constexpr uint64_t kSeed = 5;

std::string label(const Case& c, const AlgoOptions& o) {
  return o.algo + " " + to_string(o.partition) + " G=" + std::to_string(o.world) + " K=" +
         std::to_string(o.gpus_per_node) + " " + shape_string(c.p) + " mask " + describe(c.p.mask);
}

// Every rank's logged bytes per phase (and per link class) equal the closed form.
void expect_bytes(const Case& c, const AlgoOptions& o, const DistResult<double>& res) {
  const Plan plan = make_plan(c.p, o);
  for (int r = 0; r < o.world; ++r)
    for (Phase ph : {Phase::Forward, Phase::Backward})
      for (int link : {-1, 0, 1}) {
        if (link >= 0 && o.algo != "double-ring") continue;
        const ByteTotals t = totals(res.logs[r], ph, -1, link);
        EXPECT_EQ(t.sent, plan_bytes(plan, ph, r, true, 8, link))
            << label(c, o) << " rank " << r << " " << to_string(ph) << " link " << link;
        EXPECT_EQ(t.recv, plan_bytes(plan, ph, r, false, 8, link))
            << label(c, o) << " rank " << r << " " << to_string(ph) << " link " << link;
      }
}

void sweep(const std::string& algo, int min_runs) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 16});
  struct Shape { int64_t B, Hq, Hkv, Nq, Nk, d; };
  // GQA (4/2), MHA with 6 heads (G = 3), MQA-like 12/6; ragged and unequal lengths.
  const Shape shapes[] = {{1, 4, 2, 41, 41, 8}, {2, 6, 6, 37, 53, 5}, {1, 12, 6, 29, 23, 4}};
  int runs = 0;
  for (const Shape& sh : shapes)
    for (const char* mask : kMasks) {
      const Case c = make_case(sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, sh.d, mask, kSeed);
      for (int G = 1; G <= 7; ++G) {
        if (std::min(sh.Nq, sh.Nk) < 2 * G) continue;
        if (algo == "ulysses" && (sh.Hq % G || sh.Hkv % G)) continue;
        for (PartitionKind k : kKinds) {
          const int K = algo == "double-ring" ? (G % 2 == 0 ? 2 : (G % 3 == 0 ? 3 : 1)) : 0;  // gpus per node
          AlgoOptions o = options(algo, k, G, K);
          o.sim.poison = true;
          o.sim.reorder = (G + static_cast<int>(k)) % 2 == 1;
          o.sim.seed = 7 + G;
          const DistResult<double> res = run_algo(c, o, *engine);
          for (int r = 0; r < G; ++r)
            ASSERT_TRUE(testutil::all_pass(check_rank(c, res, r), label(c, o) + " rank " + std::to_string(r)));
          expect_bytes(c, o, res);
          ++runs;
        }
      }
    }
  EXPECT_GE(runs, min_runs);
}

}  // namespace

TEST(Ulysses, EveryRankMatchesTheOracleSliceAndBytesEqualTheClosedForm) { sweep("ulysses", 150); }
TEST(AllGatherCP, EveryRankMatchesTheOracleSliceAndBytesEqualTheClosedForm) { sweep("allgather", 300); }
TEST(DoubleRing, EveryRankMatchesTheOracleSliceAndBytesPerLinkEqualTheClosedForm) { sweep("double-ring", 300); }

TEST(Ulysses, HeadsNotDivisibleByWorldIsAClearError) {
  auto engine = cpu::make_engine<double>();
  const Case c = make_case(1, 6, 2, 24, 24, 4, "causal", kSeed);
  AlgoOptions o = options("ulysses", PartitionKind::Contiguous, 4);
  try {
    run_algo(c, o, *engine);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_q (6) is not a multiple of the world size G (4)"), std::string::npos)
        << e.what();
  }
  o.world = 3;  // H_q = 6 divides, H_kv = 2 does not
  try {
    run_algo(c, o, *engine);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_kv (2)"), std::string::npos) << e.what();
  }
}

// The closed forms in their paper shape for even shards (N % G == 0): Ulysses moves 1/G of the
// rows of every head group out and back (forward (G-1)/G (N/G)(3d + d + 1) per head slice);
// all-gather moves (G-1) N/G K, V rows; the double ring (G - M) intra and (M - 1) inter hops.
TEST(Schedules2, ClosedFormsInTheirPaperShape) {
  const int64_t B = 2, Hq = 16, Hkv = 8, N = 96, d = 16, eb = 4;
  Problem p = testutil::make_problem(B, Hq, Hkv, N, N, d, "causal", 1);
  for (int G : {2, 4, 8}) {
    const Partition part = make_partition(PartitionKind::Zigzag, N, G);
    const int64_t n = N / G;
    for (int r = 0; r < G; ++r) {
      // Ulysses forward: Q, K, V out ((G-1)/G of n rows of H heads), O, LSE back.
      EXPECT_EQ(ulysses_bytes(Phase::Forward, p, part, part, r, true, eb),
                eb * B * ((G - 1) * n * (Hq + 2 * Hkv) * d / G + (G - 1) * n * Hq * (d + 1) / G));
      EXPECT_EQ(ulysses_bytes(Phase::Backward, p, part, part, r, false, eb),
                eb * B * ((G - 1) * n * (Hq * (2 * d + 2) + 2 * Hkv * d) / G + (G - 1) * n * (Hq + 2 * Hkv) * d / G));
      EXPECT_EQ(allgather_bytes(Phase::Forward, p, part, part, r, true, eb), eb * 2 * B * Hkv * d * (N - n));
      EXPECT_EQ(allgather_bytes(Phase::Backward, p, part, part, r, true, eb), eb * 4 * B * Hkv * d * (N - n));
    }
    for (int K : {1, 2, G}) {
      const int M = G / K;
      for (int r = 0; r < G; ++r) {
        const int64_t kv = 2 * B * Hkv * d * n, q = B * Hq * (2 * d + 2) * n, dq = B * Hq * d * n;
        const int64_t intra_hops = M == 1 ? G - 1 : G - M, inter_hops = M == 1 ? 0 : M - 1;
        EXPECT_EQ(double_ring_bytes(Algo::Burst, Phase::Forward, p, part, part, r, true, eb, K, 0), eb * intra_hops * kv);
        EXPECT_EQ(double_ring_bytes(Algo::Burst, Phase::Forward, p, part, part, r, true, eb, K, 1), eb * inter_hops * kv);
        // Burst backward: Q, dO, D, LSE make G-1 hops; dQ's partial sums G-1 hops too, from the
        // hop after step 1 to the last one home (inter-node when M > 1): the hop after step 0,
        // intra-node unless K = 1, is not made.
        const int64_t dq_intra = M == 1 ? G - 1 : K == 1 ? 0 : G - M - 1;
        const int64_t dq_inter = M == 1 ? 0 : K == 1 ? M - 1 : M;
        EXPECT_EQ(double_ring_bytes(Algo::Burst, Phase::Backward, p, part, part, r, true, eb, K, 0),
                  eb * (intra_hops * q + dq_intra * dq));
        EXPECT_EQ(double_ring_bytes(Algo::Burst, Phase::Backward, p, part, part, r, true, eb, K, 1),
                  eb * (inter_hops * q + dq_inter * dq));
      }
    }
  }
}

TEST(DoubleRing, ShardsVisitEveryRankOnceAndResultsEqualTheFlatRing) {
  // The schedule covers every (rank, shard) pair once; the results equal the flat burst ring's
  // within the oracle bound (only the merge order differs).
  for (int G : {4, 6, 8, 9})
    for (int K : {1, 2, 3, 4}) {
      if (G % K) continue;
      for (int r = 0; r < G; ++r) {
        std::vector<int> seen(G, 0);
        for (int t = 0; t < G; ++t) ++seen[double_ring_shard(r, t, G, K)];
        for (int s = 0; s < G; ++s) EXPECT_EQ(seen[s], 1) << "G=" << G << " K=" << K << " r=" << r;
        EXPECT_EQ(double_ring_shard(r, 0, G, K), r);
      }
    }
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case c = make_case(1, 4, 2, 48, 48, 8, "causal", kSeed);
  const DistResult<double> f = run_algo(c, options("burst", PartitionKind::Zigzag, 6), *engine);
  AlgoOptions o = options("double-ring", PartitionKind::Zigzag, 6, 3);
  const DistResult<double> dr = run_algo(c, o, *engine);
  for (int r = 0; r < 6; ++r) {
    std::vector<Metrics> ms = {compare<double>("O", dr.O[r].view(), f.O[r].view(), as_const(slice<double>(c.want.fwd.O.view(), f.qp, r).view())),
                               compare<double>("dQ", dr.dQ[r].view(), f.dQ[r].view(), as_const(slice<double>(c.want.bwd.dQ.view(), f.qp, r).view())),
                               compare<double>("dK", dr.dK[r].view(), f.dK[r].view(), as_const(slice<double>(c.want.bwd.dK.view(), f.kp, r).view()))};
    EXPECT_TRUE(testutil::all_pass(ms, "double ring vs flat ring rank " + std::to_string(r)));
  }
  // Both ring backward traffics work on the double ring too.
  o.base = Algo::Ring;
  const DistResult<double> rr = run_algo(c, o, *engine);
  for (int r = 0; r < 6; ++r) ASSERT_TRUE(testutil::all_pass(check_rank(c, rr, r), "double ring, ring traffic"));
  expect_bytes(c, o, rr);
}

TEST(Schedules2, TwoRunsAreBitwiseEqual) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case c = make_case(1, 4, 4, 45, 39, 8, "causal+document:3", kSeed);
  for (const char* a : {"ulysses", "allgather", "double-ring"}) {
    AlgoOptions o = options(a, PartitionKind::Zigzag, 4, 2);
    o.sim.reorder = true;
    const DistResult<double> x = run_algo(c, o, *engine);
    o.sim.seed = 99;
    const DistResult<double> y = run_algo(c, o, *engine);
    for (int r = 0; r < 4; ++r) {
      for (auto pr : {std::make_pair(&x.O[r], &y.O[r]), std::make_pair(&x.dQ[r], &y.dQ[r]),
                      std::make_pair(&x.dK[r], &y.dK[r]), std::make_pair(&x.dV[r], &y.dV[r])})
        EXPECT_EQ(std::memcmp(pr.first->data.data(), pr.second->data.data(), pr.first->data.size() * 8), 0)
            << a << " rank " << r;
    }
  }
}

TEST(Schedules2, InjectedFailureFailsEveryRankWithoutHanging) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case c = make_case(1, 4, 4, 40, 40, 4, "causal", kSeed);
  for (const char* a : {"ulysses", "allgather", "double-ring"})
    for (int op : {0, 5, 11}) {
      AlgoOptions o = options(a, PartitionKind::Striped, 4, 2);
      o.sim.fail_rank = 1;
      o.sim.fail_at_op = op;
      o.sim.timeout_s = 20;
      std::vector<std::string> errors;
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_THROW(run_algo(c, o, *engine, &errors), Error) << a << " op " << op;
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
      ASSERT_EQ(errors.size(), 4u);
      for (int r = 0; r < 4; ++r) EXPECT_NE(errors[r].find("rank 1"), std::string::npos) << errors[r];
    }
}

// BurstEngine's separate inter-node buffer (spec §7.9): the read-only tensors' inter-node hop is
// posted at the start of each node round and lands K steps later, in flight during the whole
// round. Every step computes on the same shard as the one-hop-per-step double ring, so results
// are bitwise equal; bytes per link class equal the (prefetch) closed form, and the plain one
// for even shards (7.15).
TEST(DoubleRing, PrefetchedInterNodeHopIsBitwiseEqualToOneHopPerStep) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case c = make_case(1, 4, 2, 43, 38, 8, "causal+document:3", kSeed);
  int runs = 0;
  for (auto [G, K] : {std::pair<int, int>{4, 2}, {6, 2}, {6, 3}, {8, 4}, {9, 3}})
    for (Algo base : {Algo::Burst, Algo::Ring})
      for (PartitionKind k : {PartitionKind::Contiguous, PartitionKind::Zigzag}) {
        if (k == PartitionKind::Zigzag && std::min(c.p.N_q, c.p.N_k) < 2 * G) continue;
        AlgoOptions o = options("double-ring", k, G, K);
        o.base = base;
        o.sim.poison = true;
        o.sim.reorder = true;
        o.sim.seed = 3 + G;
        const DistResult<double> pf = run_algo(c, o, *engine);
        expect_bytes(c, o, pf);
        o.prefetch_inter = false;
        const DistResult<double> plain = run_algo(c, o, *engine);
        expect_bytes(c, o, plain);
        const std::string what = std::string(base == Algo::Burst ? "burst" : "ring") + " G=" + std::to_string(G) +
                                 " K=" + std::to_string(K) + " " + to_string(k);
        for (int r = 0; r < G; ++r) {
          for (auto pr : {std::make_pair(&pf.O[r], &plain.O[r]), std::make_pair(&pf.dQ[r], &plain.dQ[r]),
                          std::make_pair(&pf.dK[r], &plain.dK[r]), std::make_pair(&pf.dV[r], &plain.dV[r])})
            ASSERT_EQ(std::memcmp(pr.first->data.data(), pr.second->data.data(), pr.first->data.size() * 8), 0)
                << what << " rank " << r;
          ASSERT_EQ(std::memcmp(pf.LSE[r].data.data(), plain.LSE[r].data.data(), pf.LSE[r].data.size() * 8), 0)
              << what << " rank " << r;
          ASSERT_TRUE(testutil::all_pass(check_rank(c, pf, r), what + " rank " + std::to_string(r)));
        }
        // The schedule: per rank M - 1 prefetched hops per read-only tensor, to (n+1, g), posted
        // at t = aK and landing at (a+1)K; no read-only hop at a round end.
        const int M = G / K;
        for (const Schedule* s : {&pf.fwd, &pf.bwd})
          for (int r = 0; r < G; ++r) {
            int prefetched = 0;
            for (int t = 0; t < G; ++t)
              for (const Message& m : s->steps[r][t].sends) {
                const Item& it = travelling_items(s->algo, s->phase)[m.item];
                if (m.lands > 0) {
                  ++prefetched;
                  EXPECT_EQ(t % K, 0) << what;
                  EXPECT_EQ(m.lands, t + K) << what;
                  EXPECT_EQ(m.peer, ((r / K + 1) % M) * K + r % K) << what;
                  EXPECT_FALSE(it.accumulated) << what;
                } else if (!it.accumulated) {
                  EXPECT_NE(t % K, K - 1) << what << " read-only hop at a round end";
                }
              }
            int read_only = 0;
            for (const Item& it : travelling_items(s->algo, s->phase)) read_only += it.accumulated ? 0 : 1;
            EXPECT_EQ(prefetched, (M - 1) * read_only) << what << " rank " << r;
          }
        // Executed, not only planned: every read-only inter-node transfer is posted (logged) at a
        // round start, K steps before the step that reads it.
        for (int r = 0; r < G; ++r)
          for (const Transfer& x : pf.logs[r])
            if (x.link == Link::Inter && x.what != "dQ" && x.what != "dK" && x.what != "dV") {
              EXPECT_EQ(x.step % K, 0) << what << " rank " << r << " " << x.what << " step " << x.step;
            }
        ++runs;
      }
  EXPECT_GE(runs, 16);
  // Even shards: the per-class totals are those of one hop per step, eq. (7.15).
  const Problem p = testutil::make_problem(2, 4, 2, 48, 48, 8, "causal", 1);
  for (auto [G, K] : {std::pair<int, int>{4, 2}, {6, 3}, {8, 2}})
    for (Algo base : {Algo::Burst, Algo::Ring})
      for (Phase ph : {Phase::Forward, Phase::Backward}) {
        const Partition part = make_partition(PartitionKind::Zigzag, 48, G);
        for (int r = 0; r < G; ++r)
          for (int link : {0, 1})
            for (bool sent : {true, false})
              EXPECT_EQ(double_ring_bytes(base, ph, p, part, part, r, sent, 2, K, link, true),
                        double_ring_bytes(base, ph, p, part, part, r, sent, 2, K, link, false))
                  << G << " " << K << " rank " << r << " link " << link;
      }
}

// Every message of every schedule is posted inside a batch (Communicator::batch): the
// grouping an NCCL transport needs so that pairwise exchanges cannot deadlock.
TEST(Schedules, EveryTransferIsPostedInABatch) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case c = make_case(1, 4, 4, 48, 48, 4, "causal", kSeed);
  auto check_logs = [&](const DistResult<double>& res, const std::string& what) {
    int64_t n = 0;
    for (size_t r = 0; r < res.logs.size(); ++r)
      for (const Transfer& t : res.logs[r]) {
        ++n;
        EXPECT_GE(t.batch, 0) << what << " rank " << r << " " << to_string(t.phase) << " step " << t.step << " "
                              << t.what << " to/from " << (t.sent ? t.dst : t.src);
      }
    EXPECT_GT(n, 0) << what;
  };
  for (const char* a : {"ring", "burst", "double-ring", "ulysses", "allgather", "attention2d", "attention2d-o",
                        "distflash"}) {
    const PartitionKind k = find_algorithm(a).partition.value_or(PartitionKind::Zigzag);
    check_logs(run_algo(c, options(a, k, 4, std::string(a) == "double-ring" ? 2 : 0), *engine), a);
  }
}

namespace {
// An engine that runs nothing until synchronize(): every copy, fill, add and compute call of a
// thread is queued and runs when that thread synchronizes (or uploads, downloads), the way a GPU
// stream runs asynchronously. A schedule that hands the transport a buffer its engine has not finished
// sends stale data, and the oracle check fails — on a CPU, deterministically.
template <class T>
class DeferredEngine final : public Engine<T> {
  using A = acc_t<T>;

 public:
  // nan_alloc: new buffers are all-ones bytes (NaN in every floating type): a read of memory
  // nothing wrote yet (allocate's contents are unspecified) shows in the oracle check. The inner
  // engine's memory must be host memory.
  explicit DeferredEngine(Engine<T>& in, bool nan_alloc = false) : in_(in), nan_alloc_(nan_alloc) {}
  std::string name() const override { return "deferred(" + in_.name() + ")"; }
  // Frees are stream-ordered too: a released buffer lives until the releasing thread's queued
  // work has run (the CUDA engine's cached blocks wait for an event the same way).
  std::shared_ptr<void> allocate(int64_t bytes) override {
    std::shared_ptr<void> inner = in_.allocate(bytes);
    void* p = inner.get();
    if (nan_alloc_) std::memset(p, 0xff, size_t(bytes));
    return std::shared_ptr<void>(p, [this, inner](void*) mutable { later([inner] {}); });
  }
  void upload(void* d, const void* h, int64_t n) override {
    synchronize();
    in_.upload(d, h, n);
  }
  void download(void* h, const void* s, int64_t n) override {
    synchronize();
    in_.download(h, s, n);
  }
  void copy(void* d, const void* s, int64_t n) override { later([=] { in_.copy(d, s, n); }); }
  void fill(void* d, int64_t n, Dtype t, double v) override { later([=] { in_.fill(d, n, t, v); }); }
  void add(void* a, const void* b, int64_t n, Dtype t) override { later([=] { in_.add(a, b, n, t); }); }
  void synchronize() override {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> lk(mu_);
      run.swap(queue_[std::this_thread::get_id()]);
    }
    for (auto& f : run) f();
  }
  PreparedMask prepare(const MaskData& m) override { return in_.prepare(m); }
  void forward_block(const Problem& p, const PreparedMask& m, Positions q, Positions k, View4<const T> Q,
                     View4<const T> K, View4<const T> V, View4<T> O, View3<A> L, bool acc) override {
    // Positions may point at host indices that live only for the call: copy them.
    auto qi = keep(q), ki = keep(k);
    later([=] { in_.forward_block(p, m, pos(q, qi), pos(k, ki), Q, K, V, O, L, acc); });
  }
  void merge(View4<T> O, View3<A> L, View4<const T> Op, View3<const A> Lp) override {
    later([=] { in_.merge(O, L, Op, Lp); });
  }
  void compute_D(View4<const T> O, View4<const T> dO, View3<A> D) override { later([=] { in_.compute_D(O, dO, D); }); }
  void backward_block(const Problem& p, const PreparedMask& m, Positions q, Positions k, View4<const T> Q,
                      View4<const T> K, View4<const T> V, View4<const T> dO, View3<const A> L, View3<const A> D,
                      View4<A> dQ, View4<A> dK, View4<A> dV) override {
    auto qi = keep(q), ki = keep(k);
    later([=] { in_.backward_block(p, m, pos(q, qi), pos(k, ki), Q, K, V, dO, L, D, dQ, dK, dV); });
  }

 private:
  static std::shared_ptr<std::vector<int64_t>> keep(Positions p) {
    return p.index ? std::make_shared<std::vector<int64_t>>(p.index, p.index + p.n) : nullptr;
  }
  static Positions pos(Positions p, const std::shared_ptr<std::vector<int64_t>>& idx) {
    if (idx) p.index = idx->data();
    return p;
  }
  void later(std::function<void()> f) {
    std::lock_guard<std::mutex> lk(mu_);
    queue_[std::this_thread::get_id()].push_back(std::move(f));
  }
  Engine<T>& in_;
  bool nan_alloc_ = false;
  std::mutex mu_;
  std::map<std::thread::id, std::vector<std::function<void()>>> queue_;
};
}  // namespace

// Every algorithm of the table with engine work that runs only at synchronize(): each schedule
// synchronizes its engine before the transport reads what the engine wrote (a GPU's streams
// require it; the CPU engine alone would never show a missing synchronize).
TEST(Schedules, EngineWorkIsFinishedBeforeTheTransportReadsIt) {
  auto cpu = cpu::make_engine<double>(cpu::Tiles{8, 8});
  DeferredEngine<double> engine(*cpu);
  const Case c = make_case(1, 4, 4, 48, 40, 4, "causal", kSeed);
  for (const Algorithm& a : algorithms()) {
    AlgoOptions o = options(a.name, a.partition.value_or(PartitionKind::Zigzag), 4, 2);
    o.sim.poison = true;
    const DistResult<double> res =
        run_session<double>(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, engine);
    for (int r = 0; r < 4; ++r)
      ASSERT_TRUE(testutil::all_pass(check_rank(c, res, r), std::string(a.name) + " rank " + std::to_string(r)));
  }
}

// The collectives move each tensor between a pair of ranks as ONE message each way per step,
// whatever the batch size and head count (pieces of many (b, h) packed or staged: shard_ops.hpp's
// exchange), with the results still the oracle's: poisoned receive buffers, reordered completion,
// engine work deferred to synchronize() as on a GPU stream, and new buffers NaN (a staged piece
// not copied into place, or copied before its receive completed, reads as NaN).
TEST(Collectives, EachTensorIsOneMessageEachWayPerPeer) {
  auto cpu = cpu::make_engine<double>(cpu::Tiles{8, 16});
  DeferredEngine<double> engine(*cpu, true);
  const Case c = make_case(2, 6, 3, 37, 31, 5, "causal", kSeed);  // B = 2, GQA, ragged shards
  const std::pair<const char*, int> runs[] = {{"ulysses", 3},       {"allgather", 3},     {"usp", 6},
                                              {"attention2d", 4},   {"attention2d", 2},   {"attention2d-o", 2},
                                              {"attention2d-o", 4}, {"attention2d-o", 6}, {"attention2d-o", 9}};
  for (const auto& [algo, G] : runs)
    for (PartitionKind k : {PartitionKind::Zigzag, PartitionKind::Striped}) {
      if (std::string(algo).rfind("attention2d", 0) == 0 && k != PartitionKind::Striped) continue;  // cyclic only
      AlgoOptions o = options(algo, k, G);
      if (std::string(algo) == "usp") o.ulysses_degree = 3;
      o.sim.poison = true;
      o.sim.reorder = true;
      o.sim.seed = 11;
      const DistResult<double> res = run_algo(c, o, engine);
      for (int r = 0; r < o.world; ++r) {
        ASSERT_TRUE(testutil::all_pass(check_rank(c, res, r), label(c, o) + " rank " + std::to_string(r)));
        std::map<std::tuple<Phase, int, int, bool, std::string>, int> per;  // (phase, step, peer, sent, tensor)
        for (const Transfer& t : res.logs[r]) ++per[{t.phase, t.step, t.sent ? t.dst : t.src, t.sent, t.what}];
        for (const auto& [key, n] : per)
          EXPECT_EQ(n, 1) << label(c, o) << " rank " << r << " " << to_string(std::get<0>(key)) << " step "
                          << std::get<1>(key) << ": " << n << " messages of " << std::get<4>(key)
                          << (std::get<3>(key) ? " to " : " from ") << std::get<2>(key);
      }
    }
}

namespace {
// An engine that counts the calls a pass makes of it (forwarded to `in`): what a schedule asks of
// a GPU stream besides its attention blocks. Each copy, synchronize and allocation costs a GPU
// engine a few microseconds whatever its size.
template <class T>
class CountingEngine final : public Engine<T> {
  using A = acc_t<T>;

 public:
  explicit CountingEngine(Engine<T>& in) : in_(in) {}
  std::map<std::string, int64_t> take() {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(n_, {});
  }
  std::string name() const override { return "counting(" + in_.name() + ")"; }
  std::shared_ptr<void> allocate(int64_t b) override { return count("allocate"), in_.allocate(b); }
  void upload(void* d, const void* h, int64_t b) override { count("upload"), in_.upload(d, h, b); }
  void download(void* h, const void* s, int64_t b) override { count("download"), in_.download(h, s, b); }
  void copy(void* d, const void* s, int64_t b) override { count("copy"), in_.copy(d, s, b); }
  void copy_rows(void* d, int64_t dp, const void* s, int64_t sp, int64_t b, int64_t rows) override {
    count("copy"), in_.copy_rows(d, dp, s, sp, b, rows);
  }
  void fill(void* d, int64_t n, Dtype t, double v) override { count("fill"), in_.fill(d, n, t, v); }
  void add(void* a, const void* b, int64_t n, Dtype t) override { count("add"), in_.add(a, b, n, t); }
  void synchronize() override { count("synchronize"), in_.synchronize(); }
  PreparedMask prepare(const MaskData& m) override { return count("prepare"), in_.prepare(m); }
  void forward_block(const Problem& p, const PreparedMask& m, Positions q, Positions k, View4<const T> Q,
                     View4<const T> K, View4<const T> V, View4<T> O, View3<A> L, bool acc) override {
    count("block"), in_.forward_block(p, m, q, k, Q, K, V, O, L, acc);
  }
  void merge(View4<T> O, View3<A> L, View4<const T> Op, View3<const A> Lp) override {
    count("merge"), in_.merge(O, L, Op, Lp);
  }
  void compute_D(View4<const T> O, View4<const T> dO, View3<A> D) override { count("D"), in_.compute_D(O, dO, D); }
  void backward_block(const Problem& p, const PreparedMask& m, Positions q, Positions k, View4<const T> Q,
                      View4<const T> K, View4<const T> V, View4<const T> dO, View3<const A> L, View3<const A> D,
                      View4<A> dQ, View4<A> dK, View4<A> dV) override {
    count("block"), in_.backward_block(p, m, q, k, Q, K, V, dO, L, D, dQ, dK, dV);
  }

 private:
  void count(const char* what) {
    std::lock_guard<std::mutex> lk(mu_);
    ++n_[what];
  }
  Engine<T>& in_;
  std::mutex mu_;
  std::map<std::string, int64_t> n_;
};
}  // namespace

// The engine calls of one pass of each algorithm, 2 ranks, H = 32 (printed: docs/performance-gpu.md
// quotes the table; a copy_rows counts as one copy). The ring family moves its shards through the
// transport straight into the slots the blocks read, so it makes no engine copy; the collectives
// copy each tensor's (b, h) row blocks as one copy_rows per peer, way and batch index (the own
// blocks into place, a peer's packed or unpacked; here B = 1), never more than twice per block.
TEST(Schedules, EngineCallsPerPass) {
  auto cpu = cpu::make_engine<double>(cpu::Tiles{64, 64});
  CountingEngine<double> engine(*cpu);
  const int64_t B = 1, H = 32, G = 2;
  const Case c = make_case(B, H, H, 256, 256, 4, "causal", kSeed);
  std::printf("%-14s %-8s %6s %6s %6s %6s %6s %6s  (2 ranks together)\n", "algorithm", "pass", "block", "copy",
              "sync", "alloc", "fill", "add");
  for (const Algorithm& a : algorithms()) {
    const std::string name = a.name;
    AlgoOptions o = options(name, a.partition.value_or(PartitionKind::Zigzag), G, name == "double-ring" ? 1 : 0);
    if (name == "usp") o.ulysses_degree = 2;
    Session<double> s(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, engine);
    engine.take();
    for (Phase ph : {Phase::Forward, Phase::Backward}) {
      ph == Phase::Forward ? s.forward() : s.backward();
      std::map<std::string, int64_t> n = engine.take();
      std::printf("%-14s %-8s %6lld %6lld %6lld %6lld %6lld %6lld\n", a.name, to_string(ph).c_str(),
                  (long long)n["block"], (long long)n["copy"], (long long)n["synchronize"], (long long)n["allocate"],
                  (long long)n["fill"], (long long)n["add"]);
      EXPECT_GE(n["block"], G) << a.name << " " << to_string(ph);
      const bool ring_family = name == "ring" || name == "burst" || name == "double-ring" || name == "distflash";
      if (ring_family) {
        EXPECT_EQ(n["copy"], 0) << a.name << " " << to_string(ph);
      }
      // Tensors a collective moves per pass: forward Q, K, V, O, LSE; backward Q, dO, LSE, D, K, V,
      // dQ, dK, dV; G ranks, B H / G row blocks each, G row pieces a block.
      const int64_t tensors = ph == Phase::Forward ? 5 : 9;
      EXPECT_LE(n["copy"], 2 * tensors * G * B * H) << a.name << " " << to_string(ph);
      if (name == "ulysses" || name == "allgather" || name == "usp") {
        EXPECT_LE(n["copy"], 2 * tensors * G * G) << a.name << " " << to_string(ph) << ": not one copy_rows per peer";
      }
    }
  }
}

// Attention2D-O's column ring (§7.13) places the rank's K, V shard in its column buffer: one
// copy_rows per tensor, not one copy per (b, h) block. A 2 x 2 grid (columns of two members),
// B = 2, H_kv = 16: one copy per block would be 2 B H_kv = 64 a rank for the placement alone.
TEST(Schedules, Attention2dOPlacesItsColumnBlockInOneCallPerTensor) {
  auto cpu = cpu::make_engine<double>(cpu::Tiles{64, 64});
  CountingEngine<double> engine(*cpu);
  const int64_t B = 2, H = 16, G = 4;
  const Case c = make_case(B, H, H, 128, 128, 4, "causal", kSeed);
  AlgoOptions o = options("attention2d-o", PartitionKind::Striped, G);
  o.grid = Grid{2, 2};
  Session<double> s(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, engine);
  engine.take();
  s.forward();
  const int64_t copies = engine.take()["copy"];
  std::printf("attention2d-o 2x2, B = 2, H = 16, forward: %lld engine copies (4 ranks together)\n", (long long)copies);
  EXPECT_GT(copies, 0);
  // At most one copy_rows per tensor, rank, member of its row and column, and batch index:
  // 5 x 4 x (2 + 2) x 2 = 160 (the per-block placement made 272).
  EXPECT_LE(copies, 5 * G * (2 + 2) * B);
  s.backward();  // the same session's outputs against the oracle, no second run
  const dist::DistResult<double> res = s.result();
  for (int r = 0; r < G; ++r) EXPECT_TRUE(testutil::all_pass(check_rank(c, res, r), "rank " + std::to_string(r)));
}

// copy_pieces: a run of equal copies whose sources and destinations each advance by one stride
// (at least the size) is one copy_rows; anything else is copied alone; the bytes land as the
// copies one by one would put them.
TEST(CopyPieces, RunsOfEqualStridedCopiesAreOneCopyRows) {
  struct Recording final : Engine<double> {
    std::vector<std::string> calls;
    std::string name() const override { return "recording"; }
    std::shared_ptr<void> allocate(int64_t b) override { return std::shared_ptr<void>(std::malloc(size_t(b)), std::free); }
    void upload(void* d, const void* h, int64_t b) override { std::memcpy(d, h, size_t(b)); }
    void download(void* h, const void* s, int64_t b) override { std::memcpy(h, s, size_t(b)); }
    void copy(void* d, const void* s, int64_t b) override {
      calls.push_back("copy " + std::to_string(b));
      std::memcpy(d, s, size_t(b));
    }
    void copy_rows(void* d, int64_t dp, const void* s, int64_t sp, int64_t b, int64_t rows) override {
      calls.push_back("rows " + std::to_string(dp) + " " + std::to_string(sp) + " " + std::to_string(b) + " x" +
                      std::to_string(rows));
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(static_cast<char*>(d) + i * dp, static_cast<const char*>(s) + i * sp, size_t(b));
    }
    void fill(void*, int64_t, Dtype, double) override {}
    void add(void*, const void*, int64_t, Dtype) override {}
    PreparedMask prepare(const MaskData&) override { return {}; }
    void forward_block(const Problem&, const PreparedMask&, Positions, Positions, View4<const double>,
                       View4<const double>, View4<const double>, View4<double>, View3<double>, bool) override {}
    void merge(View4<double>, View3<double>, View4<const double>, View3<const double>) override {}
    void compute_D(View4<const double>, View4<const double>, View3<double>) override {}
    void backward_block(const Problem&, const PreparedMask&, Positions, Positions, View4<const double>,
                        View4<const double>, View4<const double>, View4<const double>, View3<const double>,
                        View3<const double>, View4<double>, View4<double>, View4<double>) override {}
  } e;
  std::vector<char> src(4096), dst(4096, 0), want(4096, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
  std::vector<Copy> copies;
  for (int i = 0; i < 4; ++i) copies.push_back({dst.data() + 100 * i, src.data() + 64 * i, 40});  // strided run
  copies.push_back({dst.data() + 600, src.data() + 300, 24});                                       // another size
  copies.push_back({dst.data() + 700, src.data() + 2000, 50});  // destinations 60 apart:
  copies.push_back({dst.data() + 760, src.data() + 1000, 50});  // a negative source stride
  copies.push_back({dst.data() + 800, src.data() + 3000, 16});  // pitches below the size
  copies.push_back({dst.data() + 810, src.data() + 3010, 16});
  copies.push_back({dst.data() + 900, src.data() + 3500, 8});   // a run of two
  copies.push_back({dst.data() + 950, src.data() + 3600, 8});
  for (const Copy& c : copies) std::memcpy(want.data() + (static_cast<char*>(c.to) - dst.data()), c.from, size_t(c.bytes));
  copy_pieces(e, copies);
  EXPECT_EQ(e.calls, (std::vector<std::string>{"rows 100 64 40 x4", "copy 24", "copy 50", "copy 50", "copy 16",
                                                "copy 16", "rows 50 100 8 x2"}));
  EXPECT_EQ(dst, want);
}
