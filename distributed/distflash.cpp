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
  const MaskData& m;
  const Partition& qp;
  const Partition& kp;
  Shard<T>& x;
  int r;
  int64_t B, Hq, Hkv, d, eb = sizeof(T);

  // Throws Error unless the schedule is for this world and check_distflash passes.
  Flash(Communicator& c_, Engine<T>& e_, const Problem& p_, const MaskData& m_, const FlashSchedule& s,
        const Partition& qp_, const Partition& kp_, Shard<T>& x_)
      : c(c_), e(e_), p(p_), m(m_), qp(qp_), kp(kp_), x(x_), r(c_.rank()), B(p_.B), Hq(p_.H_q), Hkv(p_.H_kv),
        d(p_.d) {
    if (s.P != c.size()) fail("distflash schedule P (", s.P, ") must equal the world size (", c.size(), ")");
    check_distflash(m, qp, kp);
  }
  int64_t nq(int s) const { return qp.local_size(s); }
  int64_t nk(int s) const { return kp.local_size(s); }
  Positions qpos(int s) const { return qp.chunk_positions(qp.rank_chunks[s][0]); }
  Positions kpos(int s) const { return kp.chunk_positions(kp.rank_chunks[s][0]); }
};

int tag(int t, int k) { return t * 16 + k; }

}  // namespace

template <class T>
void distflash_forward(Communicator& comm, Engine<T>& e, const Problem& p, const MaskData& mask,
                       const FlashSchedule& s, const Partition& qp, const Partition& kp, Shard<T>& x) {
  Flash<T> f(comm, e, p, mask, s, qp, kp, x);
  const int r = f.r;
  const int64_t B = f.B, Hq = f.Hq, Hkv = f.Hkv, d = f.d, eb = f.eb;
  prepare_forward(e, p, qp, kp, r, x);
  e.fill(x.O.data, x.O.n, T(0));  // the merge identity (§4.3)
  e.fill(x.LSE.data, x.LSE.n, -std::numeric_limits<T>::infinity());
  const int64_t mq = qp.max_local_size(), mk = kp.max_local_size();
  Buffer<T> Op = e.alloc(B * Hq * mq * d), Lp = e.alloc(B * Hq * mq);      // own block's partial
  Buffer<T> Oh = e.alloc(B * Hq * mq * d), Lh = e.alloc(B * Hq * mq);      // helper's partial (sent)
  Buffer<T> Orv = e.alloc(B * Hq * mq * d), Lrv = e.alloc(B * Hq * mq);    // helper's partial (received)
  Buffer<T> Kr = e.alloc(B * Hkv * mk * d), Vr = e.alloc(B * Hkv * mk * d), Qr = e.alloc(B * Hq * mq * d);
  const int64_t nqr = x.n_q;
  auto own_merge = [&](int64_t n) {
    e.merge(bhsd<T>(x.O.data, B, Hq, nqr, d), view3<T>(x.LSE.data, B, Hq, nqr),
            as_const(bhsd<T>(Op.data, B, Hq, n, d)), as_const(view3<T>(Lp.data, B, Hq, n)));
  };
  for (size_t t = 0; t < s.steps[r].size(); ++t) {
    comm.set_context(Phase::Forward, static_cast<int>(t));
    const FlashStep& st = s.steps[r][t];
    std::vector<RequestPtr> in, out, res;  // after the buffers: destroyed (cancelled) first
    const int T_ = static_cast<int>(t);
    if (st.role == FlashRole::Owner && st.k != r) {
      in.push_back(comm.irecv(Kr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 0), "K"));
      in.push_back(comm.irecv(Vr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 1), "V"));
    }
    if (st.role == FlashRole::Helper) in.push_back(comm.irecv(Qr.data, B * Hq * f.nq(st.q) * d * eb, st.q, tag(T_, 2), "Q"));
    if (st.q_dst >= 0) {
      res.push_back(comm.irecv(Orv.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 3), "O"));
      res.push_back(comm.irecv(Lrv.data, B * Hq * nqr * eb, st.q_dst, tag(T_, 4), "LSE"));
      out.push_back(comm.isend(x.Q.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 2), "Q"));
    }
    if (st.kv_dst >= 0) {
      out.push_back(comm.isend(x.K.data, B * Hkv * x.n_k * d * eb, st.kv_dst, tag(T_, 0), "K"));
      out.push_back(comm.isend(x.V.data, B * Hkv * x.n_k * d * eb, st.kv_dst, tag(T_, 1), "V"));
    }
    wait_all(in);
    if (st.role == FlashRole::Owner) {  // (r, k): own queries, K, V home (t = 0) or fetched
      const bool home = st.k == r;
      const int64_t n = f.nk(st.k);
      e.forward_block(p, mask, f.qpos(r), f.kpos(st.k), as_const(bhsd<T>(x.Q.data, B, Hq, nqr, d)),
                      as_const(bhsd<T>(home ? x.K.data : Kr.data, B, Hkv, n, d)),
                      as_const(bhsd<T>(home ? x.V.data : Vr.data, B, Hkv, n, d)), bhsd<T>(Op.data, B, Hq, nqr, d),
                      view3<T>(Lp.data, B, Hq, nqr));  // §6.1
      own_merge(nqr);
    } else if (st.role == FlashRole::Helper) {  // (q, r): the owner's queries, own K, V
      const int64_t n = f.nq(st.q);
      e.forward_block(p, mask, f.qpos(st.q), f.kpos(r), as_const(bhsd<T>(Qr.data, B, Hq, n, d)),
                      as_const(bhsd<T>(x.K.data, B, Hkv, x.n_k, d)), as_const(bhsd<T>(x.V.data, B, Hkv, x.n_k, d)),
                      bhsd<T>(Oh.data, B, Hq, n, d), view3<T>(Lh.data, B, Hq, n));
      e.synchronize();
      out.push_back(comm.isend(Oh.data, B * Hq * n * d * eb, st.q, tag(T_, 3), "O"));
      out.push_back(comm.isend(Lh.data, B * Hq * n * eb, st.q, tag(T_, 4), "LSE"));
    }
    if (!res.empty()) {
      wait_all(res);  // the helper's partial of our queries: merged after our own block (4.5)
      e.merge(bhsd<T>(x.O.data, B, Hq, nqr, d), view3<T>(x.LSE.data, B, Hq, nqr),
              as_const(bhsd<T>(Orv.data, B, Hq, nqr, d)), as_const(view3<T>(Lrv.data, B, Hq, nqr)));
    }
    wait_all(out);
  }
}

