// The §9 rule for bf16 / fp16 candidates is not too tight: a naive emulation of a tensor-core
// kernel (fp32 accumulation; P and dS rounded to the storage dtype before their matrix products,
// l summed from the unrounded fp32 P as FlashAttention-2 does; outputs rounded to the storage
// dtype; LSE kept in fp32) passes against the oracle on every value mode and mask kind, and the
// row-sampled check of §9.11 (its columns under the conditional bound, eq. 9.10-9.13).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "harness.hpp"
#include "rows.hpp"
#include "testutil.hpp"

namespace burstlab {
namespace {

float rnd(Dtype t, float x) { return static_cast<float>(round_to(t, x)); }

struct Emulated {
  Tensor4<float> O, dQ, dK, dV;
  Tensor3<float> LSE;
};

// Plain loops, fp32 accumulation, rounding where a bf16/fp16 tensor-core kernel rounds.
Emulated emulate(const Problem& p, const Inputs& in, Dtype t) {
  const Tensor4<float> Qt = convert<float>(in.Q), Kt = convert<float>(in.K), Vt = convert<float>(in.V),
                       dOt = convert<float>(in.dO);
  const View4<const float> Q = Qt.view(), K = Kt.view(), V = Vt.view(), dO = dOt.view();
  const MaskData md = compile_mask(p);
  const MaskParams mask = md.params();
  const float scale = static_cast<float>(scale_of(p));
  const int64_t G = group_size(p), N_q = p.N_q, N_k = p.N_k, d = p.d;
  Emulated e;
  e.O = make_tensor4<float>(Layout::BHSD, p.B, p.H_q, N_q, d);
  e.dQ = make_tensor4<float>(Layout::BHSD, p.B, p.H_q, N_q, d);
  e.dK = make_tensor4<float>(Layout::BHSD, p.B, p.H_kv, N_k, d);
  e.dV = make_tensor4<float>(Layout::BHSD, p.B, p.H_kv, N_k, d);
  e.LSE = make_tensor3<float>(p.B, p.H_q, N_q);
  std::vector<float> dKacc, dVacc;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.H_kv; ++hk) {
      dKacc.assign(static_cast<size_t>(N_k * d), 0.f);
      dVacc.assign(static_cast<size_t>(N_k * d), 0.f);
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
        for (int64_t i = 0; i < N_q; ++i) {
          std::vector<float> S(N_k), P(N_k, 0.f);
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < N_k; ++j) {
            float s = 0;
            for (int64_t k = 0; k < d; ++k) s += Q(b, h, i, k) * K(b, hk, j, k);
            S[j] = scale * s;
            if (visible(mask, i, j)) m = std::max(m, S[j]);
          }
          if (m == -std::numeric_limits<float>::infinity()) {  // empty row
            for (int64_t k = 0; k < d; ++k) { e.O.view()(b, h, i, k) = 0; e.dQ.view()(b, h, i, k) = 0; }
            e.LSE.view()(b, h, i) = m;
            continue;
          }
          float l = 0;
          for (int64_t j = 0; j < N_k; ++j)
            if (visible(mask, i, j)) { P[j] = std::exp(S[j] - m); l += P[j]; }
          const float L = m + std::log(l);
          e.LSE.view()(b, h, i) = L;
          std::vector<float> o(d, 0.f);
          for (int64_t j = 0; j < N_k; ++j) {
            const float pb = rnd(t, P[j]);  // P rounded before P V
            for (int64_t k = 0; k < d; ++k) o[k] += pb * V(b, hk, j, k);
          }
          for (int64_t k = 0; k < d; ++k) o[k] = rnd(t, o[k] / l);  // O stored in the dtype
          for (int64_t k = 0; k < d; ++k) e.O.view()(b, h, i, k) = o[k];
          // backward with this candidate's own O and LSE
          float D = 0;
          for (int64_t k = 0; k < d; ++k) D += dO(b, h, i, k) * o[k];
          std::vector<float> dq(d, 0.f);
          for (int64_t j = 0; j < N_k; ++j) {
            if (!visible(mask, i, j)) continue;
            const float pj = std::exp(S[j] - L);
            float dP = 0;
            for (int64_t k = 0; k < d; ++k) dP += dO(b, h, i, k) * V(b, hk, j, k);
            const float dS = rnd(t, pj * (dP - D)), pr = rnd(t, pj);
            for (int64_t k = 0; k < d; ++k) {
              dq[k] += dS * K(b, hk, j, k);
              dKacc[j * d + k] += dS * Q(b, h, i, k);
              dVacc[j * d + k] += pr * dO(b, h, i, k);
            }
          }
          for (int64_t k = 0; k < d; ++k) e.dQ.view()(b, h, i, k) = rnd(t, scale * dq[k]);
        }
      for (int64_t j = 0; j < N_k; ++j)
        for (int64_t k = 0; k < d; ++k) {
          e.dK.view()(b, hk, j, k) = rnd(t, scale * dKacc[j * d + k]);
          e.dV.view()(b, hk, j, k) = rnd(t, dVacc[j * d + k]);
        }
    }
  return e;
}

