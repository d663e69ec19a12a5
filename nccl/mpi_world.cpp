// nccl/mpi_world.cpp — mpirun bootstrap for NcclComm, and the notices on the side (spec §7.4).
#include "mpi_world.hpp"

#include <cuda_runtime.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <memory>
#include <sstream>
#include <thread>

#include "burstlab/env.hpp"
#include "burstlab/error.hpp"
#include "thread_world.hpp"

namespace burstlab::nccl {

namespace {
using Clock = std::chrono::steady_clock;
constexpr int kFailureTag = 7331;  // a failure notice: the message
constexpr int kLeaveTag = 7332;    // a leave notice: the collectives the rank had completed
std::atomic<bool> g_failed{false};  // this process failed: MPI_Abort at mpi_finish()
std::atomic<bool> g_said{false};    // this process printed its failure (ranks other than 0)

void mpi_check(int rc, const std::string& call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(call, " failed (MPI error ", rc, ": ", text, ")");
}

// Who this process is, for the node-local rank and for watching a peer's process.
struct HostInfo {
  char name[MPI_MAX_PROCESSOR_NAME];
  char boot[64];   // /proc/sys/kernel/random/boot_id: the same machine
  char pidns[64];  // /proc/self/ns/pid: pids mean the same processes
  int64_t pid;
  int64_t start;  // the process's start time (/proc/PID/stat field 22): tells a reused pid apart
};

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}
// Field 22 of /proc/PID/stat (start time), -1 when the process is gone or a zombie.
int64_t start_time_of(int64_t pid) {
  const std::string stat = first_line("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(stat.substr(close + 1));
  std::string state;
  in >> state;
  if (state == "Z" || state == "X" || state == "x") return -1;
  std::string field;
  for (int k = 4; k <= 22 && in >> field; ++k)
    if (k == 22) return std::atoll(field.c_str());
  return -1;
}
void copy_to(char* dst, size_t n, const std::string& s) {
  std::memset(dst, 0, n);
  std::memcpy(dst, s.data(), std::min(n - 1, s.size()));
}
HostInfo this_host() {
  HostInfo h{};
  int len = 0;
  MPI_Get_processor_name(h.name, &len);
  copy_to(h.boot, sizeof h.boot, first_line("/proc/sys/kernel/random/boot_id"));
  char ns[64] = {0};
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  copy_to(h.pidns, sizeof h.pidns, n > 0 ? std::string(ns, size_t(n)) : "");
  h.pid = getpid();
  h.start = start_time_of(h.pid);
  return h;
}
}  // namespace

bool launched_by_mpi() {
  return env::text("OMPI_COMM_WORLD_SIZE") || env::text("PMIX_RANK") || env::text("PMI_SIZE");
}

int mpi_env_rank() {
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (env::text(n)) return static_cast<int>(env::integer(n));
  return 0;
}

int mpi_env_size() {
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (env::text(n)) return static_cast<int>(env::integer(n));
  return 1;
}

namespace {
std::shared_ptr<MpiWorld>& the_process_world() {  // one per process, until mpi_finish()
  static std::shared_ptr<MpiWorld> w;
  return w;
}
}  // namespace

std::shared_ptr<MpiWorld> process_world(const NcclOptions& o, int gpus_per_node) {
  std::shared_ptr<MpiWorld>& w = the_process_world();
  if (!w) w = std::make_shared<MpiWorld>(o, gpus_per_node);
  return w;
}

void mpi_finish() {
  the_process_world().reset();  // closes the communicator and sends the leave notice
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return;
  // A failed process may leave peers that never reach MPI_Finalize: abort instead of waiting.
  // The peers told of this failure get a second to print theirs before MPI_Abort ends them.
  if (g_failed) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
}

// The notices on the side and the bounded collectives. MPI calls come from the main thread only
// (MPI_THREAD_FUNNELED): the MpiDriver and NcclComm's polls run there.
struct MpiWorld::State {
  int rank = 0, size = 1;
  double timeout_s = 120;
  std::string failure;                // the first failure seen (a notice, a peer gone, ...)
  bool notified = false;              // this process's failure notice went out
  std::list<std::string> outgoing;    // notices being sent (kept alive until sent)
  std::vector<MPI_Request> sends;
  int64_t done = 0;                   // collectives this process completed
  int64_t waiting = 0;                // the collective being waited for (done + 1), 0 = none
  std::string waiting_for;            // its name
  std::vector<int64_t> left;          // [rank] -> its `done` when it left, -1 = still here
  std::vector<int64_t> leave_buf;     // receive buffer of a leave notice
  std::vector<HostInfo> hosts;
  std::vector<char> watch;            // [rank] -> its process can be checked by pid
  Clock::time_point next_watch{};
  std::vector<std::shared_ptr<void>> abandoned;  // buffers of collectives left pending by a failure

