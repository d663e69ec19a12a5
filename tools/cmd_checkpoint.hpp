// tools/cmd_checkpoint.hpp — `burstlab checkpoint` (spec §11).
#pragma once

#include <CLI/CLI.hpp>

#include "common.hpp"

namespace burstlab::tools {

Command add_checkpoint_command(CLI::App& app);

}  // namespace burstlab::tools
