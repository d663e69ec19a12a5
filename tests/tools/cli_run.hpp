// tests/tools/cli_run.hpp — the CLI tests' way to run the burstlab binary (BURSTLAB_EXE, defined
// per test target): exit code, stdout and stderr captured apart.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace burstlab::cli_test {

struct Output {
  int rc = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs `<prefix> burstlab <args>` through the shell; prefix is shell text such as
// "env BURSTLAB_X=1" or "ulimit -v 2000000;". A signal gives 128 + its number, as a shell does.
inline Output run_burstlab(const std::string& args, const std::string& prefix = "") {
  static int counter = 0;
  const std::string base = ::testing::TempDir() + "burstlab_cli_" + std::to_string(getpid()) + "_" +
                           std::to_string(counter++);
  const std::string cmd = prefix + " '" BURSTLAB_EXE "' " + args + " >" + base + ".out 2>" + base + ".err </dev/null";
  const int status = std::system(cmd.c_str());
  Output o;
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.out = slurp(base + ".out");
  o.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return o;
}

// Bad input refused: exit 2, `message` (the field and value) and `hint` (the
// pointer to a --help) on stderr, nothing on stdout.
inline void expect_refused(const Output& o, const std::string& message, const std::string& hint) {
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_NE(o.err.find(message), std::string::npos) << "stderr: " << o.err;
  EXPECT_NE(o.err.find(hint), std::string::npos) << "no hint on stderr: " << o.err;
  EXPECT_EQ(o.out, "") << "something was printed on stdout";
}

}  // namespace burstlab::cli_test
