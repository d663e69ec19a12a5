// tests/nccl/test_nccl.cpp — NcclComm (nccl/, spec §7.4): the flags and topology helpers on any
// machine; on a GPU, a world of one rank: batches of sends and receives move bytes and are logged
// like SimComm's, NCCL's refusal of an unmatched receive becomes an error (also at the end of a
// batch), an error while posting a batch aborts the communicator, the watchdog ends a wait at its
// timeout with a message naming the rank, the operation, the phase and the step, injection fires
// at its phase and step, and an aborted communicator refuses further calls. On any machine, the
// watchdog over the ranks of one process (ranks.hpp) with plain threads: a failure stops a rank
// blocked outside the communicator, a stall is declared on a rank's behalf, ranks that do not end
// are named. With 2 GPUs, ThreadWorld: a rank blocked in cudaDeviceSynchronize behind NCCL's
// kernel, whose peer never posts, is released by the peer's failure and by the stall watchdog.
// Without a GPU the GPU tests skip; BURSTLAB_REQUIRE_GPU=1 fails them.
// Two ranks under mpirun: tests/nccl/mpi_nccl.sh.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <cstring>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "gpu_skip.hpp"
#include "nccl_comm.hpp"
#include "ranks.hpp"
#include "thread_world.hpp"

namespace burstlab::nccl {
namespace {

bool device_visible(std::string* why) {
  if (device_count() >= 1) return true;
  *why = "no CUDA device is visible";
  return false;
}
#define REQUIRE_GPU() BURSTLAB_REQUIRE_GPU(device_visible)

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NcclFlags, ParseInjection) {
  const Injection a = parse_injection("1:3");
  EXPECT_EQ(a.rank, 1);
  EXPECT_EQ(a.step, 3);
  EXPECT_EQ(a.phase, Phase::Forward);
  EXPECT_FALSE(a.hang);
  const Injection b = parse_injection("0:0:hang");
  EXPECT_EQ(b.rank, 0);
  EXPECT_TRUE(b.hang);
  const Injection c = parse_injection("2:5:bwd");
  EXPECT_EQ(c.phase, Phase::Backward);
  EXPECT_EQ(c.step, 5);
  EXPECT_FALSE(c.hang);
  const Injection d = parse_injection("1:0:bwd:hang");
  EXPECT_EQ(d.phase, Phase::Backward);
  EXPECT_TRUE(d.hang);
  EXPECT_EQ(parse_injection("1:2:fwd").phase, Phase::Forward);
  for (const char* s : {"1:3", "0:0:hang", "2:5:bwd", "1:0:bwd:hang"}) EXPECT_EQ(to_string(parse_injection(s)), s);
  for (const char* bad : {"", "1", "x:1", "1:y", "1:2:sleep", "-1:0", "1:-2", "1:2x", "1:2:hang:bwd", "1:2:bwd:fwd",
                          "1:2:hang:hang", "1:2:bwd:hang:x", "1:2:"}) {
    const std::string m = message_of([&] { parse_injection(bad); });
    EXPECT_NE(m.find(std::string("inject-failure (") + bad + ")"), std::string::npos) << bad << " -> " << m;
  }
}

TEST(NcclFlags, NodesOf) {
  EXPECT_EQ(nodes_of(4, 2, {}), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(nodes_of(3, 0, {}), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(nodes_of(4, 0, {"b", "a", "b", "c"}), (std::vector<int>{0, 1, 0, 2}));
  EXPECT_NE(message_of([] { nodes_of(6, 4, {}); }).find("gpus-per-node (4) must divide world (6)"), std::string::npos);
}

TEST(NcclWorld, MoreRanksThanGpusIsRefused) {
  const int n = device_count();
  const std::string m = message_of([&] { ThreadWorld w(n + 1, NcclOptions{}); });
  EXPECT_NE(m.find("world (" + std::to_string(n + 1) + ") needs"), std::string::npos) << m;
  EXPECT_NE(m.find("mpirun"), std::string::npos) << m;
}

struct DeviceBytes {
  explicit DeviceBytes(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DeviceBytes() { cudaFree(p); }
  std::vector<unsigned char> host() const {
    std::vector<unsigned char> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void* p = nullptr;
  size_t n;
};

TEST(NcclWorld, OneRankSendsToItselfInABatch) {
  REQUIRE_GPU();
  NcclOptions o;
  o.timeout_s = 30;
  ThreadWorld w(1, o);
  w.run([](NcclComm& c) {
    const size_t n = 1 << 20;
    DeviceBytes a(n), b(n);
    std::vector<unsigned char> pattern(n);
    for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
    ASSERT_EQ(cudaMemcpy(a.p, pattern.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(b.p, 0xff, n), cudaSuccess);
    c.set_context(Phase::Forward, 2);
    std::vector<RequestPtr> reqs;
    c.batch([&] {
      reqs.push_back(c.irecv(b.p, int64_t(n), 0, 5, "K"));
      reqs.push_back(c.isend(a.p, int64_t(n), 0, 5, "K"));
    });
    dist::wait_all(reqs);
    EXPECT_EQ(b.host(), pattern);
    // Logged as SimComm logs: both ends, the batch, the phase and step.
    ASSERT_EQ(c.log().size(), 2u);
    for (const dist::Transfer& t : c.log()) {
      EXPECT_EQ(t.bytes, int64_t(n));
      EXPECT_EQ(t.phase, Phase::Forward);
      EXPECT_EQ(t.step, 2);
      EXPECT_GE(t.batch, 0);
      EXPECT_EQ(t.what, "K");
    }
    EXPECT_EQ(dist::totals(c.log(), Phase::Forward).sent, int64_t(n));
    EXPECT_EQ(c.exposed().size(), 2u);
    // A message outside a batch is a group of one; zero bytes move nothing and complete.
    RequestPtr r0 = c.irecv(b.p, 0, 0, 6, "empty");
    RequestPtr s0 = c.isend(a.p, 0, 0, 6, "empty");
    r0->wait();
    s0->wait();
    c.barrier();
  });
}

TEST(NcclWorld, UnmatchedSelfReceiveIsAnErrorNotAHang) {
  REQUIRE_GPU();
  NcclOptions o;
  o.timeout_s = 30;
  ThreadWorld w(1, o);
  std::string m;
  try {
    w.run([](NcclComm& c) {
      DeviceBytes b(4096);
      c.set_context(Phase::Backward, 3);
      RequestPtr r = c.irecv(b.p, 4096, 0, 9, "dK");  // NCCL refuses a receive from itself with no send
      r->wait();
    });
  } catch (const Error& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("rank 0: the batch of receive of dK from rank 0 (4096 bytes) in backward step 3: NCCL error"),
            std::string::npos)
      << m;
  EXPECT_TRUE(w.comm(0).aborted());
  const std::string again = message_of([&] { w.run([](NcclComm& c) { c.barrier(); }); });
  EXPECT_NE(again.find("aborted communicator"), std::string::npos) << again;
}

// The end of a batch fails (NCCL refuses the unmatched receive in it): the error leaves batch()
// as an exception, as any other, and the communicator is aborted.
TEST(NcclWorld, AFailedBatchEndThrows) {
  REQUIRE_GPU();
  NcclOptions o;
  o.timeout_s = 30;
  ThreadWorld w(1, o);
  w.run([](NcclComm& c) {
    DeviceBytes b(4096);
    c.set_context(Phase::Forward, 1);
    std::vector<RequestPtr> reqs;
    const std::string m = message_of([&] { c.batch([&] { reqs.push_back(c.irecv(b.p, 4096, 0, 3, "K")); }); });
    EXPECT_NE(m.find("rank 0: the batch of receive of K from rank 0 (4096 bytes) in forward step 1: "), std::string::npos)
        << m;
    EXPECT_FALSE(c.in_batch());
    EXPECT_TRUE(c.aborted());
  });
}

// An error while a batch is being posted cancels it: NCCL cannot withdraw a group's operations,
// so the communicator is aborted (nothing keeps writing into the buffers the error frees), the
// error itself propagates, and later calls say why the communicator is unusable.
TEST(NcclWorld, AnErrorWhilePostingABatchAbortsTheCommunicator) {
  REQUIRE_GPU();
  NcclOptions o;
  o.timeout_s = 30;
  ThreadWorld w(1, o);
  w.run([](NcclComm& c) {
    DeviceBytes a(4096), b(4096);
    c.set_context(Phase::Backward, 2);
    std::vector<RequestPtr> reqs;
    const std::string m = message_of([&] {
      c.batch([&] {
        reqs.push_back(c.irecv(b.p, 4096, 0, 3, "dQ"));
        fail("the engine failed while posting");
      });
    });
    EXPECT_EQ(m, "the engine failed while posting");
    EXPECT_FALSE(c.in_batch());
    EXPECT_TRUE(c.aborted());
    reqs.clear();
    const std::string again = message_of([&] { c.batch([&] { c.isend(a.p, 4096, 0, 4, "dQ"); }); });
    EXPECT_NE(again.find("aborted communicator (rank 0: a batch in backward step 2 was abandoned: the engine failed "
                         "while posting)"),
              std::string::npos)
        << again;
  });
}

// A rank that stops communicating (injected hang): its own wait ends at the timeout with the
// rank, the operation, the phase and the step; with peers, theirs do too (mpi_nccl.sh).
TEST(NcclWorld, WatchdogEndsAWaitAtTheTimeout) {
  REQUIRE_GPU();
  NcclOptions o;
  // The join is bounded by the same timeout: 1 s was too short for it with 15 other GPU test
  // processes starting at once (H100, ctest -j 16).
  o.timeout_s = 4;
  o.inject = parse_injection("0:4:hang");
  ThreadWorld w(1, o);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = message_of([&] {
    w.run([](NcclComm& c) {
      DeviceBytes b(4096);
      c.set_context(Phase::Forward, 4);  // hangs here, on entering the step
      RequestPtr r = c.irecv(b.p, 4096, 0, 9, "V");
    });
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Alone, the hanging rank ends at its own bound, twice the timeout (with peers, their watchdogs
  // fire first: mpi_nccl.sh).
  EXPECT_NE(m.find("rank 0: fault injection (--inject-failure 0:4:hang), hanging in forward step 4: did not complete "
                   "within 2 x the timeout of 4.0 s"),
            std::string::npos)
      << m;
  EXPECT_GE(s, 7.9);
  EXPECT_LT(s, 40.0) << "the watchdog took " << s << " s for 2 x a 4 s timeout";
  EXPECT_TRUE(w.comm(0).aborted());
}

// The injection fires on entering its phase's step, before any transfer of the step (a step
// without transfers included), and not in the other phase.
TEST(NcclWorld, InjectedFailureNamesTheRankAndStep) {
  REQUIRE_GPU();
  for (const char* spec : {"0:1", "0:1:bwd"}) {
    NcclOptions o;
    o.timeout_s = 30;
    o.inject = parse_injection(spec);
    const Phase phase = o.inject.phase, other = phase == Phase::Forward ? Phase::Backward : Phase::Forward;
    ThreadWorld w(1, o);
    int reached = 0;
    const std::string m = message_of([&] {
      w.run([&](NcclComm& c) {
        DeviceBytes b(64);
        c.set_context(other, 1);  // the other phase: no failure
        c.set_context(phase, 0);
        RequestPtr a = c.isend(b.p, 0, 0, 1, "Q");  // step 0: fine
        a->wait();
        reached = 1;
        c.set_context(phase, 1);
        reached = 2;
      });
    });
    EXPECT_EQ(reached, 1) << spec;
    EXPECT_NE(m.find(std::string("rank 0: fault injection (--inject-failure ") + spec + ") in " +
                     dist::to_string(phase) + " step 1: injected failure"),
              std::string::npos)
        << spec << ": " << m;
  }
}

// ---- the watchdog over the ranks of one process, with plain threads (any machine)

// Stands for a CUDA call that waits for a GPU whose NCCL kernel waits for a peer: it returns
// only once the communicator is aborted (release()).
struct BlockedCall {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return released; });
  }
  void release() {
    std::lock_guard<std::mutex> lk(mu);
    released = true;
    cv.notify_all();
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(RankWatch, AFailureStopsARankBlockedOutsideTheCommunicator) {
  FailureBoard board;
  BlockedCall call;
  std::vector<std::string> stops;
  RankWatch w;
  w.stop_all = [&](const std::string& why) {
    stops.push_back(why);
    call.release();  // what aborting rank 0's communicator does to its blocked call
  };
  w.grace_s = 30;
  w.give_up = [&](const std::string& m) { ADD_FAILURE() << "gave up: " << m; call.release(); };
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> errors = run_ranks(
      2,
      [&](int r) {
        if (r == 1) fail("rank 1: the engine failed");
        call.wait();
        fail("rank 0: stopped after the first failure");
      },
      board, w);
  EXPECT_LT(seconds_since(t0), 10.0);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[1], "rank 1: the engine failed");
  EXPECT_EQ(errors[0], "rank 0: stopped after the first failure");
  EXPECT_EQ(board.first(), "rank 1: the engine failed");
  EXPECT_EQ(stops, std::vector<std::string>{"rank 1: the engine failed"});
}

TEST(RankWatch, AStallIsDeclaredOnTheRanksBehalf) {
  FailureBoard board;
  BlockedCall call;
  std::atomic<int> asked{0};
  std::string stopped_for;
  RankWatch w;
  const auto t0 = std::chrono::steady_clock::now();
  w.stalled = [&]() -> std::string {
    ++asked;
    return seconds_since(t0) > 0.3 ? "rank 0: the batch of K did not complete within the timeout" : "";
  };
  w.stop_all = [&](const std::string& why) {
    stopped_for = why;
    call.release();
  };
  w.grace_s = 30;
  w.give_up = [&](const std::string& m) { ADD_FAILURE() << "gave up: " << m; call.release(); };
  const std::vector<std::string> errors = run_ranks(
      2,
      [&](int r) {
        if (r == 0) call.wait();  // rank 1 returns at once: nothing fails but rank 0's stall
      },
      board, w);
  EXPECT_GE(seconds_since(t0), 0.3);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_GT(asked.load(), 1);
  EXPECT_EQ(stopped_for, "rank 0: the batch of K did not complete within the timeout");
  EXPECT_EQ(board.first(), stopped_for);
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
}

TEST(RankWatch, RanksThatDoNotEndAreNamed) {
  FailureBoard board;
  BlockedCall call;
  std::string gave_up;
  RankWatch w;
  w.stop_all = [](const std::string&) {};  // the abort does not release rank 0
  w.where = [](int r) { return "is blocked in test call " + std::to_string(r); };
  w.grace_s = 0.2;
  w.give_up = [&](const std::string& m) {
    gave_up = m;
    call.release();  // the process would end here; the test lets the rank go instead
  };
  const std::vector<std::string> errors = run_ranks(
      3,
      [&](int r) {
        if (r == 2) fail("rank 2: injected");
        if (r == 0) call.wait();
      },
      board, w);
  EXPECT_NE(gave_up.find("the ranks did not end within 0.2 s after the first failure (rank 2: injected): rank 0 is "
                         "blocked in test call 0;"),
            std::string::npos)
      << gave_up;
  EXPECT_EQ(gave_up.find("rank 1 "), std::string::npos) << gave_up;  // rank 1 had ended
  EXPECT_EQ(errors[2], "rank 2: injected");
}

TEST(RankWatch, ARunWithoutFailuresStopsNothing) {
  FailureBoard board;
  RankWatch w;
  bool stopped = false;
  w.stop_all = [&](const std::string&) { stopped = true; };
  w.stalled = [] { return std::string(); };
  w.give_up = [](const std::string& m) { ADD_FAILURE() << m; };
  std::atomic<int> ran{0};
  const std::vector<std::string> errors = run_ranks(4, [&](int) { ++ran; }, board, w);
  EXPECT_EQ(ran.load(), 4);
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
  EXPECT_FALSE(stopped);
  EXPECT_EQ(board.first(), "");
}

// ---- two GPUs: a rank blocked in a CUDA call behind NCCL's kernel

bool two_devices(std::string* why) {
  if (device_count() >= 2) return true;
  *why = "needs 2 CUDA devices in this process (it sees " + std::to_string(device_count()) + ")";
  return false;
}

// Both ranks exchange once (NCCL connects the pair lazily, at its first transfer; afterwards a
// batch launches NCCL's kernel at once), then rank 0 posts a batch with rank 1 and blocks in
// cudaDeviceSynchronize, which returns only when that kernel ends: when rank 1 posts (it never
// does) or the communicator is aborted. `rank1` is what rank 1 does instead.
std::string blocked_behind_nccl(ThreadWorld& w, const std::function<void(NcclComm&)>& rank1, double* s) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = message_of([&] {
    w.run([&](NcclComm& c) {
      DeviceBytes a(4096), b(4096);
      const int peer = 1 - c.rank();
      c.set_context(Phase::Forward, 0);
      std::vector<RequestPtr> reqs;
      c.batch([&] {
        reqs.push_back(c.irecv(b.p, 4096, peer, 1, "K"));
        reqs.push_back(c.isend(a.p, 4096, peer, 1, "K"));
      });
      dist::wait_all(reqs);
      c.barrier();
      if (c.rank() == 1) return rank1(c);
      c.set_context(Phase::Backward, 0);
      c.batch([&] {
        reqs.push_back(c.irecv(b.p, 4096, peer, 2, "dK"));
        reqs.push_back(c.isend(a.p, 4096, peer, 2, "dK"));
      });
      (void)cudaDeviceSynchronize();  // blocked until the abort ends NCCL's kernel
      dist::wait_all(reqs);
    });
  });
  *s = seconds_since(t0);
  return m;
}

TEST(NcclWorld2, AFailedRankReleasesAPeerBlockedBehindNcclsKernel) {
  BURSTLAB_REQUIRE_GPU(two_devices);
  NcclOptions o;
  o.timeout_s = 30;
  ThreadWorld w(2, o);
  double s = 0;
  const std::string m = blocked_behind_nccl(
      w,
      [](NcclComm&) {
        std::this_thread::sleep_for(std::chrono::seconds(1));  // rank 0 is blocked by then
        fail("rank 1: the engine failed");
      },
      &s);
  // Rank 0's error comes first; its communicator was aborted because rank 1 failed.
  EXPECT_NE(m.find("rank 0: "), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1: the engine failed"), std::string::npos) << m;
  EXPECT_LT(s, 10.0) << "rank 0 stayed blocked for " << s << " s (timeout 30 s)";
  EXPECT_TRUE(w.comm(0).aborted());
  EXPECT_TRUE(w.comm(1).aborted());
  EXPECT_EQ(w.errors().at(1), "rank 1: the engine failed");
}

TEST(NcclWorld2, AStalledRankIsFailedAtTheTimeoutNotAtThePeersBound) {
  BURSTLAB_REQUIRE_GPU(two_devices);
  NcclOptions o;
  o.timeout_s = 4;
  o.inject = parse_injection("1:1:hang");  // rank 1 hangs, bounded at 2 x the timeout
  ThreadWorld w(2, o);
  double s = 0;
  const std::string m = blocked_behind_nccl(w, [](NcclComm& c) { c.set_context(Phase::Forward, 1); }, &s);
  EXPECT_NE(m.find("rank 0: "), std::string::npos) << m;
  EXPECT_NE(m.find("did not complete within the timeout of 4.0 s (--timeout) while rank 0's thread was away from "
                   "the communicator"),
            std::string::npos)
      << m;
  EXPECT_GE(s, 4.0);
  EXPECT_LT(s, 7.5) << "ended at " << s << " s: by rank 1's own bound (8 s), not by rank 0's stall";
  // Rank 1 ends by whichever it sees first, rank 0's failure notice or its aborted communicator.
  const std::string& e1 = w.errors().at(1);
  EXPECT_NE(e1.find("rank 1: fault injection (--inject-failure 1:1:hang), hanging in forward step 1: stopped"),
            std::string::npos)
      << e1;
  EXPECT_TRUE(e1.find("stopped: the communicator was aborted") != std::string::npos ||
              e1.find("stopped because another rank failed: rank 0: ") != std::string::npos)
      << e1;
}

}  // namespace
}  // namespace burstlab::nccl
