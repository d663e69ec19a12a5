// The merge (spec §4.3): identity (0, -inf), bitwise commutativity, -inf guards, and that merging
// the partials of a split of the keys reproduces the whole (oracle partials, eq. 4.2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "burstlab/merge.hpp"
#include "harness.hpp"
#include "reference.hpp"

namespace burstlab {
namespace {

constexpr double kNinf = -std::numeric_limits<double>::infinity();

template <class T>
bool same_bits(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

TEST(Merge, IdentityBothSides) {
  std::mt19937_64 rng(1);
  std::normal_distribution<double> n(0, 3);
  for (int rep = 0; rep < 100; ++rep) {
    double o[4], z[4] = {0, 0, 0, 0};
    for (double& x : o) x = n(rng);
    const double L = n(rng);
    double a[4], La = L;
    std::memcpy(a, o, sizeof a);
    merge_row<double, double>(a, 1, &La, z, 1, kNinf, 4);  // x (+) identity
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(same_bits(a[k], o[k]));
    EXPECT_TRUE(same_bits(La, L));
    double b[4] = {0, 0, 0, 0}, Lb = kNinf;
    merge_row<double, double>(b, 1, &Lb, o, 1, L, 4);  // identity (+) x
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(same_bits(b[k], o[k]));
    EXPECT_TRUE(same_bits(Lb, L));
  }
}

TEST(Merge, BothEmptyStaysIdentityNoNan) {
  double w_a, w_b, L;
  merge_weights(kNinf, kNinf, &w_a, &w_b, &L);
  EXPECT_EQ(L, kNinf);
  EXPECT_EQ(w_a, 0.0);
  EXPECT_EQ(w_b, 0.0);
  double o[2] = {0, 0}, z[2] = {0, 0}, Lo = kNinf;
  merge_row<double, double>(o, 1, &Lo, z, 1, kNinf, 2);
  EXPECT_EQ(o[0], 0.0);
  EXPECT_EQ(o[1], 0.0);
  EXPECT_EQ(Lo, kNinf);
  float of[1] = {0}, zf[1] = {0}, Lf = -HUGE_VALF;
  merge_row<float, float>(of, 1, &Lf, zf, 1, -HUGE_VALF, 1);
  EXPECT_FALSE(std::isnan(of[0]));
  EXPECT_EQ(Lf, -HUGE_VALF);
}

TEST(Merge, CommutativeBitwise) {
  std::mt19937_64 rng(2);
  std::normal_distribution<double> n(0, 1);
  for (int rep = 0; rep < 1000; ++rep) {
    double oa[3], ob[3];
    for (int k = 0; k < 3; ++k) { oa[k] = n(rng); ob[k] = n(rng); }
    double La = 50 * n(rng), Lb = rep % 7 == 0 ? La : 50 * n(rng);  // include equal LSEs
    double x[3], y[3], Lx = La, Ly = Lb;
    std::memcpy(x, oa, sizeof x);
    std::memcpy(y, ob, sizeof y);
    merge_row<double, double>(x, 1, &Lx, ob, 1, Lb, 3);
    merge_row<double, double>(y, 1, &Ly, oa, 1, La, 3);
    EXPECT_TRUE(same_bits(Lx, Ly));
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(x[k], y[k])) << rep;
    // float storage with float accumulation too
    float xf[3], yf[3], of_a[3], of_b[3];
    for (int k = 0; k < 3; ++k) { xf[k] = of_a[k] = float(oa[k]); yf[k] = of_b[k] = float(ob[k]); }
    float Lxf = float(La), Lyf = float(Lb);
    merge_row<float, float>(xf, 1, &Lxf, of_b, 1, float(Lb), 3);
    merge_row<float, float>(yf, 1, &Lyf, of_a, 1, float(La), 3);
    EXPECT_TRUE(same_bits(Lxf, Lyf));
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(xf[k], yf[k]));
  }
}

TEST(Merge, HugeLseGapNoOverflow) {
  double o[1] = {1}, ob[1] = {2}, L = 1e300;
  merge_row<double, double>(o, 1, &L, ob, 1, -1e300, 1);
  EXPECT_EQ(o[0], 1.0);
  EXPECT_EQ(L, 1e300);
}

// Partials of the oracle over two parts of the keys, merged, equal the whole under the fp64 rule
// of spec §9 (the merge is one more rounding per element; the rule bounds any summation order).
TEST(Merge, SplitKeysReproducesWhole) {
  Problem p;
  p.B = 2; p.H_q = 2; p.H_kv = 1; p.N_q = 9; p.N_k = 13; p.d = 4;
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 8);
  const Oracle want = run_oracle(p, in, false);
  for (int64_t split : {1, 6, 12}) {
    Tensor4<double> Oa = make_tensor4<double>(Layout::BHSD, 2, 2, 9, 4), Ob = Oa;
    Tensor3<double> La = make_tensor3<double>(2, 2, 9), Lb = La;
    Problem pa = p, pb = p;
    pa.N_k = split;
    pb.N_k = p.N_k - split;
    View4<const double> Ka = in.K.f64().view(), Va = in.V.f64().view(), Kb = Ka, Vb = Va;
    Ka.dim[2] = Va.dim[2] = split;
    Kb.dim[2] = Vb.dim[2] = p.N_k - split;
    Kb.data += split * Kb.stride[2];
    Vb.data += split * Vb.stride[2];
    reference::forward<double>(pa, in.Q.f64().view(), Ka, Va, Oa.view(), La.view());
    reference::forward<double>(pb, in.Q.f64().view(), Kb, Vb, Ob.view(), Lb.view());
    merge<double>(Oa.view(), La.view(), as_const(Ob.view()), as_const(Lb.view()));
    for (const Metrics& m : check_forward<double>(want, Oa, La))
      EXPECT_TRUE(m.pass()) << "split " << split << ": " << m.tensor << " err/bound " << m.err_bound << " "
                            << m.first_wrong;
  }
}

}  // namespace
}  // namespace burstlab
