// distributed/attention2d.cpp — Attention2D-NO (spec §7.11).
#include "attention2d.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "burstlab/block_split.hpp"
#include "burstlab/error.hpp"
#include "shard_ops.hpp"

namespace burstlab::dist {

void check_attention2d(const Grid& g, int G, const Partition& qp, const Partition& kp) {
  if (g.p_r < 1 || g.p_c < 1) fail("grid (", g.p_r, "x", g.p_c, ") must have p_r, p_c >= 1");
  if (g.size() != G) fail("grid p_r x p_c (", g.p_r, "x", g.p_c, " = ", g.size(), ") must equal the world size G (", G, ")");
  if (qp.kind != PartitionKind::Striped || kp.kind != PartitionKind::Striped)
    fail("attention2d needs the cyclic (striped) partition, not ", to_string(qp.kind),
         ": its grid rows and columns gather cyclic token sets");
}

Grid default_grid(int G) {
  Grid g;
  for (int r = 1; r * r <= G; ++r)
    if (G % r == 0) g.p_r = r;
  g.p_c = G / g.p_r;
  return g;
}

Grid parse_grid(const std::string& s) {
  Grid g;
  char x = 0;
  std::istringstream is(s);
  if (!(is >> g.p_r >> x >> g.p_c) || (x != 'x' && x != 'X') || !is.eof() || g.p_r < 1 || g.p_c < 1)
    fail("grid (", s, ") must be RxC with R, C >= 1, e.g. 2x3");
  return g;
}

namespace {

// One rank's view of its grid: row and column members, and the rank holding each K, V shard
// after the transpose.
struct Members {
  std::vector<int> ranks;          // in member order
  std::vector<int64_t> rows, off;  // rows each member contributes, and their offsets
  int me = 0;
  int64_t total = 0;
  std::vector<int64_t> index;      // global positions, end to end
  Positions pos() const { return Positions{index[0], total, index.data()}; }
};
Members row_members(const Grid& g, const Partition& qp, int p) {
  Members m;
  for (int j = 0; j < g.p_c; ++j) m.ranks.push_back(g.rank(g.row(p), j));
  m.me = g.col(p);
  for (int s : m.ranks) {
    m.off.push_back(m.total);
    m.rows.push_back(qp.local_size(s));
    m.total += qp.local_size(s);
    m.index.insert(m.index.end(), qp.positions[s].begin(), qp.positions[s].end());
  }
  return m;
}
Members col_members(const Grid& g, const Partition& kp, int p) {
  Members m;
  for (int i = 0; i < g.p_r; ++i) m.ranks.push_back(g.rank(i, g.col(p)));
  m.me = g.row(p);
  for (int s : m.ranks) {
    const int shard = g.row_major(s);
    m.off.push_back(m.total);
    m.rows.push_back(kp.local_size(shard));
    m.total += kp.local_size(shard);
    m.index.insert(m.index.end(), kp.positions[shard].begin(), kp.positions[shard].end());
  }
  return m;
}
int holder_after_transpose(const Grid& g, int shard) {  // the rank whose row-major index is `shard`
  for (int q = 0; q < g.size(); ++q)
    if (g.row_major(q) == shard) return q;
  return -1;
}

// The collectives of one rank, on elements of any type U (T inputs, A statistics and gradients).
template <class T>
struct Ctx {
  using A = acc_t<T>;
  Communicator& c;
  Engine<T>& e;
  const Problem& p;
  const int r;
  Members row, col;  // this rank's grid row (q side) and column (k side)
  int64_t nt = 0;    // rows of the K, V shard this rank holds after the transpose
  bool stays = false;  // that shard is its own (p' = p): the transposes move nothing
  Staged staged;       // before any caller's requests: outlives them
  // What every schedule here does first: the grid checked, the phase's outputs sized, the rank's
  // row and column members.
  Ctx(Communicator& c_, Engine<T>& e_, const Problem& p_, const Grid& g, const Partition& qp, const Partition& kp,
      Phase phase, Shard<T>& x)
      : c(c_), e(e_), p(p_), r(c_.rank()) {
    check_attention2d(g, c.size(), qp, kp);
    if (phase == Phase::Forward) prepare_forward(e, p, qp, kp, r, x);
    else prepare_backward(e, p, qp, kp, r, x);
    row = row_members(g, qp, r);
    col = col_members(g, kp, r);
    nt = kp.local_size(g.row_major(r));
    stays = g.row_major(r) == r;
  }
  // Waits the posted collectives; their staged pieces are in place on return.
  void wait(std::vector<RequestPtr>& reqs) {
    wait_all(reqs);
    staged.finish(e);
  }
  // Whole-buffer point to point: send src (n_src elements) to `to`, receive n_dst into dst from
  // `from` (the transposes; never this rank itself).
  template <class U>
  void swap_whole(const U* src, int64_t n_src, int to, U* dst, int64_t n_dst, int from, int tag, const char* what,
                  std::vector<RequestPtr>& reqs) {
    const int64_t eb = sizeof(U);
    c.batch([&] {
      reqs.push_back(c.irecv(dst, n_dst * eb, from, tag, what));
      reqs.push_back(c.isend(src, n_src * eb, to, tag, what));
    });
  }
  // (7.22) transpose: this rank's K, V (B, H_kv, n_k, d) go to the rank holding them row-major,
  // and shard g.row_major(r), the one this rank holds after it, arrives into Kt, Vt (B, H_kv, nt,
  // d). Returns where that shard lies: Kt, Vt, or x.K, x.V themselves when it stays (no copy;
  // read only).
  std::pair<T*, T*> transpose_kv(const Grid& g, const Shard<T>& x, Buffer<T>& Kt, Buffer<T>& Vt) {
    if (stays) return {x.K.data, x.V.data};
    const int64_t n_home = p.B * p.H_kv * x.n_k * p.d, n_t = p.B * p.H_kv * nt * p.d;
    Kt = alloc<T>(e, n_t);
    Vt = alloc<T>(e, n_t);
    std::vector<RequestPtr> reqs;
    swap_whole(x.K.data, n_home, holder_after_transpose(g, r), Kt.data, n_t, g.row_major(r), 1, "K", reqs);
    swap_whole(x.V.data, n_home, holder_after_transpose(g, r), Vt.data, n_t, g.row_major(r), 2, "V", reqs);
    wait_all(reqs);
    return {Kt.data, Vt.data};
  }
  // The column's K, V (B, H_kv, col.total, d), gathered from the shards Ks, Vs the transpose left
  // with each member into Kc, Vc; a column of one member is that shard itself (no copy).
  std::pair<const T*, const T*> column_kv(const T* Ks, const T* Vs, Buffer<T>& Kc, Buffer<T>& Vc,
                                          std::vector<RequestPtr>& reqs) {
    if (col.ranks.size() == 1) return {Ks, Vs};
    Kc = alloc<T>(e, p.B * p.H_kv * col.total * p.d);
    Vc = alloc<T>(e, p.B * p.H_kv * col.total * p.d);
    gather(Ks, Kc.data, p.H_kv, p.d, col, 4, "K", reqs);
    gather(Vs, Vc.data, p.H_kv, p.d, col, 5, "V", reqs);
    return {Kc.data, Vc.data};
  }
  // The inverse, for the gradients: dKt, dVt (B, H_kv, nt, d) back to the column-major cyclic
  // owner, x.dK, x.dV (B, H_kv, n_k, d) from the rank holding the row-major shard r (not called
  // when the shard stays).
  void transpose_back(const Grid& g, const A* dKt, const A* dVt, Shard<T>& x) {
    e.synchronize();  // the column sums into dKt, dVt are finished before they travel
    const int shard_t = g.row_major(r);
    const int64_t n_home = p.B * p.H_kv * x.n_k * p.d, n_t = p.B * p.H_kv * nt * p.d;
    std::vector<RequestPtr> reqs;
    swap_whole(dKt, n_t, shard_t, x.dK.data, n_home, holder_after_transpose(g, r), 12, "dK", reqs);
    swap_whole(dVt, n_t, shard_t, x.dV.data, n_home, holder_after_transpose(g, r), 13, "dV", reqs);
    wait_all(reqs);
  }
  // The column buffers of §7.13's phase A, (B, H_kv, col.total, d): Kc, Vc with this rank's shard
  // Ks, Vs (B, H_kv, nt, d) placed in its own block, where the column ring starts; for a column of
  // one member, where no block travels, Ks, Vs themselves (read only).
  std::pair<T*, T*> column_ring_buffers(T* Ks, T* Vs, Buffer<T>& Kc, Buffer<T>& Vc) {
    if (col.ranks.size() == 1) return {Ks, Vs};
    const int64_t Hkv = p.H_kv, d = p.d, NC = col.total;
    Kc = alloc<T>(e, p.B * Hkv * NC * d);
    Vc = alloc<T>(e, p.B * Hkv * NC * d);
    std::vector<Copy> own;  // K's (b, h) blocks, then V's: one copy_rows each
    for (auto [dst, src] : {std::pair<T*, const T*>{Kc.data, Ks}, std::pair<T*, const T*>{Vc.data, Vs}})
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
          own.push_back({dst + at(b, h, col.off[col.me], Hkv, NC, d), src + at(b, h, 0, Hkv, nt, d),
                         nt * d * int64_t(sizeof(T))});
    copy_pieces(e, own);
    e.synchronize();  // the column ring sends this block first
    return {Kc.data, Vc.data};
  }
  // A collective over the group m (shard_ops.hpp's exchange_rows), in member order.
  template <class U, class PieceOf>
  void members(int64_t H, int64_t w, const Members& m, int tag, const char* what, std::vector<RequestPtr>& reqs,
               Staged& into, PieceOf piece) {
    exchange_rows<U>(c, e, m.ranks, m.me, 0, p.B, H, w, tag, what, reqs, into, piece);
  }
  // All-gather within a group: src (B, H, rows[me], w) -> dst (B, H, total, w).
  template <class U>
  void gather(const U* src, U* dst, int64_t H, int64_t w, const Members& m, int tag, const char* what,
              std::vector<RequestPtr>& reqs) {
    const int64_t n_me = m.rows[m.me];
    members<U>(H, w, m, tag, what, reqs, staged, [&](int k, int64_t b, int64_t h) {
      return RowPiece<U>{src + at(b, h, 0, H, n_me, w), n_me, dst + at(b, h, m.off[k], H, m.total, w), m.rows[k]};
    });
  }
  // Reduce-scatter within a group, stage: every member's partial of my rows, (members, B, H,
  // rows[me], w); src (B, H, total, w).
  template <class U>
  Buffer<U> scatter(const U* src, int64_t H, int64_t w, const Members& m, int tag, const char* what) {
    const int64_t n_me = m.rows[m.me], piece = p.B * H * n_me * w;
    Buffer<U> stage = alloc<U>(e, static_cast<int64_t>(m.ranks.size()) * piece);
    Staged own;  // this collective's stages only: waited here, whatever else is in flight
    std::vector<RequestPtr> reqs;
    members<U>(H, w, m, tag, what, reqs, own, [&](int k, int64_t b, int64_t h) {
      return RowPiece<U>{src + at(b, h, m.off[k], H, m.total, w), m.rows[k],
                      stage.data + k * piece + at(b, h, 0, H, n_me, w), n_me};
    });
    wait_all(reqs);
    own.finish(e);
    e.synchronize();
    return stage;
  }
  // Sum in member order (bitwise reproducible) into dst (B, H, rows[me], w).
  template <class U>
  void scatter_sum(const U* src, U* dst, int64_t H, int64_t w, const Members& m, int tag, const char* what) {
    Buffer<U> stage = scatter(src, H, w, m, tag, what);
    sum_pieces(e, stage.data, static_cast<int64_t>(m.ranks.size()), p.B * H * m.rows[m.me] * w, dst);
  }
  // dK, dV home from the column's partials dKc, dVc (B, H_kv, col.total, d): reduce-scattered
  // (sums) into this rank's shard at step `step`, transposed back to x.dK, x.dV at `step + 1`. A
  // schedule whose column has one member and whose shard stays adds into x.dK, x.dV directly
  // (home_dkdv) and does not call this.
  void dkdv_home(const Grid& g, const A* dKc, const A* dVc, int step, Shard<T>& x) {
    c.set_context(Phase::Backward, step);
    const int64_t n_t = p.B * p.H_kv * nt * p.d;
    Buffer<A> dKt, dVt;
    const A *sK = dKc, *sV = dVc;  // the sums of this rank's shard
    if (col.ranks.size() > 1) {
      if (!stays) {
        dKt = alloc<A>(e, n_t);
        dVt = alloc<A>(e, n_t);
      }
      A* tK = stays ? x.dK.data : dKt.data;
      A* tV = stays ? x.dV.data : dVt.data;
      scatter_sum(dKc, tK, p.H_kv, p.d, col, 10, "dK");
      scatter_sum(dVc, tV, p.H_kv, p.d, col, 11, "dV");
      sK = tK;
      sV = tV;
    }
    c.set_context(Phase::Backward, step + 1);
    if (!stays) transpose_back(g, sK, sV, x);
  }
  // Whether the column's dK, dV partials are this rank's own outputs: one member, shard stays.
  bool home_dkdv() const { return col.ranks.size() == 1 && stays; }
  // The other members' rows, end to end in member order without this rank's (the "others"
  // layout, total - rows[me] rows): where member k's start.
  static int64_t other_off(const Members& m, size_t k) {
    return m.off[k] - (static_cast<int>(k) > m.me ? m.rows[m.me] : 0);
  }
  // Every other member's rows into dst (B, H, total - rows[me], w), others layout; this rank's
  // src (B, H, rows[me], w) to each of them.
  template <class U>
  void gather_others(const U* src, U* dst, int64_t H, int64_t w, const Members& m, int tag, const char* what,
                     std::vector<RequestPtr>& reqs) {
    const int64_t n_me = m.rows[m.me], L = m.total - n_me;
    members<U>(H, w, m, tag, what, reqs, staged, [&](int k, int64_t b, int64_t h) {
      if (k == m.me) return RowPiece<U>{nullptr, 0, nullptr, 0};
      return RowPiece<U>{src + at(b, h, 0, H, n_me, w), n_me, dst + at(b, h, other_off(m, k), H, L, w), m.rows[k]};
    });
  }
  // The reverse with partials: each other member's rows of src (B, H, total - rows[me], w, others
  // layout) go back to it; what each other member computed of this rank's rows arrives into
  // dst[0], dst[1], ... (B, H, rows[me], w each), in member order.
  template <class U>
  void return_others(const U* src, const std::vector<U*>& dst, int64_t H, int64_t w, const Members& m, int tag,
                     const char* what, std::vector<RequestPtr>& reqs) {
    const int64_t n_me = m.rows[m.me], L = m.total - n_me;
    members<U>(H, w, m, tag, what, reqs, staged, [&](int k, int64_t b, int64_t h) {
      if (k == m.me) return RowPiece<U>{nullptr, 0, nullptr, 0};
      const size_t i = k - (k > m.me ? 1 : 0);  // dst[i]: the i-th other member
      return RowPiece<U>{src + at(b, h, other_off(m, k), H, L, w), m.rows[k], dst[i] + at(b, h, 0, H, n_me, w), n_me};
    });
  }
};

}  // namespace

// Step (3)'s block runs as one engine call per row member, the other members' rows first, so that
// this rank's own rows, computed last, are merged by the kernel into the partials the others sent
// back (forward_block's accumulate, eq. 4.5): a row of two members merges no whole partial (one
// merge per further member) and copies none. Reduction order: the other members' partials in
// member order, then the own rows.
template <class T>
void attention2d_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Grid& g,
                         const Partition& qp, const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, g, qp, kp, Phase::Forward, x);
  using A = acc_t<T>;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, n = x.n_q;
  const Members &row = c.row, &col = c.col;
  const int64_t NO = row.total - n, NC = col.total, others = static_cast<int64_t>(row.ranks.size()) - 1;
  Buffer<T> Kt, Vt, Kc, Vc;
  Buffer<T> Qo = alloc<T>(e, B * Hq * NO * d), Oo = alloc<T>(e, B * Hq * NO * d);  // the others layout
  Buffer<A> Lo = alloc<A>(e, B * Hq * NO);
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Forward, 0);  // transpose K, V to the row-major cyclic distribution
  const auto [Ks, Vs] = c.transpose_kv(g, x, Kt, Vt);
  comm.set_context(Phase::Forward, 1);  // gather Q in rows, K, V in columns
  c.gather_others(x.Q.data, Qo.data, Hq, d, row, 3, "Q", reqs);
  const auto [Kg, Vg] = c.column_kv(Ks, Vs, Kc, Vc, reqs);
  c.wait(reqs);
  const View4<const T> Kv = bhsd<const T>(Kg, B, Hkv, NC, d), Vv = bhsd<const T>(Vg, B, Hkv, NC, d);
  for (size_t k = 0; k < row.ranks.size(); ++k) {  // §6.1, the other members' rows
    if (static_cast<int>(k) == row.me) continue;
    const int64_t o = Ctx<T>::other_off(row, k), m = row.rows[k];
    e.forward_block(p, mask, slice_positions(row.pos(), row.off[k], m), col.pos(),
                    as_const(slice_rows(bhsd<T>(Qo.data, B, Hq, NO, d), o, m)), Kv, Vv,
                    slice_rows(bhsd<T>(Oo.data, B, Hq, NO, d), o, m), slice_rows(view3<A>(Lo.data, B, Hq, NO), o, m),
                    false);
  }
  e.synchronize();
  comm.set_context(Phase::Forward, 2);  // reduce-scatter (O, LSE) in rows with the merge
  Buffer<T> So = alloc<T>(e, B * Hq * n * d * std::max<int64_t>(others - 1, 0));
  Buffer<A> Sl = alloc<A>(e, B * Hq * n * std::max<int64_t>(others - 1, 0));
  std::vector<T*> to_o;
  std::vector<A*> to_l;
  for (int64_t i = 0; i < others; ++i) {  // the first into (O, LSE) itself, the rest staged
    to_o.push_back(i == 0 ? x.O.data : So.data + (i - 1) * B * Hq * n * d);
    to_l.push_back(i == 0 ? x.LSE.data : Sl.data + (i - 1) * B * Hq * n);
  }
  c.return_others(Oo.data, to_o, Hq, d, row, 6, "O", reqs);
  c.return_others(Lo.data, to_l, Hq, 1, row, 7, "LSE", reqs);
  c.wait(reqs);
  for (int64_t i = 1; i < others; ++i)
    e.merge(bhsd<T>(x.O.data, B, Hq, n, d), view3<A>(x.LSE.data, B, Hq, n), as_const(bhsd<T>(to_o[i], B, Hq, n, d)),
            as_const(view3<A>(to_l[i], B, Hq, n)));
  e.forward_block(p, mask, slice_positions(row.pos(), row.off[row.me], n), col.pos(),
                  as_const(bhsd<T>(x.Q.data, B, Hq, n, d)), Kv, Vv, bhsd<T>(x.O.data, B, Hq, n, d),
                  view3<A>(x.LSE.data, B, Hq, n), others > 0);  // §6.1, merged into the others' (4.5)
}

