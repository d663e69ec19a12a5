// distributed/distflash.cpp — spec §7.12.
#include "distflash.hpp"

#include <limits>

#include "burstlab/error.hpp"
#include "shard_ops.hpp"

namespace burstlab::dist {

FlashSchedule make_distflash_schedule(int P) {
  if (P < 1) fail("world size P (", P, ") must be >= 1");
  FlashSchedule s;
  s.P = P;
  const int S = P / 2;
  s.steps.assign(P, std::vector<FlashStep>(S + 1));
  for (int r = 0; r < P; ++r) s.steps[r][0] = FlashStep{FlashRole::Owner, r, r, -1, -1};
  for (int t = 1; t <= S; ++t) {
    const bool extra = t < P - t;  // the distance P - t differs from t: helpers take it
    for (int a = 0; a < P; ++a) {
      if (a >= t) {  // owner of (a, a - t)
        FlashStep& st = s.steps[a][t];
        st.role = FlashRole::Owner;
        st.q = a;
        st.k = a - t;
        s.steps[a - t][t].kv_dst = a;
      }
      if (extra && a >= P - t) {  // (a, a + t - P): helper h = a + t - P < t
        const int h = a + t - P;
        FlashStep& st = s.steps[h][t];
        st.role = FlashRole::Helper;
        st.q = a;
        st.k = h;
        s.steps[a][t].q_dst = h;
      }
    }
  }
  return s;
}

double distflash_idle_fraction(const FlashSchedule& s) {
  int64_t idle = 0;
  for (const auto& rank : s.steps)
    for (const FlashStep& st : rank) idle += st.role == FlashRole::Idle ? 1 : 0;
  return double(idle) / (double(s.P) * double(s.P));
}

void check_distflash(const MaskData& mask, const Partition& qp, const Partition& kp) {
  if (qp.kind != PartitionKind::Contiguous || kp.kind != PartitionKind::Contiguous)
    fail("distflash needs the contiguous partition, not ", to_string(qp.kind),
         ": its balance comes from moving whole causal blocks");
  const MaskParams m = mask.params();
  for (int a = 0; a < qp.G; ++a)
    for (int b = a + 1; b < kp.G; ++b)
      if (visible_in(m, qp.chunks[qp.rank_chunks[a][0]], kp.chunks[kp.rank_chunks[b][0]]) > 0)
        fail("distflash needs a causal-type mask: queries of rank ", a, " see keys of the later rank ", b,
             " (use ring, burst or allgather for this mask)");
}

namespace {

template <class T>
struct Flash {
  Communicator& c;
  Engine<T>& e;
  const Problem& p;
  const Partition& qp;
  const Partition& kp;
  Shard<T>& x;
  int r;
  int64_t B, Hq, Hkv, d, eb = sizeof(T), ab = sizeof(acc_t<T>);  // bytes of T and of A

