// tests/cuda/test_cuda_engine.cpp — every distributed schedule on the CUDA engine (spec §7.3):
// the ranks are threads of this process on ONE GPU, each with its own stream, and the transport
// is SimComm over device memory (device-to-device copies, poisoned buffers). Each algorithm x
// {fp32, bf16, fp16} x masks x GQA x ragged lengths is compared with the fp64 oracle under the
// §9 rule, and every rank's bytes with the closed forms (inputs in T, statistics and gradients
// in A = fp32). Without a GPU the tests skip; BURSTLAB_REQUIRE_GPU=1 turns a skip into a failure.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "cuda_engine.hpp"
#include "gpu_skip.hpp"
#include "harness.hpp"
#include "session.hpp"
#include "testutil.hpp"

namespace burstlab {
namespace {

#define REQUIRE_GPU() BURSTLAB_REQUIRE_GPU(cuda::gpu_available)

template <class U>
Tensor4<double> widen(const Tensor4<U>& x) {
  Tensor4<double> y = make_tensor4<double>(x.layout, x.B, x.H, x.N, x.d);
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = to_double(x.data[i]);
  return y;
}
template <class U>
Tensor3<double> widen(const Tensor3<U>& x) {
  Tensor3<double> y = make_tensor3<double>(x.B, x.H, x.N);
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = to_double(x.data[i]);
  return y;
}

struct Case {
  std::string algo;  // a name of dist::algorithms()
  int world;
  dist::PartitionKind partition;
  std::string mask;
  int64_t Hq, Hkv, Nq, Nk, d;
};
std::string name_of(const Case& c, Dtype t) {
  std::ostringstream os;
  os << c.algo << " G=" << c.world << " " << dist::to_string(c.partition) << " mask " << c.mask << " H " << c.Hq
     << "/" << c.Hkv << " N " << c.Nq << "x" << c.Nk << " d " << c.d << " " << to_string(t);
  return os.str();
}

template <class T>
void run_case(const Case& c, Dtype dtype, uint64_t seed, cuda::Variant variant = cuda::Variant::Auto) {
  using A = acc_t<T>;
  SCOPED_TRACE(name_of(c, dtype));
  const Problem p = testutil::make_problem(2, c.Hq, c.Hkv, c.Nq, c.Nk, c.d, c.mask, seed);
  const Inputs in = make_inputs(p, Layout::BSHD, dtype, seed, Values::Normal);
  const Oracle want = run_oracle(p, in, true);
  auto engine = cuda::make_engine<T>(variant);
  dist::SimOptions sim;
  sim.poison = true;
  sim.timeout_s = 120;
  sim.memory.copy = cuda::transport_copy;
  sim.memory.poison = cuda::transport_poison;
  dist::AlgoOptions o;
  o.algo = c.algo;
  o.partition = c.partition;
  o.world = c.world;
  o.gpus_per_node = c.algo == "double-ring" || c.algo == "usp" ? 2 : 0;
  o.sim = sim;
  const dist::DistResult<T> res = dist::run_session<T>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
  const dist::Plan plan = dist::make_plan(p, o);
  // The oracle on the whole problem against the gathered outputs (§9).
  const Tensor4<double> O = widen(dist::gather(res.O, res.qp));
  const Tensor3<double> L = widen(dist::gather(res.LSE, res.qp));
  const Tensor4<double> dQ = widen(dist::gather(res.dQ, res.qp));
  const Tensor4<double> dK = widen(dist::gather(res.dK, res.kp)), dV = widen(dist::gather(res.dV, res.kp));
  std::vector<Metrics> ms = check_forward<double>(want, O, L);
  for (const Metrics& m : check_backward<double>(want, dQ, dK, dV)) ms.push_back(m);
  for (const Metrics& m : ms)
    EXPECT_TRUE(m.pass()) << m.tensor << ": " << m.wrong << " wrong, err/bound " << m.err_bound << "; first "
                          << m.first_wrong;
  // Bytes: T for inputs and O, A for LSE, D and gradients.
  const dist::ElemBytes w(sizeof(T), sizeof(A));
  for (int r = 0; r < c.world; ++r)
    for (dist::Phase ph : {dist::Phase::Forward, dist::Phase::Backward})
      for (bool sent : {true, false}) {
        const dist::ByteTotals got = dist::totals(res.logs[r], ph);
        const int64_t want_b = dist::plan_bytes(plan, ph, r, sent, w);
        EXPECT_EQ(sent ? got.sent : got.recv, want_b) << "rank " << r << " " << dist::to_string(ph) << (sent ? " sent" : " received");
      }
}

const std::vector<Case>& cases() {
  using PK = dist::PartitionKind;
  static const std::vector<Case> cs = {
      {"ring", 1, PK::Contiguous, "causal", 4, 2, 64, 64, 64},
      {"ring", 4, PK::Zigzag, "causal", 4, 2, 203, 203, 64},
      {"burst", 4, PK::Zigzag, "causal", 4, 1, 203, 203, 128},
      {"burst", 3, PK::Striped, "window:17,0+document:3", 4, 2, 113, 150, 64},
      {"ring", 3, PK::Contiguous, "block:16x32@0.5", 2, 2, 130, 97, 64},
      {"burst", 5, PK::Contiguous, "none", 2, 1, 61, 47, 3},
      {"double-ring", 4, PK::Zigzag, "causal", 4, 2, 128, 128, 64},
      {"ulysses", 2, PK::Zigzag, "causal+document:2", 4, 2, 96, 96, 64},
      {"allgather", 3, PK::Striped, "window:9,3", 4, 4, 100, 90, 64},
      {"attention2d", 4, PK::Striped, "causal", 4, 2, 130, 130, 64},
      {"attention2d-o", 6, PK::Striped, "document:3", 2, 2, 97, 120, 128},
      {"distflash", 3, PK::Contiguous, "causal", 4, 2, 150, 150, 64},
      {"distflash", 8, PK::Contiguous, "causal", 2, 1, 256, 256, 64},
      {"usp", 4, PK::Zigzag, "causal", 4, 2, 160, 160, 64},
      {"usp", 6, PK::Striped, "window:33,0+document:2", 6, 2, 190, 170, 128},
  };
  return cs;
}

class CudaEngineSchedules : public ::testing::TestWithParam<int> {};

TEST_P(CudaEngineSchedules, Fp32MatchesOracleAndClosedForms) {
  REQUIRE_GPU();
  run_case<float>(cases()[GetParam()], Dtype::F32, 11 + GetParam());
}
TEST_P(CudaEngineSchedules, Bf16MatchesOracleAndClosedForms) {
  REQUIRE_GPU();
  run_case<bf16_t>(cases()[GetParam()], Dtype::BF16, 23 + GetParam());
}
TEST_P(CudaEngineSchedules, Fp16MatchesOracleAndClosedForms) {
  REQUIRE_GPU();
  run_case<f16_t>(cases()[GetParam()], Dtype::F16, 37 + GetParam());
}
INSTANTIATE_TEST_SUITE_P(All, CudaEngineSchedules, ::testing::Range(0, 15),
                         [](const ::testing::TestParamInfo<int>& info) {
                           const Case& c = cases()[info.param];
                           std::string n = c.algo + "_G" + std::to_string(c.world) + "_" +
                                           dist::to_string(c.partition) + "_" + c.mask + "_Hq" + std::to_string(c.Hq) +
                                           "_Hkv" + std::to_string(c.Hkv) + "_Nq" + std::to_string(c.Nq) + "_Nk" +
                                           std::to_string(c.Nk) + "_d" + std::to_string(c.d);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The engine made with each variant of the table whose forward_block runs bf16 at d = 64 (its
// forward blocks by that variant; the block backward as the engine chooses), where this GPU runs it.
std::vector<std::string> engine_variants() {
  std::vector<std::string> names;
  for (const cuda::VariantInfo* v : cuda::variants_by_number()) {
    cuda::Call c;
    c.pass = cuda::Pass::ForwardBlock;
    c.dtype = Dtype::BF16;
    c.d = 64;
    c.N_q = c.N_k = c.n_q = c.n_k = 203;
    if (cuda::supports(*v, c, v->cc)) names.push_back(v->name);
  }
  return names;
}
class CudaEngineVariants : public ::testing::TestWithParam<std::string> {};
TEST_P(CudaEngineVariants, RingBf16MatchesOracleAndClosedForms) {
  REQUIRE_GPU();
  const cuda::Variant v = cuda::parse_variant(GetParam());
  std::string why;
  if (!cuda::variant_available(v, &why)) GTEST_SKIP() << why;
  run_case<bf16_t>({"ring", 4, dist::PartitionKind::Zigzag, "causal", 4, 2, 203, 203, 64}, Dtype::BF16, 51, v);
}
INSTANTIATE_TEST_SUITE_P(Table, CudaEngineVariants, ::testing::ValuesIn(engine_variants()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// A failed rank errors every rank (no hang) on the device transport too.
TEST(CudaEngine, FailedRankErrorsEveryRank) {
  REQUIRE_GPU();
  const Problem p = testutil::make_problem(1, 2, 2, 64, 64, 64, "causal", 5);
  const Inputs in = make_inputs(p, Layout::BSHD, Dtype::BF16, 5, Values::Normal);
  auto engine = cuda::make_engine<bf16_t>();
  dist::AlgoOptions o;
  o.algo = "burst";
  o.world = 4;
  o.sim.fail_rank = 2;
  o.sim.fail_at_op = 3;
  o.sim.timeout_s = 30;
  o.sim.memory.copy = cuda::transport_copy;
  o.sim.memory.poison = cuda::transport_poison;
  std::vector<std::string> errors;
  EXPECT_THROW(
      dist::run_session<bf16_t>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine, &errors), Error);
  ASSERT_EQ(errors.size(), 4u);
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r;
}

// copy_rows: one strided-copy kernel in the widest word that divides the addresses, pitches and
// piece; row by row where a pitch is below the piece; the bytes land where `rows` copies put them.
TEST(CudaEngine, CopyRowsLandsEveryRowWhereItsCopiesWould) {
  REQUIRE_GPU();
  auto e = cuda::make_engine<bf16_t>();
  const int64_t n = 1 << 16;
  std::vector<unsigned char> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>(i * 13 + 5);
  const std::shared_ptr<void> src = e->allocate(n), dst = e->allocate(n);
  e->upload(src.get(), host.data(), n);
  // Offsets and pitches pick every word width of the kernel (16, 8, 4, 2, 1 bytes), the last
  // piece ending at the allocation's end, and the row-by-row path of overlapping rows.
  struct Case { int64_t dst_off, dst_pitch, src_off, src_pitch, bytes, rows; };
  for (const Case& c : {Case{0, 3000, 0, 1000, 700, 16}, Case{0, 256, 0, 4096, 256, 12},
                        Case{0, 512, n - 100 * 512, 512, 512, 100}, Case{8, 904, 24, 712, 640, 9},
                        Case{4, 900, 12, 700, 640, 7}, Case{2, 130, 6, 258, 126, 40}, Case{1, 777, 3, 513, 333, 11},
                        Case{0, 900, 0, 700, 640, 1}, Case{0, 100, 0, 20, 60, 30}, Case{n - 3 * 64, 64, 5, 64, 64, 3}}) {
    std::vector<unsigned char> want(n, 0xab), got(n);
    e->upload(dst.get(), want.data(), n);
    e->copy_rows(static_cast<unsigned char*>(dst.get()) + c.dst_off, c.dst_pitch,
                 static_cast<const unsigned char*>(src.get()) + c.src_off, c.src_pitch, c.bytes, c.rows);
    for (int64_t r = 0; r < c.rows; ++r)
      std::memcpy(want.data() + c.dst_off + r * c.dst_pitch, host.data() + c.src_off + r * c.src_pitch,
                  size_t(c.bytes));
    e->synchronize();
    e->download(got.data(), dst.get(), n);
    EXPECT_EQ(got, want) << "offsets " << c.dst_off << ", " << c.src_off << "; pitches " << c.dst_pitch << ", "
                         << c.src_pitch << "; " << c.bytes << " bytes x " << c.rows;
  }
}

}  // namespace
}  // namespace burstlab
