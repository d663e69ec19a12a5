// distributed/attention2d.cpp — Attention2D-NO (spec §7.11).
#include "attention2d.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

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
  }
  Buffer<T> kv_shard() { return alloc<T>(e, p.B * p.H_kv * nt * p.d); }  // (B, H_kv, nt, d)
  // Whole-buffer point to point: send src (n_src elements) to `to`, receive n_dst into dst from
  // `from` (the transposes).
  template <class U>
  void exchange(const U* src, int64_t n_src, int to, U* dst, int64_t n_dst, int from, int tag, const char* what,
                std::vector<RequestPtr>& reqs) {
    const int me = c.rank();
    if (to == me) {  // then from == me too (a permutation's fixed point)
      copy(e, dst, src, n_src);
      return;
    }
    const int64_t eb = sizeof(U);
    c.batch([&] {
      reqs.push_back(c.irecv(dst, n_dst * eb, from, tag, what));
      reqs.push_back(c.isend(src, n_src * eb, to, tag, what));
    });
  }
  // (7.22) transpose: this rank's K, V (B, H_kv, n_k, d) go to the rank holding them row-major;
  // Kt, Vt (B, H_kv, nt, d) receive shard g.row_major(r), the one this rank holds after it.
  void transpose_kv(const Grid& g, const Partition& kp, const Shard<T>& x, T* Kt, T* Vt) {
    const int r = c.rank(), shard_t = g.row_major(r);
    const int64_t n_home = p.B * p.H_kv * x.n_k * p.d, n_t = p.B * p.H_kv * kp.local_size(shard_t) * p.d;
    std::vector<RequestPtr> reqs;
    exchange(x.K.data, n_home, holder_after_transpose(g, r), Kt, n_t, shard_t, 1, "K", reqs);
    exchange(x.V.data, n_home, holder_after_transpose(g, r), Vt, n_t, shard_t, 2, "V", reqs);
    wait_all(reqs);
    e.synchronize();  // a shard kept in place was an engine copy; the gathers send it next
  }
  // The inverse, for the gradients: dKt, dVt (B, H_kv, nt, d) back to the column-major cyclic
  // owner, x.dK, x.dV (B, H_kv, n_k, d) from the rank holding the row-major shard r.
  void transpose_back(const Grid& g, const Partition& kp, const A* dKt, const A* dVt, Shard<T>& x) {
    e.synchronize();  // the column sums into dKt, dVt are finished before they travel
    const int r = c.rank(), shard_t = g.row_major(r);
    const int64_t n_home = p.B * p.H_kv * x.n_k * p.d, n_t = p.B * p.H_kv * kp.local_size(shard_t) * p.d;
    std::vector<RequestPtr> reqs;
    exchange(dKt, n_t, shard_t, x.dK.data, n_home, holder_after_transpose(g, r), 12, "dK", reqs);
    exchange(dVt, n_t, shard_t, x.dV.data, n_home, holder_after_transpose(g, r), 13, "dV", reqs);
    wait_all(reqs);
  }
  // Kt, Vt (B, H_kv, nt, d) into this rank's own block of the column buffers Kc, Vc (B, H_kv,
  // col.total, d): the column ring (§7.13 phase A) starts from it.
  void place_own_column_block(const T* Kt, const T* Vt, int64_t nt, T* Kc, T* Vc, const Members& col) {
    const int64_t Hkv = p.H_kv, d = p.d, NC = col.total;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < Hkv; ++h) {
        copy(e, Kc + at(b, h, col.off[col.me], Hkv, NC, d), Kt + at(b, h, 0, Hkv, nt, d), nt * d);
        copy(e, Vc + at(b, h, col.off[col.me], Hkv, NC, d), Vt + at(b, h, 0, Hkv, nt, d), nt * d);
      }
    e.synchronize();  // the column ring sends this block first
  }
  // All-gather within a group: src (B, H, rows[me], w) -> dst (B, H, total, w).
  template <class U>
  void gather(const U* src, U* dst, int64_t H, int64_t w, const Members& m, int tag, const char* what,
              std::vector<RequestPtr>& reqs) {
    const int64_t n_me = m.rows[m.me], eb = sizeof(U);
    c.batch([&] {  // every member's send and receive: one group
      for (size_t k = 0; k < m.ranks.size(); ++k)
        for (int64_t b = 0; b < p.B; ++b)
          for (int64_t h = 0; h < H; ++h) {
            U* to = dst + at(b, h, m.off[k], H, m.total, w);
            const U* from = src + at(b, h, 0, H, n_me, w);
            if (static_cast<int>(k) == m.me) {
              copy(e, to, from, n_me * w);
              continue;
            }
            reqs.push_back(c.irecv(to, m.rows[k] * w * eb, m.ranks[k], tag, what));
            reqs.push_back(c.isend(from, n_me * w * eb, m.ranks[k], tag, what));
          }
    });
  }
  // Reduce-scatter within a group, stage: every member's partial of my rows, (members, B, H,
  // rows[me], w); src (B, H, total, w).
  template <class U>
  Buffer<U> scatter(const U* src, int64_t H, int64_t w, const Members& m, int tag, const char* what) {
    const int64_t n_me = m.rows[m.me], piece = p.B * H * n_me * w, eb = sizeof(U);
    Buffer<U> stage = alloc<U>(e, static_cast<int64_t>(m.ranks.size()) * piece);
    std::vector<RequestPtr> reqs;
    c.batch([&] {
      for (size_t k = 0; k < m.ranks.size(); ++k)
        for (int64_t b = 0; b < p.B; ++b)
          for (int64_t h = 0; h < H; ++h) {
            U* to = stage.data + k * piece + at(b, h, 0, H, n_me, w);
            if (static_cast<int>(k) == m.me) {
              copy(e, to, src + at(b, h, m.off[m.me], H, m.total, w), n_me * w);
              continue;
            }
            reqs.push_back(c.irecv(to, n_me * w * eb, m.ranks[k], tag, what));
            reqs.push_back(c.isend(src + at(b, h, m.off[k], H, m.total, w), m.rows[k] * w * eb, m.ranks[k], tag, what));
          }
    });
    wait_all(reqs);
    e.synchronize();
    return stage;
  }
  // Sum in member order (bitwise reproducible) into dst (B, H, rows[me], w).
  template <class U>
  void scatter_sum(const U* src, U* dst, int64_t H, int64_t w, const Members& m, int tag, const char* what) {
    Buffer<U> stage = scatter(src, H, w, m, tag, what);
    sum_pieces(e, stage.data, static_cast<int64_t>(m.ranks.size()), p.B * H * m.rows[m.me] * w, dst);
  }
  // dK, dV home: the column's partials dKc, dVc (B, H_kv, col.total, d) reduce-scattered (sums)
  // into dKt, dVt (B, H_kv, nt, d), then transposed back to x.dK, x.dV (steps `step`, `step + 1`).
  void dkdv_home(const Grid& g, const Partition& kp, const A* dKc, const A* dVc, A* dKt, A* dVt, int step,
                 Shard<T>& x) {
    c.set_context(Phase::Backward, step);
    scatter_sum(dKc, dKt, p.H_kv, p.d, col, 10, "dK");
    scatter_sum(dVc, dVt, p.H_kv, p.d, col, 11, "dV");
    c.set_context(Phase::Backward, step + 1);
    transpose_back(g, kp, dKt, dVt, x);
  }
  // The merge (4.5) as the reduction, in member order, into O (B, H_q, rows[me], d), LSE.
  void scatter_merge(const T* O_src, const A* L_src, T* O, A* L, const Members& m, int tag) {
    const int64_t B = p.B, H = p.H_q, d = p.d, n = m.rows[m.me];
    Buffer<T> so = scatter(O_src, H, d, m, tag, "O");
    Buffer<A> sl = scatter(L_src, H, 1, m, tag + 1, "LSE");
    fill(e, O, B * H * n * d, 0.0);  // the merge identity (§4.3)
    fill(e, L, B * H * n, -std::numeric_limits<double>::infinity());
    for (size_t k = 0; k < m.ranks.size(); ++k)
      e.merge(bhsd<T>(O, B, H, n, d), view3<A>(L, B, H, n), as_const(bhsd<T>(so.data + k * B * H * n * d, B, H, n, d)),
              as_const(view3<A>(sl.data + k * B * H * n, B, H, n)));
  }
};

}  // namespace

