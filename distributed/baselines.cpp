// distributed/baselines.cpp — Ulysses and all-gather CP (spec §7.7, §7.8).
#include "baselines.hpp"

#include <limits>
#include <vector>

#include "burstlab/error.hpp"
#include "shard_ops.hpp"

namespace burstlab::dist {

namespace {

// Row offset of each rank's shard when the shards are laid end to end in rank order.
std::vector<int64_t> offsets(const Partition& part) {
  std::vector<int64_t> off(part.G + 1, 0);
  for (int s = 0; s < part.G; ++s) off[s + 1] = off[s] + part.local_size(s);
  return off;
}

// Global positions of the shards laid end to end in rank order (the layout after a gather or
// an all-to-all). Contiguous partitions give [0, N) in order; others need the index.
struct AllPositions {
  std::vector<int64_t> index;
  Positions pos;
};
AllPositions all_positions(const Partition& part) {
  AllPositions a;
  for (int s = 0; s < part.G; ++s) a.index.insert(a.index.end(), part.positions[s].begin(), part.positions[s].end());
  a.pos = part.kind == PartitionKind::Contiguous ? contiguous(0, part.N)
                                                 : Positions{a.index[0], part.N, a.index.data()};
  return a;
}
Positions rank_positions(const Partition& part, int r) {
  if (part.kind == PartitionKind::Contiguous) return contiguous(part.positions[r][0], part.local_size(r));
  return Positions{part.positions[r][0], part.local_size(r), part.positions[r].data()};
}

enum class Dir { ToHeads, ToSeq };

// The collectives of one rank, on elements of any type U (T inputs, A statistics and gradients).
template <class T>
struct Ctx {
  Communicator& c;
  Engine<T>& e;
  const Problem& p;
  int G, r;
  Staged staged;  // before any caller's requests: outlives them

  // Sizes the rank's outputs of the phase (prepare_forward, prepare_backward).
  Ctx(Communicator& c_, Engine<T>& e_, const Problem& p_, Phase phase, const Partition& qp, const Partition& kp,
      Shard<T>& x)
      : c(c_), e(e_), p(p_), G(c_.size()), r(c_.rank()) {
    if (phase == Phase::Forward) prepare_forward(e, p, qp, kp, r, x);
    else prepare_backward(e, p, qp, kp, r, x);
  }

