// tests/tools/test_cli.cpp — runs the built `burstlab` binary (BURSTLAB_EXE) as a user would and
// checks exit codes, messages and output. Exit codes: 0 pass, 1 a check failed, 2 bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace {

using burstlab::cli_test::Output;
using burstlab::cli_test::slurp;

// Runs `burstlab <args>`; env is a prefix such as "BURSTLAB_TEST_BROKEN_IMPL=1".
Output burstlab(const std::string& args, const std::string& env = "") {
  return burstlab::cli_test::run_burstlab(args, env.empty() ? "" : "env " + env);
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// ---------------------------------------------------------------- bad input: exit 2, one line
struct BadCase {
  const char* args;
  const char* message;  // must appear on stderr
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

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, ExitsTwoNamesTheFieldPrintsNoTable) {
  const BadCase& c = GetParam();
  burstlab::cli_test::expect_refused(burstlab(c.args), c.message, "--help");
}

INSTANTIATE_TEST_SUITE_P(
    Run, BadInput,
    ::testing::Values(BadCase{"run --hq 6 --hkv 4", "H_q (6) must be a multiple of H_kv (4)"},
                      BadCase{"run -d 0", "d (0) must be >= 1"},
                      BadCase{"run --algo double-ring --world 2 --ring ulysses", "ring (ulysses) must be one of ring, burst"},
                      BadCase{"run --nq 0", "N_q (0) must be >= 1"},
                      BadCase{"run --nk -5", "N_k (-5) must be >= 1"},
                      BadCase{"run -B 0", "B (0) must be >= 1"},
                      BadCase{"run --mask window:-3,0", "window"},
                      BadCase{"run --mask causl", "unknown part 'causl'"},
                      BadCase{"run --mask block:0x4", "block"},
                      BadCase{"run --impl foo", "impl (foo) is not built"},
                      BadCase{"run --impl cpu,,reference", "empty entry"},
                      BadCase{"run --impl reference,cpu --dtype bf16", "does not run dtype bf16"},
                      BadCase{"run --dtype fp8", "dtype (fp8)"},
                      BadCase{"run --layout XYZ", "layout (XYZ)"},
                      BadCase{"run --values huge", "values (huge)"},
                      BadCase{"run --pass sideways", "pass (sideways)"},
                      BadCase{"run --impl cpu --br -1", "br (-1)"},
                      BadCase{"run --threads -1", "threads (-1)"},
                      BadCase{"run --repeat 0", "repeat (0)"},
                      BadCase{"run --scale inf", "scale (inf) must be finite"},
                      BadCase{"run --hq abc", "--hq"},
                      BadCase{"run --bogus", "--bogus"},
                      BadCase{"bench -d 0", "d (0) must be >= 1"},
                      BadCase{"bench --verify maybe", "verify (maybe)"},
                      BadCase{"bench --reps 0", "reps (0)"},
                      BadCase{"suite --impl foo", "impl (foo)"},
                      BadCase{"simulate --elem-bytes 0", "elem-bytes (0) must be >= 1"},
                      BadCase{"simulate --preset nosuch", "nosuch"},
                      // too big for this machine: refused before allocating (resources.hpp)
                      BadCase{"run --nq 200000 --nk 200000", "TB needed"},
                      BadCase{"run --nq 200000 --nk 200000 --impl cpu", "TB needed"},
                      BadCase{"run --nq 200000 --nk 200000 --impl reference --pass fwd", "TB needed"},
                      BadCase{"run --nq 1099511627776", "PB needed"},
                      BadCase{"run --check-rows -1", "check-rows (-1) must be >= 1"},
                      BadCase{"bench --nq 200000 --nk 200000 --verify same", "TB needed"},
                      BadCase{"nosuch", "nosuch"},
                      BadCase{"", "subcommand"}),
    [](const ::testing::TestParamInfo<BadCase>& i) { return args_name(i.index, i.param.args); });

// Flags that mean something only for a distributed run are refused without --algo (they used to
// be ignored: a single-device run, exit 0); every numeric flag is checked on the text as typed.
INSTANTIATE_TEST_SUITE_P(
    Bounds, BadInput,
    ::testing::Values(BadCase{"run --nq 8 --nk 8 --transport nccl --world 2",
                              "--world (2), --transport (nccl) need --algo (ring, burst"},
                      BadCase{"run --nq 8 --nk 8 --world 2", "--world (2) needs --algo"},
                      BadCase{"run --nq 8 --nk 8 --grid 2x2", "--grid (2x2) needs --algo"},
                      BadCase{"run --nq 8 --nk 8 --timeout 5", "--timeout (5) needs --algo"},
                      BadCase{"run --nq 8 --nk 8 --nodes 2 --gpus-per-node 2",
                              "--nodes (2), --gpus-per-node (2) need --algo"},
                      BadCase{"run --nq 8 --nk 8 --partition zigzag", "--partition (zigzag) needs --algo"},
                      BadCase{"run --nq 8 --nk 8 --single --poison", "--single, --poison need --algo"},
                      BadCase{"run --nq 8 --nk 8 --timeout -1", "timeout (-1) must be > 0"},
                      BadCase{"run --nq 8 --nk 8 --nodes 0", "nodes (0) must be >= 1"},
                      BadCase{"checkpoint --nq 16 --tile 8 --world -1", "world (-1) must be >= 1"},
                      BadCase{"checkpoint --nq 16 --tile 8 --world 2", "--world (2) needs --algo"},
                      BadCase{"checkpoint --nq 16 --tile 8 --gpus-per-node 2", "--gpus-per-node (2) needs --algo"},
                      BadCase{"run --nq 8 --nk 8 --seed -1", "seed (-1) must be >= 0"},
                      BadCase{"run --nq 8 --nk 8 --seed 0x10", "seed (0x10) must be a decimal integer (--seed)"},
                      BadCase{"run --nq 99999999999999999999", "N_q (99999999999999999999) must be <= 281474976710656"},
                      BadCase{"run --nk -99999999999999999999", "N_k (-99999999999999999999) must be >= 1"},
                      BadCase{"run --impl cpu --nq 8 --nk 8 --threads 100000", "threads (100000) must be <= 1024"},
                      BadCase{"bench --threads 100000", "threads (100000) must be <= 1024"},
                      BadCase{"run --impl cpu --algo attention2d --partition striped --grid 99999x99999",
                              "grid (99999x99999 = 9999800001 ranks) must have at most 256 ranks"},
                      BadCase{"run --impl cpu --algo attention2d --partition striped --grid 65536x65536",
                              "grid (65536x65536 = 4294967296 ranks) must have at most 256 ranks"},
                      BadCase{"run --impl cpu --algo ring --nodes 2147483647 --gpus-per-node 2",
                              "nodes (2147483647) must be <= 256"},
                      BadCase{"run --impl cpu --algo ring --nodes 200 --gpus-per-node 2",
                              "world (nodes x gpus-per-node = 200 x 2 = 400) must be <= 256"},
                      BadCase{"simulate --nodes 2147483647 --gpus-per-node 2", "nodes (2147483647) must be <= 256"},
                      BadCase{"simulate --nodes 64 --gpus-per-node 8", "world (nodes x gpus-per-node = 64 x 8 = 512)"},
                      BadCase{"simulate --intra-gbs 0", "intra-gbs (0) must be > 0"},
                      BadCase{"checkpoint --width 9223372036854775807", "width (9223372036854775807) must be <= "},
                      BadCase{"checkpoint --nq 16 --tile 8 --width 16777216", "W1 (D x F) would exceed 2^48 elements"},
                      BadCase{"conform --world 0", "world (0) must be >= 1"},
                      // -0 is 0, refused where 0 is, by the flag (bench and run no longer check again)
                      BadCase{"conform --world -0", "world (-0) must be >= 1"},
                      BadCase{"bench --reps -0", "reps (-0) must be >= 1"},
                      BadCase{"run --repeat -0", "repeat (-0) must be >= 1"},
                      // CLI11 listed these in reverse ("bf16 --dtype")
                      BadCase{"suite --dtype bf16", "the following arguments were not expected: --dtype bf16"}),
    [](const ::testing::TestParamInfo<BadCase>& i) { return args_name(i.index, i.param.args); });

// Every INT, UINT and FLOAT flag of every subcommand (read from its --help) refuses a value past
// any bound, naming the value as typed (CLI11 alone read 99999999999999999999 as INT64_MAX and
// -1 into an unsigned field as 2^64 - 1).
TEST(Bounds, EveryNumericFlagRefusesAnOverflowingValue) {
  int flags = 0;
  for (const char* sub : {"run", "suite", "bench", "schedule", "simulate", "gen", "oracle", "check", "conform",
                          "checkpoint"}) {
    const Output h = burstlab(std::string(sub) + " --help");
    ASSERT_EQ(h.rc, 0) << sub;
    std::istringstream lines(h.out);
    for (std::string line; std::getline(lines, line);) {
      // "  -B,--batch INT=1   ..." or "  --scale FLOAT   ..."
      std::istringstream words(line);
      std::string names, type;
      if (line.rfind("  -", 0) != 0 || !(words >> names >> type)) continue;
      type = type.substr(0, type.find('='));
      if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
      const std::string flag = names.substr(names.rfind(',') == std::string::npos ? 0 : names.rfind(',') + 1);
      for (std::string v : {"99999999999999999999", "-99999999999999999999"}) {
        if (type == "FLOAT") v += "e999";
        const Output o = burstlab(std::string(sub) + " " + flag + " " + v);
        EXPECT_EQ(o.rc, 2) << sub << " " << flag << " " << v << "\n" << o.err;
        EXPECT_NE(o.err.find("(" + v + ")"), std::string::npos) << sub << " " << flag << " " << v << ": " << o.err;
        EXPECT_EQ(o.out, "") << sub << " " << flag << " " << v;
      }
      ++flags;
    }
  }
  EXPECT_GE(flags, 60) << "the --help format changed: fewer numeric flags found than exist";
}

// CLI11 converts integers with base 0 (010 = 8): a flag's value is read as the decimal it looks like.
TEST(Bounds, LeadingZerosAreDecimal) {
  const Output o = burstlab("run --impl cpu --nq 010 --nk 0008 --json");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(nlohmann::json::parse(o.out).at("shape"), "B=1 Hq=4 Hkv=2 Nq=10 Nk=8 d=64");
}

// --threads 1024, the bound, runs (100000 crashed the OpenMP runtime).
TEST(Bounds, TheThreadBoundRuns) {
  const Output o = burstlab("run --impl cpu --nq 8 --nk 8 --threads 1024");
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(last_line(o.out), "2 passed, 0 failed");
}

// ---------------------------------------------------------------- memory (tools/resources.hpp)
// BURSTLAB_MEMORY_AVAILABLE replaces what the machine reports, so the figures are exact here.
const std::string k24GB = "BURSTLAB_MEMORY_AVAILABLE=24000000000";

TEST(Memory, RefusalNamesNeededAvailableAndWhatToDoInstead) {
  const Output o = burstlab("run --nq 200000 --nk 200000 --threads 2", k24GB);
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_EQ(o.out, "");
  for (const char* part :
       {"burstlab run: error: not enough memory for the fp64 oracle's §9 backward bounds: 3.8 TB needed, "
        "24.0 GB available (BURSTLAB_MEMORY_AVAILABLE)",
        "the largest part: the §9 backward bounds hold 6 N_q x N_k fp64 per (b, kv-head), 1.9 TB per thread x 2 "
        "threads = 3.8 TB",
        "; it fits with --check-rows 64 --impl cpu, or with --nq 1",
        "(the fp64 oracle checks every --impl, so it runs whatever --impl is)"})
    EXPECT_NE(o.err.find(part), std::string::npos) << "missing: " << part << "\nstderr: " << o.err;
  EXPECT_EQ(count(o.err, "\n"), 2) << "one line and the --help hint: " << o.err;
}

TEST(Memory, AdviceNamesOnlyAlternativesThatFit) {
  // 20000^2: the backward bounds need 19.2 GB per thread; one thread, the sampled oracle, or the
  // forward alone, fits.
  Output o = burstlab("run --nq 20000 --nk 20000 --threads 2", k24GB);
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("it fits with --threads 1, with --check-rows 64, with --pass fwd, or with --nq 1"), std::string::npos)
      << o.err;
  o = burstlab("run --nq 1099511627776", k24GB);
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("PB needed, 24.0 GB available"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("--nk"), std::string::npos) << "N_k (203) fits already: " << o.err;
  o = burstlab("bench --nq 200000 --nk 200000 --verify same", k24GB);
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("it fits with --verify reduced --impl cpu"), std::string::npos) << o.err;
  o = burstlab("bench --gemm-n 10000000", k24GB);
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("1.2 PB needed"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("it fits with --gemm-n 1024"), std::string::npos) << o.err;
}