  // Throws Error unless the schedule is for this world (the mask was checked with
  // check_distflash when the session was set up); sizes the phase's outputs.
  Flash(Phase phase, Communicator& c_, Engine<T>& e_, const Problem& p_, const FlashSchedule& s,
        const Partition& qp_, const Partition& kp_, Shard<T>& x_)
      : c(c_), e(e_), p(p_), qp(qp_), kp(kp_), x(x_), r(c_.rank()), B(p_.B), Hq(p_.H_q), Hkv(p_.H_kv), d(p_.d) {
    if (s.P != c.size()) fail("distflash schedule P (", s.P, ") must equal the world size (", c.size(), ")");
    if (phase == Phase::Forward) prepare_forward(e, p, qp, kp, r, x);
    else prepare_backward(e, p, qp, kp, r, x);
  }
  int64_t nq(int s) const { return qp.local_size(s); }
  int64_t nk(int s) const { return kp.local_size(s); }
  Positions qpos(int s) const { return qp.chunk_positions(qp.rank_chunks[s][0]); }
  Positions kpos(int s) const { return kp.chunk_positions(kp.rank_chunks[s][0]); }
};

int tag(int t, int k) { return t * 16 + k; }

}  // namespace

template <class T>
void distflash_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask,
                       const FlashSchedule& s, const Partition& qp, const Partition& kp, Shard<T>& x) {
  Flash<T> f(Phase::Forward, comm, e, p, s, qp, kp, x);
  fill(e, x.O.data, x.O.n, 0.0);  // the merge identity (§4.3)
  fill(e, x.LSE.data, x.LSE.n, -std::numeric_limits<double>::infinity());
  using A = acc_t<T>;
  const int r = f.r;
  const int64_t B = f.B, Hq = f.Hq, Hkv = f.Hkv, d = f.d, eb = f.eb, ab = f.ab;
  const int64_t mq = qp.max_local_size(), mk = kp.max_local_size();
  Buffer<T> Oh = alloc<T>(e, B * Hq * mq * d);    // helper's partial (sent)
  Buffer<A> Lh = alloc<A>(e, B * Hq * mq);
  Buffer<T> Orv = alloc<T>(e, B * Hq * mq * d);   // helper's partial (received)
  Buffer<A> Lrv = alloc<A>(e, B * Hq * mq);
  Buffer<T> Kr = alloc<T>(e, B * Hkv * mk * d), Vr = alloc<T>(e, B * Hkv * mk * d), Qr = alloc<T>(e, B * Hq * mq * d);
  const int64_t nqr = x.n_q;
  for (size_t t = 0; t < s.steps[r].size(); ++t) {
    comm.set_context(Phase::Forward, static_cast<int>(t));
    const FlashStep& st = s.steps[r][t];
    std::vector<RequestPtr> in, out, res;  // after the buffers: destroyed (cancelled) first
    const int T_ = static_cast<int>(t);
    comm.batch([&] {  // this step's fetches and hand-offs: one group
      if (st.role == FlashRole::Owner && st.k != r) {
        in.push_back(comm.irecv(Kr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 0), "K"));
        in.push_back(comm.irecv(Vr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 1), "V"));
      }
      if (st.role == FlashRole::Helper) in.push_back(comm.irecv(Qr.data, B * Hq * f.nq(st.q) * d * eb, st.q, tag(T_, 2), "Q"));
      if (st.q_dst >= 0) out.push_back(comm.isend(x.Q.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 2), "Q"));
      if (st.kv_dst >= 0) {
        out.push_back(comm.isend(x.K.data, B * Hkv * x.n_k * d * eb, st.kv_dst, tag(T_, 0), "K"));
        out.push_back(comm.isend(x.V.data, B * Hkv * x.n_k * d * eb, st.kv_dst, tag(T_, 1), "V"));
      }
    });
    wait_all(in);
    if (st.role == FlashRole::Owner) {  // (r, k): own queries, K, V home (t = 0) or fetched
      const bool home = st.k == r;
      const int64_t n = f.nk(st.k);
      e.forward_block(p, mask, f.qpos(r), f.kpos(st.k), as_const(bhsd<T>(x.Q.data, B, Hq, nqr, d)),
                      as_const(bhsd<T>(home ? x.K.data : Kr.data, B, Hkv, n, d)),
                      as_const(bhsd<T>(home ? x.V.data : Vr.data, B, Hkv, n, d)), bhsd<T>(x.O.data, B, Hq, nqr, d),
                      view3<A>(x.LSE.data, B, Hq, nqr), true);  // §6.1, merged into (O, LSE) (4.5)
    } else if (st.role == FlashRole::Helper) {  // (q, r): the owner's queries, own K, V
      const int64_t n = f.nq(st.q);
      e.forward_block(p, mask, f.qpos(st.q), f.kpos(r), as_const(bhsd<T>(Qr.data, B, Hq, n, d)),
                      as_const(bhsd<T>(x.K.data, B, Hkv, x.n_k, d)), as_const(bhsd<T>(x.V.data, B, Hkv, x.n_k, d)),
                      bhsd<T>(Oh.data, B, Hq, n, d), view3<A>(Lh.data, B, Hq, n), false);
      e.synchronize();
    }
    // Results after the compute, on both sides: the helper's partial goes out, ours comes in
    // (a receive in the first batch would pair with a later group of the helper, §7.4).
    comm.batch([&] {
      if (st.role == FlashRole::Helper) {
        const int64_t n = f.nq(st.q);
        out.push_back(comm.isend(Oh.data, B * Hq * n * d * eb, st.q, tag(T_, 3), "O"));
        out.push_back(comm.isend(Lh.data, B * Hq * n * ab, st.q, tag(T_, 4), "LSE"));
      }
      if (st.q_dst >= 0) {
        res.push_back(comm.irecv(Orv.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 3), "O"));
        res.push_back(comm.irecv(Lrv.data, B * Hq * nqr * ab, st.q_dst, tag(T_, 4), "LSE"));
      }
    });
    if (!res.empty()) {
      wait_all(res);  // the helper's partial of our queries: merged after our own block (4.5)
      e.merge(bhsd<T>(x.O.data, B, Hq, nqr, d), view3<A>(x.LSE.data, B, Hq, nqr),
              as_const(bhsd<T>(Orv.data, B, Hq, nqr, d)), as_const(view3<A>(Lrv.data, B, Hq, nqr)));
    }
    e.synchronize();
    wait_all(out);
  }
}

