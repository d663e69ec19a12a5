// tests/cpu/test_lmhead.cpp — cpu/cpu_lmhead (spec §10.5) against the fp64 oracle under the §10.8
// rule, in fp64, fp32, bf16 and fp16 storage: ragged N and V (V not a multiple of the tile, V = 1,
// tiles larger than the problem), ignore_index rows, all-ignored batches, label smoothing, z-loss,
// both reductions, logits of magnitude 1e4, ties; the fused call and forward + separate backward;
// strided views; thread-count independence of L, LSE and dW; bad input. Outputs are poisoned
// (NaN) before every run. err/bound worst values are printed per dtype and tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/storage.hpp"
#include "cpu_lmhead.hpp"
#include "lmhead_check.hpp"
#include "lmhead_testutil.hpp"
#include "testutil.hpp"

namespace burstlab {
namespace {

using ::testing::HasSubstr;
using namespace testutil;  // the LM head helpers (lmhead_testutil.hpp) and error_message

template <class T>
struct CpuRun {
  double L = 0;
  std::vector<acc_t<T>> LSE;
  Matrix<T> dH, dW;
};

// fused: one lmhead_fused call; else lmhead_forward, then lmhead_backward from its own LSE.
template <class T>
CpuRun<T> run_cpu(const LmHeadProblem& p, const LmHeadInputs& in, double g, bool fused, cpu::LmHeadTiles tiles) {
  const Matrix<T> H = convert<T>(in.H), W = convert<T>(in.W);
  const double nan = std::nan("");
  CpuRun<T> r;
  r.LSE.assign(static_cast<size_t>(p.N), static_cast<acc_t<T>>(nan));
  r.dH = make_matrix<T>(p.N, p.d, from_double<T>(nan));
  r.dW = make_matrix<T>(p.V, p.d, from_double<T>(nan));
  if (fused) {
    r.L = cpu::lmhead_fused<T>(p, H.view(), W.view(), in.y.data(), g, r.LSE.data(), r.dH.view(), r.dW.view(), tiles);
  } else {
    r.L = cpu::lmhead_forward<T>(p, H.view(), W.view(), in.y.data(), r.LSE.data(), tiles);
    cpu::lmhead_backward<T>(p, H.view(), W.view(), in.y.data(), r.LSE.data(), g, r.dH.view(), r.dW.view(), tiles);
  }
  return r;
}

template <class T>
std::vector<Metrics> check(const LmHeadOracle& o, const CpuRun<T>& r) {
  return testutil::cat(check_lmhead_forward<double>(o, r.L, std::vector<double>(r.LSE.begin(), r.LSE.end()).data()),
                       check_lmhead_backward(o, as_const(r.dH.view()), as_const(r.dW.view())));
}

template <class T>
void sweep_dtype(testutil::WorstErrBound& worst) {
  const Dtype dt = dtype_of<T>();
  struct S { int64_t N, d, V; cpu::LmHeadTiles tiles; };
  // Tiles that do not divide N or V, tiles of 1, tiles larger than the problem, the defaults.
  const S shapes[] = {{1, 1, 1, {}},          {37, 3, 2, {16, 64}},       {113, 64, 203, {16, 64}},
                      {64, 1, 1000, {7, 100}}, {113, 3, 1023, {128, 512}}, {5, 64, 1, {2, 1}},
                      {200, 16, 129, {64, 1}}, {70, 8, 300, {1000, 1000}}};
  uint64_t seed = 1;
  for (const S& s : shapes)
    for_each_lmhead_case(s.N, s.d, s.V, dt, seed, [&](const LmHeadProblem& p, const LmHeadInputs& in, Values v, int opt) {
      const double g = opt == 1 ? 0.75 : 1.0;
      const LmHeadOracle o = lmhead_oracle(p, in, g, true);
      for (bool fused : {true, false}) {
        const std::vector<Metrics> ms = check(o, run_cpu<T>(p, in, g, fused, s.tiles));
        testutil::expect_pass(ms, shape_string(p) + " values=" + to_string(v) + " dtype=" + to_string(dt) +
                                      " Br=" + std::to_string(s.tiles.Br) + " Bv=" + std::to_string(s.tiles.Bv) +
                                      (fused ? " fused" : " forward+backward"));
        worst.add(dt, ms);
      }
    });
}

TEST(CpuLmHead, SweepMatchesOracleEveryDtype) {
  testutil::WorstErrBound worst;
  sweep_dtype<double>(worst);
  sweep_dtype<float>(worst);
  sweep_dtype<bf16_t>(worst);
  sweep_dtype<f16_t>(worst);
  worst.print("cpu lmhead sweep");
}

// fp64 is the layer where structural errors show: ~1e-12 relative agreement (§10.9).
TEST(CpuLmHead, Fp64AgreesToAboutOneInATrillion) {
  const LmHeadProblem p = lmhead_problem(113, 32, 1023, 0.1, 1e-3);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F64, 3, Values::Normal, 0.2);
  const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
  const CpuRun<double> r = run_cpu<double>(p, in, 1.0, true, {16, 100});
  for (const Metrics& m : check(o, r)) {
    EXPECT_TRUE(m.pass()) << m.tensor;
    EXPECT_LT(m.max_rel, 1e-10) << m.tensor;
  }
}

TEST(CpuLmHead, AllIgnoredBatchHasZeroLossAndGradients) {
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    const LmHeadProblem p = lmhead_problem(50, 8, 77, 0.1, 1e-2, red);
    const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F32, 5, Values::Normal, 1.0);
    const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
    for (bool fused : {true, false}) {
      const CpuRun<bf16_t> r = run_cpu<bf16_t>(p, in, 1.0, fused, {16, 32});
      EXPECT_EQ(r.L, 0.0);
      for (const bf16_t& x : r.dH.data) EXPECT_EQ(static_cast<float>(x), 0.0f);
      for (const bf16_t& x : r.dW.data) EXPECT_EQ(static_cast<float>(x), 0.0f);
      const CpuRun<float> f = run_cpu<float>(p, in, 1.0, fused, {16, 32});
      testutil::expect_pass(check(o, f), "all ignored, fp32");
    }
  }
}

