// nccl/nccl_comm.cpp — the Communicator over NCCL with a watchdog (spec §7.4).
#include "nccl_comm.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

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
  std::string ops;  // the first operations posted in it, for messages
  int n_ops = 0;
  ~Group() {
    if (done) cudaEventDestroy(done);
  }
};

class NcclRequest : public dist::Request {
 public:
  NcclRequest(NcclComm* c, std::shared_ptr<NcclComm::Group> g, std::string op)
      : c_(c), g_(std::move(g)), op_(std::move(op)) {}
  // A request dropped before it completed (an error unwinds the schedule) may still have NCCL
  // writing into a buffer about to be freed: stop the communicator.
  ~NcclRequest() override {
    if (g_ && g_->ended && !c_->aborted() && cudaEventQuery(g_->done) == cudaErrorNotReady)
      c_->abort("rank " + std::to_string(c_->rank()) + ": " + op_ + " was abandoned before it completed");
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
  bool done() override { return !g_ || (g_->ended && (c_->aborted() || ready())); }

 private:
  bool ready() {
    const cudaError_t e = cudaEventQuery(g_->done);
    if (e == cudaErrorNotReady) return false;
    BURSTLAB_CUDA_CALL(e);
    return true;
  }
  NcclComm* c_;
  std::shared_ptr<NcclComm::Group> g_;
  std::string op_;
};

NcclComm::NcclComm(const std::vector<char>& id, int rank, int size, int device, NcclOptions o)
    : rank_(rank), size_(size), device_(device), o_(std::move(o)) {
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
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, uid, rank, &cfg);
  if (!posted(r)) {
    const std::string why = ncclGetErrorString(r);
    abort(why);
    fail("rank ", rank, ": ncclCommInitRankConfig (world ", size, ", device ", device, "): ", why);
  }
  settle("joining the NCCL communicator (world " + std::to_string(size) + ", device " + std::to_string(device) + ")");
}

NcclComm::~NcclComm() {
  cudaSetDevice(device_);
  if (comm_ && !aborted_) {
    // Finalize flushes outstanding work; bounded like every wait, else abort.
    ncclResult_t st = ncclCommFinalize(comm_);
    const auto deadline = Clock::now() + std::chrono::duration<double>(o_.timeout_s);
    while (st == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclInternalError;
    }
    if (st == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  if (scratch_) cudaFree(scratch_);
  if (stream_) cudaStreamDestroy(as_stream(stream_));
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

void NcclComm::abort(const std::string& why) noexcept {
  if (aborted_) return;
  aborted_ = true;
  try {
    abort_reason_ = why;
  } catch (...) {  // out of memory for the reason: abort all the same
  }
  // Close this thread's NCCL group first (its depth is per thread; the comm must still exist).
  if (group_started_) ncclGroupEnd();
  group_started_ = false;
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclComm::check_usable(const char* op) const {
  if (aborted_) fail("rank ", rank_, ": ", op, " in ", context(), " on an aborted communicator (", abort_reason_, ")");
}

void NcclComm::fail_op(const std::string& op, const std::string& why) {
  const std::string msg = "rank " + std::to_string(rank_) + ": " + op + " in " + context() + ": " + why;
  if (o_.peers.report) o_.peers.report(msg);  // first, so the other ranks stop waiting at once
  abort(msg);
  throw Error(msg);
}

void NcclComm::poll(const std::function<bool()>& done, const std::string& op, int timeouts) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration<double>(timeouts * o_.timeout_s);
  for (int spin = 0;; ++spin) {
    if (done()) return;
    if (comm_) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
      if (q != ncclSuccess) st = q;
      if (st != ncclSuccess && st != ncclInProgress)
        fail_op(op, std::string("NCCL error: ") + ncclGetErrorString(st) + " (" + ncclGetLastError(comm_) + ")");
    }
    if (o_.peers.failure) {
      const std::string other = o_.peers.failure();
      if (!other.empty()) fail_op(op, "stopped because another rank failed: " + other);
    }
    if (Clock::now() > deadline) {
      char t[64];
      std::snprintf(t, sizeof t, "%.1f", o_.timeout_s);
      fail_op(op, std::string("did not complete within ") + (timeouts == 1 ? "" : std::to_string(timeouts) + " x ") +
                      "the timeout of " + t + " s (--timeout); a peer is late, failed or waits for a different message");
    }
    if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclComm::settle(const std::string& op) {
  poll(
      [&] {
        ncclResult_t st = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
        if (q != ncclSuccess) st = q;
        if (st == ncclInProgress) return false;
        if (st != ncclSuccess)
          fail_op(op, std::string("NCCL error: ") + ncclGetErrorString(st) + " (" + ncclGetLastError(comm_) + ")");
        return true;
      },
      op);
}

void NcclComm::context_changed() {
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
    const ncclResult_t r = send ? ncclSend(buf, size_t(bytes), ncclUint8, peer, comm_, as_stream(stream_))
                                : ncclRecv(buf, size_t(bytes), ncclUint8, peer, comm_, as_stream(stream_));
    if (!posted(r)) fail_op(op, std::string("NCCL error: ") + ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) + ")");
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
  const ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) {
    Communicator::cancel_batch("ncclGroupStart failed");
    fail_op("ncclGroupStart", ncclGetErrorString(r));
  }
  group_started_ = true;
  open_ = std::move(g);
}

void NcclComm::end_batch() {
  Communicator::end_batch();
  std::shared_ptr<Group> g = std::move(open_);
  const std::string op = "the batch of " + (g->ops.empty() ? std::string("no transfers") : g->ops);
  check_usable(op.c_str());
  group_started_ = false;
  const ncclResult_t r = ncclGroupEnd();
  if (!posted(r)) fail_op(op, std::string("ncclGroupEnd: ") + ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) + ")");
  settle(op);
  BURSTLAB_CUDA_CALL(cudaEventRecord(g->done, as_stream(stream_)));
  g->ended = true;
}

void NcclComm::cancel_batch(const char* why) noexcept {
  Communicator::cancel_batch(why);
  open_.reset();
  if (aborted_) return;  // fail_op aborted it and told the other ranks
  // NCCL cannot withdraw the operations of a group, and ending it would start transfers into
  // buffers the error is about to free: stop the communicator, and tell the other ranks, which
  // would otherwise wait for this batch's messages until their timeout.
  std::string msg;
  try {
    msg = "rank " + std::to_string(rank_) + ": a batch in " + context() + " was abandoned: " + why;
    if (o_.peers.report) o_.peers.report(msg);
  } catch (...) {  // out of memory or a failed notice: abort all the same
  }
  abort(msg);
}

void NcclComm::barrier() {
  const std::string op = "barrier (all-reduce of one float)";
  check_usable(op.c_str());
  const ncclResult_t r = ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, as_stream(stream_));
  if (!posted(r)) fail_op(op, std::string("NCCL error: ") + ncclGetErrorString(r));
  settle(op);
  cudaEvent_t ev = nullptr;
  BURSTLAB_CUDA_CALL(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  struct Destroy {
    cudaEvent_t e;
    ~Destroy() { cudaEventDestroy(e); }
  } destroy{ev};
  BURSTLAB_CUDA_CALL(cudaEventRecord(ev, as_stream(stream_)));
  poll(
      [&] {
        const cudaError_t e = cudaEventQuery(ev);
        if (e == cudaErrorNotReady) return false;
        BURSTLAB_CUDA_CALL(e);
        return true;
      },
      op);
}

}  // namespace burstlab::nccl