// The suggested size keeps headroom: run as suggested with 5% less memory, it is not refused.
TEST(Memory, TheSuggestedLengthFitsWithHeadroom) {
  const std::string args = "run --impl cpu --hq 1 --hkv 1 -d 16 --threads 1 --nq 3000 --nk 3000";
  const Output o = burstlab(args, "BURSTLAB_MEMORY_AVAILABLE=100000000");
  ASSERT_EQ(o.rc, 2) << o.err;
  const size_t at = o.err.find("--nq ");
  ASSERT_NE(at, std::string::npos) << o.err;
  const int64_t n = std::stoll(o.err.substr(at + 5));
  const std::string lens = " --nq " + std::to_string(n) + " --nk " + std::to_string(n);
  ASSERT_NE(o.err.find(lens), std::string::npos) << o.err;
  ASSERT_GT(n, 100);
  const Output r = burstlab("run --impl cpu --hq 1 --hkv 1 -d 16 --threads 1" + lens, "BURSTLAB_MEMORY_AVAILABLE=95000000");
  EXPECT_EQ(r.rc, 0) << "suggested" << lens << " at 100 MB, refused at 95 MB:\n" << r.err;
}

TEST(Memory, TheLimitIsRealForSmallProblemsToo) {
  Output o = burstlab("run", "BURSTLAB_MEMORY_AVAILABLE=1000000");
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("1.0 MB available (BURSTLAB_MEMORY_AVAILABLE)"), std::string::npos) << o.err;
  o = burstlab("run", "BURSTLAB_MEMORY_AVAILABLE=1000000000");
  EXPECT_EQ(o.rc, 0) << o.err;
  o = burstlab("run", "BURSTLAB_MEMORY_AVAILABLE=lots");
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("BURSTLAB_MEMORY_AVAILABLE (lots) must be a number of bytes"), std::string::npos) << o.err;
}

