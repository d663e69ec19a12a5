// cpu/cpu.cpp — tiled online-softmax attention on a CPU (LAO): spec §4 (forward, eq. 4.1-4.4),
// §5.3 (backward, FlashAttention-2 schedule), §6.1-§6.2 (blocks over global positions).
//
// Shapes: Q, O, dO, dQ (B, H_q, N, d); K, V, dK, dV (B, H_kv, N, d); LSE, D (B, H_q, N), all seen
// through strided views (BSHD or BHSD or anything else). Per thread, buffers are (Br x d),
// (Bc x d) and (Br x Bc): never an N x N buffer. Products are Eigen GEMMs on contiguous row-major
// tiles (views whose rows are unit-stride are mapped in place; others are copied); the
// exponentials are a branch-free polynomial exp that the compiler vectorizes.
//
// Determinism: no atomics. The forward parallelizes over (b, h, query tile); the backward runs
// pass 1 over (b, kv-head, key tile) producing dK, dV (looping over the group's q-heads and every
// query tile) and pass 2 over (b, h, query tile) producing dQ. Same inputs, same tiles, same
// thread count or not: the result is bitwise the same.
//
// Parallelism is ours (OpenMP over tiles); the tile GEMMs run serial: Eigen opens no team inside
// an active one (omp_get_num_threads() > 1), and its thread count is the caller's
// omp_get_max_threads() (nothing calls Eigen::setNbThreads), 1 in a team of one.
// EIGEN_DONT_PARALLELIZE is not used: every translation unit would have to define it (ODR).
#include "cpu.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/parallel.hpp"

