// nccl/ranks.cpp — rank threads under a watchdog (spec §7.4).
#include "ranks.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

namespace burstlab::nccl {

void FailureBoard::report(const std::string& msg) {
  std::lock_guard<std::mutex> lk(mu_);
  if (first_.empty()) first_ = msg.empty() ? std::string("a rank failed without a message") : msg;
}

std::string FailureBoard::first() const {
  std::lock_guard<std::mutex> lk(mu_);
  return first_;
}

namespace {
using Clock = std::chrono::steady_clock;

void print_and_exit(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "burstlab: %s\n", msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}
}  // namespace

std::vector<std::string> run_ranks(int G, const std::function<void(int)>& body, FailureBoard& board,
                                   const RankWatch& watch) {
  // Shared with the threads; a thread that outlives a give_up that returned still finds it.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    int ended = 0;
    std::vector<char> done;
    std::vector<std::string> errors;
    bool stop_done = false;
  };
  auto sh = std::make_shared<Shared>();
  sh->done.assign(size_t(G), 0);
  sh->errors.assign(size_t(G), "");
  std::vector<std::thread> ts;
  ts.reserve(size_t(G));
  for (int r = 0; r < G; ++r)
    ts.emplace_back([sh, &body, &board, r] {
      std::string err;
      try {
        body(r);
      } catch (const std::exception& e) {
        err = e.what();
        if (err.empty()) err = "rank " + std::to_string(r) + ": an exception without a message";
      } catch (...) {
        err = "rank " + std::to_string(r) + ": unknown exception";
      }
      if (!err.empty()) board.report(err);
      std::lock_guard<std::mutex> lk(sh->mu);
      sh->errors[size_t(r)] = err;
      sh->done[size_t(r)] = 1;
      ++sh->ended;
      sh->cv.notify_all();
    });

  bool stopping = false, gave_up = false;
  Clock::time_point stop_at{};
  std::thread stopper;
  const auto tick = std::chrono::milliseconds(20);
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(sh->mu);
      sh->cv.wait_for(lk, tick, [&] { return sh->ended == G && (!stopping || sh->stop_done); });
      if (sh->ended == G && (!stopping || sh->stop_done)) break;
    }
    if (!stopping) {
      std::string why = board.first();
      if (why.empty() && watch.stalled) {
        why = watch.stalled();
        if (!why.empty()) board.report(why);
      }
      if (why.empty()) continue;
      stopping = true;
      stop_at = Clock::now();
      stopper = std::thread([sh, &watch, why] {
        if (watch.stop_all) watch.stop_all(why);
        std::lock_guard<std::mutex> lk(sh->mu);
        sh->stop_done = true;
        sh->cv.notify_all();
      });
      continue;
    }
    if (gave_up || Clock::now() - stop_at < std::chrono::duration<double>(watch.grace_s)) continue;
    gave_up = true;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", watch.grace_s);
    std::string msg = "the ranks did not end within " + std::string(secs) + " s after the first failure (" +
                      board.first() + "):";
    {
      std::lock_guard<std::mutex> lk(sh->mu);
      for (int r = 0; r < G; ++r)
        if (!sh->done[size_t(r)]) msg += " rank " + std::to_string(r) + " " + (watch.where ? watch.where(r) : "") + ";";
      if (!sh->stop_done) msg += " the watchdog is still aborting the communicators;";
    }
    msg += " ending the process";
    if (watch.give_up) watch.give_up(msg);
    else print_and_exit(msg);
  }
  for (auto& t : ts) t.join();
  if (stopper.joinable()) stopper.join();
  std::lock_guard<std::mutex> lk(sh->mu);
  return sh->errors;
}

}  // namespace burstlab::nccl
