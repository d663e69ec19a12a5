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

template <class T>
struct Ctx {
  Communicator& c;
  Engine<T>& e;
  const Problem& p;
  int G, r;
  int64_t eb = sizeof(T);
  std::vector<T> host;  // staging for the rank's own piece (engine-agnostic copy)

  Ctx(Communicator& c_, Engine<T>& e_, const Problem& p_, int G_, int r_) : c(c_), e(e_), p(p_), G(G_), r(r_) {}

  void self_copy(T* dst, const T* src, int64_t n) { host_copy(e, host, dst, src, n); }

  // All-to-all sequence -> heads (spec §7.7): src (B, H, n_r, w) home rows of every head;
  // dst (B, H/G, N, w): every rank's rows (rank order) of head group r.
  void seq_to_heads(const T* src, T* dst, int64_t H, int64_t w, const Partition& part, int tag, const char* what,
                    std::vector<RequestPtr>& reqs) {
    const int64_t Hg = H / G, N = part.N, n_r = part.local_size(r);
    const std::vector<int64_t> off = offsets(part);
    for (int k = 0; k < G; ++k) {
      const int s = (r + k) % G;  // peer order r, r+1, ...: the same per pair on both sides
      const int64_t n_s = part.local_size(s);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < Hg; ++h) {
          const T* from = src + at(b, s * Hg + h, 0, H, n_r, w);
          T* to = dst + at(b, h, off[s], Hg, N, w);
          if (s == r) {
            self_copy(to, from, n_r * w);
            continue;
          }
          reqs.push_back(c.irecv(to, n_s * w * eb, s, tag, what));
          reqs.push_back(c.isend(from, n_r * w * eb, s, tag, what));
        }
    }
  }
  // The inverse: src (B, H/G, N, w) head group r -> dst (B, H, n_r, w) home rows.
  void heads_to_seq(const T* src, T* dst, int64_t H, int64_t w, const Partition& part, int tag, const char* what,
                    std::vector<RequestPtr>& reqs) {
    const int64_t Hg = H / G, N = part.N, n_r = part.local_size(r);
    const std::vector<int64_t> off = offsets(part);
    for (int k = 0; k < G; ++k) {
      const int s = (r + k) % G;
      const int64_t n_s = part.local_size(s);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < Hg; ++h) {
          const T* from = src + at(b, h, off[s], Hg, N, w);
          T* to = dst + at(b, s * Hg + h, 0, H, n_r, w);
          if (s == r) {
            self_copy(to, from, n_r * w);
            continue;
          }
          reqs.push_back(c.irecv(to, n_r * w * eb, s, tag, what));
          reqs.push_back(c.isend(from, n_s * w * eb, s, tag, what));
        }
    }
  }
  // All-gather of rows (spec §7.8): src (B, H, n_r, d) -> dst (B, H, N, d), shards in rank order.
  void gather_rows(const T* src, T* dst, int64_t H, const Partition& part, int tag, const char* what,
                   std::vector<RequestPtr>& reqs) {
    const int64_t d = p.d, N = part.N, n_r = part.local_size(r);
    const std::vector<int64_t> off = offsets(part);
    for (int k = 0; k < G; ++k) {
      const int s = (r + k) % G;
      const int64_t n_s = part.local_size(s);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const T* from = src + at(b, h, 0, H, n_r, d);
          T* to = dst + at(b, h, off[s], H, N, d);
          if (s == r) {
            self_copy(to, from, n_r * d);
            continue;
          }
          reqs.push_back(c.irecv(to, n_s * d * eb, s, tag, what));
          reqs.push_back(c.isend(from, n_r * d * eb, s, tag, what));
        }
    }
  }
  // Reduce-scatter of rows with a sum: src (B, H, N, d) partials of every row; rank r receives
  // the partials of its own rows from every rank into stage (G, B, H, n_r, d) and sums them in
  // rank order 0, 1, ..., G-1 (bitwise reproducible) into dst (B, H, n_r, d).
  void reduce_scatter_rows(const T* src, T* dst, int64_t H, const Partition& part, int tag, const char* what) {
    const int64_t d = p.d, N = part.N, n_r = part.local_size(r), piece = p.B * H * n_r * d;
    const std::vector<int64_t> off = offsets(part);
    Buffer<T> stage = e.alloc(G * piece);
    std::vector<RequestPtr> reqs;
    for (int k = 0; k < G; ++k) {
      const int s = (r + k) % G;
      const int64_t n_s = part.local_size(s);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const T* from = src + at(b, h, off[s], H, N, d);
          T* to = stage.data + s * piece + at(b, h, 0, H, n_r, d);
          if (s == r) {
            self_copy(to, src + at(b, h, off[r], H, N, d), n_r * d);
            continue;
          }
          reqs.push_back(c.irecv(to, n_r * d * eb, s, tag, what));
          reqs.push_back(c.isend(from, n_s * d * eb, s, tag, what));
        }
    }
    wait_all(reqs);
    e.synchronize();
    host_sum_pieces(e, stage.data, G, piece, dst);
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
void ulysses_forward(Communicator& comm, Engine<T>& e, const Problem& p, const MaskData& mask, const Partition& qp,
                     const Partition& kp, Shard<T>& x) {
  const int G = comm.size(), r = comm.rank();
  check_ulysses(p, G);
  Ctx<T> c(comm, e, p, G, r);
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G, Nq = p.N_q, Nk = p.N_k;
  prepare_forward(e, p, qp, kp, r, x);
  // Head-sharded tensors over the whole sequence, rows in rank order of the partition.
  Buffer<T> Qh = e.alloc(B * Hg * Nq * d), Kh = e.alloc(B * Hkvg * Nk * d), Vh = e.alloc(B * Hkvg * Nk * d);
  Buffer<T> Oh = e.alloc(B * Hg * Nq * d), Lh = e.alloc(B * Hg * Nq);
  std::vector<RequestPtr> reqs;  // after the buffers: destroyed (cancelled) first
  comm.set_context(Phase::Forward, 0);
  c.seq_to_heads(x.Q.data, Qh.data, p.H_q, d, qp, 1, "Q", reqs);
  c.seq_to_heads(x.K.data, Kh.data, p.H_kv, d, kp, 2, "K", reqs);
  c.seq_to_heads(x.V.data, Vh.data, p.H_kv, d, kp, 3, "V", reqs);
  wait_all(reqs);
  const AllPositions qa = all_positions(qp), ka = all_positions(kp);
  e.forward_block(head_group_problem(p, G), mask, qa.pos, ka.pos, as_const(bhsd<T>(Qh.data, B, Hg, Nq, d)),
                  as_const(bhsd<T>(Kh.data, B, Hkvg, Nk, d)), as_const(bhsd<T>(Vh.data, B, Hkvg, Nk, d)),
                  bhsd<T>(Oh.data, B, Hg, Nq, d), view3<T>(Lh.data, B, Hg, Nq));  // §6.1 over all keys
  e.synchronize();
  comm.set_context(Phase::Forward, 1);
  c.heads_to_seq(Oh.data, x.O.data, p.H_q, d, qp, 4, "O", reqs);
  c.heads_to_seq(Lh.data, x.LSE.data, p.H_q, 1, qp, 5, "LSE", reqs);
  wait_all(reqs);
}

