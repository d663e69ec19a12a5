// spec §11.4: the layer with its attention distributed on SimComm (tools/layer_dist.cpp). Under
// none, layer and remat the gradients are bitwise equal; the layer placement reruns the
// distributed forward (one more forward pass, its bytes again) and remat never does; every pass
// sends exactly its closed-form bytes; and the distributed layer computes the single-device one's
// function (fp64, another merge order: within 1e-10).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "cpu_engine.hpp"
#include "layer.hpp"
#include "layer_dist.hpp"
#include "testutil.hpp"

namespace burstlab::tools {
namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <class T>
std::vector<const std::vector<T>*> all_of(const std::vector<T>& y, const layer::Grads<T>& g) {
  return {&y, &g.dx, &g.dWq, &g.dWk, &g.dWv, &g.dWo, &g.dW1, &g.dW2};
}

struct Outcome {
  std::vector<double> y;
  layer::Grads<double> g;
  layer::Counters c;
  DistTraffic t;
};

TEST(LayerDistributed, PlacementsBitwiseAndTheirTraffic) {
  layer::Shape s;
  s.p = testutil::make_problem(1, 4, 4, 96, 96, 8, "causal", 2);
  s.D = 24;
  s.F = 40;
  const layer::Weights<double> w = layer::make_weights<double>(s, 3);
  const std::vector<double> x = layer::make_values<double>(layer::tokens(s) * s.D, 4);
  const std::vector<double> dy = layer::make_values<double>(layer::tokens(s) * s.D, 5);
  auto engine = cpu::make_engine<double>(cpu::Tiles{16, 16});
  // The single-device layer, for the function.
  Outcome one;
  {
    layer::Saved<double> saved;
    layer::Checkpointing none;
    const auto attn = layer::cpu_attention<double>({16, 16});
    one.y = layer::forward(s, w, x, none, attn, saved, one.c);
    one.g = layer::backward(s, w, saved, dy, attn, one.c);
  }
  for (const char* algo : {"distflash", "burst", "ring", "usp"}) {
    dist::AlgoOptions o;
    o.algo = algo;
    o.world = 4;
    o.gpus_per_node = 2;
    o.partition = std::string(algo) == "distflash" ? dist::PartitionKind::Contiguous : dist::PartitionKind::Zigzag;
    o.sim.poison = true;
    o.sim.reorder = true;
    auto traffic = std::make_shared<DistTraffic>();
    const layer::AttentionOps<double> attn = distributed_attention<double>(o, *engine, traffic);
    std::vector<Outcome> runs;
    for (const layer::Placement pl : {layer::Placement::None, layer::Placement::Layer, layer::Placement::Remat}) {
      *traffic = DistTraffic{};
      layer::Checkpointing ck;
      ck.placement = pl;
      Outcome r;
      layer::Saved<double> saved;
      r.y = layer::forward(s, w, x, ck, attn, saved, r.c);
      r.g = layer::backward(s, w, saved, dy, attn, r.c);
      r.t = *traffic;
      runs.push_back(r);
    }
    const auto base = all_of(runs[0].y, runs[0].g);
    for (size_t k = 1; k < runs.size(); ++k) {
      const auto other = all_of(runs[k].y, runs[k].g);
      for (size_t i = 0; i < base.size(); ++i) EXPECT_TRUE(same_bits(*base[i], *other[i])) << algo << " placement " << k << " tensor " << i;
    }
    // none and remat: one forward pass and one backward pass; layer: the forward twice.
    EXPECT_EQ(runs[0].t.forward_passes, 1) << algo;
    EXPECT_EQ(runs[1].t.forward_passes, 2) << algo;
    EXPECT_EQ(runs[2].t.forward_passes, 1) << algo;
    for (const Outcome& r : runs) {
      EXPECT_EQ(r.t.backward_passes, 1) << algo;
      EXPECT_EQ(r.t.forward_sent, r.t.forward_closed) << algo;
      EXPECT_EQ(r.t.backward_sent, r.t.backward_closed) << algo;
      EXPECT_GT(r.t.forward_sent, 0) << algo;
    }
    EXPECT_EQ(runs[1].t.forward_sent, 2 * runs[0].t.forward_sent) << algo;
    EXPECT_EQ(runs[1].t.backward_sent, runs[0].t.backward_sent) << algo;
    EXPECT_EQ(runs[2].t.forward_sent, runs[0].t.forward_sent) << algo;
    // The same function as the single-device layer (fp64; the schedule merges in another order).
    const auto single = all_of(one.y, one.g);
    for (size_t i = 0; i < base.size(); ++i) {
      double err = 0, scale = 0;
      for (size_t e = 0; e < single[i]->size(); ++e) {
        err = std::max(err, std::fabs((*base[i])[e] - (*single[i])[e]));
        scale = std::max(scale, std::fabs((*single[i])[e]));
      }
      EXPECT_LE(err, 1e-10 * std::max(scale, 1.0)) << algo << " tensor " << i;
    }
  }
}

TEST(LayerDistributed, SequencePlacementThatRecomputesIsRefused) {
  layer::Shape s;
  s.p = testutil::make_problem(1, 2, 2, 32, 32, 4, "causal", 2);
  s.D = 8;
  s.F = 8;
  auto engine = cpu::make_engine<float>();
  dist::AlgoOptions o;
  o.algo = "ring";
  o.world = 2;
  const auto attn = distributed_attention<float>(o, *engine, std::make_shared<DistTraffic>());
  layer::Checkpointing ck;
  ck.placement = layer::Placement::Sequence;
  ck.bounds = {0, 16, 32};
  ck.keep = {0, 1};
  layer::Saved<float> saved;
  layer::Counters c;
  try {
    layer::forward(s, layer::make_weights<float>(s, 1), layer::make_values<float>(32 * 8, 2), ck, attn, saved, c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention 'ring on SimComm' has no forward over a subset of query rows"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace burstlab::tools
