// tests/check/test_check_cli.cpp — `burstlab gen/oracle/check/conform` end to end: gen is
// deterministic, an exact copy of the oracle passes (exit 0), a perturbed copy fails (exit 1)
// naming the coordinates, a malformed candidate file is bad input (exit 2) naming the file,
// --json parses, conform over the quick suite passes for the cpu layer.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "case.hpp"
#include "npy.hpp"

using namespace burstlab;
namespace fs = std::filesystem;

namespace {

struct Out {
  int rc;
  std::string text;  // stdout + stderr
};
Out run(const std::string& args) {
  const std::string cmd = std::string(BURSTLAB_EXE) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string text;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, text};
}

std::string root() {
  static const std::string d = [] {
    const std::string r = ::testing::TempDir() + "h7_cli";
    fs::remove_all(r);
    return r;
  }();
  return d;
}

}  // namespace

TEST(CaseCli, GenOracleCheckExitCodes) {
  const std::string suite = root() + "/suite";
  Out g = run("gen --out " + suite + " --quick");
  ASSERT_EQ(g.rc, 0) << g.text;
  // gen is deterministic: a second run writes the same bytes.
  ASSERT_EQ(run("gen --out " + root() + "/suite2 --quick").rc, 0);
  const std::string name = "03_causal_nq_gt_nk_empty_rows_fp32";
  for (const char* f : {"case.json", "q.npy", "k.npy", "v.npy", "dO.npy"})
    EXPECT_EQ(check::read_file(suite + "/" + name + "/" + f), check::read_file(root() + "/suite2/" + name + "/" + f)) << f;
  const Out o = run("oracle --case " + suite);
  ASSERT_EQ(o.rc, 0) << o.text;
  const std::string c = suite + "/" + name;
  const std::string cand = root() + "/cand";
  fs::create_directories(cand);
  for (const char* t : {"O", "LSE", "dQ", "dK", "dV"})
    fs::copy_file(c + "/expected/" + t + ".npy", cand + "/" + t + ".npy", fs::copy_options::overwrite_existing);
  Out pass = run("check --case " + c + " --candidate " + cand);
  EXPECT_EQ(pass.rc, 0) << pass.text;
  EXPECT_NE(pass.text.find("PASS"), std::string::npos);

  // One perturbed element of dQ (BHSD: b=0, h=2, i=60, k=4).
  check::NpyArray a = check::read_npy(cand + "/dQ.npy");
  ASSERT_EQ(a.shape, (std::vector<int64_t>{1, 4, 75, 32}));
  a.data[((0 * 4 + 2) * 75 + 60) * 32 + 4] += 0.25;
  check::write_npy(cand + "/dQ.npy", Dtype::F64, a.shape, a.data.data(), a.data.size());
  Out bad = run("check --case " + c + " --candidate " + cand + " --dtype fp32");
  EXPECT_EQ(bad.rc, 1) << bad.text;
  EXPECT_NE(bad.text.find("dQ (b=0, h=2, i=60, k=4)"), std::string::npos) << bad.text;
  Out js = run("check --json --case " + c + " --candidate " + cand);
  EXPECT_EQ(js.rc, 1);
  const nlohmann::json j = nlohmann::json::parse(js.text);
  EXPECT_FALSE(j["pass"].get<bool>());
  EXPECT_EQ(j["tensors"][2]["tensor"], "dQ");
  EXPECT_EQ(j["tensors"][2]["wrong"], 1);

  // A malformed candidate file: exit 2, one line naming the file.
  check::write_file(cand + "/dK.npy", "\x93NUMPY\x01\x00garbage");
  Out mal = run("check --case " + c + " --candidate " + cand);
  EXPECT_EQ(mal.rc, 2) << mal.text;
  EXPECT_NE(mal.text.find("dK.npy"), std::string::npos) << mal.text;
  // A missing tensor fails (exit 1).
  fs::remove(cand + "/dK.npy");
  Out miss = run("check --case " + c + " --candidate " + cand);
  EXPECT_EQ(miss.rc, 1) << miss.text;
  EXPECT_NE(miss.text.find("missing"), std::string::npos) << miss.text;
  // Bad flags: exit 2 naming the flag.
  Out flag = run("check --case " + c + " --candidate " + cand + " --lse-base 10");
  EXPECT_EQ(flag.rc, 2);
  EXPECT_NE(flag.text.find("lse-base (10)"), std::string::npos) << flag.text;
}

TEST(CaseCli, ConformMatrixPassesForCpu) {
  Out r = run("conform --impl cpu --dtype fp64");
  EXPECT_EQ(r.rc, 0) << r.text;
  EXPECT_NE(r.text.find("11 passed, 0 failed"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find(" FAIL "), std::string::npos) << r.text;  // a cell
  EXPECT_EQ(r.text.find("\nFAIL "), std::string::npos) << r.text;  // a note
  // Distributed columns (SimComm, cpu engine) when distributed/ is built into the binary.
  Out d = run("conform --impl ring,allgather --dtype fp64");
  EXPECT_EQ(d.rc, 0) << d.text;
  EXPECT_EQ(d.text.find(" FAIL "), std::string::npos) << d.text;
  Out bad = run("conform --impl nosuch");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.text.find("impl (nosuch)"), std::string::npos) << bad.text;
}
