// distributed/ring.cpp — spec §7.3.
#include "ring.hpp"

#include "algorithm.hpp"  // Plan

#include "burstlab/block_split.hpp"

#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "burstlab/error.hpp"

namespace burstlab::dist {

namespace {

template <class T>
View4<T> bhsd(T* data, int64_t B, int64_t H, int64_t n, int64_t d) {
  return view4(data, Layout::BHSD, B, H, n, d);
}
template <class T>
class RingRun {
  using A = acc_t<T>;
  using Bytes = Buffer<unsigned char>;

 public:
  RingRun(const Schedule& s, Communicator& c, Engine<T>& e, const Problem& p, const PreparedMask& m,
          const Partition& qp, const Partition& kp, Shard<T>& x)
      : s_(s), c_(c), e_(e), p_(p), m_(m), qp_(qp), kp_(kp), x_(x), items_(travelling_items(s.algo, s.phase)) {
    r_ = c.rank();
    if (c.size() != s.G) fail("communicator size (", c.size(), ") must equal the schedule's G (", s.G, ")");
    if (r_ < 0 || r_ >= s.G) fail("rank (", r_, ") outside [0, ", s.G, ")");
    x_.n_q = qp.local_size(r_);
    x_.n_k = kp.local_size(r_);
  }

  // The phase's outputs allocated (when empty) and zeroed, then every step of the schedule on
  // this rank. Inlined, with run and compute, into each entry point (run_ring, ring_pass): the
  // table's pass calls the engine from its own frame.
  [[gnu::always_inline]] void execute() {
    if (s_.phase == Phase::Forward) start_forward();
    else start_backward();
    run();
  }

 private:
  void start_forward() {
    ensure(e_, x_.O, q_elems(x_.n_q, false));
    ensure(e_, x_.LSE, q_elems(x_.n_q, true));
    fill(e_, x_.O.data, x_.O.n, 0.0);  // the merge identity (O = 0, LSE = -inf), §4.3
    fill(e_, x_.LSE.data, x_.LSE.n, -std::numeric_limits<double>::infinity());
    home_ = {{"Q", x_.Q.data}, {"K", x_.K.data}, {"V", x_.V.data}, {"O", x_.O.data}, {"LSE", x_.LSE.data}};
  }

  void start_backward() {
    ensure(e_, x_.dQ, q_elems(x_.n_q, false));
    ensure(e_, x_.dK, kv_elems(x_.n_k));
    ensure(e_, x_.dV, kv_elems(x_.n_k));
    fill(e_, x_.dQ.data, x_.dQ.n, 0.0);
    fill(e_, x_.dK.data, x_.dK.n, 0.0);
    fill(e_, x_.dV.data, x_.dV.n, 0.0);
    const int64_t B = p_.B, Hq = p_.H_q, d = p_.d, n = x_.n_q;
    if (x_.D.data) {
      if (x_.D.n != q_elems(n, true)) fail("shard D has ", x_.D.n, " elements, must have B H_q n_q = ", q_elems(n, true));
      D_ = x_.D;
    } else {
      D_ = alloc<A>(e_, q_elems(n, true));
      e_.compute_D(bhsd<const T>(x_.O.data, B, Hq, n, d), bhsd<const T>(x_.dO.data, B, Hq, n, d),
                   view3(D_.data, B, Hq, n));  // eq. (5.1), once, at home
      e_.synchronize();  // D travels from step 0 (burst): done before the transport reads it
    }
    home_ = {{"Q", x_.Q.data},   {"K", x_.K.data},   {"V", x_.V.data},   {"dO", x_.dO.data},
             {"LSE", x_.LSE.data}, {"D", D_.data},   {"dQ", x_.dQ.data}, {"dK", x_.dK.data},
             {"dV", x_.dV.data}};
  }

