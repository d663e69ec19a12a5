// tests/tools/test_simulate_cli.cpp — `burstlab simulate` end to end: the papers' presets predict
// what they predicted before the per-mask rates existed (pinned), the NVLink presets of the
// machines burstlab measures on are listed by --help with their sources and give finite
// predictions for every algorithm, and the rate overrides and one-node refusals behave.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace {

using burstlab::cli_test::Output;
using burstlab::cli_test::slurp;
using nlohmann::json;

Output burstlab(const std::string& args) { return burstlab::cli_test::run_burstlab(args); }

const char* const kNvlink[] = {"h100-x2", "h100-x4", "h100-x8", "h200-x2", "h200-x4", "h200-x8"};
const char* const kNumbers[] = {"compute_ms", "comm_ms", "total_ms", "exposed_ms", "serial_ms", "intra_MB", "inter_MB"};

// Equal to 1e-12 relative: the same operations on the same doubles (a compiler's contraction
// choices aside, which move the last bits only).
void expect_same(double got, double want, const std::string& what) {
  EXPECT_LE(std::abs(got - want), 1e-12 * std::max(std::abs(got), std::abs(want)))
      << what << ": " << got << " vs " << want;
}

TEST(SimulateCli, PapersPresetsPredictAsPinned) {
  const json pinned = json::parse(slurp(BURSTLAB_SIMULATE_PINNED));
  ASSERT_EQ(pinned.at("presets").size(), 4u);
  for (const auto& [preset, want] : pinned.at("presets").items()) {
    const Output o = burstlab("simulate --preset " + preset + " " + pinned.at("args").get<std::string>());
    ASSERT_EQ(o.rc, 0) << preset << o.out << o.err;
    const json got = json::parse(o.out);
    ASSERT_EQ(got.at("rows").size(), want.at("rows").size()) << preset;
    for (size_t i = 0; i < want.at("rows").size(); ++i) {
      const json& w = want.at("rows")[i];
      const json& g = got.at("rows")[i];
      const std::string at = preset + " " + w.at("algo").get<std::string>() + " " + w.at("phase").get<std::string>();
      EXPECT_EQ(g.at("algo"), w.at("algo")) << at;
      EXPECT_EQ(g.at("phase"), w.at("phase")) << at;
      for (const char* k : kNumbers) {
        if (!w.at(k).is_number()) {  // "not run" (e.g. ulysses: H_kv = 8 < G) and its empty cells
          EXPECT_EQ(g.at(k), w.at(k)) << at << " " << k;
          continue;
        }
        expect_same(g.at(k).get<double>(), w.at(k).get<double>(), at + " " + k);
      }
    }
    EXPECT_EQ(got.contains("table1"), want.contains("table1")) << preset;
    if (want.contains("table1"))
      for (size_t i = 0; i < want.at("table1").size(); ++i)
        for (const char* k : {"table1_ms", "replay_ms"})
          expect_same(got.at("table1")[i].at(k).get<double>(), want.at("table1")[i].at(k).get<double>(),
                      preset + " table1 " + k);
  }
}

TEST(SimulateCli, HelpListsEveryPresetAndItsSources) {
  const Output o = burstlab("simulate --help");
  ASSERT_EQ(o.rc, 0) << o.err;
  for (const char* p : {"a100-pcie", "a100-roce", "a800-32", "a800-64"})
    EXPECT_NE(o.out.find(p), std::string::npos) << p;
  for (const char* p : kNvlink) EXPECT_NE(o.out.find(std::string(p) + ": 1 node x "), std::string::npos) << p;
  for (const char* s : {"plugins/cudnn/README.md", "seam-32k-final.csv", "ASSUMED",
                        "--tflops-bwd", "The simulator against measurement"})
    EXPECT_NE(o.out.find(s), std::string::npos) << s << "\n" << o.out;
}

// Every algorithm has a finite prediction on every NVLink preset, causal and unmasked, and the
// rates printed are the preset's per phase and mask (the backward slower than the forward).
TEST(SimulateCli, NvlinkPresetsPredictEveryAlgorithm) {
  for (const char* preset : kNvlink)
    for (const char* shape : {"--mask causal --partition zigzag", "--mask none --partition contiguous"}) {
      const std::string args = std::string("simulate --preset ") + preset + " --seq 32768 " + shape + " --json";
      const Output o = burstlab(args);
      ASSERT_EQ(o.rc, 0) << args << o.out << o.err;
      const json j = json::parse(o.out);
      // DistFlashAttn's schedule needs a causal-type mask (spec §7.12); every other model runs.
      const bool causal = std::string(shape).find("causal") != std::string::npos;
      if (causal) EXPECT_FALSE(j.contains("not_run")) << args << j.dump();
      else EXPECT_EQ(j.at("not_run").size(), 1u) << args << j.dump();
      EXPECT_EQ(j.at("rows").size(), 18u) << args;  // 9 models x 2 phases
      for (const json& r : j.at("rows"))
        for (const char* k : kNumbers) {
          if (!causal && r.at("algo") == "distflash") continue;
          ASSERT_TRUE(r.at(k).is_number()) << args << r.dump();
          const double x = r.at(k).get<double>();
          EXPECT_TRUE(std::isfinite(x) && x >= 0) << args << " " << r.dump();
        }
      const double fwd = j.at("flops_per_s").at("forward"), bwd = j.at("flops_per_s").at("backward");
      EXPECT_GT(fwd, 5e14) << args;  // measured 604-709 TFLOP/s
      EXPECT_LT(bwd, fwd) << args;
    }
}

