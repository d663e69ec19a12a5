// tests/tools/test_cli_limits.cpp — the `burstlab` binary (BURSTLAB_EXE) on inputs beyond what
// its oracle can hold or compute: `oracle`, `check` and `conform` refuse a case that does not fit
// in memory as `run` does (tools/resources.hpp), `ulimit -v` (RLIMIT_AS) counted; non-finite
// inputs and logits that overflow fp64 are refused before computing (spec §1.4), exit 2 each.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "case.hpp"
#include "cli_run.hpp"
#include "npy.hpp"

namespace {

namespace fs = std::filesystem;
using namespace burstlab;

using burstlab::cli_test::Output;
using burstlab::cli_test::slurp;

// Runs `<prefix> burstlab <args>` (prefix: e.g. "ulimit -v 2000000;" or an environment assignment).
Output burstlab(const std::string& args, const std::string& prefix = "") { return burstlab::cli_test::run_burstlab(args, prefix); }

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "burstlab_limits_" + std::to_string(getpid()) + "_" + name;
  fs::remove_all(dir);
  return dir;
}

// A case directory written as `burstlab gen` writes one, of the given shape.
std::string write_case(const std::string& name, int64_t H, int64_t N, int64_t d, Dtype dtype, double scale) {
  check::CaseMeta m;
  m.name = name;
  m.p.B = 1;
  m.p.H_q = m.p.H_kv = H;
  m.p.N_q = m.p.N_k = N;
  m.p.d = d;
  m.p.scale = scale;
  m.dtype = dtype;
  m.seed = 5;
  m.mask_spec = "none";
  const std::string dir = temp_dir(name);
  check::write_case(dir, check::make_case(m));
  return dir;
}

// Sets element (b, h, n, k) of a BHSD .npy of shape (B, H, N, d) to x, keeping its dtype.
void poke(const std::string& path, int64_t b, int64_t h, int64_t n, int64_t k, double x) {
  check::NpyArray a = check::read_npy(path);
  ASSERT_EQ(a.shape.size(), 4u);
  const int64_t at = ((b * a.shape[1] + h) * a.shape[2] + n) * a.shape[3] + k;
  a.data[static_cast<size_t>(at)] = x;
  check::write_npy(path, a.dtype, a.shape, a.data.data(), a.data.size());
}

// ---------------------------------------------------------------- memory
// A case of N_q = N_k = 20000: its inputs are 1.3 MB, its oracle holds 6 N_q x N_k fp64 (19.2 GB).
class BigCase : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = write_case("big", 1, 20000, 4, Dtype::F32, 0.5); }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string dir_;
};
std::string BigCase::dir_;

TEST_F(BigCase, OracleCheckConformRefuseWhatDoesNotFit) {
  const std::string env = "BURSTLAB_MEMORY_AVAILABLE=4000000000";
  for (const std::string& args : {"oracle --case " + dir_ + " --threads 2",
                                  "check --case " + dir_ + " --candidate " + dir_ + " --threads 2",
                                  "conform --case " + dir_ + " --impl cpu --threads 2"}) {
    const Output o = burstlab(args, env);
    EXPECT_EQ(o.rc, 2) << args << "\n" << o.err;
    EXPECT_EQ(o.out, "") << args;
    EXPECT_TRUE(has(o.err, "error: not enough memory for case big: ")) << args << "\n" << o.err;
    EXPECT_TRUE(has(o.err, " GB needed, 4.0 GB available (BURSTLAB_MEMORY_AVAILABLE); the largest part: ")) << o.err;
    // What fits instead: the largest N of this shape (one thread is not enough at 19.2 GB).
    EXPECT_TRUE(has(o.err, "a case of this B, H_q, H_kv, d fits with N_q and N_k up to ")) << o.err;
    EXPECT_FALSE(has(o.err, "--threads 1")) << o.err;
  }
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "expected")) << "oracle wrote outputs although it refused";
}

