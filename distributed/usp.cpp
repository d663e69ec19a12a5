// distributed/usp.cpp — spec §7.14.
#include "usp.hpp"

#include <vector>

#include "burstlab/error.hpp"
#include "shard_ops.hpp"

namespace burstlab::dist {

void check_usp(const Problem& p, int G, int u) {
  if (u < 1) fail("ulysses degree u (", u, ") must be >= 1");
  if (G % u != 0) fail("usp needs u | G: the ulysses degree u (", u, ") does not divide the world size G (", G, ")");
  if (p.H_q % u != 0) fail("usp needs u | H_q: H_q (", p.H_q, ") is not a multiple of the ulysses degree u (", u, ")");
  if (p.H_kv % u != 0)
    fail("usp needs u | H_kv: H_kv (", p.H_kv, ") is not a multiple of the ulysses degree u (", u,
         "); every rank must own whole kv heads of its query heads");
}

Partition usp_group_partition(const Partition& part, int u) {
  const int Gg = part.G / u;
  Partition g;
  g.kind = part.kind;
  g.G = Gg;
  g.N = part.N;
  g.rank_chunks.assign(Gg, {});
  g.positions.assign(Gg, {});
  g.owner_of.assign(static_cast<size_t>(part.N), 0);
  g.local_of.assign(static_cast<size_t>(part.N), 0);
  for (int grp = 0; grp < Gg; ++grp) {
    for (int m = 0; m < u; ++m) {
      const int r = grp * u + m;
      const int64_t off = static_cast<int64_t>(g.positions[grp].size());
      for (int c : part.rank_chunks[r]) {
        Chunk ch = part.chunks[c];
        ch.id = static_cast<int>(g.chunks.size());
        ch.rank = grp;
        ch.local_start += off;
        g.rank_chunks[grp].push_back(ch.id);
        g.chunks.push_back(ch);
      }
      g.positions[grp].insert(g.positions[grp].end(), part.positions[r].begin(), part.positions[r].end());
    }
    for (size_t l = 0; l < g.positions[grp].size(); ++l) {
      g.owner_of[g.positions[grp][l]] = grp;
      g.local_of[g.positions[grp][l]] = static_cast<int64_t>(l);
    }
  }
  return g;
}

Problem usp_head_problem(const Problem& p, int u) {
  Problem h = p;
  h.H_q = p.H_q / u;
  h.H_kv = p.H_kv / u;
  return h;
}

namespace {

constexpr int kRingTags = 1 << 16;  // the ring's tags live above the all-to-alls'

// The ring across groups as a Communicator: ring rank g is world rank g u + i (same member index
// i); transfers go through the world's communicator, logged there with the world's ranks, at
// world step = ring step + 1 (step 0 is the first all-to-all).
class GroupRing final : public ForwardingComm {
 public:
  GroupRing(Communicator& world, int u) : ForwardingComm(world), w_(world), u_(u), i_(world.rank() % u) {}
  int rank() const override { return w_.rank() / u_; }
  int size() const override { return w_.size() / u_; }
  Link link_to(int peer) const override { return w_.link_to(world_rank(peer)); }
  RequestPtr isend(const void* buf, int64_t bytes, int dst, int tag, const char* what, bool consume) override {
    return w_.isend(buf, bytes, world_rank(dst), kRingTags + tag, what, consume);
  }
  RequestPtr irecv(void* buf, int64_t bytes, int src, int tag, const char* what) override {
    return w_.irecv(buf, bytes, world_rank(src), kRingTags + tag, what);
  }

 protected:
  // Every ring step is a world step (so the world's failure injection reaches it, also a step
  // that moves nothing); every ring batch is a world batch (ForwardingComm).
  void context_changed() override { w_.set_context(phase(), step() + 1); }

