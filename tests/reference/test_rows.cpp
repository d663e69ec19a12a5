// The row-sampled oracle (reference/rows.hpp, spec §9.11) on problems small enough for the full
// one:
//   * sampled rows equal the full oracle's rows, and their §9 bounds the full bounds, to fp64
//     rounding, for every mask kind, GQA/MQA, ragged N_q != N_k both ways, fully masked rows;
//   * the column check fed the oracle's own O and LSE reproduces the oracle's dK, dV;
//   * the sample: K distinct sorted positions, first and last, empty rows and keys when the mask
//     has them, deterministic in the seed;
//   * a naive fp32 candidate (reference<float>) passes both checks (bounds not too tight);
//   * a dropped block of dK, a perturbed row of O, a shifted LSE on one row are caught;
//   * inputs where they lie (Stored4: bf16 words in strided memory, fp32 with negative strides)
//     give the bits of fp64 Inputs holding the same values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"
#include "reference.hpp"
#include "rows.hpp"
#include "testutil.hpp"
#include "tolerance.hpp"

namespace burstlab {
namespace {

using testutil::make_problem;

struct Shape {
  int64_t B, H_q, H_kv, N_q, N_k, d;
  const char* mask;
  Layout layout;
};
std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "B=" << s.B << " Hq=" << s.H_q << " Hkv=" << s.H_kv << " Nq=" << s.N_q << " Nk=" << s.N_k
            << " d=" << s.d << " mask=" << s.mask << " " << to_string(s.layout);
}

// |a - b| <= tol * scale, where -inf must meet -inf.
void expect_close(double got, double want, double tol, const std::string& what) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  EXPECT_LE(std::fabs(got - want), tol) << what << ": got " << got << " want " << want;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

// All rows and all columns of the problem, in flattened order.
Sample everything(const Problem& p) {
  Sample s;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H_q; ++h)
      for (int64_t i = 0; i < p.N_q; ++i) s.rows.push_back({b, h, i});
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H_kv; ++h)
      for (int64_t j = 0; j < p.N_k; ++j) s.columns.push_back({b, h, j});
  return s;
}

class RowsEqualOracle : public ::testing::TestWithParam<Shape> {};

// fp64 rounding of an O(N d)-term sum relative to its magnitude: 1e-12 leaves a wide margin.
constexpr double kRound = 1e-12;

