// tests/distributed/test_faults.cpp — a failure injected into every algorithm of the table, in
// its forward and its backward, at its first and its last step (spec §7.4 (e), (f)): one rank
// throws, or stops communicating, on entering the step (SimOptions::fail_step, the same hook as
// NcclComm's --inject-failure). Every rank must end with a burstlab::Error that names the failed
// rank, within a bound; nothing may terminate or hang (each case runs under a deadline that ends
// the test binary if it passes).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "algorithm.hpp"
#include "burstlab/error.hpp"
#include "cpu_engine.hpp"
#include "dist_testutil.hpp"
#include "session.hpp"

using namespace burstlab;
using namespace burstlab::dist;
using namespace burstlab::dist_testutil;

namespace {

constexpr int kWorld = 4;      // 2 x 2 grid for attention2d, 2 nodes of 2 for double-ring and usp
constexpr int kFailRank = 1;
constexpr double kDeadlineS = 60;  // a case past this is a hang: the binary ends with a failure

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// Runs fn on its own thread; past `deadline_s` the test binary ends (a hung rank thread cannot
// be joined), so a hang fails the test instead of blocking CI until ctest's timeout.
void with_deadline(const std::string& what, double deadline_s, const std::function<void()>& fn) {
  std::packaged_task<void()> task(fn);
  std::future<void> done = task.get_future();
  std::thread t(std::move(task));
  if (done.wait_for(std::chrono::duration<double>(deadline_s)) == std::future_status::timeout) {
    std::fprintf(stderr, "FAIL: %s did not end within %.0f s (a hang)\n", what.c_str(), deadline_s);
    std::fflush(stderr);
    std::_Exit(1);
  }
  t.join();
  done.get();
}

// Forwards everything to a rank's communicator and records the (phase, step) contexts its
// schedule enters.
class StepRecorder final : public ForwardingComm {
 public:
  StepRecorder(Communicator& c, std::set<std::pair<Phase, int>>& seen) : ForwardingComm(c), c_(c), seen_(seen) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  Link link_to(int peer) const override { return c_.link_to(peer); }
  RequestPtr isend(const void* buf, int64_t bytes, int dst, int tag, const char* what, bool consume) override {
    return c_.isend(buf, bytes, dst, tag, what, consume);
  }
  RequestPtr irecv(void* buf, int64_t bytes, int src, int tag, const char* what) override {
    return c_.irecv(buf, bytes, src, tag, what);
  }
  void barrier() override { c_.barrier(); }

 protected:
  void context_changed() override {
    seen_.insert({phase(), step()});
    c_.set_context(phase(), step());
  }

 private:
  Communicator& c_;
  std::set<std::pair<Phase, int>>& seen_;
};

const Case& the_case() {
  // H_q = H_kv = 4: ulysses splits heads over G = 4; causal: distflash's requirement.
  static const Case c = make_case(1, 4, 4, 24, 24, 4, "causal", 11);
  return c;
}

AlgoOptions options_for(const Algorithm& a) {
  AlgoOptions o;
  o.algo = a.name;
  o.world = kWorld;
  o.gpus_per_node = 2;  // double-ring's K, usp's u
  o.partition = a.partition.value_or(PartitionKind::Zigzag);
  o.sim.timeout_s = 20;
  return o;
}

Session<double> make_session(const AlgoOptions& o, Engine<double>& e, const Case& c = the_case()) {
  return Session<double>(c.p, c.in.Q.view(), c.in.K.view(), c.in.V.view(), c.in.dO.view(), o, e);
}

// One pass on a fresh world with `sim`, each rank's pass then a barrier (as Session runs it);
// per rank: "" = ok, else its message; *all_errors: whether every failed rank threw an Error.
std::vector<std::string> run_pass_on(Session<double>& s, Phase phase, const SimOptions& sim, bool* all_errors) {
  SimWorld w(kWorld, sim);
  std::vector<int> other(kWorld, 0);
  try {
    w.run([&](Communicator& c) {
      try {
        s.rank_pass(phase, c);
        c.set_context(Phase::Other, 0);
        c.barrier();
      } catch (const Error&) {
        throw;
      } catch (...) {
        other[c.rank()] = 1;
        throw;
      }
    });
  } catch (const Error&) {
  }
  *all_errors = true;
  for (int r = 0; r < kWorld; ++r)
    if (other[r]) *all_errors = false;
  return w.errors();
}

// The last step each algorithm's pass enters, checking on the way that a clean pass enters
// every step 0..last on every rank (so a failure injected at any step is reached).
int last_step(const AlgoOptions& o, Phase phase, Engine<double>& e, const Case& c = the_case()) {
  Session<double> s = make_session(o, e, c);
  const int G = o.world;
  std::vector<std::set<std::pair<Phase, int>>> seen(G);
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    SimWorld w(G, o.sim);
    w.run([&](Communicator& c) {
      StepRecorder rc(c, seen[c.rank()]);
      s.rank_pass(ph, rc);
    });
    if (ph == phase) break;
  }
  int last = -1;
  for (const auto& [ph, t] : seen[kFailRank])
    if (ph == phase) last = std::max(last, t);
  for (int r = 0; r < G; ++r)
    for (int t = 0; t <= last; ++t)
      EXPECT_TRUE(seen[r].count({phase, t})) << o.algo << " " << to_string(phase) << ": rank " << r
                                             << " never enters step " << t;
  return last;
}