 private:
  int world_rank(int g) const { return g * u_ + i_; }
  Communicator& w_;
  int u_, i_;
};

// Rows of the group's members end to end, in member order.
struct Group {
  int u = 1, me = 0, first = 0;  // member index of this rank; world rank of member 0
  std::vector<int64_t> rows, off;
  int64_t total = 0;
};
Group group_of(const Partition& part, int r, int u) {
  Group g;
  g.u = u;
  g.me = r % u;
  g.first = r - g.me;
  for (int m = 0; m < u; ++m) {
    g.off.push_back(g.total);
    g.rows.push_back(part.local_size(g.first + m));
    g.total += part.local_size(g.first + m);
  }
  return g;
}

// All-to-all inside the group (one batch, one message each way per member: exchange). ToHeads:
// src (B, H, rows[me], w) -> dst (B, H/u, total, w), member m's rows at off[m], heads block me;
// ToSeq: the inverse, src (B, H/u, total, w) -> dst (B, H, rows[me], w).
enum class Dir { ToHeads, ToSeq };
template <class U, class T>
void all_to_all(Dir dir, Communicator& c, Engine<T>& e, int64_t B, int64_t H, int64_t w, const Group& g,
                const U* src, U* dst, int tag, const char* what, std::vector<RequestPtr>& reqs, Staged& staged) {
  const int64_t Hu = H / g.u, n = g.rows[g.me];
  std::vector<int> ranks(g.u);
  for (int m = 0; m < g.u; ++m) ranks[m] = g.first + m;
  exchange_rows<U>(c, e, ranks, g.me, g.me, B, Hu, w, tag, what, reqs, staged, [&](int m, int64_t b, int64_t h) {
    const int64_t group = at(b, h, g.off[m], Hu, g.total, w);  // member m's rows of my heads
    const int64_t home = at(b, m * Hu + h, 0, H, n, w);        // my rows of member m's heads
    return dir == Dir::ToHeads ? RowPiece<U>{src + home, n, dst + group, g.rows[m]}
                               : RowPiece<U>{src + group, g.rows[m], dst + home, n};
  });
}

void check_ring(const Schedule& ring, Phase phase, int G, int u) {
  if (ring.phase != phase) fail("usp: ring schedule phase (", to_string(ring.phase), ") must be ", to_string(phase));
  if (ring.G * u != G) fail("usp: ring schedule G (", ring.G, ") x u (", u, ") must equal the world size (", G, ")");
}

// What both passes do first: the arguments checked, the phase's outputs sized; the rank.
template <class T>
int open_pass(Phase phase, Communicator& comm, Engine<T>& e, const Problem& p, int u, const Schedule& ring,
              const Partition& qp, const Partition& kp, Shard<T>& x) {
  const int G = comm.size(), r = comm.rank();
  check_usp(p, G, u);
  check_ring(ring, phase, G, u);
  if (phase == Phase::Forward) prepare_forward(e, p, qp, kp, r, x);
  else prepare_backward(e, p, qp, kp, r, x);
  return r;
}

}  // namespace

namespace {

// Both passes: the all-to-all in (Q, K, V; backward also dO, LSE and D, computed at home), the
// ring across groups on this rank's heads (world steps 1 .. ring.G), the all-to-all back (O, LSE;
// backward dQ, dK, dV).
template <class T>
void usp_pass(Phase phase, Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, int u,
              const Schedule& ring, const Partition& qp, const Partition& kp, Shard<T>& x) {
  using A = acc_t<T>;
  const bool bw = phase == Phase::Backward;
  const int r = open_pass(phase, comm, e, p, u, ring, qp, kp, x);
  const Buffer<A> D = bw ? home_D(e, p, x) : Buffer<A>{};  // eq. (5.1) at home: D travels instead of O
  const Group gq = group_of(qp, r, u), gk = group_of(kp, r, u);
  const int64_t B = p.B, d = p.d, Hu = p.H_q / u, Hkvu = p.H_kv / u;
  Shard<T> h;  // this rank's heads over the group's rows
  h.Q = alloc<T>(e, B * Hu * gq.total * d);
  if (bw) {
    h.dO = alloc<T>(e, B * Hu * gq.total * d);
    h.LSE = alloc<A>(e, B * Hu * gq.total);
    h.D = alloc<A>(e, B * Hu * gq.total);
  }
  h.K = alloc<T>(e, B * Hkvu * gk.total * d);
  h.V = alloc<T>(e, B * Hkvu * gk.total * d);
  Staged staged;  // before the requests: outlives them
  std::vector<RequestPtr> reqs;
  comm.set_context(phase, 0);
  const int kv_tag = bw ? 5 : 2;
  all_to_all(Dir::ToHeads, comm, e, B, p.H_q, d, gq, x.Q.data, h.Q.data, 1, "Q", reqs, staged);
  if (bw) {
    all_to_all(Dir::ToHeads, comm, e, B, p.H_q, d, gq, x.dO.data, h.dO.data, 2, "dO", reqs, staged);
    all_to_all<A>(Dir::ToHeads, comm, e, B, p.H_q, 1, gq, x.LSE.data, h.LSE.data, 3, "LSE", reqs, staged);
    all_to_all<A>(Dir::ToHeads, comm, e, B, p.H_q, 1, gq, D.data, h.D.data, 4, "D", reqs, staged);
  }
  all_to_all(Dir::ToHeads, comm, e, B, p.H_kv, d, gk, x.K.data, h.K.data, kv_tag, "K", reqs, staged);
  all_to_all(Dir::ToHeads, comm, e, B, p.H_kv, d, gk, x.V.data, h.V.data, kv_tag + 1, "V", reqs, staged);
  wait_all(reqs);
  staged.finish(e);
  e.synchronize();
  GroupRing rc(comm, u);
  const Problem hp = usp_head_problem(p, u);
  const Partition hq = usp_group_partition(qp, u), hk = usp_group_partition(kp, u);
  run_ring(ring, rc, e, hp, mask, hq, hk, h);
  comm.set_context(phase, ring.G + 1);
  if (bw) {
    all_to_all<A>(Dir::ToSeq, comm, e, B, p.H_q, d, gq, h.dQ.data, x.dQ.data, 7, "dQ", reqs, staged);
    all_to_all<A>(Dir::ToSeq, comm, e, B, p.H_kv, d, gk, h.dK.data, x.dK.data, 8, "dK", reqs, staged);
    all_to_all<A>(Dir::ToSeq, comm, e, B, p.H_kv, d, gk, h.dV.data, x.dV.data, 9, "dV", reqs, staged);
  } else {
    all_to_all(Dir::ToSeq, comm, e, B, p.H_q, d, gq, h.O.data, x.O.data, 4, "O", reqs, staged);
    all_to_all<A>(Dir::ToSeq, comm, e, B, p.H_q, 1, gq, h.LSE.data, x.LSE.data, 5, "LSE", reqs, staged);
  }
  wait_all(reqs);
  staged.finish(e);
}

}  // namespace

template <class T>
void usp_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, int u,
                 const Schedule& ring, const Partition& qp, const Partition& kp, Shard<T>& x) {
  usp_pass(Phase::Forward, comm, e, p, mask, u, ring, qp, kp, x);
}