namespace burstlab::cpu {

void validate_tiles(const Tiles& t) {
  if (t.Br < 1) fail("Br (", t.Br, ") must be >= 1");
  if (t.Bc < 1) fail("Bc (", t.Bc, ") must be >= 1");
}

namespace {

// ------------------------------------------------------------------------------------------
// exp for the softmax: x - m <= 0 in the forward (eq. 4.2), S - LSE <= ~0 in the backward
// (eq. 5.2), on Eigen packets (AVX-512/AVX2/SSE/NEON as compiled). Results below the smallest
// normal (x < ln 2^-126 in fp32, ln 2^-1022 in fp64) are exactly 0: the error is below tiny_a,
// which the §9 bound carries (N_k tiny_a max|V|), and -inf (masked logits) gives exactly 0, so
// keys that nobody sees get exactly zero gradients.
// fp32: round-to-nearest range reduction x = n ln2 + r, |r| <= ln2/2, Cephes minimax polynomial
// for e^r, 2^n built in the exponent bits (a few ulp; its effect is inside the §9 bounds the
// cpu sweeps check). fp64: Eigen's pexp (Cephes rational).
namespace ei = Eigen::internal;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // packet types carry vector attributes

template <class T> struct ExpCut;
template <> struct ExpCut<float> { static constexpr float v = -87.33654475f; };   // ln 2^-126
template <> struct ExpCut<double> { static constexpr double v = -708.3964185322641; };  // ln 2^-1022

template <class P>
inline P pexp_softmax(P x, float) {
  using PI = typename ei::unpacket_traits<P>::integer_packet;
  const P cut = ei::pset1<P>(ExpCut<float>::v);
  const P under = ei::pcmp_lt(x, cut);  // true for -inf (masked)
  x = ei::pmin(ei::pmax(x, cut), ei::pset1<P>(88.0f));
  const P magic = ei::pset1<P>(12582912.0f);  // 1.5 * 2^23: t - magic = round(x / ln2)
  const P t = ei::pmadd(x, ei::pset1<P>(1.44269504088896341f), magic);
  const P n = ei::psub(t, magic);
  P r = ei::pmadd(n, ei::pset1<P>(-0.693359375f), x);  // ln2 in two parts: n * C1 exact
  r = ei::pmadd(n, ei::pset1<P>(2.12194440e-4f), r);
  P y = ei::pset1<P>(1.9875691500e-4f);
  y = ei::pmadd(y, r, ei::pset1<P>(1.3981999507e-3f));
  y = ei::pmadd(y, r, ei::pset1<P>(8.3334519073e-3f));
  y = ei::pmadd(y, r, ei::pset1<P>(4.1665795894e-2f));
  y = ei::pmadd(y, r, ei::pset1<P>(1.6666665459e-1f));
  y = ei::pmadd(y, r, ei::pset1<P>(5.0000001201e-1f));
  y = ei::pmadd(y, ei::pmul(r, r), ei::padd(r, ei::pset1<P>(1.0f)));
  // 2^n: the low bits of t hold n + 0x400000; (n + 127) << 23 is 2^n, n in [-126, 127].
  const PI e = ei::padd(ei::preinterpret<PI>(t), ei::pset1<PI>(127 - 0x4B400000));
  return ei::pandnot(ei::pmul(y, ei::preinterpret<P>(ei::plogical_shift_left<23>(e))), under);
}
template <class P>
inline P pexp_softmax(P x, double) {
  return ei::pselect(ei::pcmp_lt(x, ei::pset1<P>(ExpCut<double>::v)), ei::pzero(x), ei::pexp(x));
}
template <class T>
inline T exp_softmax(T x) {  // scalar tail, same rule
  return x < ExpCut<T>::v ? T(0) : std::exp(x);
}

// max_c s[c] (-inf for n == 0).
template <class T>
inline T row_max(const T* s, int64_t n) {
  using P = typename ei::packet_traits<T>::type;
  constexpr int64_t W = ei::unpacket_traits<P>::size;
  T mx = -std::numeric_limits<T>::infinity();
  int64_t c = 0;
  if (n >= W) {
    P v = ei::ploadu<P>(s);
    for (c = W; c + W <= n; c += W) v = ei::pmax(v, ei::ploadu<P>(s + c));
    mx = ei::predux_max(v);
  }
  for (; c < n; ++c) mx = s[c] > mx ? s[c] : mx;
  return mx;
}

// s[c] <- exp(s[c] - sub) for c < n; returns the sum of the new values.
template <class T>
inline T row_exp_sum(T* s, int64_t n, T sub) {
  using P = typename ei::packet_traits<T>::type;
  constexpr int64_t W = ei::unpacket_traits<P>::size;
  const P vsub = ei::pset1<P>(sub);
  P acc = ei::pzero(vsub);
  int64_t c = 0;
  for (; c + W <= n; c += W) {
    const P e = pexp_softmax(ei::psub(ei::ploadu<P>(s + c), vsub), T());
    ei::pstoreu(s + c, e);
    acc = ei::padd(acc, e);
  }
  T sum = ei::predux(acc);
  for (; c < n; ++c) {
    s[c] = exp_softmax(s[c] - sub);
    sum += s[c];
  }
  return sum;
}
#pragma GCC diagnostic pop

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapC = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;  // read-only tile
template <class T>
using MapM = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;        // writable tile

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A (rows x d) tile of a view starting at local row n0 of (b, h): mapped in place when its rows
// are unit-stride and do not overlap, else copied into `buf` (rows x d, contiguous).
template <class T>
MapC<T> load_tile(const View4<const T>& v, int64_t b, int64_t h, int64_t n0, int64_t rows,
                  int64_t d, T* buf) {
  if (v.stride[3] == 1 && (rows == 1 || v.stride[2] >= d))
    return MapC<T>(v.row(b, h, n0), rows, d, Eigen::OuterStride<>(rows == 1 ? d : v.stride[2]));
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = v.row(b, h, n0 + r);
    for (int64_t k = 0; k < d; ++k) buf[r * d + k] = src[k * v.stride[3]];
  }
  return MapC<T>(buf, rows, d, Eigen::OuterStride<>(d));
}

// scale * (rows x d) tile of Q, always copied: S = (scale Q) K^T (eq. 2.1) and dK = dS^T (scale Q)
// (eq. 5.7) then need no further scaling.
template <class T>
MapC<T> load_scaled(const View4<const T>& v, int64_t b, int64_t h, int64_t n0, int64_t rows,
                    int64_t d, T scale, T* buf) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = v.row(b, h, n0 + r);
    const int64_t s = v.stride[3];
    if (s == 1) {
      for (int64_t k = 0; k < d; ++k) buf[r * d + k] = scale * src[k];
    } else {
      for (int64_t k = 0; k < d; ++k) buf[r * d + k] = scale * src[k * s];
    }
  }
  return MapC<T>(buf, rows, d, Eigen::OuterStride<>(d));
}

// ------------------------------------------------------------------------------------------
// Mask plan (§3, §6.1): per local query its visible key interval [lo, hi) on global positions
// (eq. 3.4) and block row; per local key its global position and block column; per tile the
// summaries that classify a (query tile, key tile) pair as empty, fully visible or partial
// with exact, cheap tests. Only partial tiles evaluate the predicate per element.
enum class TileKind { Empty, Full, Partial };

