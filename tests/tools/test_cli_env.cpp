// tests/tools/test_cli_env.cpp — `burstlab env`: the one table of environment variables
// (burstlab/env.hpp) against what the source tree reads. Fails when C++ code calls getenv outside
// src/env.cpp; when a variable read through env::, by setup.py, a Python test or a notebook
// (os.environ) or by a shell script (${NAME:-...}, upper case) is missing from
// `burstlab env --json`; or when a row names a reader that does not mention it.
// BURSTLAB_SOURCE_DIR: the repository (set by CMake).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace {

namespace fs = std::filesystem;
using burstlab::cli_test::run_burstlab;
using burstlab::cli_test::slurp;
using Json = nlohmann::json;

const fs::path kRoot = BURSTLAB_SOURCE_DIR;

Json env_json(const std::string& prefix = "") {
  const auto o = run_burstlab("env --json", prefix);
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.err, "");
  return Json::parse(o.out);
}

std::map<std::string, Json> by_name(const Json& rows) {
  std::map<std::string, Json> m;
  for (const Json& r : rows) m[r.at("name").get<std::string>()] = r;
  return m;
}

bool has_suffix(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Files of the repository (relative paths), without build trees, git's and ignored folders.
std::vector<std::string> source_files() {
  std::vector<std::string> out;
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory()) {
      if (name.rfind("build", 0) == 0 || name == ".git" || name == ".carry" || name == ".whl" || name == ".gl" ||
          name == "__pycache__" || name == ".ipynb_checkpoints")
        it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) out.push_back(fs::relative(it->path(), kRoot).generic_string());
  }
  return out;
}

enum class Lang { Cpp, Python, Shell, Other };
Lang lang_of(const std::string& rel) {
  for (const char* e : {".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh", ".inc"})
    if (has_suffix(rel, e)) return Lang::Cpp;
  if (has_suffix(rel, ".py") || has_suffix(rel, ".ipynb")) return Lang::Python;
  const std::string file = fs::path(rel).filename().string();
  if (has_suffix(rel, ".sh")) return Lang::Shell;
  if (rel.rfind(".ci/", 0) == 0 || (rel.rfind("scripts/", 0) == 0 && file.find('.') == std::string::npos)) {
    std::ifstream in((kRoot / rel).string());  // an executable script: its #! line says which
    std::string first;
    std::getline(in, first);
    return first.find("python") != std::string::npos ? Lang::Python : Lang::Shell;
  }
  return Lang::Other;
}

struct Reads {
  std::map<std::string, std::set<std::string>> names;  // variable -> files that read it
  std::vector<std::string> getenv_outside;             // C++ files calling getenv themselves
};