  int64_t q_elems(int64_t n, bool per_row) const { return p_.B * p_.H_q * n * (per_row ? 1 : p_.d); }
  int64_t kv_elems(int64_t n) const { return p_.B * p_.H_kv * n * p_.d; }
  int64_t width(const Item& it) const { return it.acc ? int64_t(sizeof(A)) : int64_t(sizeof(T)); }
  // Bytes of one slot of travelling item `it`: room for the largest shard.
  int64_t slot_bytes(const Item& it) const {
    return width(it) * (it.q_side ? q_elems(qp_.max_local_size(), it.per_row) : kv_elems(kp_.max_local_size()));
  }
  int item_index(const char* name) const {
    for (int i = 0; i < static_cast<int>(items_.size()); ++i)
      if (std::strcmp(items_[i].name, name) == 0) return i;
    return -1;
  }
  // The buffer holding tensor `name` for the shard in use at step t: home at step 0, one of the
  // inter-node slots at a step a prefetched hop landed on (spec §7.9), else the step's slot.
  void* at(const char* name, int t) {
    const int i = item_index(name);
    if (i < 0 || t == 0) return home_.at(name);
    const auto l = landed_[i].find(t);
    if (l != landed_[i].end()) return islots_[i][l->second].data;
    return slots_[i][t % 2].data;
  }
  template <class U>
  U* at(const char* name, int t) {
    return static_cast<U*>(at(name, t));
  }

  [[gnu::always_inline]] void run() {
    const int G = s_.G;
    // Two slots per travelling tensor, each big enough for the largest shard; an accumulated one
    // also has a third, the partial sum arriving while the step computes into its own slot.
    slots_.clear();
    sum_in_.clear();
    for (const Item& it : items_) {
      const int64_t n = slot_bytes(it);
      slots_.push_back({alloc<unsigned char>(e_, n), alloc<unsigned char>(e_, n)});
      sum_in_.push_back(it.accumulated ? alloc<unsigned char>(e_, n) : Bytes{});
    }
    // The double ring's separate inter-node slots (spec §7.9): two per read-only tensor, one
    // receiving the next round's shard while the other is read (and sent on) in this round.
    islots_.assign(items_.size(), {});
    landed_.assign(items_.size(), {});
    std::vector<int> next_islot(items_.size(), 0);
    for (const auto& steps : s_.steps[r_])
      for (const Message& m : steps.recvs)
        if (m.lands > 0 && islots_[m.item].empty()) {
          const int64_t n = slot_bytes(items_[m.item]);
          islots_[m.item] = {alloc<unsigned char>(e_, n), alloc<unsigned char>(e_, n)};
        }
    auto bytes = [&](const Message& m) { return m.elems * width(items_[m.item]); };
    // Prefetched hops in flight across steps: (landing step, request); destroyed (cancelled)
    // before the buffers.
    std::vector<std::pair<int, RequestPtr>> in_flight;
    for (int t = 0; t < G; ++t) {
      c_.set_context(s_.phase, t);
      const RankStep& st = s_.steps[r_][t];
      std::vector<RequestPtr> reqs;  // declared after the buffers: destroyed (cancelled) first
      std::vector<std::pair<Message, RequestPtr>> sums;  // partial sums received into sum_in_
      auto prefetched = [&](int item) {
        for (const Message& m : st.sends)
          if (m.item == item && m.lands > 0) return true;
        return false;
      };
      auto send = [&](bool after) {
        for (const Message& m : st.sends) {
          if (m.after_compute != after) continue;
          // Home read-only inputs stay valid; everything else is rewritten before its next read.
          // A buffer that also feeds a prefetched hop is consumed by that (later-waited) send only.
          const bool consume = (t > 0 || items_[m.item].accumulated) && (m.lands > 0 || !prefetched(m.item));
          // A partial sum posted before the compute is the one finished at step t - 1 (never
          // step 0's, which stays home).
          const bool sum = items_[m.item].accumulated && !after;
          if (sum && t < 2) fail("partial sum ", m.tensor, " sent before step ", t, ": none is finished yet");
          RequestPtr q = c_.isend(at(m.tensor.c_str(), sum ? t - 1 : t), bytes(m), m.peer, m.tag, m.tensor.c_str(), consume);
          if (m.lands > 0) in_flight.emplace_back(m.lands, std::move(q));
          else reqs.push_back(std::move(q));
        }
      };
      c_.batch([&] {  // this step's receives and read-only sends: one group
        for (const Message& m : st.recvs) {
          if (m.after_compute) continue;  // posted with the sends that pair with it, below
          if (m.lands > 0) {  // into the inter-node slot not read this round
            const int k = next_islot[m.item]++ % 2;
            landed_[m.item][m.lands] = k;
            in_flight.emplace_back(m.lands, c_.irecv(islots_[m.item][k].data, bytes(m), m.peer, m.tag,
                                                     m.tensor.c_str()));
            continue;
          }
          if (items_[m.item].accumulated) {  // the partial sum this step's contribution joins
            sums.emplace_back(m, c_.irecv(sum_in_[m.item].data, bytes(m), m.peer, m.tag, m.tensor.c_str()));
            continue;
          }
          recv(m, t, reqs);
        }
        send(false);  // read-only tensors and the previous step's partial sums: overlap the compute
      });
      // From step 1 a rank's contribution to a travelling shard's gradient starts from zero in
      // its own slot, so the compute need not wait for the partial sum in flight.
      if (t > 0)
        for (int i = 0; i < static_cast<int>(items_.size()); ++i)
          if (items_[i].accumulated) zero(i, t);
      for (const BlockTask& b : st.blocks) compute(st, b, t);
      // The compute is synchronized before any wait, so that a wait's time is only the
      // communication the compute did not hide (§7.4).
      e_.synchronize();
      // Partial sum + this step's contribution, in that fixed order: the sum sent on at t + 1.
      for (auto& [m, q] : sums) {
        q->wait();
        add_to(at(m.tensor.c_str(), t), m);
      }
      if (!sums.empty()) e_.synchronize();
      sums.clear();
      c_.batch([&] {
        for (const Message& m : st.recvs) {
          if (!m.after_compute) continue;
          if (items_[m.item].accumulated) {  // the last hop: the shard's sum of every other rank
            if (t != G - 1) fail("partial sum ", m.tensor, " received after step ", t, " of ", G, ": only the last");
            sums.emplace_back(m, c_.irecv(sum_in_[m.item].data, bytes(m), m.peer, m.tag, m.tensor.c_str()));
            continue;
          }
          recv(m, t, reqs);
        }
        send(true);  // the last partial sums, home
      });
      wait_all(reqs);
      // Home = own contribution (step 0) + the sum of the others.
      for (auto& [m, q] : sums) {
        q->wait();
        add_to(home_.at(m.tensor), m);
      }
      if (!sums.empty()) e_.synchronize();
      sums.clear();
      // Prefetched hops landing at step t + 1 (both the receive and the send whose slot the
      // next round reuses) must be complete before it.
      std::vector<RequestPtr> due;
      for (auto& f : in_flight)
        if (f.second && f.first <= t + 1) due.push_back(std::move(f.second));
      wait_all(due);
    }
  }

