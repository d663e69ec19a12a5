// Attention2D-NO (spec §7.11) on SimComm with the CPU engine: every rank's O, LSE, dQ, dK, dV
// equal the fp64 oracle's slice on square, rectangular and prime grids; bytes per rank equal the
// closed form (7.22)-(7.23) and shrink like 1/sqrt(P) at fixed N.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "algorithm.hpp"
#include "attention2d.hpp"
#include "burstlab/error.hpp"
#include "cpu_engine.hpp"
#include "dist_testutil.hpp"

using namespace burstlab;
using namespace burstlab::dist;
using namespace burstlab::dist_testutil;

namespace {
constexpr uint64_t kSeed = 11;
AlgoOptions opts(int pr, int pc, bool overlap = false) {
  AlgoOptions o = options(overlap ? "attention2d-o" : "attention2d", PartitionKind::Striped, pr * pc);
  o.grid = Grid{pr, pc};
  return o;
}
// Every (shape, mask, grid) run of Attention2D (overlap: Attention2D-O): each rank matches the
// oracle's slice and its bytes per phase equal attention2d_bytes, (7.22)-(7.23) or (7.26). SimComm
// poisons buffers and reorders completions on grids with (p_r + p_c) % 2 == reorder_parity.
// Adds the number of runs to `runs`.
void sweep_grids(bool overlap, const std::vector<std::pair<int, int>>& grids, const std::vector<const char*>& masks,
                 int reorder_parity, int& runs) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 16});
  struct Shape { int64_t B, Hq, Hkv, Nq, Nk, d; };
  const Shape shapes[] = {{1, 4, 2, 41, 41, 8}, {2, 3, 1, 37, 53, 5}};
  for (const Shape& sh : shapes)
    for (const char* mask : masks) {
      const Case c = make_case(sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, sh.d, mask, kSeed);
      for (auto [pr, pc] : grids) {
        AlgoOptions o = opts(pr, pc, overlap);
        o.sim.poison = true;
        o.sim.reorder = (pr + pc) % 2 == reorder_parity;
        const DistResult<double> res = run_algo(c, o, *engine);
        const std::string at = std::string(overlap ? "O " : "") + std::to_string(pr) + "x" + std::to_string(pc) +
                               " " + shape_string(c.p) + " " + mask;
        for (int r = 0; r < o.world; ++r) {
          ASSERT_TRUE(testutil::all_pass(check_rank(c, res, r), at + " rank " + std::to_string(r)));
          for (Phase ph : {Phase::Forward, Phase::Backward}) {
            const ByteTotals t = totals(res.logs[r], ph);
            EXPECT_EQ(t.sent, attention2d_bytes(ph, c.p, o.grid, res.qp, res.kp, r, true, 8, overlap)) << at << " rank " << r;
            EXPECT_EQ(t.recv, attention2d_bytes(ph, c.p, o.grid, res.qp, res.kp, r, false, 8, overlap)) << at << " rank " << r;
          }
        }
        ++runs;
      }
    }
}
}  // namespace

TEST(Attention2D, EveryRankMatchesTheOracleSliceAndBytesEqualTheClosedForm) {
  int runs = 0;
  sweep_grids(false, {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {2, 3}, {3, 2}, {3, 3}, {1, 5}, {7, 1}, {1, 7}},
              {"none", "causal", "window:5,2", "document:3", "block:8x8@0.5", "causal+document:3"}, 1, runs);
  EXPECT_EQ(runs, 120);
}