template <class T>
void ulysses_backward(Communicator& comm, Engine<T>& e, const Problem& p, const MaskData& mask, const Partition& qp,
                      const Partition& kp, Shard<T>& x) {
  const int G = comm.size(), r = comm.rank();
  check_ulysses(p, G);
  Ctx<T> c(comm, e, p, G, r);
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G, Nq = p.N_q, Nk = p.N_k;
  prepare_backward(e, p, qp, kp, r, x);
  const Buffer<T> D = home_D(e, p, x);  // eq. (5.1) at home: D travels instead of O
  Buffer<T> Qh = e.alloc(B * Hg * Nq * d), dOh = e.alloc(B * Hg * Nq * d), Lh = e.alloc(B * Hg * Nq),
            Dh = e.alloc(B * Hg * Nq), Kh = e.alloc(B * Hkvg * Nk * d), Vh = e.alloc(B * Hkvg * Nk * d);
  Buffer<T> dQh = e.alloc(B * Hg * Nq * d), dKh = e.alloc(B * Hkvg * Nk * d), dVh = e.alloc(B * Hkvg * Nk * d);
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Backward, 0);
  c.seq_to_heads(x.Q.data, Qh.data, p.H_q, d, qp, 1, "Q", reqs);
  c.seq_to_heads(x.dO.data, dOh.data, p.H_q, d, qp, 2, "dO", reqs);
  c.seq_to_heads(x.LSE.data, Lh.data, p.H_q, 1, qp, 3, "LSE", reqs);
  c.seq_to_heads(D.data, Dh.data, p.H_q, 1, qp, 4, "D", reqs);
  c.seq_to_heads(x.K.data, Kh.data, p.H_kv, d, kp, 5, "K", reqs);
  c.seq_to_heads(x.V.data, Vh.data, p.H_kv, d, kp, 6, "V", reqs);
  wait_all(reqs);
  e.fill(dQh.data, dQh.n, T(0));
  e.fill(dKh.data, dKh.n, T(0));
  e.fill(dVh.data, dVh.n, T(0));
  const AllPositions qa = all_positions(qp), ka = all_positions(kp);
  e.backward_block(head_group_problem(p, G), mask, qa.pos, ka.pos, as_const(bhsd<T>(Qh.data, B, Hg, Nq, d)),
                   as_const(bhsd<T>(Kh.data, B, Hkvg, Nk, d)), as_const(bhsd<T>(Vh.data, B, Hkvg, Nk, d)),
                   as_const(bhsd<T>(dOh.data, B, Hg, Nq, d)), as_const(view3<T>(Lh.data, B, Hg, Nq)),
                   as_const(view3<T>(Dh.data, B, Hg, Nq)), bhsd<T>(dQh.data, B, Hg, Nq, d),
                   bhsd<T>(dKh.data, B, Hkvg, Nk, d), bhsd<T>(dVh.data, B, Hkvg, Nk, d));  // §6.2
  e.synchronize();
  comm.set_context(Phase::Backward, 1);
  c.heads_to_seq(dQh.data, x.dQ.data, p.H_q, d, qp, 7, "dQ", reqs);
  c.heads_to_seq(dKh.data, x.dK.data, p.H_kv, d, kp, 8, "dK", reqs);
  c.heads_to_seq(dVh.data, x.dV.data, p.H_kv, d, kp, 9, "dV", reqs);
  wait_all(reqs);
}

