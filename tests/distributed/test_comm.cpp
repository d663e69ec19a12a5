// SimComm (spec §7.4): point-to-point, collectives, accounting, poisoning, reordering, real
// asynchrony, failure injection and timeouts.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "burstlab/error.hpp"
#include "burstlab/merge.hpp"
#include "comm.hpp"
#include "sim_comm.hpp"

using namespace burstlab;
using namespace burstlab::dist;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST(SimComm, RingExchangeAndAccounting) {
  for (int G = 1; G <= 8; ++G)
    for (bool reorder : {false, true}) {
      SimOptions o;
      o.reorder = reorder;
      o.seed = 7 + G;
      SimWorld w(G, o);
      w.run([&](Communicator& c) {
        const int r = c.rank(), n = 5 + r;  // ragged message sizes
        std::vector<double> mine(n, r + 0.5), got(5 + (r - 1 + G) % G);
        c.set_context(Phase::Forward, 3);
        if (G == 1) return;
        std::vector<RequestPtr> reqs;
        c.batch([&] {
          reqs.push_back(c.irecv(got.data(), 8 * static_cast<int64_t>(got.size()), (r - 1 + G) % G, 1, "x"));
          reqs.push_back(c.isend(mine.data(), 8 * n, (r + 1) % G, 1, "x"));
        });
        wait_all(reqs);
        for (double v : got) EXPECT_EQ(v, (r - 1 + G) % G + 0.5);
      });
      for (int r = 0; r < G; ++r) {
        const ByteTotals t = totals(w.logs()[r], Phase::Forward, 3);
        EXPECT_EQ(t.sent, G == 1 ? 0 : 8 * (5 + r));
        EXPECT_EQ(t.recv, G == 1 ? 0 : 8 * (5 + (r - 1 + G) % G));
        EXPECT_EQ(totals(w.logs()[r], Phase::Backward).sent, 0);
      }
    }
}

TEST(SimComm, ManyTagsMatchInAnyOrder) {
  SimOptions o;
  o.reorder = true;
  o.workers = 3;
  o.in_order = false;  // matching by tag, which NCCL does not do (asserted below)
  SimWorld w(3, o);
  w.run([&](Communicator& c) {
    const int r = c.rank(), G = c.size();
    const int M = 40;
    std::vector<std::vector<int>> out(M, std::vector<int>(3)), in(M, std::vector<int>(3, -1));
    std::vector<int> order(M);
    for (int i = 0; i < M; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(r + 1));
    std::vector<RequestPtr> reqs;
    for (int i : order) {
      out[i] = {r, i, 7};
      reqs.push_back(c.isend(out[i].data(), 12, (r + 1) % G, i, "m"));
    }
    std::shuffle(order.begin(), order.end(), std::mt19937(r + 11));
    for (int i : order) reqs.push_back(c.irecv(in[i].data(), 12, (r + G - 1) % G, i, "m"));
    wait_all(reqs);
    for (int i = 0; i < M; ++i) EXPECT_EQ(in[i], (std::vector<int>{(r + G - 1) % G, i, 7}));
  });
}

TEST(SimComm, TransfersProgressWithoutTheRankWaiting) {
  // Double buffering overlaps for real: a posted transfer completes while both ranks keep
  // "computing" (polling done(), never calling wait()).
  SimWorld w(2);
  w.run([&](Communicator& c) {
    std::vector<double> buf(1000, c.rank());
    RequestPtr req = c.rank() == 0 ? c.isend(buf.data(), 8000, 1, 0, "K") : c.irecv(buf.data(), 8000, 0, 0, "K");
    const auto t0 = std::chrono::steady_clock::now();
    while (!req->done()) {
      ASSERT_LT(seconds_since(t0), 10.0) << "transfer made no progress while the rank computed";
      std::this_thread::yield();
    }
    req->wait();
    if (c.rank() == 1) {
      EXPECT_EQ(buf[999], 0.0);
    }
  });
}

