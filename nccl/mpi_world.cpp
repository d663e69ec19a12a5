// nccl/mpi_world.cpp — mpirun bootstrap for NcclComm (spec §7.4).
#include "mpi_world.hpp"

#include <mpi.h>

#include <cstdlib>
#include <thread>

#include "burstlab/error.hpp"
#include "world.hpp"

namespace burstlab::nccl {

namespace {
constexpr int kFailureTag = 7331;  // the failure notice on the side
void mpi_check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) fail(call, " failed (MPI error ", rc, ")");
}
const char* env(const char* name) { return std::getenv(name); }
}  // namespace

bool launched_by_mpi() {
  return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_SIZE");
}

int mpi_env_rank() {
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = env(n)) return std::atoi(v);
  return 0;
}

int mpi_env_size() {
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = env(n)) return std::atoi(v);
  return 1;
}

struct MpiWorld::State {
  int rank = 0, size = 1;
  std::string failure;                 // the first notice received
  std::vector<std::string> outgoing;   // notices being sent (kept alive until sent)
  std::vector<MPI_Request> sends;
};

MpiWorld::MpiWorld(NcclOptions o, int gpus_per_node) : s_(std::make_unique<State>()) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &s_->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s_->size);
  // Node-local rank: the rank among the processes that share memory with this one.
  MPI_Comm local;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s_->rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  int local_rank = 0;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(size_t(s_->size) * MPI_MAX_PROCESSOR_NAME);
  mpi_check(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                          MPI_COMM_WORLD),
            "MPI_Allgather (host names)");
  std::vector<std::string> hosts;
  for (int r = 0; r < s_->size; ++r) hosts.emplace_back(all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME);
  o.node_of = nodes_of(s_->size, gpus_per_node, hosts);
  const int n = device_count();
  if (n < 1) fail("rank ", s_->rank, " on ", hosts[s_->rank], " sees no CUDA device");
  std::vector<char> id(sizeof(ncclUniqueId));
  if (s_->rank == 0) id = new_unique_id();
  mpi_check(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast (ncclUniqueId)");
  State* s = s_.get();
  o.peers.failure = [s]() -> std::string {
    if (!s->failure.empty()) return s->failure;
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, MPI_COMM_WORLD, &flag, &st);
    if (!flag) return "";
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    std::string msg(size_t(count), '\0');
    MPI_Recv(msg.data(), count, MPI_CHAR, st.MPI_SOURCE, kFailureTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    s->failure = msg;
    return msg;
  };
  o.peers.report = [s](const std::string& msg) {
    s->outgoing.push_back(msg);
    const std::string& m = s->outgoing.back();
    for (int r = 0; r < s->size; ++r) {
      if (r == s->rank) continue;
      s->sends.emplace_back();
      MPI_Isend(m.data(), static_cast<int>(m.size()), MPI_CHAR, r, kFailureTag, MPI_COMM_WORLD, &s->sends.back());
    }
  };
  comm_ = std::make_unique<NcclComm>(id, s_->rank, s_->size, local_rank % n, o);
}

MpiWorld::~MpiWorld() {
  const bool failed = comm_ && comm_->aborted();
  comm_.reset();
  // Notices still in flight get a moment to leave before the process ends.
  for (int k = 0; k < 1000 && !s_->sends.empty(); ++k) {
    int all = 0;
    MPI_Testall(static_cast<int>(s_->sends.size()), s_->sends.data(), &all, MPI_STATUSES_IGNORE);
    if (all) s_->sends.clear();
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A failed world may leave peers that never reach MPI_Finalize: abort instead of waiting.
  if (failed) MPI_Abort(MPI_COMM_WORLD, 1);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int MpiWorld::rank() const { return s_->rank; }
int MpiWorld::size() const { return s_->size; }

std::vector<std::vector<char>> MpiWorld::allgather(const std::vector<char>& mine) const {
  const int G = s_->size;
  int n = static_cast<int>(mine.size());
  if (mine.size() > size_t(1) << 30) fail("allgather of ", mine.size(), " bytes from one rank (at most 1 GiB)");
  std::vector<int> counts(G), displs(G);
  mpi_check(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather (sizes)");
  int64_t total = 0;
  for (int r = 0; r < G; ++r) {
    displs[r] = static_cast<int>(total);
    total += counts[r];
  }
  if (total > int64_t(1) << 31) fail("allgather of ", total, " bytes in all (at most 2 GiB through MPI)");
  std::vector<char> all(static_cast<size_t>(total));
  mpi_check(MPI_Allgatherv(mine.data(), n, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgatherv");
  std::vector<std::vector<char>> out(G);
  for (int r = 0; r < G; ++r) out[r].assign(all.begin() + displs[r], all.begin() + displs[r] + counts[r]);
  return out;
}

}  // namespace burstlab::nccl
