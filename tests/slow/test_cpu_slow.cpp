// tests/slow/test_cpu_slow.cpp — the full cross product of the cpu/ sweep against the oracle
// (spec §9): every mask kind and conjunction x {fp64, fp32} x {BSHD, BHSD} x ragged shapes up to
// N = 1023 and d = 128 x MHA/GQA/MQA x tile sizes {1, 7, 64, 128, > N} x value modes, forward and
// backward, plus blocks over striped/zigzag positions at N = 1023. Label slow.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_check.hpp"
#include "testutil.hpp"

namespace burstlab {
namespace {

using cputest::Case;
using cputest::NamedCase;
using testutil::param_name;

class SlowSweep : public ::testing::TestWithParam<NamedCase> {};

TEST_P(SlowSweep, ForwardBackwardMatchOracle) {
  const Case& c = GetParam().c;
  EXPECT_TRUE(testutil::all_pass(cputest::run_case(c, true), cputest::describe(c)));
}


Case make(int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t d,
          const std::string& mask, Dtype dt, cpu::Tiles t, Layout L, Values v, uint64_t seed) {
  return Case{testutil::make_problem(B, Hq, Hkv, Nq, Nk, d, mask, seed + 7), L, dt, v, seed, t, mask};
}

const char* kMasks[] = {"none", "causal", "window:31,7", "window:-1,0", "window:64,-1",
                        "document:6", "block:32x48@0.5", "causal+document:4",
                        "window:40,40+block:16x16@0.7", "document:3+block:64x32@0.6",
                        "causal+document:5+block:24x24@0.8"};

// Masks x shapes x dtypes x layouts (tiles rotate through the list).
std::vector<NamedCase> big_cases() {
  struct S { int64_t B, Hq, Hkv, Nq, Nk, d; };
  const S shapes[] = {{1, 4, 2, 1023, 1023, 64}, {1, 2, 1, 1023, 203, 128}, {2, 3, 3, 203, 1023, 3},
                      {1, 4, 1, 113, 1023, 1},   {2, 2, 2, 1, 1023, 64},    {1, 2, 2, 1023, 1, 128}};
  const cpu::Tiles tiles[] = {{64, 64}, {7, 7}, {128, 128}, {1, 64}, {2000, 2000}, {64, 7}};
  std::vector<NamedCase> out;
  uint64_t k = 0;
  for (const char* m : kMasks)
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; ++si)
      for (Dtype dt : {Dtype::F64, Dtype::F32}) {
        const S& s = shapes[si];
        const Layout L = (k % 2) ? Layout::BSHD : Layout::BHSD;
        const cpu::Tiles t = tiles[k % (sizeof tiles / sizeof tiles[0])];
        out.push_back({make(s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.d, m, dt, t, L, Values::Normal, 1000 + k),
                       param_name(m) + "_shape" + std::to_string(si) + "_" + to_string(dt) + "_" +
                           to_string(L) + "_Br" + std::to_string(t.Br) + "_Bc" + std::to_string(t.Bc)});
        ++k;
      }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Big, SlowSweep, ::testing::ValuesIn(big_cases()), testutil::ByName());

// Value modes x masks x dtypes at a medium size, tile 1 included.
std::vector<NamedCase> value_cases() {
  std::vector<NamedCase> out;
  uint64_t k = 0;
  for (Values v : {Values::Normal, Values::Large, Values::Ties, Values::WideV})
    for (const char* m : kMasks)
      for (Dtype dt : {Dtype::F64, Dtype::F32}) {
        const cpu::Tiles t = (k % 3 == 0) ? cpu::Tiles{1, 1} : (k % 3 == 1) ? cpu::Tiles{7, 64} : cpu::Tiles{128, 128};
        out.push_back({make(1, 4, 2, 203, 113, 64, m, dt, t, (k % 2) ? Layout::BSHD : Layout::BHSD, v, 5000 + k),
                       to_string(v) + "_" + param_name(m) + "_" + to_string(dt) + "_Br" + std::to_string(t.Br)});
        ++k;
      }
  return out;
}
INSTANTIATE_TEST_SUITE_P(ValuesByMask, SlowSweep, ::testing::ValuesIn(value_cases()), testutil::ByName());

// Blocks at N = 1023: striped and zigzag positions, forward_block + merge and backward_block sums.
struct BlockParam {
  const char* mask;
  cputest::Split split;
  int parts;
};
class SlowBlocks : public ::testing::TestWithParam<BlockParam> {};
TEST_P(SlowBlocks, MergeAndSumEqualWhole) {
  const BlockParam bp = GetParam();
  const Problem p = testutil::make_problem(1, 4, 2, 1023, 1023, 32, bp.mask, 3);
  const MaskData md = compile_mask(p);
  const Inputs in = make_inputs(p, Layout::BSHD, Dtype::F32, 77);
  const Oracle want = run_oracle(p, in, true);
  const Tensor4<float> Q = convert<float>(in.Q), K = convert<float>(in.K), V = convert<float>(in.V),
                       dO = convert<float>(in.dO);
  const auto parts = cputest::split_positions(p.N_q, bp.parts, bp.split, 9);
  Tensor4<float> O = make_tensor4<float>(Layout::BSHD, p.B, p.H_q, p.N_q, p.d);
  Tensor3<float> LSE = make_tensor3<float>(p.B, p.H_q, p.N_q);
  poison(O);
  poison(LSE);
  cputest::forward_by_blocks(p, md.params(), Q, K, V, parts, parts, cpu::Tiles{64, 64}, O, LSE);
  EXPECT_TRUE(testutil::all_pass(check_forward<float>(want, O, LSE), bp.mask));
  Tensor3<float> D = make_tensor3<float>(p.B, p.H_q, p.N_q);
  cpu::compute_D<float>(as_const(O.view()), dO.view(), D.view());
  Tensor4<float> dQ, dK, dV;
  cputest::backward_by_blocks(p, md.params(), Q, K, V, dO, LSE, D, parts, parts, cpu::Tiles{64, 64},
                              dQ, dK, dV);
  EXPECT_TRUE(testutil::all_pass(check_backward<float>(want, dQ, dK, dV), bp.mask));
}
INSTANTIATE_TEST_SUITE_P(
    Splits, SlowBlocks,
    ::testing::Values(BlockParam{"causal", cputest::Split::Striped, 4},
                      BlockParam{"causal", cputest::Split::Zigzag, 4},
                      BlockParam{"causal+document:5", cputest::Split::Striped, 8},
                      BlockParam{"window:100,0+block:32x32@0.7", cputest::Split::Zigzag, 3},
                      BlockParam{"none", cputest::Split::Random, 5}),
    [](const auto& info) {
      return param_name(info.param.mask) + "_" + cputest::to_string(info.param.split) +
             std::to_string(info.param.parts);
    });

}  // namespace
}  // namespace burstlab
