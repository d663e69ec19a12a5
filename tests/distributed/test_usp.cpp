// tests/distributed/test_usp.cpp — the head-context hybrid (spec §7.14) through the algorithm
// table: every rank against the oracle's slice (§9 rule) and its bytes against (7.27), for group
// sizes u dividing G and the heads, every partition and mask kind, GQA, ragged lengths, both ring
// traffics; u = 1 is the plain ring, bitwise. Its teaching trace; every entry's trace and model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "algorithm.hpp"
#include "cpu_engine.hpp"
#include "dist_testutil.hpp"

namespace {

using namespace burstlab;
using namespace burstlab::dist;
using namespace burstlab::dist_testutil;

DistResult<double> run(const Case& c, const AlgoOptions& o, Engine<double>& e) {
  return run_session<double>(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, e);
}

std::string label(const AlgoOptions& o, const std::string& mask, const Problem& p) {
  return "usp G=" + std::to_string(o.world) + " u=" + std::to_string(o.ulysses_degree) + " " + to_string(o.base) +
         " " + to_string(o.partition) + " mask " + mask + " H " + std::to_string(p.H_q) + "/" + std::to_string(p.H_kv) +
         " N " + std::to_string(p.N_q) + "x" + std::to_string(p.N_k);
}

TEST(Usp, EveryRankMatchesTheOracleSliceAndBytesEqualTheClosedForm) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 16});
  struct Shape { int64_t B, Hq, Hkv, Nq, Nk, d; };
  const Shape shapes[] = {{1, 4, 2, 41, 41, 8}, {2, 6, 6, 37, 53, 5}};
  const char* masks[] = {"none", "causal", "window:5,2", "document:3", "block:8x8@0.5"};
  int runs = 0;
  for (const Shape& sh : shapes)
    for (const char* mask : masks) {
      const Case c = make_case(sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, sh.d, mask, 9);
      for (int G : {2, 4, 6})
        for (int u = 1; u <= G; ++u) {
          if (G % u || sh.Hq % u || sh.Hkv % u || std::min(sh.Nq, sh.Nk) < 2 * G) continue;
          for (PartitionKind k : {PartitionKind::Contiguous, PartitionKind::Zigzag, PartitionKind::Striped})
            for (Algo base : {Algo::Ring, Algo::Burst}) {
              AlgoOptions o;
              o.algo = "usp";
              o.world = G;
              o.ulysses_degree = u;
              o.partition = k;
              o.base = base;
              o.sim.poison = true;
              o.sim.reorder = (G + u) % 2 == 1;
              const std::string what = label(o, mask, c.p);
              const DistResult<double> res = run(c, o, *engine);
              for (int r = 0; r < G; ++r)
                ASSERT_TRUE(testutil::all_pass(check_rank(c, res, r), what + " rank " + std::to_string(r)));
              const Plan pl = make_plan(c.p, o);
              for (int r = 0; r < G; ++r)
                for (Phase ph : {Phase::Forward, Phase::Backward}) {
                  const ByteTotals t = totals(res.logs[r], ph);
                  EXPECT_EQ(t.sent, plan_bytes(pl, ph, r, true, 8)) << what << " rank " << r << " " << to_string(ph);
                  EXPECT_EQ(t.recv, plan_bytes(pl, ph, r, false, 8)) << what << " rank " << r << " " << to_string(ph);
                }
              ++runs;
            }
        }
    }
  EXPECT_GE(runs, 100);
}

TEST(Usp, OneRankPerGroupIsThePlainRingBitwise) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Case c = make_case(1, 4, 2, 48, 40, 8, "causal+document:2", 3);
  for (Algo base : {Algo::Ring, Algo::Burst}) {
    AlgoOptions o;
    o.algo = "usp";
    o.world = 4;
    o.ulysses_degree = 1;
    o.partition = PartitionKind::Zigzag;
    o.base = base;
    const DistResult<double> a = run(c, o, *engine);
    o.algo = to_string(base);
    const DistResult<double> b = run(c, o, *engine);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(a.O[r].data, b.O[r].data) << to_string(base) << " rank " << r;
      EXPECT_EQ(a.dQ[r].data, b.dQ[r].data) << to_string(base) << " rank " << r;
      EXPECT_EQ(a.dK[r].data, b.dK[r].data) << to_string(base) << " rank " << r;
    }
  }
}

