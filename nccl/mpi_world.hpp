// nccl/mpi_world.hpp — one process per GPU under mpirun (spec §7.4, "NCCL"). MPI hands rank 0's
// ncclUniqueId to every rank, gathers the host names (which ranks share a node: the link classes,
// the double ring's nodes; the node-local rank), gathers the results for the check, and carries
// notices on the side: a failure notice from a rank that failed, and a leave notice from a rank
// that ends. NCCL moves all attention data. Debian's OpenMPI is not CUDA-aware and need not be.
//
// Nothing waits without a bound: every MPI collective is non-blocking (MPI_Iallgather,
// MPI_Ibcast) and polled with the --timeout deadline, and every poll (these and NcclComm's) stops
// at once on a peer's failure notice, on a peer that left before the collective being waited for,
// or on a peer on this host whose process is gone (killed by a signal: checked by pid, at most
// every 100 ms), and a watchdog thread aborts the communicator when this rank's transfers stall
// while its thread is blocked outside it (as ThreadWorld's does). A failure anywhere in this process (MpiWorld::fail, NcclComm's failures, a
// failed start) tells the others, aborts the communicator, and ends the job with MPI_Abort at
// mpi_finish(); MPI_Finalize only ends a process that did not fail.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nccl_comm.hpp"
#include "thread_world.hpp"

namespace burstlab::nccl {

// True when this process was started by mpirun (OpenMPI, PMIx or PMI environment).
bool launched_by_mpi();
// This process's rank under mpirun from the environment (0 when not launched by it).
int mpi_env_rank();
int mpi_env_size();  // 1 when not launched by it

// Ends MPI for this process, once, if it was started: the process world is closed first, then
// MPI_Abort when this process failed (a failure anywhere above, also one that kept the MpiWorld
// from being made), else MPI_Finalize.
void mpi_finish();

class MpiWorld;
// This process's MpiWorld, made at the first call (with these options) and kept until
// mpi_finish(); nothing else may hold it past then.
std::shared_ptr<MpiWorld> process_world(const NcclOptions& o, int gpus_per_node);

class MpiWorld : public dist::World {
 public:
  // MPI_Init, then the communicator: rank = MPI rank, world = MPI size, device = the node-local
  // rank modulo the devices this process sees; node_of from gpus_per_node, else the host names.
  MpiWorld(NcclOptions o, int gpus_per_node);
  ~MpiWorld() override;  // closes the communicator, then sends the leave notice (MPI itself: mpi_finish())
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const;
  int size() const override;
  bool holds(int r) const override { return r == rank(); }
  NcclComm& comm() { return *comm_; }
  // fn(comm) for this process's rank, on the calling thread (MPI's), its device current; a
  // failure is told to the others (fail) and rethrown.
  void run(const std::function<void(dist::Communicator&)>& fn) override;
  const std::vector<std::string>& errors() const override { return errors_; }
  std::vector<std::vector<char>> allgather(const std::function<std::vector<char>(int r)>& mine,
                                           const std::string& what) override;
  std::vector<std::vector<double>> exposed_ms(Phase phase) override;
  std::string describe() const override;
  // Every rank's bytes, in rank order (MPI_Iallgather of the sizes, MPI_Iallgatherv), on every
  // rank; `what` names it in messages. Bounded by the timeout; a peer's failure ends it.
  std::vector<std::vector<char>> allgather(const std::vector<char>& mine, const std::string& what);
  // This process failed (`why`): tells the other ranks (once), aborts the communicator, and
  // marks the process for MPI_Abort at mpi_finish(). Never throws.
  void fail(const std::string& why) noexcept;
  void failed(const std::string& why) noexcept override { fail(why); }

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::unique_ptr<NcclComm> comm_;
  std::vector<std::string> errors_;
  // Aborts the communicator when this rank's posted transfers stall past the timeout while its
  // thread is away from it (blocked in a CUDA call behind NCCL's kernel, which only an abort
  // ends); the main thread then fails as for any abort and tells the others (MPI stays on it).
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace burstlab::nccl
