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

namespace burstlab::nccl {

int device_count();  // CUDA devices visible to this process (0 without a GPU or driver)

// [rank] -> node index from --gpus-per-node K (ranks r, s share a node iff r / K == s / K), or
// from host names (ranks with equal names share a node) when K = 0.
std::vector<int> nodes_of(int world, int gpus_per_node, const std::vector<std::string>& hosts);

class ThreadWorld {
 public:
  // G ranks, rank r on device r; refuses G greater than the devices this process sees (NCCL
  // allows one rank per GPU) with an Error that says how to run more ranks.
  ThreadWorld(int G, NcclOptions o);
  ~ThreadWorld();
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  NcclComm& comm(int r) { return *comms_.at(r); }
  // fn(comm) on a thread per rank, its device current; joins them. When a rank failed, every
  // rank's outcome is in errors() and this throws Error naming the first failure.
  void run(const std::function<void(NcclComm&)>& fn);
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  struct Failure {  // the ranks' shared Peers
    std::mutex mu;
    std::string first;
  };
  std::shared_ptr<Failure> failure_ = std::make_shared<Failure>();
  std::vector<std::unique_ptr<NcclComm>> comms_;
  std::vector<std::string> errors_;
};

}  // namespace burstlab::nccl