  // The ranks 0..G-1, for exchange_rows: a collective over the whole world, this rank's peers
  // visited from itself on.
  std::vector<int> world() const {
    std::vector<int> w(G);
    for (int s = 0; s < G; ++s) w[s] = s;
    return w;
  }
  template <class U, class PieceOf>
  void each_peer(int64_t H, int64_t w, int tag, const char* what, std::vector<RequestPtr>& reqs, Staged& into,
                 PieceOf piece_of) {
    exchange_rows<U>(c, e, world(), r, r, p.B, H, w, tag, what, reqs, into, piece_of);
  }
  // Waits the posted exchanges; the staged pieces are in place on return.
  void wait(std::vector<RequestPtr>& reqs) {
    wait_all(reqs);
    staged.finish(e);
  }
  // All-to-all between sequence and heads (spec §7.7). ToHeads: src (B, H, n_r, w) home rows of
  // every head -> dst (B, H/G, N, w) every rank's rows (rank order) of head group r; ToSeq: the
  // inverse, src (B, H/G, N, w) -> dst (B, H, n_r, w).
  template <class U>
  void all_to_all(Dir dir, const U* src, U* dst, int64_t H, int64_t w, const Partition& part, int tag,
                  const char* what, std::vector<RequestPtr>& reqs) {
    const int64_t Hg = H / G, N = part.N, n_r = part.local_size(r);
    const std::vector<int64_t> off = offsets(part);
    each_peer<U>(Hg, w, tag, what, reqs, staged, [&](int s, int64_t b, int64_t h) {
      const int64_t home = at(b, s * Hg + h, 0, H, n_r, w), group = at(b, h, off[s], Hg, N, w);
      const int64_t n_s = part.local_size(s);
      return dir == Dir::ToHeads ? RowPiece<U>{src + home, n_r, dst + group, n_s}
                                 : RowPiece<U>{src + group, n_s, dst + home, n_r};
    });
  }
  // All-gather of rows (spec §7.8): src (B, H, n_r, d) -> dst (B, H, N, d), shards in rank order.
  template <class U>
  void gather_rows(const U* src, U* dst, int64_t H, const Partition& part, int tag, const char* what,
                   std::vector<RequestPtr>& reqs) {
    const int64_t d = p.d, N = part.N, n_r = part.local_size(r);
    const std::vector<int64_t> off = offsets(part);
    each_peer<U>(H, d, tag, what, reqs, staged, [&](int s, int64_t b, int64_t h) {
      return RowPiece<U>{src + at(b, h, 0, H, n_r, d), n_r, dst + at(b, h, off[s], H, N, d), part.local_size(s)};
    });
  }
  // Reduce-scatter of rows with a sum: src (B, H, N, d) partials of every row; rank r receives
  // the partials of its own rows from every rank into stage (G, B, H, n_r, d) and sums them in
  // rank order 0, 1, ..., G-1 (bitwise reproducible) into dst (B, H, n_r, d).
  template <class U>
  void reduce_scatter_rows(const U* src, U* dst, int64_t H, const Partition& part, int tag, const char* what) {
    const int64_t d = p.d, N = part.N, n_r = part.local_size(r), piece = p.B * H * n_r * d;
    const std::vector<int64_t> off = offsets(part);
    Buffer<U> stage = alloc<U>(e, G * piece);
    Staged own;  // this collective's stages only: waited here, whatever else is in flight
    std::vector<RequestPtr> reqs;
    each_peer<U>(H, d, tag, what, reqs, own, [&](int s, int64_t b, int64_t h) {
      const int64_t n_s = part.local_size(s);
      return RowPiece<U>{src + at(b, h, off[s], H, N, d), n_s, stage.data + s * piece + at(b, h, 0, H, n_r, d), n_r};
    });
    wait_all(reqs);
    own.finish(e);
    e.synchronize();
    sum_pieces(e, stage.data, G, piece, dst);
  }
};

int64_t n_of(const Partition& part, int r) { return part.local_size(r); }

// Ulysses' local problem (§7.7): the H_q / G, H_kv / G heads of one group, the whole sequence.
Problem head_group_problem(const Problem& p, int G) {
  Problem pl = p;
  pl.H_q = p.H_q / G;
  pl.H_kv = p.H_kv / G;
  return pl;
}

}  // namespace

void check_ulysses(const Problem& p, int G) {
  if (G < 1) fail("world size G (", G, ") must be >= 1");
  if (p.H_q % G != 0)
    fail("ulysses needs H_q % G == 0: H_q (", p.H_q, ") is not a multiple of the world size G (", G,
         "); use a ring or all-gather schedule, or a world size dividing H_q");
  if (p.H_kv % G != 0)
    fail("ulysses needs H_kv % G == 0: H_kv (", p.H_kv, ") is not a multiple of the world size G (", G,
         "); every rank must own whole kv heads of its query heads");
}

template <class T>
void ulysses_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Partition& qp,
                     const Partition& kp, Shard<T>& x) {
  check_ulysses(p, comm.size());
  Ctx<T> c(comm, e, p, Phase::Forward, qp, kp, x);
  const int G = c.G;
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G, Nq = p.N_q, Nk = p.N_k;
  // Head-sharded tensors over the whole sequence, rows in rank order of the partition.
  using A = acc_t<T>;
  Buffer<T> Qh = alloc<T>(e, B * Hg * Nq * d), Kh = alloc<T>(e, B * Hkvg * Nk * d), Vh = alloc<T>(e, B * Hkvg * Nk * d);
  Buffer<T> Oh = alloc<T>(e, B * Hg * Nq * d);
  Buffer<A> Lh = alloc<A>(e, B * Hg * Nq);
  std::vector<RequestPtr> reqs;  // after the buffers: destroyed (cancelled) first
  comm.set_context(Phase::Forward, 0);
  c.all_to_all(Dir::ToHeads, x.Q.data, Qh.data, p.H_q, d, qp, 1, "Q", reqs);
  c.all_to_all(Dir::ToHeads, x.K.data, Kh.data, p.H_kv, d, kp, 2, "K", reqs);
  c.all_to_all(Dir::ToHeads, x.V.data, Vh.data, p.H_kv, d, kp, 3, "V", reqs);
  c.wait(reqs);
  const AllPositions qa = all_positions(qp), ka = all_positions(kp);
  e.forward_block(head_group_problem(p, G), mask, qa.pos, ka.pos, as_const(bhsd<T>(Qh.data, B, Hg, Nq, d)),
                  as_const(bhsd<T>(Kh.data, B, Hkvg, Nk, d)), as_const(bhsd<T>(Vh.data, B, Hkvg, Nk, d)),
                  bhsd<T>(Oh.data, B, Hg, Nq, d), view3<A>(Lh.data, B, Hg, Nq), false);  // §6.1 over all keys
  e.synchronize();
  comm.set_context(Phase::Forward, 1);
  c.all_to_all(Dir::ToSeq, Oh.data, x.O.data, p.H_q, d, qp, 4, "O", reqs);
  c.all_to_all(Dir::ToSeq, Lh.data, x.LSE.data, p.H_q, 1, qp, 5, "LSE", reqs);
  c.wait(reqs);
}