  // The first reason to stop waiting for the other ranks, or "".
  std::string check() {
    if (!failure.empty()) return failure;
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS || !flag) break;
      int count = 0;
      MPI_Get_count(&st, MPI_CHAR, &count);
      std::string msg(size_t(std::max(count, 0)), '\0');
      MPI_Recv(msg.data(), count, MPI_CHAR, st.MPI_SOURCE, kFailureTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      failure = msg;
      return failure;
    }
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kLeaveTag, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS || !flag) break;
      int64_t n = 0;
      MPI_Recv(&n, 1, MPI_INT64_T, st.MPI_SOURCE, kLeaveTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      left[size_t(st.MPI_SOURCE)] = n;
    }
    if (waiting > 0)
      for (int r = 0; r < size; ++r)
        if (left[size_t(r)] >= 0 && left[size_t(r)] < waiting) {
          failure = "rank " + std::to_string(r) + " ended after " + std::to_string(left[size_t(r)]) +
                    " collectives while rank " + std::to_string(rank) + " waits for it in collective " +
                    std::to_string(waiting) + " (" + waiting_for + "): it failed or skipped it";
          return failure;
        }
    const auto now = Clock::now();
    if (now >= next_watch) {
      next_watch = now + std::chrono::milliseconds(100);
      for (int r = 0; r < size; ++r) {
        if (!watch[size_t(r)] || left[size_t(r)] >= 0) continue;
        if (start_time_of(hosts[size_t(r)].pid) == hosts[size_t(r)].start) continue;
        failure = "rank " + std::to_string(r) + " (pid " + std::to_string(hosts[size_t(r)].pid) + " on " +
                  hosts[size_t(r)].name + ") ended without a failure notice: killed by a signal, or it crashed";
        return failure;
      }
    }
    return "";
  }

  void send_to_all(int tag, const void* data, int count, MPI_Datatype type) {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      sends.emplace_back();
      MPI_Isend(data, count, type, r, tag, MPI_COMM_WORLD, &sends.back());
    }
  }
  void notify(const std::string& msg) {
    if (notified) return;
    notified = true;
    outgoing.push_back(msg);  // a list: the string an Isend reads never moves
    const std::string& m = outgoing.back();
    send_to_all(kFailureTag, m.data(), static_cast<int>(m.size()), MPI_CHAR);
  }
  // Gives the notices in flight up to `s` seconds to leave; true when they did.
  bool flush(double s) {
    const auto end = Clock::now() + std::chrono::duration<double>(s);
    while (!sends.empty()) {
      int all = 0;
      MPI_Testall(static_cast<int>(sends.size()), sends.data(), &all, MPI_STATUSES_IGNORE);
      if (all) sends.clear();
      else if (Clock::now() > end) return false;
      else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  // Polls a non-blocking collective until it completes, a peer fails, or the timeout passes
  // (then throws; `keep` holds its buffers, which MPI may still write, until the process ends).
  void wait(MPI_Request& req, const std::string& what, std::vector<std::shared_ptr<void>> keep) {
    waiting = done + 1;
    waiting_for = what;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (int spin = 0;; ++spin) {
      const std::string other = check();
      if (!other.empty() || Clock::now() > deadline) {
        for (auto& k : keep) abandoned.push_back(std::move(k));
        waiting = 0;
        char t[64];
        std::snprintf(t, sizeof t, "%.1f", timeout_s);
        burstlab::fail("rank ", rank, ": ", what, ": ",
             other.empty() ? "did not complete within the timeout of " + std::string(t) +
                                 " s (--timeout); a peer is late, failed or skipped it"
                           : "stopped because another rank failed: " + other);
      }
      int flag = 0;
      mpi_check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test (" + what + ")");
      if (flag) break;
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    waiting = 0;
    ++done;
  }
};

MpiWorld::MpiWorld(NcclOptions o, int gpus_per_node) : s_(std::make_unique<State>()) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  // Errors come back as codes (checked, named), not as MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &s_->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s_->size);
  errors_.assign(size_t(s_->size), "");
  State* s = s_.get();
  s->timeout_s = o.timeout_s > 0 ? o.timeout_s : 120.0;
  s->left.assign(size_t(s->size), -1);
  s->watch.assign(size_t(s->size), 0);
  try {
    if (!(o.timeout_s > 0)) burstlab::fail("timeout (", o.timeout_s, ") must be > 0 seconds");
    auto hosts = std::make_shared<std::vector<HostInfo>>(size_t(s->size));
    auto mine = std::make_shared<HostInfo>(this_host());
    MPI_Request rq;
    mpi_check(MPI_Iallgather(mine.get(), sizeof(HostInfo), MPI_BYTE, hosts->data(), sizeof(HostInfo), MPI_BYTE,
                             MPI_COMM_WORLD, &rq),
              "MPI_Iallgather (host names)");
    s->wait(rq, "MPI_Iallgather (host names)", {hosts, mine});
    s->hosts = *hosts;
    std::vector<std::string> names;
    int local_rank = 0;
    for (int r = 0; r < s->size; ++r) {
      const HostInfo& h = s->hosts[size_t(r)];
      names.emplace_back(h.name);
      const bool same_machine = std::strcmp(h.name, mine->name) == 0 && std::strcmp(h.boot, mine->boot) == 0;
      if (same_machine && r < s->rank) ++local_rank;  // the node-local rank, in rank order
      s->watch[size_t(r)] = r != s->rank && same_machine && mine->boot[0] && std::strcmp(h.pidns, mine->pidns) == 0 &&
                            h.start >= 0;
    }
    o.node_of = nodes_of(s->size, gpus_per_node, names);
    const int n = device_count();
    if (n < 1) burstlab::fail("rank ", s->rank, " on ", names[size_t(s->rank)], " sees no CUDA device");
    auto id = std::make_shared<std::vector<char>>(sizeof(ncclUniqueId));
    if (s->rank == 0) *id = new_unique_id();
    mpi_check(MPI_Ibcast(id->data(), static_cast<int>(id->size()), MPI_BYTE, 0, MPI_COMM_WORLD, &rq),
              "MPI_Ibcast (ncclUniqueId)");
    s->wait(rq, "MPI_Ibcast (ncclUniqueId)", {id});
    o.peers.failure = [s] { return s->check(); };
    o.peers.report = [s](const std::string& msg) {
      g_failed = true;
      s->notify(msg);
    };
    comm_ = std::make_unique<NcclComm>(*id, s->rank, s->size, local_rank % n, o);
    watchdog_ = std::thread([this] {
      while (!stop_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (stop_.load() || comm_->aborted()) continue;
        if (const std::string why = stalled(*comm_); !why.empty()) {
          g_failed = true;
          comm_->abort(why);
        }
      }
    });
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (msg.rfind("rank ", 0) != 0) msg = "rank " + std::to_string(s->rank) + ": " + msg;
    fail(msg);
    // The notices must outlive their sends: keep the state if they have not left yet.
    if (!s_->flush(1.0)) (void)s_.release();
    throw;
  }
}

MpiWorld::~MpiWorld() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  if (comm_) {
    try {
      comm_->close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "burstlab: %s\n", e.what());
      fail(e.what());
    }
    if (comm_->aborted()) g_failed = true;
    comm_.reset();
  }
  if (!g_failed) {
    // A peer still waiting in a collective this process did not reach learns it at once.
    auto n = std::make_shared<int64_t>(s_->done);
    s_->abandoned.push_back(n);
    s_->send_to_all(kLeaveTag, n.get(), 1, MPI_INT64_T);
  }
  // Notices in flight get a moment to leave; a state whose notices did not is kept (their
  // buffers must outlive the sends) until the process ends.
  if (!s_->flush(1.0)) (void)s_.release();
}

