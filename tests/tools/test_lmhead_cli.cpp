// tests/tools/test_lmhead_cli.cpp — `burstlab run --op lmhead-ce` and `burstlab bench --op
// lmhead-ce` end to end (spec §10): checked runs pass with PASS columns and parseable JSON, every
// loss option and dtype reaches the layers, bad input exits 2 naming the field with nothing on
// stdout, and the bench reports a cpu peak heap far below the reference's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace {

using burstlab::cli_test::Output;
using burstlab::cli_test::slurp;

Output burstlab(const std::string& args) { return burstlab::cli_test::run_burstlab(args); }

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

TEST(LmHeadCli, RunChecksEveryPassOfBothImpls) {
  const Output o = burstlab("run --op lmhead-ce --vocab 203 --nq 37 -d 16");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(last_line(o.out), "6 passed, 0 failed") << o.out;
  EXPECT_NE(o.out.find("fused"), std::string::npos) << o.out;
}

TEST(LmHeadCli, JsonRowsCarryTheCheck) {
  const Output o = burstlab("run --op lmhead-ce --vocab 77 -B 3 --nq 11 -d 8 --label-smoothing 0.1 --z-loss 1e-3 "
                            "--reduction sum --pass fused --json");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["op"], "lmhead-ce");
  EXPECT_NE(j["shape"].get<std::string>().find("N=33 d=8 V=77 eps=0.1 lambda=0.001 reduction=sum"), std::string::npos);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& r : j["rows"]) {
    EXPECT_EQ(r["pass"], "fused");
    EXPECT_EQ(r["result"], "PASS");
    EXPECT_EQ(r["tensors"].size(), 4u);  // L, LSE, dH, dW
    EXPECT_EQ(r["flops"].get<double>(), 6.0 * 33 * 77 * 8);
  }
}

TEST(LmHeadCli, EveryDtypeOnTheCpuLayer) {
  for (const char* dt : {"fp64", "fp32", "bf16", "fp16"}) {
    const Output o = burstlab(std::string("run --op lmhead-ce --impl cpu --vocab 517 --nq 45 -d 24 --br 16 --bv 100 "
                                          "--values large --dtype ") + dt);
    EXPECT_EQ(o.rc, 0) << dt << "\n" << o.out << o.err;
    EXPECT_EQ(last_line(o.out), "3 passed, 0 failed") << dt << "\n" << o.out;
  }
}

TEST(LmHeadCli, OneWordVocabularyAndAllIgnoredRows) {
  Output o = burstlab("run --op lmhead-ce --vocab 1 --nq 9 -d 4 --z-loss 0.5");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  o = burstlab("run --op lmhead-ce --vocab 50 --nq 9 -d 4 --ignore-fraction 1 --json");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  // Named: a range-for over parse(...)["rows"] would iterate a member of a destroyed temporary.
  const nlohmann::json report = nlohmann::json::parse(o.out);
  const nlohmann::json& rows = report.at("rows");
  ASSERT_FALSE(rows.empty()) << o.out;
  for (const auto& r : rows) EXPECT_EQ(r["result"], "PASS");
}

struct BadCase {
  const char* args;
  const char* message;
};
std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << "burstlab " << c.args; }