template <class T>
void ulysses_backward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Partition& qp,
                      const Partition& kp, Shard<T>& x) {
  check_ulysses(p, comm.size());
  Ctx<T> c(comm, e, p, Phase::Backward, qp, kp, x);
  using A = acc_t<T>;
  const Buffer<A> D = home_D(e, p, x);  // eq. (5.1) at home: D travels instead of O
  const int G = c.G;
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G, Nq = p.N_q, Nk = p.N_k;
  Buffer<T> Qh = alloc<T>(e, B * Hg * Nq * d), dOh = alloc<T>(e, B * Hg * Nq * d), Kh = alloc<T>(e, B * Hkvg * Nk * d),
            Vh = alloc<T>(e, B * Hkvg * Nk * d);
  Buffer<A> Lh = alloc<A>(e, B * Hg * Nq), Dh = alloc<A>(e, B * Hg * Nq);
  Buffer<A> dQh = alloc<A>(e, B * Hg * Nq * d), dKh = alloc<A>(e, B * Hkvg * Nk * d), dVh = alloc<A>(e, B * Hkvg * Nk * d);
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Backward, 0);
  c.all_to_all(Dir::ToHeads, x.Q.data, Qh.data, p.H_q, d, qp, 1, "Q", reqs);
  c.all_to_all(Dir::ToHeads, x.dO.data, dOh.data, p.H_q, d, qp, 2, "dO", reqs);
  c.all_to_all(Dir::ToHeads, x.LSE.data, Lh.data, p.H_q, 1, qp, 3, "LSE", reqs);
  c.all_to_all(Dir::ToHeads, D.data, Dh.data, p.H_q, 1, qp, 4, "D", reqs);
  c.all_to_all(Dir::ToHeads, x.K.data, Kh.data, p.H_kv, d, kp, 5, "K", reqs);
  c.all_to_all(Dir::ToHeads, x.V.data, Vh.data, p.H_kv, d, kp, 6, "V", reqs);
  c.wait(reqs);
  fill(e, dQh.data, dQh.n, 0.0);
  fill(e, dKh.data, dKh.n, 0.0);
  fill(e, dVh.data, dVh.n, 0.0);
  const AllPositions qa = all_positions(qp), ka = all_positions(kp);
  e.backward_block(head_group_problem(p, G), mask, qa.pos, ka.pos, as_const(bhsd<T>(Qh.data, B, Hg, Nq, d)),
                   as_const(bhsd<T>(Kh.data, B, Hkvg, Nk, d)), as_const(bhsd<T>(Vh.data, B, Hkvg, Nk, d)),
                   as_const(bhsd<T>(dOh.data, B, Hg, Nq, d)), as_const(view3<A>(Lh.data, B, Hg, Nq)),
                   as_const(view3<A>(Dh.data, B, Hg, Nq)), bhsd<A>(dQh.data, B, Hg, Nq, d),
                   bhsd<A>(dKh.data, B, Hkvg, Nk, d), bhsd<A>(dVh.data, B, Hkvg, Nk, d));  // §6.2
  e.synchronize();
  comm.set_context(Phase::Backward, 1);
  c.all_to_all(Dir::ToSeq, dQh.data, x.dQ.data, p.H_q, d, qp, 7, "dQ", reqs);
  c.all_to_all(Dir::ToSeq, dKh.data, x.dK.data, p.H_kv, d, kp, 8, "dK", reqs);
  c.all_to_all(Dir::ToSeq, dVh.data, x.dV.data, p.H_kv, d, kp, 9, "dV", reqs);
  c.wait(reqs);
}