  // An ordinary hop of a read-only tensor lands in the slot of step t + 1.
  void recv(const Message& m, int t, std::vector<RequestPtr>& reqs) {
    if (t == s_.G - 1) fail("read-only ", m.tensor, " received at the last step ", t);
    reqs.push_back(c_.irecv(slots_[m.item][(t + 1) % 2].data, m.elems * width(items_[m.item]), m.peer, m.tag,
                            m.tensor.c_str()));
  }
  // Accumulated item i's slot of step t set to zero over the step's shard.
  void zero(int i, int t) {
    const Item& it = items_[i];
    const RankStep& st = s_.steps[r_][t];
    const int64_t n = it.q_side ? q_elems(qp_.local_size(st.q_shard), it.per_row) : kv_elems(kp_.local_size(st.k_shard));
    fill(e_, static_cast<A*>(at(it.name, t)), n, 0.0);
  }
  // dst += the partial sum of message m (in sum_in_), element by element on the engine.
  void add_to(void* dst, const Message& m) {
    add(e_, static_cast<A*>(dst), static_cast<const A*>(static_cast<const void*>(sum_in_[m.item].data)), m.elems);
  }

  [[gnu::always_inline]] void compute(const RankStep& st, const BlockTask& b, int t) {
    const int64_t B = p_.B, Hq = p_.H_q, Hkv = p_.H_kv, d = p_.d;
    const Chunk& qc = qp_.chunks[b.q_chunk];
    const Chunk& kc = kp_.chunks[b.k_chunk];
    const int64_t nq = qp_.local_size(st.q_shard), nk = kp_.local_size(st.k_shard);
    // Views of tensor `name` at step t, elements of type decltype(u): q side (B, H_q, q chunk, d),
    // kv side (B, H_kv, kv chunk, d), row statistics (B, H_q, q chunk).
    auto qv = [&](auto u, const char* name) {
      using U = decltype(u);
      return slice_rows(bhsd<U>(at<U>(name, t), B, Hq, nq, d), qc.local_start, qc.n);
    };
    auto kv = [&](auto u, const char* name) {
      using U = decltype(u);
      return slice_rows(bhsd<U>(at<U>(name, t), B, Hkv, nk, d), kc.local_start, kc.n);
    };
    auto qr = [&](const char* name) { return slice_rows(view3<A>(at<A>(name, t), B, Hq, nq), qc.local_start, qc.n); };
    const Positions qpos = qp_.chunk_positions(b.q_chunk), kpos = kp_.chunk_positions(b.k_chunk);
    if (s_.phase == Phase::Forward) {  // merged into the home (O, LSE) in step order, eq. (4.5)
      e_.forward_block(p_, m_, qpos, kpos, as_const(qv(T{}, "Q")), as_const(kv(T{}, "K")), as_const(kv(T{}, "V")),
                       qv(T{}, "O"), qr("LSE"), true);
    } else {
      e_.backward_block(p_, m_, qpos, kpos, as_const(qv(T{}, "Q")), as_const(kv(T{}, "K")), as_const(kv(T{}, "V")),
                        as_const(qv(T{}, "dO")), as_const(qr("LSE")), as_const(qr("D")), qv(A{}, "dQ"),
                        kv(A{}, "dK"), kv(A{}, "dV"));
    }
  }