// A test name from the arguments, e.g. 12_run_nq_m1 for "run --nq -1" (GoogleTest names take
// letters, digits and '_'; the index keeps them unique).
std::string args_name(size_t index, const std::string& args) {
  std::string n = std::to_string(index);
  std::istringstream words(args);
  for (std::string w; words >> w;) {
    size_t at = w.find_first_not_of('-');
    if (at == std::string::npos) continue;
    if (n.back() != '_') n += '_';
    if (at > 0 && std::isdigit(static_cast<unsigned char>(w[at]))) n += 'm';  // a negative number
    for (; at < w.size(); ++at) {
      const unsigned char ch = static_cast<unsigned char>(w[at]);
      if (std::isalnum(ch)) n += static_cast<char>(ch);
      else if (n.back() != '_') n += '_';
    }
  }
  return args.empty() ? n + "_no_args" : n;
}
class LmHeadBadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(LmHeadBadInput, ExitsTwoNamesTheField) {
  const Output o = burstlab(GetParam().args);
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find(GetParam().message), std::string::npos) << o.err;
  EXPECT_EQ(o.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    Run, LmHeadBadInput,
    ::testing::Values(BadCase{"run --op lmhead-ce", "vocab (0) must be >= 1"},
                      BadCase{"run --op lmhead-ce --vocab 10 --nk 5", "--nk does not apply to --op lmhead-ce"},
                      BadCase{"run --op lmhead-ce --vocab 10 --hq 2", "--hq does not apply to --op lmhead-ce"},
                      BadCase{"run --op lmhead-ce --vocab 10 --algo ring", "--algo does not apply"},
                      BadCase{"run --vocab 10", "--vocab applies to --op lmhead-ce only"},
                      BadCase{"run --op softmax", "op (softmax) must be attention or lmhead-ce"},
                      BadCase{"run --op lmhead-ce --vocab 10 --label-smoothing 1.5", "label_smoothing (1.5)"},
                      BadCase{"run --op lmhead-ce --vocab 10 --z-loss -1", "z_loss (-1)"},
                      BadCase{"run --op lmhead-ce --vocab 10 --reduction avg", "reduction (avg) must be mean or sum"},
                      BadCase{"run --op lmhead-ce --vocab 10 --ignore-fraction 2", "ignore-fraction (2)"},
                      BadCase{"run --op lmhead-ce --vocab 10 -d 0", "d (0) must be >= 1"},
                      BadCase{"run --op lmhead-ce --vocab 10 --nq 0", "nq (0) must be >= 1"},
                      BadCase{"run --op lmhead-ce --vocab 10 --dtype bf16", "impl reference does not run dtype bf16"},
                      BadCase{"run --op lmhead-ce --vocab 10 --pass xx", "pass (xx) must be fwd, bwd, fused or both"},
                      BadCase{"run --op lmhead-ce --vocab 10 --values widev", "values (widev) does not apply"},
                      BadCase{"run --op lmhead-ce --vocab 10 --bv -1", "bv (-1) must be >= 1"},
                      BadCase{"run --op lmhead-ce --vocab 100000000 --nq 1000000 -d 4096", "not enough memory"},
                      BadCase{"bench --op lmhead-ce --vocab 10 --gemm-n 64", "--gemm-n does not apply"},
                      BadCase{"bench --op lmhead-ce --vocab 10 --reps 0", "reps (0) must be >= 1"}),
    [](const ::testing::TestParamInfo<BadCase>& i) { return args_name(i.index, i.param.args); });

TEST(LmHeadCli, BenchVerifiesThenReportsTimeAndHeap) {
  const Output o = burstlab("bench --op lmhead-ce --vocab 3000 --nq 256 -d 32 --reps 1 --json");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_TRUE(j["verified"].get<bool>());
  for (const auto& v : j["verify"]) EXPECT_EQ(v["result"], "PASS");
  ASSERT_EQ(j["rows"].size(), 4u);  // reference, cpu x fwd, fused
  if (!j["heap_counted"].get<bool>()) GTEST_SKIP() << "malloc interposition not in effect";
  const auto& ref_fused = j["rows"][1];
  const auto& cpu_fused = j["rows"][3];
  ASSERT_EQ(ref_fused["impl"], "reference");
  ASSERT_EQ(cpu_fused["impl"], "cpu");
  // The reference holds the 256 x 3000 fp32 logits (2.9 MiB); the cpu layer's Br x V buffer is
  // half of that at Br = 128, plus tiles: it must stay below the reference.
  EXPECT_LT(cpu_fused["peak_extra_heap_mib"].get<double>(), ref_fused["peak_extra_heap_mib"].get<double>());
}

}  // namespace
