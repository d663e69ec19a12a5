// tests/tools/test_resources.cpp — tools/resources.cpp: the memory estimates against heap peaks
// measured by tools/memcount.cpp (linked into this executable, as into burstlab: it counts every
// malloc of the process), the byte arithmetic that saturates instead of overflowing, reading the
// memory available, and the refusal's message. Nothing here allocates more than ~100 MB.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

#include "burstlab/error.hpp"
#include "burstlab/lmhead.hpp"
#include "algorithm.hpp"
#include "common.hpp"
#include "cpu_engine.hpp"
#include "cpu_lmhead.hpp"
#include "harness.hpp"
#include "lmhead_check.hpp"
#include "memcount.hpp"
#include "resources.hpp"
#include "session.hpp"

namespace burstlab::tools {
namespace {

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

const Impl& impl_named(const std::string& name) { return *find_impls(name).at(0); }

// OpenMP threads for the measurements: 1, so that no thread's allocation can miss another's
// (with 2 threads the estimate counts both buffers; one thread may finish before the other starts).
struct OneThread {
  int before = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(before); }
};

// Peak heap bytes of f() above what was live before it.
template <class F>
int64_t measured_peak(F&& f) {
  heap_reset_peak();
  const int64_t base = heap_live();
  f();
  return heap_peak() - base;
}

// The estimate must cover the measured peak (the refusal relies on it) and stay close to it
// (a figure that is 10x too big would refuse problems that fit). 25% by default: the estimate
// rounds up per-buffer slack and counts a few buffers over their whole step.
void expect_close_above(int64_t estimate, int64_t measured, const std::string& what, double within = 1.25) {
  std::printf("  %s: estimate %lld, measured %lld (x%.3f)\n", what.c_str(), static_cast<long long>(estimate),
              static_cast<long long>(measured), double(estimate) / double(measured));
  EXPECT_GE(estimate, measured) << what << ": the estimate is below the measured heap peak";
  EXPECT_LE(double(estimate), within * double(measured)) << what << ": estimate " << estimate << " vs measured " << measured;
}

// ---------------------------------------------------------------- byte counts
TEST(Bytes, FormatInSIUnits) {
  EXPECT_EQ(format_bytes(0), "0 bytes");
  EXPECT_EQ(format_bytes(999), "999 bytes");
  EXPECT_EQ(format_bytes(1000), "1.0 kB");
  EXPECT_EQ(format_bytes(999999), "1.0 MB");  // not "1000.0 kB"
  EXPECT_EQ(format_bytes(320000000000), "320.0 GB");
  EXPECT_EQ(format_bytes(23668012LL * 1024), "24.2 GB");
  EXPECT_EQ(format_bytes(kTooMany), "more than 9.2 EB");
}

TEST(Bytes, SaturateInsteadOfOverflowing) {
  EXPECT_EQ(bytes_mul(int64_t(1) << 31, int64_t(1) << 31), int64_t(1) << 62);
  EXPECT_EQ(bytes_mul(int64_t(1) << 32, int64_t(1) << 31), kTooMany);
  EXPECT_EQ(bytes_mul(kTooMany, 2), kTooMany);
  EXPECT_EQ(bytes_mul(0, kTooMany), 0);
  EXPECT_EQ(bytes_add(kTooMany, 1), kTooMany);
  EXPECT_EQ(bytes_add(40, 2), 42);
  EXPECT_THROW(bytes_mul(-1, 8), Error);
}

// ---------------------------------------------------------------- estimates
Problem shape(int64_t B, int64_t H_q, int64_t H_kv, int64_t N_q, int64_t N_k, int64_t d) {
  Problem p;  // not validated: the estimate must handle any size
  p.B = B; p.H_q = H_q; p.H_kv = H_kv; p.N_q = N_q; p.N_k = N_k; p.d = d;
  return p;
}

TEST(Estimate, OracleOfTheIssueNeedsTerabytes) {
  // `burstlab run --nq 200000 --nk 200000` (B 1, H_q 4, H_kv 2, d 64) on 2 threads: the §9 backward
  // bounds hold 6 N_q x N_k fp64 per (b, kv-head) and thread.
  const Problem p = shape(1, 4, 2, 200000, 200000, 64);
  const MemNeed n = oracle_need(p, true, 2);
  const int64_t six_nn_two_threads = 2LL * 6 * 8 * 200000LL * 200000LL;  // 3.84e12
  EXPECT_GE(n.bytes, six_nn_two_threads);
  EXPECT_LE(n.bytes, six_nn_two_threads + six_nn_two_threads / 100);
  EXPECT_TRUE(has(n.step, "backward bounds")) << n.step;
  ASSERT_FALSE(n.parts.empty());
  EXPECT_TRUE(has(n.parts[0].what, "6 N_q x N_k fp64")) << n.parts[0].what;
  // Forward only: two N_q x N_k per (b, h), on min(2, B H_q) = 2 threads.
  const MemNeed f = oracle_need(p, false, 2);
  EXPECT_GE(f.bytes, 2LL * 2 * 8 * 200000LL * 200000LL);
  EXPECT_LT(f.bytes, n.bytes / 2);
  // One thread: half of it.
  EXPECT_LT(oracle_need(p, true, 1).bytes, n.bytes / 2 + n.bytes / 100);
}

TEST(Estimate, SampledOracleHasNoNxN) {
  // `burstlab run --nq 200000 --nk 200000 --check-rows 64 --impl cpu`: inputs and the cpu run
  // dominate; the oracle part is O(N) (spec §9.11).
  Case c;
  c.p = shape(1, 4, 2, 200000, 200000, 64);
  c.check_rows = 64;
  const MemNeed o = sampled_oracle_need(c.p, 64, true, 2);
  EXPECT_LT(o.bytes, 100LL * 1000 * 1000) << o.parts[0].what;
  const MemNeed n = case_need(c, find_impls("cpu"), 2);
  EXPECT_LT(n.bytes, 5LL * 1000 * 1000 * 1000);  // inputs in fp64 1.2 GB, the cpu run ~2 GB
  for (const MemPart& x : n.parts) EXPECT_FALSE(has(x.what, "N_q x N_k")) << x.what;
  c.check_rows = 0;
  EXPECT_GT(case_need(c, find_impls("cpu"), 2).bytes, 1000LL * 1000 * 1000 * 1000);
}

TEST(Estimate, SampledDistributedRunGathersNoOutputs) {
  // `run --algo ring --world 2 --check-rows K`: the check reads the sample and the rows' LSE, D
  // through the World (gather.hpp), so neither the gathered outputs nor their fp64 copies are held.
  const Problem p = shape(1, 32, 32, 1 << 20, 1 << 20, 128);
  const Footprint whole = distributed_footprint(2, 2, cpu_engine_footprint());
  const Footprint sampled = distributed_footprint(2, 2, cpu_engine_footprint(), true);
  const MemNeed w = make_need("", whole(p, Dtype::F32, ImplOptions{}, true, 2));
  const MemNeed s = make_need("", sampled(p, Dtype::F32, ImplOptions{}, true, 2));
  const int64_t outputs = 4LL * (2 * 32LL * (1 << 20) * 128 * 2 + 32LL * (1 << 20));  // O, dQ, dK, dV, LSE in fp32
  EXPECT_GE(w.bytes - s.bytes, 2 * outputs);
  for (const MemPart& x : s.parts) {
    EXPECT_FALSE(has(x.what, "gathered outputs")) << x.what;
    EXPECT_FALSE(has(x.what, "fetched")) << x.what;
  }
}

TEST(Estimate, DistributedDevicePartsAreOneDevicesShare) {
  // 1M tokens, H = 32, d = 128, bf16 over NCCL with one rank per GPU: each GPU holds its rank's
  // shards, blocks and engine, half of what SimComm puts on one GPU; the host parts are the same.
  const Problem p = shape(1, 32, 32, 1 << 20, 1 << 20, 128);
  EngineFootprint gpu;
  gpu.what = "a device engine";
  gpu.device = true;
  gpu.block_call = [](const Problem&, int64_t rows, Dtype, const ImplOptions&, int) { return 1000 * rows; };
  const auto need = [&](int ranks_per_device) {
    return make_need("", distributed_footprint(2, 2, gpu, true, ranks_per_device)(p, Dtype::BF16, ImplOptions{}, true, 2));
  };
  const MemNeed sim = need(0), one = need(1), both = need(2);
  EXPECT_EQ(sim.device_bytes, both.device_bytes);
  EXPECT_EQ(sim.bytes, one.bytes);  // bytes: the host parts
  EXPECT_EQ(2 * one.device_bytes, sim.device_bytes);
  // Q, K, V, dO, O, dQ, dK, dV of the whole problem in bf16 are 8 x 8 GiB: one GPU of two holds
  // half of them, beside its blocks in flight.
  EXPECT_GE(one.device_bytes, 32LL << 30);
  bool named = false;
  for (const MemPart& x : one.parts) named = named || has(x.what, "on each device (1 of the 2 ranks)");
  EXPECT_TRUE(named);
  // A host engine's parts are the whole world's whatever is asked.
  const MemNeed cpu = make_need("", distributed_footprint(2, 2, cpu_engine_footprint(), true, 1)(p, Dtype::F32, ImplOptions{}, true, 2));
  const MemNeed cpu_all = make_need("", distributed_footprint(2, 2, cpu_engine_footprint(), true)(p, Dtype::F32, ImplOptions{}, true, 2));
  EXPECT_EQ(cpu.bytes, cpu_all.bytes);
}

TEST(Estimate, InputsAreCountedInTheirStorageType) {
  // 1M tokens, H = 32, d = 128: 2^32 elements a tensor, 4 tensors; bf16 and fp16 2 bytes an
  // element (34.4 GB), fp32 4, fp64 8 (137 GB). The full oracle's fp64 copies of narrower inputs
  // are counted where it runs: Q, K, V (and dO for a backward).
  const Problem p = shape(1, 32, 32, int64_t(1) << 20, int64_t(1) << 20, 128);
  const int64_t elements = int64_t(4) << 32;
  for (auto [dt, bytes] : {std::pair{Dtype::BF16, 2}, {Dtype::F16, 2}, {Dtype::F32, 4}, {Dtype::F64, 8}}) {
    const std::vector<MemPart> parts = inputs_footprint(p, dt);
    ASSERT_FALSE(parts.empty());
    EXPECT_EQ(parts[0].bytes, bytes * elements) << to_string(dt);
    EXPECT_NE(parts[0].what.find(to_string(dt)), std::string::npos) << parts[0].what;
    EXPECT_EQ(inputs_widened(p, dt, true).bytes, dt == Dtype::F64 ? 0 : 8 * elements) << to_string(dt);
    EXPECT_EQ(inputs_widened(p, dt, false).bytes, dt == Dtype::F64 ? 0 : 8 * (elements / 4 * 3)) << to_string(dt);
  }
  EXPECT_EQ(inputs_footprint(p, Dtype::BF16)[0].bytes, int64_t(34359738368));
}

TEST(Estimate, OverflowIsTooManyNotUndefined) {
  // N_q x N_k = 2^80: beyond int64 (validate() refuses such a problem; the estimate must not be UB
  // either way).
  const Problem p = shape(1, 1, 1, int64_t(1) << 40, int64_t(1) << 40, 64);
  EXPECT_EQ(oracle_need(p, true, 2).bytes, kTooMany);
  EXPECT_EQ(make_need("", reference_footprint(p, Dtype::F32, ImplOptions{}, true, 2)).bytes, kTooMany);
  // B x H_q = 2^80 elements per row statistic: every product saturates.
  const Problem q = shape(int64_t(1) << 40, int64_t(1) << 40, int64_t(1) << 40, 1, 1, 1);
  EXPECT_EQ(make_need("", inputs_footprint(q, Dtype::F64)).bytes, kTooMany);
  EXPECT_EQ(oracle_need(q, true, 2).bytes, kTooMany);
  EXPECT_EQ(make_need("", cpu_footprint(q, Dtype::F32, ImplOptions{}, true, 2)).bytes, kTooMany);
  EXPECT_EQ(make_need("", distributed_footprint(/*kv_shards=*/2, 4, cpu_engine_footprint())(q, Dtype::F32, ImplOptions{}, true, 2)).bytes, kTooMany);
}

TEST(Estimate, ThreadsFollowTheLayers) {
  // reference.cpp and tolerance.cpp: parallel over (b, h) items only when B H_q N_q N_k d >= 2^16
  EXPECT_EQ(reference::region_threads(shape(1, 4, 2, 16, 16, 8), 4, 8), 1);      // 8192 < 2^16: serial
  EXPECT_EQ(reference::region_threads(shape(1, 4, 2, 128, 128, 64), 4, 8), 4);   // min(threads, items)
  EXPECT_EQ(reference::region_threads(shape(1, 4, 2, 128, 128, 64), 2, 8), 2);
  EXPECT_EQ(reference::region_threads(shape(1, 4, 2, 128, 128, 64), 1, 8), 1);   // one item: serial
  // cpu: every thread of the team makes its Scratch, however few tasks there are.
  const Problem p = shape(1, 1, 1, 1000, 1000, 64);
  ImplOptions big{512, 512};
  const int64_t one = make_need("", cpu_footprint(p, Dtype::F32, big, false, 1)).bytes;
  const int64_t four = make_need("", cpu_footprint(p, Dtype::F32, big, false, 4)).bytes;
  EXPECT_GE(four - one, 3 * 2 * 512 * 512 * 4);  // 3 more threads x (S, dP tiles of 512 x 512 fp32)
}

TEST(Estimate, OracleCoversTheMeasuredHeap) {
  if (!heap_counting()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  OneThread one;
  for (bool backward : {false, true}) {
    const Problem p = make_problem(1, 2, 1, 768, 640, 16, "causal+document:3", 7, nullptr);
    Case c;
    c.p = p;
    c.pass.bwd = backward;
    const int64_t measured = measured_peak([&] {
      const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 7);
      const Oracle o = run_oracle(p, in, backward);
    });
    expect_close_above(case_need(c, {}, 1).bytes, measured, backward ? "oracle fwd+bwd" : "oracle fwd");
  }
}

TEST(Estimate, EachImplementationCoversItsMeasuredHeap) {
  if (!heap_counting()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  OneThread one;
  struct Run {
    const char* impl;
    Dtype dtype;
    ImplOptions opt;
    Problem p;
  };
  const Run runs[] = {
      {"reference", Dtype::F32, {}, make_problem(1, 2, 1, 700, 900, 32, "none", 1, nullptr)},
      {"reference", Dtype::F64, {}, make_problem(2, 2, 2, 500, 300, 8, "causal", 1, nullptr)},
      {"cpu", Dtype::F32, {}, make_problem(1, 4, 2, 1000, 1200, 64, "causal", 1, nullptr)},
      {"cpu", Dtype::F64, {512, 384}, make_problem(1, 2, 1, 1000, 900, 16, "document:3", 1, nullptr)},
  };
  for (const Run& r : runs) {
    const Impl& m = impl_named(r.impl);
    const Inputs in = make_inputs(r.p, Layout::BSHD, r.dtype, 1);
    // As run_case does: prepare, forward, fetch (kept while checked), backward, fetch.
    const int64_t measured = measured_peak([&] {
      Runner run = m.prepare(r.p, in, r.opt);
      run.forward();
      {
        Tensor4<double> O;
        Tensor3<double> LSE;
        run.fetch_forward(O, LSE);
      }
      run.backward();
      Tensor4<double> dQ, dK, dV;
      run.fetch_backward(dQ, dK, dV);
    });
    const int64_t estimate = make_need("", m.footprint(r.p, r.dtype, r.opt, true, 1)).bytes;
    expect_close_above(estimate, measured, std::string(r.impl) + " " + to_string(r.dtype) + " " + shape_string(r.p));
  }
}

TEST(Estimate, RunCaseCoversTheMeasuredHeap) {
  if (!heap_counting()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  OneThread one;
  Case c;
  c.p = make_problem(1, 4, 2, 600, 700, 32, "causal+block:64x64@0.5", 3, nullptr);
  c.dtype = Dtype::F32;
  c.seed = 3;
  const std::vector<const Impl*> impls = find_impls("reference,cpu");
  const int64_t measured = measured_peak([&] {
    const std::vector<Result> rs = run_case(c, impls, 1);
    for (const Result& r : rs) EXPECT_TRUE(r.pass_ok()) << r.impl << " " << r.pass << " " << r.error;
  });
  expect_close_above(case_need(c, impls, 1).bytes, measured, "run_case reference,cpu");
  // Two threads: every thread's buffers are counted, so the estimate covers the peak however the
  // threads' work overlaps in time.
  omp_set_num_threads(2);
  const int64_t measured2 = measured_peak([&] { run_case(c, impls, 1); });
  EXPECT_GE(case_need(c, impls, 2).bytes, measured2);
}

TEST(Estimate, RunCaseSampledCoversTheMeasuredHeap) {
  if (!heap_counting()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  OneThread one;
  Case c;
  c.p = make_problem(1, 2, 1, 3000, 2500, 16, "causal+document:3", 3, nullptr);
  c.dtype = Dtype::F32;
  c.seed = 3;
  c.check_rows = 32;
  const std::vector<const Impl*> impls = find_impls("cpu");
  const int64_t measured = measured_peak([&] {
    const std::vector<Result> rs = run_case(c, impls, 1);
    for (const Result& r : rs) EXPECT_TRUE(r.pass_ok()) << r.impl << " " << r.pass << " " << r.error;
  });
  expect_close_above(case_need(c, impls, 1).bytes, measured, "run_case cpu --check-rows 32");
}

// ---------------------------------------------------------------- what the machine has
std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "burstlab_res_" + std::to_string(getpid()) + "_" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}
void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Available, MeminfoIsReadInKilobytes) {
  EXPECT_EQ(parse_meminfo_available("MemTotal:       24576000 kB\nMemFree:  1 kB\nMemAvailable:   23668012 kB\n"),
            23668012LL * 1024);
  EXPECT_EQ(parse_meminfo_available("MemTotal: 1 kB\n"), -1);  // old kernels: no MemAvailable line
}

TEST(Available, CgroupLimitLeftCountsInactiveCacheAsFree) {
  const std::string v2 = temp_dir("v2");
  write(v2 + "/memory.max", "8000000000\n");
  write(v2 + "/memory.current", "3000000000\n");
  write(v2 + "/memory.stat", "anon 2000000000\nfile 1000000000\ninactive_file 600000000\n");
  EXPECT_EQ(cgroup_dir_available(v2), 8000000000LL - (3000000000LL - 600000000LL));
  write(v2 + "/memory.max", "max\n");
  EXPECT_EQ(cgroup_dir_available(v2), -1);  // unlimited
  const std::string v1 = temp_dir("v1");
  write(v1 + "/memory.limit_in_bytes", "4294967296\n");
  write(v1 + "/memory.usage_in_bytes", "1073741824\n");
  write(v1 + "/memory.stat", "cache 5\ntotal_inactive_file 73741824\n");
  EXPECT_EQ(cgroup_dir_available(v1), 4294967296LL - 1000000000LL);
  write(v1 + "/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  EXPECT_EQ(cgroup_dir_available(v1), -1);
  EXPECT_EQ(cgroup_dir_available(temp_dir("none")), -1);
}

TEST(Available, EnvironmentOverridesAndIsValidated) {
  setenv("BURSTLAB_MEMORY_AVAILABLE", "123456789", 1);
  MemAvailable a = memory_available();
  EXPECT_EQ(a.bytes, 123456789);
  EXPECT_EQ(a.source, "BURSTLAB_MEMORY_AVAILABLE");
  setenv("BURSTLAB_MEMORY_AVAILABLE", "12GB", 1);
  EXPECT_THROW(memory_available(), Error);
  unsetenv("BURSTLAB_MEMORY_AVAILABLE");
  a = memory_available();
#ifdef __linux__
  EXPECT_GT(a.bytes, 0);  // this machine: MemAvailable or a cgroup limit
  EXPECT_FALSE(a.source.empty());
#endif
}

TEST(Available, ProcessesOfOneHostShareIt) {
  // mpirun -np 2 on one host: each process holds its own inputs and oracle, so each may count on
  // half of what the host has (an over-estimate let both start and the kernel's OOM killer end them).
  unsetenv("BURSTLAB_MEMORY_AVAILABLE");
  unsetenv("MPI_LOCALNRANKS");
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const MemAvailable one = memory_available();
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  const MemAvailable two = memory_available();
  EXPECT_EQ(local_processes(), 2);
#ifdef __linux__
  if (one.source.rfind("RLIMIT_AS", 0) != 0 && two.source.rfind("RLIMIT_AS", 0) != 0) {
    EXPECT_NE(two.source.find(" / 2 processes of this host (mpirun)"), std::string::npos) << two.source;
    EXPECT_NEAR(double(two.bytes) / double(one.bytes), 0.5, 0.05) << one.bytes << " " << two.bytes;  // MemAvailable moves a little
  }
#endif
  setenv("BURSTLAB_MEMORY_AVAILABLE", "1000", 1);  // the user's figure is this process's own
  EXPECT_EQ(memory_available().bytes, 1000);
  unsetenv("BURSTLAB_MEMORY_AVAILABLE");
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "two", 1);
  EXPECT_THROW(memory_available(), Error);
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  setenv("MPI_LOCALNRANKS", "4", 1);
  EXPECT_EQ(local_processes(), 4);
  unsetenv("MPI_LOCALNRANKS");
  EXPECT_EQ(local_processes(), 1);
}

TEST(Available, AddressSpaceLimitLessWhatIsMappedAndThreads) {
  EXPECT_EQ(parse_statm_size("765 431 403 5 0 123 0\n", 4096), 765LL * 4096);
  EXPECT_EQ(parse_statm_size("", 4096), -1);
  struct rlimit before {};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &before), 0);
  if (before.rlim_cur != RLIM_INFINITY) GTEST_SKIP() << "this process runs under a limit already";
  EXPECT_EQ(address_space_available(1).bytes, -1);  // no limit: nothing from RLIMIT_AS
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  statm >> pages;
  const int64_t mapped = pages * sysconf(_SC_PAGESIZE), room = int64_t(4) << 30;
  struct rlimit lim = before;
  lim.rlim_cur = static_cast<rlim_t>(mapped + room);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lim), 0);
  const MemAvailable one = address_space_available(1), three = address_space_available(3);
  setrlimit(RLIMIT_AS, &before);
  EXPECT_LT(one.bytes, room);
  EXPECT_GT(one.bytes, room - (int64_t(64) << 20)) << one.source;  // what this test mapped since, and the slack
  EXPECT_TRUE(has(one.source, "RLIMIT_AS: ulimit -v ")) << one.source;
  EXPECT_TRUE(has(one.source, "kept for malloc and 1 thread")) << one.source;
  // Each further thread: its stack and two 64 MiB malloc heaps.
  EXPECT_LE(three.bytes, one.bytes - 2 * (int64_t(128) << 20)) << three.source;
}

