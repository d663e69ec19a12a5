// tools/distributed.hpp — the distributed/ part of `burstlab run` (spec §7):
// `burstlab run --algo ring|burst --world G --partition ...`. `run` (cmd_run.cpp) calls down into
// these three; they call down into the Session and its World (distributed/, nccl/), never back up.
#pragma once

#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "common.hpp"  // Result
#include "impls.hpp"
#include "table.hpp"   // Json

namespace burstlab::tools {

struct DistRun;  // the distributed flags given to `run`, and what its wrapped runs leave behind

// Adds --algo, --world, --partition, --gpus-per-node, --transport, ... to `run`; call it after
// `run`'s own flags (the ones added here are refused without --algo).
std::shared_ptr<DistRun> add_distributed_flags(CLI::App& run);

// `run`'s selected implementations with --algo applied: each one that provides an engine becomes
// "<algo>/<impl>" per algorithm (run on SimComm or NCCL by --transport), kept as well with
// --single; the others stay single-device. Without --algo: `impls` as they are. Throws Error for a
// bad flag, before anything runs.
std::vector<Impl> distributed_impls(const std::shared_ptr<DistRun>& d, const std::vector<const Impl*>& impls);

// After `run`'s header: the bytes table against the closed forms (and the scaling table with
// --single), added to `header` and printed unless `json`. False when a byte count differs from its
// closed form; true without --algo.
bool distributed_report(const DistRun& d, Json& header, bool json, const std::vector<Result>& rs);

}  // namespace burstlab::tools
