// nccl/ranks.hpp — the ranks of one process as threads, under a watchdog (spec §7.4, "NCCL").
// No CUDA or NCCL here: ThreadWorld (thread_world.hpp) passes its communicators' abort and stall checks
// as hooks, and tests drive it with plain threads on any machine.
//
// Why a watchdog outside the ranks: a rank's own watchdog (NcclComm::poll) bounds only the waits
// it makes. A rank thread blocked in a CUDA call that waits for its GPU (a first kernel launch
// that loads a module, cudaFree, a device or stream synchronize) while NCCL's kernel on that GPU
// waits for a peer that never posts stays blocked until someone aborts its communicator; NCCL's
// kernels end only when the peer posts or the communicator is aborted. So the first failure of
// any rank (or a rank whose posted transfers stall past the timeout while its thread is away from
// the communicator) makes this watchdog stop every rank, and every rank thread is joined within a
// bound.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace burstlab::nccl {

// The first failure among the ranks of one process; what NcclComm's Peers read and write there.
class FailureBoard {
 public:
  void report(const std::string& msg);  // keeps the first message
  std::string first() const;

 private:
  mutable std::mutex mu_;
  std::string first_;
};

struct RankWatch {
  // Called once, on a helper thread, with the first failure: stops every rank (ThreadWorld aborts
  // every communicator, so that NCCL's kernels end and CUDA calls waiting for them return).
  std::function<void(const std::string& why)> stop_all;
  // Called every tick while no rank failed: a failure to declare on a rank's behalf, or "".
  std::function<std::string()> stalled;
  // What rank r is doing, for the message when it does not end.
  std::function<std::string(int r)> where;
  // How long the ranks (and stop_all) get to end after the first failure.
  double grace_s = 10;
  // When they did not end within grace_s: by default prints `msg` to stderr and ends the process
  // with exit code 1 (a thread blocked for good cannot be joined, and returning would free what
  // it still uses). If it returns (tests), run_ranks keeps waiting.
  std::function<void(const std::string& msg)> give_up;
};

namespace detail {
// What the rank threads and the watchdog share; a thread that outlives a give_up that returned
// still finds it.
struct RankState {
  std::mutex mu;
  std::condition_variable cv;
  int ended = 0;
  std::vector<char> done;
  std::vector<std::string> errors;
  bool stop_done = false;
};
std::shared_ptr<RankState> rank_state(int G);
// The message of a rank's exception (null: not a std::exception), never empty.
std::string rank_error(int r, const std::exception* e);
// On rank r's thread when its body ended: `err` ("" = ok, else reported to `board`) recorded.
void rank_ended(RankState& sh, FailureBoard& board, int r, std::string err);
}  // namespace detail

// G rank threads started by start_ranks, waited for by watch_ranks.
struct RankThreads {
  std::shared_ptr<detail::RankState> state;
  std::vector<std::thread> threads;
};

// Starts body(r) on G threads, each body in its thread's own frame (a template: no type-erased
// call between the thread and a rank's work). `body` must outlive watch_ranks.
template <class Body>
RankThreads start_ranks(int G, const Body& body, FailureBoard& board) {
  RankThreads t;
  t.state = detail::rank_state(G);
  t.threads.reserve(size_t(G));
  for (int r = 0; r < G; ++r)
    t.threads.emplace_back([sh = t.state, &body, &board, r] {
      std::string err;
      try {
        body(r);
      } catch (const std::exception& e) {
        err = detail::rank_error(r, &e);
      } catch (...) {
        err = detail::rank_error(r, nullptr);
      }
      detail::rank_ended(*sh, board, r, std::move(err));
    });
  return t;
}

// The watchdog over t's ranks until every one ended, then the threads joined. Returns each rank's
// outcome: "" when its body returned, else its exception's message (also reported to `board`).
std::vector<std::string> watch_ranks(RankThreads& t, FailureBoard& board, const RankWatch& watch);

// Both: body(r) on G threads under the watchdog, joined.
template <class Body>
std::vector<std::string> run_ranks(int G, const Body& body, FailureBoard& board, const RankWatch& watch) {
  RankThreads t = start_ranks(G, body, board);
  return watch_ranks(t, board, watch);
}

}  // namespace burstlab::nccl