template <class T>
void allgather_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Partition& qp,
                       const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, Phase::Forward, qp, kp, x);
  const int r = c.r;
  const int64_t B = p.B, d = p.d, Hkv = p.H_kv, Nk = p.N_k;
  Buffer<T> Ka = alloc<T>(e, B * Hkv * Nk * d), Va = alloc<T>(e, B * Hkv * Nk * d);  // (B, H_kv, N_k, d)
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Forward, 0);
  c.gather_rows(x.K.data, Ka.data, Hkv, kp, 1, "K", reqs);
  c.gather_rows(x.V.data, Va.data, Hkv, kp, 2, "V", reqs);
  c.wait(reqs);
  const AllPositions ka = all_positions(kp);
  e.forward_block(p, mask, rank_positions(qp, r), ka.pos, as_const(bhsd<T>(x.Q.data, B, p.H_q, x.n_q, d)),
                  as_const(bhsd<T>(Ka.data, B, Hkv, Nk, d)), as_const(bhsd<T>(Va.data, B, Hkv, Nk, d)),
                  bhsd<T>(x.O.data, B, p.H_q, x.n_q, d), view3<acc_t<T>>(x.LSE.data, B, p.H_q, x.n_q), false);  // §6.1
  e.synchronize();
}

template <class T>
void allgather_backward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Partition& qp,
                        const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, Phase::Backward, qp, kp, x);
  using A = acc_t<T>;
  const int r = c.r;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, Nk = p.N_k;
  const Buffer<A> D = home_D(e, p, x);  // eq. (5.1)
  Buffer<T> Ka = alloc<T>(e, B * Hkv * Nk * d), Va = alloc<T>(e, B * Hkv * Nk * d);
  Buffer<A> dKa = alloc<A>(e, B * Hkv * Nk * d), dVa = alloc<A>(e, B * Hkv * Nk * d);  // partials of every key
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Backward, 0);
  c.gather_rows(x.K.data, Ka.data, Hkv, kp, 1, "K", reqs);
  c.gather_rows(x.V.data, Va.data, Hkv, kp, 2, "V", reqs);
  c.wait(reqs);
  fill(e, x.dQ.data, x.dQ.n, 0.0);
  fill(e, dKa.data, dKa.n, 0.0);
  fill(e, dVa.data, dVa.n, 0.0);
  const AllPositions ka = all_positions(kp);
  e.backward_block(p, mask, rank_positions(qp, r), ka.pos, as_const(bhsd<T>(x.Q.data, B, Hq, x.n_q, d)),
                   as_const(bhsd<T>(Ka.data, B, Hkv, Nk, d)), as_const(bhsd<T>(Va.data, B, Hkv, Nk, d)),
                   as_const(bhsd<T>(x.dO.data, B, Hq, x.n_q, d)), as_const(view3<A>(x.LSE.data, B, Hq, x.n_q)),
                   as_const(view3<A>(D.data, B, Hq, x.n_q)), bhsd<A>(x.dQ.data, B, Hq, x.n_q, d),
                   bhsd<A>(dKa.data, B, Hkv, Nk, d), bhsd<A>(dVa.data, B, Hkv, Nk, d));  // §6.2
  e.synchronize();
  comm.set_context(Phase::Backward, 1);
  c.reduce_scatter_rows(dKa.data, x.dK.data, Hkv, kp, 3, "dK");
  c.reduce_scatter_rows(dVa.data, x.dV.data, Hkv, kp, 4, "dV");
}

