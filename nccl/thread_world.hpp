// nccl/thread_world.hpp — where NcclComm's ranks live (spec §7.4, "NCCL"): the two dist::World kinds of
// the NCCL transport (distributed/world.hpp), and how `burstlab run --transport nccl` picks one.
//   ThreadWorld  one process drives every local GPU, a thread per rank (`burstlab run
//                --transport nccl --world 2`);
//   MpiWorld     one process per GPU under mpirun (mpi_world.hpp; MPI only hands out the
//                ncclUniqueId and the host names, gathers results, and carries failure notices;
//                NCCL moves the data).
// The communicators live as long as the world: every pass reuses them.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nccl_comm.hpp"
#include "ranks.hpp"
#include "world.hpp"  // dist::World (distributed/)

namespace burstlab::nccl {

int device_count();  // CUDA devices visible to this process (0 without a GPU or driver)

// [rank] -> node index from --gpus-per-node K (ranks r, s share a node iff r / K == s / K), or
// from host names (ranks with equal names share a node) when K = 0.
std::vector<int> nodes_of(int world, int gpus_per_node, const std::vector<std::string>& hosts);

// A watchdog's check of one communicator, from another thread: the message of the oldest batch it
// posted that stalls (NcclComm::stall) and that the device, asked for at most a second, does not
// report complete; "" when none.
std::string stalled(NcclComm& c);

// Host ms c's thread spent blocked in waits per step of `phase` (index = step), its latest pass.
std::vector<double> exposed_of(const NcclComm& c, Phase phase);

// How this process was started: by mpirun (OpenMPI, PMIx or PMI environment; always false in a
// build without MPI), its rank and the number of processes (0 and 1 otherwise).
struct Launch {
  bool by_mpi = false;
  int rank = 0;
  int size = 1;
};
Launch launch();
// The world of `burstlab run --transport nccl` with G ranks: under mpirun this process's
// MpiWorld (made at the first call and kept until shutdown(); G must equal the processes mpirun
// started), else a ThreadWorld of G ranks, one per GPU. `inject`: --inject-failure's text.
// Throws Error naming the flag for a bad timeout, injection or world.
std::shared_ptr<dist::World> nccl_world(int G, int gpus_per_node, double timeout_s, const std::string& inject);
// Ends an mpirun world, once, last in main(): MPI_Abort when this process failed, else
// MPI_Finalize (mpi_finish). Nothing without mpirun.
void shutdown();

// Every run of the ranks is watched (ranks.hpp): the first failure of any rank aborts every
// communicator, a rank whose posted transfers stall past the timeout while its thread is away from
// the communicator (blocked in a CUDA call behind NCCL's kernel) is failed on its behalf, and every
// rank thread ends within the timeout plus a grace, or the process ends with a message saying
// where each rank is.
class ThreadWorld : public dist::World {
 public:
  // G ranks, rank r on device r; refuses G greater than the devices this process sees (NCCL
  // allows one rank per GPU) with an Error that says how to run more ranks. A rank that fails to
  // join stops the others at once.
  ThreadWorld(int G, NcclOptions o);
  ~ThreadWorld() override;  // closes every communicator (each on its rank's thread), watched like run()
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const override { return static_cast<int>(comms_.size()); }
  NcclComm& comm(int r) { return *comms_.at(r); }
  // fn(comm) on a thread per rank, its device current; joins them. When a rank failed, every
  // rank's outcome is in errors() and this throws Error naming the first failure.
  void run(const std::function<void(NcclComm&)>& fn);
  void run(const std::function<void(dist::Communicator&)>& fn) override;
  // Closes every communicator (finalize, then destroy); throws Error naming the first failure.
  void close();
  const std::vector<std::string>& errors() const override { return errors_; }
  std::vector<std::vector<double>> exposed_ms(Phase phase) override;
  std::string describe() const override;

 private:
  // body(r) on a thread per rank under the watchdog (run_ranks).
  template <class Body>
  std::vector<std::string> watched(const Body& body) {
    return run_ranks(size(), body, board_, watch_);
  }
  std::string stalled();  // the first rank whose posted transfers stall (NcclComm::stall), or ""

  FailureBoard board_;
  RankWatch watch_;  // stops every communicator on the first failure; set by the constructor
  std::mutex comms_mu_;  // comms_ entries, set by the rank threads while joining
  std::vector<std::unique_ptr<NcclComm>> comms_;
  std::vector<std::string> errors_;
  bool closed_ = false;
};

}  // namespace burstlab::nccl