// As the forward, by row members: the other members' rows first into dQ partials that go back
// to them, the own rows straight into x.dQ, to which the others' partials are then added in
// member order. dK, dV of a column of one member whose shard stays are this rank's own outputs.
template <class T>
void attention2d_backward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Grid& g,
                          const Partition& qp, const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, g, qp, kp, Phase::Backward, x);
  using A = acc_t<T>;
  const Buffer<A> D = home_D(e, p, x);  // eq. (5.1) at home
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, n = x.n_q;
  const Members &row = c.row, &col = c.col;
  const int64_t NO = row.total - n, NC = col.total, others = static_cast<int64_t>(row.ranks.size()) - 1;
  Buffer<T> Kt, Vt, Kc, Vc;
  Buffer<T> Qo = alloc<T>(e, B * Hq * NO * d), dOo = alloc<T>(e, B * Hq * NO * d);  // the others layout
  Buffer<A> Lo = alloc<A>(e, B * Hq * NO), Do = alloc<A>(e, B * Hq * NO), dQo = alloc<A>(e, B * Hq * NO * d);
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Backward, 0);
  const auto [Ks, Vs] = c.transpose_kv(g, x, Kt, Vt);
  comm.set_context(Phase::Backward, 1);
  c.gather_others(x.Q.data, Qo.data, Hq, d, row, 3, "Q", reqs);
  c.gather_others(x.dO.data, dOo.data, Hq, d, row, 4, "dO", reqs);
  c.gather_others(x.LSE.data, Lo.data, Hq, 1, row, 5, "LSE", reqs);
  c.gather_others(D.data, Do.data, Hq, 1, row, 6, "D", reqs);
  if (col.ranks.size() > 1) {  // column_kv's gather, with the backward's tags
    Kc = alloc<T>(e, B * Hkv * NC * d);
    Vc = alloc<T>(e, B * Hkv * NC * d);
    c.gather(Ks, Kc.data, Hkv, d, col, 7, "K", reqs);
    c.gather(Vs, Vc.data, Hkv, d, col, 8, "V", reqs);
  }
  const T* Kg = col.ranks.size() > 1 ? Kc.data : Ks;
  const T* Vg = col.ranks.size() > 1 ? Vc.data : Vs;
  c.wait(reqs);
  Buffer<A> dKc, dVc;  // the column's dK, dV partials, unless they are x.dK, x.dV
  if (!c.home_dkdv()) {
    dKc = alloc<A>(e, B * Hkv * NC * d);
    dVc = alloc<A>(e, B * Hkv * NC * d);
  }
  A* dKg = c.home_dkdv() ? x.dK.data : dKc.data;
  A* dVg = c.home_dkdv() ? x.dV.data : dVc.data;
  fill(e, x.dQ.data, x.dQ.n, 0.0);
  fill(e, dQo.data, dQo.n, 0.0);
  fill(e, dKg, B * Hkv * NC * d, 0.0);
  fill(e, dVg, B * Hkv * NC * d, 0.0);
  const View4<const T> Kv = bhsd<const T>(Kg, B, Hkv, NC, d), Vv = bhsd<const T>(Vg, B, Hkv, NC, d);
  const View4<A> dKv = bhsd<A>(dKg, B, Hkv, NC, d), dVv = bhsd<A>(dVg, B, Hkv, NC, d);
  for (size_t k = 0; k < row.ranks.size(); ++k) {  // §6.2, the other members' rows
    if (static_cast<int>(k) == row.me) continue;
    const int64_t o = Ctx<T>::other_off(row, k), m = row.rows[k];
    e.backward_block(p, mask, slice_positions(row.pos(), row.off[k], m), col.pos(),
                     as_const(slice_rows(bhsd<T>(Qo.data, B, Hq, NO, d), o, m)), Kv, Vv,
                     as_const(slice_rows(bhsd<T>(dOo.data, B, Hq, NO, d), o, m)),
                     as_const(slice_rows(view3<A>(Lo.data, B, Hq, NO), o, m)),
                     as_const(slice_rows(view3<A>(Do.data, B, Hq, NO), o, m)),
                     slice_rows(bhsd<A>(dQo.data, B, Hq, NO, d), o, m), dKv, dVv);
  }
  e.backward_block(p, mask, slice_positions(row.pos(), row.off[row.me], n), col.pos(),
                   as_const(bhsd<T>(x.Q.data, B, Hq, n, d)), Kv, Vv, as_const(bhsd<T>(x.dO.data, B, Hq, n, d)),
                   as_const(view3<A>(x.LSE.data, B, Hq, n)), as_const(view3<A>(D.data, B, Hq, n)),
                   bhsd<A>(x.dQ.data, B, Hq, n, d), dKv, dVv);  // §6.2, the own rows
  e.synchronize();
  comm.set_context(Phase::Backward, 2);  // reduce-scatter dQ in rows, dK, dV in columns (sums)
  Buffer<A> S = alloc<A>(e, B * Hq * n * d * others);
  std::vector<A*> to;
  for (int64_t i = 0; i < others; ++i) to.push_back(S.data + i * B * Hq * n * d);
  c.return_others(dQo.data, to, Hq, d, row, 9, "dQ", reqs);
  c.wait(reqs);
  for (A* piece : to) add(e, x.dQ.data, piece, B * Hq * n * d);
  if (!c.home_dkdv()) c.dkdv_home(g, dKg, dVg, 2, x);  // step 3: back to the column-major owners
}

