// tools/cmd_simulate.hpp — `burstlab simulate` (the alpha-beta simulator, spec §7.10) and the
// double-ring trace for `burstlab schedule --algo double-ring` (spec §7.9).
#pragma once

#include <CLI/CLI.hpp>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "partition.hpp"

namespace burstlab::tools {

void add_simulate_command(CLI::App& app);

// Forward / backward trace of the double ring (BurstAttention traffic), then per rank its bytes
// per link class next to the closed forms of spec §7.9.
void print_double_ring(const Problem& p, const MaskData& mask, const dist::Partition& qp, const dist::Partition& kp,
                       int64_t elem_bytes, int gpus_per_node, bool fwd, bool bwd);

}  // namespace burstlab::tools