  const Schedule& s_;
  Communicator& c_;
  Engine<T>& e_;
  const Problem& p_;
  const PreparedMask& m_;
  const Partition& qp_;
  const Partition& kp_;
  Shard<T>& x_;
  const std::vector<Item>& items_;
  int r_ = 0;
  Buffer<A> D_;
  std::map<std::string, void*> home_;
  std::vector<std::vector<Bytes>> slots_;
  std::vector<Bytes> sum_in_;  // [item] an accumulated item's arriving partial sum (else empty)
  std::vector<std::vector<Bytes>> islots_;  // [item] the two inter-node slots (double ring prefetch)
  std::vector<std::map<int, int>> landed_;      // [item] landing step -> inter-node slot
};

void check_schedule(const Schedule& s, Phase want) {
  if (s.phase != want)
    fail("schedule phase (", to_string(s.phase), ") must be ", to_string(want), " for this executor");
}

}  // namespace

template <class T>
void run_ring(const Schedule& s, Communicator& comm, Engine<T>& engine, const Problem& p, const PreparedMask& mask,
              const Partition& qp, const Partition& kp, Shard<T>& shard) {
  RingRun<T>(s, comm, engine, p, mask, qp, kp, shard).execute();
}

template <class T>
void ring_pass(Phase phase, const Plan& plan, Communicator& comm, Engine<T>& engine, const PreparedMask& mask,
               Shard<T>& shard) {
  const Schedule& s = phase == Phase::Forward ? plan.fwd : plan.bwd;
  check_schedule(s, phase);
  RingRun<T>(s, comm, engine, plan.p, mask, plan.qp, plan.kp, shard).execute();
}

#define BURSTLAB_RING_INST(T)                                                                              \
  template void run_ring<T>(const Schedule&, Communicator&, Engine<T>&, const Problem&, const PreparedMask&, \
                            const Partition&, const Partition&, Shard<T>&);                                  \
  template void ring_pass<T>(Phase, const Plan&, Communicator&, Engine<T>&, const PreparedMask&, Shard<T>&);
BURSTLAB_RING_INST(float)
BURSTLAB_RING_INST(double)
BURSTLAB_RING_INST(bf16_t)
BURSTLAB_RING_INST(f16_t)
#undef BURSTLAB_RING_INST

}  // namespace burstlab::dist
