// tools/nccl_run.cpp — the algorithm table's schedules over NCCL (spec §7.4), for `burstlab run`.
#include "nccl_run.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <type_traits>

#include "burstlab/error.hpp"
#include "gather.hpp"
#include "world.hpp"
#ifdef BURSTLAB_HAVE_MPI
#include "mpi_world.hpp"
#endif

namespace burstlab::tools {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

#ifdef BURSTLAB_HAVE_MPI
std::unique_ptr<nccl::MpiWorld>& mpi_world() {  // one per process, for its lifetime
  static std::unique_ptr<nccl::MpiWorld> w;
  return w;
}
#endif

// The latest pass of `phase` from a communicator's log into `keep` (other phases kept).
void keep_phase(std::vector<dist::Transfer>& keep, dist::Communicator& c, dist::Phase phase) {
  std::vector<dist::Transfer> out;
  for (const dist::Transfer& t : keep)
    if (t.phase != phase) out.push_back(t);
  for (const dist::Transfer& t : c.log())
    if (t.phase == phase) out.push_back(t);
  keep = std::move(out);
  c.clear_log();
}
// ms blocked in waits per step of `phase` (index = step).
std::vector<double> exposed_of(nccl::NcclComm& c, dist::Phase phase) {
  std::vector<double> ms;
  for (const auto& e : c.exposed())
    if (e.phase == phase && e.step >= 0) {
      if (ms.size() <= size_t(e.step)) ms.resize(size_t(e.step) + 1, 0.0);
      ms[size_t(e.step)] += e.ms;
    }
  return ms;
}
// ---- byte images of one rank's outputs and log, for MPI's all-gather
template <class U>
void put(std::vector<char>& b, const std::vector<U>& v) {
  const int64_t n = static_cast<int64_t>(v.size());
  const char* p = reinterpret_cast<const char*>(&n);
  b.insert(b.end(), p, p + sizeof n);
  p = reinterpret_cast<const char*>(v.data());
  b.insert(b.end(), p, p + n * int64_t(sizeof(U)));
}
template <class U>
std::vector<U> take(const std::vector<char>& b, size_t& at) {
  int64_t n = 0;
  if (at + sizeof n > b.size()) fail("a rank's gathered outputs are truncated");
  std::memcpy(&n, b.data() + at, sizeof n);
  at += sizeof n;
  if (n < 0 || at + size_t(n) * sizeof(U) > b.size()) fail("a rank's gathered outputs are truncated");
  std::vector<U> v(static_cast<size_t>(n));
  std::memcpy(v.data(), b.data() + at, size_t(n) * sizeof(U));
  at += size_t(n) * sizeof(U);
  return v;
}
struct LogEntry {  // dist::Transfer without its name
  int phase, step, src, dst, tag, link, sent, batch;
  int64_t bytes;
};
std::vector<char> log_bytes(const std::vector<dist::Transfer>& log) {
  std::vector<LogEntry> es;
  std::vector<char> names;
  for (const dist::Transfer& t : log) {
    es.push_back({int(t.phase), t.step, t.src, t.dst, t.tag, int(t.link), t.sent ? 1 : 0, t.batch, t.bytes});
    names.insert(names.end(), t.what.begin(), t.what.end());
    names.push_back('\0');
  }
  std::vector<char> b;
  put(b, es);
  put(b, names);
  return b;
}
std::vector<dist::Transfer> log_of(const std::vector<char>& b, size_t& at) {
  const std::vector<LogEntry> es = take<LogEntry>(b, at);
  const std::vector<char> names = take<char>(b, at);
  std::vector<dist::Transfer> log;
  size_t k = 0;
  for (const LogEntry& e : es) {
    dist::Transfer t;
    t.phase = dist::Phase(e.phase);
    t.step = e.step;
    t.src = e.src;
    t.dst = e.dst;
    t.tag = e.tag;
    t.link = dist::Link(e.link);
    t.sent = e.sent != 0;
    t.batch = e.batch;
    t.bytes = e.bytes;
    for (; k < names.size() && names[k]; ++k) t.what.push_back(names[k]);
    ++k;
    log.push_back(std::move(t));
  }
  return log;
}

// One driver per dtype: the ranks' sessions (each holds its own shard on its own engine and GPU)
// and the world they talk over.
template <class T>
class Driver {
 public:
  virtual ~Driver() = default;
  virtual void pass(dist::Phase phase) = 0;
  virtual dist::DistResult<T> result() = 0;  // every rank's outputs and logs
  virtual std::vector<std::vector<double>> exposed(dist::Phase phase) = 0;  // [rank][step] ms
  // This process failed outside the driver's calls (e.g. reading a fetched result): under mpirun
  // the others are told and the job ends with MPI_Abort; ThreadWorld's runs see to their own.
  virtual void failed(const std::string& why) noexcept { (void)why; }
  dist::Plan plan;
  std::string launch;
};

template <class T>
std::unique_ptr<Engine<T>> make(const EngineMakers& mk, const ImplOptions& opt) {
  if constexpr (std::is_same_v<T, double>) return mk.f64(opt);
  else if constexpr (std::is_same_v<T, float>) return mk.f32(opt);
  else if constexpr (std::is_same_v<T, bf16_t>) return mk.bf16(opt);
  else return mk.f16(opt);
}

// Ranks as threads of this process, rank r on GPU r.
template <class T>
class ThreadDriver : public Driver<T> {
 public:
  ThreadDriver(const Problem& p, const Inputs& in, const ImplOptions& opt, const dist::AlgoOptions& o,
               const EngineMakers& mk, nccl::NcclOptions no)
      : world_(o.world, no), engines_(o.world), sessions_(o.world), logs_(o.world) {
    this->launch = "threads, " + std::to_string(o.world) + " GPU" + (o.world > 1 ? "s" : "");
    // Each rank's engine, shard upload and later its frees run on its own thread and device.
    world_.run([&](nccl::NcclComm& c) {
      const int r = c.rank();
      engines_[r] = make<T>(mk, opt);
      sessions_[r] = std::make_unique<dist::Session<T>>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o,
                                                        *engines_[r], std::vector<int>{r});
    });
    this->plan = sessions_[0]->plan();
  }
  ~ThreadDriver() override {
    try {
      world_.run([&](nccl::NcclComm& c) {
        sessions_[c.rank()].reset();
        engines_[c.rank()].reset();
      });
    } catch (...) {  // a failed world: what is left is freed with the process
    }
  }
  void pass(dist::Phase phase) override {
    world_.run([&](nccl::NcclComm& c) {
      c.clear_exposed(phase);
      sessions_[c.rank()]->rank_pass(phase, c);
      c.set_context(dist::Phase::Other, 0);
      c.barrier();  // the pass ends when every rank's has
      keep_phase(logs_[c.rank()], c, phase);
    });
  }
  dist::DistResult<T> result() override {
    const int G = world_.size();
    std::vector<dist::DistResult<T>> rs(G);
    world_.run([&](nccl::NcclComm& c) { rs[c.rank()] = sessions_[c.rank()]->result(); });
    dist::DistResult<T> res = std::move(rs[0]);
    for (int r = 1; r < G; ++r) {
      res.O[r] = std::move(rs[r].O[r]);
      res.LSE[r] = std::move(rs[r].LSE[r]);
      if (r < int(rs[r].dQ.size())) {
        res.dQ[r] = std::move(rs[r].dQ[r]);
        res.dK[r] = std::move(rs[r].dK[r]);
        res.dV[r] = std::move(rs[r].dV[r]);
      }
    }
    res.logs = logs_;
    return res;
  }
  std::vector<std::vector<double>> exposed(dist::Phase phase) override {
    std::vector<std::vector<double>> ms;
    for (int r = 0; r < world_.size(); ++r) ms.push_back(exposed_of(world_.comm(r), phase));
    return ms;
  }