template <class T>
void attention2d_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Grid& g,
                         const Partition& qp, const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, g, qp, kp, Phase::Forward, x);
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv;
  const Members &row = c.row, &col = c.col;
  using A = acc_t<T>;
  Buffer<T> Kt = c.kv_shard(), Vt = c.kv_shard();
  Buffer<T> Qr = alloc<T>(e, B * Hq * row.total * d), Kc = alloc<T>(e, B * Hkv * col.total * d),
            Vc = alloc<T>(e, B * Hkv * col.total * d);
  Buffer<T> Or = alloc<T>(e, B * Hq * row.total * d);
  Buffer<A> Lr = alloc<A>(e, B * Hq * row.total);
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Forward, 0);  // transpose K, V to the row-major cyclic distribution
  c.transpose_kv(g, kp, x, Kt.data, Vt.data);
  comm.set_context(Phase::Forward, 1);  // gather Q in rows, K, V in columns
  c.gather(x.Q.data, Qr.data, Hq, d, row, 3, "Q", reqs);
  c.gather(Kt.data, Kc.data, Hkv, d, col, 4, "K", reqs);
  c.gather(Vt.data, Vc.data, Hkv, d, col, 5, "V", reqs);
  wait_all(reqs);
  e.forward_block(p, mask, row.pos(), col.pos(), as_const(bhsd<T>(Qr.data, B, Hq, row.total, d)),
                  as_const(bhsd<T>(Kc.data, B, Hkv, col.total, d)), as_const(bhsd<T>(Vc.data, B, Hkv, col.total, d)),
                  bhsd<T>(Or.data, B, Hq, row.total, d), view3<A>(Lr.data, B, Hq, row.total), false);  // §6.1
  e.synchronize();
  comm.set_context(Phase::Forward, 2);  // reduce-scatter (O, LSE) in rows with the merge
  c.scatter_merge(Or.data, Lr.data, x.O.data, x.LSE.data, row, 6);
}

