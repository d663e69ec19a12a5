// spec §11.4-11.5: Session::load_forward (a backward from kept O, LSE runs no forward and equals
// the backward after the session's own forward, bitwise, for every algorithm), and the cost models
// of distributed/checkpointing.hpp against values computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "burstlab/error.hpp"
#include "checkpointing.hpp"
#include "cpu_engine.hpp"
#include "harness.hpp"
#include "session.hpp"
#include "testutil.hpp"

namespace burstlab::dist {
namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

AlgoOptions options_for(const Algorithm& a, int world) {
  AlgoOptions o;
  o.algo = a.name;
  o.world = world;
  o.gpus_per_node = 2;
  o.partition = a.partition.value_or(PartitionKind::Zigzag);
  o.sim.poison = true;  // a backward that read a forward buffer it was not given would see NaN
  return o;
}

TEST(LoadForward, BackwardFromKeptOutputsEqualsBackwardAfterForward) {
  const Problem p = testutil::make_problem(1, 4, 4, 61, 61, 8, "causal", 3);
  const Inputs in = make_inputs(p, Layout::BSHD, Dtype::F64, 4);
  auto engine = cpu::make_engine<float>(cpu::Tiles{16, 16});
  for (const Algorithm& a : algorithms()) {
    const AlgoOptions o = options_for(a, 4);
    Session<float> one(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
    one.forward();
    one.backward();
    const DistResult<float> r1 = one.result();
    const Tensor4<double> O = to_double(gather(r1.O, r1.qp));
    const Tensor3<double> LSE = to_double(gather(r1.LSE, r1.qp));
    Session<float> two(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
    two.load_forward(O.view(), LSE.view());
    two.backward();
    const DistResult<float> r2 = two.result();
    for (int r = 0; r < o.world; ++r) {
      EXPECT_TRUE(same_bits(r1.dQ[r].data, r2.dQ[r].data)) << a.name << " rank " << r << " dQ";
      EXPECT_TRUE(same_bits(r1.dK[r].data, r2.dK[r].data)) << a.name << " rank " << r << " dK";
      EXPECT_TRUE(same_bits(r1.dV[r].data, r2.dV[r].data)) << a.name << " rank " << r << " dV";
      EXPECT_EQ(totals(r2.logs[r], Phase::Forward).sent, 0) << a.name << ": load_forward ran a forward";
      EXPECT_EQ(totals(r2.logs[r], Phase::Backward).sent, totals(r1.logs[r], Phase::Backward).sent) << a.name;
    }
  }
}

TEST(LoadForward, BadShapesNameTheTensor) {
  const Problem p = testutil::make_problem(1, 2, 2, 20, 20, 4, "causal", 3);
  const Inputs in = make_inputs(p, Layout::BHSD, Dtype::F64, 4);
  auto engine = cpu::make_engine<double>();
  AlgoOptions o;
  o.algo = "ring";
  o.world = 2;
  Session<double> s(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o, *engine);
  const Tensor4<double> short_O = make_tensor4<double>(Layout::BHSD, 1, 2, 19, 4, 1.0);
  const Tensor3<double> LSE = make_tensor3<double>(1, 2, 20, 0.0);
  try {
    s.load_forward(short_O.view(), LSE.view());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("O.dim[2] (19)"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ the models, by hand

// A model small enough to count by hand: lf = 2 (D (H_q + 2 H_kv) d + H_q d D + 2 D F)
// = 2 (2 * 3 * 2 + 2 * 2 + 2 * 2 * 3) = 56 FLOPs per token, LM head 2 D vocab = 20.
ModelShape tiny() {
  ModelShape m;
  m.name = "tiny";
  m.layers = 2;
  m.H_q = m.H_kv = 1;
  m.head_dim = 2;
  m.D = 2;
  m.F = 3;
  m.vocab = 5;
  m.ffn_matrices = 2;
  return m;
}

TEST(CheckpointModel, FlopsPerToken) {
  EXPECT_EQ(layer_linear_flops_per_token(tiny()), 56.0);
  EXPECT_EQ(head_flops_per_token(tiny()), 20.0);
  // 7B: 2 (4096 * 96 * 128 + 32 * 128 * 4096 + 3 * 4096 * 11008) = 2 * 202375168.
  EXPECT_EQ(layer_linear_flops_per_token(model_preset("7b")), 404750336.0);
}

// The tiny model on N = 8 tokens over G = 2 ranks.
CkptSetting tiny_n8_g2(PartitionKind partition) {
  CkptSetting s;
  s.model = tiny();
  s.N = 8;
  s.G = 2;
  s.partition = partition;
  return s;
}

TEST(CheckpointModel, StripedCausalByHand) {
  // N = 8 over G = 2, striped, causal: rank 0 rows 0, 2, 4, 6 see 1 + 3 + 5 + 7 = 16 keys; rank 1
  // rows 1, 3, 5, 7 see 2 + 4 + 6 + 8 = 20: rank 1 is the busiest, n = 4. keep 1/2: rows 1, 3
  // (2 + 4 = 6 pairs) rerun. Per pair 4 d H_q = 8 FLOPs; per GPU lin = 4 * 56 = 224, head = 80.
  const std::vector<CkptCost> c = checkpoint_costs(tiny_n8_g2(PartitionKind::Striped));
  ASSERT_EQ(c.size(), 3u);
  for (const CkptCost& x : c) {
    EXPECT_EQ(x.rank, 1);
    EXPECT_EQ(x.rows, 4);
    EXPECT_EQ(x.pairs, 20);
    EXPECT_EQ(x.input_bytes, 2 * 4 * 2 * 2);  // L n D s
  }
  EXPECT_EQ(c[0].recomputed_pairs, 20);
  EXPECT_EQ(c[1].recomputed_pairs, 0);
  EXPECT_EQ(c[2].recomputed_pairs, 6);
  EXPECT_EQ(c[0].attention_bytes, 0);
  EXPECT_EQ(c[1].attention_bytes, 2 * 4 * (1 * 2 * 2 + 1 * 4));  // L n (H_q d s + H_q s_stat) = 64
  EXPECT_EQ(c[2].attention_bytes, 2 * 2 * (1 * 2 * 2 + 1 * 4));  // half the rows: 32
  // step = L (4 lin + 8 (3.5 pairs + recomputed)) + 3 head
  EXPECT_EQ(c[0].step_flops, 2 * (896 + 8 * (70 + 20)) + 240);  // 3472
  EXPECT_EQ(c[1].step_flops, 2 * (896 + 8 * 70) + 240);         // 3152
  EXPECT_EQ(c[2].step_flops, 2 * (896 + 8 * (70 + 6)) + 240);   // 3248
}

TEST(CheckpointModel, ZigzagRecomputesTheFrontChunk) {
  // Zigzag, N = 8, G = 2: rank 0 holds rows 0, 1 | 6, 7 (1 + 2 + 7 + 8 = 18 pairs), rank 1 rows
  // 2, 3 | 4, 5 (3 + 4 + 5 + 6 = 18): a tie, rank 0. Its first half, rows 0 and 1: 3 pairs.
  const std::vector<CkptCost> c = checkpoint_costs(tiny_n8_g2(PartitionKind::Zigzag));
  EXPECT_EQ(c[2].rank, 0);
  EXPECT_EQ(c[2].pairs, 18);
  EXPECT_EQ(c[2].recomputed_pairs, 3);
}

TEST(CheckpointModel, BurstEngine14BAtOneMillionTokens) {
  // 14B, N = 2^20 over 32 GPUs, striped, causal: n = 32768 rows per GPU, rank 31 the busiest
  // (rows 31 + 32 m see 32 (m + 1) keys): pairs = 32 * 32768 * 32769 / 2 = 17180393472; its first
  // 16384 rows: 32 * 16384 * 16385 / 2 = 4295229440.
  CkptSetting s;
  s.model = model_preset("14b");
  s.N = 1 << 20;
  s.G = 32;
  const std::vector<CkptCost> c = checkpoint_costs(s);
  EXPECT_EQ(c[0].rank, 31);
  EXPECT_EQ(c[0].pairs, 17180393472LL);
  EXPECT_EQ(c[2].recomputed_pairs, 4295229440LL);
  EXPECT_EQ(c[0].input_bytes, 13421772800LL);      // 40 * 32768 * 5120 * 2
  EXPECT_EQ(c[0].attention_bytes, 0);
  EXPECT_EQ(c[1].attention_bytes, 13631488000LL);  // 40 * 32768 * (5120 * 2 + 40 * 4)
  EXPECT_EQ(c[2].attention_bytes, 6815744000LL);   // half of it
}

TEST(CheckpointModel, DistFlashAttnVolumeByHand) {
  // (7.25), elements, H = 1, d = 4. P = 2, N = 8 (n = 4): forward rank 0 sends K, V (32), rank 1
  // nothing: 16 per worker = 0.5 N d. Backward: rank 0 K, V (32), rank 1 the dK, dV partial (32):
  // 1.0 N d.
  const Volume v2 = distflash_volume(8, 2, 1, 4);
  EXPECT_DOUBLE_EQ(v2.forward, 16.0 / 32.0);
  EXPECT_DOUBLE_EQ(v2.backward, 32.0 / 32.0);
  // P = 3, N = 9 (n = 3), one step with one helper (rank 0 for owner 2). Forward: rank 0 K, V (24)
  // + (O, LSE) back (5 * 3); rank 1 K, V (24); rank 2 Q to its helper (12): 75 / 3 per worker.
  // Backward: rank 0 K, V (24) + dQ back (12); rank 1 K, V (24) + dK, dV partial (24); rank 2
  // Q, dO, LSE, D (10 * 3) + dK, dV partial (24): 138 / 3. N d = 36.
  const Volume v3 = distflash_volume(9, 3, 1, 4);
  EXPECT_DOUBLE_EQ(v3.forward, 25.0 / 36.0);
  EXPECT_DOUBLE_EQ(v3.backward, 46.0 / 36.0);
  EXPECT_DOUBLE_EQ(megatron_volume(8, false), 8.75);  // 10 * 7 / 8
  EXPECT_DOUBLE_EQ(megatron_volume(8, true), 12.25);  // 14 * 7 / 8
  EXPECT_DOUBLE_EQ(megatron_volume(1, true), 0.0);
}

TEST(CheckpointModel, RematByHand) {
  // One layer, H = 1, d = 2, D = 2, F = 4, two MLP matrices, no LM head: lf = 2 (12 + 4 + 16) = 64.
  // n = 4 per GPU, P = 2: N = 8, pairs per GPU 8 * 9 / 4 = 18, one forward 4 d H * 18 = 144 FLOPs;
  // the matrices 4 n lf = 1024. HF: 1024 + 4.5 * 144 = 1672; remat: 1024 + 3.5 * 144 = 1528.
  ModelShape m = tiny();
  m.layers = 1;
  m.F = 4;
  m.vocab = 0;
  const RematCost c = remat_cost(m, 4, 2);
  EXPECT_DOUBLE_EQ(c.step_flops_layer, 1672.0);
  EXPECT_DOUBLE_EQ(c.step_flops_remat, 1528.0);
  EXPECT_DOUBLE_EQ(c.speedup(), 1672.0 / 1528.0);
}

TEST(CheckpointModel, BadInputNamesTheField) {
  auto expect_error = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([] { model_preset("70b"); }, "model (70b) must be one of 7b, 14b");
  CkptSetting s = tiny_n8_g2(PartitionKind::Striped);
  s.keep = 1.5;
  expect_error([&] { checkpoint_costs(s); }, "keep (1.5) must lie in [0, 1]");
  s.keep = 0.5;
  s.mask = "window";
  expect_error([&] { checkpoint_costs(s); }, "mask (window) must be none or causal");
  s.mask = "causal";
  s.G = 16;
  expect_error([&] { checkpoint_costs(s); }, "N (8) cannot be split");
  expect_error([] { remat_cost(tiny(), 0, 2); }, "n_per_gpu (0) must be >= 1");
  expect_error([] { megatron_volume(0, false); }, "P (0) must be >= 1");
}

}  // namespace
}  // namespace burstlab::dist
