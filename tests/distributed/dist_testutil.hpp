// tests/distributed/dist_testutil.hpp — the setup the algorithm-table tests share (test_schedules2,
// test_attention2d, test_distflash): a problem with its fp64 inputs and oracle, one run_session on
// SimComm, and one rank's outputs against the oracle's slice (§9 rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness.hpp"
#include "session.hpp"
#include "testutil.hpp"
#include "tolerance.hpp"

namespace burstlab::dist_testutil {

struct Case {
  Problem p;
  Inputs in;   // Q, dO (B, N_q, H_q, d), K, V (B, N_k, H_kv, d): BSHD, fp64, normal values
  Oracle want;
};

inline Case make_case(int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t d, const std::string& mask,
                      uint64_t seed) {
  Case c;
  c.p = testutil::make_problem(B, Hq, Hkv, Nq, Nk, d, mask, seed);
  c.in = make_inputs(c.p, Layout::BSHD, Dtype::F64, seed, Values::Normal);
  c.want = run_oracle(c.p, c.in, true);
  return c;
}

// The options of `algo` on `world` ranks, partition k, gpus_per_node (0: one node); the rest default.
inline dist::AlgoOptions options(const std::string& algo, dist::PartitionKind k, int world, int gpus_per_node = 0) {
  dist::AlgoOptions o;
  o.algo = algo;
  o.partition = k;
  o.world = world;
  o.gpus_per_node = gpus_per_node;
  return o;
}

inline dist::DistResult<double> run_algo(const Case& c, const dist::AlgoOptions& o, Engine<double>& e,
                                         std::vector<std::string>* errs = nullptr) {
  return dist::run_session<double>(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, e, errs);
}

// Rank r's O, LSE, dQ, dK, dV against the oracle's slice of that rank (fp64 reference and the
// same-dtype reference of the §9 rule).
inline std::vector<Metrics> check_rank(const Case& c, const dist::DistResult<double>& res, int r) {
  auto q4 = [&](const Tensor4<double>& t) { return dist::slice<double>(t.view(), res.qp, r); };
  auto k4 = [&](const Tensor4<double>& t) { return dist::slice<double>(t.view(), res.kp, r); };
  auto q3 = [&](const Tensor3<double>& t) { return dist::slice<double>(t.view(), res.qp, r); };
  std::vector<Metrics> ms;
  ms.push_back(compare<double>("O", res.O[r].view(), as_const(q4(c.want.O).view()), as_const(q4(c.want.fwd.O).view())));
  ms.push_back(compare<double>("LSE", res.LSE[r].view(), as_const(q3(c.want.LSE).view()), as_const(q3(c.want.fwd.LSE).view())));
  ms.push_back(compare<double>("dQ", res.dQ[r].view(), as_const(q4(c.want.dQ).view()), as_const(q4(c.want.bwd.dQ).view())));
  ms.push_back(compare<double>("dK", res.dK[r].view(), as_const(k4(c.want.dK).view()), as_const(k4(c.want.bwd.dK).view())));
  ms.push_back(compare<double>("dV", res.dV[r].view(), as_const(k4(c.want.dV).view()), as_const(k4(c.want.bwd.dV).view())));
  return ms;
}

}  // namespace burstlab::dist_testutil