struct Plan {
  const MaskParams* m = nullptr;
  Positions qp, kp;
  int64_t Br = 1, Bc = 1, n_qt = 0, n_kt = 0;
  std::vector<int64_t> lo, hi, brow;         // (n_q): interval, block row offset or -1
  std::vector<int64_t> kpos, bcol;           // (n_k): global key, block column
  std::vector<int64_t> q_min, q_max;         // (n_qt): global positions spanned
  std::vector<int64_t> lo_min, lo_max, hi_min, hi_max;  // (n_qt)
  std::vector<int64_t> k_min, k_max;         // (n_kt)

  Plan(const MaskParams& mask, Positions q, Positions k, int64_t br, int64_t bc)
      : m(&mask), qp(q), kp(k), Br(br), Bc(bc) {
    const int64_t nq = q.n, nk = k.n;
    n_qt = ceil_div(nq, Br);
    n_kt = ceil_div(nk, Bc);
    lo.resize(nq); hi.resize(nq); brow.resize(nq);
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t gi = q[i];
      row_range(mask, gi, &lo[i], &hi[i]);
      brow[i] = mask.block ? (gi / mask.block_q) * mask.n_block_k : -1;
    }
    kpos.resize(nk); bcol.resize(nk);
    for (int64_t j = 0; j < nk; ++j) {
      kpos[j] = k[j];
      bcol[j] = mask.block ? kpos[j] / mask.block_k : 0;
    }
    q_min.resize(n_qt); q_max.resize(n_qt);
    lo_min.resize(n_qt); lo_max.resize(n_qt); hi_min.resize(n_qt); hi_max.resize(n_qt);
    for (int64_t t = 0; t < n_qt; ++t) {
      const int64_t i0 = t * Br, i1 = std::min(nq, i0 + Br);
      q_min[t] = q_max[t] = q[i0];
      lo_min[t] = lo_max[t] = lo[i0];
      hi_min[t] = hi_max[t] = hi[i0];
      for (int64_t i = i0 + 1; i < i1; ++i) {
        q_min[t] = std::min(q_min[t], q[i]); q_max[t] = std::max(q_max[t], q[i]);
        lo_min[t] = std::min(lo_min[t], lo[i]); lo_max[t] = std::max(lo_max[t], lo[i]);
        hi_min[t] = std::min(hi_min[t], hi[i]); hi_max[t] = std::max(hi_max[t], hi[i]);
      }
    }
    k_min.resize(n_kt); k_max.resize(n_kt);
    for (int64_t t = 0; t < n_kt; ++t) {
      const int64_t j0 = t * Bc, j1 = std::min(nk, j0 + Bc);
      k_min[t] = k_max[t] = kpos[j0];
      for (int64_t j = j0 + 1; j < j1; ++j) {
        k_min[t] = std::min(k_min[t], kpos[j]);
        k_max[t] = std::max(k_max[t], kpos[j]);
      }
    }
  }

  // Classifies tile (qt, kt). For Partial, fills vis (rows x cols, row-major, 1 = visible).
  // Exact: Empty only when no pair is visible, Full only when every pair is.
  TileKind classify(int64_t qt, int64_t kt, uint8_t* vis) const {
    const int64_t kmin = k_min[kt], kmax = k_max[kt];
    if (hi_max[qt] <= kmin || lo_min[qt] > kmax) return TileKind::Empty;  // all keys in [kmin, kmax]
    const bool band_full = lo_max[qt] <= kmin && hi_min[qt] > kmax;
    if (band_full && !m->block) return TileKind::Full;
    if (m->block) {
      // Block bits over the bounding rectangle of the tile's positions: all 0 -> Empty; all 1 and
      // band_full -> Full. Skipped when the rectangle is large (scattered positions).
      const int64_t r0 = q_min[qt] / m->block_q, r1 = q_max[qt] / m->block_q;
      const int64_t c0 = kmin / m->block_k, c1 = kmax / m->block_k;
      if ((r1 - r0 + 1) * (c1 - c0 + 1) <= 256) {
        bool any = false, all = true;
        for (int64_t r = r0; r <= r1; ++r)
          for (int64_t c = c0; c <= c1; ++c) {
            const bool on = m->block[r * m->n_block_k + c] != 0;
            any |= on;
            all &= on;
          }
        if (!any) return TileKind::Empty;
        if (all && band_full) return TileKind::Full;
      }
    }
    // Per element (eq. 3.5 on global positions).
    const int64_t i0 = qt * Br, i1 = std::min(qp.n, i0 + Br);
    const int64_t j0 = kt * Bc, j1 = std::min(kp.n, j0 + Bc), cols = j1 - j0;
    int64_t count = 0;
    for (int64_t i = i0; i < i1; ++i) {
      uint8_t* v = vis + (i - i0) * cols;
      const int64_t a = lo[i], z = hi[i];
      const int64_t* kq = kpos.data() + j0;
      if (brow[i] < 0) {
        for (int64_t c = 0; c < cols; ++c) v[c] = kq[c] >= a && kq[c] < z;
      } else {
        const uint8_t* bm = m->block + brow[i];
        const int64_t* bc = bcol.data() + j0;
        for (int64_t c = 0; c < cols; ++c) v[c] = kq[c] >= a && kq[c] < z && bm[bc[c]] != 0;
      }
      for (int64_t c = 0; c < cols; ++c) count += v[c];
    }
    if (count == 0) return TileKind::Empty;
    if (count == (i1 - i0) * cols) return TileKind::Full;
    return TileKind::Partial;
  }
};