TEST(Memory, AnAllocationThatFailsAnywayIsAClearErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__)
  // burstlab is built with ASan too: its operator new reports a refused size and aborts, it
  // cannot throw the std::bad_alloc this test is about.
  GTEST_SKIP() << "AddressSanitizer build: a refused operator new aborts instead of throwing";
#endif
  // The check told that 2^63 bytes are free: make_inputs asks for petabytes (fp32 inputs), which
  // malloc refuses at once (more than any address space), and std::bad_alloc reaches main().
  const Output o = burstlab("run --nq 1099511627776", "BURSTLAB_MEMORY_AVAILABLE=9223372036854775807");
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("burstlab run: error: out of memory (std::bad_alloc) while generating the inputs Q, K, V, "
                       "dO in fp32 (estimated 2.3 PB)"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("use a smaller problem (--nq, --nk, --threads)"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("terminate"), std::string::npos) << o.err;
  EXPECT_EQ(o.out, "");
  // The mask is made before anything can be estimated: 2^46 segment ids of 4 bytes are more than
  // any address space, so this too fails at once, whatever the overcommit setting.
  const Output m = burstlab("run --nq 70368744177664 --nk 1 -d 1 --hq 1 --hkv 1 --mask document");
  EXPECT_EQ(m.rc, 2) << m.err;
  EXPECT_NE(m.err.find("out of memory (std::bad_alloc) while generating the mask 'document'"), std::string::npos)
      << m.err;
}