namespace {
int md(int a, int m) { return ((a % m) + m) % m; }
// Views of rows [off, off + n) of a BHSD buffer of L rows.
template <class T>
View4<T> rows4(T* data, int64_t B, int64_t H, int64_t L, int64_t d, int64_t off, int64_t n) {
  View4<T> v = view4(data, Layout::BHSD, B, H, L, d);
  v.data += off * v.stride[2];
  v.dim[2] = n;
  return v;
}
template <class T>
View3<T> rows3(T* data, int64_t B, int64_t H, int64_t L, int64_t off, int64_t n) {
  View3<T> v = view3(data, B, H, L);
  v.data += off * v.stride[2];
  v.dim[2] = n;
  return v;
}
Positions shard_pos(const Partition& part, int s) {
  return Positions{part.positions[s][0], part.local_size(s), part.positions[s].data()};
}
// A whole buffer of `elems` elements (a block of rows of every (b, h)): one message.
template <class T>
void send_all(Communicator& c, std::vector<RequestPtr>& reqs, const T* buf, int64_t elems, int to, int tag,
              const char* what) {
  reqs.push_back(c.isend(buf, elems * int64_t(sizeof(T)), to, tag, what));
}
template <class T>
void recv_all(Communicator& c, std::vector<RequestPtr>& reqs, T* buf, int64_t elems, int from, int tag,
              const char* what) {
  reqs.push_back(c.irecv(buf, elems * int64_t(sizeof(T)), from, tag, what));
}
// Column ring step u (§7.13 phase A): block me - u of Kc, Vc (B, H_kv, col.total, d) goes up the
// column while block me - u - 1 arrives from below (staged: in place after staged.finish);
// nothing moves at the last step. Each tensor is one message each way (shard_ops.hpp's exchange).
template <class T>
void column_ring_step(Communicator& comm, Engine<T>& e, Staged& staged, std::vector<RequestPtr>& reqs, T* Kc, T* Vc,
                      int64_t B, int64_t Hkv, int64_t d, const Members& col, int u) {
  const int pr = static_cast<int>(col.ranks.size()), me = col.me;
  if (u >= pr - 1) return;
  const int cur = md(me - u, pr), nxt = md(me - u - 1, pr);
  const int up = col.ranks[md(me + 1, pr)], down = col.ranks[md(me - 1, pr)];
  const int64_t NC = col.total, eb = sizeof(T);
  int tag = 100 + 4 * u;
  for (auto [buf, what] : {std::pair<T*, const char*>{Kc, "K"}, {Vc, "V"}}) {
    PeerPieces from_down{down, {}, {}}, to_up{up, {}, {}};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hkv; ++h) {
        from_down.in.emplace_back(buf + at(b, h, col.off[nxt], Hkv, NC, d), col.rows[nxt] * d * eb);
        to_up.out.emplace_back(buf + at(b, h, col.off[cur], Hkv, NC, d), col.rows[cur] * d * eb);
      }
    std::vector<PeerPieces> peers;
    if (up == down) {  // a column of two: one peer both ways
      to_up.in = std::move(from_down.in);
      peers = {std::move(to_up)};
    } else {
      peers = {std::move(from_down), std::move(to_up)};
    }
    exchange(comm, e, peers, tag++, what, reqs, staged);
  }
}
}  // namespace

