// The device memory a CUDA run takes, as the cuda layer states it (cuda/cuda_footprint.hpp) and
// as the tool composes it for `run --algo` (tools/resources.cpp): it follows the variant's
// workspace (v4's one-pass, v5, v6 and v14 hold an fp32 dQ accumulator; v1-v3 none) and never the cpu
// layer's tiles. Host code only: no GPU needed.
#include <gtest/gtest.h>

#include <string>

#include "burstlab/error.hpp"
#include "common.hpp"
#include "cuda_footprint.hpp"
#include "resources.hpp"

namespace burstlab::tools {
namespace {

Problem shape(int64_t B, int64_t H_q, int64_t H_kv, int64_t N, int64_t d) {
  Problem p;
  p.B = B; p.H_q = H_q; p.H_kv = H_kv; p.N_q = p.N_k = N; p.d = d;
  return p;
}
int64_t accumulator_bytes(const std::vector<MemPart>& parts) {
  int64_t n = 0;
  for (const MemPart& x : parts)
    if (x.what.find("dQ accumulator") != std::string::npos) n += x.bytes;
  return n;
}
EngineFootprint cuda_engine(cuda::Variant v) {
  EngineFootprint e;
  e.what = "cuda engine workspace";
  e.device = true;
  e.block_call = [v](const Problem& p, int64_t rows, Dtype dtype, const ImplOptions&, int) {
    return cuda::block_call_bytes(p, rows, dtype, v, false);
  };
  return e;
}

TEST(CudaFootprint, BackwardHoldsTheVariantsAccumulatorOnTheDevice) {
  const Problem p = shape(2, 8, 2, 1000, 64);
  const int64_t acc = 4LL * 2 * 8 * 1024 * 64;  // v4_dq_acc_floats: 1000 rows in 16 tiles of 64
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::BF16, cuda::Variant::V14, false)), acc);
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::BF16, cuda::Variant::V5, false)), acc);
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::BF16, cuda::Variant::V4, false)), acc);
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::BF16, cuda::Variant::V4, true)), 0);
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::BF16, cuda::Variant::V2, false)), 0);
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::F64, cuda::Variant::V1, false)), 0);
  // auto: the most of the rows that may run it (v14 at d = 64 in bf16), none for fp64 (v1 only).
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::BF16, cuda::Variant::Auto, false)), acc);
  EXPECT_EQ(accumulator_bytes(cuda::backward_workspace(p, Dtype::F64, cuda::Variant::Auto, false)), 0);
  for (const MemPart& x : cuda::backward_workspace(p, Dtype::BF16, cuda::Variant::V5, false)) EXPECT_TRUE(x.device) << x.what;
  // The arguments: Q, O, dO, dQ and K, V, dK, dV in bf16, LSE in fp32.
  const MemNeed args = make_need("", cuda::call_arguments(p, Dtype::BF16, true));
  EXPECT_EQ(args.bytes, 0);
  EXPECT_EQ(args.device_bytes, 2 * (4LL * 2 * 8 * 1000 * 64 + 4LL * 2 * 2 * 1000 * 64) + 4LL * 2 * 8 * 1000);
}

TEST(CudaFootprint, DistributedRunOnTheCudaEngineIsDeviceMemoryNotCpuTiles) {
  const Problem p = shape(1, 4, 4, 1000, 64);
  ImplOptions small, large;
  small.Br = small.Bc = 16;
  large.Br = large.Bc = 128;
  const Footprint v4 = distributed_footprint(2, 4, cuda_engine(cuda::Variant::V4));
  const MemNeed a = make_need("", v4(p, Dtype::BF16, small, true, 2)), b = make_need("", v4(p, Dtype::BF16, large, true, 2));
  EXPECT_EQ(a.bytes, b.bytes);  // the cpu layer's --br/--bc play no part
  EXPECT_EQ(a.device_bytes, b.device_bytes);
  const MemNeed v1 = make_need("", distributed_footprint(2, 4, cuda_engine(cuda::Variant::V1))(p, Dtype::BF16, small, true, 2));
  // 4 ranks, each v4's accumulator over its 250 rows (4 tiles of 64): 4 x 4 B H_q 256 d bytes.
  EXPECT_EQ(a.device_bytes - v1.device_bytes, 4 * 4LL * 1 * 4 * 256 * 64);
  EXPECT_EQ(a.bytes, v1.bytes);  // the host holds the gathered outputs either way
  // On the cpu engine every part is host memory, and the tiles count.
  const Footprint cpu = distributed_footprint(2, 4, cpu_engine_footprint());
  const MemNeed c = make_need("", cpu(p, Dtype::F32, small, true, 2)), d = make_need("", cpu(p, Dtype::F32, large, true, 2));
  EXPECT_EQ(c.device_bytes, 0);
  EXPECT_LT(c.bytes, d.bytes);
}

// A GPU implementation whose device parts exceed what its device has free is refused (exit 2) by
// its device memory, naming the largest device part; the host parts play no part in that.
TEST(CudaFootprint, DeviceMemoryIsRefusedByTheDeviceParts) {
  Impl m;
  m.name = "gpu";
  m.footprint = [](const Problem& p, Dtype dtype, const ImplOptions& o, bool backward, int threads) {
    std::vector<MemPart> parts = cuda_host_footprint(p, dtype, o, backward, threads);
    for (const std::vector<MemPart>& more : {cuda::call_arguments(p, dtype, backward),
                                             cuda::backward_workspace(p, dtype, cuda::Variant::V5, false)})
      parts.insert(parts.end(), more.begin(), more.end());
    return parts;
  };
  int64_t free_bytes = 0;
  m.device_memory = [&free_bytes] {
    MemAvailable a;
    a.bytes = free_bytes;
    a.source = "the test's device";
    return a;
  };
  Case c;
  c.p = shape(1, 8, 8, 4096, 64);
  c.dtype = Dtype::BF16;
  const MemNeed n = make_need("", m.footprint(c.p, c.dtype, c.opt, true, 1));
  free_bytes = n.device_bytes;
  EXPECT_NO_THROW(require_device_memory(c, {&m}, 1));
  free_bytes = n.device_bytes - 1;
  try {
    require_device_memory(c, {&m}, 1);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("not enough device memory for impl gpu (bf16): " + format_bytes(n.device_bytes) + " needed"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("the largest part: Q, O, dO, dQ in bf16 on the device"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace burstlab::tools