TEST_P(RowsEqualOracle, RowsColumnsAndBounds) {
  const Shape& s = GetParam();
  const Problem p = make_problem(s.B, s.H_q, s.H_kv, s.N_q, s.N_k, s.d, s.mask, 7);
  const Inputs in = make_inputs(p, s.layout, Dtype::F32, 11);
  const Oracle o = run_oracle(p, in, true);
  const Sample all = everything(p);
  const RowOracle rows = row_oracle(p, in, all.rows, true);
  const ColumnOracle cols = column_oracle(p, in, o.O.view(), o.LSE.view(), all.columns);
  const int64_t d = p.d;
  const double sO = max_abs(rows.O) + 1, sdQ = max_abs(rows.dQ) + 1, sdK = max_abs(cols.dK) + 1,
               sdV = max_abs(cols.dV) + 1;
  int empty_rows = 0;
  for (size_t r = 0; r < all.rows.size(); ++r) {
    const RowId& q = all.rows[r];
    const std::string at = "row (" + std::to_string(q.b) + "," + std::to_string(q.h) + "," + std::to_string(q.i) + ")";
    expect_close(rows.LSE[r], o.LSE.view()(q.b, q.h, q.i), kRound * (1 + std::fabs(rows.LSE[r])), at + " LSE");
    expect_close(rows.bound_LSE[r], o.fwd.LSE.view()(q.b, q.h, q.i), 1e-9 * rows.bound_LSE[r], at + " bound LSE");
    empty_rows += std::isinf(rows.LSE[r]);
    for (int64_t k = 0; k < d; ++k) {
      expect_close(rows.O[r * d + k], o.O.view()(q.b, q.h, q.i, k), kRound * sO, at + " O");
      expect_close(rows.dQ[r * d + k], o.dQ.view()(q.b, q.h, q.i, k), kRound * sdQ, at + " dQ");
      const double bO = o.fwd.O.view()(q.b, q.h, q.i, k), bdQ = o.bwd.dQ.view()(q.b, q.h, q.i, k);
      expect_close(rows.bound_O[r * d + k], bO, 1e-9 * bO, at + " bound O");
      expect_close(rows.bound_dQ[r * d + k], bdQ, 1e-9 * bdQ, at + " bound dQ");
    }
  }
  for (size_t r = 0; r < all.columns.size(); ++r) {
    const ColumnId& q = all.columns[r];
    const std::string at = "column (" + std::to_string(q.b) + "," + std::to_string(q.h) + "," + std::to_string(q.j) + ")";
    for (int64_t k = 0; k < d; ++k) {
      expect_close(cols.dK[r * d + k], o.dK.view()(q.b, q.h, q.j, k), kRound * sdK, at + " dK");
      expect_close(cols.dV[r * d + k], o.dV.view()(q.b, q.h, q.j, k), kRound * sdV, at + " dV");
      // The conditional bound drops the propagation of the forward's errors: never above (9.8)-(9.9).
      EXPECT_LE(cols.bound_dK[r * d + k], o.bwd.dK.view()(q.b, q.h, q.j, k) * (1 + 1e-9)) << at;
      EXPECT_LE(cols.bound_dV[r * d + k], o.bwd.dV.view()(q.b, q.h, q.j, k) * (1 + 1e-9)) << at;
    }
  }
  // The oracle's own outputs pass both checks with room.
  SampledOracle so{all, rows};
  for (const Metrics& m : testutil::cat(check_sampled_forward(so, p, o.O.view(), o.LSE.view()),
                                        check_sampled_backward(so, p, in, o.O.view(), o.LSE.view(), o.dQ.view(),
                                                               o.dK.view(), o.dV.view()))) {
    EXPECT_TRUE(m.pass()) << m.tensor << " " << m.first_wrong;
    EXPECT_LT(m.err_bound, 1e-2) << m.tensor;
  }
  const std::string mk = s.mask;
  const bool has_empty = mk.find("document") != std::string::npos || (mk.find("causal") != std::string::npos && s.N_q > s.N_k);
  if (has_empty) {
    EXPECT_GT(empty_rows, 0) << "this case is meant to have fully masked rows";
  }
}

INSTANTIATE_TEST_SUITE_P(
    MaskKinds, RowsEqualOracle,
    ::testing::Values(Shape{2, 4, 2, 37, 53, 5, "none", Layout::BHSD},
                      Shape{2, 4, 2, 53, 37, 5, "causal", Layout::BHSD},
                      Shape{1, 4, 2, 37, 53, 5, "causal", Layout::BSHD},
                      Shape{1, 4, 1, 41, 41, 3, "window:4,2", Layout::BHSD},
                      Shape{2, 2, 2, 53, 37, 5, "document:3", Layout::BSHD},
                      Shape{1, 4, 2, 37, 53, 5, "block:7x9@0.5", Layout::BHSD},
                      Shape{1, 4, 1, 53, 37, 4, "causal+document:3+block:8x8@0.6", Layout::BHSD},
                      Shape{1, 1, 1, 1, 1, 1, "none", Layout::BHSD}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return testutil::param_name("B" + std::to_string(s.B) + "_Hq" + std::to_string(s.H_q) + "_Hkv" +
                                  std::to_string(s.H_kv) + "_Nq" + std::to_string(s.N_q) + "_Nk" +
                                  std::to_string(s.N_k) + "_d" + std::to_string(s.d) + "_" + s.mask + "_" +
                                  to_string(s.layout));
    });

