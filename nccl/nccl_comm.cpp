// nccl/nccl_comm.cpp — the Communicator over NCCL with a watchdog (spec §7.4).
#include "nccl_comm.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "burstlab/error.hpp"

namespace burstlab::nccl {

namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) fail(file, ":", line, ": ", call, ": ", cudaGetErrorString(e));
}
#define BURSTLAB_CUDA_CALL(x) cuda_check((x), #x, __FILE__, __LINE__)

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

bool posted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

}  // namespace

Injection parse_injection(const std::string& s) {
  const char* form = "RANK:STEP, RANK:STEP:bwd, RANK:STEP:hang or RANK:STEP:bwd:hang";
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t c = s.find(':', at);
    parts.push_back(s.substr(at, c == std::string::npos ? std::string::npos : c - at));
    if (c == std::string::npos) break;
    at = c + 1;
  }
  if (parts.size() < 2 || parts.size() > 4) fail("inject-failure (", s, ") must be ", form);
  Injection in;
  try {
    size_t used = 0;
    in.rank = std::stoi(parts[0], &used);
    if (used != parts[0].size()) throw std::invalid_argument(parts[0]);
    in.step = std::stoi(parts[1], &used);
    if (used != parts[1].size()) throw std::invalid_argument(parts[1]);
  } catch (const std::exception&) {
    fail("inject-failure (", s, ") must be ", form, ", with whole numbers RANK and STEP");
  }
  bool phase_given = false;
  for (size_t k = 2; k < parts.size(); ++k) {
    const std::string& x = parts[k];
    if ((x == "fwd" || x == "bwd") && !phase_given && !in.hang) {
      in.phase = x == "bwd" ? Phase::Backward : Phase::Forward;
      phase_given = true;
    } else if (x == "hang" && !in.hang) {
      in.hang = true;
    } else {
      fail("inject-failure (", s, "): '", x, "' is not expected there; the form is ", form);
    }
  }
  if (in.rank < 0 || in.step < 0) fail("inject-failure (", s, ") needs RANK >= 0 and STEP >= 0");
  return in;
}

std::string to_string(const Injection& in) {
  return std::to_string(in.rank) + ":" + std::to_string(in.step) + (in.phase == Phase::Backward ? ":bwd" : "") +
         (in.hang ? ":hang" : "");
}

std::vector<char> new_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) fail("ncclGetUniqueId: ", ncclGetErrorString(r));
  return std::vector<char>(id.internal, id.internal + sizeof(id.internal));
}

// One group of sends and receives: complete once `done`, recorded after ncclGroupEnd, completed.
struct NcclComm::Group {
  cudaEvent_t done = nullptr;
  bool ended = false;
  std::atomic<bool> seen{false};  // seen complete (by a wait, done(), or the device)
  std::chrono::steady_clock::time_point posted;
  std::string ops;  // the first operations posted in it, for messages
  std::string context;  // "backward step 0"
  int n_ops = 0;
  ~Group() {
    if (done) cudaEventDestroy(done);
  }
};

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::string seconds(double s) {
  char t[64];
  std::snprintf(t, sizeof t, "%.1f", s);
  return t;
}
// Marks the owner thread as in a wait for the duration of a poll.
struct InWait {
  std::atomic<bool>& in;
  std::atomic<int64_t>& away;
  explicit InWait(std::atomic<bool>& i, std::atomic<int64_t>& a) : in(i), away(a) { in = true; }
  ~InWait() {
    away = now_ns();
    in = false;
  }
};
}  // namespace

class NcclRequest : public dist::Request {
 public:
  NcclRequest(NcclComm* c, std::shared_ptr<NcclComm::Group> g, std::string op)
      : c_(c), g_(std::move(g)), op_(std::move(op)) {}
  // A request dropped before it completed (an error unwinds the schedule) may still have NCCL
  // writing into a buffer about to be freed: stop the communicator.
  ~NcclRequest() override {
    if (g_ && g_->ended && !c_->aborted()) {
      const cudaError_t e = cudaEventQuery(g_->done);
      if (e == cudaSuccess) g_->seen = true;
      else c_->abort("rank " + std::to_string(c_->rank()) + ": " + op_ + " was abandoned before it completed");
    }
  }
  void wait() override {
    if (!g_) return;  // zero bytes
    if (!g_->ended) fail("rank ", c_->rank(), ": wait on ", op_, " inside its batch (wait after batch() returns)");
    c_->check_usable(op_.c_str());
    const auto t0 = Clock::now();
    c_->poll([&] { return ready(); }, op_);
    c_->exposed_.push_back({c_->phase(), c_->step(), std::chrono::duration<double, std::milli>(Clock::now() - t0).count()});
    g_.reset();
  }
  // Complete only when not aborted: an aborted kernel ends early and completes its event.
  bool done() override { return !g_ || (g_->ended && (c_->aborted() || ready())); }