// S <- -inf where not visible (rows x cols, contiguous).
template <class T>
void apply_mask(T* S, const uint8_t* vis, int64_t n) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t e = 0; e < n; ++e) S[e] = vis[e] ? S[e] : ninf;
}

// Per-thread scratch, sized once. Aligned to Eigen's maximum packet alignment: Eigen peels the
// unaligned head of a vectorized reduction, so with malloc's varying alignment the summation
// order (and the last bits) would change from run to run; aligned buffers keep runs bitwise equal.
template <class T>
using AVec = std::vector<T, Eigen::aligned_allocator<T>>;
template <class T>
struct Scratch {
  AVec<T> qs, qbuf, dob, kb, vb, s, dp, acc, acc2, m, l, L, Dr;
  std::vector<uint8_t> vis;
  Scratch(int64_t Br, int64_t Bc, int64_t d) {
    qs.resize(Br * d); qbuf.resize(Br * d); dob.resize(Br * d);
    kb.resize(Bc * d); vb.resize(Bc * d);
    s.resize(Br * Bc); dp.resize(Br * Bc);
    acc.resize(std::max(Br, Bc) * d); acc2.resize(Bc * d);
    m.resize(Br); l.resize(Br); L.resize(Br); Dr.resize(Br);
    vis.resize(Br * Bc);
  }
};

void check_positions(const char* name, Positions pos, int64_t N, const char* n_name) {
  if (pos.n < 0) fail(name, ".n (", pos.n, ") must be >= 0");
  if (!pos.index) {
    if (pos.start < 0 || pos.start + pos.n > N)
      fail(name, " [", pos.start, ", ", pos.start + pos.n, ") must lie in [0, ", n_name, " = ", N, ")");
    return;
  }
  for (int64_t k = 0; k < pos.n; ++k)
    if (pos.index[k] < 0 || pos.index[k] >= N)
      fail(name, "[", k, "] (", pos.index[k], ") must be in [0, ", n_name, " = ", N, ")");
}

void check_block_args(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                      const Tiles& tiles) {
  validate(p);
  validate_tiles(tiles);
  if (mask.N_q != p.N_q) fail("mask.N_q (", mask.N_q, ") must equal N_q (", p.N_q, ")");
  if (mask.N_k != p.N_k) fail("mask.N_k (", mask.N_k, ") must equal N_k (", p.N_k, ")");
  if (mask.block && (mask.block_q < 1 || mask.block_k < 1))
    fail("mask.block_q (", mask.block_q, ") and mask.block_k (", mask.block_k, ") must be >= 1");
  check_positions("q_pos", q_pos, p.N_q, "N_q");
  check_positions("k_pos", k_pos, p.N_k, "N_k");
}