// ---------------------------------------------------------------- the sample
TEST(Sample, DistinctSortedFirstLastEmptyDeterministic) {
  const Problem p = make_problem(2, 4, 2, 300, 200, 8, "causal+document:4", 3);
  const Sample a = choose_sample(p, 20, 5), b = choose_sample(p, 20, 5), c = choose_sample(p, 20, 6);
  ASSERT_EQ(a.rows.size(), 20u);
  ASSERT_EQ(a.columns.size(), 20u);
  auto rflat = [&](const RowId& r) { return (r.b * p.H_q + r.h) * p.N_q + r.i; };
  auto cflat = [&](const ColumnId& r) { return (r.b * p.H_kv + r.h) * p.N_k + r.j; };
  for (size_t t = 1; t < a.rows.size(); ++t) EXPECT_LT(rflat(a.rows[t - 1]), rflat(a.rows[t]));
  for (size_t t = 1; t < a.columns.size(); ++t) EXPECT_LT(cflat(a.columns[t - 1]), cflat(a.columns[t]));
  EXPECT_EQ(rflat(a.rows.front()), 0);
  EXPECT_EQ(rflat(a.rows.back()), p.B * p.H_q * p.N_q - 1);
  EXPECT_EQ(cflat(a.columns.front()), 0);
  EXPECT_EQ(cflat(a.columns.back()), p.B * p.H_kv * p.N_k - 1);
  // The generated document mask has a document with queries and no keys: its rows are empty.
  const MaskData md = compile_mask(p);
  const MaskParams m = md.params();
  auto row_empty = [&](int64_t i) {
    for (int64_t j = 0; j < p.N_k; ++j)
      if (visible(m, i, j)) return false;
    return true;
  };
  int empty = 0;
  for (const RowId& r : a.rows) empty += row_empty(r.i);
  EXPECT_GE(empty, 1);
  for (size_t t = 0; t < a.rows.size(); ++t) EXPECT_EQ(rflat(a.rows[t]), rflat(b.rows[t]));
  bool differs = false;
  for (size_t t = 0; t < a.rows.size(); ++t) differs = differs || rflat(a.rows[t]) != rflat(c.rows[t]);
  EXPECT_TRUE(differs) << "another seed should draw other random rows";
  // K at least the population: everything.
  const Problem tiny = make_problem(1, 2, 1, 3, 4, 2, "none", 1);
  const Sample t = choose_sample(tiny, 64, 1);
  EXPECT_EQ(t.rows.size(), 6u);
  EXPECT_EQ(t.columns.size(), 4u);
}

TEST(Sample, KeysNoRowSeesAreSampled) {
  // One block row, six block columns of 10 keys; the third is off: keys 20..29 are seen by no row.
  Problem p = make_problem(1, 1, 1, 40, 60, 4, "none", 1);
  p.mask.block_q = 40;
  p.mask.block_k = 10;
  p.mask.block_mask = {1, 1, 0, 1, 1, 1};
  validate(p);
  for (uint64_t seed : {1, 2, 3}) {
    const Sample s = choose_sample(p, 6, seed);
    int unseen = 0;
    for (const ColumnId& c : s.columns) unseen += c.j >= 20 && c.j < 30;
    EXPECT_GE(unseen, 1) << "seed " << seed;
    EXPECT_TRUE(std::any_of(s.columns.begin(), s.columns.end(), [](const ColumnId& c) { return c.j == 20; }))
        << "the first unseen key";
  }
}

// ---------------------------------------------------------------- a naive fp32 candidate passes
struct FloatRun {
  Tensor4<double> O, dQ, dK, dV;
  Tensor3<double> LSE;
};
FloatRun run_float(const Problem& p, const Inputs& in) {
  const testutil::RefRun<float> r = testutil::run_reference<float>(p, convert<float>(in.Q), convert<float>(in.K),
                                                                   convert<float>(in.V), convert<float>(in.dO));
  return {to_double(r.O), to_double(r.dQ), to_double(r.dK), to_double(r.dV), to_double(r.LSE)};
}