struct Outcome {
  double seconds = 0;
  bool all_errors = false;  // every rank's failure was a burstlab::Error
  std::vector<std::string> errors;
};

// A fresh session; the forward runs clean when the failure is in the backward.
Outcome inject(const Algorithm& a, Phase phase, int step, bool hang, double timeout_s, Engine<double>& e) {
  AlgoOptions o = options_for(a);
  Session<double> s = make_session(o, e);
  if (phase == Phase::Backward) s.forward();
  SimOptions sim = o.sim;
  sim.fail_rank = kFailRank;
  sim.fail_phase = phase;
  sim.fail_step = step;
  sim.fail_hang = hang;
  sim.timeout_s = timeout_s;
  Outcome out;
  const auto t0 = std::chrono::steady_clock::now();
  out.errors = run_pass_on(s, phase, sim, &out.all_errors);
  out.seconds = seconds_since(t0);
  return out;
}

void check_matrix(bool hang) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const double timeout_s = hang ? 0.5 : 20.0;
  // A thrown failure reaches every rank at once; a hang only once a wait times out.
  const double bound_s = hang ? timeout_s + 5.0 : 5.0;
  int cases = 0;
  for (const Algorithm& a : algorithms())
    for (Phase phase : {Phase::Forward, Phase::Backward}) {
      const int last = last_step(options_for(a), phase, *engine);
      ASSERT_GE(last, 0) << a.name << " " << to_string(phase) << " enters no step";
      for (int step : std::set<int>{0, last}) {
        const std::string what = std::string(a.name) + " " + to_string(phase) + " step " + std::to_string(step) +
                                 (hang ? " hang" : " throw");
        Outcome out;
        with_deadline(what, kDeadlineS, [&] { out = inject(a, phase, step, hang, timeout_s, *engine); });
        ++cases;
        const std::string where = "injected failure on rank " + std::to_string(kFailRank) + " in " +
                                  to_string(phase) + " step " + std::to_string(step);
        std::printf("%-14s %-8s step %d/%d %-5s %6.3f s  rank 0: %s\n", a.name, to_string(phase).c_str(), step, last,
                    hang ? "hang" : "throw", out.seconds, first_line(out.errors.at(0)).c_str());
        EXPECT_TRUE(out.all_errors) << what << ": a rank failed with something other than burstlab::Error";
        EXPECT_LT(out.seconds, bound_s) << what;
        if (hang) {
          EXPECT_GE(out.seconds, 0.9 * timeout_s) << what << ": ended before any wait could time out";
        }
        ASSERT_EQ(out.errors.size(), size_t(kWorld)) << what;
        for (int r = 0; r < kWorld; ++r) {
          const std::string& m = out.errors[r];
          EXPECT_FALSE(m.empty()) << what << ": rank " << r << " ended without an error";
          // Thrown: every rank names the failure (the failed rank, its phase and step). Hang:
          // the failed rank names it; the others name the wait that timed out (theirs or the
          // first to expire), or, if none waited within twice the timeout, the hang.
          if (!hang) {
            EXPECT_NE(m.find(where), std::string::npos) << what << ", rank " << r << ": " << m;
          } else if (r == kFailRank) {
            EXPECT_NE(m.find(where + " (hanging)"), std::string::npos) << what << ": " << m;
          } else {
            EXPECT_TRUE(m.find("timed out") != std::string::npos || m.find(where + " (hanging)") != std::string::npos)
                << what << ", rank " << r << ": " << m;
          }
        }
      }
    }
  EXPECT_GE(cases, static_cast<int>(algorithms().size()) * 2);
}