 private:
  using Clock = std::chrono::steady_clock;
  bool ready() {
    if (g_->seen) return true;
    const cudaError_t e = cudaEventQuery(g_->done);
    if (e == cudaErrorNotReady) return false;
    BURSTLAB_CUDA_CALL(e);
    g_->seen = true;
    return true;
  }
  NcclComm* c_;
  std::shared_ptr<NcclComm::Group> g_;
  std::string op_;
};

NcclComm::NcclComm(const std::vector<char>& id, int rank, int size, int device, NcclOptions o)
    : rank_(rank), size_(size), device_(device), o_(std::move(o)) {
  away_since_ns_ = now_ns();
  try {
    if (size < 1) fail("world (", size, ") must be >= 1");
    if (rank < 0 || rank >= size) fail("rank (", rank, ") must be in [0, world = ", size, ")");
    if (id.size() != sizeof(ncclUniqueId)) fail("NCCL unique id of ", id.size(), " bytes, expected ", sizeof(ncclUniqueId));
    if (!o_.node_of.empty() && static_cast<int>(o_.node_of.size()) != size)
      fail("node_of has ", o_.node_of.size(), " entries for world ", size);
    if (!(o_.timeout_s > 0)) fail("timeout (", o_.timeout_s, ") must be > 0 seconds");
    BURSTLAB_CUDA_CALL(cudaSetDevice(device));
    cudaStream_t s = nullptr;
    BURSTLAB_CUDA_CALL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_ = s;
    BURSTLAB_CUDA_CALL(cudaMalloc(&scratch_, sizeof(float)));
    ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // every call returns at once; poll() bounds each wait (the watchdog)
    ncclResult_t r;
    {
      std::lock_guard<std::recursive_timed_mutex> lk(mu_);
      r = ncclCommInitRankConfig(&comm_, size, uid, rank, &cfg);
    }
    if (!posted(r)) {
      const std::string why = std::string(ncclGetErrorString(r)) + (comm_ ? " (" + last_error() + ")" : "");
      fail("rank ", rank, ": ncclCommInitRankConfig (world ", size, ", device ", device, "): ", why);
    }
    settle("joining the NCCL communicator (world " + std::to_string(size) + ", device " + std::to_string(device) + ")");
  } catch (const std::exception& e) {
    // Tell the others first (they wait for this rank to join), then undo what was made.
    std::string msg = e.what();
    if (msg.rfind("rank ", 0) != 0) msg = "rank " + std::to_string(rank) + ": " + msg;
    set_reason(msg);
    try {
      if (o_.peers.report) o_.peers.report(msg);
    } catch (...) {  // the notice failed: the others see this rank's failure at their timeout
    }
    abort(msg);
    release();
    throw;
  }
}

NcclComm::~NcclComm() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "burstlab: %s\n", e.what());
  }
  release();
}

void NcclComm::release() noexcept {
  cudaSetDevice(device_);
  if (scratch_) cudaFree(scratch_);
  scratch_ = nullptr;
  if (stream_) cudaStreamDestroy(as_stream(stream_));
  stream_ = nullptr;
}

void NcclComm::close() {
  if (closed_) return;
  closed_ = true;
  if (aborted_) return;  // ncclCommAbort freed it
  BURSTLAB_CUDA_CALL(cudaSetDevice(device_));
  const std::string op = "closing the communicator (ncclCommFinalize)";
  ncclResult_t r;
  {
    std::lock_guard<std::recursive_timed_mutex> lk(mu_);
    if (!comm_) return;
    r = ncclCommFinalize(comm_);
  }
  if (!posted(r)) fail_op(op, std::string("ncclCommFinalize: ") + ncclGetErrorString(r) + " (" + last_error() + ")");
  settle(op);  // finalize completes when every rank's has: bounded, a peer's failure ends it
  std::lock_guard<std::recursive_timed_mutex> lk(mu_);
  if (!comm_) fail("rank ", rank_, ": ", op, ": the communicator was aborted (", abort_reason(), ")");
  r = ncclCommDestroy(comm_);
  comm_ = nullptr;
  if (r != ncclSuccess) {
    aborted_ = true;
    fail("rank ", rank_, ": ncclCommDestroy: ", ncclGetErrorString(r));
  }
}