// Logits of magnitude 1e4 (value mode large): finite and within the rule in every dtype.
TEST(CpuLmHead, LogitsOfTenThousand) {
  const LmHeadProblem p = lmhead_problem(64, 16, 333, 0.05, 1e-4);
  testutil::WorstErrBound worst;
  auto one = [&](auto tag) {
    using T = decltype(tag);
    const LmHeadInputs in = make_lmhead_inputs(p, dtype_of<T>(), 8, Values::Large, 0.1);
    double zmax = 0;
    const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
    for (double L : o.LSE) zmax = std::max(zmax, std::fabs(L));
    EXPECT_GT(zmax, 1e4) << "the value mode must reach logits of 1e4";
    const CpuRun<T> r = run_cpu<T>(p, in, 1.0, true, {16, 64});
    EXPECT_TRUE(std::isfinite(r.L));
    const std::vector<Metrics> ms = check(o, r);
    testutil::expect_pass(ms, "large " + to_string(dtype_of<T>()));
    worst.add(dtype_of<T>(), ms);
  };
  one(double());
  one(float());
  one(bf16_t());
  one(f16_t());
  worst.print("logits ~1e4");
}

// The fused call and forward + backward run the same arithmetic: bitwise equal.
TEST(CpuLmHead, FusedEqualsForwardThenBackward) {
  const LmHeadProblem p = lmhead_problem(99, 24, 517, 0.1, 1e-3);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F32, 12, Values::Normal, 0.2);
  const CpuRun<float> a = run_cpu<float>(p, in, 0.5, true, {32, 100});
  const CpuRun<float> b = run_cpu<float>(p, in, 0.5, false, {32, 100});
  EXPECT_EQ(a.L, b.L);
  EXPECT_EQ(std::memcmp(a.LSE.data(), b.LSE.data(), a.LSE.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.dH.data.data(), b.dH.data.data(), a.dH.data.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.dW.data.data(), b.dW.data.data(), a.dW.data.size() * sizeof(float)), 0);
}

// L, LSE and dW do not depend on the thread count (cpu/cpu_lmhead.cpp); dH stays within the rule.
TEST(CpuLmHead, ThreadCountChangesNeitherLossNorDW) {
  const LmHeadProblem p = lmhead_problem(80, 16, 700, 0.1, 0.0);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F32, 2, Values::Normal, 0.1);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const CpuRun<float> one = run_cpu<float>(p, in, 1.0, true, {16, 64});
  omp_set_num_threads(3);
  const CpuRun<float> three = run_cpu<float>(p, in, 1.0, true, {16, 64});
  omp_set_num_threads(saved);
  EXPECT_EQ(one.L, three.L);
  EXPECT_EQ(std::memcmp(one.LSE.data(), three.LSE.data(), one.LSE.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(one.dW.data.data(), three.dW.data.data(), one.dW.data.size() * sizeof(float)), 0);
  const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
  testutil::expect_pass(check(o, three), "3 threads");
}