template <class T>
void distflash_backward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask,
                        const FlashSchedule& s, const Partition& qp, const Partition& kp, Shard<T>& x) {
  Flash<T> f(Phase::Backward, comm, e, p, s, qp, kp, x);
  using A = acc_t<T>;
  const int r = f.r;
  const int64_t B = f.B, Hq = f.Hq, Hkv = f.Hkv, d = f.d, eb = f.eb, ab = f.ab;
  const int64_t nqr = x.n_q, nkr = x.n_k;
  fill(e, x.dQ.data, x.dQ.n, 0.0);
  fill(e, x.dK.data, x.dK.n, 0.0);
  fill(e, x.dV.data, x.dV.n, 0.0);
  const Buffer<A> D = home_D(e, p, x);  // eq. (5.1) at home
  const int64_t mq = qp.max_local_size(), mk = kp.max_local_size();
  Buffer<T> Kr = alloc<T>(e, B * Hkv * mk * d), Vr = alloc<T>(e, B * Hkv * mk * d);       // owner: fetched K, V
  Buffer<A> dKp = alloc<A>(e, B * Hkv * mk * d), dVp = alloc<A>(e, B * Hkv * mk * d);     // owner: their partials
  Buffer<T> Qr = alloc<T>(e, B * Hq * mq * d), dOr = alloc<T>(e, B * Hq * mq * d);        // helper: fetched q side
  Buffer<A> Lr = alloc<A>(e, B * Hq * mq), Dr = alloc<A>(e, B * Hq * mq), dQp = alloc<A>(e, B * Hq * mq * d);
  Buffer<A> dKin = alloc<A>(e, B * Hkv * nkr * d), dVin = alloc<A>(e, B * Hkv * nkr * d), dQin = alloc<A>(e, B * Hq * nqr * d);
  for (size_t t = 0; t < s.steps[r].size(); ++t) {
    comm.set_context(Phase::Backward, static_cast<int>(t));
    const FlashStep& st = s.steps[r][t];
    const int T_ = static_cast<int>(t);
    std::vector<RequestPtr> in, out, res;
    comm.batch([&] {  // this step's fetches and hand-offs: one group
      if (st.role == FlashRole::Owner && st.k != r) {
        in.push_back(comm.irecv(Kr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 0), "K"));
        in.push_back(comm.irecv(Vr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 1), "V"));
      }
      if (st.role == FlashRole::Helper) {
        const int64_t n = f.nq(st.q);
        in.push_back(comm.irecv(Qr.data, B * Hq * n * d * eb, st.q, tag(T_, 2), "Q"));
        in.push_back(comm.irecv(dOr.data, B * Hq * n * d * eb, st.q, tag(T_, 5), "dO"));
        in.push_back(comm.irecv(Lr.data, B * Hq * n * ab, st.q, tag(T_, 6), "LSE"));
        in.push_back(comm.irecv(Dr.data, B * Hq * n * ab, st.q, tag(T_, 7), "D"));
      }
      if (st.kv_dst >= 0) {
        out.push_back(comm.isend(x.K.data, B * Hkv * nkr * d * eb, st.kv_dst, tag(T_, 0), "K"));
        out.push_back(comm.isend(x.V.data, B * Hkv * nkr * d * eb, st.kv_dst, tag(T_, 1), "V"));
      }
      if (st.q_dst >= 0) {
        out.push_back(comm.isend(x.Q.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 2), "Q"));
        out.push_back(comm.isend(x.dO.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 5), "dO"));
        out.push_back(comm.isend(x.LSE.data, B * Hq * nqr * ab, st.q_dst, tag(T_, 6), "LSE"));
        out.push_back(comm.isend(D.data, B * Hq * nqr * ab, st.q_dst, tag(T_, 7), "D"));
      }
    });
    wait_all(in);
    if (st.role == FlashRole::Owner) {
      const bool home = st.k == r;
      const int64_t n = f.nk(st.k);
      A* dK = home ? x.dK.data : dKp.data;
      A* dV = home ? x.dV.data : dVp.data;
      if (!home) {
        fill(e, dKp.data, B * Hkv * n * d, 0.0);
        fill(e, dVp.data, B * Hkv * n * d, 0.0);
      }
      e.backward_block(p, mask, f.qpos(r), f.kpos(st.k), as_const(bhsd<T>(x.Q.data, B, Hq, nqr, d)),
                       as_const(bhsd<T>(home ? x.K.data : Kr.data, B, Hkv, n, d)),
                       as_const(bhsd<T>(home ? x.V.data : Vr.data, B, Hkv, n, d)),
                       as_const(bhsd<T>(x.dO.data, B, Hq, nqr, d)), as_const(view3<A>(x.LSE.data, B, Hq, nqr)),
                       as_const(view3<A>(D.data, B, Hq, nqr)), bhsd<A>(x.dQ.data, B, Hq, nqr, d),
                       bhsd<A>(dK, B, Hkv, n, d), bhsd<A>(dV, B, Hkv, n, d));  // §6.2
      e.synchronize();
    } else if (st.role == FlashRole::Helper) {
      const int64_t n = f.nq(st.q);
      fill(e, dQp.data, B * Hq * n * d, 0.0);
      e.backward_block(p, mask, f.qpos(st.q), f.kpos(r), as_const(bhsd<T>(Qr.data, B, Hq, n, d)),
                       as_const(bhsd<T>(x.K.data, B, Hkv, nkr, d)), as_const(bhsd<T>(x.V.data, B, Hkv, nkr, d)),
                       as_const(bhsd<T>(dOr.data, B, Hq, n, d)), as_const(view3<A>(Lr.data, B, Hq, n)),
                       as_const(view3<A>(Dr.data, B, Hq, n)), bhsd<A>(dQp.data, B, Hq, n, d),
                       bhsd<A>(x.dK.data, B, Hkv, nkr, d), bhsd<A>(x.dV.data, B, Hkv, nkr, d));
      e.synchronize();
    }
    comm.batch([&] {  // results after the compute, on both sides (as in the forward)
      if (st.role == FlashRole::Owner && st.k != r) {
        const int64_t n = f.nk(st.k);
        out.push_back(comm.isend(dKp.data, B * Hkv * n * d * ab, st.k, tag(T_, 9), "dK"));
        out.push_back(comm.isend(dVp.data, B * Hkv * n * d * ab, st.k, tag(T_, 10), "dV"));
      }
      if (st.role == FlashRole::Helper)
        out.push_back(comm.isend(dQp.data, B * Hq * f.nq(st.q) * d * ab, st.q, tag(T_, 8), "dQ"));
      if (st.kv_dst >= 0) {
        res.push_back(comm.irecv(dKin.data, B * Hkv * nkr * d * ab, st.kv_dst, tag(T_, 9), "dK"));
        res.push_back(comm.irecv(dVin.data, B * Hkv * nkr * d * ab, st.kv_dst, tag(T_, 10), "dV"));
      }
      if (st.q_dst >= 0) res.push_back(comm.irecv(dQin.data, B * Hq * nqr * d * ab, st.q_dst, tag(T_, 8), "dQ"));
    });
    wait_all(res);  // partials of our rows, added in a fixed order: dK, dV then dQ
    if (st.kv_dst >= 0) {
      add(e, x.dK.data, dKin.data, B * Hkv * nkr * d);
      add(e, x.dV.data, dVin.data, B * Hkv * nkr * d);
    }
    if (st.q_dst >= 0) add(e, x.dQ.data, dQin.data, B * Hq * nqr * d);
    e.synchronize();
    wait_all(out);
  }
}

