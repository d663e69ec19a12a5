// tests/distributed/test_head_chunks.cpp — Ulysses' and USP's all-to-alls by head chunks
// (distributed/head_a2a.hpp, spec §7.7, §7.14): every chunk count against the oracle and the
// closed forms; the chunks change no value (bitwise, CPU engine); chunk j+1's inputs are posted
// before chunk j computes and chunk j's outputs before chunk j+1 computes; the gathered layout
// is in global order for contiguous and zigzag partitions, so the block runs over contiguous
// positions (one launch per chunk, counted here against the parts the old rank-order layout split
// into).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "burstlab/block_split.hpp"
#include "burstlab/error.hpp"
#include "cpu_engine.hpp"
#include "dist_testutil.hpp"
#include "head_a2a.hpp"
#include "session.hpp"

namespace {

using namespace burstlab;
using namespace burstlab::dist;
using namespace burstlab::dist_testutil;

const PartitionKind kKinds[] = {PartitionKind::Contiguous, PartitionKind::Zigzag, PartitionKind::Striped};

AlgoOptions chunked(const std::string& algo, PartitionKind k, int G, int u, int chunks) {
  AlgoOptions o = options(algo, k, G);
  o.ulysses_degree = u;
  o.head_chunks = chunks;
  return o;
}

std::string label(const AlgoOptions& o, const Case& c) {
  return o.algo + " " + to_string(o.partition) + " G=" + std::to_string(o.world) + " u=" +
         std::to_string(o.ulysses_degree) + " chunks=" + std::to_string(o.head_chunks) + " " + shape_string(c.p) +
         " mask " + describe(c.p.mask);
}

bool same(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

}  // namespace

TEST(HeadChunks, CountIsADivisorOfTheKvHeadsAtMostTheRequest) {
  EXPECT_EQ(head_chunk_count(0, 16), 2);  // the default
  EXPECT_EQ(head_chunk_count(1, 16), 1);
  EXPECT_EQ(head_chunk_count(4, 16), 4);
  EXPECT_EQ(head_chunk_count(3, 16), 2);  // a divisor: chunks of equal size
  EXPECT_EQ(head_chunk_count(5, 3), 3);   // at most the kv heads
  EXPECT_EQ(head_chunk_count(0, 1), 1);   // one kv head: nothing to chunk
  EXPECT_EQ(head_chunk_count(2, 3), 1);
  const Case c = make_case(1, 4, 4, 24, 24, 4, "causal", 3);
  for (const char* a : {"ulysses", "usp"}) {
    AlgoOptions o = chunked(a, PartitionKind::Zigzag, 2, 2, -1);
    try {
      make_plan(c.p, o);
      FAIL() << a << ": a negative head chunk count must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("head chunks (-1)"), std::string::npos) << e.what();
    }
  }
}

// Every chunk count (1 = the unchunked schedule, those that clamp, the largest) on every
// partition, GQA, ragged and unequal lengths: every rank against the oracle, bytes = the closed
// forms (7.10)-(7.11), (7.27); and every count gives the bits of c = 1.
TEST(HeadChunks, EveryCountMatchesTheOracleTheClosedFormsAndTheUnchunkedBits) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 16});
  struct Shape { int64_t B, Hq, Hkv, Nq, Nk, d; };
  const Shape shapes[] = {{1, 12, 12, 41, 41, 8}, {2, 12, 6, 37, 53, 5}};
  int runs = 0;
  for (const Shape& sh : shapes)
    for (const char* mask : {"causal", "window:5,2", "none"}) {
      const Case c = make_case(sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, sh.d, mask, 7);
      for (const char* algo : {"ulysses", "usp"})
        for (int G : {2, 3}) {
          const int u = std::string(algo) == "usp" ? (G == 2 ? 2 : 3) : G;
          for (PartitionKind k : kKinds) {
            DistResult<double> base;
            for (int chunks : {1, 2, 3, 6}) {
              AlgoOptions o = chunked(algo, k, G, u, chunks);
              o.sim.poison = true;
              o.sim.reorder = chunks % 2 == 0;
              o.sim.seed = 11 + chunks;
              const std::string what = label(o, c);
              const DistResult<double> res = run_algo(c, o, *engine);
              for (int r = 0; r < G; ++r)
                ASSERT_TRUE(testutil::all_pass(check_rank(c, res, r), what + " rank " + std::to_string(r)));
              const Plan pl = make_plan(c.p, o);
              for (int r = 0; r < G; ++r)
                for (Phase ph : {Phase::Forward, Phase::Backward}) {
                  const ByteTotals t = totals(res.logs[r], ph);
                  EXPECT_EQ(t.sent, plan_bytes(pl, ph, r, true, 8)) << what << " rank " << r << " " << to_string(ph);
                  EXPECT_EQ(t.recv, plan_bytes(pl, ph, r, false, 8)) << what << " rank " << r << " " << to_string(ph);
                }
              EXPECT_EQ(in_order_problem(res.logs), "") << what;
              if (chunks == 1) {
                base = res;
              } else {
                for (int r = 0; r < G; ++r) {
                  EXPECT_TRUE(same(res.O[r].data, base.O[r].data)) << what << " O rank " << r;
                  EXPECT_TRUE(same(res.dQ[r].data, base.dQ[r].data)) << what << " dQ rank " << r;
                  EXPECT_TRUE(same(res.dK[r].data, base.dK[r].data)) << what << " dK rank " << r;
                  EXPECT_TRUE(same(res.dV[r].data, base.dV[r].data)) << what << " dV rank " << r;
                }
              }
              ++runs;
            }
          }
        }
    }
  EXPECT_GE(runs, 140);
}

