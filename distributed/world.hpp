// distributed/world.hpp — where a Session's ranks run (spec §7.4): every pass of every schedule
// goes through one World, whatever the transport.
//   SimWorld           G ranks as threads of this process over SimComm (sim_comm.hpp);
//   nccl::ThreadWorld  a thread per GPU of this process over NcclComm (nccl/thread_world.hpp);
//   nccl::MpiWorld     one process per GPU under mpirun, this process holding one rank
//                      (nccl/mpi_world.hpp).
// The Session (session.hpp) builds each rank's engine, uploads its shard, runs its passes and
// gathers its outputs through these calls only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm.hpp"

namespace burstlab::dist {

class World {
 public:
  virtual ~World() = default;
  virtual int size() const = 0;  // G
  // Whether rank r runs in this process (mpirun: only its own).
  virtual bool holds(int r) const {
    (void)r;
    return true;
  }
  // Whether the ranks of this process share one device (SimWorld: then one engine serves them).
  virtual bool one_device() const { return false; }
  // body(comm) for every rank held here, each on its own thread with its device current, joined.
  // When a rank failed, errors() holds each held rank's outcome and this throws Error naming the
  // first failure.
  virtual void run(const std::function<void(Communicator&)>& body) = 0;
  virtual const std::vector<std::string>& errors() const = 0;  // [rank], "" = ok
  // Every rank's bytes on every process, in rank order: `mine(r)` for each rank held here, the
  // others' from their processes (a collective: every process calls it in the same order).
  virtual std::vector<std::vector<char>> allgather(const std::function<std::vector<char>(int r)>& mine,
                                                   const std::string& what);
  // Host ms each rank spent blocked in waits per step of the latest pass of `phase`, [rank][step]
  // (the communication its compute did not hide); empty where the transport does not measure it.
  // A collective, like allgather.
  virtual std::vector<std::vector<double>> exposed_ms(Phase phase) {
    (void)phase;
    return {};
  }
  // This process failed outside run() (e.g. checking a gathered result): the other processes
  // are told, as for a failure inside it. Never throws.
  virtual void failed(const std::string& why) noexcept { (void)why; }
  virtual std::string describe() const = 0;  // "SimComm, 4 ranks", "threads, 2 GPUs", ...
};

}  // namespace burstlab::dist