int64_t distflash_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r, bool sent,
                        ElemBytes w) {
  const int P = qp.G, S = P / 2;
  const int64_t B = p.B, Hq = p.H_q, Hkv = p.H_kv, d = p.d, t_ = w.t, a_ = w.a;
  const bool bwd = phase == Phase::Backward;
  // Bytes per row (T for Q, K, V, O, dO; A for LSE, D, dQ, dK, dV; t = a gives (7.24)-(7.25)).
  const int64_t q_out = bwd ? 2 * d * t_ + 2 * a_ : d * t_;  // Q (, dO, LSE, D) to a helper
  const int64_t q_back = bwd ? d * a_ : d * t_ + a_;         // (O, LSE) or dQ back to the owner
  const int64_t kv_out = 2 * d * t_, kv_back = 2 * d * a_;   // K, V out; the dK, dV partial back
  int64_t e = 0;
  for (int t = 1; t <= S; ++t) {
    const bool extra = t < P - t;
    // K, V: rank r sends to r + t when r + t < P; receives from r - t when r >= t. Backward:
    // the dK, dV partial goes the other way.
    if (r + t < P) e += (sent ? kv_out : (bwd ? kv_back : 0)) * Hkv * kp.local_size(r);
    if (r >= t) e += (sent ? (bwd ? kv_back : 0) : kv_out) * Hkv * kp.local_size(r - t);
    // Helper pairs: r >= P - t sends its q side to r + t - P and gets the partial back; r < t
    // (helper) receives the q side of r + P - t and sends the partial.
    if (extra && r >= P - t) e += Hq * qp.local_size(r) * (sent ? q_out : q_back);
    if (extra && r < t) e += Hq * qp.local_size(r + P - t) * (sent ? q_back : q_out);
  }
  return B * e;  // (7.24) forward, (7.25) backward
}

template <class T>
void run_distflash(Phase phase, Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask,
                   const FlashSchedule& s, const Partition& qp, const Partition& kp, Shard<T>& x) {
  if (phase == Phase::Forward) distflash_forward(comm, e, p, mask, s, qp, kp, x);
  else distflash_backward(comm, e, p, mask, s, qp, kp, x);
}

#define BURSTLAB_FLASH_INST(T)                                                                                 \
  template void run_distflash<T>(Phase, Communicator&, Engine<T>&, const Problem&, const PreparedMask&,          \
                                 const FlashSchedule&, const Partition&, const Partition&, Shard<T>&);
BURSTLAB_FOR_EACH_STORAGE(BURSTLAB_FLASH_INST)
#undef BURSTLAB_FLASH_INST

}  // namespace burstlab::dist
