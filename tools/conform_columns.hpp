// tools/conform_columns.hpp — the columns of `burstlab conform` (cmd_conform.cpp): one per
// implementation, and one per algorithm of the table on each engine, on SimComm or on the one
// NCCL World (docs/conformance.md).
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "case.hpp"        // check::CaseData, check::Candidate
#include "dist_flags.hpp"  // DistFlags
#include "impls.hpp"
#include "resources.hpp"   // Footprint
#include "world.hpp"

namespace burstlab::tools {

using check::CaseData;

// ---- conform -----------------------------------------------------------------------------------
// A column of the matrix. prepare() validates and sets up one case (throws Error when the column
// cannot run that problem: cell "n/a"); the closure it returns runs it (any throw: cell FAIL).
using RunFn = std::function<check::Candidate()>;
struct MatrixColumn {
  std::string name;
  std::vector<Dtype> dtypes;
  std::function<RunFn(const CaseData& cd)> prepare;
  Footprint footprint;  // host bytes of its run (resources.hpp); empty: not estimated
  std::string transport = "none";  // --json's "transport": sim or nccl for a distributed column
  // Runs on the one NCCL World (Net): its cells are collectives under mpirun.
  bool on_nccl() const { return transport == to_string(Transport::Nccl); }
  bool runs(Dtype t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }
};

// Where the distributed columns' ranks talk (--transport). SimComm: each cell's session has
// simulated ranks of its own. NCCL: every cell's session runs on ONE World made before the first
// case (a thread per GPU, or this process's rank under mpirun) and reuses its communicators. A
// throw inside that World aborts its communicators (and, under mpirun, ends every process at
// exit), so the NCCL cells after it are not run.
struct Net {
  DistFlags f;  // transport, gpus_per_node, timeout, inject; f.world is the G every column uses
  std::shared_ptr<dist::World> world;  // NCCL only
  std::string dead;                    // the first failure on `world` ("" while it is usable)
};


// An implementation run alone (its Runner), as a column.
MatrixColumn impl_column(const Impl& m);
// Every algorithm of the table (distributed/algorithm.hpp), on the engine of each implementation
// in `engines` (the layers cpu and cuda, and the engine plug-ins --impl names). attention2d runs on
// the cyclic partition it needs, distflash on the contiguous one, usp with groups of 2 (when 2
// divides G). On NCCL only the engines whose buffers live in device memory (a transport copy).
std::vector<MatrixColumn> dist_columns(const std::string& partition, const std::vector<const Impl*>& engines,
                                 const std::shared_ptr<Net>& net);
// Under NCCL every process must take the same branch for every cell (a process that skipped a
// session the others ran would leave them waiting): the refusal of any process, the lowest
// rank's, is every process's. One small collective per cell.
std::string agreed_refusal(dist::World& w, const std::string& mine, const std::string& what);

}  // namespace burstlab::tools