TEST(Usp, RequirementsAreClearErrors) {
  const Problem p = testutil::make_problem(1, 4, 2, 32, 32, 8, "causal", 1);
  AlgoOptions o;
  o.algo = "usp";
  o.world = 4;
  EXPECT_THROW(make_plan(p, o), Error);  // no group size
  o.ulysses_degree = 3;
  try {
    make_plan(p, o);
    FAIL() << "u = 3 with G = 4 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the world size G (4)"), std::string::npos) << e.what();
  }
  o.ulysses_degree = 4;  // divides G and H_q but not H_kv = 2
  try {
    make_plan(p, o);
    FAIL() << "u = 4 with H_kv = 2 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_kv (2)"), std::string::npos) << e.what();
  }
  o.gpus_per_node = 2;  // u defaults to the node size
  o.ulysses_degree = 0;
  EXPECT_NO_THROW(make_plan(p, o));
}

// The teaching trace (Algorithm::trace, `burstlab schedule --algo usp`): the all-to-all inside
// each group, the ring across groups, the all-to-all back; every rank's traced bytes (from the
// messages and the ring's schedule) equal (7.27), at fp32 and with 2-byte elements and 4-byte
// accumulators, for every u dividing G and the heads.
TEST(Usp, TraceShowsBothCollectivesAndTheRingAndItsBytesEqualTheClosedForm) {
  const Problem p = testutil::make_problem(2, 4, 2, 29, 23, 4, "causal", 1);
  const Algorithm& a = find_algorithm("usp");
  for (int G : {2, 4, 6})
    for (int u : {1, 2})
      for (Algo base : {Algo::Ring, Algo::Burst})
        for (ElemBytes w : {ElemBytes(4), ElemBytes(2, 4)}) {
          if (G % u) continue;
          AlgoOptions o;
          o.algo = "usp";
          o.world = G;
          o.ulysses_degree = u;
          o.base = base;
          o.partition = PartitionKind::Zigzag;
          const Plan pl = make_plan(p, o);
          const Trace t = a.trace(pl, w, true, true);
          const std::string what = "G=" + std::to_string(G) + " u=" + std::to_string(u) + " " + to_string(base) +
                                   " t=" + std::to_string(w.t) + " a=" + std::to_string(w.a);
          EXPECT_TRUE(t.ok) << what << "\n" << t.text;
          EXPECT_EQ(t.text.find(" NO"), std::string::npos) << what;
          for (const char* s : {"usp forward", "usp backward", "all-to-all 1, inside each group: sequence -> heads of Q,K,V",
                                "all-to-all 2, inside each group: heads -> sequence of dQ,dK,dV", "ring across the",
                                "bytes per rank (spec 7.27)"})
            EXPECT_NE(t.text.find(s), std::string::npos) << what << ": no '" << s << "'";
        }
  // Only the phases asked for.
  AlgoOptions o;
  o.algo = "usp";
  o.world = 4;
  o.ulysses_degree = 2;
  const Trace fwd_only = find_algorithm("usp").trace(make_plan(p, o), 4, true, false);
  EXPECT_NE(fwd_only.text.find("usp forward"), std::string::npos);
  EXPECT_EQ(fwd_only.text.find("usp backward"), std::string::npos);
}

// Every algorithm of the table has a trace whose traced bytes equal its closed forms, and a
// simulator model (but attention2d-o, priced by none of its own: spec §7.13).
TEST(AlgorithmTable, EveryAlgorithmHasATraceAndAModel) {
  const Problem p = testutil::make_problem(1, 8, 4, 24, 24, 4, "causal", 1);  // ulysses: G | H
  for (const Algorithm& a : algorithms()) {
    ASSERT_NE(a.trace, nullptr) << a.name;
    EXPECT_EQ(a.simulate == nullptr, std::string(a.name) == "attention2d-o") << a.name;
    AlgoOptions o;
    o.algo = a.name;
    o.world = 4;
    o.gpus_per_node = 2;
    o.partition = a.partition.value_or(PartitionKind::Zigzag);
    const Plan pl = make_plan(p, o);
    const Trace t = a.trace(pl, 4, true, true);
    EXPECT_TRUE(t.ok) << a.name << "\n" << t.text;
    EXPECT_FALSE(t.text.empty()) << a.name;
  }
}

}  // namespace