// Paper form for P | N, n = N / P, square grid p_r = p_c = sqrt(P), s bytes per element (eb):
// forward per rank
//   s B n [(H_q d + 2 H_kv d + H_q (d + 1)) (sqrt(P) - 1)] + transpose 2 H_kv d n (unless fixed),
// i.e. ~ N / sqrt(P): it shrinks like 1/sqrt(P) at fixed N.
TEST(Attention2D, BytesShrinkLikeOneOverSqrtP) {
  const int64_t B = 1, Hq = 8, Hkv = 8, N = 14400, d = 64, eb = 2;
  const Problem p = testutil::make_problem(B, Hq, Hkv, N, N, d, "causal", 1);
  double prev = 0;
  for (int side : {2, 3, 4, 5, 6, 8}) {  // p_r = p_c = sqrt(P)
    const int P = side * side;
    const Partition part = make_partition(PartitionKind::Striped, N, P);
    const Grid g{side, side};
    const int64_t n = N / P;
    int64_t max_sent = 0;
    for (int r = 0; r < P; ++r) {
      const int64_t tr = g.row_major(r) == r ? 0 : 2 * Hkv * d * n;
      const int64_t want = eb * B * ((Hq * d + 2 * Hkv * d + Hq * (d + 1)) * n * (side - 1) + tr);
      EXPECT_EQ(attention2d_bytes(Phase::Forward, p, g, part, part, r, true, eb), want) << "P=" << P << " r=" << r;
      max_sent = std::max(max_sent, want);
    }
    // bytes x sqrt(P) / N tends to a constant: (side - 1) / side -> 1 (plus the transpose, 1/side).
    // With C = H_q d + 2 H_kv d + H_q (d + 1):
    //   max_sent side / (eb B N C) = ((side - 1) C + 2 H_kv d) / (side C).
    // Every quantity is an integer (n = N / side^2 exactly), so compare the cross-multiplied form
    // exactly in int64 (both sides < 5e8).
    if (prev > 0) {
      EXPECT_LT(double(max_sent), prev) << "P=" << P;
    }
    const int64_t C = Hq * d + 2 * Hkv * d + Hq * (d + 1);
    EXPECT_EQ(max_sent * side * side, eb * B * N * ((side - 1) * C + 2 * Hkv * d)) << "P=" << P;
    prev = double(max_sent);
  }
}

TEST(Attention2D, BadGridOrPartitionIsAClearError) {
  auto engine = cpu::make_engine<double>();
  const Case c = make_case(1, 2, 1, 24, 24, 4, "causal", kSeed);
  AlgoOptions o = opts(2, 3);
  o.world = 4;
  EXPECT_THROW(run_algo(c, o, *engine), Error);
  o = opts(2, 2);
  o.partition = PartitionKind::Zigzag;
  try {
    run_algo(c, o, *engine);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cyclic (striped)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_grid("2y3"), Error);
  EXPECT_EQ(parse_grid("2x3").p_c, 3);
  EXPECT_EQ(default_grid(12).p_r, 3);
  EXPECT_EQ(default_grid(7).p_r, 1);
}

TEST(Attention2D, TwoRunsAreBitwiseEqualAndFailuresNeverHang) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case c = make_case(1, 4, 2, 45, 39, 8, "causal", kSeed);
  AlgoOptions o = opts(2, 3);
  o.sim.reorder = true;
  const DistResult<double> x = run_algo(c, o, *engine);
  o.sim.seed = 77;
  const DistResult<double> y = run_algo(c, o, *engine);
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(std::memcmp(x.O[r].data.data(), y.O[r].data.data(), x.O[r].data.size() * 8), 0);
    EXPECT_EQ(std::memcmp(x.dK[r].data.data(), y.dK[r].data.data(), x.dK[r].data.size() * 8), 0);
  }
  for (int op : {0, 7}) {
    AlgoOptions f = opts(2, 2);
    f.sim.fail_rank = 3;
    f.sim.fail_at_op = op;
    f.sim.timeout_s = 20;
    std::vector<std::string> errors;
    EXPECT_THROW(run_algo(c, f, *engine, &errors), Error);
    ASSERT_EQ(errors.size(), 4u);
    for (const std::string& e : errors) EXPECT_NE(e.find("rank 3"), std::string::npos) << e;
  }
}