template <class T>
void distflash_backward(Communicator& comm, Engine<T>& e, const Problem& p, const MaskData& mask,
                        const FlashSchedule& s, const Partition& qp, const Partition& kp, Shard<T>& x) {
  Flash<T> f(comm, e, p, mask, s, qp, kp, x);
  const int r = f.r;
  const int64_t B = f.B, Hq = f.Hq, Hkv = f.Hkv, d = f.d, eb = f.eb;
  prepare_backward(e, p, qp, kp, r, x);
  const int64_t nqr = x.n_q, nkr = x.n_k;
  e.fill(x.dQ.data, x.dQ.n, T(0));
  e.fill(x.dK.data, x.dK.n, T(0));
  e.fill(x.dV.data, x.dV.n, T(0));
  const Buffer<T> D = home_D(e, p, x);  // eq. (5.1) at home
  const int64_t mq = qp.max_local_size(), mk = kp.max_local_size();
  Buffer<T> Kr = e.alloc(B * Hkv * mk * d), Vr = e.alloc(B * Hkv * mk * d);             // owner: fetched K, V
  Buffer<T> dKp = e.alloc(B * Hkv * mk * d), dVp = e.alloc(B * Hkv * mk * d);           // owner: their partials
  Buffer<T> Qr = e.alloc(B * Hq * mq * d), dOr = e.alloc(B * Hq * mq * d), Lr = e.alloc(B * Hq * mq),
            Dr = e.alloc(B * Hq * mq), dQp = e.alloc(B * Hq * mq * d);                  // helper: fetched q side
  Buffer<T> dKin = e.alloc(B * Hkv * nkr * d), dVin = e.alloc(B * Hkv * nkr * d), dQin = e.alloc(B * Hq * nqr * d);
  for (size_t t = 0; t < s.steps[r].size(); ++t) {
    comm.set_context(Phase::Backward, static_cast<int>(t));
    const FlashStep& st = s.steps[r][t];
    const int T_ = static_cast<int>(t);
    std::vector<RequestPtr> in, out, res;
    if (st.role == FlashRole::Owner && st.k != r) {
      in.push_back(comm.irecv(Kr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 0), "K"));
      in.push_back(comm.irecv(Vr.data, B * Hkv * f.nk(st.k) * d * eb, st.k, tag(T_, 1), "V"));
    }
    if (st.role == FlashRole::Helper) {
      const int64_t n = f.nq(st.q);
      in.push_back(comm.irecv(Qr.data, B * Hq * n * d * eb, st.q, tag(T_, 2), "Q"));
      in.push_back(comm.irecv(dOr.data, B * Hq * n * d * eb, st.q, tag(T_, 5), "dO"));
      in.push_back(comm.irecv(Lr.data, B * Hq * n * eb, st.q, tag(T_, 6), "LSE"));
      in.push_back(comm.irecv(Dr.data, B * Hq * n * eb, st.q, tag(T_, 7), "D"));
    }
    if (st.kv_dst >= 0) {
      out.push_back(comm.isend(x.K.data, B * Hkv * nkr * d * eb, st.kv_dst, tag(T_, 0), "K"));
      out.push_back(comm.isend(x.V.data, B * Hkv * nkr * d * eb, st.kv_dst, tag(T_, 1), "V"));
      res.push_back(comm.irecv(dKin.data, B * Hkv * nkr * d * eb, st.kv_dst, tag(T_, 9), "dK"));
      res.push_back(comm.irecv(dVin.data, B * Hkv * nkr * d * eb, st.kv_dst, tag(T_, 10), "dV"));
    }
    if (st.q_dst >= 0) {
      out.push_back(comm.isend(x.Q.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 2), "Q"));
      out.push_back(comm.isend(x.dO.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 5), "dO"));
      out.push_back(comm.isend(x.LSE.data, B * Hq * nqr * eb, st.q_dst, tag(T_, 6), "LSE"));
      out.push_back(comm.isend(D.data, B * Hq * nqr * eb, st.q_dst, tag(T_, 7), "D"));
      res.push_back(comm.irecv(dQin.data, B * Hq * nqr * d * eb, st.q_dst, tag(T_, 8), "dQ"));
    }
    wait_all(in);
    if (st.role == FlashRole::Owner) {
      const bool home = st.k == r;
      const int64_t n = f.nk(st.k);
      T* dK = home ? x.dK.data : dKp.data;
      T* dV = home ? x.dV.data : dVp.data;
      if (!home) {
        e.fill(dKp.data, B * Hkv * n * d, T(0));
        e.fill(dVp.data, B * Hkv * n * d, T(0));
      }
      e.backward_block(p, mask, f.qpos(r), f.kpos(st.k), as_const(bhsd<T>(x.Q.data, B, Hq, nqr, d)),
                       as_const(bhsd<T>(home ? x.K.data : Kr.data, B, Hkv, n, d)),
                       as_const(bhsd<T>(home ? x.V.data : Vr.data, B, Hkv, n, d)),
                       as_const(bhsd<T>(x.dO.data, B, Hq, nqr, d)), as_const(view3<T>(x.LSE.data, B, Hq, nqr)),
                       as_const(view3<T>(D.data, B, Hq, nqr)), bhsd<T>(x.dQ.data, B, Hq, nqr, d),
                       bhsd<T>(dK, B, Hkv, n, d), bhsd<T>(dV, B, Hkv, n, d));  // §6.2
      e.synchronize();
      if (!home) {
        out.push_back(comm.isend(dKp.data, B * Hkv * n * d * eb, st.k, tag(T_, 9), "dK"));
        out.push_back(comm.isend(dVp.data, B * Hkv * n * d * eb, st.k, tag(T_, 10), "dV"));
      }
    } else if (st.role == FlashRole::Helper) {
      const int64_t n = f.nq(st.q);
      e.fill(dQp.data, B * Hq * n * d, T(0));
      e.backward_block(p, mask, f.qpos(st.q), f.kpos(r), as_const(bhsd<T>(Qr.data, B, Hq, n, d)),
                       as_const(bhsd<T>(x.K.data, B, Hkv, nkr, d)), as_const(bhsd<T>(x.V.data, B, Hkv, nkr, d)),
                       as_const(bhsd<T>(dOr.data, B, Hq, n, d)), as_const(view3<T>(Lr.data, B, Hq, n)),
                       as_const(view3<T>(Dr.data, B, Hq, n)), bhsd<T>(dQp.data, B, Hq, n, d),
                       bhsd<T>(x.dK.data, B, Hkv, nkr, d), bhsd<T>(x.dV.data, B, Hkv, nkr, d));
      e.synchronize();
      out.push_back(comm.isend(dQp.data, B * Hq * n * d * eb, st.q, tag(T_, 8), "dQ"));
    }
    wait_all(res);  // partials of our rows, added in a fixed order: dK, dV then dQ
    if (st.kv_dst >= 0) {
      host_add(e, x.dK.data, dKin.data, B * Hkv * nkr * d);  // through the host: fixed order
      host_add(e, x.dV.data, dVin.data, B * Hkv * nkr * d);
    }
    if (st.q_dst >= 0) host_add(e, x.dQ.data, dQin.data, B * Hq * nqr * d);
    wait_all(out);
  }
}