template <class T>
void attention2d_o_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Grid& g,
                           const Partition& qp, const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, g, qp, kp, Phase::Forward, x);
  const int pr = g.p_r, pc = g.p_c;
  // With a column of one member (p_r = 1), phase A is one block, the own queries against the own
  // shard, with nothing travelling: it runs last, merged by the kernel (forward_block's
  // accumulate, eq. 4.5) into the chain of the own block, which arrives straight into (O, LSE);
  // no merge of whole partials then finishes the pass.
  const bool own_last = pr == 1 && pc > 1;
  if (!own_last) {
    fill(e, x.O.data, x.O.n, 0.0);  // the merge identity (§4.3)
    fill(e, x.LSE.data, x.LSE.n, -std::numeric_limits<double>::infinity());
  }
  using A = acc_t<T>;
  const int r = c.r;
  const Members &row = c.row, &col = c.col;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, nq = x.n_q;
  const int64_t NC = col.total, mq = qp.max_local_size();
  Buffer<T> Kt, Vt, Kcb, Vcb;
  Buffer<T> Op = alloc<T>(e, B * Hq * mq * d);
  Buffer<A> Lp = alloc<A>(e, B * Hq * mq);
  Buffer<T> Qs[2] = {alloc<T>(e, B * Hq * mq * d), alloc<T>(e, B * Hq * mq * d)};
  Buffer<T> Ar[2] = {alloc<T>(e, B * Hq * mq * d), alloc<T>(e, B * Hq * mq * d)};
  Buffer<A> ALr[2] = {alloc<A>(e, B * Hq * mq), alloc<A>(e, B * Hq * mq)};
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Forward, 0);
  T *Kc = nullptr, *Vc = nullptr;  // the column's K, V (B, H_kv, NC, d)
  {
    const auto [Ks, Vs] = c.transpose_kv(g, x, Kt, Vt);
    std::tie(Kc, Vc) = c.column_ring_buffers(Ks, Vs, Kcb, Vcb);
  }
  // Phase A: the column ring. Step u holds the block of member me - u; it goes on to me + 1.
  const int me = col.me;
  auto own_block = [&](int k) {  // own queries x column block k, merged into (O, LSE), eq. (4.5)
    e.forward_block(p, mask, qp.chunk_positions(r), shard_pos(kp, g.row_major(col.ranks[k])),
                    as_const(bhsd<T>(x.Q.data, B, Hq, nq, d)), as_const(rows4<T>(Kc, B, Hkv, NC, d, col.off[k], col.rows[k])),
                    as_const(rows4<T>(Vc, B, Hkv, NC, d, col.off[k], col.rows[k])), bhsd<T>(x.O.data, B, Hq, nq, d),
                    view3<A>(x.LSE.data, B, Hq, nq), true);
  };
  for (int u = 0; u < pr; ++u) {
    comm.set_context(Phase::Forward, 1 + u);
    column_ring_step<T>(comm, e, c.staged, reqs, Kc, Vc, B, Hkv, d, col, u);
    if (!own_last) own_block(md(me - u, pr));  // overlaps the transfers above
    e.synchronize();
    c.wait(reqs);
  }
  // Phase B: the row ring. Step v holds the queries of member j + v (from the right, on to the
  // left) and the accumulated partial of that block from the right; adds its own and passes it on.
  const int jm = row.me, left = row.ranks[md(jm - 1, pc)], right = row.ranks[md(jm + 1, pc)];
  if (pc > 1) {
    comm.set_context(Phase::Forward, 1 + pr);
    const int first = md(jm + 1, pc);
    comm.batch([&] {
      recv_all<T>(comm, reqs, Qs[1].data, B * Hq * row.rows[first] * d, right, 2000, "Q");
      send_all<T>(comm, reqs, x.Q.data, B * Hq * nq * d, left, 2000, "Q");
    });
    wait_all(reqs);
  }
  std::vector<RequestPtr> acc;  // the partial chain's receive, posted one step ahead
  for (int v = 1; v < pc; ++v) {
    comm.set_context(Phase::Forward, 1 + pr + v);
    const int m = md(jm + v, pc);
    const int64_t n = row.rows[m];
    Buffer<T>& Qm = Qs[v % 2];
    if (v + 1 < pc) {  // prefetch the next query block, pass this one on
      const int m2 = md(jm + v + 1, pc);
      comm.batch([&] {
        recv_all<T>(comm, reqs, Qs[(v + 1) % 2].data, B * Hq * row.rows[m2] * d, right, 2000 + 8 * v, "Q");
        send_all<T>(comm, reqs, Qm.data, B * Hq * n * d, left, 2000 + 8 * v, "Q");
      });
    }
    e.forward_block(p, mask, shard_pos(qp, row.ranks[m]), col.pos(), as_const(bhsd<T>(Qm.data, B, Hq, n, d)),
                    as_const(bhsd<T>(Kc, B, Hkv, NC, d)), as_const(bhsd<T>(Vc, B, Hkv, NC, d)),
                    bhsd<T>(Op.data, B, Hq, n, d), view3<A>(Lp.data, B, Hq, n), false);  // §6.1
    T* so = Op.data;
    A* sl = Lp.data;
    if (v >= 2) {  // acc (from the right) (+) own, eq. (4.5), in ring order
      wait_all(acc);
      e.merge(bhsd<T>(Ar[v % 2].data, B, Hq, n, d), view3<A>(ALr[v % 2].data, B, Hq, n),
              as_const(bhsd<T>(Op.data, B, Hq, n, d)), as_const(view3<A>(Lp.data, B, Hq, n)));
      so = Ar[v % 2].data;
      sl = ALr[v % 2].data;
    }
    e.synchronize();
    {  // post the next partial's receive before anything waits: block j + v + 1 (our own at the end)
      const int m2 = md(jm + v + 1, pc);
      const int64_t n2 = row.rows[m2];
      const bool home = own_last && v == pc - 1;  // our own block's chain: into (O, LSE) itself
      T* ro = home ? x.O.data : Ar[(v + 1) % 2].data;
      A* rl = home ? x.LSE.data : ALr[(v + 1) % 2].data;
      comm.batch([&] {
        recv_all<T>(comm, acc, ro, B * Hq * n2 * d, right, 2001 + 8 * (v + 1), "O");
        recv_all<A>(comm, acc, rl, B * Hq * n2, right, 2002 + 8 * (v + 1), "LSE");
        send_all<T>(comm, reqs, so, B * Hq * n * d, left, 2001 + 8 * (v + 1), "O");
        send_all<A>(comm, reqs, sl, B * Hq * n, left, 2002 + 8 * (v + 1), "LSE");
      });
    }
    if (v == pc - 1) {  // the chain of our own block arrives from the right
      wait_all(acc);
      if (own_last) own_block(0);
      else
        e.merge(bhsd<T>(x.O.data, B, Hq, nq, d), view3<A>(x.LSE.data, B, Hq, nq),
                as_const(bhsd<T>(Ar[(v + 1) % 2].data, B, Hq, nq, d)),
                as_const(view3<A>(ALr[(v + 1) % 2].data, B, Hq, nq)));
    }
    wait_all(reqs);
  }
}