void NcclComm::clear_exposed(Phase phase) {
  std::vector<Exposed> keep;
  for (const Exposed& e : exposed_)
    if (e.phase != phase) keep.push_back(e);
  exposed_ = std::move(keep);
}

Link NcclComm::link_to(int peer) const {
  if (o_.node_of.empty() || peer < 0 || peer >= size_) return Link::Intra;
  return o_.node_of[peer] == o_.node_of[rank_] ? Link::Intra : Link::Inter;
}

std::string NcclComm::abort_reason() const {
  std::lock_guard<std::mutex> lk(state_mu_);
  return abort_reason_;
}

void NcclComm::abort(const std::string& why) noexcept {
  set_reason(why);
  aborted_ = true;
  // NCCL calls on this communicator never block, so the owner releases mu_ soon: a batch being
  // posted ends, a poll step returns. Bounded all the same (a thread stuck inside one would keep
  // the communicator; ThreadWorld's watchdog then reports where).
  std::unique_lock<std::recursive_timed_mutex> lk(mu_, std::defer_lock);
  if (!lk.try_lock_for(std::chrono::duration<double>(std::max(5.0, o_.timeout_s)))) {
    std::fprintf(stderr, "burstlab: rank %d: could not abort its NCCL communicator (another call holds it)\n", rank_);
    return;
  }
  // Close the owner's open group first (its depth is per thread; the comm must still exist).
  // Only the owner can hold mu_ with a group open, so only the owner gets here with one.
  if (group_started_) ncclGroupEnd();
  group_started_ = false;
  if (!comm_) return;
  const ncclResult_t r = ncclCommAbort(comm_);
  comm_ = nullptr;
  if (r != ncclSuccess) {
    std::fprintf(stderr, "burstlab: rank %d: ncclCommAbort: %s\n", rank_, ncclGetErrorString(r));
    try {
      std::lock_guard<std::mutex> sl(state_mu_);
      abort_reason_ += std::string("; ncclCommAbort: ") + ncclGetErrorString(r);
    } catch (...) {
    }
  }
}

void NcclComm::check_usable(const char* op) const {
  if (aborted_) fail("rank ", rank_, ": ", op, " in ", context(), " on an aborted communicator (", abort_reason(), ")");
}

ncclResult_t NcclComm::async_state() {
  std::lock_guard<std::recursive_timed_mutex> lk(mu_);
  if (!comm_) return ncclInvalidArgument;
  ncclResult_t st = ncclSuccess;
  const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
  return q != ncclSuccess ? q : st;
}

std::string NcclComm::last_error() {
  std::lock_guard<std::recursive_timed_mutex> lk(mu_);
  const char* e = comm_ ? ncclGetLastError(comm_) : nullptr;
  return e ? e : "";
}

void NcclComm::set_reason(const std::string& why) noexcept {
  try {
    std::lock_guard<std::mutex> lk(state_mu_);
    if (abort_reason_.empty()) abort_reason_ = why;
  } catch (...) {  // out of memory for the reason: abort all the same
  }
}

void NcclComm::fail_op(const std::string& op, const std::string& why) {
  const std::string msg = "rank " + std::to_string(rank_) + ": " + op + " in " + context() + ": " + why;
  set_reason(msg);  // this rank's own reason, before a watchdog aborts with the shared one
  if (o_.peers.report) o_.peers.report(msg);  // then the notice, so the other ranks stop at once
  abort(msg);
  throw Error(msg);
}