TEST(SampledCheck, NaiveFp32PassesEveryMaskAndValueMode) {
  double worst_rows = 0, worst_cols = 0;
  for (const char* mask : {"none", "causal", "window:16,0", "document:3", "block:16x16@0.5", "causal+document:2+block:8x8"})
    for (Values v : {Values::Normal, Values::Large, Values::Ties, Values::WideV})
      for (auto [N_q, N_k] : {std::pair<int64_t, int64_t>{113, 203}, {203, 113}}) {
        const Problem p = make_problem(1, 4, 2, N_q, N_k, 16, mask, 3);
        const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F32, 5, v);
        const SampledOracle so = sampled_oracle(p, in, 24, 9, true);
        const FloatRun r = run_float(p, in);
        const auto f = check_sampled_forward(so, p, r.O.view(), r.LSE.view());
        const auto b = check_sampled_backward(so, p, in, r.O.view(), r.LSE.view(), r.dQ.view(), r.dK.view(), r.dV.view());
        for (const Metrics& m : testutil::cat(f, b)) {
          EXPECT_TRUE(m.pass()) << mask << " " << to_string(v) << " " << N_q << "x" << N_k << " " << m.tensor << " "
                                << m.first_wrong;
          (m.tensor == "dK" || m.tensor == "dV" ? worst_cols : worst_rows) =
              std::max(m.tensor == "dK" || m.tensor == "dV" ? worst_cols : worst_rows, m.err_bound);
        }
      }
  std::printf("naive fp32: worst err/bound rows (O, LSE, dQ) %.3g, columns (dK, dV, eq. 9.12-9.13) %.3g\n",
              worst_rows, worst_cols);
}

// ---------------------------------------------------------------- wrong candidates are caught
TEST(SampledCheck, DroppedBlockOfDKIsCaught) {
  // Rows [N_q/2, N_q) of every q-head do not reach keys [0, N_k/3): a ring step's dK, dV block
  // that never arrived. dO = 0 on those rows removes exactly their contributions.
  const Problem p = make_problem(1, 4, 2, 96, 96, 8, "causal", 1);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 2);
  const Oracle o = run_oracle(p, in, true);
  Inputs cut = in;
  for (int64_t h = 0; h < p.H_q; ++h)
    for (int64_t i = p.N_q / 2; i < p.N_q; ++i)
      for (int64_t k = 0; k < p.d; ++k) cut.dO.f64().view()(0, h, i, k) = 0;
  Tensor4<double> dQ = o.dQ, dK = o.dK, dV = o.dV;
  reference::backward<double>(p, in.Q.f64().view(), in.K.f64().view(), in.V.f64().view(), o.O.view(), as_const(cut.dO.f64().view()), o.LSE.view(),
                              dQ.view(), dK.view(), dV.view());
  Tensor4<double> bad_dK = o.dK, bad_dV = o.dV;
  for (int64_t hk = 0; hk < p.H_kv; ++hk)
    for (int64_t j = 0; j < p.N_k / 3; ++j)
      for (int64_t k = 0; k < p.d; ++k) {
        bad_dK.view()(0, hk, j, k) = dK.view()(0, hk, j, k);
        bad_dV.view()(0, hk, j, k) = dV.view()(0, hk, j, k);
      }
  const SampledOracle so = sampled_oracle(p, in, 8, 1, true);
  const auto ms = check_sampled_backward(so, p, in, o.O.view(), o.LSE.view(), o.dQ.view(), as_const(bad_dK.view()), as_const(bad_dV.view()));
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_TRUE(ms[0].pass()) << "dQ is untouched";
  EXPECT_FALSE(ms[1].pass()) << "dK";
  EXPECT_FALSE(ms[2].pass()) << "dV";
  EXPECT_NE(ms[1].first_wrong.find("(b=0, h=0, i=0, k=0)"), std::string::npos) << ms[1].first_wrong;
}

TEST(SampledCheck, PerturbedRowOfOIsCaughtWhenSampled) {
  const Problem p = make_problem(1, 2, 1, 64, 80, 8, "causal", 1);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 3);
  const Oracle o = run_oracle(p, in, false);
  const SampledOracle so = sampled_oracle(p, in, 10, 4, false);
  const RowId hit = so.sample.rows[3];
  Tensor4<double> O = o.O;
  for (int64_t k = 0; k < p.d; ++k) O.view()(hit.b, hit.h, hit.i, k) *= 1 + 1e-3;
  auto f = check_sampled_forward(so, p, as_const(O.view()), o.LSE.view());
  EXPECT_FALSE(f[0].pass());
  EXPECT_EQ(f[0].wrong, p.d);
  EXPECT_TRUE(f[1].pass());
  // The limit of sampling (§9.11): a row outside the sample is not seen.
  int64_t miss = 0;
  while (std::any_of(so.sample.rows.begin(), so.sample.rows.end(),
                     [&](const RowId& r) { return r.b == 0 && r.h == 0 && r.i == miss; }))
    ++miss;
  O = o.O;
  for (int64_t k = 0; k < p.d; ++k) O.view()(0, 0, miss, k) += 1;
  f = check_sampled_forward(so, p, as_const(O.view()), o.LSE.view());
  EXPECT_TRUE(f[0].pass()) << "row " << miss << " is not sampled";
}

