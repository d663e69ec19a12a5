// tests/cuda/test_cuda_lmhead.cpp — the CUDA LM head + cross-entropy (cuda/cuda_lmhead.hpp,
// spec §10), every variant (v1, v2, v3; v3 under (10.21) with its r_W roundings of dW), against
// the fp64 oracle under the §10.8 rule, bf16 and fp16: ragged N and V (V not
// a multiple of 8 or of the 128-wide tile, V = 1), d from 8 to 136, several chunks of rows,
// ignore_index rows, all-ignored batches, label smoothing, z-loss, both reductions, logits of
// 1e4, ties, strided H; the fused call, forward + separate backward; bitwise repeatability;
// bad input. Outputs are poisoned (0xff: NaN) before every run. Without a GPU every test skips;
// with BURSTLAB_REQUIRE_GPU=1 a skip fails.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/storage.hpp"
#include "cuda_lmhead.hpp"
#include "gpu_skip.hpp"
#include "lmhead_check.hpp"
#include "lmhead_testutil.hpp"
#include "testutil.hpp"

namespace {

using namespace burstlab;
namespace bc = burstlab::cuda;
using ::testing::HasSubstr;
using testutil::error_message;
using testutil::for_each_lmhead_case;
using testutil::lmhead_problem;

#define REQUIRE_GPU() BURSTLAB_REQUIRE_GPU(bc::gpu_available)

// DT: the storage type (bf16_t, f16_t), on the host and in the device buffers alike.
template <class DT>
struct GpuRun {
  float L = NAN;
  std::vector<float> LSE;
  Matrix<double> dH, dW;
  int64_t r_W = 1;                // roundings of dW to the storage type (10.21)
  int64_t peak = -1, model = -1;  // measured pool peak of the last call, and lmhead_workspace_bytes
};

constexpr int kVariants[] = {1, 2, 3};

// ldh: row stride of H on the device (>= d, a multiple of 8).
template <class DT>
GpuRun<DT> run_gpu(const LmHeadProblem& p, const LmHeadInputs& in, double g, bool fused, int64_t chunk_rows,
                   int variant, int64_t ldh = 0) {
  if (ldh == 0) ldh = p.d;
  std::vector<DT> h(static_cast<size_t>(p.N * ldh), from_double<DT>(7.0)), w(static_cast<size_t>(p.V * p.d));
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t k = 0; k < p.d; ++k) h[i * ldh + k] = from_double<DT>(in.H.data[i * p.d + k]);
  for (size_t e = 0; e < w.size(); ++e) w[e] = from_double<DT>(in.W.data[e]);
  bc::DeviceBuffer<DT> H(h.size()), W(w.size()), dH(static_cast<size_t>(p.N * p.d)), dW(w.size());
  H.upload(h.data(), h.size());
  W.upload(w.data(), w.size());
  bc::DeviceBuffer<int64_t> y(in.y.size());
  y.upload(in.y.data(), in.y.size());
  bc::DeviceBuffer<float> LSE(static_cast<size_t>(p.N));
  dH.poison();
  dW.poison();
  LSE.poison();
  View2<const DT> Hv;
  Hv.data = H.data(); Hv.dim[0] = p.N; Hv.dim[1] = p.d; Hv.stride[0] = ldh; Hv.stride[1] = 1;
  const View2<const DT> Wv = view2<const DT>(W.data(), p.V, p.d);
  const View2<DT> dHv = view2<DT>(dH.data(), p.N, p.d), dWv = view2<DT>(dW.data(), p.V, p.d);
  bc::LmHeadOptions opt;
  opt.chunk_rows = chunk_rows;
  opt.variant = variant;
  GpuRun<DT> r;
  const int v = bc::lmhead_variant<DT>(p, dHv, dWv, opt);
  r.r_W = bc::lmhead_dW_roundings(p, v, opt);
  r.model = bc::lmhead_workspace_bytes(p, v, true, opt);
  if (fused) {
    bc::reset_pool_peak();
    r.L = bc::lmhead_fused<DT>(p, Hv, Wv, y.data(), g, LSE.data(), dHv, dWv, opt);
    r.peak = bc::pool_peak_bytes();
  } else {
    r.L = bc::lmhead_forward<DT>(p, Hv, Wv, y.data(), LSE.data(), opt);
    bc::reset_pool_peak();
    bc::lmhead_backward<DT>(p, Hv, Wv, y.data(), LSE.data(), g, dHv, dWv, opt);
    r.peak = bc::pool_peak_bytes();
  }
  r.LSE.resize(static_cast<size_t>(p.N));
  LSE.download(r.LSE.data(), r.LSE.size());
  auto fetch = [](const bc::DeviceBuffer<DT>& b, int64_t rows, int64_t cols) {
    std::vector<DT> x(static_cast<size_t>(rows * cols));
    b.download(x.data(), x.size());
    Matrix<double> m = make_matrix<double>(rows, cols);
    for (size_t e = 0; e < x.size(); ++e) m.data[e] = static_cast<double>(x[e]);
    return m;
  };
  r.dH = fetch(dH, p.N, p.d);
  r.dW = fetch(dW, p.V, p.d);
  return r;
}

