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

namespace detail {

std::shared_ptr<RankState> rank_state(int G) {
  auto sh = std::make_shared<RankState>();
  sh->done.assign(size_t(G), 0);
  sh->errors.assign(size_t(G), "");
  return sh;
}

std::string rank_error(int r, const std::exception* e) {
  if (!e) return "rank " + std::to_string(r) + ": unknown exception";
  std::string err = e->what();
  return err.empty() ? "rank " + std::to_string(r) + ": an exception without a message" : err;
}

void rank_ended(RankState& sh, FailureBoard& board, int r, std::string err) {
  if (!err.empty()) board.report(err);
  std::lock_guard<std::mutex> lk(sh.mu);
  sh.errors[size_t(r)] = std::move(err);
  sh.done[size_t(r)] = 1;
  ++sh.ended;
  sh.cv.notify_all();
}

}  // namespace detail

std::vector<std::string> watch_ranks(RankThreads& t, FailureBoard& board, const RankWatch& watch) {
  const std::shared_ptr<detail::RankState>& sh = t.state;
  const int G = static_cast<int>(sh->done.size());
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
  for (auto& th : t.threads) th.join();
  if (stopper.joinable()) stopper.join();
  std::lock_guard<std::mutex> lk(sh->mu);
  return sh->errors;
}

}  // namespace burstlab::nccl