TEST(SimComm, BatchBoundary) {
  SimOptions o;
  o.in_order = false;  // the unbatched exchange below would deadlock NCCL (asserted below)
  SimWorld w(2, o);
  w.run([&](Communicator& c) {
    const int peer = 1 - c.rank();
    double out = c.rank(), in = -1;
    std::vector<RequestPtr> reqs;
    c.batch([&] {
      EXPECT_TRUE(c.in_batch());
      reqs.push_back(c.irecv(&in, 8, peer, 1, "x"));
      reqs.push_back(c.isend(&out, 8, peer, 1, "x"));
    });
    EXPECT_FALSE(c.in_batch());
    wait_all(reqs);
    EXPECT_EQ(in, double(peer));
    ASSERT_EQ(c.log().size(), 2u);
    EXPECT_GE(c.log()[0].batch, 1);
    EXPECT_EQ(c.log()[0].batch, c.log()[1].batch);
    auto r = c.isend(&out, 8, peer, 2, "y");  // outside a batch: recorded as such
    auto q = c.irecv(&in, 8, peer, 2, "y");
    r->wait();
    q->wait();
    EXPECT_EQ(c.log().back().batch, -1);
  });
  const std::string problem = in_order_problem(w.logs());
  EXPECT_NE(problem.find("deadlock"), std::string::npos) << problem;
}

// An exception while a batch is posted (here: a nested batch) cancels the batch and propagates;
// the communicator is usable again after it (SimComm; NcclComm aborts instead).
TEST(SimComm, AnExceptionInABatchCancelsIt) {
  SimWorld w(2);
  w.run([&](Communicator& c) {
    const int peer = 1 - c.rank();
    double out = c.rank(), in = -1;
    std::string m;
    try {
      c.batch([&] { c.batch([] {}); });
    } catch (const Error& e) {
      m = e.what();
    }
    EXPECT_NE(m.find("batches do not nest"), std::string::npos) << m;
    EXPECT_FALSE(c.in_batch());
    std::vector<RequestPtr> reqs;
    c.batch([&] {
      reqs.push_back(c.irecv(&in, 8, peer, 1, "x"));
      reqs.push_back(c.isend(&out, 8, peer, 1, "x"));
    });
    wait_all(reqs);
    EXPECT_EQ(in, double(peer));
  });
}

// The end of a batch reports another rank's failure, as NCCL's group end does (an error out of
// batch(), never from a destructor).
TEST(SimComm, EndOfABatchReportsAnotherRanksFailure) {
  SimOptions o;
  o.timeout_s = 0.2;
  SimWorld w(2, o);
  std::atomic<bool> world_failed{false};
  EXPECT_THROW(w.run([&](Communicator& c) {
    c.set_context(Phase::Forward, 2);
    double x = 0;
    if (c.rank() == 1) {  // a wait that times out fails the world before it throws
      RequestPtr q = c.irecv(&x, 8, 0, 99, "never");
      try {
        q->wait();
      } catch (...) {
        world_failed = true;
        throw;
      }
    }
    std::vector<RequestPtr> reqs;
    c.batch([&] {
      reqs.push_back(c.irecv(&x, 8, 1, 0, "K"));
      while (!world_failed) std::this_thread::yield();
    });
    wait_all(reqs);
  }),
               Error);
  EXPECT_NE(w.errors()[0].find("rank 0: gave up on the end of a batch in forward step 2 because rank 1 failed"),
            std::string::npos)
      << w.errors()[0];
  EXPECT_NE(w.errors()[0].find("timed out"), std::string::npos) << w.errors()[0];
}

