// distributed/comm.hpp — the Communicator: the one transport interface (DESIGN.md
// "Distributed: one schedule, many transports"; spec §7.4).
// Schedules talk to a Communicator only: rank, size, asynchronous point-to-point send/recv with
// wait, all-gather, reduce-scatter with a custom reduction, all-to-all, barrier. Every transfer
// is recorded (per rank, per phase and step, per link class) so byte counts can be asserted
// against the closed forms of spec §7.5. Buffers are raw pointers in the memory the transport
// works on (host for SimComm, device for NCCL later); sizes are in bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace burstlab::dist {

enum class Phase : int { Forward = 0, Backward = 1, Other = 2 };
enum class Link : int { Intra = 0, Inter = 1 };  // same node / different nodes
std::string to_string(Phase p);
std::string to_string(Link l);

// One entry of a rank's transfer log. A message appears twice: sent = true in the sender's log,
// sent = false in the receiver's.
struct Transfer {
  Phase phase = Phase::Other;
  int step = 0;
  int src = 0, dst = 0;
  int tag = 0;
  int64_t bytes = 0;
  Link link = Link::Intra;
  bool sent = true;
  std::string what;  // tensor name, e.g. "K", or a collective's name
};

// Totals over a log; step < 0 = every step; link: -1 = both classes.
struct ByteTotals {
  int64_t sent = 0, recv = 0;
};
ByteTotals totals(const std::vector<Transfer>& log, Phase phase, int step = -1, int link = -1);

class Request {
 public:
  virtual ~Request() = default;  // implementations cancel or finish the transfer here
  // Blocks until the transfer completed; throws Error on a failed rank, a timeout, or a
  // size mismatch (the message names ranks, tensor, phase and step).
  virtual void wait() = 0;
  // Non-blocking: true once the transfer completed (successfully or not); wait() still reports.
  virtual bool done() = 0;
};
using RequestPtr = std::unique_ptr<Request>;
void wait_all(std::vector<RequestPtr>& reqs);  // waits every request, then clears the vector

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Link link_to(int peer) const { (void)peer; return Link::Intra; }

  // Accounting and error context: what the caller is doing now.
  void set_context(Phase phase, int step) { phase_ = phase; step_ = step; }
  Phase phase() const { return phase_; }
  int step() const { return step_; }
  std::string context() const;  // "forward step 2"

  // Point-to-point. `what` names the payload for logs and errors. Messages between the same
  // (src, dst) pair match by tag, in posting order. The buffer must stay valid and (for a send)
  // unmodified until the request completed. consume = true declares that the sender will not
  // read the buffer again before rewriting it (SimComm may then poison it, spec §7.4).
  virtual RequestPtr isend(const void* buf, int64_t bytes, int dst, int tag, const char* what,
                           bool consume = false) = 0;
  virtual RequestPtr irecv(void* buf, int64_t bytes, int src, int tag, const char* what) = 0;

  // Collectives. Generic versions built on isend/irecv (direct exchange, deterministic order);
  // transports may override. recv of all_gather / all_to_all holds size() * bytes.
  virtual void all_gather(const void* send, int64_t bytes, void* recv);
  virtual void all_to_all(const void* send, int64_t bytes_per_rank, void* recv);
  // send holds size() segments of bytes_per_rank; rank r receives in recv the reduction of
  // segment r of every rank, combined in rank order 0, 1, ..., G-1 (bitwise reproducible):
  // recv = seg_0; op(recv, seg_1); op(recv, seg_2); ...  op(acc, in, bytes) combines in into acc.
  using Reduce = std::function<void(void* acc, const void* in, int64_t bytes)>;
  virtual void reduce_scatter(const void* send, int64_t bytes_per_rank, void* recv,
                              const Reduce& op);
  virtual void barrier();

  const std::vector<Transfer>& log() const { return log_; }
  void clear_log() { log_.clear(); }

 protected:
  void record(int src, int dst, int tag, int64_t bytes, bool sent, const char* what);
  int next_collective_tag();  // reserved tag space for collectives, same sequence on every rank

 private:
  Phase phase_ = Phase::Other;
  int step_ = 0;
  int collective_seq_ = 0;
  std::vector<Transfer> log_;
};

}  // namespace burstlab::dist