// ---------------------------------------------------------------- valid input
TEST(Run, ReferenceAndCpuPassFp32) {
  const Output o = burstlab("run --impl reference,cpu --dtype fp32 --mask causal --hq 4 --hkv 2 --nq 113 --nk 203");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(count(o.out, "PASS"), 4) << o.out;  // 2 impls x (fwd, bwd)
  EXPECT_EQ(count(o.out, "FAIL"), 0) << o.out;
  EXPECT_NE(o.out.find("err/bound"), std::string::npos) << o.out;
  EXPECT_EQ(last_line(o.out), "4 passed, 0 failed");
}

TEST(Run, CpuFp64BshdVerboseHasOneRowPerTensor) {
  const Output o = burstlab("run --impl cpu --dtype fp64 --layout BSHD --mask causal+document:3 -v --br 7 --bc 5");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  // summary rows (fwd, bwd) + O, LSE + dQ, dK, dV
  EXPECT_EQ(count(o.out, "PASS"), 7) << o.out;
  EXPECT_EQ(last_line(o.out), "2 passed, 0 failed");
}

TEST(Run, JsonParses) {
  const Output o = burstlab("run --json --mask window:16,0 --values large --pass both");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  const auto j = nlohmann::json::parse(o.out);  // throws (test fails) if it is not JSON
  EXPECT_EQ(j.at("command"), "run");
  ASSERT_EQ(j.at("rows").size(), 4u);
  for (const auto& row : j.at("rows")) {
    EXPECT_EQ(row.at("result"), "PASS") << row.dump();
    EXPECT_EQ(row.at("all").at("wrong"), 0);
    EXPECT_GT(row.at("all").at("checked").get<int64_t>(), 0);
  }
  EXPECT_EQ(j.at("passed"), 4);
  EXPECT_EQ(j.at("failed"), 0);
}