Reads scan_sources() {
  const std::regex getenv_call(R"(\b(secure_)?getenv\s*\()");
  const std::regex env_read(R"(env::(text|flag|integer)\(\s*"([A-Za-z_][A-Za-z0-9_]*)\")");
  const std::regex py_read(R"(os\.(environ\.get\(|environ\[|getenv\()\s*\\?["']([A-Za-z_][A-Za-z0-9_]*))");
  const std::regex sh_read(R"(\$\{([A-Z_][A-Z0-9_]*):?[-=+?])");  // upper case: the environment
  Reads r;
  for (const std::string& rel : source_files()) {
    if (rel == "tests/tools/test_cli_env.cpp") continue;  // its patterns would match themselves
    const Lang lang = lang_of(rel);
    if (lang == Lang::Other) continue;
    std::istringstream in(slurp((kRoot / rel).string()));
    std::string line;
    bool calls_getenv = false;
    while (std::getline(in, line)) {
      auto collect = [&](const std::regex& re, int group) {
        for (std::sregex_iterator m(line.begin(), line.end(), re), end; m != end; ++m)
          r.names[(*m)[group].str()].insert(rel);
      };
      if (lang == Lang::Cpp) {
        if (line.find("getenv") != std::string::npos && std::regex_search(line, getenv_call)) calls_getenv = true;
        if (line.find("env::") != std::string::npos) collect(env_read, 2);
      } else if (lang == Lang::Python) {
        if (line.find("os.") != std::string::npos) collect(py_read, 2);
      } else if (line.find("${") != std::string::npos) {
        collect(sh_read, 1);
      }
    }
    if (calls_getenv && rel != "src/env.cpp") r.getenv_outside.push_back(rel);
  }
  return r;
}

TEST(CliEnv, JsonListsEveryKnobWithItsFields) {
  const Json rows = env_json();
  ASSERT_TRUE(rows.is_array());
  ASSERT_GE(rows.size(), 8u);
  std::set<std::string> seen;
  for (const Json& r : rows) {
    for (const char* key : {"name", "value", "default", "kind", "read_by", "meaning"})
      EXPECT_TRUE(r.contains(key)) << r.dump() << " lacks " << key;
    const std::string name = r.at("name");
    EXPECT_TRUE(seen.insert(name).second) << name << " is listed twice";
    const std::string kind = r.at("kind");
    EXPECT_TRUE(kind == "flag" || kind == "integer" || kind == "text") << name << ": " << kind;
    EXPECT_FALSE(r.at("meaning").get<std::string>().empty()) << name;
    EXPECT_FALSE(r.at("read_by").get<std::string>().empty()) << name;
  }
}

TEST(CliEnv, ShowsTheValuesOfThisProcess) {
  const auto unset = by_name(env_json("env -u BURSTLAB_V4_GRID -u BURSTLAB_TEST_BROKEN_IMPL"));
  ASSERT_TRUE(unset.count("BURSTLAB_V4_GRID"));
  EXPECT_TRUE(unset.at("BURSTLAB_V4_GRID").at("value").is_null());
  EXPECT_EQ(unset.at("BURSTLAB_V4_GRID").at("default"), "0");
  const auto set = by_name(env_json("env BURSTLAB_V4_GRID=3 BURSTLAB_TEST_BROKEN_IMPL=1"));
  EXPECT_EQ(set.at("BURSTLAB_V4_GRID").at("value"), "3");
  EXPECT_EQ(set.at("BURSTLAB_TEST_BROKEN_IMPL").at("value"), "1");
}

TEST(CliEnv, TableHasAHeaderAndARowPerKnob) {
  const auto o = run_burstlab("env");
  ASSERT_EQ(o.rc, 0) << o.err;
  const Json rows = env_json();
  std::istringstream in(o.out);
  std::string header;
  std::getline(in, header);
  for (const char* col : {"name", "value", "default", "kind", "read by", "meaning"})
    EXPECT_NE(header.find(col), std::string::npos) << header;
  for (const Json& r : rows)
    EXPECT_NE(o.out.find("\n" + r.at("name").get<std::string>() + " "), std::string::npos) << r.at("name");
}

// A flag knob with a value other than 0 or 1 is bad input: exit 2, the variable and value named.
TEST(CliEnv, MalformedFlagIsBadInput) {
  const auto o = run_burstlab("run --impl reference --nq 8 --nk 8 -d 8", "env BURSTLAB_TEST_BROKEN_IMPL=yes");
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("BURSTLAB_TEST_BROKEN_IMPL (yes) must be 0 or 1"), std::string::npos) << o.err;
  EXPECT_EQ(o.out, "");
}

TEST(CliEnv, EveryVariableTheSourceReadsIsListed) {
  const Reads reads = scan_sources();
  EXPECT_TRUE(reads.getenv_outside.empty())
      << "read environment variables through burstlab/env.hpp, not getenv: " << reads.getenv_outside.front();
  // The scan must see the readers it is meant to police; an empty scan would pass anything.
  for (const char* known : {"BURSTLAB_CUDA_CACHE", "BURSTLAB_MEMORY_AVAILABLE", "BURSTLAB_BIN", "OUT"})
    EXPECT_TRUE(reads.names.count(known)) << "the scan did not find " << known;
  const auto listed = by_name(env_json());
  for (const auto& [name, files] : reads.names)
    EXPECT_TRUE(listed.count(name)) << name << " is read by " << *files.begin()
                                    << " but missing from src/env.cpp's table (burstlab env)";
}

// Each row's readers exist and mention the variable (a glob in a file name: one match does), so
// the table does not outlive the code that reads a variable.
TEST(CliEnv, EveryRowNamesReadersThatMentionIt) {
  const std::vector<std::string> files = source_files();
  for (const Json& r : env_json()) {
    const std::string name = r.at("name");
    std::istringstream list(r.at("read_by").get<std::string>());
    std::string reader;
    while (std::getline(list, reader, ',')) {
      reader.erase(0, reader.find_first_not_of(' '));
      std::string pattern;  // the reader as a regex: '*' matches within one path component
      for (char ch : reader) pattern += ch == '*' ? std::string("[^/]*") : std::regex_replace(std::string(1, ch), std::regex(R"([.^$|()\[\]{}+?\\])"), R"(\$&)");
      const std::regex re(pattern);
      bool exists = false, mentions = false;
      for (const std::string& f : files)
        if (std::regex_match(f, re)) {
          exists = true;
          mentions = mentions || slurp((kRoot / f).string()).find(name) != std::string::npos;
        }
      EXPECT_TRUE(exists) << name << ": reader " << reader << " is not a file of the repository";
      EXPECT_TRUE(mentions) << name << ": reader " << reader << " does not mention it";
    }
  }
}

}  // namespace