// ---------------------------------------------------------------- the refusal
TEST(Refusal, NamesNeededAvailableLargestPartAndAdvice) {
  const MemNeed need = make_need("the step", {{"small", 1000}, {"big part", 320000000000}});
  const MemAvailable avail{23400000000, "MemAvailable"};
  try {
    require_memory(need, avail, [] { return std::string("use --threads 1"); });
    FAIL() << "no refusal";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "not enough memory for the step: 320.0 GB needed, 23.4 GB available (MemAvailable); the largest "
              "part: big part = 320.0 GB; use --threads 1");
  }
  bool asked = false;
  EXPECT_NO_THROW(require_memory(need, MemAvailable{need.bytes, "x"}, [&] { asked = true; return std::string(); }));
  EXPECT_NO_THROW(require_memory(need, MemAvailable{}, [&] { asked = true; return std::string(); }));  // unknown
  EXPECT_FALSE(asked) << "advice computed although the problem fits";
}

TEST(Refusal, LargestFittingLength) {
  auto under = [](int64_t limit) { return [limit](int64_t nq, int64_t nk) { return nq * nk <= limit; }; };
  EXPECT_EQ(largest_fitting_length(200000, 200000, under(1000000)), 1000);
  EXPECT_EQ(largest_fitting_length(int64_t(1) << 40, 203, under(100000000)), 492000);  // 492610, 3 digits
  EXPECT_EQ(largest_fitting_length(200000, 200000, under(0)), 0);
  EXPECT_EQ(largest_fitting_length(5, 7, under(1000)), 7);
}