// The suggested N fits: a case of that N, on 2 GB, is not refused.
TEST_F(BigCase, TheSuggestedLengthFits) {
  const Output o = burstlab("oracle --case " + dir_ + " --threads 1", "BURSTLAB_MEMORY_AVAILABLE=2000000000");
  ASSERT_EQ(o.rc, 2) << o.err;
  const std::string key = "fits with N_q and N_k up to ";
  const size_t at = o.err.find(key);
  ASSERT_NE(at, std::string::npos) << o.err;
  const int64_t n = std::stoll(o.err.substr(at + key.size()));
  EXPECT_GT(n, 1000) << o.err;
  EXPECT_LT(n, 20000) << o.err;
  const std::string small = write_case("fits", 1, n, 4, Dtype::F32, 0.5);
  const Output r = burstlab("oracle --case " + small + " --threads 1", "BURSTLAB_MEMORY_AVAILABLE=2000000000");
  EXPECT_EQ(r.rc, 0) << "suggested N = " << n << ":\n" << r.err;
  fs::remove_all(small);
}

// MemAvailable here: the RLIMIT_AS test needs it above the limit it sets.
int64_t meminfo_available_kb() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t v = -1;
  std::string unit;
  while (f >> key >> v) {
    if (key == "MemAvailable:") return v;
    std::getline(f, unit);
  }
  return -1;
}

TEST_F(BigCase, TheAddressSpaceLimitIsCounted) {
  // burstlab maps about 1 GB at start (its CUDA libraries when built with them): 3 GB of address
  // space leave it room to start and to refuse; without the limit the machine's memory would.
  const int64_t limit_kb = 3000000;
  if (meminfo_available_kb() <= limit_kb) GTEST_SKIP() << "MemAvailable is below the limit this test sets";
  const std::string ulimit = "ulimit -v " + std::to_string(limit_kb) + ";";
  for (const std::string& args : {"oracle --case " + dir_ + " --threads 1",
                                  "check --case " + dir_ + " --candidate " + dir_ + " --threads 1",
                                  "conform --case " + dir_ + " --impl cpu --threads 1",
                                  std::string("run --impl cpu --hq 1 --hkv 1 -d 4 --nq 20000 --nk 20000 --threads 1")}) {
    const Output o = burstlab(args, ulimit);
    EXPECT_EQ(o.rc, 2) << args << "\n" << o.err;
    EXPECT_TRUE(has(o.err, "error: not enough memory for ")) << args << "\n" << o.err;
    EXPECT_TRUE(has(o.err, " available (RLIMIT_AS: ulimit -v 3000000 kB less the ")) << args << "\n" << o.err;
    EXPECT_TRUE(has(o.err, " this process maps and ")) << o.err;
    EXPECT_FALSE(has(o.err, "out of memory")) << "refused only when an allocation failed:\n" << o.err;
  }
  // Threads count: each maps a stack and a malloc arena.
  const Output two = burstlab("run --impl cpu --hq 1 --hkv 1 -d 4 --nq 20000 --nk 20000 --threads 2", ulimit);
  EXPECT_TRUE(has(two.err, " kept for malloc and 2 threads)")) << two.err;
}

// A problem that fits under the limit runs: the limit does not refuse everything.
TEST(AddressSpace, WhatFitsUnderTheLimitRuns) {
  if (meminfo_available_kb() <= 3000000) GTEST_SKIP() << "MemAvailable is below the limit this test sets";
  const Output o = burstlab("run --impl cpu --nq 300 --nk 300 --threads 2", "ulimit -v 3000000;");
  EXPECT_EQ(o.rc, 0) << o.err;
}

// ---------------------------------------------------------------- non-finite inputs
class OneCase : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = write_case("one", 2, 24, 8, Dtype::F32, 0.25); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(OneCase, NonFiniteInputsAreRefusedNamingTensorCoordinatesAndValue) {
  ASSERT_EQ(burstlab("oracle --case " + dir_).rc, 0);  // the case as written is valid
  fs::remove_all(fs::path(dir_) / "expected");
  poke(dir_ + "/q.npy", 0, 1, 5, 3, std::nan(""));
  for (const std::string& args : {"oracle --case " + dir_, "check --case " + dir_ + " --candidate " + dir_,
                                  "conform --case " + dir_ + " --impl cpu"}) {
    const Output o = burstlab(args);
    EXPECT_EQ(o.rc, 2) << args << "\n" << o.out << o.err;
    EXPECT_EQ(o.out, "") << args;
    EXPECT_TRUE(has(o.err, dir_ + ": q.npy holds nan at (b=0, h=1, i=5, k=3): inputs must be finite (spec §1.4)"))
        << args << "\n" << o.err;
  }
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "expected")) << "oracle wrote outputs although it refused";
  poke(dir_ + "/q.npy", 0, 1, 5, 3, 0.5);
  poke(dir_ + "/k.npy", 0, 0, 7, 2, -HUGE_VAL);
  const Output k = burstlab("oracle --case " + dir_);
  EXPECT_EQ(k.rc, 2) << k.err;
  EXPECT_TRUE(has(k.err, "k.npy holds -inf at (b=0, h=0, j=7, k=2)")) << k.err;
  poke(dir_ + "/k.npy", 0, 0, 7, 2, 0.5);
  poke(dir_ + "/dO.npy", 0, 1, 23, 7, HUGE_VAL);
  const Output d = burstlab("oracle --case " + dir_);
  EXPECT_EQ(d.rc, 2) << d.err;
  EXPECT_TRUE(has(d.err, "dO.npy holds inf at (b=0, h=1, i=23, k=7)")) << d.err;
}

