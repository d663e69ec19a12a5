// tools/cmd_simulate.hpp — `burstlab simulate` (the alpha-beta simulator, spec §7.10).
#pragma once

#include <CLI/CLI.hpp>

#include "common.hpp"  // Command

namespace burstlab::tools {

Command add_simulate_command(CLI::App& app);

}  // namespace burstlab::tools