TEST(SampledCheck, ShiftedLSEIsCaughtByRowsAndColumns) {
  const Problem p = make_problem(1, 2, 2, 53, 53, 8, "none", 1);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 5);
  const Oracle o = run_oracle(p, in, true);
  const SampledOracle so = sampled_oracle(p, in, 6, 2, true);
  // The last row is always sampled; every row sees key 0, which is always sampled.
  Tensor3<double> L = o.LSE;
  L.view()(0, 1, p.N_q - 1) += 1e-3;
  const auto f = check_sampled_forward(so, p, o.O.view(), as_const(L.view()));
  EXPECT_FALSE(f[1].pass()) << "LSE";
  EXPECT_EQ(f[1].wrong, 1);
  // dK, dV computed from the correct LSE but reported with the shifted one: the columns of kv-head 1
  // disagree with the conditional reference.
  const auto b = check_sampled_backward(so, p, in, o.O.view(), as_const(L.view()), o.dQ.view(), o.dK.view(), o.dV.view());
  EXPECT_FALSE(b[1].pass()) << "dK";
  EXPECT_FALSE(b[2].pass()) << "dV";
  // A non-finite LSE on a row that sees a sampled key leaves the column's reference undefined.
  L = o.LSE;
  L.view()(0, 0, 0) = -std::numeric_limits<double>::infinity();
  const auto nf = check_sampled_backward(so, p, in, o.O.view(), as_const(L.view()), o.dQ.view(), o.dK.view(), o.dV.view());
  EXPECT_FALSE(nf[1].pass());
  EXPECT_NE(nf[1].first_wrong.find("want nan"), std::string::npos) << nf[1].first_wrong;
}

TEST(SampledCheck, BadPositionsAndShapesAreErrors) {
  const Problem p = make_problem(1, 2, 1, 8, 8, 4, "none", 1);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 5);
  EXPECT_THROW(choose_sample(p, 0, 1), Error);
  EXPECT_THROW(row_oracle(p, in, {{0, 2, 0}}, false), Error);
  const Oracle o = run_oracle(p, in, false);
  EXPECT_THROW(column_oracle(p, in, o.O.view(), o.LSE.view(), {{0, 0, 8}}), Error);
}

// ---------------------------------------------------------------- inputs where they lie
// A 4-D tensor's values stored as bf16 bits in a (B, N, H, 2d) buffer (every other feature), or as
// fp32 with N reversed (negative strides): what a Python caller's tensors look like.
struct Stored {
  std::vector<uint16_t> b16;
  std::vector<float> f32;
  Stored4 s;
};
Stored store(const Tensor4<double>& t, Dtype dtype) {
  Stored r;
  const View4<const double> v = t.view();
  const int64_t B = v.dim[0], H = v.dim[1], N = v.dim[2], d = v.dim[3];
  r.s.dtype = dtype;
  for (int a = 0; a < 4; ++a) r.s.dim[a] = v.dim[a];
  if (dtype == Dtype::BF16) {
    r.b16.assign(size_t(B * N * H * 2 * d), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < d; ++k) {
            const float x = static_cast<float>(v(b, h, n, k));  // already a bf16 value: exact
            uint32_t w;
            std::memcpy(&w, &x, 4);
            r.b16[size_t(((b * N + n) * H + h) * 2 * d + 2 * k)] = uint16_t(w >> 16);
          }
    r.s.base = reinterpret_cast<const char*>(r.b16.data());
    const int64_t e[4] = {N * H * 2 * d, 2 * d, H * 2 * d, 2};
    for (int a = 0; a < 4; ++a) r.s.bytes[a] = 2 * e[a];
  } else {
    r.f32.assign(size_t(B * H * N * d), 0.f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < d; ++k) r.f32[size_t(((b * H + h) * N + (N - 1 - n)) * d + k)] = float(v(b, h, n, k));
    r.s.base = reinterpret_cast<const char*>(r.f32.data() + (N - 1) * d);  // row n at -n rows
    const int64_t e[4] = {H * N * d, N * d, -d, 1};
    for (int a = 0; a < 4; ++a) r.s.bytes[a] = 4 * e[a];
  }
  return r;
}

