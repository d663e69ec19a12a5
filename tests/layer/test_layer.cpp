// spec §11: the transformer layer and its checkpoint placements.
//   * the fp64 reference layer's gradients (dx and every weight) against central finite
//     differences of its own forward; cpu/ in fp64 against it;
//   * gradients (and y) bitwise equal under none, layer, remat and sequence placements, for
//     cpu/ in fp32 and fp64 on every mask kind, GQA, ragged N, fully masked rows, large logits,
//     and for reference/ where it applies; independent of the OpenMP thread count;
//   * attention forwards, recomputed rows and pairs, kept bytes against hand-computed values;
//   * the sequence-level segment choice (§11.3); bad input names the field and its value.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "layer.hpp"
#include "testutil.hpp"

namespace burstlab::layer {
namespace {

Shape make_shape(int64_t B, int64_t H_q, int64_t H_kv, int64_t N, int64_t d, int64_t D, int64_t F,
                 const std::string& mask) {
  Shape s;
  s.p = testutil::make_problem(B, H_q, H_kv, N, N, d, mask, 5);
  s.D = D;
  s.F = F;
  return s;
}

template <class T>
struct Outcome {
  std::vector<T> y;
  Grads<T> g;
  Counters c;
};

template <class T>
Outcome<T> run(const Shape& s, const Weights<T>& w, const std::vector<T>& x, const std::vector<T>& dy,
           const Checkpointing& ck, const AttentionOps<T>& attn) {
  Outcome<T> r;
  Saved<T> saved;
  r.y = forward(s, w, x, ck, attn, saved, r.c);
  r.g = backward(s, w, saved, dy, attn, r.c);
  return r;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <class T>
void expect_bitwise(const Outcome<T>& a, const Outcome<T>& b, const std::string& ctx) {
  EXPECT_TRUE(same_bits(a.y, b.y)) << ctx << " y";
  EXPECT_TRUE(same_bits(a.g.dx, b.g.dx)) << ctx << " dx";
  EXPECT_TRUE(same_bits(a.g.dWq, b.g.dWq)) << ctx << " dWq";
  EXPECT_TRUE(same_bits(a.g.dWk, b.g.dWk)) << ctx << " dWk";
  EXPECT_TRUE(same_bits(a.g.dWv, b.g.dWv)) << ctx << " dWv";
  EXPECT_TRUE(same_bits(a.g.dWo, b.g.dWo)) << ctx << " dWo";
  EXPECT_TRUE(same_bits(a.g.dW1, b.g.dW1)) << ctx << " dW1";
  EXPECT_TRUE(same_bits(a.g.dW2, b.g.dW2)) << ctx << " dW2";
}

Checkpointing placement(Placement x) {
  Checkpointing c;
  c.placement = x;
  return c;
}
Checkpointing sequence(std::vector<int64_t> bounds, std::vector<uint8_t> keep) {
  Checkpointing c;
  c.placement = Placement::Sequence;
  c.bounds = std::move(bounds);
  c.keep = std::move(keep);
  return c;
}

// ------------------------------------------------------------------ the fp64 reference layer

// L = sum(dy o y); dL/dθ ~ (L(θ + h) - L(θ - h)) / 2h. With h = 1e-6 and O(1) values the
// truncation error is ~h^2 |L'''| ~ 1e-12 and the cancellation error ~eps |L| / h with |L| ~ 10,
// ~2e-9 (measured: 5e-10 .. 4e-9); agreement to 1e-7 relative to the gradient's scale (>= 1)
// leaves a margin of ~25.
constexpr double kStep = 1e-6;
constexpr double kRel = 1e-7;

double loss(const Shape& s, const Weights<double>& w, const std::vector<double>& x, const std::vector<double>& dy) {
  Saved<double> saved;
  Counters c;
  const std::vector<double> y = forward(s, w, x, placement(Placement::None), reference_attention<double>(), saved, c);
  double L = 0;
  for (size_t e = 0; e < y.size(); ++e) L += dy[e] * y[e];
  return L;
}

// `get` picks the perturbed tensor (a weight or x) out of the copies it is handed.
template <class Get>
void check_fd(const char* name, const Shape& s, const Weights<double>& w, const std::vector<double>& x,
              const std::vector<double>& dy, Get get, const std::vector<double>& grad, const std::string& ctx) {
  Weights<double> wc = w;
  std::vector<double> xc = x;
  std::vector<double>& param = get(wc, xc);
  ASSERT_EQ(param.size(), grad.size()) << name;
  double max_err = 0, max_g = 0;
  size_t worst = 0;
  for (size_t e = 0; e < param.size(); ++e) {
    const double v0 = param[e];
    param[e] = v0 + kStep;
    const double Lp = loss(s, wc, xc, dy);
    param[e] = v0 - kStep;
    const double Lm = loss(s, wc, xc, dy);
    param[e] = v0;
    const double err = std::fabs((Lp - Lm) / (2 * kStep) - grad[e]);
    if (err > max_err) { max_err = err; worst = e; }
    max_g = std::max(max_g, std::fabs(grad[e]));
  }
  std::printf("  %-26s %-4s max|grad| %.3e  max|fd - grad| %.3e\n", ctx.c_str(), name, max_g, max_err);
  EXPECT_LE(max_err, kRel * std::max(max_g, 1.0)) << ctx << " " << name << " element " << worst;
  EXPECT_GT(max_g, 0.0) << ctx << " " << name << ": an all-zero gradient checks nothing";
}

struct FdCase {
  std::string mask;
  int64_t B, H_q, H_kv, N, d, D, F;
};
std::string case_name(const ::testing::TestParamInfo<FdCase>& info) {
  return testutil::param_name(info.param.mask) + "_Hq" + std::to_string(info.param.H_q) + "_Hkv" +
         std::to_string(info.param.H_kv);
}
class LayerFiniteDiff : public ::testing::TestWithParam<FdCase> {};

TEST_P(LayerFiniteDiff, ReferenceGradients) {
  const FdCase c = GetParam();
  const Shape s = make_shape(c.B, c.H_q, c.H_kv, c.N, c.d, c.D, c.F, c.mask);
  const Weights<double> w = make_weights<double>(s, 3);
  const std::vector<double> x = make_values<double>(tokens(s) * s.D, 11), dy = make_values<double>(tokens(s) * s.D, 12);
  const Outcome<double> r = run(s, w, x, dy, placement(Placement::None), reference_attention<double>());
  const std::string ctx = c.mask + " Hq" + std::to_string(c.H_q) + "/Hkv" + std::to_string(c.H_kv);
  using W = Weights<double>;
  using X = std::vector<double>;
  check_fd("dx", s, w, x, dy, [](W&, X& xx) -> X& { return xx; }, r.g.dx, ctx);
  check_fd("dWq", s, w, x, dy, [](W& ww, X&) -> X& { return ww.Wq; }, r.g.dWq, ctx);
  check_fd("dWk", s, w, x, dy, [](W& ww, X&) -> X& { return ww.Wk; }, r.g.dWk, ctx);
  check_fd("dWv", s, w, x, dy, [](W& ww, X&) -> X& { return ww.Wv; }, r.g.dWv, ctx);
  check_fd("dWo", s, w, x, dy, [](W& ww, X&) -> X& { return ww.Wo; }, r.g.dWo, ctx);
  check_fd("dW1", s, w, x, dy, [](W& ww, X&) -> X& { return ww.W1; }, r.g.dW1, ctx);
  check_fd("dW2", s, w, x, dy, [](W& ww, X&) -> X& { return ww.W2; }, r.g.dW2, ctx);
}

INSTANTIATE_TEST_SUITE_P(Layer, LayerFiniteDiff,
                         ::testing::Values(FdCase{"causal", 2, 4, 2, 7, 3, 6, 10},
                                           FdCase{"causal+document:3", 1, 2, 1, 9, 4, 5, 7},
                                           FdCase{"window:2,1", 1, 3, 3, 8, 2, 4, 6}),
                         case_name);

// cpu/ in fp64 computes the same function: every gradient within 1e-10 of the oracle's scale
// (fp64 sums of at most ~100 terms through a dozen dependent steps: errors ~1e-13).
TEST(Layer, CpuMatchesReferenceFp64) {
  for (const std::string mask : {"causal", "none", "causal+document:3", "block:16x16"}) {
    const Shape s = make_shape(2, 4, 2, 75, 8, 20, 36, mask);
    const Weights<double> w = make_weights<double>(s, 4);
    const std::vector<double> x = make_values<double>(tokens(s) * s.D, 5), dy = make_values<double>(tokens(s) * s.D, 6);
    const Outcome<double> ref = run(s, w, x, dy, placement(Placement::None), reference_attention<double>());
    const Outcome<double> cpu = run(s, w, x, dy, placement(Placement::None), cpu_attention<double>({16, 16}));
    auto close = [&](const char* name, const std::vector<double>& a, const std::vector<double>& b) {
      ASSERT_EQ(a.size(), b.size());
      double err = 0, scale = 0;
      for (size_t e = 0; e < a.size(); ++e) {
        err = std::max(err, std::fabs(a[e] - b[e]));
        scale = std::max(scale, std::fabs(a[e]));
      }
      EXPECT_LE(err, 1e-10 * std::max(scale, 1.0)) << mask << " " << name;
    };
    close("y", ref.y, cpu.y);
    close("dx", ref.g.dx, cpu.g.dx);
    close("dWq", ref.g.dWq, cpu.g.dWq);
    close("dWk", ref.g.dWk, cpu.g.dWk);
    close("dWv", ref.g.dWv, cpu.g.dWv);
    close("dWo", ref.g.dWo, cpu.g.dWo);
    close("dW1", ref.g.dW1, cpu.g.dW1);
    close("dW2", ref.g.dW2, cpu.g.dW2);
  }
}

// ------------------------------------------------------------------ bitwise under every placement

template <class T>
void placements_bitwise(const std::string& mask, double x_scale) {
  // N = 203 (ragged), tiles Br = 32: recomputed segments start and end at multiples of 32 or at N.
  const Shape s = make_shape(2, 4, 2, 203, 8, 24, 40, mask);
  const Weights<T> w = make_weights<T>(s, 7);
  std::vector<T> x = make_values<T>(tokens(s) * s.D, 8);
  for (T& v : x) v = static_cast<T>(double(v) * x_scale);
  const std::vector<T> dy = make_values<T>(tokens(s) * s.D, 9);
  const AttentionOps<T> attn = cpu_attention<T>({32, 16});
  const Outcome<T> none = run(s, w, x, dy, placement(Placement::None), attn);
  const std::string ctx = mask + " x*" + std::to_string(x_scale) + (sizeof(T) == 4 ? " fp32" : " fp64");
  expect_bitwise(none, run(s, w, x, dy, placement(Placement::Layer), attn), ctx + " layer");
  expect_bitwise(none, run(s, w, x, dy, placement(Placement::Remat), attn), ctx + " remat");
  expect_bitwise(none, run(s, w, x, dy, sequence({0, 96, 203}, {0, 1}), attn), ctx + " sequence half");
  expect_bitwise(none, run(s, w, x, dy, sequence({0, 192, 203}, {1, 0}), attn), ctx + " sequence tail");
  expect_bitwise(none, run(s, w, x, dy, sequence({0, 64, 128, 203}, {0, 1, 0}), attn), ctx + " sequence 0-1-0");
  expect_bitwise(none, run(s, w, x, dy, sequence({0, 203}, {0}), attn), ctx + " sequence all recomputed");
  expect_bitwise(none, run(s, w, x, dy, sequence_checkpointing(s.p, segment_bounds(203, 32), 100), attn),
                 ctx + " sequence chosen");
  // Fully masked rows and outputs the checks read: y is not all zero, no gradient is NaN.
  EXPECT_TRUE(std::any_of(none.y.begin(), none.y.end(), [](T v) { return v != T(0); }));
  for (const std::vector<T>* g : {&none.g.dx, &none.g.dWq, &none.g.dWk, &none.g.dWv, &none.g.dWo, &none.g.dW1, &none.g.dW2})
    EXPECT_TRUE(std::all_of(g->begin(), g->end(), [](T v) { return std::isfinite(double(v)); })) << ctx;
}

TEST(Layer, PlacementsBitwiseFp32) {
  for (const std::string mask : {"causal", "none", "window:17,0", "causal+document:3", "block:32x32"})
    placements_bitwise<float>(mask, 1.0);
  placements_bitwise<float>("causal", 30.0);  // logits of magnitude ~1e2-1e3
}
TEST(Layer, PlacementsBitwiseFp64) {
  for (const std::string mask : {"causal", "window:0,-1", "document:4"}) placements_bitwise<double>(mask, 1.0);
}

// reference/ has no forward over a subset of rows: none, layer, remat and a sequence placement
// that keeps every segment apply, and agree bitwise.
TEST(Layer, ReferencePlacementsBitwise) {
  const Shape s = make_shape(1, 2, 2, 37, 4, 8, 12, "causal");
  const Weights<double> w = make_weights<double>(s, 2);
  const std::vector<double> x = make_values<double>(tokens(s) * s.D, 3), dy = make_values<double>(tokens(s) * s.D, 4);
  const AttentionOps<double> attn = reference_attention<double>();
  const Outcome<double> none = run(s, w, x, dy, placement(Placement::None), attn);
  expect_bitwise(none, run(s, w, x, dy, placement(Placement::Layer), attn), "reference layer");
  expect_bitwise(none, run(s, w, x, dy, placement(Placement::Remat), attn), "reference remat");
  expect_bitwise(none, run(s, w, x, dy, sequence({0, 10, 37}, {1, 1}), attn), "reference sequence kept");
}

// The same bits whatever the OpenMP thread count (layer.cpp: one thread per output element).
TEST(Layer, ThreadCountDoesNotChangeBits) {
  const Shape s = make_shape(2, 4, 4, 130, 8, 16, 24, "causal");
  const Weights<float> w = make_weights<float>(s, 1);
  const std::vector<float> x = make_values<float>(tokens(s) * s.D, 2), dy = make_values<float>(tokens(s) * s.D, 3);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Outcome<float> one = run(s, w, x, dy, placement(Placement::None), cpu_attention<float>({32, 32}));
  omp_set_num_threads(3);
  const Outcome<float> three = run(s, w, x, dy, sequence({0, 64, 130}, {0, 1}), cpu_attention<float>({32, 32}));
  omp_set_num_threads(saved_threads);
  expect_bitwise(one, three, "1 thread none vs 3 threads sequence");
}

// ------------------------------------------------------------------ counters and kept bytes

TEST(Layer, CountersAndSavedBytes) {
  // B = 2, N = 203, H_q = 4, H_kv = 2, d = 8 (H_q d = 32, H_kv d = 16), D = 24, F = 40, causal.
  // Visible pairs per (b, h): 203 * 204 / 2 = 20706; rows [0, 96): 96 * 97 / 2 = 4656.
  const Shape s = make_shape(2, 4, 2, 203, 8, 24, 40, "causal");
  const Weights<float> w = make_weights<float>(s, 7);
  const std::vector<float> x = make_values<float>(tokens(s) * s.D, 8), dy = make_values<float>(tokens(s) * s.D, 9);
  const AttentionOps<float> attn = cpu_attention<float>({32, 16});
  const Counters none = run(s, w, x, dy, placement(Placement::None), attn).c;
  const Counters lay = run(s, w, x, dy, placement(Placement::Layer), attn).c;
  const Counters remat = run(s, w, x, dy, placement(Placement::Remat), attn).c;
  const Counters seq = run(s, w, x, dy, sequence({0, 96, 203}, {0, 1}), attn).c;
  EXPECT_EQ(none.attention_forwards, 1);
  EXPECT_EQ(lay.attention_forwards, 2);   // layer-boundary checkpointing reruns the attention forward
  EXPECT_EQ(remat.attention_forwards, 1);  // DistFlashAttn: never
  EXPECT_EQ(seq.attention_forwards, 1);
  EXPECT_EQ(seq.row_forwards, 1);
  EXPECT_EQ(none.row_forwards + lay.row_forwards + remat.row_forwards, 0);
  EXPECT_EQ(none.forward_rows, 203);
  EXPECT_EQ(lay.forward_rows, 406);
  EXPECT_EQ(seq.forward_rows, 203 + 96);
  EXPECT_EQ(none.forward_pairs, 20706);
  EXPECT_EQ(lay.forward_pairs, 41412);
  EXPECT_EQ(remat.forward_pairs, 20706);
  EXPECT_EQ(seq.forward_pairs, 20706 + 4656);  // the recompute costs 4656 / 20706 = 22% of a forward
  for (const Counters* c : {&none, &lay, &remat, &seq}) EXPECT_EQ(c->attention_backwards, 1);
  // Kept elements (eq. 11.10), B N = 406 tokens, LSE 406 x 4:
  //   none   406 (2*24 + 2*32 + 2*16 + 2*40) + 1624 = 90944 + 1624 = 92568
  //   layer  406 * 24 = 9744
  //   remat  406 (24 + 32) + 1624 = 24360
  //   seq    9744 + 2 * 107 * (32 + 4) = 17448   (rows [96, 203) kept)
  EXPECT_EQ(none.saved_bytes, 92568 * 4);
  EXPECT_EQ(lay.saved_bytes, 9744 * 4);
  EXPECT_EQ(remat.saved_bytes, 24360 * 4);
  EXPECT_EQ(seq.saved_bytes, 17448 * 4);
  EXPECT_EQ(saved_bytes(s, Placement::None, 0, 4), 92568 * 4);
  EXPECT_EQ(saved_bytes(s, Placement::Layer, 0, 4), 9744 * 4);
  EXPECT_EQ(saved_bytes(s, Placement::Remat, 0, 4), 24360 * 4);
  EXPECT_EQ(saved_bytes(s, Placement::Sequence, 107, 4), 17448 * 4);
}

// ------------------------------------------------------------------ §11.3 the segments kept

TEST(Layer, SequenceCheckpointingKeepsTheCostliestSegments) {
  const std::vector<int64_t> bounds = {0, 50, 100, 150, 203};
  EXPECT_EQ(segment_bounds(203, 50), (std::vector<int64_t>{0, 50, 100, 150, 200, 203}));
  EXPECT_EQ(segment_bounds(7, 10), (std::vector<int64_t>{0, 7}));
  // causal: row i sees i + 1 keys. Segment pairs: 1275, 3775, 6275, 9381 (= (151 + 203) 53 / 2).
  const Problem causal = testutil::make_problem(1, 1, 1, 203, 203, 4, "causal");
  EXPECT_EQ(rows_pairs(causal, 150, 203), 9381);
  EXPECT_EQ(rows_pairs(causal, 0, 50), 1275);
  EXPECT_EQ(sequence_checkpointing(causal, bounds, 100).keep, (std::vector<uint8_t>{0, 0, 0, 1}));  // 53 + 50 > 100
  EXPECT_EQ(sequence_checkpointing(causal, bounds, 103).keep, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(sequence_checkpointing(causal, bounds, 0).keep, (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(sequence_checkpointing(causal, bounds, 203).keep, (std::vector<uint8_t>{1, 1, 1, 1}));
  // BurstEngine's split: two halves, the second kept.
  EXPECT_EQ(sequence_checkpointing(causal, {0, 101, 203}, 102).keep, (std::vector<uint8_t>{0, 1}));
  // Keys at or after the query (window 0 left, unbounded right): the first rows cost the most.
  const Problem anti = testutil::make_problem(1, 1, 1, 203, 203, 4, "window:0,-1");
  EXPECT_EQ(sequence_checkpointing(anti, bounds, 100).keep, (std::vector<uint8_t>{1, 1, 0, 0}));
  // No mask: pairs proportional to rows, ties go to the later segment.
  const Problem full = testutil::make_problem(1, 1, 1, 200, 200, 4, "none");
  EXPECT_EQ(sequence_checkpointing(full, {0, 50, 100, 150, 200}, 100).keep, (std::vector<uint8_t>{0, 0, 1, 1}));
}

// ------------------------------------------------------------------ bad input

template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

TEST(Layer, BadInputNamesTheFieldAndValue) {
  const Shape s = make_shape(1, 2, 2, 40, 4, 8, 12, "causal");
  const Weights<float> w = make_weights<float>(s, 1);
  const std::vector<float> x = make_values<float>(tokens(s) * s.D, 2), dy = make_values<float>(tokens(s) * s.D, 3);
  const AttentionOps<float> cpu = cpu_attention<float>({16, 16});
  Saved<float> saved;
  Counters c;
  auto fwd = [&](const Shape& sh, const Weights<float>& ww, const std::vector<float>& xx, const Checkpointing& ck,
                 const AttentionOps<float>& a) { return forward(sh, ww, xx, ck, a, saved, c); };

  Shape cross = s;
  cross.p = testutil::make_problem(1, 2, 2, 40, 41, 4, "none");
  expect_error([&] { validate(cross); }, "N_k (41) must equal N_q (40)");
  Shape no_d = s;
  no_d.D = 0;
  expect_error([&] { validate(no_d); }, "D (0) must be >= 1");
  Shape no_f = s;
  no_f.F = -3;
  expect_error([&] { validate(no_f); }, "F (-3) must be >= 1");
  Weights<float> short_wo = w;
  short_wo.Wo.pop_back();
  expect_error([&] { fwd(s, short_wo, x, placement(Placement::None), cpu); }, "Wo has 63 elements; (H_q d, D) = (8, 8) needs 64");
  expect_error([&] { fwd(s, w, std::vector<float>(5), placement(Placement::None), cpu); }, "x has 5 elements");
  expect_error([&] { fwd(s, w, x, sequence({5, 40}, {0}), cpu); }, "bounds[0] (5) must be 0");
  expect_error([&] { fwd(s, w, x, sequence({0, 32, 32, 40}, {0, 1, 1}), cpu); },
               "bounds[2] (32) must be greater than bounds[1] (32)");
  expect_error([&] { fwd(s, w, x, sequence({0, 32}, {0}), cpu); }, "bounds[1] (32) must be N (40)");
  expect_error([&] { fwd(s, w, x, sequence({0, 32, 40}, {0}), cpu); }, "keep (1 entries) must have one entry per segment (2)");
  expect_error([&] { fwd(s, w, x, sequence({0, 32, 40}, {2, 0}), cpu); }, "keep[0] (2) must be 0 (recompute) or 1 (keep)");
  expect_error([&] { fwd(s, w, x, sequence({0, 20, 40}, {0, 1}), cpu); },
               "bound 20 of recomputed segment 0 must be a multiple of the attention's query tile (16) or N (40)");
  Checkpointing stray = placement(Placement::Remat);
  stray.bounds = {0, 40};
  expect_error([&] { fwd(s, w, x, stray, cpu); }, "bounds and keep are fields of the sequence placement; placement is remat");
  expect_error([&] { fwd(s, w, x, sequence({0, 16, 40}, {0, 1}), reference_attention<float>()); },
               "attention 'reference' has no forward over a subset of query rows");
  expect_error([] { parse_placement("full"); }, "placement (full) must be one of none, layer, remat, sequence");
  expect_error([&] { sequence_checkpointing(s.p, {0, 16, 40}, 41); }, "keep_rows (41) must lie in [0, N = 40]");
  expect_error([] { segment_bounds(10, 0); }, "rows (0) per segment must be >= 1");
  // The backward checks what it was handed.
  fwd(s, w, x, placement(Placement::Remat), cpu);
  expect_error([&] { backward(s, w, saved, std::vector<float>(3), cpu, c); }, "dy has 3 elements");
  Saved<float> broken = saved;
  broken.A.resize(7);
  expect_error([&] { backward(s, w, broken, dy, cpu, c); }, "saved.A has 7 elements");
  const Shape other = make_shape(1, 2, 2, 48, 4, 8, 12, "causal");
  expect_error([&] { backward(other, make_weights<float>(other, 1), saved, dy, cpu, c); }, "saved.x has 320 elements");
}

}  // namespace
}  // namespace burstlab::layer