TEST(OutOfMemory, MessageNamesTheStepItsBytesAndTheAdvice) {
  std::string msg;
  try {
    Allocating step("generating the inputs", 4500000000000000LL);
    throw std::bad_alloc();
  } catch (const std::bad_alloc& e) {
    msg = out_of_memory_message(e, "use a smaller problem (--nq)");
  }
  EXPECT_TRUE(has(msg, "out of memory (std::bad_alloc) while generating the inputs (estimated 4.5 PB)")) << msg;
  EXPECT_TRUE(has(msg, "available")) << msg;
  EXPECT_TRUE(has(msg, "use a smaller problem (--nq)")) << msg;
  // Forgotten once reported; a step that ended normally is not blamed.
  { Allocating done("a step that finished", 1); }
  msg = out_of_memory_message(std::bad_alloc());
  EXPECT_FALSE(has(msg, "while")) << msg;
}

// A step of at least its announce size says on stderr when it starts and how it ended; a smaller
// one says nothing.
TEST(Progress, LargeStepsAnnounceTheirStartAndEnd) {
  testing::internal::CaptureStderr();
  { Allocating small("a small step", 1000, 1001); }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  { Allocating large("generating the inputs", 3000000000LL, 1001); }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(err, "burstlab: generating the inputs (estimated 3.0 GB) ...\n")) << err;
  EXPECT_TRUE(has(err, "burstlab: generating the inputs: done after ")) << err;
  testing::internal::CaptureStderr();
  try {
    Allocating failing("running the oracle", 5000, 1001);
    throw std::bad_alloc();
  } catch (const std::bad_alloc&) {
  }
  err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(err, "burstlab: running the oracle: failed after ")) << err;
  out_of_memory_message(std::bad_alloc());  // forget the failed step
}

}  // namespace
}  // namespace burstlab::tools