// The emulated kernel in dtype t on every case of the sweeps: the (N_q, N_k) sizes, d in {3, 64},
// four masks, the four value modes, seeds from seed + 1 on; f(p, in, e, mask, mode, seed) until a
// fatal failure.
template <class F>
void for_each_emulated(Dtype t, uint64_t seed, std::initializer_list<std::pair<int64_t, int64_t>> sizes, F f) {
  for (auto [N_q, N_k] : sizes)
    for (int64_t d : {3, 64})
      for (const char* mask : {"none", "causal", "document:3+window:8,2", "block:8x8"})
        for (Values mode : {Values::Normal, Values::Large, Values::Ties, Values::WideV}) {
          const Problem p = testutil::make_problem(1, 2, 1, N_q, N_k, d, mask, ++seed);
          const Inputs in = make_inputs(p, Layout::BHSD, t, seed, mode);
          f(p, in, emulate(p, in, t), mask, mode, seed);
          if (::testing::Test::HasFatalFailure()) return;
        }
}

TEST(LowPrecision, EmulatedTensorCoreKernelPasses) {
  for (Dtype t : {Dtype::BF16, Dtype::F16}) {
    double worst_f = 0, worst_b = 0;
    for_each_emulated(t, 77, {{33, 70}, {70, 33}, {1, 50}},
                      [&](const Problem& p, const Inputs& in, const Emulated& e, const char* mask, Values mode,
                          uint64_t) {
            const Oracle o = run_oracle(p, in, true);
            const std::vector<Metrics> f = check_forward<float>(o, e.O, e.LSE);
            const std::vector<Metrics> g = check_backward<float>(o, e.dQ, e.dK, e.dV);
            worst_f = std::max(worst_f, testutil::worst_err_bound(f));
            worst_b = std::max(worst_b, testutil::worst_err_bound(g));
            ASSERT_TRUE(testutil::all_pass(testutil::cat(f, g), to_string(t) + " " + shape_string(p) + " mask=" +
                                                                     mask + " values=" + to_string(mode)));
          });
    if (HasFatalFailure()) return;
    std::printf("%s emulated kernel: worst err/bound forward %.3e backward %.3e\n", to_string(t).c_str(), worst_f,
                worst_b);
  }
}

TEST(LowPrecision, EmulatedTensorCoreKernelPassesTheSampledCheck) {
  for (Dtype t : {Dtype::BF16, Dtype::F16}) {
    double worst_rows = 0, worst_cols = 0;
    for_each_emulated(t, 177, {{33, 70}, {70, 33}},
                      [&](const Problem& p, const Inputs& in, const Emulated& e, const char* mask, Values mode,
                          uint64_t seed) {
            const Tensor4<double> O = to_double(e.O), dQ = to_double(e.dQ), dK = to_double(e.dK), dV = to_double(e.dV);
            const Tensor3<double> L = to_double(e.LSE);
            const SampledOracle so = sampled_oracle(p, in, 16, seed, true);
            const std::vector<Metrics> f = check_sampled_forward(so, p, O.view(), L.view());
            const std::vector<Metrics> g = check_sampled_backward(so, p, in, O.view(), L.view(), dQ.view(), dK.view(), dV.view());
            worst_rows = std::max({worst_rows, testutil::worst_err_bound(f), g[0].err_bound});
            worst_cols = std::max({worst_cols, g[1].err_bound, g[2].err_bound});
            ASSERT_TRUE(testutil::all_pass(testutil::cat(f, g), to_string(t) + " " + shape_string(p) + " mask=" +
                                                                     mask + " values=" + to_string(mode)));
          });
    if (HasFatalFailure()) return;
    std::printf("%s emulated kernel, sampled check: worst err/bound rows %.3e, columns (eq. 9.12-9.13) %.3e\n",
                to_string(t).c_str(), worst_rows, worst_cols);
  }
}

}  // namespace
}  // namespace burstlab
