// tools/cmd_env.hpp — `burstlab env`: the environment variables the project reads (burstlab/env.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include "common.hpp"  // Command

namespace burstlab::tools {

Command add_env_command(CLI::App& app);

}  // namespace burstlab::tools
