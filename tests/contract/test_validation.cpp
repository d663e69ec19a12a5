// Every validation message of src/contract.cpp (validate, validate_view, compile_mask, parsers)
// and of make_mask / parse_values (reference/harness.cpp), checked on the exact field/value text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "burstlab/error.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "harness.hpp"

namespace burstlab {
namespace {

using ::testing::HasSubstr;

// The message of the burstlab::Error that f throws ("" + a test failure when it throws nothing).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-burstlab exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected burstlab::Error, nothing was thrown";
  return "";
}

Problem ok() {
  Problem p;
  p.B = 2; p.H_q = 4; p.H_kv = 2; p.N_q = 5; p.N_k = 7; p.d = 3;
  return p;
}

// validate() and compile_mask() (which validates first) must both report it.
void expect_invalid(const Problem& p, const std::string& text) {
  EXPECT_THAT(error_of([&] { validate(p); }), HasSubstr(text));
  EXPECT_THAT(error_of([&] { compile_mask(p); }), HasSubstr(text));
}

TEST(Validate, AcceptsGoodProblem) {
  EXPECT_NO_THROW(validate(ok()));
  Problem p = ok();
  p.mask.causal = true;
  p.mask.window_left = 2;
  p.mask.q_segment = {0, 0, 1, 1, 1};
  p.mask.k_segment = {0, 1, 1, 1, 2, 2, 2};
  p.mask.block_q = 2; p.mask.block_k = 3;
  p.mask.block_mask.assign(3 * 3, 1);
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(compile_mask(p));
}

TEST(Validate, PositiveSizes) {
  struct Field { const char* name; int64_t Problem::*f; };
  for (Field fld : {Field{"B", &Problem::B}, Field{"H_q", &Problem::H_q}, Field{"H_kv", &Problem::H_kv},
                    Field{"N_q", &Problem::N_q}, Field{"N_k", &Problem::N_k}, Field{"d", &Problem::d}}) {
    for (int64_t v : {0, -3}) {
      Problem p = ok();
      p.*(fld.f) = v;
      expect_invalid(p, std::string(fld.name) + " (" + std::to_string(v) + ") must be >= 1");
    }
  }
}

TEST(Validate, GroupDivisibility) {
  Problem p = ok();
  p.H_q = 6; p.H_kv = 4;
  expect_invalid(p, "H_q (6) must be a multiple of H_kv (4)");
}

TEST(Validate, ProblemSize) {
  Problem p = ok();
  p.B = 1; p.H_q = 1; p.H_kv = 1; p.N_q = int64_t(1) << 30; p.N_k = 1; p.d = int64_t(1) << 20;
  expect_invalid(p, "problem size (B=1 Hq=1 Hkv=1 Nq=1073741824 Nk=1 d=1048576) exceeds 2^48 elements per tensor");
  Problem q = ok();
  q.N_q = int64_t(1) << 25; q.N_k = int64_t(1) << 24; q.d = 1; q.B = 1; q.H_q = 1; q.H_kv = 1;
  expect_invalid(q, "exceeds 2^48 elements per tensor");  // N_q * N_k
}

// Element counts of tensors made without a validated Problem: an error, never a wrapped product.
TEST(Validate, TensorElementCountOverflowIsAnError) {
  const int64_t big = int64_t(1) << 20;
  EXPECT_THAT(error_of([&] { make_tensor4<float>(Layout::BHSD, big, big, big, big); }),
              HasSubstr("tensor (1048576 x 1048576 x 1048576 x 1048576) has more elements than int64 holds"));
  EXPECT_THAT(error_of([&] { make_tensor3<double>(int64_t(1) << 32, int64_t(1) << 31, 2); }),
              HasSubstr("has more elements than int64 holds"));
  EXPECT_THAT(error_of([&] { make_tensor4<float>(Layout::BSHD, 1, -2, 3, 4); }),
              HasSubstr("tensor dimension (-2) must be >= 0"));
  EXPECT_EQ(element_count({int64_t(1) << 31, int64_t(1) << 31}), size_t(1) << 62);
  EXPECT_EQ(make_tensor4<float>(Layout::BHSD, 2, 3, 0, 5).data.size(), 0u);
}

TEST(Validate, Scale) {
  Problem p = ok();
  p.scale = std::numeric_limits<double>::infinity();
  expect_invalid(p, "scale (inf) must be finite");
  p.scale = std::nan("");
  expect_invalid(p, "scale (nan) must be finite");
  p.scale = 0.0;  // any finite value is allowed
  EXPECT_NO_THROW(validate(p));
  p.scale = -2.5;
  EXPECT_NO_THROW(validate(p));
}

TEST(Validate, Band) {
  Problem p = ok();
  p.mask.window_left = -3;
  expect_invalid(p, "window_left (-3) must be >= 0, or -1 for unbounded");
  p = ok();
  p.mask.window_right = -2;
  expect_invalid(p, "window_right (-2) must be >= 0, or -1 for unbounded");
}

TEST(Validate, Segments) {
  Problem p = ok();
  p.mask.k_segment = {0, 0, 0, 1, 1, 1, 1};
  expect_invalid(p, "q_segment is empty but k_segment has 7 entries: give both or neither");
  p = ok();
  p.mask.q_segment = {0, 0, 0, 1, 1};
  expect_invalid(p, "k_segment is empty but q_segment has 5 entries: give both or neither");
  p = ok();
  p.mask.q_segment = {0, 0, 1};
  p.mask.k_segment = {0, 0, 0, 1, 1, 1, 1};
  expect_invalid(p, "q_segment has 3 entries but N_q is 5");
  p = ok();
  p.mask.q_segment = {0, 0, 0, 1, 1};
  p.mask.k_segment = {0, 1};
  expect_invalid(p, "k_segment has 2 entries but N_k is 7");
  p = ok();
  p.mask.q_segment = {0, -1, 0, 1, 1};
  p.mask.k_segment = {0, 0, 0, 1, 1, 1, 1};
  expect_invalid(p, "q_segment[1] (-1) must be >= 0");
  p = ok();
  p.mask.q_segment = {0, 0, 0, 1, 1};
  p.mask.k_segment = {0, 0, 0, 1, 1, 1, -4};
  expect_invalid(p, "k_segment[6] (-4) must be >= 0");
  p = ok();
  p.mask.q_segment = {0, 1, 0, 1, 1};
  p.mask.k_segment = {0, 0, 0, 1, 1, 1, 1};
  expect_invalid(p, "q_segment[2] (0) is less than q_segment[1] (1): segment ids must be non-decreasing "
                    "(documents are contiguous)");
  p = ok();
  p.mask.q_segment = {0, 0, 0, 1, 1};
  p.mask.k_segment = {0, 0, 3, 1, 1, 1, 1};
  expect_invalid(p, "k_segment[3] (1) is less than k_segment[2] (3)");
}

TEST(Validate, Block) {
  Problem p = ok();
  p.mask.block_q = 0; p.mask.block_k = 2;
  p.mask.block_mask = {1};
  expect_invalid(p, "block_q (0) must be >= 1 when a block mask is given");
  p = ok();
  p.mask.block_q = 2; p.mask.block_k = -1;
  expect_invalid(p, "block_k (-1) must be >= 1 when a block mask is given");
  p = ok();
  p.mask.block_mask = {1, 0};  // bits but no tile sizes
  expect_invalid(p, "block_q (0) must be >= 1 when a block mask is given");
  p = ok();
  p.mask.block_q = 2; p.mask.block_k = 3;  // ceil(5/2) x ceil(7/3) = 3 x 3
  p.mask.block_mask = {1, 1, 1, 1};
  expect_invalid(p, "block_mask has 4 entries but needs ceil(N_q/block_q) x ceil(N_k/block_k) = 3 x 3 = 9");
}

TEST(ValidateView, DimsAndNull) {
  const Problem p = ok();  // Q side (2, 4, 5, 3), KV side (2, 2, 7, 3), rows (2, 4, 5)
  std::vector<double> buf(1000, 1.0);
  View4<const double> Q = as_const(view4(buf.data(), Layout::BHSD, 2, 4, 5, 3));
  View4<const double> K = as_const(view4(buf.data(), Layout::BSHD, 2, 2, 7, 3));
  EXPECT_NO_THROW(validate_views(p, Q, K, K));
  View4<const double> bad = Q;
  bad.dim[2] = 6;
  EXPECT_THAT(error_of([&] { validate_views(p, bad, K, K); }), HasSubstr("Q.dim[2] (6) must equal N (5)"));
  bad = K;
  bad.dim[0] = 1;
  EXPECT_THAT(error_of([&] { validate_views(p, Q, bad, K); }), HasSubstr("K.dim[0] (1) must equal B (2)"));
  bad = K;
  bad.dim[1] = 4;
  EXPECT_THAT(error_of([&] { validate_views(p, Q, K, bad); }), HasSubstr("V.dim[1] (4) must equal H (2)"));
  bad = Q;
  bad.dim[3] = 4;
  EXPECT_THAT(error_of([&] { validate_q_side(p, "dO", bad); }), HasSubstr("dO.dim[3] (4) must equal d (3)"));
  bad = Q;
  bad.data = nullptr;
  EXPECT_THAT(error_of([&] { validate_views(p, bad, K, K); }), HasSubstr("Q (null) must point to data"));
  View3<const double> L = as_const(view3(buf.data(), 2, 4, 5));
  EXPECT_NO_THROW(validate_rows(p, "LSE", L));
  L.dim[2] = 7;
  EXPECT_THAT(error_of([&] { validate_rows(p, "LSE", L); }), HasSubstr("LSE.dim[2] (7) must equal N (5)"));
  // validate_views validates the problem first
  Problem q = p;
  q.d = 0;
  EXPECT_THAT(error_of([&] { validate_views(q, Q, K, K); }), HasSubstr("d (0) must be >= 1"));
}

TEST(Parse, LayoutDtypeValues) {
  EXPECT_EQ(parse_layout("BSHD"), Layout::BSHD);
  EXPECT_EQ(parse_layout("bhsd"), Layout::BHSD);
  EXPECT_THAT(error_of([] { parse_layout("BHDS"); }), HasSubstr("layout (BHDS) must be BSHD or BHSD"));
  EXPECT_EQ(parse_dtype("bf16"), Dtype::BF16);
  EXPECT_EQ(parse_dtype("float"), Dtype::F32);
  EXPECT_THAT(error_of([] { parse_dtype("fp8"); }), HasSubstr("dtype (fp8) must be one of fp64, fp32, bf16, fp16"));
  EXPECT_EQ(parse_values("large"), Values::Large);
  EXPECT_EQ(parse_values(to_string(Values::WideV)), Values::WideV);
  EXPECT_THAT(error_of([] { parse_values("huge"); }), HasSubstr("values (huge) must be one of normal, large, ties, widev"));
}

TEST(MakeMask, Errors) {
  EXPECT_THAT(error_of([] { make_mask("causl", 4, 4, 1); }),
              HasSubstr("mask (causl) has unknown part 'causl'; parts: none, causal, window:L,R, "
                        "document[:n_docs], block[:BQxBK[@density]]"));
  EXPECT_THAT(error_of([] { make_mask("", 4, 4, 1); }), HasSubstr("mask () is empty"));
  EXPECT_THAT(error_of([] { make_mask("causal+", 4, 4, 1); }), HasSubstr("mask (causal+) has an empty part"));
  EXPECT_THAT(error_of([] { make_mask("causal+causal", 4, 4, 1); }),
              HasSubstr("mask (causal+causal) gives part 'causal' twice"));
  EXPECT_THAT(error_of([] { make_mask("window:3", 4, 4, 1); }),
              HasSubstr("mask (window:3) part 'window:3' must be window:L,R with integers L, R >= -1"));
  EXPECT_THAT(error_of([] { make_mask("window:-2,0", 4, 4, 1); }),
              HasSubstr("part 'window:-2,0' must be window:L,R"));
  EXPECT_THAT(error_of([] { make_mask("window", 4, 4, 1); }), HasSubstr("part 'window' must be window:L,R"));
  EXPECT_THAT(error_of([] { make_mask("window:a,1", 4, 4, 1); }), HasSubstr("part 'window:a,1' must be"));
  EXPECT_THAT(error_of([] { make_mask("document:0", 4, 4, 1); }),
              HasSubstr("mask (document:0) part 'document:0' must be document[:n_docs] with an integer n_docs >= 1"));
  EXPECT_THAT(error_of([] { make_mask("document:x", 4, 4, 1); }), HasSubstr("part 'document:x' must be"));
  EXPECT_THAT(error_of([] { make_mask("block:4", 4, 4, 1); }),
              HasSubstr("mask (block:4) part 'block:4' must be block[:BQxBK[@density]] with integers BQ, BK >= 1 "
                        "and density in [0, 1]"));
  EXPECT_THAT(error_of([] { make_mask("block:0x4", 4, 4, 1); }), HasSubstr("part 'block:0x4' must be"));
  EXPECT_THAT(error_of([] { make_mask("block:2x2@1.5", 4, 4, 1); }), HasSubstr("part 'block:2x2@1.5' must be"));
  EXPECT_THAT(error_of([] { make_mask("causal:1", 4, 4, 1); }), HasSubstr("has unknown part 'causal:1'"));
  EXPECT_THAT(error_of([] { make_mask("none", 0, 4, 1); }), HasSubstr("N_q (0) must be >= 1"));
  EXPECT_THAT(error_of([] { make_mask("none", 4, -1, 1); }), HasSubstr("N_k (-1) must be >= 1"));
}

TEST(MakeMask, Grammar) {
  EXPECT_TRUE(is_full(make_mask("none", 5, 6, 1)));
  MaskSpec m = make_mask("causal", 5, 6, 1);
  EXPECT_TRUE(m.causal);
  EXPECT_EQ(describe(m), "causal");
  m = make_mask("window:3,-1", 5, 6, 1);
  EXPECT_EQ(m.window_left, 3);
  EXPECT_EQ(m.window_right, -1);
  m = make_mask("causal+window:2,4", 5, 6, 1);
  EXPECT_EQ(band_right(m), 0);
  EXPECT_EQ(band_left(m), 2);
  m = make_mask("block:2x3@1", 5, 7, 1);
  EXPECT_EQ(m.block_q, 2);
  EXPECT_EQ(m.block_k, 3);
  ASSERT_EQ(m.block_mask.size(), 9u);
  // density 1, but one block row is forced to zero (fully masked rows)
  int zeros = 0;
  for (uint8_t b : m.block_mask) zeros += b == 0;
  EXPECT_EQ(zeros, 3);
  m = make_mask("block", 9, 9, 1);  // default ~4x4 grid
  EXPECT_EQ(m.block_q, 3);
  EXPECT_EQ(m.block_k, 3);
  m = make_mask("document:4", 40, 30, 1);
  EXPECT_EQ(m.q_segment.size(), 40u);
  EXPECT_EQ(m.k_segment.size(), 30u);
  Problem p;
  p.N_q = 40; p.N_k = 30; p.mask = m;
  EXPECT_NO_THROW(validate(p));
}

// Deterministic in the seed; documents and blocks always leave some fully masked rows.
TEST(MakeMask, DeterministicWithEmptyRows) {
  for (uint64_t seed = 1; seed < 40; ++seed)
    for (const char* spec : {"document:3", "document:2+block:3x3", "causal+document:5"}) {
      for (auto [nq, nk] : {std::pair<int64_t, int64_t>{17, 23}, {23, 17}, {2, 9}}) {
        const MaskSpec a = make_mask(spec, nq, nk, seed), b = make_mask(spec, nq, nk, seed);
        EXPECT_EQ(a.q_segment, b.q_segment);
        EXPECT_EQ(a.k_segment, b.k_segment);
        EXPECT_EQ(a.block_mask, b.block_mask);
        Problem p;
        p.N_q = nq; p.N_k = nk; p.mask = a;
        ASSERT_NO_THROW(validate(p)) << spec << " seed " << seed;
        const MaskData md = compile_mask(p);
        const MaskParams mp = md.params();
        int64_t empty = 0;
        for (int64_t i = 0; i < nq; ++i) empty += !any_visible(mp, i, i + 1, 0, nk);
        EXPECT_GE(empty, 1) << spec << " seed " << seed << " " << nq << "x" << nk;
      }
    }
  EXPECT_NE(make_mask("document:3", 50, 50, 1).q_segment, make_mask("document:3", 50, 50, 2).q_segment);
}

}  // namespace
}  // namespace burstlab