// Attention2D-O: the same results (another merge order) and bytes equal to (7.26); a 1 x P and
// a P x 1 grid degenerate to one ring.
TEST(Attention2D, OverlappedMatchesTheOracleAndItsClosedForm) {
  int runs = 0;
  sweep_grids(true, {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {2, 3}, {3, 2}, {3, 3}, {1, 5}, {7, 1}},
              {"none", "causal", "document:3", "causal+block:8x8@0.6"}, 0, runs);
  EXPECT_EQ(runs, 72);
}

// `burstlab schedule --algo attention2d --overlap` prints Algorithm::trace of attention2d-o: the
// steps of §7.13, not Attention2D-NO's one block per rank. Every rank's traced sends and receives
// at every step equal what the SimComm run moves at that step (the transport's step numbers),
// with GQA, N_q != N_k, ragged shards and 1 x P, P x 1 grids.
TEST(Attention2D, OverlappedTraceIsTheStepsTheRunTakes) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 16});
  const Case c = make_case(2, 4, 2, 37, 29, 5, "causal", kSeed);
  const std::regex step_re(R"(^step (\d+):)"), rank_re(R"(^  rank (\d+) \(row )"),
      send_re(R"((send|recv) [^;]*?[-<][>-] \d+ \((\d+) B\))");
  for (auto [pr, pc] : std::vector<std::pair<int, int>>{{1, 1}, {1, 3}, {3, 1}, {2, 2}, {2, 3}, {3, 2}}) {
    const std::string at = std::to_string(pr) + "x" + std::to_string(pc);
    const AlgoOptions ao = opts(pr, pc, true);
    const DistResult<double> res = run_algo(c, ao, *engine);
    const Trace tr = find_algorithm("attention2d-o").trace(make_plan(c.p, ao), 8, true, true);
    EXPECT_TRUE(tr.ok) << at << "\n" << tr.text;
    EXPECT_EQ(tr.text.find("computes 1 block"), std::string::npos) << at;
    EXPECT_NE(tr.text.find("column ring 1 of " + std::to_string(pr) + " (phase A)"), std::string::npos) << at;
    EXPECT_EQ(tr.text.find("row ring 1 of ") != std::string::npos, pc > 1) << at;
    // (phase, rank, step) -> traced sent, received bytes
    std::map<std::tuple<Phase, int, int>, std::pair<int64_t, int64_t>> traced;
    Phase ph = Phase::Forward;
    int step = -1;
    std::istringstream lines(tr.text);
    for (std::string line; std::getline(lines, line);) {
      std::smatch mt;
      if (line.rfind("attention2d-o backward", 0) == 0) ph = Phase::Backward, step = -1;
      if (std::regex_search(line, mt, step_re)) step = std::stoi(mt[1]);
      if (!std::regex_search(line, mt, rank_re)) continue;  // a step's line of one rank
      auto& [sent, recv] = traced[{ph, std::stoi(mt[1]), step}];
      for (auto it = std::sregex_iterator(line.begin(), line.end(), send_re); it != std::sregex_iterator(); ++it)
        ((*it)[1] == "send" ? sent : recv) += std::stoll((*it)[2]);
    }
    int64_t moved = 0;
    for (Phase p2 : {Phase::Forward, Phase::Backward})
      for (int r = 0; r < pr * pc; ++r)
        for (int st = 0; st <= pr + pc + 2; ++st) {
          const ByteTotals want = totals(res.logs[r], p2, st);
          const auto got = traced.count({p2, r, st}) ? traced.at({p2, r, st}) : std::pair<int64_t, int64_t>{0, 0};
          EXPECT_EQ(got.first, want.sent) << at << " " << to_string(p2) << " rank " << r << " step " << st;
          EXPECT_EQ(got.second, want.recv) << at << " " << to_string(p2) << " rank " << r << " step " << st;
          moved += want.sent;
        }
    EXPECT_EQ(moved > 0, pr * pc > 1) << at;
  }
}