int64_t ulysses_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r, bool sent,
                      ElemBytes w) {
  const int G = qp.G;
  check_ulysses(p, G);
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G;
  const int64_t nq = n_of(qp, r), nk = n_of(kp, r), oq = p.N_q - nq, ok = p.N_k - nk;  // own / others' rows
  // Scatter (seq -> heads): rank r sends its rows of the (G-1) other head groups and receives
  // the other ranks' rows of its head group; the gather (heads -> seq) is the mirror image.
  // Row widths: Q, dO, O, dQ, K, V, dK, dV d; LSE, D 1.
  // T rows: Q, K, V, O, dO; A rows: LSE, D, dQ, dK, dV (t = a gives (7.10)-(7.11)).
  const int64_t t = w.t, a = w.a;
  if (phase == Phase::Forward) {
    const int64_t out_kv = Hkvg * 2 * d * t;  // K, V per row
    if (sent) return B * ((G - 1) * nq * Hg * d * t + (G - 1) * nk * out_kv) + B * oq * Hg * (d * t + a);  // (7.10)
    return B * (oq * Hg * d * t + ok * out_kv) + B * (G - 1) * nq * Hg * (d * t + a);                      // (7.10)
  }
  const int64_t in_q = Hg * (2 * d * t + 2 * a), in_kv = Hkvg * 2 * d * t;  // Q, dO, LSE, D; K, V
  const int64_t out_q = Hg * d * a, out_kv = Hkvg * 2 * d * a;              // dQ; dK, dV
  if (sent) return B * (G - 1) * (nq * in_q + nk * in_kv) + B * (oq * out_q + ok * out_kv);  // (7.11)
  return B * (oq * in_q + ok * in_kv) + B * (G - 1) * (nq * out_q + nk * out_kv);              // (7.11)
}

int64_t allgather_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r, bool sent,
                        ElemBytes w) {
  (void)qp;
  const int G = kp.G;
  const int64_t kv = 2 * p.B * p.H_kv * p.d, nk = n_of(kp, r), ok = p.N_k - nk;
  int64_t e = w.t * (sent ? (G - 1) * nk * kv : ok * kv);                        // (7.12) gather K, V
  if (phase == Phase::Backward) e += w.a * (sent ? ok * kv : (G - 1) * nk * kv);  // (7.13) + reduce-scatter dK, dV
  return e;
}

template <class T>
void run_collective(bool ulysses, Phase phase, Communicator& comm, Engine<T>& e, const Problem& p,
                     const PreparedMask& mask, const Partition& qp, const Partition& kp, Shard<T>& x) {
  const bool f = phase == Phase::Forward;
  const auto run = ulysses ? (f ? &ulysses_forward<T> : &ulysses_backward<T>)
                           : (f ? &allgather_forward<T> : &allgather_backward<T>);
  run(comm, e, p, mask, qp, kp, x);
}

#define BURSTLAB_BASELINES_INST(T)                                                                        \
  template void run_collective<T>(bool, Phase, Communicator&, Engine<T>&, const Problem&, const PreparedMask&, \
                                   const Partition&, const Partition&, Shard<T>&);
BURSTLAB_FOR_EACH_STORAGE(BURSTLAB_BASELINES_INST)
#undef BURSTLAB_BASELINES_INST

}  // namespace burstlab::dist