namespace {

// One rank thread's events, in order: "in <step>" for the sends of an all-to-all in (Q ... V),
// "out <step>" for those of one back (O, LSE / dQ, dK, dV), "compute" for a block; consecutive
// repeats folded.
thread_local std::vector<std::string>* events = nullptr;
void note(const std::string& e) {
  if (events && (events->empty() || events->back() != e)) events->push_back(e);
}

class EventComm final : public ForwardingComm {
 public:
  explicit EventComm(Communicator& c) : ForwardingComm(c), c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  Link link_to(int peer) const override { return c_.link_to(peer); }
  RequestPtr isend(const void* buf, int64_t bytes, int dst, int tag, const char* what, bool consume) override {
    const std::string w = what;
    const bool back = w == "O" || w == "LSE" || w == "dQ" || w == "dK" || w == "dV";
    if (phase() == Phase::Forward || w != "LSE") note((back ? "out " : "in ") + std::to_string(step()));
    else note("in " + std::to_string(step()));  // the backward's LSE travels in
    return c_.isend(buf, bytes, dst, tag, what, consume);
  }
  RequestPtr irecv(void* buf, int64_t bytes, int src, int tag, const char* what) override {
    return c_.irecv(buf, bytes, src, tag, what);
  }
  void barrier() override { c_.barrier(); }

 protected:
  void context_changed() override { c_.set_context(phase(), step()); }

 private:
  Communicator& c_;
};

// Forwards every call to the CPU engine; notes each block, and counts blocks, those over indexed
// positions, the kernel launches they make (their parts: block_split.hpp) and copies.
class CountingEngine final : public Engine<double> {
 public:
  explicit CountingEngine(Engine<double>& in) : in_(in) {}
  struct Counts {
    int blocks = 0, indexed = 0, launches = 0, copies = 0;
    int64_t copy_bytes = 0;
  };
  Counts counts() {
    std::lock_guard<std::mutex> lk(mu_);
    return n_;
  }
  std::string name() const override { return "counting(" + in_.name() + ")"; }
  std::shared_ptr<void> allocate(int64_t bytes) override { return in_.allocate(bytes); }
  void upload(void* d, const void* h, int64_t n) override { in_.upload(d, h, n); }
  void download(void* h, const void* s, int64_t n) override { in_.download(h, s, n); }
  void copy(void* d, const void* s, int64_t n) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++n_.copies;
      n_.copy_bytes += n;
    }
    in_.copy(d, s, n);
  }
  void fill(void* d, int64_t n, Dtype t, double v) override { in_.fill(d, n, t, v); }
  void add(void* a, const void* b, int64_t n, Dtype t) override { in_.add(a, b, n, t); }
  PreparedMask prepare(const MaskData& m) override {
    params_ = m.params();
    return in_.prepare(m);
  }
  void forward_block(const Problem& p, const PreparedMask& m, Positions q, Positions k, View4<const double> Q,
                     View4<const double> K, View4<const double> V, View4<double> O, View3<double> L,
                     bool accumulate) override {
    block(q, k);
    in_.forward_block(p, m, q, k, Q, K, V, O, L, accumulate);
  }
  void merge(View4<double> O, View3<double> L, View4<const double> Op, View3<const double> Lp) override {
    in_.merge(O, L, Op, Lp);
  }
  void compute_D(View4<const double> O, View4<const double> dO, View3<double> D) override { in_.compute_D(O, dO, D); }
  void backward_block(const Problem& p, const PreparedMask& m, Positions q, Positions k, View4<const double> Q,
                      View4<const double> K, View4<const double> V, View4<const double> dO,
                      View3<const double> L, View3<const double> D, View4<double> dQ, View4<double> dK,
                      View4<double> dV) override {
    block(q, k);
    in_.backward_block(p, m, q, k, Q, K, V, dO, L, D, dQ, dK, dV);
  }

 private:
  void block(Positions q, Positions k) {
    note("compute");
    int launches = 1;  // the engines run indexed positions by their parts when they split
    if (q.index || k.index) {
      const std::vector<BlockPart> parts = split_block(params_, q, k);
      if (!parts.empty()) {
        launches = 0;
        for (const BlockPart& b : parts) launches += b.hidden ? 0 : 1;
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    ++n_.blocks;
    n_.indexed += (q.index || k.index) ? 1 : 0;
    n_.launches += launches;
  }
  Engine<double>& in_;
  MaskParams params_;
  std::mutex mu_;
  Counts n_;
};

// The events of every rank of one pass of `phase` (a forward first when phase is the backward).
std::vector<std::vector<std::string>> pass_events(const Case& c, const AlgoOptions& o, Phase phase, Engine<double>& e) {
  Session<double> s(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, e);
  if (phase == Phase::Backward) s.forward();
  std::vector<std::vector<std::string>> ev(o.world);
  SimWorld w(o.world, o.sim);
  w.run([&](Communicator& comm) {
    events = &ev[comm.rank()];
    EventComm ec(comm);
    s.rank_pass(phase, ec);
    events = nullptr;
  });
  return ev;
}

}  // namespace

