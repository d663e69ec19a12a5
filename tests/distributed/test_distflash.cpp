// DistFlashAttn's balanced causal schedule (spec §7.12): every rank matches the fp64 oracle's
// slice; the exported schedule covers every causal block once and its idle fraction is the
// paper's eq. (2); bytes equal the closed form.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "burstlab/error.hpp"
#include "cpu_engine.hpp"
#include "dist_testutil.hpp"
#include "distflash.hpp"
#include "schedule.hpp"

using namespace burstlab;
using namespace burstlab::dist;
using namespace burstlab::dist_testutil;

namespace {
constexpr uint64_t kSeed = 13;
DistResult<double> run(const Case& c, int P, Engine<double>& e, SimOptions sim = {},
                       std::vector<std::string>* errs = nullptr) {
  AlgoOptions o = options("distflash", PartitionKind::Contiguous, P);
  o.sim = sim;
  return run_algo(c, o, e, errs);
}
}  // namespace

TEST(DistFlash, ScheduleCoversEveryCausalBlockOnceWithThePapersIdleFraction) {
  for (int P = 1; P <= 12; ++P) {
    const FlashSchedule s = make_distflash_schedule(P);
    std::set<std::pair<int, int>> seen;
    for (int r = 0; r < P; ++r)
      for (const FlashStep& st : s.steps[r]) {
        if (st.role == FlashRole::Idle) continue;
        EXPECT_TRUE(seen.insert({st.q, st.k}).second) << "P=" << P << " block twice";
        EXPECT_LE(st.k, st.q);
        EXPECT_EQ(st.role == FlashRole::Owner ? st.q : st.k, r);  // owners use own Q, helpers own K, V
      }
    EXPECT_EQ(static_cast<int>(seen.size()), P * (P + 1) / 2) << "P=" << P;
    // eq. (2): 0 for odd P, 1/(2P) for even P (idle slots over P^2).
    EXPECT_DOUBLE_EQ(distflash_idle_fraction(s), P % 2 ? 0.0 : 1.0 / (2.0 * P)) << "P=" << P;
  }
  // The same normalization gives the unbalanced ring (P^2 - P) / 2P^2, from its schedule.
  for (int P : {2, 3, 5, 8}) {
    const Problem p = testutil::make_problem(1, 1, 1, 8 * P, 8 * P, 4, "causal", 1);
    const MaskData md = compile_mask(p);
    const Partition part = make_partition(PartitionKind::Contiguous, 8 * P, P);
    const Schedule ring = make_schedule(Algo::Ring, Phase::Forward, p, md, part, part);
    int idle = 0;
    for (int r = 0; r < P; ++r)
      for (const RankStep& st : ring.steps[r]) idle += st.blocks.empty() ? 1 : 0;
    EXPECT_DOUBLE_EQ(double(idle) / (P * P), double(P * P - P) / (2.0 * P * P)) << "P=" << P;
  }
}

TEST(DistFlash, EveryRankMatchesTheOracleSliceAndBytesEqualTheClosedForm) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 16});
  const char* masks[] = {"causal", "causal+document:3", "window:6,0", "causal+block:8x8@0.6"};
  struct Shape { int64_t B, Hq, Hkv, Nq, Nk, d; };
  const Shape shapes[] = {{1, 4, 2, 41, 41, 8}, {2, 3, 1, 37, 37, 5}};
  int runs = 0;
  for (const Shape& sh : shapes)
    for (const char* mask : masks) {
      const Case c = make_case(sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, sh.d, mask, kSeed);
      for (int P = 1; P <= 8; ++P) {
        SimOptions sim;
        sim.poison = true;
        sim.reorder = P % 2 == 1;
        const DistResult<double> res = run(c, P, *engine, sim);
        const std::string at = "P=" + std::to_string(P) + " " + shape_string(c.p) + " " + mask;
        for (int r = 0; r < P; ++r) {
          ASSERT_TRUE(testutil::all_pass(check_rank(c, res, r), at + " rank " + std::to_string(r)));
          for (Phase ph : {Phase::Forward, Phase::Backward}) {
            const ByteTotals t = totals(res.logs[r], ph);
            EXPECT_EQ(t.sent, distflash_bytes(ph, c.p, res.qp, res.kp, r, true, 8)) << at << " rank " << r;
            EXPECT_EQ(t.recv, distflash_bytes(ph, c.p, res.qp, res.kp, r, false, 8)) << at << " rank " << r;
          }
        }
        ++runs;
      }
    }
  EXPECT_EQ(runs, 64);
}

TEST(DistFlash, NonCausalMaskOrPartitionIsAClearErrorAndRunsAreRepeatable) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case nc = make_case(1, 2, 1, 24, 24, 4, "none", kSeed);
  try {
    run(nc, 3, *engine);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("causal-type mask"), std::string::npos) << e.what();
  }
  const Case c = make_case(1, 4, 2, 45, 45, 8, "causal", kSeed);
  SimOptions sim;
  sim.reorder = true;
  const DistResult<double> x = run(c, 6, *engine, sim);
  sim.seed = 5;
  const DistResult<double> y = run(c, 6, *engine, sim);
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(std::memcmp(x.O[r].data.data(), y.O[r].data.data(), x.O[r].data.size() * 8), 0);
    EXPECT_EQ(std::memcmp(x.dQ[r].data.data(), y.dQ[r].data.data(), x.dQ[r].data.size() * 8), 0);
    EXPECT_EQ(std::memcmp(x.dK[r].data.data(), y.dK[r].data.data(), x.dK[r].data.size() * 8), 0);
  }
  for (int op : {0, 4}) {
    SimOptions f;
    f.fail_rank = 2;
    f.fail_at_op = op;
    f.timeout_s = 20;
    std::vector<std::string> errors;
    EXPECT_THROW(run(c, 5, *engine, f, &errors), Error);
    ASSERT_EQ(errors.size(), 5u);
    for (const std::string& e : errors) EXPECT_NE(e.find("rank 2"), std::string::npos) << e;
  }
}
