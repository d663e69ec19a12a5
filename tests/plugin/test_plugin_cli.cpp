// tests/plugin/test_plugin_cli.cpp — `burstlab ... --impl plugin:PATH.so` end to end with the test
// plug-ins of this folder: the plug-in alone and under the schedules on SimComm passes against the
// fp64 oracle (run: ring, burst, ulysses, attention2d; suite; conform: every algorithm); a problem
// it declines up front is bad input (exit 2, its reason, no table) or an n/a cell; a block it
// declines mid-run is an ERROR row naming the reason (exit 1); a missing file, a library without
// the entry point and a wrong ABI version are exit 2 naming the path.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "cli_run.hpp"

namespace {

using burstlab::cli_test::Output;
using burstlab::cli_test::run_burstlab;

int count(const std::string& text, const std::regex& re) {
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

const std::string kPlugin = std::string("plugin:") + BURSTLAB_TEST_PLUGIN;

TEST(PluginCli, AloneBesideCpu) {
  const Output o = run_burstlab("run --impl " + kPlugin +
                                ",cpu --nq 100 --nk 90 --hq 4 --hkv 2 -d 16 --mask causal+document:3 --layout BSHD");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(count(o.out, std::regex("\nplugin:\\S+ +fp32 .* PASS")), 2) << o.out;
  EXPECT_NE(o.out.find("4 passed, 0 failed"), std::string::npos) << o.out;
}

TEST(PluginCli, UnderEverySchedule) {
  const std::string shape = " --world 4 --nq 64 --nk 64 --hq 4 --hkv 4 -d 16 --pass both";
  Output o = run_burstlab("run --impl " + kPlugin + " --algo ring,burst,ulysses --mask causal --dtype fp64" + shape);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  for (const char* algo : {"ring", "burst", "ulysses"})
    EXPECT_EQ(count(o.out, std::regex(std::string("\n") + algo + "/plugin:\\S+ +fp64 .* (fwd|bwd) .* PASS")), 2)
        << algo << "\n" << o.out;
  EXPECT_NE(o.out.find("6 passed, 0 failed"), std::string::npos) << o.out;

  o = run_burstlab("run --impl " + kPlugin + " --algo attention2d --partition striped --mask causal" + shape);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(count(o.out, std::regex("\nattention2d/plugin:\\S+ +fp32 .* PASS")), 2) << o.out;

  // zigzag shards (indexed positions, forward blocks split into contiguous parts) under a document mask
  o = run_burstlab("run --impl " + kPlugin + " --algo ring,burst --partition zigzag --mask causal+document:3" + shape);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("4 passed, 0 failed"), std::string::npos) << o.out;
}

TEST(PluginCli, Suite) {
  const Output o = run_burstlab("suite --impl " + kPlugin);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("\n([1-9][0-9]+) passed, 0 failed"))) << o.out;
}

// conform: the plug-in's own column and its engine under every algorithm of the table.
TEST(PluginCli, ConformEveryAlgorithm) {
  Output o = run_burstlab("conform --world 4 --impl " + kPlugin);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  for (const char* algo : {"ring", "burst", "double-ring", "distflash", "attention2d", "attention2d-o", "ulysses",
                           "allgather", "usp"})
    EXPECT_NE(o.out.find(std::string(algo) + "/" + kPlugin + " G=4"), std::string::npos) << algo << "\n" << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("\n([1-9][0-9]+) passed, 0 failed"))) << o.out;
  // a declined problem is an n/a cell with the reason, in every column of the plug-in
  o = run_burstlab(std::string("conform --world 2 --impl plugin:") + BURSTLAB_TEST_PLUGIN_DECLINE_DOCUMENT);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(count(o.out, std::regex("\nn/a \\S+ .*declined the forward of this problem: document masks")), 10) << o.out;
  EXPECT_EQ(o.out.find(" FAIL"), std::string::npos) << o.out;  // no cell failed
}

TEST(PluginCli, DeclinedProblemIsBadInput) {
  const Output o = run_burstlab(std::string("run --impl plugin:") + BURSTLAB_TEST_PLUGIN_DECLINE_DOCUMENT +
                                " --mask document:3 --nq 64 --nk 64");
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_EQ(o.out, "");
  EXPECT_NE(o.err.find("plugin cpu-example (" BURSTLAB_TEST_PLUGIN_DECLINE_DOCUMENT
                       ") declined the forward of this problem: document masks (segment ids) are not supported"),
            std::string::npos)
      << o.err;
  // the same build runs what it does not decline
  const Output ok = run_burstlab(std::string("run --impl plugin:") + BURSTLAB_TEST_PLUGIN_DECLINE_DOCUMENT +
                                 " --mask causal --nq 64 --nk 64");
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
}

