// nccl/mpi_world.hpp — one process per GPU under mpirun (spec §7.4, "NCCL"). MPI does three
// things: it hands rank 0's ncclUniqueId to every rank, gathers the host names (which ranks share
// a node: the link classes, the double ring's nodes), and carries a failure notice from a rank
// that failed to the others (so they stop at once instead of at their timeout). NCCL moves all
// attention data. Debian's OpenMPI is not CUDA-aware and need not be.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nccl_comm.hpp"

namespace burstlab::nccl {

// True when this process was started by mpirun (OpenMPI, PMIx or PMI environment).
bool launched_by_mpi();
// This process's rank under mpirun from the environment (0 when not launched by it).
int mpi_env_rank();
int mpi_env_size();  // 1 when not launched by it

class MpiWorld {
 public:
  // MPI_Init, then the communicator: rank = MPI rank, world = MPI size, device = the node-local
  // rank modulo the devices this process sees; node_of from gpus_per_node, else the host names.
  MpiWorld(NcclOptions o, int gpus_per_node);
  ~MpiWorld();  // destroys the communicator, then MPI_Finalize
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const;
  int size() const;
  NcclComm& comm() { return *comm_; }
  // Every rank's bytes, in rank order (MPI_Allgatherv), on every rank.
  std::vector<std::vector<char>> allgather(const std::vector<char>& mine) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::unique_ptr<NcclComm> comm_;
};

}  // namespace burstlab::nccl