template <class DT>
std::vector<Metrics> check(const LmHeadOracle& o, const GpuRun<DT>& r) {
  return testutil::cat(check_lmhead_forward(o, r.L, r.LSE.data()),
                       check_lmhead_backward<double>(o, r.dH.view(), r.dW.view(), r.r_W));
}

template <class DT>
void sweep(testutil::WorstErrBound& worst) {
  const Dtype dt = dtype_of<DT>();
  struct S { int64_t N, d, V, chunk; };
  // V below, at and above the 128-wide tile, not a multiple of 8; chunks that split N unevenly.
  const S shapes[] = {{1, 8, 1, 0},       {37, 16, 2, 0},      {113, 64, 203, 0},  {300, 72, 1000, 128},
                      {64, 8, 4099, 0},   {200, 128, 129, 64}, {257, 136, 517, 100}, {130, 32, 128, 0}};
  uint64_t seed = 1;
  for (const S& s : shapes)
    for_each_lmhead_case(s.N, s.d, s.V, dt, seed, [&](const LmHeadProblem& p, const LmHeadInputs& in, Values v, int opt) {
      const double g = opt == 1 ? 0.75 : 1.0;
      const LmHeadOracle o = lmhead_oracle(p, in, g, true);
      for (int variant : kVariants)
        for (bool fused : {true, false}) {
          const GpuRun<DT> r = run_gpu<DT>(p, in, g, fused, s.chunk, variant);
          const std::vector<Metrics> ms = check(o, r);
          testutil::expect_pass(ms, shape_string(p) + " values=" + to_string(v) + " dtype=" + to_string(dt) +
                                        " chunk=" + std::to_string(s.chunk) + " v" + std::to_string(variant) +
                                        " r_W=" + std::to_string(r.r_W) + (fused ? " fused" : " fwd+bwd"));
          // The workspace the layer reports is what the pool handed out, within its rounding.
          EXPECT_LE(r.peak, r.model + (int64_t(4) << 20)) << "v" << variant << " " << shape_string(p);
          worst.add(dt, ms);
        }
    });
}

TEST(CudaLmHead, SweepMatchesOracle) {
  REQUIRE_GPU();
  testutil::WorstErrBound worst;
  sweep<bf16_t>(worst);
  sweep<f16_t>(worst);
  worst.print("cuda lmhead");
}

TEST(CudaLmHead, AllIgnoredAndStridedH) {
  REQUIRE_GPU();
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    const LmHeadProblem p = lmhead_problem(50, 16, 77, 0.1, 1e-2, red);
    const LmHeadInputs in = make_lmhead_inputs(p, Dtype::BF16, 5, Values::Normal, 1.0);
    for (int variant : kVariants) {
      const GpuRun<bf16_t> r = run_gpu<bf16_t>(p, in, 1.0, true, 16, variant);
      EXPECT_EQ(r.L, 0.0f);
      for (double x : r.dH.data) EXPECT_EQ(x, 0.0);
      for (double x : r.dW.data) EXPECT_EQ(x, 0.0);
    }
  }
  const LmHeadProblem p = lmhead_problem(41, 24, 95, 0.2, 1e-3, Reduction::Sum);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F16, 21, Values::Normal, 0.25);
  const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
  for (int variant : kVariants)
    testutil::expect_pass(check(o, run_gpu<f16_t>(p, in, 1.0, true, 16, variant, p.d + 8)),
                          "strided H v" + std::to_string(variant));
}

// v3 rounds dW to the storage type once per chunk: with 64 chunks its dW meets (10.21) with
// r_W = 64 (the value printed under r_W = 1 shows how much of the term the roundings used).
TEST(CudaLmHead, ChunkRoundingsOfDwAreCounted) {
  REQUIRE_GPU();
  const LmHeadProblem p = lmhead_problem(512, 64, 300);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::BF16, 9, Values::Normal, 0.0);
  const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
  const GpuRun<bf16_t> r = run_gpu<bf16_t>(p, in, 1.0, true, 8, 3);
  EXPECT_EQ(r.r_W, 64);
  const std::vector<Metrics> ms = check(o, r);
  testutil::expect_pass(ms, "v3, 64 chunks");
  const Metrics dW1 = check_lmhead_backward<double>(o, r.dH.view(), r.dW.view(), 1)[1];
  std::printf("  v3 with 64 chunks: dW err/bound %.3f under r_W = 64, %.3f under r_W = 1\n", ms.back().err_bound,
              dW1.err_bound);
}

