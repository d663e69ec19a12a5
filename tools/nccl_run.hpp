// tools/nccl_run.hpp — `burstlab run --algo ... --transport nccl`: the schedules of the algorithm
// table (distributed/algorithm.hpp) over NcclComm (nccl/), a rank per GPU, as threads of this
// process or one process per GPU under mpirun. Every rank's outputs come back to the host of
// every process, so `run` checks them against the oracle as it checks SimComm's.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "impls.hpp"
#include "sim_run.hpp"

namespace burstlab::tools {

struct NcclFlags {
  double timeout_s = 120.0;  // --timeout
  std::string inject;        // --inject-failure RANK:STEP[:bwd][:hang]
};

// A prepared distributed run over NCCL.
struct NcclDist {
  Runner run;                // forward / backward time a pass on every rank; fetch_* gather
  dist::Plan plan;
  std::string launch;        // "threads, 2 GPUs" or "mpirun, 2 processes"
  // Every rank's transfer log (the latest pass of each phase, as of the latest fetch) and the
  // host time each rank spent blocked in waits in each step of a phase's latest pass, [rank][step]
  // in ms: the communication its compute did not hide. Under mpirun exposed_ms is a collective:
  // every process calls it in the same order.
  std::function<std::vector<std::vector<dist::Transfer>>()> logs;
  std::function<std::vector<std::vector<double>>(dist::Phase)> exposed_ms;
};

// o.world ranks: under mpirun the MPI size (o.world must equal it), else threads of this
// process. Throws Error for bad flags, too few GPUs, or an NCCL failure at start-up.
NcclDist nccl_dist(const Problem& p, const Inputs& in, const ImplOptions& opt, const dist::AlgoOptions& o,
                   const EngineMakers& mk, const NcclFlags& f);

// Under mpirun: this process's rank, from the environment (0 otherwise). main() prints tables
// on rank 0 only.
bool launched_by_mpi();
int mpi_rank();
int mpi_size();  // the processes mpirun started (1 otherwise)
// Ends the mpirun world (MPI_Finalize) if this process started one; main() calls it last.
void nccl_shutdown();

}  // namespace burstlab::tools