void MpiWorld::fail(const std::string& why) noexcept {
  // Only rank 0 prints its tables (the others' stdout is silenced): the others name their own
  // failure here, once, so that each rank's cause is on record whoever MPI_Abort ends first.
  g_failed = true;
  if (s_ && s_->rank != 0 && !g_said.exchange(true))
    std::fprintf(stderr, "burstlab: rank %d failed: %s\n", s_->rank, why.c_str());
  try {
    if (s_) s_->notify(why);
  } catch (...) {  // the others then see this rank's failure at MPI_Abort or their timeout
  }
  if (comm_) comm_->abort(why);
}

int MpiWorld::rank() const { return s_->rank; }
int MpiWorld::size() const { return s_->size; }

void MpiWorld::run(const std::function<void(dist::Communicator&)>& fn) {
  errors_.assign(size_t(s_->size), "");
  try {
    if (cudaSetDevice(comm_->device()) != cudaSuccess) burstlab::fail("cudaSetDevice(", comm_->device(), ")");
    fn(*comm_);
  } catch (const std::exception& e) {
    errors_[size_t(s_->rank)] = e.what();
    fail(e.what());
    throw;
  }
}

std::vector<std::vector<char>> MpiWorld::allgather(const std::function<std::vector<char>(int)>& mine,
                                                   const std::string& what) {
  std::vector<char> b;
  try {
    b = mine(s_->rank);
  } catch (const std::exception& e) {
    fail(e.what());
    throw;
  }
  return allgather(b, what);
}