// No atomics in the arithmetic: two runs are bitwise equal.
TEST(CudaLmHead, BitwiseRepeatable) {
  REQUIRE_GPU();
  const LmHeadProblem p = lmhead_problem(300, 64, 1000, 0.1, 1e-4);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::BF16, 3, Values::Normal, 0.1);
  for (int variant : kVariants) {
    const GpuRun<bf16_t> a = run_gpu<bf16_t>(p, in, 1.0, true, 128, variant),
                           b = run_gpu<bf16_t>(p, in, 1.0, true, 128, variant);
    EXPECT_EQ(a.L, b.L) << "v" << variant;
    EXPECT_EQ(a.LSE, b.LSE) << "v" << variant;
    EXPECT_EQ(a.dH.data, b.dH.data) << "v" << variant;
    EXPECT_EQ(a.dW.data, b.dW.data) << "v" << variant;
  }
}

TEST(CudaLmHead, BadInputNamesTheField) {
  // Host-side checks come before any device work: they run without a GPU.
  LmHeadProblem p = lmhead_problem(4, 12, 10);
  View2<const bf16_t> H, W;
  alignas(16) static bf16_t dummy[64];
  H.data = dummy; H.dim[0] = 4; H.dim[1] = 12; H.stride[0] = 12; H.stride[1] = 1;
  W.data = dummy; W.dim[0] = 10; W.dim[1] = 12; W.stride[0] = 12; W.stride[1] = 1;
  float lse[4];
  const int64_t* y = reinterpret_cast<const int64_t*>(dummy);
  EXPECT_THAT(error_message([&] { bc::lmhead_forward<bf16_t>(p, H, W, y, lse); }), HasSubstr("d (12) must be a multiple of 8"));
  p = lmhead_problem(4, 16, 0);
  EXPECT_THAT(error_message([&] { bc::lmhead_forward<bf16_t>(p, H, W, y, lse); }), HasSubstr("V (0) must be >= 1"));
  p = lmhead_problem(4, 16, 10);
  H.dim[1] = W.dim[1] = 16;
  H.stride[0] = W.stride[0] = 16;
  H.stride[1] = 2;
  EXPECT_THAT(error_message([&] { bc::lmhead_forward<bf16_t>(p, H, W, y, lse); }), HasSubstr("H.stride[1] (2) must be 1"));
  H.stride[1] = 1;
  W.dim[0] = 11;
  EXPECT_THAT(error_message([&] { bc::lmhead_forward<bf16_t>(p, H, W, y, lse); }), HasSubstr("W.dim[0] (11) must equal V (10)"));
  W.dim[0] = 10;
  EXPECT_THAT(error_message([&] { bc::lmhead_forward<bf16_t>(p, H, W, nullptr, lse); }), HasSubstr("y (null)"));
  // The variant: a number the layer has, and outputs cuBLAS can write (host-side choice).
  bc::LmHeadOptions opt;
  opt.variant = 4;
  View2<bf16_t> dH, dW;
  EXPECT_THAT(error_message([&] { bc::lmhead_variant<bf16_t>(p, dH, dW, opt); }),
              HasSubstr("variant (4) must be 0 (the first that supports the call), 1, 2 or 3"));
  dW.data = dummy; dW.dim[0] = 10; dW.dim[1] = 16; dW.stride[0] = 32; dW.stride[1] = 2;
  opt.variant = 3;
  EXPECT_THAT(error_message([&] { bc::lmhead_variant<bf16_t>(p, dH, dW, opt); }),
              HasSubstr("variant (3) writes dH and dW through cuBLAS: dW.stride[1] (2) must be 1"));
  opt.variant = 0;
  EXPECT_EQ(bc::lmhead_variant<bf16_t>(p, dH, dW, opt), 1);
  dW.stride[1] = 1;
  EXPECT_EQ(bc::lmhead_variant<bf16_t>(p, dH, dW, opt), 3);
  EXPECT_THAT(error_message([&] { bc::lmhead_chunk_rows(p, 0, opt); }), HasSubstr("variant (0) must be 1, 2 or 3"));
  // Labels are checked on the device.
  REQUIRE_GPU();
  const LmHeadProblem q = lmhead_problem(6, 8, 10);
  LmHeadInputs in = make_lmhead_inputs(q, Dtype::BF16, 1, Values::Normal, 0.0);
  in.y[4] = 10;
  for (int variant : kVariants)
    EXPECT_THAT(error_message([&] { run_gpu<bf16_t>(q, in, 1.0, true, 0, variant); }),
              HasSubstr("y[4] (10) must be in [0, V) = [0, 10) or equal ignore_index (-100)"));
}

}  // namespace