TEST(Help, EveryCommandTeachesWithExamples) {
  for (const char* args : {"--help", "run --help", "suite --help", "bench --help", "schedule --help", "simulate --help"}) {
    const Output o = burstlab(args);
    EXPECT_EQ(o.rc, 0) << args;
    EXPECT_NE(o.out.find("Examples"), std::string::npos) << args << "\n" << o.out;
  }
}

// Every value a flag's --help lists ("a | b | c") is one the command accepts.
struct Listed {
  const char* command;  // the subcommand, whose --help is read
  const char* flag;
  const char* args;     // a quick run, the flag's value appended
};
TEST(Help, EveryListedValueIsAccepted) {
  for (const Listed& l : {Listed{"schedule", "--dtype", "schedule --algo ring --world 2 --nq 4 --nk 4 -d 2 --dtype "},
                          Listed{"schedule", "--partition", "schedule --algo ring --world 2 --nq 4 --nk 4 -d 2 --partition "},
                          Listed{"checkpoint", "--dtype", "checkpoint --nq 16 --tile 8 -d 4 --hq 2 --hkv 2 --json --dtype "},
                          Listed{"simulate", "--partition", "simulate --seq 4096 --algo ring --json --partition "},
                          Listed{"conform", "--partition", "conform --world 2 --impl ring --dtype fp64 --json --partition "}}) {
    const Output h = burstlab(std::string(l.command) + " --help");
    ASSERT_EQ(h.rc, 0) << l.command;
    std::istringstream lines(h.out);
    std::string desc;
    for (std::string line; std::getline(lines, line);)
      if (line.rfind(std::string("  ") + l.flag + " ", 0) == 0) desc = line;
    ASSERT_FALSE(desc.empty()) << l.command << " --help has no " << l.flag << "\n" << h.out;
    const size_t bar = desc.find(" | ");
    ASSERT_NE(bar, std::string::npos) << desc;
    // the values: the words around the first " | " run
    size_t begin = desc.rfind(' ', bar - 1) + 1, end = desc.find_first_of(" ,;()", desc.rfind(" | ") + 3);
    std::string list = desc.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (!list.empty() && list.back() == ':') list.pop_back();
    int values = 0;
    for (size_t at = 0; at <= list.size();) {
      const size_t next = std::min(list.find(" | ", at), list.size());
      const std::string v = list.substr(at, next - at);
      at = next + 3;
      const Output o = burstlab(l.args + v);
      EXPECT_EQ(o.rc, 0) << l.command << " " << l.flag << " " << v << " is listed in --help (" << desc
                         << ") but refused:\n" << o.err;
      ++values;
    }
    EXPECT_GE(values, 2) << desc;
  }
}

// ---------------------------------------------------------------- a wrong implementation fails
TEST(Broken, RunPrintsFailAndExitsOne) {
  const Output o = burstlab("run --impl cpu,broken", "BURSTLAB_TEST_BROKEN_IMPL=1");
  EXPECT_EQ(o.rc, 1) << o.out << o.err;
  EXPECT_EQ(count(o.out, "FAIL"), 4) << o.out;  // 2 rows + 2 notes naming the first wrong element
  EXPECT_NE(o.out.find("first (b=0"), std::string::npos) << o.out;
  EXPECT_EQ(last_line(o.out), "2 passed, 2 failed");
}

// ---------------------------------------------------------------- the row-sampled check (§9.11)
TEST(CheckRows, PassesSaysWhatItSampledAndCarriesItInJson) {
  Output o = burstlab("run --impl reference,cpu --mask causal+document --check-rows 16");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("rows sampled: 16 of 452"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("columns: 16 of 406"), std::string::npos) << o.out;
  EXPECT_EQ(last_line(o.out), "4 passed, 0 failed");
  o = burstlab("run --impl cpu --check-rows 16 --json -v");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["check"]["oracle"], "sampled");
  EXPECT_EQ(j["check"]["rows"], 16);
  EXPECT_EQ(j["check"]["rows_of"], 452);
  EXPECT_EQ(j["check"]["columns"], 16);
  EXPECT_EQ(j["rows"][1]["tensors"][1]["tensor"], "dK");
  EXPECT_EQ(j["rows"][1]["tensors"][1]["checked"], 16 * 64);
}

