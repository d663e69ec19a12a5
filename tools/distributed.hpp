// tools/distributed.hpp — the distributed/ part of the `burstlab` command line (spec §7):
// `burstlab run --algo ring|burst --world G --partition ...` and `burstlab schedule`.
#pragma once

#include <CLI/CLI.hpp>

#include "impls.hpp"

namespace burstlab::tools {

// Adds --algo, --world, --partition, --gpus-per-node, --poison, --reorder to `run` (through
// hooks: selected "cpu" rows become "<algo>/cpu" rows run on SimComm; other rows stay
// single-device for comparison) and the `schedule` subcommand to `app`.
void add_distributed_cli(CLI::App& app, CLI::App& run, RunHooks& hooks);

}  // namespace burstlab::tools
