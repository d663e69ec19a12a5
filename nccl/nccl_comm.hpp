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
// peer, bytes), the phase and the step. After that every call throws. Each poll looks for those
// failures before it looks for completion: an aborted NCCL kernel ends early, and its event then
// completes although the data never arrived.
// Another thread may abort the communicator (abort() is thread-safe): a rank's thread can be
// blocked in a CUDA call that waits for its GPU while NCCL's kernel there waits for a peer that
// never posts; only an abort ends that kernel. ThreadWorld does it on the first failure of any
// rank, and on a rank whose posted transfers stall past the timeout while its thread is away from
// the communicator (stall()).
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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
  // Called with this rank's error before it aborts (the first report counts).
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
  // calling thread). Polls until every rank joined, or the watchdog gives up; a failure here is
  // reported to the other ranks (Peers) before it is thrown, so they stop waiting at once.
  NcclComm(const std::vector<char>& id, int rank, int size, int device, NcclOptions o);
  ~NcclComm() override;  // close() unless closed; a failure there is printed (stderr)
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Link link_to(int peer) const override;
  int device() const { return device_; }

  RequestPtr isend(const void* buf, int64_t bytes, int dst, int tag, const char* what, bool consume = false) override;
  RequestPtr irecv(void* buf, int64_t bytes, int src, int tag, const char* what) override;
  void barrier() override;

  // Ends the communicator: ncclCommFinalize, polled like every wait (the peers finalize too),
  // then ncclCommDestroy; on a failure it aborts instead and throws Error naming the rank and the
  // NCCL call. Nothing to do on an aborted communicator. Call on the rank's thread, the other
  // ranks closing theirs at the same time.
  void close();

  // Aborts the communicator: later calls throw, naming `why`. Idempotent, never throws, callable
  // from any thread (NCCL calls of the owner thread are serialized with it; a batch being posted
  // is ended first). A failed ncclCommAbort is printed (stderr) and kept in the reason.
  void abort(const std::string& why) noexcept;
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;

  // For a watchdog on another thread: the oldest batch this rank posted and has not seen
  // complete, when it was posted more than the timeout ago while this rank's thread has been away
  // from the communicator (not in a wait) for the timeout too. `done` is the batch's CUDA event
  // (cudaEvent_t), to ask the device whether it is complete after all; `holder` keeps it alive.
  struct Stall {
    void* done = nullptr;
    std::shared_ptr<void> holder;
    std::string message;  // the failure to declare, naming the rank, the batch, phase and step
  };
  bool stall(Stall& out) const;
  void mark_complete(const std::shared_ptr<void>& holder) const;  // the device says it completed
  std::string where() const;  // what the owner thread is doing, for messages

  // Host time spent blocked in Request::wait, per wait. Schedules wait after the step's compute
  // and Engine::synchronize(), so this is the communication the compute did not hide.
  struct Exposed {
    Phase phase;
    int step;
    double ms;
  };
  const std::vector<Exposed>& exposed() const { return exposed_; }
  void clear_exposed(Phase phase);  // forgets the waits of one phase (a new pass of it)
  void begin_pass(Phase phase) override { clear_exposed(phase); }

  struct Group;  // one ncclGroupStart/End and its completion event (nccl_comm.cpp)

 protected:
  void begin_batch() override;
  void end_batch() override;
  void cancel_batch(const char* why) noexcept override;
  void context_changed() override;  // --inject-failure

 private:
  friend class NcclRequest;
  using Clock = std::chrono::steady_clock;
  void check_usable(const char* op) const;
  // Polls until NCCL's asynchronous state is settled (non-blocking calls), or fails.
  void settle(const std::string& op);
  // Polls `done` until true; first, each time: an abort from another thread, an NCCL error, a
  // peer's failure, then past `timeouts` x --timeout: abort and throw.
  void poll(const std::function<bool()>& done, const std::string& op, int timeouts = 1);
  [[noreturn]] void fail_op(const std::string& op, const std::string& why);
  void set_reason(const std::string& why) noexcept;  // the abort reason, unless one is set
  RequestPtr post(bool send, void* buf, int64_t bytes, int peer, int tag, const char* what);
  ncclResult_t async_state();  // ncclCommGetAsyncError (ncclInvalidArgument once aborted)
  std::string last_error();    // ncclGetLastError, for messages
  void release() noexcept;     // the stream and scratch (after the communicator is gone)
  void track(const std::shared_ptr<Group>& g);  // a posted batch, watched by stall()

  int rank_, size_, device_;
  NcclOptions o_;
  // Guards comm_ and every NCCL call on it. The owner holds it from ncclGroupStart to
  // ncclGroupEnd (a group's operations name the communicator until the group ends), so an abort
  // from another thread waits for the end of a batch being posted; NCCL calls here never block.
  mutable std::recursive_timed_mutex mu_;
  ncclComm_t comm_ = nullptr;
  void* stream_ = nullptr;   // cudaStream_t: the communication stream
  void* scratch_ = nullptr;  // a device float for the barrier's all-reduce
  std::shared_ptr<Group> open_;  // the batch being posted
  bool batch_locked_ = false;    // mu_ held for the batch being posted
  std::atomic<bool> aborted_{false};
  bool injected_ = false;
  bool group_started_ = false;  // ncclGroupStart called, ncclGroupEnd not yet
  bool closed_ = false;
  mutable std::mutex state_mu_;  // abort_reason_, pending_
  std::string abort_reason_;
  std::vector<std::shared_ptr<Group>> pending_;  // posted batches not yet seen complete, oldest first
  std::atomic<bool> in_wait_{false};             // the owner thread is in poll()
  std::atomic<int64_t> away_since_ns_{0};        // when it last left a communicator call
  std::atomic<int> ctx_phase_{int(Phase::Other)}, ctx_step_{0};  // the context, for where()
  std::vector<Exposed> exposed_;
};

}  // namespace burstlab::nccl