namespace burstlab::tools {
namespace {

// cpu::lmhead_workspace_bytes (the LM head's footprint in `run --op lmhead-ce`) against the heap
// peak of the calls it describes: it must cover the peak and not be far above it (its GEMM packing
// term is a bound, hence 1.5x rather than 1.25x).
TEST(Estimate, LmHeadWorkspaceCoversTheMeasuredHeap) {
  if (!heap_counting()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  OneThread one;
  LmHeadProblem p;
  p.N = 700;
  p.d = 96;
  p.V = 5003;
  p.label_smoothing = 0.1;
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F32, 3, Values::Normal, 0.1);
  for (Dtype t : {Dtype::F32, Dtype::BF16})
    for (bool backward : {false, true}) {
      const cpu::LmHeadTiles tiles{128, 512};
      int64_t measured = 0;
      if (t == Dtype::F32) {
        Matrix<float> H = make_matrix<float>(p.N, p.d), W = make_matrix<float>(p.V, p.d);
        for (size_t e = 0; e < H.data.size(); ++e) H.data[e] = float(in.H.data[e]);
        for (size_t e = 0; e < W.data.size(); ++e) W.data[e] = float(in.W.data[e]);
        Matrix<float> dH = make_matrix<float>(p.N, p.d), dW = make_matrix<float>(p.V, p.d);
        std::vector<float> LSE(static_cast<size_t>(p.N));
        measured = measured_peak([&] {
          if (backward) cpu::lmhead_fused<float>(p, H.view(), W.view(), in.y.data(), 1.0, LSE.data(), dH.view(), dW.view(), tiles);
          else cpu::lmhead_forward<float>(p, H.view(), W.view(), in.y.data(), LSE.data(), tiles);
        });
      } else {
        Matrix<bf16_t> H = make_matrix<bf16_t>(p.N, p.d), W = make_matrix<bf16_t>(p.V, p.d);
        for (size_t e = 0; e < H.data.size(); ++e) H.data[e] = bf16_t(float(in.H.data[e]));
        for (size_t e = 0; e < W.data.size(); ++e) W.data[e] = bf16_t(float(in.W.data[e]));
        Matrix<bf16_t> dH = make_matrix<bf16_t>(p.N, p.d), dW = make_matrix<bf16_t>(p.V, p.d);
        std::vector<float> LSE(static_cast<size_t>(p.N));
        measured = measured_peak([&] {
          if (backward) cpu::lmhead_fused<bf16_t>(p, H.view(), W.view(), in.y.data(), 1.0, LSE.data(), dH.view(), dW.view(), tiles);
          else cpu::lmhead_forward<bf16_t>(p, H.view(), W.view(), in.y.data(), LSE.data(), tiles);
        });
      }
      const int64_t estimate = cpu::lmhead_workspace_bytes(p, t, backward, tiles, 1);
      const std::string what = "cpu lmhead " + to_string(t) + (backward ? " fused" : " forward");
      std::printf("  %s: estimate %lld, measured %lld (x%.3f)\n", what.c_str(), static_cast<long long>(estimate),
                  static_cast<long long>(measured), double(estimate) / double(measured));
      EXPECT_GE(estimate, measured) << what;
      EXPECT_LE(double(estimate), 1.5 * double(measured)) << what;
    }
}

}  // namespace
}  // namespace burstlab::tools

