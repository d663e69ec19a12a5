// tests/nccl/test_nccl.cpp — NcclComm (nccl/, spec §7.4): the flags and topology helpers on any
// machine; on a GPU, a world of one rank: batches of sends and receives move bytes and are logged
// like SimComm's, NCCL's refusal of an unmatched receive becomes an error (also at the end of a
// batch), an error while posting a batch aborts the communicator, the watchdog ends a wait at its
// timeout with a message naming the rank, the operation, the phase and the step, injection fires
// at its phase and step, and an aborted communicator refuses further calls. Without a GPU the GPU tests skip; BURSTLAB_REQUIRE_GPU=1 fails them.
// Two or more ranks run under mpirun (tests/nccl/mpi_nccl.sh).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "gpu_skip.hpp"
#include "nccl_comm.hpp"
#include "world.hpp"

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
  o.timeout_s = 1;
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
                   "within 2 x the timeout of 1.0 s"),
            std::string::npos)
      << m;
  EXPECT_GE(s, 1.9);
  EXPECT_LT(s, 30.0) << "the watchdog took " << s << " s for 2 x a 1 s timeout";
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

}  // namespace
}  // namespace burstlab::nccl