void NcclComm::poll(const std::function<bool()>& done, const std::string& op, int timeouts) {
  const InWait in(in_wait_, away_since_ns_);
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration<double>(timeouts * o_.timeout_s);
  for (int spin = 0;; ++spin) {
    // Failures first: once aborted (here or by another thread), a transfer's event completes
    // although its data never arrived.
    if (aborted_) fail_op(op, "stopped: the communicator was aborted (" + abort_reason() + ")");
    const ncclResult_t st = async_state();
    if (st != ncclSuccess && st != ncclInProgress)
      fail_op(op, std::string("NCCL error: ") + ncclGetErrorString(st) + " (" + last_error() + ")");
    if (o_.peers.failure) {
      const std::string other = o_.peers.failure();
      if (!other.empty()) fail_op(op, "stopped because another rank failed: " + other);
    }
    if (done()) return;
    if (Clock::now() > deadline)
      fail_op(op, std::string("did not complete within ") + (timeouts == 1 ? "" : std::to_string(timeouts) + " x ") +
                      "the timeout of " + seconds(o_.timeout_s) +
                      " s (--timeout); a peer is late, failed or waits for a different message");
    if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclComm::settle(const std::string& op) {
  poll([&] { return async_state() != ncclInProgress; }, op);  // an error state fails in poll itself
}

bool NcclComm::stall(Stall& out) const {
  if (aborted_ || in_wait_) return false;
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lk(state_mu_);
    for (const auto& p : pending_)
      if (!p->seen) {
        g = p;
        break;
      }
  }
  if (!g) return false;
  const auto away = Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(away_since_ns_.load())));
  const auto since = std::max(g->posted, away);
  if (Clock::now() - since < std::chrono::duration<double>(o_.timeout_s) || in_wait_) return false;
  out.done = g->done;
  out.holder = g;
  out.message = "rank " + std::to_string(rank_) + ": the batch of " + g->ops + " posted in " + g->context +
                " did not complete within the timeout of " + seconds(o_.timeout_s) + " s (--timeout) while rank " +
                std::to_string(rank_) + "'s thread was away from the communicator (" + where() +
                "); a peer is late, failed or waits for a different message";
  return true;
}

void NcclComm::mark_complete(const std::shared_ptr<void>& holder) const {
  if (holder) static_cast<Group*>(holder.get())->seen = true;
}

std::string NcclComm::where() const {
  // Read from another thread: the context as last set (atomics), not Communicator::context().
  const std::string ctx = dist::to_string(Phase(ctx_phase_.load())) + " step " + std::to_string(ctx_step_.load());
  if (aborted_) return "its communicator aborted, in " + ctx;
  if (in_wait_) return "waiting in " + ctx;
  return "busy outside the communicator in " + ctx +
         ": computing, or blocked in a CUDA call that waits for its GPU, e.g. a first kernel launch, cudaFree or a "
         "synchronize, while NCCL's kernel waits for a peer";
}

void NcclComm::context_changed() {
  ctx_phase_ = int(phase());
  ctx_step_ = step();
  const Injection& in = o_.inject;
  if (injected_ || in.rank != rank_ || phase() != in.phase || step() != in.step) return;
  injected_ = true;
  const std::string what = "fault injection (--inject-failure " + to_string(in) + ")";
  if (!in.hang) fail_op(what, "injected failure");
  // Stop communicating: the others' watchdogs give up, report, and this rank follows them. Its
  // own bound is twice the timeout, so theirs, which a hang tests, expire first.
  poll([] { return false; }, what + ", hanging", 2);
}

RequestPtr NcclComm::post(bool send, void* buf, int64_t bytes, int peer, int tag, const char* what) {
  const std::string op = std::string(send ? "send of " : "receive of ") + what + " " + (send ? "to" : "from") +
                         " rank " + std::to_string(peer) + " (" + std::to_string(bytes) + " bytes)";
  check_usable(op.c_str());
  if (peer < 0 || peer >= size_) fail("rank ", rank_, ": ", op, ": peer outside the world of ", size_);
  if (bytes < 0) fail("rank ", rank_, ": ", op, ": negative size");
  record(send ? rank_ : peer, send ? peer : rank_, tag, bytes, send, what);
  if (bytes == 0) return std::make_unique<NcclRequest>(this, nullptr, op);  // NCCL moves nothing either
  std::shared_ptr<Group> g;
  auto enqueue = [&] {
    g = open_;
    if (g->n_ops++ < 2) g->ops += (g->ops.empty() ? "" : ", ") + op;
    else if (g->n_ops == 3) g->ops += ", ...";
    std::lock_guard<std::recursive_timed_mutex> lk(mu_);  // held since begin_batch already
    if (!comm_) fail("rank ", rank_, ": ", op, " in ", context(), " on an aborted communicator (", abort_reason(), ")");
    const ncclResult_t r = send ? ncclSend(buf, size_t(bytes), ncclUint8, peer, comm_, as_stream(stream_))
                                : ncclRecv(buf, size_t(bytes), ncclUint8, peer, comm_, as_stream(stream_));
    if (!posted(r)) fail_op(op, std::string("NCCL error: ") + ncclGetErrorString(r) + " (" + last_error() + ")");
  };
  if (open_) enqueue();
  else batch(enqueue);  // outside a batch: a group of one
  return std::make_unique<NcclRequest>(this, std::move(g), op);
}

RequestPtr NcclComm::isend(const void* buf, int64_t bytes, int dst, int tag, const char* what, bool consume) {
  (void)consume;  // SimComm's poisoning only
  return post(true, const_cast<void*>(buf), bytes, dst, tag, what);
}