template <class T>
void attention2d_backward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Grid& g,
                          const Partition& qp, const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, g, qp, kp, Phase::Backward, x);
  using A = acc_t<T>;
  const Buffer<A> D = home_D(e, p, x);  // eq. (5.1) at home
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, nt = c.nt;
  const Members &row = c.row, &col = c.col;
  const int64_t NR = row.total, NC = col.total;
  Buffer<T> Kt = c.kv_shard(), Vt = c.kv_shard();
  Buffer<T> Qr = alloc<T>(e, B * Hq * NR * d), dOr = alloc<T>(e, B * Hq * NR * d), Kc = alloc<T>(e, B * Hkv * NC * d),
            Vc = alloc<T>(e, B * Hkv * NC * d);
  Buffer<A> Lr = alloc<A>(e, B * Hq * NR), Dr = alloc<A>(e, B * Hq * NR);
  Buffer<A> dQr = alloc<A>(e, B * Hq * NR * d), dKc = alloc<A>(e, B * Hkv * NC * d), dVc = alloc<A>(e, B * Hkv * NC * d);
  Buffer<A> dKt = alloc<A>(e, B * Hkv * nt * d), dVt = alloc<A>(e, B * Hkv * nt * d);
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Backward, 0);
  c.transpose_kv(g, kp, x, Kt.data, Vt.data);
  comm.set_context(Phase::Backward, 1);
  c.gather(x.Q.data, Qr.data, Hq, d, row, 3, "Q", reqs);
  c.gather(x.dO.data, dOr.data, Hq, d, row, 4, "dO", reqs);
  c.gather(x.LSE.data, Lr.data, Hq, 1, row, 5, "LSE", reqs);
  c.gather(D.data, Dr.data, Hq, 1, row, 6, "D", reqs);
  c.gather(Kt.data, Kc.data, Hkv, d, col, 7, "K", reqs);
  c.gather(Vt.data, Vc.data, Hkv, d, col, 8, "V", reqs);
  wait_all(reqs);
  fill(e, dQr.data, dQr.n, 0.0);
  fill(e, dKc.data, dKc.n, 0.0);
  fill(e, dVc.data, dVc.n, 0.0);
  e.backward_block(p, mask, row.pos(), col.pos(), as_const(bhsd<T>(Qr.data, B, Hq, NR, d)),
                   as_const(bhsd<T>(Kc.data, B, Hkv, NC, d)), as_const(bhsd<T>(Vc.data, B, Hkv, NC, d)),
                   as_const(bhsd<T>(dOr.data, B, Hq, NR, d)), as_const(view3<A>(Lr.data, B, Hq, NR)),
                   as_const(view3<A>(Dr.data, B, Hq, NR)), bhsd<A>(dQr.data, B, Hq, NR, d),
                   bhsd<A>(dKc.data, B, Hkv, NC, d), bhsd<A>(dVc.data, B, Hkv, NC, d));  // §6.2
  e.synchronize();
  comm.set_context(Phase::Backward, 2);  // reduce-scatter dQ in rows, dK, dV in columns (sums)
  c.scatter_sum(dQr.data, x.dQ.data, Hq, d, row, 9, "dQ");
  c.dkdv_home(g, kp, dKc.data, dVc.data, dKt.data, dVt.data, 2, x);  // step 3: back to the column-major owners
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
// Rows [off, off + n) of every (b, h) of a BHSD buffer: one message per (b, h), posted in a
// fixed order on both sides.
template <class T>
void send_rows(Communicator& c, std::vector<RequestPtr>& reqs, const T* buf, int64_t B, int64_t H, int64_t L,
               int64_t w, int64_t off, int64_t n, int to, int tag, const char* what) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      reqs.push_back(c.isend(buf + at(b, h, off, H, L, w), n * w * int64_t(sizeof(T)), to, tag, what));
}
template <class T>
void recv_rows(Communicator& c, std::vector<RequestPtr>& reqs, T* buf, int64_t B, int64_t H, int64_t L, int64_t w,
               int64_t off, int64_t n, int from, int tag, const char* what) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      reqs.push_back(c.irecv(buf + at(b, h, off, H, L, w), n * w * int64_t(sizeof(T)), from, tag, what));
}
// Column ring step u (§7.13 phase A): block me - u of Kc, Vc (B, H_kv, col.total, d) goes up the
// column while block me - u - 1 arrives from below; nothing moves at the last step.
template <class T>
void column_ring_step(Communicator& comm, std::vector<RequestPtr>& reqs, T* Kc, T* Vc, int64_t B, int64_t Hkv,
                      int64_t d, const Members& col, int u) {
  const int pr = static_cast<int>(col.ranks.size()), me = col.me;
  if (u >= pr - 1) return;
  const int cur = md(me - u, pr), nxt = md(me - u - 1, pr);
  const int up = col.ranks[md(me + 1, pr)], down = col.ranks[md(me - 1, pr)];
  const int64_t NC = col.total;
  comm.batch([&] {
    recv_rows<T>(comm, reqs, Kc, B, Hkv, NC, d, col.off[nxt], col.rows[nxt], down, 100 + 4 * u, "K");
    recv_rows<T>(comm, reqs, Vc, B, Hkv, NC, d, col.off[nxt], col.rows[nxt], down, 101 + 4 * u, "V");
    send_rows<T>(comm, reqs, Kc, B, Hkv, NC, d, col.off[cur], col.rows[cur], up, 100 + 4 * u, "K");
    send_rows<T>(comm, reqs, Vc, B, Hkv, NC, d, col.off[cur], col.rows[cur], up, 101 + 4 * u, "V");
  });
}
}  // namespace

