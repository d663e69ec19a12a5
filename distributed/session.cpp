// distributed/session.cpp — spec §7.
#include "session.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "burstlab/error.hpp"

namespace burstlab::dist {

template <class U, class T>
Tensor4<U> slice(View4<const T> g, const Partition& part, int r) {
  const int64_t n = part.local_size(r), H = g.dim[1], d = g.dim[3];
  Tensor4<U> out = make_tensor4<U>(Layout::BHSD, g.dim[0], H, n, d);
  View4<U> v = out.view();
  // Rows are independent, so they are copied side by side: a rank's shard at 1M tokens is billions
  // of elements. The same type is copied as it is (the round trip through fp64 is exact).
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < g.dim[0] * H * n; ++row) {
    const int64_t b = row / (H * n), h = row / n % H, l = row % n, i = part.positions[r][l];
    for (int64_t k = 0; k < d; ++k) {
      if constexpr (std::is_same_v<U, T>) v(b, h, l, k) = g(b, h, i, k);
      else v(b, h, l, k) = from_double<U>(to_double(g(b, h, i, k)));
    }
  }
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

std::vector<std::vector<char>> World::allgather(const std::function<std::vector<char>(int)>& mine,
                                                const std::string& what) {
  std::vector<std::vector<char>> all(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    if (!holds(r)) fail(describe(), ": allgather (", what, ") of rank ", r, ", which this process does not hold");
    all[size_t(r)] = mine(r);
  }
  return all;
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

// Rank r's rows of global g (B, H, N, d) in engine memory, BHSD over its local length, rounded
// to T. Where g is already T and each (b, h)'s rows lie one after another (BHSD), a chunk of
// consecutive positions (contiguous, zigzag) is one run of g: uploaded as it lies, with no host
// copy of the shard (at 1M tokens, gigabytes per tensor, zero-filled on one thread first).
// Otherwise (a conversion, another layout, striped chunks) through the host slice.
template <class T, class S>
Buffer<T> upload_rows(Engine<T>& e, View4<const S> g, const Partition& part, int r) {
  if constexpr (std::is_same_v<S, T>) {
    const int64_t B = g.dim[0], H = g.dim[1], d = g.dim[3], n = part.local_size(r);
    bool runs = g.stride[3] == 1 && g.stride[2] == d;
    for (int c : part.rank_chunks[size_t(r)]) runs = runs && (part.chunks[size_t(c)].step == 1 || part.chunks[size_t(c)].n == 1);
    if (runs) {
      Buffer<T> b = alloc<T>(e, B * H * n * d);
      for (int64_t bi = 0; bi < B; ++bi)
        for (int64_t h = 0; h < H; ++h)
          for (int c : part.rank_chunks[size_t(r)]) {
            const Chunk& ch = part.chunks[size_t(c)];
            upload(e, b.data + ((bi * H + h) * n + ch.local_start) * d, g.row(bi, h, ch.start), ch.n * d);
          }
      return b;
    }
  }
  return upload_all(e, slice<T>(g, part, r).data);
}

// Rank r's slices of Q, K, V (and dO when `backward`), rounded to T, in engine memory: Q, dO
// (B, H_q, n_q, d), K, V (B, H_kv, n_k, d).
template <class T>
Shard<T> upload_shard(Engine<T>& e, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                      const AnyView4& dO, const Partition& qp, const Partition& kp, bool backward, int r) {
  Shard<T> x;
  auto up = [&](const AnyView4& g, const Partition& part) {
    return std::visit([&](const auto& v) { return upload_rows(e, v, part, r); }, g);
  };
  x.Q = up(Q, qp);
  x.K = up(K, kp);
  x.V = up(V, kp);
  if (backward) x.dO = up(dO, qp);
  return x;
}

// ---- byte images of one rank's outputs and log, for a World of several processes
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
struct LogEntry {  // Transfer without its name
  int phase, step, src, dst, tag, link, sent, batch;
  int64_t bytes;
};
void put_log(std::vector<char>& b, const std::vector<Transfer>& log) {
  std::vector<LogEntry> es;
  std::vector<char> names;
  for (const Transfer& t : log) {
    es.push_back({int(t.phase), t.step, t.src, t.dst, t.tag, int(t.link), t.sent ? 1 : 0, t.batch, t.bytes});
    names.insert(names.end(), t.what.begin(), t.what.end());
    names.push_back('\0');
  }
  put(b, es);
  put(b, names);
}
std::vector<Transfer> take_log(const std::vector<char>& b, size_t& at) {
  const std::vector<LogEntry> es = take<LogEntry>(b, at);
  const std::vector<char> names = take<char>(b, at);
  std::vector<Transfer> log;
  size_t k = 0;
  for (const LogEntry& e : es) {
    Transfer t;
    t.phase = Phase(e.phase);
    t.step = e.step;
    t.src = e.src;
    t.dst = e.dst;
    t.tag = e.tag;
    t.link = Link(e.link);
    t.sent = e.sent != 0;
    t.batch = e.batch;
    t.bytes = e.bytes;
    for (; k < names.size() && names[k]; ++k) t.what.push_back(names[k]);
    ++k;
    log.push_back(std::move(t));
  }
  return log;
}
// The latest pass of `phase` from a communicator's log into `keep` (other phases kept).
void keep_phase(std::vector<Transfer>& keep, Communicator& c, Phase phase) {
  std::vector<Transfer> out;
  for (const Transfer& t : keep)
    if (t.phase != phase && t.phase != Phase::Other) out.push_back(t);
  for (const Transfer& t : c.log())
    if (t.phase == phase || t.phase == Phase::Other) out.push_back(t);
  keep = std::move(out);
  c.clear_log();
}
}  // namespace

template <class T>
void Session<T>::start(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                       const AnyView4& dO, const AlgoOptions& o) {
  validate_views(p, shape_of(Q), shape_of(K), shape_of(V));
  if (o.backward) validate_q_side(p, "dO", shape_of(dO));
  plan_ = make_plan(p, o);
  pass_ = pass_of<T>(find_algorithm(plan_.o.algo));
  const int G = o.world;
  e_.assign(G, nullptr);
  prepared_.assign(G, {});
  shards_.assign(G, {});
  logs_.assign(G, {});
  errors_.assign(G, "");
}

template <class T>
void Session<T>::place_all(Engine<T>& e, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                           const AnyView4& dO) {
  const PreparedMask m = e.prepare(plan_.mask);
  for (int r = 0; r < plan_.o.world; ++r) {
    if (!w_->holds(r)) continue;
    e_[r] = &e;
    prepared_[r] = m;
    shards_[r] = upload_shard(e, Q, K, V, dO, plan_.qp, plan_.kp, plan_.o.backward, r);
  }
}

template <class T>
Session<T>::Session(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                    const AnyView4& dO, const AlgoOptions& o, World& world, EngineMaker<T> make_engine)
    : w_(&world) {
  start(p, Q, K, V, dO, o);
  if (world.size() != o.world) fail("world (", o.world, ") must equal the size of ", world.describe());
  if (world.one_device()) {  // one engine for every rank, made and filled here
    own_engines_.push_back(make_engine());
    place_all(*own_engines_.back(), Q, K, V, dO);
    return;
  }
  // Each rank makes its engine and uploads its shard on its own thread and device.
  own_engines_.resize(o.world);
  try {
    world.run([&](Communicator& c) {
      const int r = c.rank();
      own_engines_[r] = make_engine();
      e_[r] = own_engines_[r].get();
      prepared_[r] = e_[r]->prepare(plan_.mask);
      shards_[r] = upload_shard(*e_[r], Q, K, V, dO, plan_.qp, plan_.kp, o.backward, r);
    });
  } catch (...) {
    errors_ = world.errors();
    throw;
  }
}

template <class T>
Session<T>::Session(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                    const AnyView4& dO, const AlgoOptions& o, Engine<T>& engine) {
  start(p, Q, K, V, dO, o);
  own_world_ = std::make_unique<SimWorld>(o.world, plan_.o.sim);
  w_ = own_world_.get();
  place_all(engine, Q, K, V, dO);
}

template <class T>
Session<T>::~Session() {
  if (own_engines_.size() <= 1) return;  // one device: freed here, in member order
  try {
    w_->run([&](Communicator& c) {
      const int r = c.rank();
      shards_[r] = {};
      prepared_[r] = {};
      own_engines_[r].reset();
    });
  } catch (...) {  // a failed world: what is left is freed with the process
  }
}

template <class T>
Engine<T>& Session<T>::held(const Communicator& comm) const {
  const int r = comm.rank();
  if (comm.size() != plan_.o.world)
    fail("communicator size (", comm.size(), ") must equal the session's world (", plan_.o.world, ")");
  if (!e_.at(r)) fail("rank ", r, "'s shard is not held by this session (local ranks only)");
  return *e_[r];
}

// Inlined into both callers, so that run's rank thread goes from its body straight to the
// algorithm's pass (no frame of its own).
template <class T>
[[gnu::always_inline]] inline void Session<T>::pass_on(Phase phase, Communicator& comm) {
  Engine<T>& e = held(comm);
  pass_(phase, plan_, comm, e, prepared_[comm.rank()], shards_[comm.rank()]);
  e.synchronize();  // this rank's engine work is complete before the pass ends
}

template <class T>
void Session<T>::rank_pass(Phase phase, Communicator& comm) {
  pass_on(phase, comm);
}

// forward() and backward() end in a call of this one, so that a backtrace from an engine shows
// one Session frame on the calling thread.
template <class T>
void Session<T>::run(Phase phase) {
  if (phase == Phase::Forward) have_forward_ = false;
  try {
    w_->run([&](Communicator& c) {
      c.begin_pass(phase);
      pass_on(phase, c);
      c.set_context(Phase::Other, 0);
      c.barrier();  // the pass ends when every rank's has; every rank observes another's failure
      keep_phase(logs_[c.rank()], c, phase);
    });
  } catch (...) {
    errors_ = w_->errors();
    throw;
  }
  errors_ = w_->errors();
  if (phase == Phase::Forward) have_forward_ = true;
}

template <class T>
void Session<T>::forward() {
  run(Phase::Forward);
}

template <class T>
void Session<T>::load_forward(View4<const double> O, View3<const double> LSE) {
  using A = acc_t<T>;
  validate_q_side(plan_.p, "O", O);
  validate_rows(plan_.p, "LSE", LSE);
  auto load = [&](int r) {
    shards_[r].O = upload_all(*e_[r], slice<T>(O, plan_.qp, r).data);
    shards_[r].LSE = upload_all(*e_[r], slice<A>(LSE, plan_.qp, r).data);
  };
  if (own_engines_.size() <= 1) {
    for (int r = 0; r < plan_.o.world; ++r)
      if (e_[r]) load(r);
  } else {
    w_->run([&](Communicator& c) { load(c.rank()); });
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
void Session<T>::read_output(int r, Output which, int64_t at, int64_t n, void* host) const {
  if (r < 0 || r >= plan_.o.world || !e_[r]) fail("read_output: rank ", r, " is not held by this process");
  const Shard<T>& x = shards_[r];
  auto read = [&](const auto& b, const char* name) {
    using U = std::remove_pointer_t<decltype(b.data)>;
    if (!b.data) fail("read_output: rank ", r, "'s ", name, " has not been computed");
    if (at < 0 || n < 0 || at + n > b.n)
      fail("read_output: elements [", at, ", ", at + n, ") of rank ", r, "'s ", name, " (", b.n, ")");
    download(*e_[r], static_cast<U*>(host), b.data + at, n);
  };
  switch (which) {
    case Output::O: return read(x.O, "O");
    case Output::LSE: return read(x.LSE, "LSE");
    case Output::dQ: return read(x.dQ, "dQ");
    case Output::dK: return read(x.dK, "dK");
    case Output::dV: return read(x.dV, "dV");
  }
}

template <class T>
DistResult<T> Session<T>::result(bool outputs) const {
  using A = acc_t<T>;
  const Problem& p = plan_.p;
  const bool backward = plan_.o.backward;
  const int G = plan_.o.world;
  DistResult<T> res;
  res.qp = plan_.qp;
  res.kp = plan_.kp;
  res.fwd = plan_.fwd;
  res.bwd = plan_.bwd;
  res.logs = logs_;
  auto down4 = [&](Engine<T>& e, const auto& b, int64_t H, int64_t n) {  // (B, H, n, d) BHSD
    using U = std::remove_pointer_t<decltype(b.data)>;
    Tensor4<U> t = make_tensor4<U>(Layout::BHSD, p.B, H, n, p.d);
    if (b.data) download_all(e, b, t.data);
    return t;
  };
  res.O.resize(G);
  res.LSE.resize(G);
  if (backward && outputs) {
    res.dQ.resize(G);
    res.dK.resize(G);
    res.dV.resize(G);
  }
  auto download_rank = [&](int r) {
    Engine<T>& e = *e_[r];
    const Shard<T>& x = shards_[r];
    const int64_t nq = res.qp.local_size(r), nk = res.kp.local_size(r);
    res.O[r] = down4(e, x.O, p.H_q, nq);
    res.LSE[r] = make_tensor3<A>(p.B, p.H_q, nq);  // (B, H_q, nq)
    if (x.LSE.data) download_all(e, x.LSE, res.LSE[r].data);
    if (backward) {
      res.dQ[r] = down4(e, x.dQ, p.H_q, nq);
      res.dK[r] = down4(e, x.dK, p.H_kv, nk);
      res.dV[r] = down4(e, x.dV, p.H_kv, nk);
    }
  };
  bool all_here = true;
  for (int r = 0; r < G; ++r) all_here = all_here && w_->holds(r);
  if (outputs)
    for (int r = 0; r < G; ++r)
      if (e_[r]) download_rank(r);
  if (all_here) return res;
  // The other processes' ranks: every process sends its ranks' outputs and logs to every other.
  const std::vector<std::vector<char>> all = w_->allgather(
      [&](int r) {
        std::vector<char> b;
        if (!outputs) {
          put_log(b, logs_[r]);
          return b;
        }
        put(b, res.O[r].data);
        put(b, res.LSE[r].data);
        if (backward) {
          put(b, res.dQ[r].data);
          put(b, res.dK[r].data);
          put(b, res.dV[r].data);
        }
        put_log(b, logs_[r]);
        return b;
      },
      outputs ? "the ranks' outputs and logs" : "the ranks' logs");
  for (int k = 0; k < G; ++k) {
    if (w_->holds(k)) continue;
    size_t at = 0;
    if (!outputs) {
      res.logs[k] = take_log(all[k], at);
      continue;
    }
    const int64_t nq = res.qp.local_size(k), nk = res.kp.local_size(k);
    auto t4 = [&](auto u, int64_t H, int64_t n) {
      using U = decltype(u);
      Tensor4<U> t = make_tensor4<U>(Layout::BHSD, p.B, H, n, p.d);
      t.data = take<U>(all[k], at);
      if (t.data.size() != size_t(p.B * H * n * p.d)) fail("rank ", k, "'s gathered outputs have the wrong size");
      return t;
    };
    res.O[k] = t4(T{}, p.H_q, nq);
    res.LSE[k] = make_tensor3<A>(p.B, p.H_q, nq);
    res.LSE[k].data = take<A>(all[k], at);
    if (res.LSE[k].data.size() != size_t(p.B * p.H_q * nq)) fail("rank ", k, "'s gathered LSE has the wrong size");
    if (backward) {
      res.dQ[k] = t4(A{}, p.H_q, nq);
      res.dK[k] = t4(A{}, p.H_kv, nk);
      res.dV[k] = t4(A{}, p.H_kv, nk);
    }
    res.logs[k] = take_log(all[k], at);
  }
  return res;
}

template <class T>
DistResult<T> run_session(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                          const AnyView4& dO, const AlgoOptions& o, Engine<T>& engine,
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
  template DistResult<T> run_session<T>(const Problem&, const AnyView4&, const AnyView4&,          \
                                        const AnyView4&, const AnyView4&, const AlgoOptions&,        \
                                        Engine<T>&, std::vector<std::string>*);                       \
  template Tensor4<T> slice<T, double>(View4<const double>, const Partition&, int);                \
  template Tensor3<T> slice<T, double>(View3<const double>, const Partition&, int);                \
  template Tensor4<T> gather<T>(const std::vector<Tensor4<T>>&, const Partition&);                 \
  template Tensor3<T> gather<T>(const std::vector<Tensor3<T>>&, const Partition&);                 \

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