int64_t distflash_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r, bool sent,
                        int64_t eb) {
  const int P = qp.G, S = P / 2;
  const int64_t B = p.B, Hq = p.H_q, Hkv = p.H_kv, d = p.d;
  const bool bwd = phase == Phase::Backward;
  const int64_t q_out = bwd ? 2 * d + 2 : d;  // Q (, dO, LSE, D) to a helper
  const int64_t q_back = bwd ? d : d + 1;     // (O, LSE) or dQ back to the owner
  int64_t e = 0;
  for (int t = 1; t <= S; ++t) {
    const bool extra = t < P - t;
    // K, V: rank r sends to r + t when r + t < P; receives from r - t when r >= t. Backward:
    // the dK, dV partial goes the other way.
    if (r + t < P) e += (sent ? 2 : (bwd ? 2 : 0)) * Hkv * d * kp.local_size(r);
    if (r >= t) e += (sent ? (bwd ? 2 : 0) : 2) * Hkv * d * kp.local_size(r - t);
    // Helper pairs: r >= P - t sends its q side to r + t - P and gets the partial back; r < t
    // (helper) receives the q side of r + P - t and sends the partial.
    if (extra && r >= P - t) e += Hq * qp.local_size(r) * (sent ? q_out : q_back);
    if (extra && r < t) e += Hq * qp.local_size(r + P - t) * (sent ? q_back : q_out);
  }
  return B * e * eb;  // (7.24) forward, (7.25) backward
}

#define BURSTLAB_FLASH_INST(T)                                                                                 \
  template void distflash_forward<T>(Communicator&, Engine<T>&, const Problem&, const MaskData&,               \
                                     const FlashSchedule&, const Partition&, const Partition&, Shard<T>&);       \
  template void distflash_backward<T>(Communicator&, Engine<T>&, const Problem&, const MaskData&,              \
                                      const FlashSchedule&, const Partition&, const Partition&, Shard<T>&);
BURSTLAB_FLASH_INST(float)
BURSTLAB_FLASH_INST(double)
#undef BURSTLAB_FLASH_INST

}  // namespace burstlab::dist