// Strided views: H with padded rows, W and dW transposed in memory (column stride V), dH padded.
TEST(CpuLmHead, StridedViews) {
  const LmHeadProblem p = lmhead_problem(41, 7, 95, 0.2, 1e-3, Reduction::Sum);
  const LmHeadInputs in = make_lmhead_inputs(p, Dtype::F32, 21, Values::Normal, 0.25);
  const LmHeadOracle o = lmhead_oracle(p, in, 1.0, true);
  const int64_t ldh = p.d + 5;
  std::vector<float> Hs(static_cast<size_t>(p.N * ldh), 7.0f), Wt(static_cast<size_t>(p.V * p.d));
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t k = 0; k < p.d; ++k) Hs[i * ldh + k] = static_cast<float>(in.H.data[i * p.d + k]);
  for (int64_t j = 0; j < p.V; ++j)
    for (int64_t k = 0; k < p.d; ++k) Wt[k * p.V + j] = static_cast<float>(in.W.data[j * p.d + k]);
  View2<const float> H;
  H.data = Hs.data(); H.dim[0] = p.N; H.dim[1] = p.d; H.stride[0] = ldh; H.stride[1] = 1;
  View2<const float> W;
  W.data = Wt.data(); W.dim[0] = p.V; W.dim[1] = p.d; W.stride[0] = 1; W.stride[1] = p.V;
  std::vector<float> dHs(static_cast<size_t>(p.N * ldh), std::nanf("")), dWs(static_cast<size_t>(p.V * p.d), std::nanf(""));
  View2<float> dH;
  dH.data = dHs.data(); dH.dim[0] = p.N; dH.dim[1] = p.d; dH.stride[0] = ldh; dH.stride[1] = 1;
  View2<float> dW;
  dW.data = dWs.data(); dW.dim[0] = p.V; dW.dim[1] = p.d; dW.stride[0] = 1; dW.stride[1] = p.V;
  std::vector<float> LSE(static_cast<size_t>(p.N), std::nanf(""));
  const float L = cpu::lmhead_fused<float>(p, H, W, in.y.data(), 1.0, LSE.data(), dH, dW, {8, 32});
  testutil::expect_pass(testutil::cat(check_lmhead_forward(o, L, LSE.data()),
                                      check_lmhead_backward<float>(o, dH, dW)),
                        "strided");
  for (int64_t i = 0; i < p.N; ++i)  // the padding of dH is untouched
    for (int64_t k = p.d; k < ldh; ++k) EXPECT_TRUE(std::isnan(dHs[i * ldh + k]));
}

TEST(CpuLmHead, BadInputNamesTheField) {
  const LmHeadProblem p = lmhead_problem(3, 2, 4);
  Matrix<float> H = make_matrix<float>(3, 2, 1.0f), W = make_matrix<float>(4, 2, 1.0f);
  Matrix<float> dH = make_matrix<float>(3, 2), dW = make_matrix<float>(4, 2);
  std::vector<float> LSE(3);
  std::vector<int64_t> y = {0, 3, -100};
  EXPECT_THAT(error_message([&] { cpu::lmhead_forward<float>(p, H.view(), W.view(), y.data(), LSE.data(), {0, 8}); }),
              HasSubstr("Br (0) must be >= 1"));
  EXPECT_THAT(error_message([&] { cpu::lmhead_forward<float>(p, H.view(), W.view(), y.data(), LSE.data(), {8, 0}); }),
              HasSubstr("Bv (0) must be >= 1"));
  y[2] = 4;
  EXPECT_THAT(error_message([&] { cpu::lmhead_fused<float>(p, H.view(), W.view(), y.data(), 1.0, LSE.data(), dH.view(), dW.view()); }),
              HasSubstr("y[2] (4) must be in [0, V) = [0, 4)"));
  y[2] = 1;
  EXPECT_THAT(error_message([&] { cpu::lmhead_fused<float>(lmhead_problem(3, 2, 0), H.view(), W.view(), y.data(), 1.0, LSE.data(),
                                                 dH.view(), dW.view()); }),
              HasSubstr("V (0) must be >= 1"));
  Matrix<float> W5 = make_matrix<float>(5, 2, 1.0f);
  EXPECT_THAT(error_message([&] { cpu::lmhead_fused<float>(p, H.view(), W5.view(), y.data(), 1.0, LSE.data(), dH.view(), dW.view()); }),
              HasSubstr("W.dim[0] (5) must equal V (4)"));
  EXPECT_THAT(error_message([&] { cpu::lmhead_backward<float>(p, H.view(), W.view(), y.data(), LSE.data(), 1.0, dH.view(), W5.view()); }),
              HasSubstr("dW.dim[0] (5) must equal V (4)"));
  EXPECT_THAT(error_message([&] { cpu::lmhead_backward<float>(p, H.view(), W.view(), y.data(), nullptr, 1.0, dH.view(), dW.view()); }),
              HasSubstr("LSE (null)"));
}

// Memory O(N d + V (d + Br)) (§10.5): never N x V. At N = 1M, V = 128K, d = 4096 the workspace
// is a small fraction of one fp32 N x V buffer.
TEST(CpuLmHead, WorkspaceIsLinearInNAndV) {
  LmHeadProblem p = lmhead_problem(1 << 20, 4096, 128 * 1024);
  const cpu::LmHeadTiles t;
  const double nv = double(p.N) * double(p.V) * 4;
  for (Dtype dt : {Dtype::F32, Dtype::BF16}) {
    const int64_t w = cpu::lmhead_workspace_bytes(p, dt, true, t, 16);
    EXPECT_LT(double(w), nv / 100) << to_string(dt);
    EXPECT_GE(w, t.Br * p.V * 4) << to_string(dt);
  }
  p.N *= 2;  // doubling N does not change it
  EXPECT_EQ(cpu::lmhead_workspace_bytes(p, Dtype::F32, true, t, 16),
            cpu::lmhead_workspace_bytes(lmhead_problem(1 << 20, 4096, 128 * 1024), Dtype::F32, true, t, 16));
}

}  // namespace
}  // namespace burstlab
