// make_inputs (spec §9.5) fills its four tensors side by side (reference/fill.hpp); its values
// must be, bit for bit, those of the serial pass that defines them: Q, K, V, dO in order, each
// from its own stream, all drawing normals through one std::normal_distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <omp.h>

#include "fill.hpp"
#include "harness.hpp"
#include "rows.hpp"
#include "streams.hpp"

namespace burstlab {
namespace {

// The serial pass, as make_inputs wrote it before its tensors were filled side by side.
Inputs serial_inputs(const Problem& p, Layout layout, Dtype dtype, uint64_t seed, Values values) {
  Inputs in{dtype, make_tensor4<double>(layout, p.B, p.H_q, p.N_q, p.d), make_tensor4<double>(layout, p.B, p.H_kv, p.N_k, p.d),
            make_tensor4<double>(layout, p.B, p.H_kv, p.N_k, p.d), make_tensor4<double>(layout, p.B, p.H_q, p.N_q, p.d)};
  std::mt19937_64 rq = reference::stream(seed, 1), rk = reference::stream(seed, 2), rv = reference::stream(seed, 3),
                  rdo = reference::stream(seed, 4);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](Tensor4<double>& t, std::mt19937_64& rng, auto draw) {
    View4<double> v = t.view();
    for (int64_t b = 0; b < t.B; ++b)
      for (int64_t h = 0; h < t.H; ++h)
        for (int64_t n = 0; n < t.N; ++n)
          for (int64_t k = 0; k < t.d; ++k) {
            double x;
            do { x = round_to(dtype, draw(rng)); } while (x == 0.0);
            v(b, h, n, k) = x;
          }
  };
  const double qk_mult = qk_multiplier(p, values);
  auto qk = [&](std::mt19937_64& r) -> double {
    static const double choices[3] = {-1.0, 0.5, 1.0};
    if (values == Values::Ties) return choices[std::uniform_int_distribution<int>(0, 2)(r)];
    return qk_mult * normal(r);
  };
  const double lo = dtype == Dtype::F16 ? -4.0 : -6.0, hi = dtype == Dtype::F16 ? 1.5 : 6.0;
  auto wide = [&](std::mt19937_64& r) {
    const double e = std::uniform_real_distribution<double>(lo, hi)(r);
    const double sign = std::uniform_int_distribution<int>(0, 1)(r) ? 1.0 : -1.0;
    return sign * std::pow(10.0, e);
  };
  auto gauss = [&](std::mt19937_64& r) { return normal(r); };
  fill(in.Q.f64(), rq, qk);
  fill(in.K.f64(), rk, qk);
  if (values == Values::WideV) {
    fill(in.V.f64(), rv, wide);
    fill(in.dO.f64(), rdo, wide);
  } else {
    fill(in.V.f64(), rv, gauss);
    fill(in.dO.f64(), rdo, gauss);
  }
  return in;
}

bool same_bits(const Tensor4<double>& a, const Tensor4<double>& b) {
  return a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0;
}
// The same values (widened to fp64), whatever each is held in.
bool same_bits(const AnyTensor4& a, const AnyTensor4& b) { return same_bits(a.as<double>(), b.as<double>()); }
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

Problem shape(int64_t B, int64_t H_q, int64_t H_kv, int64_t N_q, int64_t N_k, int64_t d) {
  Problem p;
  p.B = B, p.H_q = H_q, p.H_kv = H_kv, p.N_q = N_q, p.N_k = N_k, p.d = d;
  return p;
}

TEST(Inputs, SideBySideEqualsTheSerialPass) {
  // Odd and even element counts, so that the normal distribution's cached value carries from one
  // tensor to the next in every combination; one element per tensor; every dtype, value mode, layout.
  const Problem shapes[] = {shape(1, 1, 1, 3, 5, 7), shape(2, 3, 1, 5, 4, 3), shape(1, 1, 1, 1, 1, 1),
                            shape(1, 2, 2, 1, 3, 1), shape(1, 4, 2, 33, 17, 16)};
  int checked = 0;
  for (const Problem& p : shapes)
    for (Dtype dt : {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16})
      for (Values v : {Values::Normal, Values::Large, Values::Ties, Values::WideV})
        for (Layout l : {Layout::BHSD, Layout::BSHD})
          for (uint64_t seed : {1ull, 7ull, 12345ull}) {
            const Inputs a = make_inputs(p, l, dt, seed, v), b = serial_inputs(p, l, dt, seed, v);
            const std::string at = to_string(dt) + " " + to_string(v) + " seed " + std::to_string(seed) + " Nq " +
                                   std::to_string(p.N_q) + " Nk " + std::to_string(p.N_k);
            EXPECT_EQ(a.Q.dtype(), dt) << "make_inputs holds Q in the dtype's storage type, " << at;
            EXPECT_EQ(a.Q.bytes(), a.Q.size() * size_t(bytes_of(dt))) << at;
            EXPECT_TRUE(same_bits(a.Q, b.Q)) << "Q " << at;
            EXPECT_TRUE(same_bits(a.K, b.K)) << "K " << at;
            EXPECT_TRUE(same_bits(a.V, b.V)) << "V " << at;
            EXPECT_TRUE(same_bits(a.dO, b.dO)) << "dO " << at;
            ++checked;
          }
  EXPECT_EQ(checked, 5 * 4 * 4 * 2 * 3);
}

TEST(Inputs, TheSameOnOneThreadAndOnMany) {
  const Problem p = shape(1, 2, 1, 65, 31, 8);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const Inputs one = make_inputs(p, Layout::BHSD, Dtype::BF16, 3);
  omp_set_num_threads(4);
  const Inputs four = make_inputs(p, Layout::BHSD, Dtype::BF16, 3);
  omp_set_num_threads(before);
  EXPECT_TRUE(same_bits(one.Q, four.Q) && same_bits(one.K, four.K) && same_bits(one.V, four.V) &&
              same_bits(one.dO, four.dO));
}

TEST(Inputs, ACarriedValueThatRoundsToZeroIsRedrawn) {
  // A draw that maps some normals to 1e-30 (0 in fp16): both the tensors' own redraws and a carried
  // value that rounds to 0 must give the serial pass's values. Two tensors of 3 elements each
  // share one distribution serially; seeds are searched until the carried value is such a zero.
  auto draw = [](std::mt19937_64& r, auto& normal) {
    const double x = normal(r);
    return x > 0.8 ? 1e-30 : x;
  };
  int carried_zero = 0;
  for (uint64_t seed = 1; seed < 400; ++seed) {
    Tensor4<double> a1 = make_tensor4<double>(Layout::BHSD, 1, 1, 1, 3), b1 = a1, a2 = a1, b2 = a1;
    // Serial: one distribution through both tensors.
    std::mt19937_64 r1 = reference::stream(seed, 1), r2 = reference::stream(seed, 2);
    std::normal_distribution<double> nd(0.0, 1.0);
    auto shared = [&](std::mt19937_64& r) { return nd(r); };
    int zeros_at_start_of_2 = 0;
    auto serial = [&](Tensor4<double>& t, std::mt19937_64& rng, bool second) {
      bool first = true;
      for (double& e : t.data) {
        double x;
        do {
          x = round_to(Dtype::F16, draw(rng, shared));
          if (second && first && x == 0.0) ++zeros_at_start_of_2;
          first = false;
        } while (x == 0.0);
        e = x;
      }
    };
    serial(a1, r1, false);
    serial(a2, r2, true);
    // Side by side.
    const reference::Filled f1 = reference::fill_alone(b1, Dtype::F16, reference::stream(seed, 1), draw);
    const reference::Filled f2 = reference::fill_alone(b2, Dtype::F16, reference::stream(seed, 2), draw);
    reference::Carry c = reference::stitch(b1, Dtype::F16, f1, {}, draw);
    if (c.available && c.value > 0.8) ++carried_zero;
    reference::stitch(b2, Dtype::F16, f2, c, draw);
    ASSERT_TRUE(same_bits(a1, b1)) << "seed " << seed;
    ASSERT_TRUE(same_bits(a2, b2)) << "seed " << seed << " (zero redraws at the start of the second: "
                                   << zeros_at_start_of_2 << ")";
  }
  EXPECT_GT(carried_zero, 0) << "no seed carried a value that rounds to 0: the case was not exercised";
}

// The inputs in their storage type and widened to fp64 are the same values: every oracle (full,
// sampled rows, sampled columns) and the conversion to each storage type give the same bits.
TEST(Inputs, EveryReaderSeesTheSameBitsAsOfAnFp64Copy) {
  Problem p = shape(2, 4, 2, 37, 29, 8);
  p.mask.causal = true;
  int checked = 0;
  for (Dtype dt : {Dtype::F32, Dtype::BF16, Dtype::F16})
    for (Layout l : {Layout::BHSD, Layout::BSHD}) {
      const Inputs in = make_inputs(p, l, dt, 5, Values::WideV);
      const Inputs wide{dt, in.Q.as<double>(), in.K.as<double>(), in.V.as<double>(), in.dO.as<double>()};
      ASSERT_EQ(in.Q.dtype(), dt);
      ASSERT_EQ(wide.Q.dtype(), Dtype::F64);
      const std::string at = to_string(dt) + " " + to_string(l);
      const Oracle a = run_oracle(p, in, true), b = run_oracle(p, wide, true);
      for (auto [x, y] : {std::pair{&a.O, &b.O}, {&a.dQ, &b.dQ}, {&a.dK, &b.dK}, {&a.dV, &b.dV}, {&a.fwd.O, &b.fwd.O},
                          {&a.bwd.dQ, &b.bwd.dQ}, {&a.bwd.dK, &b.bwd.dK}, {&a.bwd.dV, &b.bwd.dV}})
        EXPECT_TRUE(same_bits(*x, *y)) << at;
      EXPECT_TRUE(same_bits(a.LSE.data, b.LSE.data)) << at;
      const Sample smp = choose_sample(p, 12, 3);
      const RowOracle ra = row_oracle(p, in, smp.rows, true), rb = row_oracle(p, wide, smp.rows, true);
      EXPECT_TRUE(same_bits(ra.O, rb.O) && same_bits(ra.LSE, rb.LSE) && same_bits(ra.dQ, rb.dQ) &&
                  same_bits(ra.bound_dQ, rb.bound_dQ)) << at;
      const ColumnOracle ca = column_oracle(p, in, as_const(a.O.view()), as_const(a.LSE.view()), smp.columns);
      const ColumnOracle cb = column_oracle(p, wide, as_const(a.O.view()), as_const(a.LSE.view()), smp.columns);
      EXPECT_TRUE(same_bits(ca.dK, cb.dK) && same_bits(ca.dV, cb.dV) && same_bits(ca.bound_dK, cb.bound_dK)) << at;
      const Tensor4<float> fa = in.V.as<float>(), fb = wide.V.as<float>();
      EXPECT_EQ(0, std::memcmp(fa.data.data(), fb.data.data(), fa.data.size() * sizeof(float))) << at;
      const Tensor4<bf16_t> ha = in.dO.as<bf16_t>(), hb = wide.dO.as<bf16_t>();
      EXPECT_EQ(0, std::memcmp(ha.data.data(), hb.data.data(), ha.data.size() * sizeof(bf16_t))) << at;
      ++checked;
    }
  EXPECT_EQ(checked, 6);
}

}  // namespace
}  // namespace burstlab
