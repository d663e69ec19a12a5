// distributed/sim_comm.cpp — spec §7.4.
#include "sim_comm.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "burstlab/error.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace burstlab::dist {

namespace {

enum class OpState { Posted, Queued, Copying, Done, Cancelled };

struct Op {
  bool is_send = false;
  int src = 0, dst = 0, tag = 0;
  void* buf = nullptr;
  int64_t bytes = 0;
  bool consume = false;
  std::string what, ctx;  // payload name, "forward step 2"
  OpState state = OpState::Posted;
  std::string error;      // set with Done when the transfer failed
  std::weak_ptr<Op> partner;  // weak: two matched ops owning each other would never be freed
  std::string describe() const {
    std::string s = is_send ? "send of " + what + " (tag " + std::to_string(tag) + ") to rank " + std::to_string(dst)
                            : "recv of " + what + " (tag " + std::to_string(tag) + ") from rank " + std::to_string(src);
    return s + " in " + ctx;
  }
};
using OpPtr = std::shared_ptr<Op>;

void copy_bytes(const SimOptions& o, void* dst, const void* src, int64_t bytes) {
  if (o.memory.copy) o.memory.copy(dst, src, bytes);
  else std::memcpy(dst, src, static_cast<size_t>(bytes));
}
// All-ones bytes: NaN in fp64, fp32, bf16 and fp16.
void poison_bytes(const SimOptions& o, void* buf, int64_t bytes) {
  if (o.memory.poison) o.memory.poison(buf, bytes);
  else std::memset(buf, 0xFF, static_cast<size_t>(bytes));
}
using Key = std::tuple<int, int, int>;  // (src, dst, tag)

}  // namespace

struct SimState {
  int G;
  SimOptions opt;
  std::mutex m;
  std::condition_variable done_cv, work_cv;
  std::map<Key, std::deque<OpPtr>> sends, recvs;
  std::deque<std::pair<OpPtr, OpPtr>> work;  // (send, recv)
  bool stop = false;
  bool aborted = false;
  int failed_rank = -1;
  std::string failure;  // "rank 2 failed in forward step 1: ..."
  std::mt19937_64 rng;
  std::vector<std::thread> workers;

  SimState(int G_, const SimOptions& o) : G(G_), opt(o), rng(o.seed) {
    for (int w = 0; w < std::max(1, opt.workers); ++w) workers.emplace_back([this] { worker(); });
  }
  ~SimState() {
    {
      std::lock_guard<std::mutex> lk(m);
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : workers) t.join();
  }

  void abort(int rank, const std::string& msg) {
    {
      std::lock_guard<std::mutex> lk(m);
      if (!aborted) {
        aborted = true;
        failed_rank = rank;
        failure = msg;
      }
    }
    done_cv.notify_all();
  }

  [[noreturn]] void throw_aborted(int rank, const std::string& doing) {
    fail("rank ", rank, ": gave up on ", doing, " because rank ", failed_rank, " failed: ", failure);
  }

  void finish(const OpPtr& a, const std::string& err) {  // lock held
    a->state = OpState::Done;
    a->error = err;
  }

  void worker() {
    std::uniform_int_distribution<int> delay_us(0, 200);
    for (;;) {
      std::pair<OpPtr, OpPtr> job;
      int delay = 0;
      {
        std::unique_lock<std::mutex> lk(m);
        work_cv.wait(lk, [&] { return stop || !work.empty(); });
        if (work.empty()) return;  // stop
        size_t k = 0;
        if (opt.reorder) {
          k = static_cast<size_t>(rng() % work.size());
          delay = delay_us(rng);
        }
        job = work[k];
        work.erase(work.begin() + static_cast<std::ptrdiff_t>(k));
        OpPtr s = job.first, r = job.second;
        if (s->state == OpState::Cancelled || r->state == OpState::Cancelled) {
          OpPtr gone = s->state == OpState::Cancelled ? s : r;
          OpPtr left = gone == s ? r : s;
          if (left->state != OpState::Cancelled)
            finish(left, "rank " + std::to_string(gone == s ? s->src : r->dst) + " abandoned the matching " +
                             gone->describe() + " (it failed)");
          done_cv.notify_all();
          continue;
        }
        s->state = r->state = OpState::Copying;
      }
      if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      if (job.first->bytes > 0) copy_bytes(opt, job.second->buf, job.first->buf, job.first->bytes);
      {
        std::lock_guard<std::mutex> lk(m);
        finish(job.first, "");
        finish(job.second, "");
      }
      done_cv.notify_all();
    }
  }