 private:
  nccl::ThreadWorld world_;
  std::vector<std::unique_ptr<Engine<T>>> engines_;
  std::vector<std::unique_ptr<dist::Session<T>>> sessions_;
  std::vector<std::vector<dist::Transfer>> logs_;
};

#ifdef BURSTLAB_HAVE_MPI
// One process per GPU: this process holds one rank.
template <class T>
class MpiDriver : public Driver<T> {
 public:
  MpiDriver(const Problem& p, const Inputs& in, const ImplOptions& opt, const dist::AlgoOptions& o,
            const EngineMakers& mk, nccl::MpiWorld& w)
      : w_(w) {
    guarded([&] {
      if (o.world != w.size())
        fail("world (", o.world, ") must equal the number of processes mpirun started (", w.size(), ")");
      this->launch = "mpirun, " + std::to_string(w.size()) + " process" + (w.size() > 1 ? "es" : "");
      if (cudaSetDevice(w.comm().device()) != cudaSuccess) fail("cudaSetDevice(", w.comm().device(), ")");
      engine_ = make<T>(mk, opt);
      session_ = std::make_unique<dist::Session<T>>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o,
                                                    *engine_, std::vector<int>{w.rank()});
      this->plan = session_->plan();
    });
  }
  void pass(dist::Phase phase) override {
    guarded([&] {
      nccl::NcclComm& c = w_.comm();
      c.clear_exposed(phase);
      session_->rank_pass(phase, c);
      c.set_context(dist::Phase::Other, 0);
      c.barrier();
      keep_phase(log_, c, phase);
    });
  }
  dist::DistResult<T> result() override {
    return guarded([&] { return gathered(); });
  }
  std::vector<std::vector<double>> exposed(dist::Phase phase) override {
    return guarded([&] {
      std::vector<char> b;
      put(b, exposed_of(w_.comm(), phase));
      std::vector<std::vector<double>> ms;
      for (const auto& x : w_.allgather(b, "exposed wait times")) {
        size_t at = 0;
        ms.push_back(take<double>(x, at));
      }
      return ms;
    });
  }
  void failed(const std::string& why) noexcept override { w_.fail(why); }

 private:
  // A failure anywhere in this process's part tells the other processes (they may be waiting for
  // it in a collective or a transfer), aborts the communicator, and ends the job at exit.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      w_.fail(e.what());
      throw;
    }
  }
  dist::DistResult<T> gathered() {
    using A = acc_t<T>;
    const int r = w_.rank();
    dist::DistResult<T> res = session_->result();
    const bool bwd = !res.dQ.empty();
    std::vector<char> mine;
    put(mine, res.O[r].data);
    put(mine, res.LSE[r].data);
    if (bwd) {
      put(mine, res.dQ[r].data);
      put(mine, res.dK[r].data);
      put(mine, res.dV[r].data);
    }
    const std::vector<char> lb = log_bytes(log_);
    mine.insert(mine.end(), lb.begin(), lb.end());
    const std::vector<std::vector<char>> all = w_.allgather(mine, "the ranks' outputs and logs");
    const Problem& p = this->plan.p;
    res.logs.assign(w_.size(), {});
    for (int k = 0; k < w_.size(); ++k) {
      size_t at = 0;
      const int64_t nq = res.qp.local_size(k), nk = res.kp.local_size(k);
      auto t4 = [&](auto u, int64_t H, int64_t n) {
        using U = decltype(u);
        Tensor4<U> t = make_tensor4<U>(Layout::BHSD, p.B, H, n, p.d);
        t.data = take<U>(all[k], at);
        if (t.data.size() != size_t(p.B * H * n * p.d)) fail("rank ", k, "'s gathered outputs have the wrong size");
        return t;
      };
      res.O[k] = t4(T{}, p.H_q, nq);
      Tensor3<A> L = make_tensor3<A>(p.B, p.H_q, nq);
      L.data = take<A>(all[k], at);
      res.LSE[k] = std::move(L);
      if (bwd) {
        res.dQ[k] = t4(A{}, p.H_q, nq);
        res.dK[k] = t4(A{}, p.H_kv, nk);
        res.dV[k] = t4(A{}, p.H_kv, nk);
      }
      res.logs[k] = log_of(all[k], at);
    }
    return res;
  }

  nccl::MpiWorld& w_;
  std::unique_ptr<Engine<T>> engine_;
  std::unique_ptr<dist::Session<T>> session_;
  std::vector<dist::Transfer> log_;
};
#endif

