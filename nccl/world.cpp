// nccl/world.cpp — ranks as threads of one process, one per GPU (spec §7.4).
#include "world.hpp"

#include <cuda_runtime.h>

#include <map>
#include <thread>

#include "burstlab/error.hpp"

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
// Runs fn(r) on G threads and joins them; the outcome of each ("" = ok) in errors.
void on_threads(int G, const std::function<void(int)>& fn, std::vector<std::string>& errors) {
  errors.assign(G, "");
  std::vector<std::thread> ts;
  for (int r = 0; r < G; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      } catch (...) {
        errors[r] = "rank " + std::to_string(r) + ": unknown exception";
      }
    });
  for (auto& t : ts) t.join();
}
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
  const std::vector<char> id = new_unique_id();
  o.peers.failure = [f = failure_] {
    std::lock_guard<std::mutex> lk(f->mu);
    return f->first;
  };
  o.peers.report = [f = failure_](const std::string& msg) {
    std::lock_guard<std::mutex> lk(f->mu);
    if (f->first.empty()) f->first = msg;
  };
  comms_.resize(G);
  // Every rank joins at once (ncclCommInitRank blocks until all have called it).
  on_threads(G, [&](int r) { comms_[r] = std::make_unique<NcclComm>(id, r, G, r, o); }, errors_);
  throw_first(errors_);
}

ThreadWorld::~ThreadWorld() {
  // Finalize on each rank's own thread and device, all at once (finalize waits for the peers).
  std::vector<std::string> ignored;
  on_threads(size(), [&](int r) { comms_[r].reset(); }, ignored);
}

void ThreadWorld::run(const std::function<void(NcclComm&)>& fn) {
  on_threads(
      size(),
      [&](int r) {
        if (cudaSetDevice(comms_[r]->device()) != cudaSuccess) fail("rank ", r, ": cudaSetDevice(", comms_[r]->device(), ")");
        try {
          fn(*comms_[r]);
        } catch (const std::exception& e) {
          // A failure outside a communicator call (the engine, a check) stops the others too.
          comms_[r]->abort(e.what());
          std::lock_guard<std::mutex> lk(failure_->mu);
          if (failure_->first.empty()) failure_->first = e.what();
          throw;
        }
      },
      errors_);
  throw_first(errors_);
}

}  // namespace burstlab::nccl