TEST(CheckRows, RefusalWithoutItNamesIt) {
  // 4 GB: the full oracle at N = 20000 needs tens of GB, the sampled one a few MB.
  const Output o = burstlab("run --nq 20000 --nk 20000 --impl cpu", "BURSTLAB_MEMORY_AVAILABLE=4000000000");
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("it fits with --check-rows 64"), std::string::npos) << o.err;
}

TEST(CheckRows, DistributedRunPasses) {
  const Output o = burstlab("run --impl cpu --algo burst --world 3 --partition zigzag --mask causal --check-rows 12");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(last_line(o.out), "2 passed, 0 failed");
}

TEST(CheckRows, BrokenImplFails) {
  // broken perturbs O[0] and dK[0]: row (0, 0, 0) and column (0, 0, 0) are always sampled.
  const Output o = burstlab("run --impl cpu,broken --check-rows 8", "BURSTLAB_TEST_BROKEN_IMPL=1");
  EXPECT_EQ(o.rc, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("O: 1 of 512 wrong; first (b=0, h=0, i=0, k=0)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("dK: "), std::string::npos) << o.out;
  EXPECT_EQ(last_line(o.out), "2 passed, 2 failed");
}

TEST(Broken, BenchRefusesToTimeIt) {
  const Output o = burstlab("bench --impl reference,broken --nq 128 --nk 128 -d 64 --reps 1 --gemm-n 64",
                            "BURSTLAB_TEST_BROKEN_IMPL=1");
  EXPECT_EQ(o.rc, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("FAILED"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("eigen-sgemm"), std::string::npos) << "speed printed for a failing impl:\n" << o.out;
}

// ---------------------------------------------------------------- judging nothing fails
// conform: every cell '-' (reference runs fp32 only in the suite) or every cell 'n/a' (no quick
// case splits over 256 ranks): exit 1, saying so, in the matrix and in --json.
TEST(NothingJudged, ConformFails) {
  for (const char* args : {"conform --impl reference --dtype fp64", "conform --impl ring --world 256 --dtype fp64",
                           "conform --impl ring --world 256 --dtype fp64 --json"}) {
    const Output o = burstlab(args);
    EXPECT_EQ(o.rc, 1) << args << "\n" << o.out << o.err;
    EXPECT_NE((o.out + o.err).find("FAIL: nothing was judged: none of the "), std::string::npos)
        << args << "\n" << o.out << o.err;
  }
  const Output dash = burstlab("conform --impl reference --dtype fp64");
  EXPECT_NE(dash.out.find("11 '-': no column here runs fp64"), std::string::npos) << dash.out;
  const Output na = burstlab("conform --impl ring --world 256 --dtype fp64");
  // One 'n/a' per fp64 case and column, and the columns depend on the layers built (cuda or not).
  EXPECT_TRUE(std::regex_search(na.out, std::regex("[1-9][0-9]* 'n/a': the reasons above"))) << na.out;
}

// `suite --impl cuda` on a machine without a GPU: nothing to judge; the refusal says why.
TEST(NothingJudged, SuiteSaysWhy) {
  const Output o = burstlab("suite --impl cuda");
  if (o.rc == 0 || o.err.find("impl (cuda) is not") != std::string::npos || o.err.find("impl (cuda)") == std::string::npos)
    GTEST_SKIP() << "cuda runs here, or is not built: " << o.err;
  EXPECT_EQ(o.rc, 2) << o.err;
  EXPECT_NE(o.err.find("impl (cuda) has nothing to run here, so nothing would be judged; cuda: "), std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("Choose implementations that run on this machine"), std::string::npos) << o.err;
}

// check: a candidate path that does not exist is bad input (as an empty directory is); --tensors
// naming no tensor of the case judges nothing and fails.
TEST(NothingJudged, CheckMissingCandidateAndNoTensor) {
  const std::string dir = ::testing::TempDir() + "burstlab_cli_check_" + std::to_string(getpid());
  ASSERT_EQ(burstlab("gen --out " + dir + " --quick --oracle").rc, 0);
  const std::string one = dir + "/01_full_mha_fp32";
  for (const std::string& c : {one, dir}) {
    const Output o = burstlab("check --case " + c + " --candidate /nonexistent");
    EXPECT_EQ(o.rc, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("candidate (/nonexistent) does not exist"), std::string::npos) << o.err;
    EXPECT_EQ(o.out, "");
  }
  const Output f = burstlab("check --case " + one + " --candidate " + one + "/case.json");
  EXPECT_EQ(f.rc, 2) << f.out << f.err;
  EXPECT_NE(f.err.find("is not a directory"), std::string::npos) << f.err;
  const Output t = burstlab("check --case " + one + " --candidate " + one + "/expected --tensors L");
  EXPECT_EQ(t.rc, 1) << t.out << t.err;
  EXPECT_NE(t.err.find("FAIL: nothing was judged: --tensors (L) names no tensor of this case"), std::string::npos)
      << t.err;
  // --case is conform's name too (as oracle's and check's); --suite stays as its alias.
  for (const char* flag : {"--case", "--suite"}) {
    const Output c = burstlab(std::string("conform --impl cpu ") + flag + " " + dir);
    EXPECT_EQ(c.rc, 0) << flag << "\n" << c.out << c.err;
    EXPECT_NE(c.out.find("11 passed, 0 failed"), std::string::npos) << flag << "\n" << c.out;
  }
  std::system(("rm -rf '" + dir + "'").c_str());
}

// ---------------------------------------------------------------- simulate: Table 1 vs the replay
// Two nodes, H_q = H_kv, seq % G == 0: the closed forms of BurstEngine Table 1 are compared.
constexpr const char* kSimulateTable1 = "simulate --preset a800-32 --nodes 2 --gpus-per-node 4 --seq 65536 --hq 8 --hkv 8";

TEST(Simulate, Table1MatchesTheReplayExitsZero) {
  const Output o = burstlab(kSimulateTable1);
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("BurstEngine Table 1"), std::string::npos) << o.out;
  EXPECT_EQ(count(o.out, " yes"), 3) << o.out;  // RingAttention, DoubleRing, BurstAttention
  EXPECT_EQ(count(o.out, " NO"), 0) << o.out;
}

// A failed closed-form check is a failed check (exit 1), not bad input (exit 2): nothing on stderr.
TEST(Simulate, Table1MismatchPrintsNoAndExitsOne) {
  const Output o = burstlab(kSimulateTable1, "BURSTLAB_TEST_BROKEN_TABLE1=1");
  EXPECT_EQ(o.rc, 1) << o.out << o.err;
  EXPECT_EQ(count(o.out, " NO"), 3) << o.out;
  EXPECT_NE(o.out.find("FAIL: the replay differs from Table 1"), std::string::npos) << o.out;
  EXPECT_EQ(o.err, "");
}

TEST(Simulate, Table1MismatchJsonExitsOne) {
  const Output o = burstlab(std::string(kSimulateTable1) + " --json", "BURSTLAB_TEST_BROKEN_TABLE1=1");
  EXPECT_EQ(o.rc, 1) << o.out << o.err;
  const auto j = nlohmann::json::parse(o.out);
  ASSERT_EQ(j.at("table1").size(), 3u) << o.out;
  for (const auto& row : j.at("table1")) EXPECT_EQ(row.at("match"), "NO") << row.dump();
}

// ---------------------------------------------------------------- schedule --json
// The double ring's JSON carries the traffic --ring asks for, as its text trace does: with ring
// traffic the backward moves K, V, dK, dV, and every rank sends eq. (7.3)'s 2 s H d (2N - 2n) bytes
// (read-only tensors and partial sums, G - 1 hops each).
TEST(Schedule, DoubleRingJsonFollowsRing) {
  for (const char* ring : {"ring", "burst"}) {
    const Output o = burstlab(std::string("schedule --algo double-ring --ring ") + ring +
                              " --world 4 --gpus-per-node 2 --nq 16 --nk 16 -d 8 --hq 2 --hkv 2 --dtype fp64 --pass bwd --json");
    ASSERT_EQ(o.rc, 0) << o.out << o.err;
    const auto j = nlohmann::json::parse(o.out);
    const auto& ph = j.at("phases").at(0);
    const bool r = std::string(ring) == "ring";
    EXPECT_EQ(ph.at("travelling"), r ? nlohmann::json({"K", "V", "dK", "dV"})
                                     : nlohmann::json({"Q", "dO", "D", "LSE", "dQ"})) << ph.at("travelling").dump();
    const int64_t s = 8, H = 2, d = 8, N = 16, n = 4;
    const int64_t want = r ? 2 * s * H * d * (2 * N - 2 * n) : s * H * ((2 * d + 2) * (N - n) + d * (N - n));  // (7.3), (7.5)
    for (const auto& rank : ph.at("ranks")) EXPECT_EQ(rank.at("sent").get<int64_t>(), want) << ring << " " << rank.dump();
  }
}

// ---------------------------------------------------------------- checkpoint --json
// Every column of every table is one JSON type (null where a value is absent, never a string such
// as "-", "yes" or "not run" in a column of numbers or booleans).
void expect_typed_columns(const nlohmann::json& rows, const std::string& table) {
  ASSERT_TRUE(rows.is_array()) << table;
  std::map<std::string, nlohmann::json::value_t> type;
  for (const auto& row : rows)
    for (const auto& [key, v] : row.items()) {
      if (v.is_null()) continue;
      // integers and doubles are both JSON numbers
      const auto t = v.is_number() ? nlohmann::json::value_t::number_float : v.type();
      const auto [it, fresh] = type.emplace(key, t);
      EXPECT_TRUE(fresh || it->second == t) << table << "." << key << " mixes types: " << row.dump();
    }
}

TEST(Checkpoint, JsonBooleansAreBooleansNumbersNumbersAbsentNull) {
  for (const char* args : {"checkpoint --nq 96 --tile 32 --json",
                           "checkpoint --algo distflash --world 4 --nq 96 --tile 32 --json"}) {
    const Output o = burstlab(args);
    ASSERT_EQ(o.rc, 0) << args << "\n" << o.out << o.err;
    const auto j = nlohmann::json::parse(o.out);
    const bool distributed = std::string(args).find("--algo") != std::string::npos;
    for (const char* t : {"placements", "distflash_volume", "distflash_table5", "burstengine"})
      expect_typed_columns(j.at(t), std::string(args) + " " + t);
    ASSERT_TRUE(j.at("not_run").is_array()) << args;  // present, empty when every placement ran
    EXPECT_EQ(j.at("not_run").size(), distributed ? 1u : 0u) << args;
    for (const auto& row : j.at("placements")) {
      const bool ran = row.at("placement") != "sequence" || !distributed;  // distflash: no row subsets
      for (const char* k : {"kept_KB", "attn_fwd", "row_fwd", "fwd_rows", "fwd_pairs", "attn_bwd"})
        EXPECT_TRUE(ran ? row.at(k).is_number() : row.at(k).is_null()) << args << " " << k << ": " << row.dump();
      for (const char* k : {"fwd_sent_KB", "bwd_sent_KB", "sent_per_worker_Nd"})
        EXPECT_TRUE(ran && distributed ? row.at(k).is_number() : row.at(k).is_null()) << args << " " << k;
      EXPECT_TRUE(ran && distributed ? row.at("bytes_ok") == true : row.at("bytes_ok").is_null()) << args << " " << row.dump();
      EXPECT_TRUE(ran ? row.at("bitwise") == true : row.at("bitwise").is_null()) << args << " " << row.dump();
    }
    for (const auto& row : j.at("distflash_volume")) {
      EXPECT_TRUE(row.at("paper").is_number()) << row.dump();  // in N d, as the model columns
      EXPECT_TRUE(row.at("measured").is_number() || row.at("measured").is_null()) << row.dump();
    }
    EXPECT_EQ(j.at("distflash_volume").at(0).at("paper"), 3);
    EXPECT_EQ(j.at("distflash_volume").at(1).at("paper"), 4);  // 3 N d + N d
    EXPECT_TRUE(j.at("distflash_volume").at(2).at("measured").is_null());  // Megatron-LM: a model, not run
    EXPECT_EQ(j.at("distflash_table5").at(0).at("per_gpu"), 8192);
  }
}

// ---------------------------------------------------------------- bench and suite
TEST(Bench, SmallJsonVerifiesThenTimes) {
  const Output o = burstlab("bench --nq 256 --nk 200 -d 64 --mask causal --reps 1 --gemm-n 128 --json");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j.at("verified"), true);
  for (const auto& row : j.at("verify")) EXPECT_EQ(row.at("result"), "PASS") << row.dump();
  EXPECT_GE(j.at("rows").size(), 4u);  // reference, cpu x fwd, bwd (x thread settings)
  EXPECT_GE(j.at("sgemm").size(), 1u);
}

TEST(Suite, PassesEverything) {
  const Output o = burstlab("suite");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  const std::string last = last_line(o.out);
  EXPECT_NE(last.find(" passed, 0 failed"), std::string::npos) << last;
  EXPECT_EQ(count(o.out, "FAIL") + count(o.out, "ERROR"), 0) << o.out;
  EXPECT_GT(count(o.out, "PASS"), 50) << o.out;
  // Every run the summary counts is a printed PASS row (and nothing else prints PASS).
  EXPECT_EQ(count(o.out, "PASS"), std::stoi(last.substr(0, last.find(" passed")))) << last;
}

}  // namespace