template <class T>
void allgather_forward(Communicator& comm, Engine<T>& e, const Problem& p, const MaskData& mask, const Partition& qp,
                       const Partition& kp, Shard<T>& x) {
  const int G = comm.size(), r = comm.rank();
  Ctx<T> c(comm, e, p, G, r);
  const int64_t B = p.B, d = p.d, Hkv = p.H_kv, Nk = p.N_k;
  prepare_forward(e, p, qp, kp, r, x);
  Buffer<T> Ka = e.alloc(B * Hkv * Nk * d), Va = e.alloc(B * Hkv * Nk * d);  // (B, H_kv, N_k, d)
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Forward, 0);
  c.gather_rows(x.K.data, Ka.data, Hkv, kp, 1, "K", reqs);
  c.gather_rows(x.V.data, Va.data, Hkv, kp, 2, "V", reqs);
  wait_all(reqs);
  const AllPositions ka = all_positions(kp);
  e.forward_block(p, mask, rank_positions(qp, r), ka.pos, as_const(bhsd<T>(x.Q.data, B, p.H_q, x.n_q, d)),
                  as_const(bhsd<T>(Ka.data, B, Hkv, Nk, d)), as_const(bhsd<T>(Va.data, B, Hkv, Nk, d)),
                  bhsd<T>(x.O.data, B, p.H_q, x.n_q, d), view3<T>(x.LSE.data, B, p.H_q, x.n_q));  // §6.1
  e.synchronize();
}

