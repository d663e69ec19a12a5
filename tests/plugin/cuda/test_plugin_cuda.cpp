// tests/plugin/cuda/test_plugin_cuda.cpp — the engine plug-in over the CUDA engine (device memory)
// through `burstlab run --impl plugin:...`: alone beside impl cuda, under ring, burst, ulysses and
// attention2d with G ranks on SimComm over one GPU's memory (the plug-in's transport copies), and
// on NCCL with 2 GPUs; every row PASS against the oracle. Skips without a GPU (BURSTLAB_REQUIRE_GPU=1:
// fails).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <regex>
#include <string>

#include "cli_run.hpp"
#include "cuda.hpp"
#include "gpu_skip.hpp"

namespace {

using burstlab::cli_test::Output;
using burstlab::cli_test::run_burstlab;

#define REQUIRE_GPU() BURSTLAB_REQUIRE_GPU(burstlab::cuda::gpu_available)

const std::string kPlugin = std::string("plugin:") + BURSTLAB_TEST_CUDA_PLUGIN;

int count(const std::string& text, const std::regex& re) {
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

TEST(CudaPlugin, AloneBesideCuda) {
  REQUIRE_GPU();
  for (const char* dtype : {"bf16", "fp16", "fp32"}) {
    const Output o = run_burstlab("run --impl " + kPlugin + ",cuda --dtype " + dtype +
                                  " --nq 300 --nk 257 --hq 4 --hkv 2 -d 64 --mask causal+document:3 --pass both");
    EXPECT_EQ(o.rc, 0) << o.out << o.err;
    EXPECT_EQ(count(o.out, std::regex("\nplugin:\\S+ +" + std::string(dtype) + " .* PASS")), 2) << o.out;
  }
}

TEST(CudaPlugin, UnderSchedulesOnOneGpu) {
  REQUIRE_GPU();
  const std::string shape = " --world 4 --nq 512 --nk 512 --hq 4 --hkv 4 -d 64 --dtype bf16 --pass both";
  Output o = run_burstlab("run --impl " + kPlugin + " --algo ring,burst,ulysses --partition zigzag --mask causal" + shape);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("6 passed, 0 failed"), std::string::npos) << o.out;
  o = run_burstlab("run --impl " + kPlugin + " --algo attention2d --partition striped --mask causal" + shape);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("2 passed, 0 failed"), std::string::npos) << o.out;
}

TEST(CudaPlugin, OnNccl) {
  REQUIRE_GPU();
#ifndef BURSTLAB_HAVE_NCCL
  GTEST_SKIP() << "burstlab was built without NCCL";
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) GTEST_SKIP() << "NCCL needs 2 GPUs; " << devices << " here";
  const Output o = run_burstlab("run --impl " + kPlugin +
                                " --algo ring,burst --transport nccl --world 2 --nq 1024 --nk 1024 --hq 4 --hkv 4 -d 64"
                                " --dtype bf16 --mask causal --partition zigzag --pass both");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("4 passed, 0 failed"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("NCCL"), std::string::npos) << o.out;
#endif
}

}  // namespace