std::vector<std::vector<double>> MpiWorld::exposed_ms(Phase phase) {
  const std::vector<double> mine = exposed_of(*comm_, phase);
  std::vector<char> b(mine.size() * sizeof(double));
  if (!b.empty()) std::memcpy(b.data(), mine.data(), b.size());
  std::vector<std::vector<double>> ms;
  for (const std::vector<char>& x : allgather(b, "exposed wait times")) {
    ms.emplace_back(x.size() / sizeof(double));
    if (!x.empty()) std::memcpy(ms.back().data(), x.data(), ms.back().size() * sizeof(double));
  }
  return ms;
}

std::string MpiWorld::describe() const {
  return "mpirun, " + std::to_string(s_->size) + " process" + (s_->size > 1 ? "es" : "");
}

std::vector<std::vector<char>> MpiWorld::allgather(const std::vector<char>& mine, const std::string& what) {
  try {
    const int G = s_->size;
    auto counts = std::make_shared<std::vector<int>>(size_t(G));
    auto n = std::make_shared<int>(static_cast<int>(mine.size()));
    if (mine.size() > size_t(1) << 30) burstlab::fail("allgather of ", mine.size(), " bytes from one rank (at most 1 GiB)");
    MPI_Request rq;
    const std::string sizes = "MPI_Iallgather (" + what + ": sizes)";
    mpi_check(MPI_Iallgather(n.get(), 1, MPI_INT, counts->data(), 1, MPI_INT, MPI_COMM_WORLD, &rq), sizes);
    s_->wait(rq, sizes, {counts, n});
    std::vector<int> displs(static_cast<size_t>(G));
    int64_t total = 0;
    for (int r = 0; r < G; ++r) {
      displs[size_t(r)] = static_cast<int>(total);
      total += (*counts)[size_t(r)];
    }
    if (total > int64_t(1) << 31) burstlab::fail("allgather of ", total, " bytes in all (at most 2 GiB through MPI)");
    // Both buffers hold at least one byte: MPI may refuse a null address even for a count of 0
    // (a rank with nothing to send, e.g. no sampled row of a check, or nothing sent by any).
    auto all = std::make_shared<std::vector<char>>(static_cast<size_t>(std::max<int64_t>(total, 1)));
    auto send = std::make_shared<std::vector<char>>(mine);
    if (send->empty()) send->push_back(0);
    const std::string data = "MPI_Iallgatherv (" + what + ")";
    mpi_check(MPI_Iallgatherv(send->data(), *n, MPI_BYTE, all->data(), counts->data(), displs.data(), MPI_BYTE,
                              MPI_COMM_WORLD, &rq),
              data);
    s_->wait(rq, data, {all, send, counts});
    std::vector<std::vector<char>> out(static_cast<size_t>(G));
    for (int r = 0; r < G; ++r)
      out[size_t(r)].assign(all->begin() + displs[size_t(r)], all->begin() + displs[size_t(r)] + (*counts)[size_t(r)]);
    return out;
  } catch (const std::exception& e) {
    fail(e.what());
    throw;
  }
}

}  // namespace burstlab::nccl
