// tests/cpu/test_omp_errors.cpp — an exception thrown inside an OpenMP region of reference/ or
// cpu/ reaches the caller as that exception (burstlab/parallel.hpp), instead of
// std::terminate ("terminate called recursively", exit 134). The allocation failure is real: this
// executable interposes malloc and refuses blocks above a limit while a test sets one, so the
// N_q x N_k buffers of reference/ and tolerance.cpp, and cpu/'s per-thread tiles, fail to
// allocate (std::bad_alloc) inside their regions, on 2 threads, without using much memory.
// Without the guards, this process aborts and every test here fails.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "burstlab/parallel.hpp"
#include "cpu.hpp"
#include "harness.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define BURSTLAB_FAIL_MALLOC 1  // sanitizers interpose malloc themselves: no refusal there
#endif

namespace {
std::atomic<size_t> g_limit{SIZE_MAX};  // malloc refuses blocks larger than this
}

#ifdef BURSTLAB_FAIL_MALLOC
extern "C" {
void* __libc_malloc(size_t);
// operator new and Eigen's aligned_malloc allocate through malloc.
void* malloc(size_t n) {
  if (n > g_limit.load(std::memory_order_relaxed)) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_malloc(n);
}
}
#endif

namespace burstlab {
namespace {

// While alive: malloc refuses blocks above `bytes`; 2 OpenMP threads.
struct RefuseAbove {
  int threads = omp_get_max_threads();
  explicit RefuseAbove(size_t bytes) {
    omp_set_num_threads(2);
    g_limit = bytes;
  }
  ~RefuseAbove() {
    g_limit = SIZE_MAX;
    omp_set_num_threads(threads);
  }
};

bool refusal_works() {
#ifdef BURSTLAB_FAIL_MALLOC
  RefuseAbove limit(1000);
  void* (*volatile alloc)(size_t) = &malloc;  // not elided
  void* p = alloc(4000);
  const bool refused = p == nullptr;
  if (p) free(p);
  return refused;
#else
  return false;
#endif
}

// 512 x 512 fp64 is 2 MiB per (b, h): above the 1 MiB limit. The inputs are made before it.
Problem problem() {
  Problem p;
  p.B = 1; p.H_q = 2; p.H_kv = 1; p.N_q = 512; p.N_k = 512; p.d = 16;
  return p;
}
constexpr size_t kLimit = size_t(1) << 20;

TEST(FirstError, KeepsTheFirstExceptionAndRethrowsItAfterTheRegion) {
  FirstError err;
  std::atomic<int> ran{0};
#pragma omp parallel for num_threads(2) schedule(dynamic, 1)
  for (int i = 0; i < 1000; ++i) err.run([&] {
    ++ran;
    if (i == 37) throw std::runtime_error("item 37");
    // Later items wait for the failure: a thread descheduled inside item 37 must not let the
    // other one run every item before it is recorded. Item 37 was handed out before them.
    if (i > 37)
      while (!err.failed()) std::this_thread::yield();
  });
  EXPECT_TRUE(err.failed());
  try {
    err.rethrow();
    FAIL() << "nothing rethrown";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "item 37");
  }
  EXPECT_LT(ran.load(), 1000) << "work after the failure was not skipped";
}

TEST(FirstError, EveryThreadFailingStillEndsTheRegion) {
  FirstError err;
#pragma omp parallel num_threads(2)
  {
    err.run([] { throw std::bad_alloc(); });  // e.g. per-thread scratch
#pragma omp for
    for (int i = 0; i < 10; ++i) err.run([] {});
  }
  EXPECT_THROW(err.rethrow(), std::bad_alloc);
  FirstError none;
#pragma omp parallel for num_threads(2)
  for (int i = 0; i < 10; ++i) none.run([] {});
  EXPECT_FALSE(none.failed());
  EXPECT_NO_THROW(none.rethrow());
}

TEST(OmpErrors, ReferenceForwardAndBackwardThrowBadAlloc) {
  if (!refusal_works()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  const Problem p = problem();
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 1);
  Tensor4<double> O = make_tensor4<double>(Layout::BHSD, p.B, p.H_q, p.N_q, p.d);
  Tensor3<double> LSE = make_tensor3<double>(p.B, p.H_q, p.N_q);
  Tensor4<double> dQ = O, dK = in.K.f64(), dV = in.V.f64();
  {
    RefuseAbove limit(kLimit);
    EXPECT_THROW(reference::forward<double>(p, in.Q.f64().view(), in.K.f64().view(), in.V.f64().view(), O.view(), LSE.view()),
                 std::bad_alloc);
  }
  reference::forward<double>(p, in.Q.f64().view(), in.K.f64().view(), in.V.f64().view(), O.view(), LSE.view());  // recovers
  RefuseAbove limit(kLimit);
  EXPECT_THROW(reference::backward<double>(p, in.Q.f64().view(), in.K.f64().view(), in.V.f64().view(), as_const(O.view()),
                                           in.dO.f64().view(), as_const(LSE.view()), dQ.view(), dK.view(), dV.view()),
               std::bad_alloc);
}

TEST(OmpErrors, OracleAndBoundsThrowBadAlloc) {
  if (!refusal_works()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  const Problem p = problem();
  const Inputs in = as_fp64(make_inputs(p, Layout::BSHD, Dtype::F32, 2));
  const Oracle o = run_oracle(p, in, true);
  RefuseAbove limit(kLimit);
  EXPECT_THROW(run_oracle(p, in, true), std::bad_alloc);
  EXPECT_THROW(forward_bounds(p, Dtype::F32, in.Q.f64().view(), in.K.f64().view(), in.V.f64().view()), std::bad_alloc);
  EXPECT_THROW(backward_bounds(p, Dtype::F32, in.Q.f64().view(), in.K.f64().view(), in.V.f64().view(), o.O.view(), in.dO.f64().view(),
                               o.LSE.view()),
               std::bad_alloc);
}

TEST(OmpErrors, CpuTilesThatCannotBeAllocatedThrowBadAlloc) {
  if (!refusal_works()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  const Problem p = problem();
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 3);
  const Tensor4<float> Q = convert<float>(in.Q), K = convert<float>(in.K), V = convert<float>(in.V),
                       dO = convert<float>(in.dO);
  Tensor4<float> O = convert<float>(in.Q), dQ = O, dK = K, dV = V;
  Tensor3<float> LSE = make_tensor3<float>(p.B, p.H_q, p.N_q);
  const cpu::Tiles whole{512, 512};  // S and dP tiles of 512 x 512 fp32: 1 MiB each, per thread
  cpu::forward<float>(p, Q.view(), K.view(), V.view(), O.view(), LSE.view());  // default tiles: fine
  RefuseAbove limit(kLimit - 1);
  EXPECT_THROW(cpu::forward<float>(p, Q.view(), K.view(), V.view(), O.view(), LSE.view(), whole), std::bad_alloc);
  EXPECT_THROW(cpu::backward<float>(p, Q.view(), K.view(), V.view(), as_const(O.view()), dO.view(),
                                    as_const(LSE.view()), dQ.view(), dK.view(), dV.view(), whole),
               std::bad_alloc);
  // The default tiles still run under the same limit: only what does not fit fails.
  EXPECT_NO_THROW(cpu::forward<float>(p, Q.view(), K.view(), V.view(), O.view(), LSE.view()));
}

}  // namespace
}  // namespace burstlab