// The pinned prediction of one shape (2x H100, 32K causal, burst and ring): each phase's compute
// is half the one-GPU time the preset's causal rates were measured from (12.40 and 48.64 ms), the
// transfers posted before a step's compute hidden under it; the backward's last partial sums, sent
// home after the last step's compute, are exposed: one fp32 dQ shard (burst) or a dK and a dV shard
// (ring), 32 x 16384 x 128 x 4 bytes each at the assumed 450 GB/s + 10 us. At G = 2 that is the
// only gradient hop (a rank's own contribution stays home, spec §7.2).
TEST(SimulateCli, H100PairPinnedAt32KCausal) {
  const Output o = burstlab("simulate --preset h100-x2 --seq 32768 --algo burst,ring --json");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  const json j = json::parse(o.out);
  ASSERT_EQ(j.at("rows").size(), 4u);
  const double shard_ms = (10e-6 + 32.0 * 16384 * 128 * 4 / 450e9) * 1e3;
  for (const json& r : j.at("rows")) {
    const bool fwd = r.at("phase") == "forward";
    const double exposed = fwd ? 0 : shard_ms * (r.at("algo") == "ring" ? 2 : 1);
    expect_same(r.at("compute_ms").get<double>(), fwd ? 6.20 : 24.32, r.dump());
    EXPECT_NEAR(r.at("exposed_ms").get<double>(), exposed, 1e-9) << r.dump();
    EXPECT_NEAR(r.at("total_ms").get<double>(), (fwd ? 6.20 : 24.32) + exposed, 1e-9) << r.dump();
  }
}

TEST(SimulateCli, RateOverrides) {
  // --tflops alone prices every phase and mask.
  for (const char* mask : {"causal", "none"}) {
    const Output o =
        burstlab(std::string("simulate --preset h200-x2 --seq 4096 --algo ring --tflops 100 --json --mask ") + mask);
    ASSERT_EQ(o.rc, 0) << o.err;
    const json j = json::parse(o.out);
    EXPECT_EQ(j.at("flops_per_s").at("forward").get<double>(), 100e12) << mask;
    EXPECT_EQ(j.at("flops_per_s").at("backward").get<double>(), 100e12) << mask;
  }
  // --tflops-bwd alone replaces the backward's rates and keeps the forward's.
  const json base = json::parse(burstlab("simulate --preset h100-x2 --seq 4096 --algo ring --json").out);
  const Output o = burstlab("simulate --preset h100-x2 --seq 4096 --algo ring --tflops-bwd 50 --json");
  ASSERT_EQ(o.rc, 0) << o.err;
  const json j = json::parse(o.out);
  EXPECT_EQ(j.at("flops_per_s").at("forward"), base.at("flops_per_s").at("forward"));
  EXPECT_EQ(j.at("flops_per_s").at("backward").get<double>(), 50e12);
  EXPECT_EQ(j.at("rows")[0].at("compute_ms"), base.at("rows")[0].at("compute_ms"));  // the forward
  EXPECT_GT(j.at("rows")[1].at("compute_ms").get<double>(), base.at("rows")[1].at("compute_ms").get<double>());
  // The text names both rates.
  const Output t = burstlab("simulate --preset h100-x2 --seq 4096 --algo ring");
  EXPECT_NE(t.out.find("709.4 TFLOP/s per GPU forward, 452.1 backward"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("inter none (one node)"), std::string::npos) << t.out;
}

// Bad input: exit 2, the field and value named, nothing on stdout.
TEST(SimulateCli, RefusesWhatTheModelCannotPrice) {
  struct Bad {
    const char* args;
    const char* message;
  };
  for (const Bad& b : {Bad{"simulate --preset h100-x2 --nodes 2", "nodes (2) > 1 needs an inter-node bandwidth"},
                       Bad{"simulate --preset h200-x8 --nodes 4 --gpus-per-node 8", "preset h200-x8 is one node"},
                       Bad{"simulate --tflops-bwd 0", "tflops-bwd (0) must be > 0"},
                       Bad{"simulate --tflops-bwd -1", "tflops-bwd (-1)"},
                       Bad{"simulate --flops measured --tflops-bwd 10", "tflops-bwd (10) both set the compute rate"},
                       Bad{"simulate --preset h100-x3", "h100-x3"}}) {
    SCOPED_TRACE(b.args);
    burstlab::cli_test::expect_refused(burstlab(b.args), b.message, "see `burstlab simulate --help`");
  }
  // With an inter-node link given, more nodes are priced.
  const Output o =
      burstlab("simulate --preset h100-x8 --nodes 2 --inter-gbs 50 --seq 65536 --algo ring,burst-double-ring");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("inter 50.0 GB/s"), std::string::npos) << o.out;
}

}  // namespace
