// distributed/sim_comm.hpp — SimComm: G ranks as threads of one process (spec §7.4).
// How every schedule is proven on a CPU, in CI. Point-to-point messages match on
// (src, dst, tag) in posting order; a matched pair is copied by transfer worker threads, so a
// transfer really proceeds while the posting rank computes (double buffering overlaps for real).
// Options:
//   poison     recv buffers are NaN-filled when posted, and a send buffer posted with
//              consume = true is NaN-filled once its send completed: stale reads become NaN.
//   reorder    matched transfers complete in a seeded random order after random delays.
//   fail_rank  that rank throws at its fail_at_op-th communicator call (0 = the first); every
//              other rank then fails with an error naming the failed rank and its operation.
//              With fail_step >= 0 it fails instead when it enters step fail_step of fail_phase
//              (set_context), as NcclComm's --inject-failure does: every schedule reaches that
//              point at each of its steps, also a step that moves nothing. fail_hang: it stops
//              communicating there instead of throwing, until the world fails (another rank's
//              wait times out), at most 2 timeout_s.
//   timeout_s  bounds every wait; a timeout fails the whole world (nothing hangs).
//   in_order   after every SimWorld::run, fail unless an in-order transport (NCCL) would match
//              every message the same way and finish (in_order_problem, comm.hpp).
//   gpus_per_node  link class: ranks r, s are on one node iff r / gpus_per_node == s / gpus_per_node
//              (0 = one node).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm.hpp"
#include "world.hpp"

namespace burstlab::dist {

// Where the ranks' buffers live: host memory (memcpy, memset) unless an engine's device copies
// are given (e.g. cuda::transport_copy), so the ranks of one process can share one GPU.
struct SimMemory {
  std::function<void(void* dst, const void* src, int64_t bytes)> copy;  // returns when done
  std::function<void(void* buf, int64_t bytes)> poison;                 // every byte 0xff
};

struct SimOptions {
  bool poison = false;
  bool reorder = false;
  uint64_t seed = 1;
  int fail_rank = -1;
  int fail_at_op = 0;
  Phase fail_phase = Phase::Forward;
  int fail_step = -1;  // >= 0: fail at this step of fail_phase instead of at fail_at_op
  bool fail_hang = false;
  double timeout_s = 60.0;
  int gpus_per_node = 0;
  bool in_order = true;
  int workers = 2;           // transfer threads
  int threads_per_rank = 1;  // OpenMP threads each rank's engine may use
  SimMemory memory;          // empty: host memory
};

struct SimState;  // shared by the ranks of one world (sim_comm.cpp)

class SimWorld : public World {
 public:
  explicit SimWorld(int G, SimOptions options = {});
  ~SimWorld() override;
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  int size() const override { return G_; }
  bool one_device() const override { return true; }
  const SimOptions& options() const { return options_; }

  // Runs fn(comm) for every rank on its own thread, over a fresh set of SimComms, and joins
  // them. When any rank failed, every rank's outcome is in errors() and run() throws Error
  // naming the first failure.
  void run(const std::function<void(Communicator&)>& fn) override;
  const std::vector<std::string>& errors() const override { return errors_; }  // per rank, "" = ok
  std::string describe() const override { return "SimComm, " + std::to_string(G_) + " ranks"; }
  const std::vector<std::vector<Transfer>>& logs() const { return logs_; }  // per rank

 private:
  int G_;
  SimOptions options_;
  std::vector<std::string> errors_;
  std::vector<std::vector<Transfer>> logs_;
};

}  // namespace burstlab::dist