// ------------------------------------------------------------------------------------------
// Forward over one block (§4.1, §6.1), eq. (4.1)-(4.4). Q (B, H_q, nq, d); K, V (B, H_kv, nk, d);
// O (B, H_q, nq, d); LSE (B, H_q, nq). Arguments validated by the caller.
template <class T>
void forward_impl(const Problem& p, const MaskParams& mask, Positions qp, Positions kp,
                  View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O, View3<T> LSE,
                  Tiles tiles) {
  const int64_t nq = qp.n, nk = kp.n, d = p.d, G = group_size(p);
  if (nq == 0) return;
  const int64_t Br = std::min(tiles.Br, nq), Bc = std::min(tiles.Bc, std::max<int64_t>(nk, 1));
  const T scale = static_cast<T>(scale_of(p));
  const T ninf = -std::numeric_limits<T>::infinity();
  const Plan plan(mask, qp, kp, Br, Bc);
  const int64_t n_tasks = p.B * p.H_q * plan.n_qt;

  // An exception (Scratch's allocation: std::bad_alloc) may not leave the region: it is kept
  // and rethrown after it (burstlab/parallel.hpp). A thread whose Scratch failed runs no task.
  FirstError err;
#pragma omp parallel
  {
    std::optional<Scratch<T>> ws;
    err.run([&] { ws.emplace(Br, Bc, d); });
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks; ++task) err.run([&] {
      if (!ws) return;
      Scratch<T>& w = *ws;
      const int64_t qt = task % plan.n_qt, bh = task / plan.n_qt;
      const int64_t h = bh % p.H_q, b = bh / p.H_q, hk = kv_head(h, G);
      const int64_t i0 = qt * Br, rows = std::min(Br, nq - i0);
      T* m = w.m.data();  // running max m, eq. (4.1)
      T* l = w.l.data();  // running sum l, eq. (4.2)
      MapM<T> Oacc(w.acc.data(), rows, d, Eigen::OuterStride<>(d));  // O~ (unnormalized), eq. (4.3)
      Oacc.setZero();
      for (int64_t r = 0; r < rows; ++r) { m[r] = ninf; l[r] = T(0); }
      const MapC<T> Qs = load_scaled(Q, b, h, i0, rows, d, scale, w.qs.data());
      for (int64_t kt = 0; kt < plan.n_kt; ++kt) {
        const TileKind kind = plan.classify(qt, kt, w.vis.data());
        if (kind == TileKind::Empty) continue;
        const int64_t j0 = kt * Bc, cols = std::min(Bc, nk - j0);
        const MapC<T> Kt = load_tile(K, b, hk, j0, cols, d, w.kb.data());
        const MapC<T> Vt = load_tile(V, b, hk, j0, cols, d, w.vb.data());
        MapM<T> S(w.s.data(), rows, cols, Eigen::OuterStride<>(cols));
        S.noalias() = Qs * Kt.transpose();  // S, eq. (2.1); scale folded into Qs
        if (kind == TileKind::Partial) apply_mask(w.s.data(), w.vis.data(), rows * cols);
        // eq. (4.1)-(4.3): online softmax; exp(S - m_new) overwrites S.
        for (int64_t r = 0; r < rows; ++r) {
          T* srow = w.s.data() + r * cols;
          const T m_new = std::max(m[r], row_max(srow, cols));
          if (m_new == ninf) {  // nothing visible in this row yet: P = 0
            for (int64_t c = 0; c < cols; ++c) srow[c] = T(0);
            continue;
          }
          const T sum = row_exp_sum(srow, cols, m_new);
          if (m_new != m[r]) {
            const T alpha = m[r] == ninf ? T(0) : std::exp(m[r] - m_new);
            l[r] *= alpha;
            Oacc.row(r) *= alpha;
            m[r] = m_new;
          }
          l[r] += sum;
        }
        Oacc.noalias() += S * Vt;
      }
      // eq. (4.4): O = O_acc / l, LSE = m + log l; empty rows O = 0, LSE = -inf (§2.3).
      for (int64_t r = 0; r < rows; ++r) {
        T* orow = O.row(b, h, i0 + r);
        const int64_t so = O.stride[3];
        if (m[r] == ninf || !(l[r] > T(0))) {
          for (int64_t k = 0; k < d; ++k) orow[k * so] = T(0);
          LSE(b, h, i0 + r) = ninf;
        } else {
          const T inv = T(1) / l[r];
          for (int64_t k = 0; k < d; ++k) orow[k * so] = Oacc(r, k) * inv;
          LSE(b, h, i0 + r) = m[r] + std::log(l[r]);
        }
      }
    });
  }
  err.rethrow();
}