template <class T>
void attention2d_o_forward(Communicator& comm, Engine<T>& e, const Problem& p, const PreparedMask& mask, const Grid& g,
                           const Partition& qp, const Partition& kp, Shard<T>& x) {
  Ctx<T> c(comm, e, p, g, qp, kp, Phase::Forward, x);
  fill(e, x.O.data, x.O.n, 0.0);  // the merge identity (§4.3)
  fill(e, x.LSE.data, x.LSE.n, -std::numeric_limits<double>::infinity());
  using A = acc_t<T>;
  const int r = c.r;
  const Members &row = c.row, &col = c.col;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, nq = x.n_q;
  const int64_t nt = c.nt, NC = col.total, mq = qp.max_local_size();
  Buffer<T> Kt = c.kv_shard(), Vt = c.kv_shard();
  Buffer<T> Kc = alloc<T>(e, B * Hkv * NC * d), Vc = alloc<T>(e, B * Hkv * NC * d);
  Buffer<T> Op = alloc<T>(e, B * Hq * mq * d);
  Buffer<A> Lp = alloc<A>(e, B * Hq * mq);
  Buffer<T> Qs[2] = {alloc<T>(e, B * Hq * mq * d), alloc<T>(e, B * Hq * mq * d)};
  Buffer<T> Ar[2] = {alloc<T>(e, B * Hq * mq * d), alloc<T>(e, B * Hq * mq * d)};
  Buffer<A> ALr[2] = {alloc<A>(e, B * Hq * mq), alloc<A>(e, B * Hq * mq)};
  std::vector<RequestPtr> reqs;
  comm.set_context(Phase::Forward, 0);
  c.transpose_kv(g, kp, x, Kt.data, Vt.data);
  // Phase A: the column ring. Step u holds the block of member me - u; it goes on to me + 1.
  const int pr = g.p_r, pc = g.p_c, me = col.me;
  c.place_own_column_block(Kt.data, Vt.data, nt, Kc.data, Vc.data, col);
  auto own_block = [&](int k) {  // own queries x column block k, merged into (O, LSE), eq. (4.5)
    e.forward_block(p, mask, qp.chunk_positions(r), shard_pos(kp, g.row_major(col.ranks[k])),
                    as_const(bhsd<T>(x.Q.data, B, Hq, nq, d)), as_const(rows4<T>(Kc.data, B, Hkv, NC, d, col.off[k], col.rows[k])),
                    as_const(rows4<T>(Vc.data, B, Hkv, NC, d, col.off[k], col.rows[k])), bhsd<T>(x.O.data, B, Hq, nq, d),
                    view3<A>(x.LSE.data, B, Hq, nq), true);
  };
  for (int u = 0; u < pr; ++u) {
    comm.set_context(Phase::Forward, 1 + u);
    column_ring_step<T>(comm, reqs, Kc.data, Vc.data, B, Hkv, d, col, u);
    own_block(md(me - u, pr));  // overlaps the transfers above
    e.synchronize();
    wait_all(reqs);
  }
  // Phase B: the row ring. Step v holds the queries of member j + v (from the right, on to the
  // left) and the accumulated partial of that block from the right; adds its own and passes it on.
  const int jm = row.me, left = row.ranks[md(jm - 1, pc)], right = row.ranks[md(jm + 1, pc)];
  if (pc > 1) {
    comm.set_context(Phase::Forward, 1 + pr);
    const int first = md(jm + 1, pc);
    comm.batch([&] {
      recv_rows<T>(comm, reqs, Qs[1].data, B, Hq, row.rows[first], d, 0, row.rows[first], right, 2000, "Q");
      send_rows<T>(comm, reqs, x.Q.data, B, Hq, nq, d, 0, nq, left, 2000, "Q");
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
        recv_rows<T>(comm, reqs, Qs[(v + 1) % 2].data, B, Hq, row.rows[m2], d, 0, row.rows[m2], right, 2000 + 8 * v, "Q");
        send_rows<T>(comm, reqs, Qm.data, B, Hq, n, d, 0, n, left, 2000 + 8 * v, "Q");
      });
    }
    e.forward_block(p, mask, shard_pos(qp, row.ranks[m]), col.pos(), as_const(bhsd<T>(Qm.data, B, Hq, n, d)),
                    as_const(bhsd<T>(Kc.data, B, Hkv, NC, d)), as_const(bhsd<T>(Vc.data, B, Hkv, NC, d)),
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
      comm.batch([&] {
        recv_rows<T>(comm, acc, Ar[(v + 1) % 2].data, B, Hq, n2, d, 0, n2, right, 2001 + 8 * (v + 1), "O");
        recv_rows<A>(comm, acc, ALr[(v + 1) % 2].data, B, Hq, n2, 1, 0, n2, right, 2002 + 8 * (v + 1), "LSE");
        send_rows<T>(comm, reqs, so, B, Hq, n, d, 0, n, left, 2001 + 8 * (v + 1), "O");
        send_rows<A>(comm, reqs, sl, B, Hq, n, 1, 0, n, left, 2002 + 8 * (v + 1), "LSE");
      });
    }
    if (v == pc - 1) {  // the chain of our own block arrives from the right
      wait_all(acc);
      e.merge(bhsd<T>(x.O.data, B, Hq, nq, d), view3<A>(x.LSE.data, B, Hq, nq),
              as_const(bhsd<T>(Ar[(v + 1) % 2].data, B, Hq, nq, d)), as_const(view3<A>(ALr[(v + 1) % 2].data, B, Hq, nq)));
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
  const int64_t nt = c.nt, NC = col.total, mq = qp.max_local_size();
  Buffer<T> Kt = c.kv_shard(), Vt = c.kv_shard();
  Buffer<A> dKt = alloc<A>(e, B * Hkv * nt * d), dVt = alloc<A>(e, B * Hkv * nt * d);
  Buffer<T> Kc = alloc<T>(e, B * Hkv * NC * d), Vc = alloc<T>(e, B * Hkv * NC * d);
  Buffer<A> dKc = alloc<A>(e, B * Hkv * NC * d), dVc = alloc<A>(e, B * Hkv * NC * d);
  fill(e, dKc.data, dKc.n, 0.0);
  fill(e, dVc.data, dVc.n, 0.0);
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
  c.transpose_kv(g, kp, x, Kt.data, Vt.data);
  const int pr = g.p_r, pc = g.p_c, me = col.me;
  c.place_own_column_block(Kt.data, Vt.data, nt, Kc.data, Vc.data, col);
  // Phase A: the column ring; own q side against each arriving block (dQ home, dK, dV of the block).
  for (int u = 0; u < pr; ++u) {
    comm.set_context(Phase::Backward, 1 + u);
    column_ring_step<T>(comm, reqs, Kc.data, Vc.data, B, Hkv, d, col, u);
    const int cur = md(me - u, pr);
    const int64_t o = col.off[cur], n = col.rows[cur];
    e.backward_block(p, mask, qp.chunk_positions(r), shard_pos(kp, g.row_major(col.ranks[cur])),
                     as_const(bhsd<T>(x.Q.data, B, Hq, nq, d)), as_const(rows4<T>(Kc.data, B, Hkv, NC, d, o, n)),
                     as_const(rows4<T>(Vc.data, B, Hkv, NC, d, o, n)), as_const(bhsd<T>(x.dO.data, B, Hq, nq, d)),
                     as_const(view3<A>(x.LSE.data, B, Hq, nq)), as_const(view3<A>(D.data, B, Hq, nq)),
                     bhsd<A>(x.dQ.data, B, Hq, nq, d), rows4<A>(dKc.data, B, Hkv, NC, d, o, n),
                     rows4<A>(dVc.data, B, Hkv, NC, d, o, n));  // §6.2
    e.synchronize();
    wait_all(reqs);
  }
  // Phase B: the row ring of q sides; dQ partials accumulate along the ring to their owner.
  const int jm = row.me, left = row.ranks[md(jm - 1, pc)], right = row.ranks[md(jm + 1, pc)];
  auto post_q = [&](QSide& s, int m, int tag) {  // receive member m's q side from the right
    const int64_t n = row.rows[m];
    recv_rows<T>(comm, reqs, s.Q.data, B, Hq, n, d, 0, n, right, tag, "Q");
    recv_rows<T>(comm, reqs, s.dO.data, B, Hq, n, d, 0, n, right, tag + 1, "dO");
    recv_rows<A>(comm, reqs, s.L.data, B, Hq, n, 1, 0, n, right, tag + 2, "LSE");
    recv_rows<A>(comm, reqs, s.D.data, B, Hq, n, 1, 0, n, right, tag + 3, "D");
  };
  auto pass_q = [&](const T* Q, const T* dO, const A* L, const A* Dv, int64_t n, int tag) {
    send_rows<T>(comm, reqs, Q, B, Hq, n, d, 0, n, left, tag, "Q");
    send_rows<T>(comm, reqs, dO, B, Hq, n, d, 0, n, left, tag + 1, "dO");
    send_rows<A>(comm, reqs, L, B, Hq, n, 1, 0, n, left, tag + 2, "LSE");
    send_rows<A>(comm, reqs, Dv, B, Hq, n, 1, 0, n, left, tag + 3, "D");
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
                     as_const(bhsd<T>(Kc.data, B, Hkv, NC, d)), as_const(bhsd<T>(Vc.data, B, Hkv, NC, d)),
                     as_const(bhsd<T>(s.dO.data, B, Hq, n, d)), as_const(view3<A>(s.L.data, B, Hq, n)),
                     as_const(view3<A>(s.D.data, B, Hq, n)), bhsd<A>(dQp.data, B, Hq, n, d),
                     bhsd<A>(dKc.data, B, Hkv, NC, d), bhsd<A>(dVc.data, B, Hkv, NC, d));  // §6.2
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
        recv_rows<A>(comm, acc, Ar[(v + 1) % 2].data, B, Hq, n2, d, 0, n2, right, 2004 + 8 * (v + 1), "dQ");
        send_rows<A>(comm, reqs, out, B, Hq, n, d, 0, n, left, 2004 + 8 * (v + 1), "dQ");
      });
    }
    if (v == pc - 1) {
      wait_all(acc);
      add(e, x.dQ.data, Ar[(v + 1) % 2].data, B * Hq * nq * d);
    }
    wait_all(reqs);
  }
  // Phase C: dK, dV reduce-scattered in the column, then transposed back (as Attention2D-NO).
  c.dkdv_home(g, kp, dKc.data, dVc.data, dKt.data, dVt.data, 1 + pr + pc, x);
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
