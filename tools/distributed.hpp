// tools/distributed.hpp — the distributed/ part of `burstlab run` (spec §7):
// `burstlab run --algo ring|burst --world G --partition ...`.
#pragma once

#include <CLI/CLI.hpp>

#include "impls.hpp"
#include "sim_run.hpp"

namespace burstlab::tools {

// A distributed run's outputs gathered from the ranks' shards (dist::gather) into global fp64
// tensors, BHSD: O, dQ (B, H_q, N_q, d), LSE (B, H_q, N_q), dK, dV (B, H_kv, N_k, d); a pass not
// asked for stays empty. `run` checks these against the full oracle, or with --check-rows with
// check_sampled_forward / check_sampled_backward (reference/rows.hpp, spec §9.11): a transport
// that brings each rank's shard to the host calls the same two steps.
struct GatheredOutputs {
  Tensor4<double> O, dQ, dK, dV;
  Tensor3<double> LSE;
};
template <class T>
GatheredOutputs gather_outputs(const dist::DistResult<T>& res, bool forward, bool backward);

// Adds --algo, --world, --partition, --gpus-per-node, --poison, --reorder, ... to `run` (through
// hooks: selected "cpu" rows become "<algo>/cpu" rows run on SimComm; other rows stay
// single-device for comparison).
void add_distributed_cli(CLI::App& run, RunHooks& hooks);

}  // namespace burstlab::tools