// The in-order model (NCCL's): pairs match in posting order and groups run one after another.
TEST(SimComm, InOrderProblemFindsWhatNcclWouldDo) {
  auto t = [](int src, int dst, bool sent, int tag, int batch, int step = 0) {
    Transfer x;
    x.src = src;
    x.dst = dst;
    x.sent = sent;
    x.tag = tag;
    x.bytes = 8;
    x.batch = batch;
    x.step = step;
    x.what = "x";
    return x;
  };
  // A ring exchange in one batch per rank: fine.
  EXPECT_EQ(in_order_problem({{t(0, 1, true, 0, 1), t(1, 0, false, 0, 1)}, {t(1, 0, true, 0, 1), t(0, 1, false, 0, 1)}}), "");
  // Two messages of a pair received in the other order: NCCL pairs the first send with the first receive.
  const std::string swapped = in_order_problem({{t(0, 1, true, 1, 1), t(0, 1, true, 2, 1)},
                                                {t(0, 1, false, 2, 1), t(0, 1, false, 1, 1)}});
  EXPECT_NE(swapped.find("would pair them"), std::string::npos) << swapped;
  // A receive posted in the first batch for what the peer sends in its second, both ranks the
  // same way (the gradient hop of a ring posted before the compute): each first group waits for
  // the other's second.
  const std::string ahead = in_order_problem({{t(1, 0, false, 5, 1), t(0, 1, true, 5, 2)},
                                              {t(0, 1, false, 5, 1), t(1, 0, true, 5, 2)}});
  EXPECT_NE(ahead.find("deadlock"), std::string::npos) << ahead;
  // The same messages with each receive in the batch of its send: fine.
  EXPECT_EQ(in_order_problem({{t(0, 1, true, 5, 2), t(1, 0, false, 5, 2)}, {t(1, 0, true, 5, 2), t(0, 1, false, 5, 2)}}), "");
  // Groups need not line up by number, only by what they pair with: rank 1 has an extra group
  // with rank 2 first.
  EXPECT_EQ(in_order_problem({{t(0, 1, true, 0, 3), t(1, 0, false, 0, 3)},
                              {t(1, 2, true, 0, 1), t(1, 0, true, 0, 2), t(0, 1, false, 0, 2)},
                              {t(1, 2, false, 0, 1)}}),
            "");
  // A send nobody receives.
  EXPECT_NE(in_order_problem({{t(0, 1, true, 0, 1)}, {}}).find("which receives 0"), std::string::npos);
}

TEST(SimComm, LinkClassesFollowNodes) {
  SimOptions o;
  o.gpus_per_node = 2;
  SimWorld w(4, o);
  w.run([&](Communicator& c) {
    const int r = c.rank();
    double x = r, y = -1;
    c.set_context(Phase::Backward, 0);
    std::vector<RequestPtr> reqs;
    c.batch([&] {
      reqs.push_back(c.irecv(&y, 8, (r + 3) % 4, 0, "x"));
      reqs.push_back(c.isend(&x, 8, (r + 1) % 4, 0, "x"));
    });
    wait_all(reqs);
  });
  for (int r = 0; r < 4; ++r) {
    const bool inter_send = (r % 2) == 1;  // 1 -> 2 and 3 -> 0 cross nodes
    EXPECT_EQ(totals(w.logs()[r], Phase::Backward, -1, static_cast<int>(Link::Inter)).sent, inter_send ? 8 : 0);
    EXPECT_EQ(totals(w.logs()[r], Phase::Backward, -1, static_cast<int>(Link::Intra)).sent, inter_send ? 0 : 8);
  }
}

TEST(SimComm, PoisonMarksRecvBuffersAndConsumedSends) {
  SimOptions o;
  o.poison = true;
  SimWorld w(2, o);
  w.run([&](Communicator& c) {
    std::vector<double> a(4, 1.0), b(4, 2.0);
    if (c.rank() == 0) {
      RequestPtr s1 = c.isend(a.data(), 32, 1, 0, "kept", false);
      RequestPtr s2 = c.isend(b.data(), 32, 1, 1, "consumed", true);
      s1->wait();
      s2->wait();
      EXPECT_EQ(a[0], 1.0);         // not consumed: untouched
      EXPECT_TRUE(std::isnan(b[0]));  // consumed: poisoned once sent
    } else {
      std::vector<double> x(4, 5.0), y(4, 5.0);
      RequestPtr r1 = c.irecv(x.data(), 32, 0, 0, "kept");
      EXPECT_TRUE(std::isnan(x[3]) || x[3] == 1.0);  // poisoned at post (or already delivered)
      RequestPtr r2 = c.irecv(y.data(), 32, 0, 1, "consumed");
      r1->wait();
      r2->wait();
      EXPECT_EQ(x[3], 1.0);
      EXPECT_EQ(y[3], 2.0);
    }
  });
}