namespace burstlab::tools {
namespace {

// `run --algo`'s estimate of what every rank holds (distributed_footprint, sampled: no gathered
// outputs) against the heap peak of a Session on SimComm with the CPU engine, forward and
// backward: B = 2 and GQA; G = 9 puts Attention2D on a 3 x 3 grid (its columns hold 3 shards).
// Within 2x, not 25%: the estimate holds every phase's blocks in flight, and the rings' arriving
// partial sums, at once (the rings measure x1.76-1.87 here).
TEST(Estimate, DistributedSessionsCoverTheirMeasuredHeap) {
  if (!heap_counting()) GTEST_SKIP() << "malloc interposition not in effect (sanitizer build)";
  OneThread one;
  const Problem p = make_problem(2, 8, 4, 1200, 1100, 16, "causal", 5, nullptr);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 5);
  auto engine = cpu::make_engine<float>();
  for (int G : {2, 4, 9}) {
    for (const dist::Algorithm& a : dist::algorithms()) {
      const bool by_heads = a.ulysses_groups || std::string(a.name) == "ulysses";
      if (G == 9 && by_heads) continue;  // H_kv = 4 heads do not split over 9 ranks
      dist::AlgoOptions o;
      o.algo = a.name;
      o.world = G;
      o.partition = a.partition.value_or(dist::PartitionKind::Zigzag);
      if (a.ulysses_groups) o.ulysses_degree = 2;
      if (a.node_rings) o.gpus_per_node = G == 9 ? 3 : 2;
      const int64_t measured = measured_peak([&] {
        dist::Session<float> s(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
        s.forward();
        s.backward();
      });
      const Footprint f = distributed_footprint(dist::held_kv_shards(o), o.world, cpu_engine_footprint(), true);
      expect_close_above(make_need("", f(p, Dtype::F32, {}, true, 1)).bytes, measured,
                         std::string(a.name) + " G=" + std::to_string(G), 2.0);
    }
  }
}

}  // namespace
}  // namespace burstlab::tools
