// distributed/sim_run.cpp — spec §7.
#include "sim_run.hpp"

#include <algorithm>
#include <type_traits>

#include "burstlab/error.hpp"

namespace burstlab::dist {

template <class U, class T>
Tensor4<U> slice(View4<const T> g, const Partition& part, int r) {
  const int64_t n = part.local_size(r);
  Tensor4<U> out = make_tensor4<U>(Layout::BHSD, g.dim[0], g.dim[1], n, g.dim[3]);
  View4<U> v = out.view();
  for (int64_t b = 0; b < g.dim[0]; ++b)
    for (int64_t h = 0; h < g.dim[1]; ++h)
      for (int64_t l = 0; l < n; ++l)
        for (int64_t k = 0; k < g.dim[3]; ++k) v(b, h, l, k) = from_double<U>(to_double(g(b, h, part.positions[r][l], k)));
  return out;
}
template <class U, class T>
Tensor3<U> slice(View3<const T> g, const Partition& part, int r) {
  const int64_t n = part.local_size(r);
  Tensor3<U> out = make_tensor3<U>(g.dim[0], g.dim[1], n);
  View3<U> v = out.view();
  for (int64_t b = 0; b < g.dim[0]; ++b)
    for (int64_t h = 0; h < g.dim[1]; ++h)
      for (int64_t l = 0; l < n; ++l) v(b, h, l) = from_double<U>(to_double(g(b, h, part.positions[r][l])));
  return out;
}
template <class T>
Tensor4<T> gather(const std::vector<Tensor4<T>>& locals, const Partition& part) {
  if (static_cast<int>(locals.size()) != part.G) fail("gather: ", locals.size(), " locals for G = ", part.G);
  const Tensor4<T>& f = locals[0];
  Tensor4<T> out = make_tensor4<T>(Layout::BHSD, f.B, f.H, part.N, f.d);
  View4<T> v = out.view();
  for (int r = 0; r < part.G; ++r) {
    View4<const T> l = locals[r].view();
    for (int64_t b = 0; b < f.B; ++b)
      for (int64_t h = 0; h < f.H; ++h)
        for (int64_t i = 0; i < part.local_size(r); ++i)
          for (int64_t k = 0; k < f.d; ++k) v(b, h, part.positions[r][i], k) = l(b, h, i, k);
  }
  return out;
}
template <class T>
Tensor3<T> gather(const std::vector<Tensor3<T>>& locals, const Partition& part) {
  if (static_cast<int>(locals.size()) != part.G) fail("gather: ", locals.size(), " locals for G = ", part.G);
  const Tensor3<T>& f = locals[0];
  Tensor3<T> out = make_tensor3<T>(f.B, f.H, part.N);
  View3<T> v = out.view();
  for (int r = 0; r < part.G; ++r) {
    View3<const T> l = locals[r].view();
    for (int64_t b = 0; b < f.B; ++b)
      for (int64_t h = 0; h < f.H; ++h)
        for (int64_t i = 0; i < part.local_size(r); ++i) v(b, h, part.positions[r][i]) = l(b, h, i);
  }
  return out;
}

namespace {
template <class U, class T>
Buffer<U> upload_all(Engine<T>& e, const std::vector<U>& host) {
  Buffer<U> b = alloc<U>(e, static_cast<int64_t>(host.size()));
  upload(e, b.data, host.data(), b.n);
  return b;
}
template <class U, class T>
void download_all(Engine<T>& e, const Buffer<U>& b, std::vector<U>& host) {
  if (static_cast<int64_t>(host.size()) != b.n) fail("download: buffer of ", b.n, " for ", host.size(), " elements");
  download(e, host.data(), b.data, b.n);
}
}  // namespace

template <class T>
Session<T>::Session(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
                    View4<const double> dO, const AlgoOptions& o, Engine<T>& engine, std::vector<int> local)
    : e_(engine) {
  validate_views(p, Q, K, V);
  if (o.backward) validate_q_side(p, "dO", dO);
  plan_ = make_plan(p, o);
  prepared_ = engine.prepare(plan_.mask);
  for (int r : local)
    if (r < 0 || r >= o.world) fail("local rank (", r, ") must be in [0, world = ", o.world, ")");
  shards_ = upload_shards(engine, Q, K, V, dO, plan_.qp, plan_.kp, o.backward, local);
  logs_.assign(o.world, {});
}

template <class T>
std::vector<Shard<T>> upload_shards(Engine<T>& e, View4<const double> Q, View4<const double> K,
                                    View4<const double> V, View4<const double> dO, const Partition& qp,
                                    const Partition& kp, bool backward, const std::vector<int>& local) {
  std::vector<Shard<T>> shards(qp.G);
  for (int r = 0; r < qp.G; ++r) {
    if (!local.empty() && std::find(local.begin(), local.end(), r) == local.end()) continue;
    Shard<T>& x = shards[r];
    x.Q = upload_all(e, slice<T>(Q, qp, r).data);
    x.K = upload_all(e, slice<T>(K, kp, r).data);
    x.V = upload_all(e, slice<T>(V, kp, r).data);
    if (backward) x.dO = upload_all(e, slice<T>(dO, qp, r).data);
  }
  return shards;
}

void run_pass(int world, const SimOptions& sim, Phase phase, std::vector<std::vector<Transfer>>& logs,
              std::vector<std::string>& errors, const std::function<void(Communicator&)>& body) {
  for (auto& log : logs)  // keep only the latest run of each phase
    log.erase(std::remove_if(log.begin(), log.end(),
                             [&](const Transfer& t) { return t.phase == phase || t.phase == Phase::Other; }),
              log.end());
  SimWorld w(world, sim);
  struct Keep {  // the per-rank outcome and logs, also when run() throws
    SimWorld& w;
    std::vector<std::vector<Transfer>>& logs;
    std::vector<std::string>& errors;
    ~Keep() {
      errors = w.errors();
      for (size_t r = 0; r < w.logs().size(); ++r) logs[r].insert(logs[r].end(), w.logs()[r].begin(), w.logs()[r].end());
    }
  } keep{w, logs, errors};
  w.run([&](Communicator& comm) {
    body(comm);
    comm.set_context(Phase::Other, 0);
    comm.barrier();  // every rank observes a failure of any other rank
  });
}

template <class T>
void Session<T>::rank_pass(Phase phase, Communicator& comm) {
  const int r = comm.rank();
  if (comm.size() != plan_.o.world)
    fail("communicator size (", comm.size(), ") must equal the session's world (", plan_.o.world, ")");
  if (!shards_.at(r).Q.data) fail("rank ", r, "'s shard is not held by this session (local ranks only)");
  pass_of<T>(find_algorithm(plan_.o.algo))(phase, plan_, comm, e_, prepared_, shards_.at(r));
  e_.synchronize();  // this rank's engine work is complete before the pass ends
}

template <class T>
void Session<T>::run(Phase phase) {
  run_pass(plan_.o.world, plan_.o.sim, phase, logs_, errors_, [&](Communicator& comm) { rank_pass(phase, comm); });
}

template <class T>
void Session<T>::forward() {
  have_forward_ = false;
  run(Phase::Forward);
  have_forward_ = true;
}

template <class T>
void Session<T>::load_forward(View4<const double> O, View3<const double> LSE) {
  using A = acc_t<T>;
  validate_q_side(plan_.p, "O", O);
  validate_rows(plan_.p, "LSE", LSE);
  for (int r = 0; r < plan_.o.world; ++r) {
    if (!shards_[r].Q.data) continue;  // another process's rank
    shards_[r].O = upload_all(e_, slice<T>(O, plan_.qp, r).data);
    shards_[r].LSE = upload_all(e_, slice<A>(LSE, plan_.qp, r).data);
  }
  have_forward_ = true;
}

template <class T>
void Session<T>::backward() {
  if (!plan_.o.backward) fail("Session::backward: the session was built with backward = false");
  if (!have_forward_) fail("Session::backward: run forward() first (the backward uses its O and LSE)");
  run(Phase::Backward);
}

template <class T>
void download_outputs(Engine<T>& e, const Problem& p, const std::vector<Shard<T>>& shards, bool backward,
                      DistResult<T>& res) {
  using A = acc_t<T>;
  auto down4 = [&](const auto& b, int64_t H, int64_t n) {  // (B, H, n, d) BHSD
    using U = std::remove_pointer_t<decltype(b.data)>;
    Tensor4<U> t = make_tensor4<U>(Layout::BHSD, p.B, H, n, p.d);
    if (b.data) download_all(e, b, t.data);
    return t;
  };
  for (size_t r = 0; r < shards.size(); ++r) {
    const Shard<T>& x = shards[r];
    if (!x.Q.data) {  // another process's rank
      res.O.emplace_back();
      res.LSE.emplace_back();
      if (backward) {
        res.dQ.emplace_back();
        res.dK.emplace_back();
        res.dV.emplace_back();
      }
      continue;
    }
    const int64_t nq = res.qp.local_size(int(r)), nk = res.kp.local_size(int(r));
    res.O.push_back(down4(x.O, p.H_q, nq));
    Tensor3<A> L = make_tensor3<A>(p.B, p.H_q, nq);  // (B, H_q, nq)
    if (x.LSE.data) download_all(e, x.LSE, L.data);
    res.LSE.push_back(std::move(L));
    if (backward) {
      res.dQ.push_back(down4(x.dQ, p.H_q, nq));
      res.dK.push_back(down4(x.dK, p.H_kv, nk));
      res.dV.push_back(down4(x.dV, p.H_kv, nk));
    }
  }
}

template <class T>
DistResult<T> Session<T>::result() const {
  DistResult<T> res;
  res.qp = plan_.qp;
  res.kp = plan_.kp;
  res.fwd = plan_.fwd;
  res.bwd = plan_.bwd;
  res.logs = logs_;
  download_outputs(e_, plan_.p, shards_, plan_.o.backward, res);
  return res;
}

template <class T>
DistResult<T> run_session(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
                          View4<const double> dO, const AlgoOptions& o, Engine<T>& engine,
                          std::vector<std::string>* rank_errors) {
  Session<T> s(p, Q, K, V, dO, o, engine);
  try {
    s.forward();
    if (o.backward) s.backward();
  } catch (...) {
    if (rank_errors) *rank_errors = s.errors();
    throw;
  }
  if (rank_errors) *rank_errors = s.errors();
  return s.result();
}

#define BURSTLAB_DIST_INST(T)                                                                        \
  template DistResult<T> run_session<T>(const Problem&, View4<const double>, View4<const double>,  \
                                        View4<const double>, View4<const double>, const AlgoOptions&, \
                                        Engine<T>&, std::vector<std::string>*);                       \
  template Tensor4<T> slice<T, double>(View4<const double>, const Partition&, int);                \
  template Tensor3<T> slice<T, double>(View3<const double>, const Partition&, int);                \
  template Tensor4<T> gather<T>(const std::vector<Tensor4<T>>&, const Partition&);                 \
  template Tensor3<T> gather<T>(const std::vector<Tensor3<T>>&, const Partition&);                 \
  template void download_outputs<T>(Engine<T>&, const Problem&, const std::vector<Shard<T>>&, bool, DistResult<T>&); \
  template std::vector<Shard<T>> upload_shards<T>(Engine<T>&, View4<const double>, View4<const double>,          \
                                                  View4<const double>, View4<const double>, const Partition&,    \
                                                  const Partition&, bool, const std::vector<int>&);
BURSTLAB_DIST_INST(float)
BURSTLAB_DIST_INST(double)
BURSTLAB_DIST_INST(bf16_t)
BURSTLAB_DIST_INST(f16_t)
template class Session<float>;
template class Session<double>;
template class Session<bf16_t>;
template class Session<f16_t>;
template Tensor4<double> slice<double, float>(View4<const float>, const Partition&, int);
template Tensor3<double> slice<double, float>(View3<const float>, const Partition&, int);
#undef BURSTLAB_DIST_INST

}  // namespace burstlab::dist