TEST(Faults, InjectedFailureAtFirstAndLastStepFailsEveryRank) { check_matrix(false); }

TEST(Faults, InjectedHangAtFirstAndLastStepEndsEveryRankAtTheTimeout) { check_matrix(true); }

// tests/nccl/mpi_nccl.sh's fault matrix runs 2 ranks with its own flags and injects at each
// pass's last step from its table (last_fwd, last_bwd): a step the pass never enters injects
// nothing and the run ends clean, failing that row. The same runs on SimComm, so that a change
// of an executor's steps fails here, in CI, and not first on a GPU machine.
TEST(Faults, TheNcclMatrixTableIsEachPassLastStepOnTwoRanks) {
  struct Row {
    const char* algo;
    const char* mask;
    PartitionKind partition;
    int gpus_per_node, ulysses_degree;
    int last_fwd, last_bwd;  // as in the script's table
  };
  const PartitionKind zz = PartitionKind::Zigzag, st = PartitionKind::Striped, co = PartitionKind::Contiguous;
  const Row rows[] = {
      {"ring", "causal", zz, 0, 0, 1, 1},          {"burst", "causal+document:3", zz, 0, 0, 1, 1},
      {"double-ring", "causal", zz, 1, 0, 1, 1},   {"distflash", "causal", co, 0, 0, 1, 1},
      {"attention2d", "causal", st, 0, 0, 2, 2},   {"attention2d-o", "window:40,0", st, 0, 0, 3, 3},
      {"ulysses", "causal", zz, 0, 0, 1, 1},       {"allgather", "none", zz, 0, 0, 0, 1},
      {"usp", "causal", zz, 0, 2, 2, 2},
  };
  EXPECT_EQ(std::size(rows), algorithms().size());
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  for (const Row& row : rows) {
    const Case c = make_case(1, 4, 2, 45, 45, 4, row.mask, 7);  // the script's H_q = 4, H_kv = 2
    AlgoOptions o;
    o.algo = row.algo;
    o.world = 2;
    o.partition = row.partition;
    o.gpus_per_node = row.gpus_per_node;
    o.ulysses_degree = row.ulysses_degree;
    o.sim.timeout_s = 20;
    EXPECT_EQ(last_step(o, Phase::Forward, *engine, c), row.last_fwd) << row.algo << " forward";
    EXPECT_EQ(last_step(o, Phase::Backward, *engine, c), row.last_bwd) << row.algo << " backward";
  }
}

// The step hook is exact: a step the pass never reaches injects nothing, and an injection in the
// backward leaves the forward alone.
TEST(Faults, InjectionFiresOnlyAtItsPhaseAndStep) {
  auto engine = cpu::make_engine<double>(cpu::Tiles{8, 8});
  const Algorithm& a = find_algorithm("attention2d");
  AlgoOptions o = options_for(a);
  o.sim.fail_rank = kFailRank;
  o.sim.fail_phase = Phase::Backward;
  o.sim.fail_step = 0;
  Session<double> s = make_session(o, *engine);
  s.forward();  // clean: the injection is for the backward
  for (const std::string& m : s.errors()) EXPECT_TRUE(m.empty()) << m;
  EXPECT_THROW(s.backward(), Error);
  for (const std::string& m : s.errors())
    EXPECT_NE(m.find("injected failure on rank 1 in backward step 0"), std::string::npos) << m;
  o.sim.fail_step = 99;
  Session<double> beyond = make_session(o, *engine);
  beyond.forward();
  beyond.backward();
  for (const std::string& m : beyond.errors()) EXPECT_TRUE(m.empty()) << m;
}

}  // namespace
