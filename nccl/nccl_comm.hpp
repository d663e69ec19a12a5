// nccl/nccl_comm.hpp — NcclComm: the Communicator (distributed/comm.hpp) over NCCL, one rank per
// GPU (spec §7.4, "NCCL"). Schedules run on it unchanged.
//
// How the Communicator maps onto NCCL:
//   batch                     ncclGroupStart / ncclGroupEnd: the batch's sends and receives are
//                             one group, enqueued on this rank's communication stream; an event
//                             recorded after the group completes every request of the batch. A
//                             batch cancelled by an error (NCCL cannot withdraw a group's
//                             operations) aborts the communicator and tells the other ranks.
//   isend / irecv             ncclSend / ncclRecv of `bytes` as ncclUint8 (outside a batch: a
//                             group of one). NCCL pairs the messages of a (src, dst) pair in
//                             posting order; SimComm checks every schedule under that model
//                             (in_order_problem), so tags only label the log here.
//   Request::wait             polls the group's event; the host blocks, the compute stream
//                             (engine) keeps running, so a transfer posted before a step's compute
//                             overlaps it.
//   barrier                   a one-element all-reduce.
// Buffers are device memory of this rank's GPU. A send's buffer must be complete when it is
// posted: schedules call Engine::synchronize() before posting what the engine wrote, as they do
// for SimComm over device memory.
//
// The watchdog: the communicator is non-blocking (ncclConfig_t::blocking = 0), so no NCCL call
// blocks the host; every wait polls with a deadline. An operation that does not complete within
// `timeout_s`, an NCCL asynchronous error, or a failure reported by another rank (Peers) aborts
// the communicator (ncclCommAbort) and throws Error naming this rank, the operation (tensor,
// peer, bytes), the phase and the step. After that every call throws. Nothing hangs.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm.hpp"

namespace burstlab::nccl {

using dist::Communicator;
using dist::Link;
using dist::Phase;
using dist::RequestPtr;

// How a rank learns that another rank failed, and tells the others that it did. In one process
// (a thread per GPU) a shared flag; under mpirun a message on the side (mpi_world.cpp).
struct Peers {
  // "" while every rank is fine; else the first failure's message.
  std::function<std::string()> failure;
  // Called once with this rank's error before it aborts.
  std::function<void(const std::string&)> report;
};

// --inject-failure RANK:STEP[:bwd][:hang]: rank RANK fails when it enters step STEP of the
// forward (of the backward with bwd; fwd names the forward explicitly), i.e. when its schedule
// sets that context, before the step's first transfer; every schedule passes there, also at a
// step that moves nothing. It throws, or with hang stops communicating until the others give up.
struct Injection {
  int rank = -1;
  int step = 0;
  Phase phase = Phase::Forward;
  bool hang = false;
};
Injection parse_injection(const std::string& s);  // Error naming "inject-failure" and the value
std::string to_string(const Injection& in);        // as parse_injection reads it: "1:0:bwd:hang"

struct NcclOptions {
  double timeout_s = 120.0;  // --timeout: the watchdog's bound on one wait
  std::vector<int> node_of;  // [rank] -> node index: the link class of each peer (empty: one node)
  Injection inject;
  Peers peers;
};

// The ncclUniqueId as bytes (handed out by MPI, or shared by the threads of one process).
std::vector<char> new_unique_id();

class NcclComm : public Communicator {
 public:
  // Joins the communicator `id` as `rank` of `size` on CUDA device `device` (made current on the
  // calling thread). Blocks until every rank joined, or the watchdog gives up.
  NcclComm(const std::vector<char>& id, int rank, int size, int device, NcclOptions o);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Link link_to(int peer) const override;
  int device() const { return device_; }

  RequestPtr isend(const void* buf, int64_t bytes, int dst, int tag, const char* what, bool consume = false) override;
  RequestPtr irecv(void* buf, int64_t bytes, int src, int tag, const char* what) override;
  void barrier() override;

  // Aborts the communicator (idempotent; never throws); later calls throw. Used when this rank
  // fails.
  void abort(const std::string& why) noexcept;
  bool aborted() const { return aborted_; }

  // Host time spent blocked in Request::wait, per wait. Schedules wait after the step's compute
  // and Engine::synchronize(), so this is the communication the compute did not hide.
  struct Exposed {
    Phase phase;
    int step;
    double ms;
  };
  const std::vector<Exposed>& exposed() const { return exposed_; }
  void clear_exposed(Phase phase);  // forgets the waits of one phase (a new pass of it)

  struct Group;  // one ncclGroupStart/End and its completion event (nccl_comm.cpp)

 protected:
  void begin_batch() override;
  void end_batch() override;
  void cancel_batch(const char* why) noexcept override;
  void context_changed() override;  // --inject-failure

 private:
  friend class NcclRequest;
  void check_usable(const char* op) const;
  // Polls until NCCL's asynchronous state is settled (non-blocking calls), or fails.
  void settle(const std::string& op);
  // Polls `done` until true; past `timeouts` x --timeout, on an NCCL error or a peer's failure:
  // abort and throw.
  void poll(const std::function<bool()>& done, const std::string& op, int timeouts = 1);
  [[noreturn]] void fail_op(const std::string& op, const std::string& why);
  RequestPtr post(bool send, void* buf, int64_t bytes, int peer, int tag, const char* what);

  int rank_, size_, device_;
  NcclOptions o_;
  ncclComm_t comm_ = nullptr;
  void* stream_ = nullptr;   // cudaStream_t: the communication stream
  void* scratch_ = nullptr;  // a device float for the barrier's all-reduce
  std::shared_ptr<Group> open_;  // the batch being posted
  bool aborted_ = false;
  bool injected_ = false;
  bool group_started_ = false;  // ncclGroupStart called, ncclGroupEnd not yet
  std::string abort_reason_;
  std::vector<Exposed> exposed_;
};

}  // namespace burstlab::nccl