template <class T>
NcclDist make_dist(const Problem& p, const Inputs& in, const ImplOptions& opt, const dist::AlgoOptions& o,
                   const EngineMakers& mk, const NcclFlags& f) {
  nccl::NcclOptions no;
  no.timeout_s = f.timeout_s;
  if (!(f.timeout_s > 0)) fail("timeout (", f.timeout_s, ") must be > 0 seconds");
  if (!f.inject.empty()) no.inject = nccl::parse_injection(f.inject);
  if (no.inject.rank >= o.world) fail("inject-failure (", f.inject, ") names rank ", no.inject.rank, " of a world of ", o.world);
  std::shared_ptr<Driver<T>> d;
  if (launched_by_mpi()) {
#ifdef BURSTLAB_HAVE_MPI
    auto& w = mpi_world();
    if (!w) w = std::make_unique<nccl::MpiWorld>(no, o.gpus_per_node);
    d = std::make_shared<MpiDriver<T>>(p, in, opt, o, mk, *w);
#else
    fail("transport (nccl) under mpirun needs a build with MPI (it was not found at configure time)");
#endif
  } else {
    no.node_of = nccl::nodes_of(o.world, o.gpus_per_node, {});
    d = std::make_shared<ThreadDriver<T>>(p, in, opt, o, mk, no);
  }
  NcclDist out;
  out.plan = d->plan;
  out.launch = d->launch;
  const bool bwd = o.backward;
  out.run.forward = [d] {
    const auto t0 = std::chrono::steady_clock::now();
    d->pass(dist::Phase::Forward);
    return ms_since(t0);
  };
  out.run.backward = [d] {
    const auto t0 = std::chrono::steady_clock::now();
    d->pass(dist::Phase::Backward);
    return ms_since(t0);
  };
  // The logs come with each fetch's result (under mpirun every fetch is a collective, which every
  // process reaches in the same order).
  auto last = std::make_shared<std::vector<std::vector<dist::Transfer>>>();
  out.run.fetch_forward = [d, last](Tensor4<double>& O, Tensor3<double>& LSE) {
    try {
      const dist::DistResult<T> res = d->result();
      *last = res.logs;
      GatheredOutputs g = gather_outputs(res, true, false);
      O = std::move(g.O);
      LSE = std::move(g.LSE);
    } catch (const std::exception& e) {
      d->failed(e.what());
      throw;
    }
  };
  out.run.fetch_backward = [d, bwd, last](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
    try {
      if (!bwd) fail("the NCCL session was built without a backward");
      const dist::DistResult<T> res = d->result();
      *last = res.logs;
      GatheredOutputs g = gather_outputs(res, false, true);
      dQ = std::move(g.dQ);
      dK = std::move(g.dK);
      dV = std::move(g.dV);
    } catch (const std::exception& e) {
      d->failed(e.what());
      throw;
    }
  };
  out.logs = [last] { return *last; };
  out.exposed_ms = [d](dist::Phase ph) { return d->exposed(ph); };
  return out;
}

}  // namespace

NcclDist nccl_dist(const Problem& p, const Inputs& in, const ImplOptions& opt, const dist::AlgoOptions& o,
                   const EngineMakers& mk, const NcclFlags& f) {
  switch (in.dtype) {
    case Dtype::F64: return make_dist<double>(p, in, opt, o, mk, f);
    case Dtype::F32: return make_dist<float>(p, in, opt, o, mk, f);
    case Dtype::BF16: return make_dist<bf16_t>(p, in, opt, o, mk, f);
    case Dtype::F16: break;
  }
  return make_dist<f16_t>(p, in, opt, o, mk, f);
}

#ifdef BURSTLAB_HAVE_MPI
bool launched_by_mpi() { return nccl::launched_by_mpi(); }
int mpi_rank() { return nccl::mpi_env_rank(); }
int mpi_size() { return nccl::mpi_env_size(); }
void nccl_shutdown() {
  mpi_world().reset();
  nccl::mpi_finish();  // MPI_Abort when this process failed (also before its world was made)
}
#else
bool launched_by_mpi() { return false; }
int mpi_rank() { return 0; }
int mpi_size() { return 1; }
void nccl_shutdown() {}
#endif

}  // namespace burstlab::tools