// P (eq. 5.2) recomputed from the global LSE into S (rows x cols) in place; masked entries are
// -inf already and give exactly 0; rows with LSE = -inf (empty) give 0.
template <class T>
void recompute_P(T* S, const T* L, int64_t rows, int64_t cols) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    T* srow = S + r * cols;
    const T Lr = L[r];
    if (Lr == ninf || std::isnan(Lr)) {
      for (int64_t c = 0; c < cols; ++c) srow[c] = Lr == ninf ? T(0) : Lr;
      continue;
    }
    row_exp_sum(srow, cols, Lr);
  }
}

// dS = P o (dP - D) (eq. 5.5), written over dP.
template <class T>
void make_dS(const T* P, T* dP, const T* D, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* prow = P + r * cols;
    T* drow = dP + r * cols;
    const T Dr = D[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) drow[c] = prow[c] * (drow[c] - Dr);
  }
}

// Backward over one block, eq. (5.2)-(5.7), ACCUMULATING into dQ, dK, dV. LSE, D global.
template <class T>
void backward_impl(const Problem& p, const MaskParams& mask, Positions qp, Positions kp,
                   View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                   View3<const T> LSE, View3<const T> D, View4<T> dQ, View4<T> dK, View4<T> dV,
                   Tiles tiles) {
  const int64_t nq = qp.n, nk = kp.n, d = p.d, G = group_size(p);
  if (nq == 0 || nk == 0) return;
  const int64_t Br = std::min(tiles.Br, nq), Bc = std::min(tiles.Bc, nk);
  const T scale = static_cast<T>(scale_of(p));
  const Plan plan(mask, qp, kp, Br, Bc);

  // Pass 1 (§5.3): each (b, kv-head, key tile) owns its rows of dK, dV (eq. 5.3, 5.7), summing
  // over the group's q-heads and every query tile in a fixed order.
  const int64_t n_tasks1 = p.B * p.H_kv * plan.n_kt;
  FirstError err;  // as in forward_impl: kept, rethrown after each region
#pragma omp parallel
  {
    std::optional<Scratch<T>> ws;
    err.run([&] { ws.emplace(Br, Bc, d); });
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks1; ++task) err.run([&] {
      if (!ws) return;
      Scratch<T>& w = *ws;
      const int64_t kt = task % plan.n_kt, bh = task / plan.n_kt;
      const int64_t hk = bh % p.H_kv, b = bh / p.H_kv;
      const int64_t j0 = kt * Bc, cols = std::min(Bc, nk - j0);
      const MapC<T> Kt = load_tile(K, b, hk, j0, cols, d, w.kb.data());
      const MapC<T> Vt = load_tile(V, b, hk, j0, cols, d, w.vb.data());
      MapM<T> dKacc(w.acc.data(), cols, d, Eigen::OuterStride<>(d));
      MapM<T> dVacc(w.acc2.data(), cols, d, Eigen::OuterStride<>(d));
      dKacc.setZero();
      dVacc.setZero();
      bool any = false;
      for (int64_t qt = 0; qt < plan.n_qt; ++qt) {
        const TileKind kind = plan.classify(qt, kt, w.vis.data());
        if (kind == TileKind::Empty) continue;
        any = true;
        const int64_t i0 = qt * Br, rows = std::min(Br, nq - i0);
        for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
          const MapC<T> Qs = load_scaled(Q, b, h, i0, rows, d, scale, w.qs.data());
          const MapC<T> dOt = load_tile(dO, b, h, i0, rows, d, w.dob.data());
          for (int64_t r = 0; r < rows; ++r) {
            w.L[r] = LSE(b, h, i0 + r);
            w.Dr[r] = D(b, h, i0 + r);
          }
          MapM<T> S(w.s.data(), rows, cols, Eigen::OuterStride<>(cols));
          MapM<T> dP(w.dp.data(), rows, cols, Eigen::OuterStride<>(cols));
          S.noalias() = Qs * Kt.transpose();  // S, eq. (2.1)
          if (kind == TileKind::Partial) apply_mask(w.s.data(), w.vis.data(), rows * cols);
          recompute_P(w.s.data(), w.L.data(), rows, cols);  // eq. (5.2)
          dVacc.noalias() += S.transpose() * dOt;            // eq. (5.3)
          dP.noalias() = dOt * Vt.transpose();               // eq. (5.4)
          make_dS(w.s.data(), w.dp.data(), w.Dr.data(), rows, cols);  // eq. (5.5)
          dKacc.noalias() += dP.transpose() * Qs;            // eq. (5.7), scale in Qs
        }
      }
      if (!any) return;
      for (int64_t r = 0; r < cols; ++r) {
        T* dk = dK.row(b, hk, j0 + r);
        T* dv = dV.row(b, hk, j0 + r);
        const int64_t sk = dK.stride[3], sv = dV.stride[3];
        for (int64_t k = 0; k < d; ++k) {
          dk[k * sk] += dKacc(r, k);
          dv[k * sv] += dVacc(r, k);
        }
      }
    });
  }
  err.rethrow();

  // Pass 2: each (b, h, query tile) owns its rows of dQ (eq. 5.6).
  const int64_t n_tasks2 = p.B * p.H_q * plan.n_qt;