template <class T>
void attention2d_o_backward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Grid& g,
                            const Partition& qp, const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, g, qp, kp, Phase::Backward, x);
  fill(e, x.dQ.data, x.dQ.n, 0.0);
  using A = acc_t<T>;
  const Buffer<A> D = home_D(e, p, x);  // eq. (5.1) at home
  const int r = c.r;
  const Members &row = c.row, &col = c.col;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, nq = x.n_q;
  const int64_t NC = col.total, mq = qp.max_local_size();
  Buffer<T> Kt, Vt, Kcb, Vcb;
  Buffer<A> dKcb, dVcb;  // the column's dK, dV partials, unless they are x.dK, x.dV (home_dkdv)
  if (!c.home_dkdv()) {
    dKcb = alloc<A>(e, B * Hkv * NC * d);
    dVcb = alloc<A>(e, B * Hkv * NC * d);
  }
  A* const dKc = c.home_dkdv() ? x.dK.data : dKcb.data;
  A* const dVc = c.home_dkdv() ? x.dV.data : dVcb.data;
  fill(e, dKc, B * Hkv * NC * d, 0.0);
  fill(e, dVc, B * Hkv * NC * d, 0.0);
  // The travelling q side: Q, dO (d wide, T), LSE, D (1 wide, A), two slots each; dQ partials (A).
  struct QSide {
    Buffer<T> Q, dO;
    Buffer<A> L, D;
  };
  QSide qs[2];
  for (QSide& s : qs) {
    s.Q = alloc<T>(e, B * Hq * mq * d);
    s.dO = alloc<T>(e, B * Hq * mq * d);
    s.L = alloc<A>(e, B * Hq * mq);
    s.D = alloc<A>(e, B * Hq * mq);
  }
  Buffer<A> dQp = alloc<A>(e, B * Hq * mq * d), Ar[2] = {alloc<A>(e, B * Hq * mq * d), alloc<A>(e, B * Hq * mq * d)};
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Backward, 0);
  T *Kc = nullptr, *Vc = nullptr;  // the column's K, V (B, H_kv, NC, d)
  {
    const auto [Ks, Vs] = c.transpose_kv(g, x, Kt, Vt);
    std::tie(Kc, Vc) = c.column_ring_buffers(Ks, Vs, Kcb, Vcb);
  }
  const int pr = g.p_r, pc = g.p_c, me = col.me;
  // Phase A: the column ring; own q side against each arriving block (dQ home, dK, dV of the block).
  for (int u = 0; u < pr; ++u) {
    comm.set_context(Phase::Backward, 1 + u);
    column_ring_step<T>(comm, e, c.staged, reqs, Kc, Vc, B, Hkv, d, col, u);
    const int cur = md(me - u, pr);
    const int64_t o = col.off[cur], n = col.rows[cur];
    e.backward_block(p, mask, qp.chunk_positions(r), shard_pos(kp, g.row_major(col.ranks[cur])),
                     as_const(bhsd<T>(x.Q.data, B, Hq, nq, d)), as_const(rows4<T>(Kc, B, Hkv, NC, d, o, n)),
                     as_const(rows4<T>(Vc, B, Hkv, NC, d, o, n)), as_const(bhsd<T>(x.dO.data, B, Hq, nq, d)),
                     as_const(view3<A>(x.LSE.data, B, Hq, nq)), as_const(view3<A>(D.data, B, Hq, nq)),
                     bhsd<A>(x.dQ.data, B, Hq, nq, d), rows4<A>(dKc, B, Hkv, NC, d, o, n),
                     rows4<A>(dVc, B, Hkv, NC, d, o, n));  // §6.2
    e.synchronize();
    c.wait(reqs);
  }
  // Phase B: the row ring of q sides; dQ partials accumulate along the ring to their owner.
  const int jm = row.me, left = row.ranks[md(jm - 1, pc)], right = row.ranks[md(jm + 1, pc)];
  auto post_q = [&](QSide& s, int m, int tag) {  // receive member m's q side from the right
    const int64_t n = row.rows[m];
    recv_all<T>(comm, reqs, s.Q.data, B * Hq * n * d, right, tag, "Q");
    recv_all<T>(comm, reqs, s.dO.data, B * Hq * n * d, right, tag + 1, "dO");
    recv_all<A>(comm, reqs, s.L.data, B * Hq * n, right, tag + 2, "LSE");
    recv_all<A>(comm, reqs, s.D.data, B * Hq * n, right, tag + 3, "D");
  };
  auto pass_q = [&](const T* Q, const T* dO, const A* L, const A* Dv, int64_t n, int tag) {
    send_all<T>(comm, reqs, Q, B * Hq * n * d, left, tag, "Q");
    send_all<T>(comm, reqs, dO, B * Hq * n * d, left, tag + 1, "dO");
    send_all<A>(comm, reqs, L, B * Hq * n, left, tag + 2, "LSE");
    send_all<A>(comm, reqs, Dv, B * Hq * n, left, tag + 3, "D");
  };
  if (pc > 1) {
    comm.set_context(Phase::Backward, 1 + pr);
    comm.batch([&] {
      post_q(qs[1], md(jm + 1, pc), 2000);
      pass_q(x.Q.data, x.dO.data, x.LSE.data, D.data, nq, 2000);
    });
    wait_all(reqs);
  }
  std::vector<RequestPtr> acc;  // the dQ chain's receive, posted one step ahead
  for (int v = 1; v < pc; ++v) {
    comm.set_context(Phase::Backward, 1 + pr + v);
    const int m = md(jm + v, pc);
    const int64_t n = row.rows[m];
    QSide& s = qs[v % 2];
    if (v + 1 < pc) {
      comm.batch([&] {
        post_q(qs[(v + 1) % 2], md(jm + v + 1, pc), 2000 + 8 * v);
        pass_q(s.Q.data, s.dO.data, s.L.data, s.D.data, n, 2000 + 8 * v);
      });
    }
    fill(e, dQp.data, B * Hq * n * d, 0.0);
    e.backward_block(p, mask, shard_pos(qp, row.ranks[m]), col.pos(), as_const(bhsd<T>(s.Q.data, B, Hq, n, d)),
                     as_const(bhsd<T>(Kc, B, Hkv, NC, d)), as_const(bhsd<T>(Vc, B, Hkv, NC, d)),
                     as_const(bhsd<T>(s.dO.data, B, Hq, n, d)), as_const(view3<A>(s.L.data, B, Hq, n)),
                     as_const(view3<A>(s.D.data, B, Hq, n)), bhsd<A>(dQp.data, B, Hq, n, d),
                     bhsd<A>(dKc, B, Hkv, NC, d), bhsd<A>(dVc, B, Hkv, NC, d));  // §6.2
    A* out = dQp.data;
    if (v >= 2) {  // acc (from the right) + own, in ring order
      wait_all(acc);
      add(e, Ar[v % 2].data, dQp.data, B * Hq * n * d);
      out = Ar[v % 2].data;
    }
    {  // the next partial's receive, posted before anything waits (our own block at the end)
      const int64_t n2 = row.rows[md(jm + v + 1, pc)];
      e.synchronize();  // the partial is complete before the transport reads it
      comm.batch([&] {
        recv_all<A>(comm, acc, Ar[(v + 1) % 2].data, B * Hq * n2 * d, right, 2004 + 8 * (v + 1), "dQ");
        send_all<A>(comm, reqs, out, B * Hq * n * d, left, 2004 + 8 * (v + 1), "dQ");
      });
    }
    if (v == pc - 1) {
      wait_all(acc);
      add(e, x.dQ.data, Ar[(v + 1) % 2].data, B * Hq * nq * d);
    }
    wait_all(reqs);
  }
  // Phase C: dK, dV reduce-scattered in the column, then transposed back (as Attention2D-NO).
  if (!c.home_dkdv()) c.dkdv_home(g, dKc, dVc, 1 + pr + pc, x);
}

