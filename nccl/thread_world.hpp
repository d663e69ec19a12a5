// nccl/world.hpp — where NcclComm's ranks live (spec §7.4, "NCCL"):
//   ThreadWorld  one process drives every local GPU, a thread per rank (`burstlab run
//                --transport nccl --world 2`);
//   MpiWorld     one process per GPU under mpirun (mpi_world.hpp; MPI only hands out the
//                ncclUniqueId and the host names, NCCL moves the data).
// The communicators live as long as the world: every pass reuses them.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nccl_comm.hpp"
#include "ranks.hpp"

namespace burstlab::nccl {

int device_count();  // CUDA devices visible to this process (0 without a GPU or driver)

// [rank] -> node index from --gpus-per-node K (ranks r, s share a node iff r / K == s / K), or
// from host names (ranks with equal names share a node) when K = 0.
std::vector<int> nodes_of(int world, int gpus_per_node, const std::vector<std::string>& hosts);

// A watchdog's check of one communicator, from another thread: the message of the oldest batch it
// posted that stalls (NcclComm::stall) and that the device, asked for at most a second, does not
// report complete; "" when none.
std::string stalled(NcclComm& c);

// Every run of the ranks is watched (ranks.hpp): the first failure of any rank aborts every
// communicator, a rank whose posted transfers stall past the timeout while its thread is away from
// the communicator (blocked in a CUDA call behind NCCL's kernel) is failed on its behalf, and every
// rank thread ends within the timeout plus a grace, or the process ends with a message saying
// where each rank is.
class ThreadWorld {
 public:
  // G ranks, rank r on device r; refuses G greater than the devices this process sees (NCCL
  // allows one rank per GPU) with an Error that says how to run more ranks. A rank that fails to
  // join stops the others at once.
  ThreadWorld(int G, NcclOptions o);
  ~ThreadWorld();  // closes every communicator (each on its rank's thread), watched like run()
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  NcclComm& comm(int r) { return *comms_.at(r); }
  // fn(comm) on a thread per rank, its device current; joins them. When a rank failed, every
  // rank's outcome is in errors() and this throws Error naming the first failure.
  void run(const std::function<void(NcclComm&)>& fn);
  // Closes every communicator (finalize, then destroy); throws Error naming the first failure.
  void close();
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::vector<std::string> watched(const std::function<void(int)>& body);
  std::string stalled();  // the first rank whose posted transfers stall (NcclComm::stall), or ""

  double timeout_s_ = 120;
  FailureBoard board_;
  std::mutex comms_mu_;  // comms_ entries, set by the rank threads while joining
  std::vector<std::unique_ptr<NcclComm>> comms_;
  std::vector<std::string> errors_;
  bool closed_ = false;
};

}  // namespace burstlab::nccl