TEST(SimComm, SizeMismatchIsAClearError) {
  SimWorld w(2);
  EXPECT_THROW(w.run([&](Communicator& c) {
    double x[2] = {0, 0};
    RequestPtr q = c.rank() == 0 ? c.isend(x, 16, 1, 0, "K") : c.irecv(x, 8, 0, 0, "K");
    q->wait();
  }),
               Error);
  for (int r = 0; r < 2; ++r) EXPECT_NE(w.errors()[r].find("size mismatch"), std::string::npos) << w.errors()[r];
}

TEST(SimComm, InjectedFailureFailsEveryRankQuickly) {
  for (int G : {2, 3, 5, 8}) {
    SimOptions o;
    o.fail_rank = G / 2;
    o.fail_at_op = 5;
    o.timeout_s = 20;
    SimWorld w(G, o);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w.run([&](Communicator& c) {
        const int r = c.rank();
        double x = r, y = 0;
        for (int step = 0; step < 10; ++step) {
          c.set_context(Phase::Forward, step);
          std::vector<RequestPtr> reqs;
          reqs.push_back(c.irecv(&y, 8, (r + G - 1) % G, step, "K"));
          reqs.push_back(c.isend(&x, 8, (r + 1) % G, step, "K"));
          wait_all(reqs);
        }
        c.barrier();
      });
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(G / 2)), std::string::npos) << e.what();
    }
    EXPECT_LT(seconds_since(t0), 10.0);  // propagated by abort, not by the timeout
    for (int r = 0; r < G; ++r) {
      const std::string& m = w.errors()[r];
      ASSERT_FALSE(m.empty()) << "rank " << r << " did not fail";
      // Every rank names the failed rank and its operation.
      EXPECT_NE(m.find("rank " + std::to_string(G / 2)), std::string::npos) << m;
      EXPECT_NE(m.find("injected failure"), std::string::npos) << m;
      EXPECT_NE(m.find("forward step 2"), std::string::npos) << m;  // op #5 = step 2's isend
    }
  }
}

TEST(SimComm, ThrowingRankFailsEveryRank) {
  SimWorld w(4);
  EXPECT_THROW(w.run([&](Communicator& c) {
    c.set_context(Phase::Backward, 1);
    if (c.rank() == 3) throw std::runtime_error("engine exploded");
    double x = 0;
    RequestPtr q = c.irecv(&x, 8, 3, 0, "dQ");  // never sent
    q->wait();
  }),
               Error);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(w.errors()[r].find(r == 3 ? "engine exploded" : "rank 3 failed in backward step 1: engine exploded"),
              std::string::npos)
        << w.errors()[r];
  }
}

TEST(SimComm, TimeoutBoundsEveryWait) {
  SimOptions o;
  o.timeout_s = 0.3;
  SimWorld w(2, o);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(w.run([&](Communicator& c) {
    if (c.rank() == 1) {
      double x = 0;
      c.set_context(Phase::Forward, 4);
      RequestPtr q = c.irecv(&x, 8, 0, 9, "V");  // rank 0 never sends
      q->wait();
    }
  }),
               Error);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_NE(w.errors()[1].find("timed out"), std::string::npos) << w.errors()[1];
  EXPECT_NE(w.errors()[1].find("recv of V (tag 9) from rank 0 in forward step 4"), std::string::npos)
      << w.errors()[1];
}