int64_t attention2d_bytes(Phase phase, const Problem& p, const Grid& g, const Partition& qp, const Partition& kp,
                          int r, bool sent, ElemBytes w, bool overlapped) {
  check_attention2d(g, qp.G, qp, kp);
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv;
  const int i = g.row(r), j = g.col(r), rt = g.row_major(r);
  auto nq = [&](int x) { return qp.local_size(x); };  // n_q(x), n_k(x) of (7.22): striped shard x
  auto nk = [&](int x) { return kp.local_size(x); };
  int64_t q_others = 0, k_others = 0;  // rows of the other row members (q) / column members (k)
  for (int jj = 0; jj < g.p_c; ++jj) if (jj != j) q_others += nq(g.rank(i, jj));
  for (int ii = 0; ii < g.p_r; ++ii) if (ii != i) k_others += nk(g.row_major(g.rank(ii, j)));
  int64_t q_mine = nq(r) * (g.p_c - 1), k_mine = nk(rt) * (g.p_r - 1);
  int64_t acc_recv = q_mine;  // partials of our rows received in the reduce-scatter
  if (overlapped) {
    // (7.26) rings: rank (i, j) forwards the column blocks of members i, i-1, ..., i-p_r+2 and the
    // query blocks of members j, j+1, ..., j+p_c-2; the partial chain brings it the partials of
    // blocks j+2, ..., j+p_c-1 and finally of its own block.
    k_mine = 0;
    for (int u = 0; u + 1 < g.p_r; ++u) k_mine += nk(g.row_major(g.rank(md(i - u, g.p_r), j)));
    q_mine = 0;
    for (int v = 0; v + 1 < g.p_c; ++v) q_mine += nq(g.rank(i, md(j + v, g.p_c)));
    acc_recv = g.p_c > 1 ? nq(r) : 0;
    for (int v = 2; v < g.p_c; ++v) acc_recv += nq(g.rank(i, md(j + v, g.p_c)));
  }
  // Transposes: rank r sends its shard r and receives shard rt (nothing when rt == r).
  // Bytes: T for Q, K, V, O, dO; A for LSE, D, dQ, dK, dV (t = a gives (7.22)-(7.23)).
  const int64_t t = w.t, a = w.a;
  const int64_t tr = rt == r ? 0 : 2 * Hkv * d * (sent ? nk(r) : nk(rt));
  const int64_t tr_back = rt == r ? 0 : 2 * Hkv * d * (sent ? nk(rt) : nk(r));
  int64_t e = 0;
  if (phase == Phase::Forward) {
    // (7.22) transpose; gather Q (row), K, V (column); reduce-scatter O, LSE (row).
    e = t * tr + t * Hq * d * (sent ? q_mine : q_others) + t * 2 * Hkv * d * (sent ? k_mine : k_others) +
        Hq * (d * t + a) * (sent ? q_others : acc_recv);
  } else {
    // (7.23) transpose; gather Q, dO, LSE, D (row), K, V (column); reduce-scatter dQ (row),
    // dK, dV (column); transpose dK, dV back.
    e = t * tr + Hq * (2 * d * t + 2 * a) * (sent ? q_mine : q_others) + t * 2 * Hkv * d * (sent ? k_mine : k_others) +
        a * Hq * d * (sent ? q_others : acc_recv) + a * 2 * Hkv * d * (sent ? k_others : nk(rt) * (g.p_r - 1)) +
        a * tr_back;
  }
  return B * e;
}

template <class T>
void run_attention2d(bool overlapped, Phase phase, Communicator& comm, Engine<T>& e, const Problem& p,
                     const PreparedMask& mask, const Grid& g, const Partition& qp, const Partition& kp, Shard<T>& x) {
  const bool f = phase == Phase::Forward;
  const auto run = overlapped ? (f ? &attention2d_o_forward<T> : &attention2d_o_backward<T>)
                              : (f ? &attention2d_forward<T> : &attention2d_backward<T>);
  run(comm, e, p, mask, g, qp, kp, x);
}

#define BURSTLAB_A2D_INST(T)                                                                                  \
  template void run_attention2d<T>(bool, Phase, Communicator&, Engine<T>&, const Problem&, const PreparedMask&, \
                                   const Grid&, const Partition&, const Partition&, Shard<T>&);
BURSTLAB_FOR_EACH_STORAGE(BURSTLAB_A2D_INST)
#undef BURSTLAB_A2D_INST

}  // namespace burstlab::dist
