// nccl/thread_world.cpp — ranks as threads of one process, one per GPU (spec §7.4).
#include "thread_world.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <thread>

#include "burstlab/error.hpp"
#ifdef BURSTLAB_HAVE_MPI
#include "mpi_world.hpp"
#endif

namespace burstlab::nccl {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::vector<int> nodes_of(int world, int gpus_per_node, const std::vector<std::string>& hosts) {
  std::vector<int> node(world, 0);
  if (gpus_per_node > 0) {
    if (world % gpus_per_node != 0)
      fail("gpus-per-node (", gpus_per_node, ") must divide world (", world, ")");
    for (int r = 0; r < world; ++r) node[r] = r / gpus_per_node;
    return node;
  }
  if (hosts.empty()) return node;
  if (static_cast<int>(hosts.size()) != world) fail(hosts.size(), " host names for world ", world);
  std::map<std::string, int> index;
  for (int r = 0; r < world; ++r) node[r] = index.emplace(hosts[r], static_cast<int>(index.size())).first->second;
  return node;
}

namespace {
void throw_first(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) throw Error(errors[r]);
}
}  // namespace

ThreadWorld::ThreadWorld(int G, NcclOptions o) {
  if (G < 1) fail("world (", G, ") must be >= 1");
  const int n = device_count();
  if (G > n)
    fail("world (", G, ") needs ", G, " GPUs in this process (NCCL runs one rank per GPU); it sees ", n,
         ": use --world ", n > 0 ? n : 1, ", or one process per GPU under mpirun (mpirun -np G burstlab run "
         "--transport nccl ...) on machines with more GPUs");
  if (!(o.timeout_s > 0)) fail("timeout (", o.timeout_s, ") must be > 0 seconds");
  // The watchdog's calls hold comms_mu_ while they use a communicator: a rank thread that frees
  // its own (~ThreadWorld) takes it out under the same lock first.
  watch_.stop_all = [this](const std::string& why) {
    const std::string reason = "stopped after the first failure: " + why;
    std::lock_guard<std::mutex> lk(comms_mu_);
    for (auto& c : comms_)
      if (c) c->abort(reason);
  };
  watch_.stalled = [this] { return stalled(); };
  watch_.where = [this](int r) -> std::string {
    std::lock_guard<std::mutex> lk(comms_mu_);
    return comms_[size_t(r)] ? comms_[size_t(r)]->where() : "joining the communicator";
  };
  watch_.grace_s = std::max(5.0, o.timeout_s);
  const std::vector<char> id = new_unique_id();
  o.peers.failure = [this] { return board_.first(); };
  o.peers.report = [this](const std::string& msg) { board_.report(msg); };
  comms_.resize(G);
  // Every rank joins at once (the communicator is complete when all have); a rank that fails to
  // join reports it, and the others' joins stop at once.
  errors_ = watched([&](int r) {
    auto c = std::make_unique<NcclComm>(id, r, G, r, o);
    std::lock_guard<std::mutex> lk(comms_mu_);
    comms_[r] = std::move(c);
  });
  bool failed = false;
  for (const std::string& e : errors_) failed = failed || !e.empty();
  if (!failed) return;
  // The members are destroyed without ~ThreadWorld: abort (not finalize) what joined.
  for (auto& c : comms_)
    if (c) c->abort(board_.first());
  closed_ = true;
  std::string first;
  for (const std::string& e : errors_)
    if (first.empty()) first = e;
  fail(first);
}

ThreadWorld::~ThreadWorld() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "burstlab: %s\n", e.what());
  }
  // Free each rank's stream and scratch on its own thread and device.
  std::vector<std::string> ignored = watched([&](int r) {
    std::unique_ptr<NcclComm> c;
    {
      std::lock_guard<std::mutex> lk(comms_mu_);
      c.swap(comms_[r]);
    }
  });
  (void)ignored;
}