// The pipeline's order on every rank: chunk 0's inputs (step 0), then at step 1 + j L chunk j-1's
// outputs and chunk j+1's inputs posted BEFORE chunk j computes; chunk c-1's outputs last.
TEST(HeadChunks, NextChunksInputsAndLastChunksOutputsArePostedBeforeTheChunkComputes) {
  auto cpu = cpu::make_engine<double>(cpu::Tiles{8, 16});
  CountingEngine e(*cpu);
  const Case c = make_case(1, 6, 6, 30, 30, 4, "causal", 5);
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    // Ulysses, G = 2, 3 kv heads a rank, 3 chunks: steps 0, 1, 2, 3, 4.
    AlgoOptions o = chunked("ulysses", PartitionKind::Zigzag, 2, 2, 3);
    const std::vector<std::string> want = {"in 0",  "in 1",  "compute", "out 2", "in 2",
                                           "compute", "out 3", "compute", "out 4"};
    for (const auto& ev : pass_events(c, o, ph, e)) EXPECT_EQ(ev, want) << "ulysses " << to_string(ph);
    // USP with one group (u = G = 2): its ring of one is one compute step per chunk, as Ulysses.
    o.algo = "usp";
    for (const auto& ev : pass_events(c, o, ph, e)) EXPECT_EQ(ev, want) << "usp " << to_string(ph);
    // c = 1: the unchunked order.
    o.algo = "ulysses";
    o.head_chunks = 1;
    const std::vector<std::string> one = {"in 0", "compute", "out 2"};
    for (const auto& ev : pass_events(c, o, ph, e)) EXPECT_EQ(ev, one) << "ulysses c=1 " << to_string(ph);
  }
}

// The CPU counter: at G = 2, zigzag, causal, N = 2048, Ulysses' block of each chunk runs over
// contiguous positions [0, N) (one launch), where the old rank-order layout (chunks 0, 3 | 1, 2)
// passed an index that the engine split into its visible parts, each a launch merged into the
// last; the copies (each rank's own rows into and out of the gathered layout) move the same bytes.
TEST(HeadChunks, CpuCounterOneLaunchPerChunkOverContiguousPositions) {
  auto cpu = cpu::make_engine<double>(cpu::Tiles{64, 64});
  const int64_t N = 2048, H = 4, d = 8;
  const Case c = make_case(1, H, H, N, N, d, "causal", 2);
  for (PartitionKind k : {PartitionKind::Zigzag, PartitionKind::Contiguous, PartitionKind::Striped})
    for (const char* algo : {"ulysses", "usp"})
      for (int chunks : {1, 2}) {
        CountingEngine e(*cpu);
        AlgoOptions o = chunked(algo, k, 2, 2, chunks);
        Session<double> s(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, e);
        s.forward();
        const CountingEngine::Counts n = e.counts();
        // The old layout: each rank's shards end to end in rank order, passed as an index.
        const Plan pl = make_plan(c.p, o);
        std::vector<int64_t> old;
        for (int r = 0; r < 2; ++r) old.insert(old.end(), pl.qp.positions[r].begin(), pl.qp.positions[r].end());
        const Positions op{old[0], N, old.data()};
        int old_launches = 0;
        for (const BlockPart& b : split_block(pl.mask.params(), op, op)) old_launches += b.hidden ? 0 : 1;
        std::printf("[counter] %s %s chunks=%d: per rank %d blocks, %d over indexed positions, %d launches "
                    "(rank-order layout: 1 block, %d launches); %d copies, %lld bytes copied\n",
                    algo, to_string(k).c_str(), chunks, n.blocks / 2, n.indexed / 2, n.launches / 2, old_launches,
                    n.copies / 2, static_cast<long long>(n.copy_bytes / 2));
        // Striped: stride-G progressions, an index as before (usp's ring: a block per chunk pair).
        if (k == PartitionKind::Striped) continue;
        const int c_eff = chunks;  // H_kv / G = 2 kv heads a rank: both counts divide it
        EXPECT_EQ(n.blocks, 2 * c_eff) << algo << " " << to_string(k);
        EXPECT_EQ(n.indexed, 0) << algo << " " << to_string(k);
        EXPECT_EQ(n.launches, 2 * c_eff) << algo << " " << to_string(k);
        if (k == PartitionKind::Zigzag) {
          EXPECT_EQ(old_launches, 6);  // runs 0 | 3 | 1-2 each side: 9 pairs, 3 hidden
        }
      }
}