  // Posts an op; matches it with the oldest opposite op of the same (src, dst, tag).
  void post(const OpPtr& op, int rank) {
    std::unique_lock<std::mutex> lk(m);
    if (aborted) {
      lk.unlock();
      throw_aborted(rank, op->describe());
    }
    const Key key{op->src, op->dst, op->tag};
    auto& mine = op->is_send ? sends[key] : recvs[key];
    auto& theirs = op->is_send ? recvs[key] : sends[key];
    if (theirs.empty()) {
      mine.push_back(op);
      return;
    }
    OpPtr other = theirs.front();
    theirs.pop_front();
    OpPtr s = op->is_send ? op : other, r = op->is_send ? other : op;
    s->partner = r;
    r->partner = s;
    if (s->bytes != r->bytes) {
      const std::string msg = "size mismatch: rank " + std::to_string(s->src) + " sends " +
                              std::to_string(s->bytes) + " bytes of " + s->what + " (tag " + std::to_string(s->tag) +
                              ", " + s->ctx + ") but rank " + std::to_string(r->dst) + " expects " +
                              std::to_string(r->bytes) + " bytes of " + r->what + " (" + r->ctx + ")";
      finish(s, msg);
      finish(r, msg);
      lk.unlock();
      done_cv.notify_all();
      return;
    }
    s->state = r->state = OpState::Queued;
    work.emplace_back(s, r);
    lk.unlock();
    work_cv.notify_one();
  }

  // A matched but not yet copied op is withdrawn (its rank is unwinding): its partner goes back
  // to waiting, so it reports the world's failure (or a timeout), never a half-explained error.
  void unmatch(const OpPtr& op) {  // lock held
    OpPtr other = op->partner.lock();  // before the work queue drops its reference
    for (auto it = work.begin(); it != work.end(); ++it)
      if (it->first == op || it->second == op) {
        work.erase(it);
        break;
      }
    op->state = OpState::Cancelled;
    op->partner.reset();
    if (other) {
      other->partner.reset();
      other->state = OpState::Posted;
      const Key key{other->src, other->dst, other->tag};
      (other->is_send ? sends[key] : recvs[key]).push_front(other);
    }
  }

  void remove_posted(const OpPtr& op) {  // lock held
    const Key key{op->src, op->dst, op->tag};
    auto& q = op->is_send ? sends[key] : recvs[key];
    for (auto it = q.begin(); it != q.end(); ++it)
      if (*it == op) {
        q.erase(it);
        return;
      }
  }
};

namespace {

class SimRequest final : public Request {
 public:
  SimRequest(SimState* w, OpPtr op, int rank) : w_(w), op_(std::move(op)), rank_(rank) {}
  ~SimRequest() override {
    // Never leave a transfer running into a buffer the caller is about to free.
    std::unique_lock<std::mutex> lk(w_->m);
    switch (op_->state) {
      case OpState::Posted: w_->remove_posted(op_); op_->state = OpState::Cancelled; break;
      case OpState::Queued: w_->unmatch(op_); break;
      case OpState::Copying: w_->done_cv.wait(lk, [&] { return op_->state == OpState::Done; }); break;
      default: break;
    }
  }
  bool done() override {
    std::lock_guard<std::mutex> lk(w_->m);
    return op_->state == OpState::Done;
  }
  void wait() override {
    if (waited_) return;
    std::unique_lock<std::mutex> lk(w_->m);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(w_->opt.timeout_s));
    for (;;) {
      if (op_->state == OpState::Done) {
        if (!op_->error.empty()) {
          const std::string e = op_->error;
          lk.unlock();
          fail("rank ", rank_, ": ", op_->describe(), " failed: ", e);
        }
        break;
      }
      if (w_->aborted) {
        lk.unlock();
        w_->throw_aborted(rank_, op_->describe());
      }
      if (w_->done_cv.wait_until(lk, deadline) == std::cv_status::timeout &&
          op_->state != OpState::Done && !w_->aborted) {
        lk.unlock();
        std::string msg = "timed out after " + std::to_string(w_->opt.timeout_s) + " s waiting for " +
                          op_->describe() + " (the peer never posted the matching operation)";
        w_->abort(rank_, "rank " + std::to_string(rank_) + " " + msg);
        fail("rank ", rank_, ": ", msg);
      }
    }
    lk.unlock();
    waited_ = true;
    if (op_->is_send && op_->consume && w_->opt.poison && op_->bytes > 0)
      poison_bytes(w_->opt, op_->buf, op_->bytes);
  }

 private:
  SimState* w_;
  OpPtr op_;
  int rank_;
  bool waited_ = false;
};