#pragma omp parallel
  {
    std::optional<Scratch<T>> ws;
    err.run([&] { ws.emplace(Br, Bc, d); });
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks2; ++task) err.run([&] {
      if (!ws) return;
      Scratch<T>& w = *ws;
      const int64_t qt = task % plan.n_qt, bh = task / plan.n_qt;
      const int64_t h = bh % p.H_q, b = bh / p.H_q, hk = kv_head(h, G);
      const int64_t i0 = qt * Br, rows = std::min(Br, nq - i0);
      MapM<T> dQacc(w.acc.data(), rows, d, Eigen::OuterStride<>(d));
      dQacc.setZero();
      bool any = false;
      const MapC<T> Qs = load_scaled(Q, b, h, i0, rows, d, scale, w.qs.data());
      const MapC<T> dOt = load_tile(dO, b, h, i0, rows, d, w.dob.data());
      for (int64_t r = 0; r < rows; ++r) {
        w.L[r] = LSE(b, h, i0 + r);
        w.Dr[r] = D(b, h, i0 + r);
      }
      for (int64_t kt = 0; kt < plan.n_kt; ++kt) {
        const TileKind kind = plan.classify(qt, kt, w.vis.data());
        if (kind == TileKind::Empty) continue;
        any = true;
        const int64_t j0 = kt * Bc, cols = std::min(Bc, nk - j0);
        const MapC<T> Kt = load_tile(K, b, hk, j0, cols, d, w.kb.data());
        const MapC<T> Vt = load_tile(V, b, hk, j0, cols, d, w.vb.data());
        MapM<T> S(w.s.data(), rows, cols, Eigen::OuterStride<>(cols));
        MapM<T> dP(w.dp.data(), rows, cols, Eigen::OuterStride<>(cols));
        S.noalias() = Qs * Kt.transpose();
        if (kind == TileKind::Partial) apply_mask(w.s.data(), w.vis.data(), rows * cols);
        recompute_P(w.s.data(), w.L.data(), rows, cols);
        dP.noalias() = dOt * Vt.transpose();
        make_dS(w.s.data(), w.dp.data(), w.Dr.data(), rows, cols);
        dQacc.noalias() += dP * Kt;  // eq. (5.6) without the scale
      }
      if (!any) return;
      for (int64_t r = 0; r < rows; ++r) {
        T* dq = dQ.row(b, h, i0 + r);
        const int64_t s = dQ.stride[3];
        for (int64_t k = 0; k < d; ++k) dq[k * s] += scale * dQacc(r, k);
      }
    });
  }
  err.rethrow();
}

template <class T>
void fill4(View4<T> v, T value) {
  for (int64_t b = 0; b < v.dim[0]; ++b)
    for (int64_t h = 0; h < v.dim[1]; ++h)
      for (int64_t n = 0; n < v.dim[2]; ++n)
        for (int64_t k = 0; k < v.dim[3]; ++k) v(b, h, n, k) = value;
}

}  // namespace

// ---------------------------------------------------------------------------- entry points

template <class T>
void forward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
             View3<T> LSE, Tiles tiles) {
  validate_forward_views(p, Q, K, V, O, LSE);
  validate_tiles(tiles);
  const MaskData md = compile_mask(p);
  const MaskParams mp = md.params();
  forward_impl<T>(p, mp, contiguous(0, p.N_q), contiguous(0, p.N_k), Q, K, V, O, LSE, tiles);
}

template <class T>
void forward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                   View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O, View3<T> LSE,
                   Tiles tiles) {
  check_block_args(p, mask, q_pos, k_pos, tiles);
  validate_block_forward_views(p, q_pos.n, k_pos.n, Q, K, V, O, LSE);
  if (q_pos.n == 0) return;
  if (k_pos.n == 0) {  // no keys: the identity (O = 0, LSE = -inf) of §4.2
    fill4(O, T(0));
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H_q; ++h)
        for (int64_t i = 0; i < q_pos.n; ++i) LSE(b, h, i) = -std::numeric_limits<T>::infinity();
    return;
  }
  forward_impl<T>(p, mask, q_pos, k_pos, Q, K, V, O, LSE, tiles);
}