// A plug-in that declines a plain backward has no backward pass: --pass both is bad input, its
// forward runs, suite runs its forwards only.
TEST(PluginCli, WithoutBackward) {
  const std::string impl = std::string(" --impl plugin:") + BURSTLAB_TEST_PLUGIN_NO_BACKWARD;
  Output o = run_burstlab("run" + impl + " --nq 64 --nk 64");
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_EQ(o.out, "");
  EXPECT_NE(o.err.find("has no backward pass; use --pass fwd"), std::string::npos) << o.err;
  o = run_burstlab("run" + impl + " --nq 64 --nk 64 --pass fwd --mask causal");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("1 passed, 0 failed"), std::string::npos) << o.out;
  o = run_burstlab("suite" + impl);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(count(o.out, std::regex(" bwd ")), 0) << o.out;
  EXPECT_GT(count(o.out, std::regex(" fwd .* PASS")), 10) << o.out;
}

// A block the plug-in declines and that has no contiguous parts (striped positions under a
// block-sparse mask are not a band in local indices) fails its row, with the plug-in's reason.
TEST(PluginCli, DeclinedBlockFailsItsRow) {
  const Output o = run_burstlab(std::string("run --impl plugin:") + BURSTLAB_TEST_PLUGIN_DECLINE_INDEXED +
                                " --algo ring --partition striped --world 2 --mask block:16x16 --nq 64 --nk 64 -d 8");
  EXPECT_EQ(o.rc, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("declined forward_block: indexed positions (a zigzag or striped shard) are not supported"),
            std::string::npos)
      << o.out;
  EXPECT_EQ(count(o.out, std::regex("\nring/plugin:\\S+ +fp32 .* ERROR")), 2) << o.out;
  EXPECT_NE(o.out.find("0 passed, 2 failed"), std::string::npos) << o.out;
}

// The plug-in that declines indexed positions under two algorithms (fwd and bwd each): exit 0 and
// all 4 rows PASS.
void expect_declining_plugin_passes(const std::string& algos, const std::string& args) {
  const Output o = run_burstlab(std::string("run --impl plugin:") + BURSTLAB_TEST_PLUGIN_DECLINE_INDEXED +
                                " --algo " + algos + " " + args + " -d 8 --pass both");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  const std::string names = "(" + std::regex_replace(algos, std::regex(","), "|") + ")";
  EXPECT_EQ(count(o.out, std::regex("\n" + names + "/plugin:\\S+ +fp32 .* (fwd|bwd) .* PASS")), 4) << o.out;
}

// Short striped shards (32 rows a rank, below the built-in engines' split size) that the plug-in
// declines whole run by their contiguous parts, however short.
TEST(PluginCli, ShortIndexedShardsRunByPartsWhenDeclined) {
  expect_declining_plugin_passes("ring,attention2d", "--partition striped --world 2 --mask causal --nq 64 --nk 64");
}

// Causal with N_q > N_k on zigzag shards: whole query runs see no key, and their rows get the
// identity from a hidden part over contiguous positions, which a plug-in that declines indexed
// positions runs too.
TEST(PluginCli, QueryRunsThatSeeNoKeyRunOverContiguousPositions) {
  expect_declining_plugin_passes("ulysses,allgather", "--partition zigzag --world 2 --mask causal --nq 100 --nk 64");
}

// Striped shards (progressions of stride G, 128 rows or more) split into blocks over contiguous
// positions, forward and backward: a plug-in that declines indexed positions runs them.
TEST(PluginCli, IndexedShardsRunByParts) {
  const Output o = run_burstlab(std::string("run --impl plugin:") + BURSTLAB_TEST_PLUGIN_DECLINE_INDEXED +
                                " --algo ring,allgather,ulysses,attention2d --partition striped --world 2 --mask causal"
                                " --nq 1024 --nk 1024"
                                " --hq 4 --hkv 2 -d 8 --pass both");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(count(o.out, std::regex("\n(ring|allgather|ulysses|attention2d)/plugin:\\S+ +fp32 .* (fwd|bwd) .* PASS")), 8) << o.out;
}

TEST(PluginCli, LoadFailuresNameThePath) {
  struct Bad {
    std::string path, says;
  };
  for (const Bad& b : {Bad{"/nonexistent/libx.so", "plugin (/nonexistent/libx.so) cannot be loaded: "},
                       Bad{BURSTLAB_TEST_PLUGIN_NO_ENTRY, ") does not export burstlab_plugin_v1"},
                       Bad{BURSTLAB_TEST_PLUGIN_ABI99, ") was built for plug-in ABI version 99; this burstlab loads version 1"}}) {
    for (const char* cmd : {"run", "suite", "bench", "conform"}) {
      const Output o = run_burstlab(std::string(cmd) + " --impl plugin:" + b.path);
      EXPECT_EQ(o.rc, 2) << cmd << " " << b.path << "\n" << o.out << o.err;
      EXPECT_EQ(o.out, "") << cmd << " " << b.path;
      EXPECT_NE(o.err.find("impl (plugin:" + b.path + ")"), std::string::npos) << o.err;
      EXPECT_NE(o.err.find(b.says), std::string::npos) << o.err;
    }
  }
}

}  // namespace