class SimComm final : public Communicator {
 public:
  SimComm(SimState* w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_->G; }
  Link link_to(int peer) const override {
    const int g = w_->opt.gpus_per_node;
    if (g <= 0) return Link::Intra;
    return rank_ / g == peer / g ? Link::Intra : Link::Inter;
  }
  RequestPtr isend(const void* buf, int64_t bytes, int dst, int tag, const char* what, bool consume) override {
    check_peer(dst, "isend", what);
    auto op = make(true, rank_, dst, tag, const_cast<void*>(buf), bytes, what);
    op->consume = consume;
    maybe_fail(*op);
    record(rank_, dst, tag, bytes, true, what);
    w_->post(op, rank_);
    return std::make_unique<SimRequest>(w_, op, rank_);
  }
  RequestPtr irecv(void* buf, int64_t bytes, int src, int tag, const char* what) override {
    check_peer(src, "irecv", what);
    auto op = make(false, src, rank_, tag, buf, bytes, what);
    maybe_fail(*op);
    if (w_->opt.poison && bytes > 0) poison_bytes(w_->opt, buf, bytes);
    record(src, rank_, tag, bytes, false, what);
    w_->post(op, rank_);
    return std::make_unique<SimRequest>(w_, op, rank_);
  }

 protected:
  // As NCCL's group end, which settles the group while watching for other ranks' failures: a
  // batch ends with an error once the world has failed.
  void end_batch() override {
    Communicator::end_batch();
    std::unique_lock<std::mutex> lk(w_->m);
    if (w_->aborted) {
      lk.unlock();
      w_->throw_aborted(rank_, "the end of a batch in " + context());
    }
  }
  void context_changed() override {
    const SimOptions& o = w_->opt;
    if (injected_ || rank_ != o.fail_rank || o.fail_step < 0 || phase() != o.fail_phase || step() != o.fail_step) return;
    injected_ = true;
    const std::string where = "injected failure on rank " + std::to_string(rank_) + " in " + context();
    if (!o.fail_hang) fail(where);
    // Stop communicating until the world fails: a wait on this rank times out (what a hang
    // tests). Bounded by twice the timeout, so the other ranks' waits expire first.
    std::unique_lock<std::mutex> lk(w_->m);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(2 * o.timeout_s));
    w_->done_cv.wait_until(lk, deadline, [&] { return w_->aborted; });
    if (w_->aborted) {
      lk.unlock();
      w_->throw_aborted(rank_, "its " + where + " (hanging)");
    }
    lk.unlock();
    fail("rank ", rank_, ": ", where, " (hanging) ended after twice the timeout of ", o.timeout_s,
         " s: no other rank waited for it");
  }

 private:
  void check_peer(int peer, const char* fn, const char* what) const {
    if (peer < 0 || peer >= w_->G)
      fail("rank ", rank_, ": ", fn, " of ", what, " names peer rank ", peer, " outside [0, ", w_->G, ")");
    if (peer == rank_) fail("rank ", rank_, ": ", fn, " of ", what, " to itself (copy locally instead)");
  }
  OpPtr make(bool is_send, int src, int dst, int tag, void* buf, int64_t bytes, const char* what) {
    if (bytes < 0) fail("rank ", rank_, ": message size (", bytes, ") must be >= 0");
    auto op = std::make_shared<Op>();
    op->is_send = is_send;
    op->src = src;
    op->dst = dst;
    op->tag = tag;
    op->buf = buf;
    op->bytes = bytes;
    op->what = what;
    op->ctx = context();
    return op;
  }
  void maybe_fail(const Op& op) {
    const int n = calls_++;
    if (rank_ == w_->opt.fail_rank && w_->opt.fail_step < 0 && n == w_->opt.fail_at_op)
      fail("injected failure on rank ", rank_, " at communicator call #", n, " (", op.describe(), ")");
  }
  SimState* w_;
  int rank_;
  int calls_ = 0;
  bool injected_ = false;
};

}  // namespace

SimWorld::SimWorld(int G, SimOptions options) : G_(G), options_(options) {
  if (G < 1) fail("world size G (", G, ") must be >= 1");
  if (!(options.timeout_s > 0)) fail("timeout_s (", options.timeout_s, ") must be > 0");
}
SimWorld::~SimWorld() = default;

void SimWorld::run(const std::function<void(Communicator&)>& fn) {
  SimState state(G_, options_);
  errors_.assign(G_, "");
  logs_.assign(G_, {});
  std::vector<std::thread> threads;
  for (int r = 0; r < G_; ++r) {
    threads.emplace_back([&, r] {
#if defined(_OPENMP)
      omp_set_num_threads(std::max(1, options_.threads_per_rank));
#endif
      SimComm comm(&state, r);
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors_[r] = e.what();
        state.abort(r, "rank " + std::to_string(r) + " failed in " + comm.context() + ": " + e.what());
      } catch (...) {
        errors_[r] = "unknown exception";
        state.abort(r, "rank " + std::to_string(r) + " failed in " + comm.context() + ": unknown exception");
      }
      logs_[r] = comm.log();
    });
  }
  for (auto& t : threads) t.join();
  if (state.aborted) fail("SimComm world of ", G_, " ranks failed: ", state.failure);
  if (options_.in_order) {
    const std::string problem = in_order_problem(logs_);
    if (!problem.empty()) fail("SimComm world of ", G_, " ranks (in_order check): ", problem);
  }
}

}  // namespace burstlab::dist
