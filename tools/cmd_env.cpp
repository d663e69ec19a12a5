// tools/cmd_env.cpp — `burstlab env`: every environment variable the project reads, from the one
// table (burstlab/env.hpp, src/env.cpp), with its value in this process, what unset means, its
// kind, who reads it and what it does.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "burstlab/env.hpp"
#include "common.hpp"
#include "table.hpp"

namespace burstlab::tools {

Command add_env_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "env", "the environment variables burstlab reads: value here, default, kind, reader, meaning");
  sub->add_flag("--json", *json, "a JSON array instead of the table");
  sub->footer(
      "The C++ code reads these only through burstlab/env.hpp; scripts, setup.py, the Python tests and\n"
      "the notebooks read theirs directly. A flag is 0 or 1; unset or empty means the default.\n"
      "Examples:\n"
      "  burstlab env\n"
      "  burstlab env --json");
  return {sub, [json]() -> int {
    Table t;
    t.columns = {{"name", "name", true},       {"value", "value", true},     {"default", "default", true},
                 {"kind", "kind", true},       {"read_by", "read by", true}, {"meaning", "meaning", true}};
    for (const env::Knob& k : env::knobs()) {
      const std::optional<std::string> v = env::text(k.name);
      const std::string fallback = k.fallback;
      t.add({text(k.name), v ? text(*v) : missing(), fallback.empty() ? missing() : text(fallback),
             text(env::to_string(k.kind)), text(k.read_by), text(k.meaning)});
    }
    if (*json)
      std::printf("%s\n", t.json().dump(2).c_str());
    else
      t.print(stdout);
    return kExitPass;
  }};
}

}  // namespace burstlab::tools