RequestPtr NcclComm::irecv(void* buf, int64_t bytes, int src, int tag, const char* what) {
  return post(false, buf, bytes, src, tag, what);
}

void NcclComm::begin_batch() {
  check_usable("begin_batch");
  auto g = std::make_shared<Group>();
  BURSTLAB_CUDA_CALL(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
  Communicator::begin_batch();
  // Held until the group ends (end_batch or cancel_batch): an abort from another thread waits
  // for it rather than freeing the communicator under the group's operations.
  mu_.lock();
  batch_locked_ = true;
  if (!comm_) {
    batch_locked_ = false;
    mu_.unlock();
    Communicator::cancel_batch("the communicator was aborted");
    fail("rank ", rank_, ": begin_batch in ", context(), " on an aborted communicator (", abort_reason(), ")");
  }
  const ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) {
    batch_locked_ = false;
    mu_.unlock();
    Communicator::cancel_batch("ncclGroupStart failed");
    fail_op("ncclGroupStart", ncclGetErrorString(r));
  }
  group_started_ = true;
  open_ = std::move(g);
}

void NcclComm::end_batch() {
  Communicator::end_batch();
  std::shared_ptr<Group> g = std::move(open_);
  const std::string op = g->ops.empty() ? std::string("an empty batch (no transfers)") : "the batch of " + g->ops;
  ncclResult_t r = ncclSuccess;
  bool ended_here = false;
  if (batch_locked_) {
    batch_locked_ = false;
    if (group_started_) {
      group_started_ = false;
      r = ncclGroupEnd();
      ended_here = true;
    }
    mu_.unlock();
  }
  check_usable(op.c_str());
  if (!ended_here) fail("rank ", rank_, ": ", op, " in ", context(), ": its group was not open");
  if (!posted(r)) fail_op(op, std::string("ncclGroupEnd: ") + ncclGetErrorString(r) + " (" + last_error() + ")");
  settle(op);
  BURSTLAB_CUDA_CALL(cudaEventRecord(g->done, as_stream(stream_)));
  g->context = context();
  g->posted = Clock::now();
  g->ended = true;
  track(g);
}

void NcclComm::track(const std::shared_ptr<Group>& g) {
  std::lock_guard<std::mutex> lk(state_mu_);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return p->seen.load(); }),
                 pending_.end());
  pending_.push_back(g);
  away_since_ns_ = now_ns();
}

void NcclComm::cancel_batch(const char* why) noexcept {
  Communicator::cancel_batch(why);
  open_.reset();
  // NCCL cannot withdraw the operations of a group, and ending it would start transfers into
  // buffers the error is about to free: stop the communicator (also when another thread marked
  // it aborted and waits for this batch), and tell the other ranks, which would otherwise wait
  // for this batch's messages until their timeout.
  std::string msg;
  try {
    msg = "rank " + std::to_string(rank_) + ": a batch in " + context() + " was abandoned: " + why;
    const bool first = !aborted_;
    set_reason(msg);
    if (first && o_.peers.report) o_.peers.report(msg);
  } catch (...) {  // out of memory or a failed notice: abort all the same
  }
  abort(msg);  // ends the open group first, under mu_ (held by this thread: recursive)
  if (batch_locked_) {
    batch_locked_ = false;
    if (group_started_) ncclGroupEnd();
    group_started_ = false;
    mu_.unlock();
  }
}

void NcclComm::barrier() {
  const std::string op = "barrier (all-reduce of one float)";
  check_usable(op.c_str());
  ncclResult_t r;
  {
    std::lock_guard<std::recursive_timed_mutex> lk(mu_);
    if (!comm_) fail("rank ", rank_, ": ", op, " in ", context(), " on an aborted communicator (", abort_reason(), ")");
    r = ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, as_stream(stream_));
  }
  if (!posted(r)) fail_op(op, std::string("NCCL error: ") + ncclGetErrorString(r));
  settle(op);
  auto g = std::make_shared<Group>();
  BURSTLAB_CUDA_CALL(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
  BURSTLAB_CUDA_CALL(cudaEventRecord(g->done, as_stream(stream_)));
  g->ops = op;
  g->context = context();
  g->posted = Clock::now();
  g->ended = true;
  track(g);
  poll(
      [&] {
        const cudaError_t e = cudaEventQuery(g->done);
        if (e == cudaErrorNotReady) return false;
        BURSTLAB_CUDA_CALL(e);
        g->seen = true;
        return true;
      },
      op);
}

}  // namespace burstlab::nccl
