// tests/tools/test_conform_cli.cpp — `burstlab conform --transport` on a machine without a GPU:
// the default and `--transport sim` give the same matrix, --json names each column's transport,
// and every bad combination of the transport flags is bad input (exit 2, the field and value on
// stderr, nothing on stdout) before anything runs. The NCCL runs themselves need GPUs:
// tests/nccl/mpi_nccl.sh.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace {

using burstlab::cli_test::Output;

Output burstlab(const std::string& args, const std::string& env = "") {
  return burstlab::cli_test::run_burstlab(args, env.empty() ? "" : "env " + env);
}

// The flag is optional and defaults to sim: the default run and an explicit --transport sim print
// the same matrix and exit the same way, with SimComm's columns (no transport line).
TEST(ConformTransport, SimIsTheDefault) {
  const std::string args = "conform --impl cpu,ring,burst --dtype fp64";
  const Output def = burstlab(args);
  const Output sim = burstlab(args + " --transport sim");
  ASSERT_EQ(def.rc, 0) << def.out << def.err;
  EXPECT_EQ(sim.rc, 0) << sim.out << sim.err;
  EXPECT_EQ(def.out, sim.out);
  EXPECT_EQ(def.out.rfind("case ", 0), 0u) << def.out;  // the matrix's header first, no transport line
  EXPECT_NE(def.out.find("ring/cpu G=2"), std::string::npos) << def.out;
  EXPECT_NE(def.out.find("33 passed, 0 failed"), std::string::npos) << def.out;  // cpu, ring/cpu, burst/cpu
}

// --json: one object per cell, keys as before plus "transport": sim for a distributed column,
// none for a column on one device.
TEST(ConformTransport, JsonRecordsTheTransport) {
  const Output o = burstlab("conform --impl cpu,ring --dtype fp64 --json");
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  std::istringstream lines(o.out);
  std::map<std::string, int> by_transport;
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++n;
    for (const char* key : {"case", "impl", "cell", "note", "transport"}) EXPECT_TRUE(j.contains(key)) << key << ": " << line;
    const std::string impl = j["impl"], transport = j["transport"];
    EXPECT_EQ(transport, impl == "cpu" ? "none" : "sim") << line;
    ++by_transport[transport];
    if (j["cell"] != "-" && j["cell"] != "n/a") {
      EXPECT_TRUE(j["pass"].get<bool>()) << line;
      EXPECT_TRUE(j["worst_err_bound"].is_number()) << line;
    }
  }
  EXPECT_EQ(by_transport["none"], 11) << o.out;  // the quick suite's 11 fp64 cases
  EXPECT_EQ(by_transport["sim"], n - 11) << o.out;
  EXPECT_GE(n, 22) << o.out;  // ring/cpu, and ring/cuda in a build with CUDA
}

struct Refusal {
  const char* args;
  const char* message;
  const char* env = "";
};
std::ostream& operator<<(std::ostream& os, const Refusal& r) { return os << r.env << " burstlab " << r.args; }

class Refused : public ::testing::TestWithParam<Refusal> {};

TEST_P(Refused, ExitsTwoNamingTheFieldAndValue) {
  const Refusal& r = GetParam();
  burstlab::cli_test::expect_refused(burstlab(r.args, r.env), r.message, "see `burstlab conform --help`");
}

// In every build.
INSTANTIATE_TEST_SUITE_P(
    AnyBuild, Refused,
    ::testing::Values(Refusal{"conform --transport bogus", "transport (bogus) must be sim or nccl"},
                      Refusal{"conform --transport NCCL", "transport (NCCL) must be sim or nccl"},
                      Refusal{"conform --timeout 5", "--timeout (5) is a --transport nccl option (the transport is sim)"},
                      Refusal{"conform --transport sim --timeout 5 --inject-failure 1:0",
                              "--timeout (5), --inject-failure (1:0) are --transport nccl options"},
                      Refusal{"conform --transport nccl --timeout 0", "timeout (0) must be > 0"},
                      Refusal{"conform --transport nccl --timeout -1", "timeout (-1) must be > 0"},
                      Refusal{"conform --gpus-per-node -1", "gpus-per-node (-1) must be >= 0 (0 = one node)"},
                      Refusal{"conform --world 0 --transport nccl", "world (0) must be >= 1"}));

#ifdef BURSTLAB_TEST_HAVE_NCCL
// A build with NCCL, on a machine with fewer than 256 GPUs. OMPI_COMM_WORLD_* make the process
// believe mpirun started it (nccl::launch reads the environment; MPI itself is not started
// before the refusal).
INSTANTIATE_TEST_SUITE_P(
    WithNccl, Refused,
    ::testing::Values(
        Refusal{"conform --transport nccl --impl cpu",
                "impl (cpu) is not a column of --transport nccl, whose columns are the algorithms on the engines in "
                "device memory: ring/cuda G=2, burst/cuda G=2"},
        Refusal{"conform --transport nccl --impl ring,reference", "impl (reference) is not a column of --transport nccl"},
        Refusal{"conform --transport nccl --world 256", "transport (nccl) with world (256) needs 256 GPUs in this process"},
        Refusal{"conform --transport nccl --inject-failure 2:0", "inject-failure (2:0) names rank 2 of a world of 2"},
        Refusal{"conform --transport nccl --inject-failure soon", "inject-failure (soon) must be RANK:STEP"},
        Refusal{"conform --transport nccl --world 3",
                "world (3) must equal the number of processes mpirun started (2): leave --world out under mpirun",
                "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0"},
        Refusal{"conform --transport nccl --world 1 --dtype bf16",
                "world (1) must equal the number of processes mpirun started (4)",
                "OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=0"}));

// mpirun's size binds the NCCL world only: with --transport sim every process runs its own
// SimComm ranks, --world as given.
TEST(ConformTransport, SimUnderMpirunIgnoresItsSize) {
  const Output o = burstlab("conform --impl ring --dtype fp64 --world 3", "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0");
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("ring/cpu G=3"), std::string::npos) << o.out;
}
#else
// A build without NCCL refuses the transport itself.
INSTANTIATE_TEST_SUITE_P(WithoutNccl, Refused,
                         ::testing::Values(Refusal{"conform --transport nccl",
                                                   "transport (nccl) needs a build with CUDA and NCCL"}));
#endif

// --help teaches the transport: what nccl runs, and the mpirun form.
TEST(ConformTransport, HelpTeachesNccl) {
  const Output h = burstlab("conform --help");
  ASSERT_EQ(h.rc, 0) << h.err;
  for (const char* text : {"--transport", "--timeout", "--gpus-per-node", "--inject-failure",
                           "mpirun -np 2 burstlab conform --transport nccl", "burstlab conform --transport nccl --world 2",
                           "rank 0 alone prints", "'not run'"})
    EXPECT_NE(h.out.find(text), std::string::npos) << text << "\n" << h.out;
}

}  // namespace