TEST(StoredInputs, StridedBf16AndFp32GiveTheBitsOfFp64Inputs) {
  for (Dtype dt : {Dtype::BF16, Dtype::F32})
    for (const char* mask : {"causal", "document:3", "block:8x8@0.5"}) {
      const Problem p = make_problem(2, 4, 2, 37, 45, 6, mask, 3);
      const Inputs in = as_fp64(make_inputs(p, Layout::BHSD, dt, 5));  // values representable in dt
      const Oracle o = run_oracle(p, in, true);
      const Stored Q = store(in.Q.f64(), dt), K = store(in.K.f64(), dt), V = store(in.V.f64(), dt),
                   dO = store(in.dO.f64(), dt);
      Tensor4<double> O_dt = o.O;  // the run's O as a candidate of dt would hold it
      for (double& x : O_dt.data) x = dt == Dtype::BF16 ? double(round_to_bf16(float(x))) : double(float(x));
      const Stored O = store(O_dt, dt);
      for (const auto& [t, st] : {std::pair{&in.Q.f64(), &Q}, {&in.K.f64(), &K}, {&in.V.f64(), &V}, {&in.dO.f64(), &dO}, {&O_dt, &O}}) {
        const View4<const double> v = as_const(t->view());
        for (int64_t b = 0; b < v.dim[0]; ++b)
          for (int64_t h = 0; h < v.dim[1]; ++h)
            for (int64_t n = 0; n < v.dim[2]; ++n)
              for (int64_t k = 0; k < v.dim[3]; ++k)
                ASSERT_EQ(st->s(b, h, n, k), v(b, h, n, k)) << to_string(dt) << " " << b << h << n << k;
      }
      const StoredInputs si{dt, Q.s, K.s, V.s, dO.s};
      const Sample sm = choose_sample(p, 20, 4);
      const RowOracle a = row_oracle(p, in, sm.rows, true), b = row_oracle(p, si, sm.rows, true);
      const ColumnOracle c = column_oracle(p, in, as_const(O_dt.view()), o.LSE.view(), sm.columns);
      const ColumnOracle e = column_oracle(p, si, O.s, o.LSE.view(), sm.columns);
      auto same = [&](const std::vector<double>& x, const std::vector<double>& y, const char* what) {
        ASSERT_EQ(x.size(), y.size()) << what;
        EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(double))) << to_string(dt) << " " << mask
                                                                                 << " " << what;
      };
      same(a.O, b.O, "O");
      same(a.LSE, b.LSE, "LSE");
      same(a.dQ, b.dQ, "dQ");
      same(a.bound_O, b.bound_O, "bound_O");
      same(a.bound_dQ, b.bound_dQ, "bound_dQ");
      same(c.dK, e.dK, "dK");
      same(c.dV, e.dV, "dV");
      same(c.bound_dK, e.bound_dK, "bound_dK");
    }
  const Problem p = make_problem(1, 2, 1, 8, 8, 4, "none", 1);
  const Inputs in = as_fp64(make_inputs(p, Layout::BHSD, Dtype::F32, 5));
  const Stored Q = store(in.Q.f64(), Dtype::F32);
  const StoredInputs short_k{Dtype::F32, Q.s, Q.s, Q.s, Q.s};  // K with H_q heads: the wrong shape
  EXPECT_THROW(row_oracle(p, short_k, {{0, 0, 0}}, false), Error);
}

}  // namespace
}  // namespace burstlab