// A suite writes nothing when one of its cases is refused.
TEST_F(OneCase, ASuiteWithOneBadCaseWritesNothing) {
  const std::string suite = temp_dir("suite");
  fs::create_directories(suite);
  fs::copy(dir_, suite + "/a_good", fs::copy_options::recursive);
  fs::copy(dir_, suite + "/b_bad", fs::copy_options::recursive);
  poke(suite + "/b_bad/v.npy", 0, 0, 0, 0, std::nan(""));
  const Output o = burstlab("oracle --case " + suite);
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_TRUE(has(o.err, "b_bad: v.npy holds nan at (b=0, h=0, j=0, k=0)")) << o.err;
  EXPECT_FALSE(fs::exists(suite + "/a_good/expected")) << "the good case was written before the bad one was refused";
  fs::remove_all(suite);
}

// ---------------------------------------------------------------- logits beyond fp64
TEST(Logits, RunRefusesAScaleWhoseLogitsOverflowBeforeComputing) {
  for (const char* scale : {"1e308", "-1e307"}) {
    const Output o = burstlab(std::string("run --impl cpu --dtype fp64 --scale ") + scale);
    EXPECT_EQ(o.rc, 2) << scale << "\n" << o.out << o.err;
    EXPECT_EQ(o.out, "");
    EXPECT_TRUE(has(o.err, "error: the logits overflow fp64: scale (--scale) (")) << o.err;
    EXPECT_TRUE(has(o.err, "exceeds 8.99e+307 (half of fp64's largest number; spec §1.4")) << o.err;
    EXPECT_TRUE(has(o.err, "with these inputs |scale (--scale)| must be at most ")) << o.err;
  }
  // The largest scale it names is accepted by the overflow check (the run itself may still be
  // refused later by the §9 bounds' own range, but not for overflowing logits).
  const Output o = burstlab("run --impl cpu --dtype fp64 --scale 1e308");
  const std::string key = "must be at most ";
  const size_t at = o.err.find(key);
  ASSERT_NE(at, std::string::npos) << o.err;
  const double most = std::stod(o.err.substr(at + key.size())) * 0.99;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", most);
  const Output ok = burstlab(std::string("run --impl cpu --dtype fp64 --scale ") + buf);
  EXPECT_FALSE(has(ok.err, "the logits overflow")) << buf << "\n" << ok.err;
}

TEST_F(OneCase, ACaseWhoseScaleOverflowsTheLogitsIsRefused) {
  // case.json's scale rewritten to 1e308: the file is valid JSON and the scale finite.
  const std::string path = dir_ + "/case.json";
  std::string json = slurp(path);
  const size_t at = json.find("\"scale\":");
  ASSERT_NE(at, std::string::npos);
  const size_t end = json.find_first_of(",\n}", at);
  json.replace(at, end - at, "\"scale\": 1e308");
  std::ofstream(path) << json;
  const Output o = burstlab("oracle --case " + dir_);
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_TRUE(has(o.err, "the logits overflow fp64: scale (case.json) (1e+308)")) << o.err;
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "expected"));
}

// The oracle's §9 bounds leave fp64 before its logits do: a run whose bounds are NaN or infinite
// judges nothing, and is refused instead of passing every element against a NaN bound.
TEST(Logits, ARunWhoseBoundsAreNotFiniteIsRefused) {
  const Output o = burstlab("run --impl reference --dtype fp64 --scale 1e200");
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_EQ(o.out, "");
  EXPECT_TRUE(has(o.err, "error: the fp64 oracle: the §9 bound of ")) << o.err;
  EXPECT_TRUE(has(o.err, "use a smaller scale (--scale) or smaller values")) << o.err;
}

}  // namespace
