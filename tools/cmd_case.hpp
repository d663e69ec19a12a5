// tools/cmd_case.hpp — `burstlab gen`, `oracle`, `check`, `conform` (cmd_case.cpp, docs/conformance.md).
#pragma once

#include <vector>

#include "common.hpp"

namespace burstlab::tools {
std::vector<Command> add_case_commands(CLI::App& app);
}  // namespace burstlab::tools
