// distributed/comm.hpp — the Communicator: the one transport interface (docs/design.md §5;
// spec §7.4).
// Schedules talk to a Communicator only: rank, size, asynchronous point-to-point send/recv with
// wait, grouped into batches, and a barrier. The schedules' collectives (gathers, all-to-alls,
// reduce-scatters with the merge or a sum) are batches of point-to-point messages, one per peer
// and tensor each way (the rows of every (b, h) packed or staged: shard_ops.hpp's exchange), so
// ragged shards need no padding and every reduction runs in the engine's memory in a fixed
// order. Every transfer
// is recorded (per rank, per phase and step, per link class) so byte counts can be asserted
// against the closed forms of spec §7.5. Buffers are raw pointers in the memory the transport
// works on (host or one GPU's memory for SimComm, the rank's GPU for NcclComm in nccl/); sizes
// are in bytes.
#pragma once

#include <cstdint>
#include <exception>
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
  int batch = -1;    // the batch it was posted in (its sequence number), -1 = none
};

// Totals over a log; step < 0 = every step; link: -1 = both classes.
struct ByteTotals {
  int64_t sent = 0, recv = 0;
};
ByteTotals totals(const std::vector<Transfer>& log, Phase phase, int step = -1, int link = -1);

// What an in-order transport would do with the logs of one pass (logs[r] = rank r's transfers in
// posting order). NCCL matches the messages of a (src, dst) pair in posting order, not by tag,
// and the groups (batches) of one communicator run one after another on the device: a group ends
// only when every message in it found its partner running. Returns "" when (1) the k-th send of
// every pair meets the k-th receive with the same tag and size, as SimComm matched them, and
// (2) replaying the groups in that model, every rank's groups all complete; else the first
// problem, naming ranks, tensors, phases and steps. Spec §7.4.
std::string in_order_problem(const std::vector<std::vector<Transfer>>& logs);

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

  // Accounting and error context: what the caller is doing now. Every schedule calls it at the
  // start of each of its steps, also of a step that moves nothing, so a transport's failure
  // injection (context_changed) is reached at every step of every schedule.
  void set_context(Phase phase, int step) {
    phase_ = phase;
    step_ = step;
    context_changed();
  }
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

  // The batch boundary: the sends and receives that post() makes are one group (NCCL:
  // ncclGroupStart/End, without which two ranks that post a send to each other before their
  // receives deadlock). batch() begins the group, runs post(), and ends it explicitly, so an
  // error at the end (a timeout, a transport error, another rank's failure) reaches the caller
  // as an exception like any other. An exception from post() cancels the group instead
  // (cancel_batch: never throws; NCCL aborts the communicator, which cannot withdraw operations
  // it was given) and propagates. The requests are waited for after batch() returns, never
  // inside it. Batches do not nest. SimComm posts each operation at once (its transfer threads
  // need no grouping) and records the batch of every transfer in the log, so tests assert that
  // schedules post all their messages in batches.
  template <class Post>
  void batch(Post&& post) {
    begin_batch();
    try {
      post();
    } catch (const std::exception& e) {
      cancel_batch(e.what());
      throw;
    } catch (...) {
      cancel_batch("an unknown exception");
      throw;
    }
    end_batch();
  }
  bool in_batch() const { return batch_open_; }

  // Returns once every rank has entered (zero-byte messages to and from every peer).
  virtual void barrier();

  const std::vector<Transfer>& log() const { return log_; }
  void clear_log() { log_.clear(); }
  // A pass of `phase` begins (the Session calls it): a transport's per-pass statistics of that
  // phase restart (NcclComm's exposed wait times).
  virtual void begin_pass(Phase phase) { (void)phase; }

 protected:
  // Called by set_context once the new phase and step are set: SimComm and NcclComm fire an
  // injected failure here.
  virtual void context_changed() {}
  // The pieces of batch(), for transports to extend; only batch() calls them, so no batch is
  // left open and none is ended by a destructor while an exception unwinds.
  virtual void begin_batch();
  virtual void end_batch();
  virtual void cancel_batch(const char* why) noexcept;  // why: the error that abandons the batch
  // The same on another communicator (a Communicator that forwards to one, as usp's ring does).
  static void begin_batch_of(Communicator& c) { c.begin_batch(); }
  static void end_batch_of(Communicator& c) { c.end_batch(); }
  static void cancel_batch_of(Communicator& c, const char* why) noexcept { c.cancel_batch(why); }

  void record(int src, int dst, int tag, int64_t bytes, bool sent, const char* what);
  int next_collective_tag();  // reserved tag space for collectives, same sequence on every rank

 private:
  Phase phase_ = Phase::Other;
  int step_ = 0;
  int collective_seq_ = 0;
  int batch_seq_ = 0;
  bool batch_open_ = false;
  std::vector<Transfer> log_;
};

// A Communicator in front of another (usp's ring across groups, a test's recorder): every batch
// of it is a batch of the inner one, opened first and closed last.
class ForwardingComm : public Communicator {
 public:
  explicit ForwardingComm(Communicator& inner) : inner_(inner) {}

 protected:
  void begin_batch() override {
    begin_batch_of(inner_);
    Communicator::begin_batch();
  }
  void end_batch() override {
    Communicator::end_batch();
    end_batch_of(inner_);
  }
  void cancel_batch(const char* why) noexcept override {
    Communicator::cancel_batch(why);
    cancel_batch_of(inner_, why);
  }
  Communicator& inner_;
};

}  // namespace burstlab::dist