template <class T>
void compute_D(View4<const T> O, View4<const T> dO, View3<T> D) {
  const int64_t e4[4] = {O.dim[0], O.dim[1], O.dim[2], O.dim[3]};
  const int64_t e3[3] = {O.dim[0], O.dim[1], O.dim[2]};
  for (int a = 0; a < 4; ++a)
    if (O.dim[a] < 0) fail("O.dim[", a, "] (", O.dim[a], ") must be >= 0");
  const int64_t n = O.dim[0] * O.dim[1] * O.dim[2];
  if (n * O.dim[3] > 0) {
    validate_view("O", O.dim, O.data, 4, e4);
    validate_view("dO", dO.dim, dO.data, 4, e4);
  } else {
    for (int a = 0; a < 4; ++a)
      if (dO.dim[a] != e4[a]) fail("dO.dim[", a, "] (", dO.dim[a], ") must equal O.dim[", a, "] (", e4[a], ")");
  }
  if (n > 0) validate_view("D", D.dim, D.data, 3, e3);
  const int64_t d = O.dim[3];
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const int64_t i = t % O.dim[2], bh = t / O.dim[2], h = bh % O.dim[1], b = bh / O.dim[1];
    const T* o = O.row(b, h, i);
    const T* g = dO.row(b, h, i);
    T s = T(0);
    for (int64_t k = 0; k < d; ++k) s += g[k * dO.stride[3]] * o[k * O.stride[3]];
    D(b, h, i) = s;
  }
}

template <class T>
void backward(const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
              View4<const T> O, View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK,
              View4<T> dV, Tiles tiles) {
  validate_backward_views(p, Q, K, V, O, dO, LSE, dQ, dK, dV);
  validate_tiles(tiles);
  const MaskData md = compile_mask(p);
  const MaskParams mp = md.params();
  Tensor3<T> D = make_tensor3<T>(p.B, p.H_q, p.N_q);  // (B, H_q, N_q), eq. (5.1)
  compute_D<T>(O, dO, D.view());
  fill4(dQ, T(0));
  fill4(dK, T(0));
  fill4(dV, T(0));
  backward_impl<T>(p, mp, contiguous(0, p.N_q), contiguous(0, p.N_k), Q, K, V, dO, LSE,
                   as_const(D.view()), dQ, dK, dV, tiles);
}

template <class T>
void backward_block(const Problem& p, const MaskParams& mask, Positions q_pos, Positions k_pos,
                    View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> dO,
                    View3<const T> LSE, View3<const T> D, View4<T> dQ, View4<T> dK, View4<T> dV,
                    Tiles tiles) {
  check_block_args(p, mask, q_pos, k_pos, tiles);
  validate_block_backward_views(p, q_pos.n, k_pos.n, Q, K, V, dO, LSE, D, dQ, dK, dV);
  backward_impl<T>(p, mask, q_pos, k_pos, Q, K, V, dO, LSE, D, dQ, dK, dV, tiles);
}

#define BURSTLAB_CPU_INSTANTIATE(T)                                                            \
  template void forward<T>(const Problem&, View4<const T>, View4<const T>, View4<const T>,      \
                           View4<T>, View3<T>, Tiles);                                          \
  template void forward_block<T>(const Problem&, const MaskParams&, Positions, Positions,       \
                                 View4<const T>, View4<const T>, View4<const T>, View4<T>,      \
                                 View3<T>, Tiles);                                              \
  template void compute_D<T>(View4<const T>, View4<const T>, View3<T>);                         \
  template void backward<T>(const Problem&, View4<const T>, View4<const T>, View4<const T>,     \
                            View4<const T>, View4<const T>, View3<const T>, View4<T>, View4<T>, \
                            View4<T>, Tiles);                                                   \
  template void backward_block<T>(const Problem&, const MaskParams&, Positions, Positions,      \
                                  View4<const T>, View4<const T>, View4<const T>,               \
                                  View4<const T>, View3<const T>, View3<const T>, View4<T>,     \
                                  View4<T>, View4<T>, Tiles);

BURSTLAB_CPU_INSTANTIATE(float)
BURSTLAB_CPU_INSTANTIATE(double)

}  // namespace burstlab::cpu
