// tests/distributed/test_sampled_dist.cpp — the row-sampled check of a distributed run from its
// pieces (tools/gather.cpp, spec §9.11): what each rank holds at the sample and the rows' LSE and
// D, all-gathered through the World, give every Metrics of the check on gathered global tensors
// bit for bit; a corrupted shard fails at the same coordinates; and no global tensor is held
// (heap counted by tools/memcount.cpp, linked into this executable).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cpu_engine.hpp"
#include "dist_testutil.hpp"
#include "gather.hpp"
#include "memcount.hpp"
#include "rows.hpp"
#include "session.hpp"

namespace burstlab {
namespace {

using dist::PartitionKind;
using tools::GatheredOutputs;

// Bitwise equality of two doubles (NaN equal to the same NaN bits).
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
::testing::AssertionResult same_bits(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": " << a.size() << " vs " << b.size() << " values";
  for (size_t e = 0; e < a.size(); ++e)
    if (!same_bits(a[e], b[e])) return ::testing::AssertionFailure() << what << "[" << e << "]: " << a[e] << " vs " << b[e];
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult same_metrics(const std::vector<Metrics>& a, const std::vector<Metrics>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " tensors";
  for (size_t t = 0; t < a.size(); ++t) {
    const Metrics &x = a[t], &y = b[t];
    if (x.tensor != y.tensor || !same_bits(x.max_abs, y.max_abs) || !same_bits(x.max_rel, y.max_rel) ||
        !same_bits(x.err_bound, y.err_bound) || x.wrong != y.wrong || x.checked != y.checked ||
        x.first_wrong != y.first_wrong)
      return ::testing::AssertionFailure() << "tensor " << t << ":\n  " << testutil::format(x) << "\n  "
                                           << testutil::format(y);
  }
  return ::testing::AssertionSuccess();
}

// The check as `run` did it before the pieces: every rank's outputs gathered into global fp64
// tensors, then the global-tensor forms of rows.hpp.
template <class T>
std::vector<Metrics> global_check(const SampledOracle& so, const Problem& p, const Inputs& in,
                                  const dist::DistResult<T>& res) {
  const GatheredOutputs g = tools::gather_outputs(res, true, true);
  std::vector<Metrics> m = check_sampled_forward(so, p, as_const(g.O.view()), as_const(g.LSE.view()));
  for (const Metrics& x : check_sampled_backward(so, p, in, as_const(g.O.view()), as_const(g.LSE.view()),
                                                 as_const(g.dQ.view()), as_const(g.dK.view()), as_const(g.dV.view())))
    m.push_back(x);
  return m;
}

// The check from the pieces read through `read`, all-gathered on `w`.
struct Pieces {
  SampledOutputs got;
  RunRows run;
  std::vector<Metrics> metrics;
};
Pieces pieces_check(dist::World& w, const SampledOracle& so, const Problem& p, const Inputs& in,
                    const dist::Partition& qp, const dist::Partition& kp, const tools::ReadOutput& read) {
  Pieces x;
  tools::sampled_forward(w, p, qp, so.sample, read, in.dO.view(), x.got, &x.run);
  tools::sampled_backward(w, p, qp, kp, so.sample, read, x.got);
  x.metrics = check_sampled_forward(so, x.got);
  for (const Metrics& m : check_sampled_backward(so, p, in, x.run, x.got)) x.metrics.push_back(m);
  return x;
}

struct Config {
  const char* what;
  int64_t B, Hq, Hkv, Nq, Nk, d;
  const char* mask;
  std::vector<const char*> algos;
  PartitionKind part;
  int world;
  int64_t K;
};

template <class T>
void pieces_equal_global(const Config& c, Dtype dtype) {
  const Problem p = testutil::make_problem(c.B, c.Hq, c.Hkv, c.Nq, c.Nk, c.d, c.mask, 7);
  const Inputs in = make_inputs(p, Layout::BSHD, dtype, 11, Values::Normal);
  const SampledOracle so = sampled_oracle(p, in, c.K, 5, true);
  auto engine = cpu::make_engine<T>(cpu::Tiles{8, 16});
  for (const char* algo : c.algos) {
    const std::string ctx = std::string(c.what) + ", " + algo + ", " + to_string(dtype);
    SCOPED_TRACE(ctx);
    const dist::AlgoOptions o = dist_testutil::options(algo, c.part, c.world);
    dist::Session<T> s(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
    s.forward();
    s.backward();
    const dist::DistResult<T> res = s.result();
    const std::vector<Metrics> want = global_check(so, p, in, res);
    EXPECT_TRUE(testutil::all_pass(want, ctx));
    // From engine memory (what `run` does) and from a result's host tensors: the same pieces.
    const Pieces a = pieces_check(s.world(), so, p, in, s.qp(), s.kp(), tools::session_reader(s));
    const Pieces b = pieces_check(s.world(), so, p, in, s.qp(), s.kp(), tools::result_reader(res));
    EXPECT_TRUE(same_metrics(want, a.metrics));
    EXPECT_TRUE(same_metrics(want, b.metrics));
    // The pieces themselves equal what the global tensors hold at the sample.
    const GatheredOutputs g = tools::gather_outputs(res, true, true);
    const SampledOutputs sg = sampled_outputs(so.sample, p.d, as_const(g.O.view()), as_const(g.LSE.view()),
                                              as_const(g.dQ.view()), as_const(g.dK.view()), as_const(g.dV.view()));
    const RunRows rg = run_rows(p, in.dO.view(), as_const(g.O.view()), as_const(g.LSE.view()), so.sample.columns);
    for (const Pieces* x : {&a, &b}) {
      EXPECT_TRUE(same_bits(sg.O, x->got.O, "O"));
      EXPECT_TRUE(same_bits(sg.LSE, x->got.LSE, "LSE"));
      EXPECT_TRUE(same_bits(sg.dQ, x->got.dQ, "dQ"));
      EXPECT_TRUE(same_bits(sg.dK, x->got.dK, "dK"));
      EXPECT_TRUE(same_bits(sg.dV, x->got.dV, "dV"));
      EXPECT_EQ(rg.heads, x->run.heads);
      EXPECT_TRUE(same_bits(rg.LSE, x->run.LSE, "RunRows.LSE"));
      EXPECT_TRUE(same_bits(rg.D, x->run.D, "RunRows.D"));
      EXPECT_TRUE(same_bits(rg.Dmag, x->run.Dmag, "RunRows.Dmag"));
    }
  }
}

const std::vector<Config>& configs() {
  static const std::vector<Config> c = {
      // GQA, causal + document (fully masked rows: some documents have no keys), striped
      {"GQA causal+document", 1, 8, 4, 203, 203, 16, "causal+document:5", {"ring", "burst", "ulysses", "attention2d"},
       PartitionKind::Striped, 4, 16},
      // sliding window with N_q != N_k (bottom-right aligned: the first rows see no key), zigzag
      {"window ragged", 1, 4, 2, 113, 203, 8, "window:6,2", {"ring", "burst", "allgather", "ulysses"},
       PartitionKind::Zigzag, 2, 24},
      // ragged lengths on 3 ranks, MQA, d = 3, B = 2, every row and column sampled (K > B H N)
      {"MQA ragged all rows", 2, 3, 1, 37, 29, 3, "causal", {"ring", "burst", "allgather"},
       PartitionKind::Contiguous, 3, 1000},
      // block-sparse mask: rows and keys no block reaches
      {"block", 1, 2, 2, 64, 96, 8, "block:16x16@0.4", {"ring", "burst"}, PartitionKind::Zigzag, 4, 12},
  };
  return c;
}

TEST(SampledDist, PiecesEqualTheGlobalCheckBitForBitFp32) {
  for (const Config& c : configs()) pieces_equal_global<float>(c, Dtype::F32);
}
TEST(SampledDist, PiecesEqualTheGlobalCheckBitForBitFp64) {
  for (const Config& c : configs()) pieces_equal_global<double>(c, Dtype::F64);
}

// Elements of O and dQ (one row) or of dK (one column) off in the ranks' shards: both checks
// fail with the same metrics, naming the corrupted global coordinates.
TEST(SampledDist, ACorruptedShardFailsAtTheSameCoordinates) {
  const Problem p = testutil::make_problem(1, 4, 2, 203, 113, 8, "causal+document:3", 3);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 2, Values::Normal);
  const SampledOracle so = sampled_oracle(p, in, 16, 9, true);
  auto engine = cpu::make_engine<float>(cpu::Tiles{8, 16});
  const dist::AlgoOptions o = dist_testutil::options("burst", PartitionKind::Zigzag, 4);
  dist::Session<float> s(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
  s.forward();
  s.backward();
  const dist::DistResult<float> clean = s.result();
  ASSERT_TRUE(testutil::all_pass(global_check(so, p, in, clean)));
  // A sampled row (b, h, i) and column (b, h_kv, j) away from the first.
  const RowId row = so.sample.rows[so.sample.rows.size() / 2];
  const ColumnId col = so.sample.columns[so.sample.columns.size() / 2];
  const dist::Partition &qp = clean.qp, &kp = clean.kp;
  const int rq = qp.owner_of[size_t(row.i)], rk = kp.owner_of[size_t(col.j)];
  const size_t at_q = size_t(((row.b * p.H_q + row.h) * qp.local_size(rq) + qp.local_of[size_t(row.i)]) * p.d);
  const size_t at_k = size_t(((col.b * p.H_kv + col.h) * kp.local_size(rk) + kp.local_of[size_t(col.j)]) * p.d);
  auto coord = [](int64_t b, int64_t h, int64_t n, int64_t k) {
    return "(b=" + std::to_string(b) + ", h=" + std::to_string(h) + ", i=" + std::to_string(n) + ", k=" +
           std::to_string(k) + "): ";
  };
  {  // O and dQ of one row
    dist::DistResult<float> res = clean;
    res.O[size_t(rq)].data[at_q + 2] += 0.5f;
    res.dQ[size_t(rq)].data[at_q + 1] += 0.5f;
    const std::vector<Metrics> want = global_check(so, p, in, res);
    const Pieces got = pieces_check(s.world(), so, p, in, s.qp(), s.kp(), tools::result_reader(res));
    EXPECT_TRUE(same_metrics(want, got.metrics));
    ASSERT_EQ(got.metrics.size(), 5u);  // O, LSE, dQ, dK, dV
    EXPECT_EQ(got.metrics[0].tensor, "O");
    EXPECT_EQ(got.metrics[0].wrong, 1);
    EXPECT_EQ(got.metrics[0].first_wrong.rfind(coord(row.b, row.h, row.i, 2), 0), 0u) << got.metrics[0].first_wrong;
    EXPECT_EQ(got.metrics[1].wrong, 0);  // LSE
    EXPECT_EQ(got.metrics[2].tensor, "dQ");
    EXPECT_EQ(got.metrics[2].wrong, 1);
    EXPECT_EQ(got.metrics[2].first_wrong.rfind(coord(row.b, row.h, row.i, 1), 0), 0u) << got.metrics[2].first_wrong;
  }
  {  // dK of one column
    dist::DistResult<float> res = clean;
    res.dK[size_t(rk)].data[at_k + 3] += 0.5f;
    const std::vector<Metrics> want = global_check(so, p, in, res);
    const Pieces got = pieces_check(s.world(), so, p, in, s.qp(), s.kp(), tools::result_reader(res));
    EXPECT_TRUE(same_metrics(want, got.metrics));
    ASSERT_EQ(got.metrics.size(), 5u);
    for (size_t t : {0, 1, 2, 4}) EXPECT_EQ(got.metrics[t].wrong, 0) << got.metrics[t].tensor;
    EXPECT_EQ(got.metrics[3].tensor, "dK");
    EXPECT_EQ(got.metrics[3].wrong, 1);
    EXPECT_EQ(got.metrics[3].first_wrong.rfind(coord(col.b, col.h, col.j, 3), 0), 0u) << got.metrics[3].first_wrong;
  }
}

// G processes as threads, each holding one rank (as under mpirun): allgather exchanges the byte
// images through shared slots between two barriers, as MpiWorld's MPI_Iallgatherv does.
struct Exchange {
  explicit Exchange(int G) : G(G), slots(size_t(G)) {}
  int G;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<std::vector<char>> slots;
  void barrier() {
    std::unique_lock<std::mutex> l(m);
    const int64_t g = generation;
    if (++arrived == G) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(l, [&] { return generation != g; });
    }
  }
};
class OneRankWorld : public dist::World {
 public:
  OneRankWorld(Exchange& x, int me) : x_(x), me_(me), errors_(size_t(x.G)) {}
  int size() const override { return x_.G; }
  bool holds(int r) const override { return r == me_; }
  void run(const std::function<void(dist::Communicator&)>&) override { fail("OneRankWorld runs no pass"); }
  const std::vector<std::string>& errors() const override { return errors_; }
  std::vector<std::vector<char>> allgather(const std::function<std::vector<char>(int r)>& mine,
                                          const std::string&) override {
    x_.slots[size_t(me_)] = mine(me_);
    x_.barrier();
    std::vector<std::vector<char>> all = x_.slots;
    x_.barrier();
    return all;
  }
  std::string describe() const override { return "process " + std::to_string(me_) + " of " + std::to_string(x_.G); }

 private:
  Exchange& x_;
  int me_;
  std::vector<std::string> errors_;
};

// Each process reads only the rank it holds (the result's other ranks are emptied, so a read of
// one would throw) and every process reaches the verdicts of the gathered check.
TEST(SampledDist, EachProcessHoldingOneRankReachesTheSameVerdicts) {
  const Problem p = testutil::make_problem(2, 8, 4, 203, 157, 8, "causal+document:4", 5);
  const Inputs in = make_inputs(p, Layout::BSHD, Dtype::F32, 6, Values::Normal);
  const SampledOracle so = sampled_oracle(p, in, 12, 3, true);
  auto engine = cpu::make_engine<float>(cpu::Tiles{8, 16});
  const int G = 4;
  for (const char* algo : {"ring", "ulysses"}) {
    SCOPED_TRACE(algo);
    const dist::AlgoOptions o = dist_testutil::options(algo, PartitionKind::Zigzag, G);
    dist::Session<float> s(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
    s.forward();
    s.backward();
    const dist::DistResult<float> res = s.result();
    const std::vector<Metrics> want = global_check(so, p, in, res);
    Exchange x(G);
    std::vector<std::vector<Metrics>> got(static_cast<size_t>(G));
    std::vector<std::thread> procs;
    for (int me = 0; me < G; ++me)
      procs.emplace_back([&, me] {
        try {
          dist::DistResult<float> mine = res;  // this process's view: its own rank's outputs only
          for (int r = 0; r < G; ++r)
            if (r != me) mine.O[size_t(r)] = {}, mine.LSE[size_t(r)] = {}, mine.dQ[size_t(r)] = {},
                         mine.dK[size_t(r)] = {}, mine.dV[size_t(r)] = {};
          OneRankWorld w(x, me);
          got[size_t(me)] = pieces_check(w, so, p, in, res.qp, res.kp, tools::result_reader(mine)).metrics;
        } catch (const std::exception& e) {  // the others would wait at a barrier forever
          std::fprintf(stderr, "process %d: %s\n", me, e.what());
          std::abort();
        }
      });
    for (std::thread& t : procs) t.join();
    for (int me = 0; me < G; ++me) EXPECT_TRUE(same_metrics(want, got[size_t(me)])) << "process " << me;
  }
}

// The pieces path holds no global tensor: its heap peak stays below one fp64 (B, H_q, N_q, d)
// tensor, where gathering the outputs holds five of them.
TEST(SampledDist, HoldsNoGlobalTensor) {
  if (!tools::heap_counting()) GTEST_SKIP() << "malloc interposition not in effect";
  const Problem p = testutil::make_problem(1, 4, 4, 8192, 8192, 64, "causal", 1);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 4, Values::Normal);
  const SampledOracle so = sampled_oracle(p, in, 16, 1, true);
  auto engine = cpu::make_engine<float>();
  const dist::AlgoOptions o = dist_testutil::options("ring", PartitionKind::Zigzag, 2);
  dist::Session<float> s(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
  s.forward();
  s.backward();
  const int64_t global = p.B * p.H_q * p.N_q * p.d * int64_t(sizeof(double));
  SampledOutputs got;
  RunRows run;
  tools::heap_reset_peak();
  int64_t base = tools::heap_live();
  tools::sampled_forward(s.world(), p, s.qp(), so.sample, tools::session_reader(s), in.dO.view(), got, &run);
  tools::sampled_backward(s.world(), p, s.qp(), s.kp(), so.sample, tools::session_reader(s), got);
  const int64_t pieces = tools::heap_peak() - base;
  tools::heap_reset_peak();
  base = tools::heap_live();
  RunRows rg;
  {
    const dist::DistResult<float> res = s.result();
    const GatheredOutputs g = tools::gather_outputs(res, true, true);
    rg = run_rows(p, in.dO.view(), as_const(g.O.view()), as_const(g.LSE.view()), so.sample.columns);
  }
  const int64_t gathered = tools::heap_peak() - base;
  // D of blocks of rows read from engine memory: the bits of the global form.
  EXPECT_TRUE(same_bits(rg.D, run.D, "RunRows.D"));
  EXPECT_TRUE(same_bits(rg.Dmag, run.Dmag, "RunRows.Dmag"));
  EXPECT_TRUE(same_bits(rg.LSE, run.LSE, "RunRows.LSE"));
  std::printf("  heap peak: pieces %lld bytes, gathered %lld bytes, one fp64 global tensor %lld bytes\n",
              static_cast<long long>(pieces), static_cast<long long>(gathered), static_cast<long long>(global));
  EXPECT_LT(pieces, global / 4);
  EXPECT_GT(gathered, 4 * global);
}

}  // namespace
}  // namespace burstlab
