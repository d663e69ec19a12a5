// burstlab/parallel.hpp — exceptions and OpenMP regions.
// An exception may not leave an OpenMP structured block: the runtime calls std::terminate
// ("terminate called recursively", exit 134) instead of unwinding to the caller. So every
// parallel region of a layer runs its work through one FirstError: the first exception thrown
// on any thread is kept, the work left is skipped, and rethrow() raises that exception on the
// calling thread once the region has ended (std::bad_alloc stays std::bad_alloc, Error stays
// Error).
//
//   FirstError err;
//   #pragma omp parallel for
//   for (int64_t t = 0; t < n; ++t)
//     err.run([&] { ... });  // a return inside the lambda is the loop's `continue`
//   err.rethrow();
//
// Every thread still reaches each worksharing loop and barrier of the region (skipped work is
// a cheap early return), so a failure never leaves a thread waiting.
#pragma once

#include <atomic>
#include <exception>
#include <utility>

namespace burstlab {

class FirstError {
 public:
  // Runs f() unless some thread has failed already; keeps the first exception f() throws.
  template <class F>
  void run(F&& f) noexcept {
    if (failed()) return;
    try {
      std::forward<F>(f)();
    } catch (...) {
      bool expected = false;
      if (claimed_.compare_exchange_strong(expected, true)) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  // After the region (its closing barrier orders first_'s write before this read).
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::atomic<bool> claimed_{false};
  std::exception_ptr first_;
};

}  // namespace burstlab