std::string stalled(NcclComm& c) {
  NcclComm::Stall st;
  if (!c.stall(st)) return "";
  // The batch may be complete on the device while the thread computes: ask the device, on a
  // helper thread, for at most a second (the query needs the GPU's context, which a thread
  // blocked behind NCCL's kernel may hold; then the answer is late, and the rank is stalled).
  struct Answer {
    std::mutex mu;
    std::condition_variable cv;
    bool given = false;
    cudaError_t e = cudaErrorNotReady;
  };
  auto a = std::make_shared<Answer>();
  std::thread([a, holder = st.holder, ev = st.done, dev = c.device()] {
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
    std::lock_guard<std::mutex> lk(a->mu);
    a->given = true;
    a->e = e;
    a->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lk(a->mu);
  a->cv.wait_for(lk, std::chrono::seconds(1), [&] { return a->given; });
  if (a->given && a->e == cudaSuccess) {
    c.mark_complete(st.holder);
    return "";
  }
  return st.message;
}

std::vector<double> exposed_of(const NcclComm& c, Phase phase) {
  std::vector<double> ms;
  for (const auto& e : c.exposed())
    if (e.phase == phase && e.step >= 0) {
      if (ms.size() <= size_t(e.step)) ms.resize(size_t(e.step) + 1, 0.0);
      ms[size_t(e.step)] += e.ms;
    }
  return ms;
}

void ThreadWorld::run(const std::function<void(dist::Communicator&)>& fn) {
  // The threads started and watched here, not through run_ranks: a rank's backtrace goes from its
  // thread straight to fn, and the calling thread's from here to the watchdog.
  const auto body = [&](int r) {
    NcclComm& c = *comms_[r];
    if (cudaSetDevice(c.device()) != cudaSuccess) fail("rank ", r, ": cudaSetDevice(", c.device(), ")");
    try {
      fn(c);
    } catch (const std::exception& e) {
      // A failure outside a communicator call (the engine, a check) stops the others too (the
      // watchdog aborts every communicator once the failure is reported).
      c.abort(e.what());
      throw;
    }
  };
  RankThreads t = start_ranks(size(), body, board_);
  errors_ = watch_ranks(t, board_, watch_);
  throw_first(errors_);
}

void ThreadWorld::run(const std::function<void(NcclComm&)>& fn) {
  // Every rank's communicator here is an NcclComm.
  const std::function<void(dist::Communicator&)> each = [&](dist::Communicator& c) { fn(static_cast<NcclComm&>(c)); };
  run(each);
}

std::vector<std::vector<double>> ThreadWorld::exposed_ms(Phase phase) {
  std::vector<std::vector<double>> ms;
  for (auto& c : comms_) ms.push_back(exposed_of(*c, phase));
  return ms;
}

std::string ThreadWorld::describe() const {
  return "threads, " + std::to_string(size()) + " GPU" + (size() > 1 ? "s" : "");
}

Launch launch() {
  Launch l;
#ifdef BURSTLAB_HAVE_MPI
  l.by_mpi = launched_by_mpi();
  l.rank = mpi_env_rank();
  l.size = mpi_env_size();
#endif
  return l;
}

std::shared_ptr<dist::World> nccl_world(int G, int gpus_per_node, double timeout_s, const std::string& inject) {
  NcclOptions o;
  if (!(timeout_s > 0)) fail("timeout (", timeout_s, ") must be > 0 seconds");
  o.timeout_s = timeout_s;
  if (!inject.empty()) o.inject = parse_injection(inject);
  if (o.inject.rank >= G) fail("inject-failure (", inject, ") names rank ", o.inject.rank, " of a world of ", G);
  if (launch().by_mpi) {
#ifdef BURSTLAB_HAVE_MPI
    std::shared_ptr<MpiWorld> w = process_world(o, gpus_per_node);
    if (G != w->size())
      fail("world (", G, ") must equal the number of processes mpirun started (", w->size(), ")");
    return w;
#else
    fail("transport (nccl) under mpirun needs a build with MPI (it was not found at configure time)");
#endif
  }
  o.node_of = nodes_of(G, gpus_per_node, {});
  return std::make_shared<ThreadWorld>(G, o);
}

void shutdown() {
#ifdef BURSTLAB_HAVE_MPI
  mpi_finish();
#endif
}

std::string ThreadWorld::stalled() {
  std::lock_guard<std::mutex> lk(comms_mu_);
  for (auto& c : comms_)
    if (c)
      if (std::string why = nccl::stalled(*c); !why.empty()) return why;
  return "";
}

void ThreadWorld::close() {
  if (closed_) return;
  closed_ = true;
  // Each rank finalizes on its own thread and device, all at once (finalize completes when every
  // rank's has).
  errors_ = watched([&](int r) {
    if (cudaSetDevice(comms_[r]->device()) != cudaSuccess) fail("rank ", r, ": cudaSetDevice(", comms_[r]->device(), ")");
    try {
      comms_[r]->close();
    } catch (const std::exception& e) {
      comms_[r]->abort(e.what());
      throw;
    }
  });
  throw_first(errors_);
}

}  // namespace burstlab::nccl