template <class T>
void allgather_backward(Communicator& comm, Engine<T>& e, const Problem& p, const MaskData& mask, const Partition& qp,
                        const Partition& kp, Shard<T>& x) {
  const int G = comm.size(), r = comm.rank();
  Ctx<T> c(comm, e, p, G, r);
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, Nk = p.N_k;
  prepare_backward(e, p, qp, kp, r, x);
  const Buffer<T> D = home_D(e, p, x);  // eq. (5.1)
  Buffer<T> Ka = e.alloc(B * Hkv * Nk * d), Va = e.alloc(B * Hkv * Nk * d);
  Buffer<T> dKa = e.alloc(B * Hkv * Nk * d), dVa = e.alloc(B * Hkv * Nk * d);  // partials of every key
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Backward, 0);
  c.gather_rows(x.K.data, Ka.data, Hkv, kp, 1, "K", reqs);
  c.gather_rows(x.V.data, Va.data, Hkv, kp, 2, "V", reqs);
  wait_all(reqs);
  e.fill(x.dQ.data, x.dQ.n, T(0));
  e.fill(dKa.data, dKa.n, T(0));
  e.fill(dVa.data, dVa.n, T(0));
  const AllPositions ka = all_positions(kp);
  e.backward_block(p, mask, rank_positions(qp, r), ka.pos, as_const(bhsd<T>(x.Q.data, B, Hq, x.n_q, d)),
                   as_const(bhsd<T>(Ka.data, B, Hkv, Nk, d)), as_const(bhsd<T>(Va.data, B, Hkv, Nk, d)),
                   as_const(bhsd<T>(x.dO.data, B, Hq, x.n_q, d)), as_const(view3<T>(x.LSE.data, B, Hq, x.n_q)),
                   as_const(view3<T>(D.data, B, Hq, x.n_q)), bhsd<T>(x.dQ.data, B, Hq, x.n_q, d),
                   bhsd<T>(dKa.data, B, Hkv, Nk, d), bhsd<T>(dVa.data, B, Hkv, Nk, d));  // §6.2
  e.synchronize();
  comm.set_context(Phase::Backward, 1);
  c.reduce_scatter_rows(dKa.data, x.dK.data, Hkv, kp, 3, "dK");
  c.reduce_scatter_rows(dVa.data, x.dV.data, Hkv, kp, 4, "dV");
}

int64_t ulysses_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r, bool sent,
                      int64_t eb) {
  const int G = qp.G;
  check_ulysses(p, G);
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G;
  const int64_t nq = n_of(qp, r), nk = n_of(kp, r), oq = p.N_q - nq, ok = p.N_k - nk;  // own / others' rows
  // Scatter (seq -> heads): rank r sends its rows of the (G-1) other head groups and receives
  // the other ranks' rows of its head group; the gather (heads -> seq) is the mirror image.
  // Row widths: Q, dO, O, dQ, K, V, dK, dV d; LSE, D 1.
  int64_t e = 0;
  if (phase == Phase::Forward) {
    const int64_t out_kv = Hkvg * 2 * d;  // K, V per row
    if (sent) e = B * ((G - 1) * nq * Hg * d + (G - 1) * nk * out_kv) + B * oq * Hg * (d + 1);    // (7.10)
    else e = B * (oq * Hg * d + ok * out_kv) + B * (G - 1) * nq * Hg * (d + 1);                    // (7.10)
  } else {
    if (sent) e = B * (G - 1) * (nq * Hg * (2 * d + 2) + nk * Hkvg * 2 * d) + B * (oq * Hg * d + ok * Hkvg * 2 * d);  // (7.11)
    else e = B * (oq * Hg * (2 * d + 2) + ok * Hkvg * 2 * d) + B * (G - 1) * (nq * Hg * d + nk * Hkvg * 2 * d);       // (7.11)
  }
  return e * eb;
}

int64_t allgather_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r, bool sent,
                        int64_t eb) {
  (void)qp;
  const int G = kp.G;
  const int64_t kv = 2 * p.B * p.H_kv * p.d, nk = n_of(kp, r), ok = p.N_k - nk;
  int64_t e = sent ? (G - 1) * nk * kv : ok * kv;                   // (7.12) gather K, V
  if (phase == Phase::Backward) e += sent ? ok * kv : (G - 1) * nk * kv;  // (7.13) + reduce-scatter dK, dV
  return e * eb;
}

#define BURSTLAB_BASELINES_INST(T)                                                                            \
  template void ulysses_forward<T>(Communicator&, Engine<T>&, const Problem&, const MaskData&, const Partition&, \
                                   const Partition&, Shard<T>&);                                                \
  template void ulysses_backward<T>(Communicator&, Engine<T>&, const Problem&, const MaskData&,                  \
                                    const Partition&, const Partition&, Shard<T>&);                              \
  template void allgather_forward<T>(Communicator&, Engine<T>&, const Problem&, const MaskData&,                 \
                                     const Partition&, const Partition&, Shard<T>&);                             \
  template void allgather_backward<T>(Communicator&, Engine<T>&, const Problem&, const MaskData&,                \
                                      const Partition&, const Partition&, Shard<T>&);
BURSTLAB_BASELINES_INST(float)
BURSTLAB_BASELINES_INST(double)
#undef BURSTLAB_BASELINES_INST

}  // namespace burstlab::dist