template <class T>
void usp_backward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, int u,
                  const Schedule& ring, const Partition& qp, const Partition& kp, Shard<T>& x) {
  usp_pass(Phase::Backward, comm, e, p, mask, u, ring, qp, kp, x);
}

int64_t usp_bytes(Algo base, Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int u, int r,
                  bool sent, ElemBytes w) {
  check_usp(p, qp.G, u);
  const Group gq = group_of(qp, r, u), gk = group_of(kp, r, u);
  const int64_t B = p.B, d = p.d, Hu = p.H_q / u, Hkvu = p.H_kv / u, t = w.t, a = w.a;
  const int64_t nq = gq.rows[gq.me], nk = gk.rows[gk.me];
  const int64_t oq = gq.total - nq, ok = gk.total - nk;  // the other members' rows
  // (7.27): the all-to-all in sends (u-1) x my rows of the other members' heads and receives the
  // others' rows of mine; the one back is its mirror; between them the ring across groups on
  // H/u heads and the group shards, (7.1)-(7.6).
  int64_t in_q, in_kv, out_q, out_kv;  // bytes per row and head
  if (phase == Phase::Forward) {
    in_q = d * t;  in_kv = 2 * d * t;  out_q = d * t + a;  out_kv = 0;       // Q; K, V | O, LSE
  } else {
    in_q = 2 * d * t + 2 * a;  in_kv = 2 * d * t;  out_q = d * a;  out_kv = 2 * d * a;  // Q, dO, LSE, D; K, V | dQ; dK, dV
  }
  const int64_t in = sent ? (u - 1) * (nq * Hu * in_q + nk * Hkvu * in_kv) : oq * Hu * in_q + ok * Hkvu * in_kv;
  const int64_t out = sent ? oq * Hu * out_q + ok * Hkvu * out_kv : (u - 1) * (nq * Hu * out_q + nk * Hkvu * out_kv);
  const int64_t ring = closed_form_bytes(base, phase, usp_head_problem(p, u), usp_group_partition(qp, u),
                                         usp_group_partition(kp, u), r / u, sent, w);
  return B * (in + out) + ring;
}

#define BURSTLAB_USP_INST(T)                                                                                  \
  template void usp_forward<T>(Communicator&, Engine<T>&, const Problem&, const PreparedMask&, int,            \
                               const Schedule&, const Partition&, const Partition&, Shard<T>&);                \
  template void usp_backward<T>(Communicator&, Engine<T>&, const Problem&, const PreparedMask&, int,           \
                                const Schedule&, const Partition&, const Partition&, Shard<T>&);
BURSTLAB_FOR_EACH_STORAGE(BURSTLAB_USP_INST)
#undef BURSTLAB_USP_INST

}  // namespace burstlab::dist
