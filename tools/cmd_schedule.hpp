// tools/cmd_schedule.hpp — `burstlab schedule` (spec §7): what each rank computes and sends.
#pragma once

#include <CLI/CLI.hpp>

#include "common.hpp"  // Command

namespace burstlab::tools {

Command add_schedule_command(CLI::App& app);

}  // namespace burstlab::tools
