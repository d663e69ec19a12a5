// layer/layer.cpp — spec §11: the layer (eq. 11.1-11.9) and its checkpoint placements.
//
// Determinism (what makes the placements bitwise equal, §11.2). A recomputation calls the same
// function on the same inputs as the forward did, and every function here returns the same bits
// for the same inputs whatever the thread count or schedule:
//   * the products (matmul*) give every output element to exactly one thread, which sums over the
//     inner index in increasing order; OpenMP only decides which thread, never the order;
//   * the pointwise parts (residual adds, silu) are elementwise;
//   * cpu/ attention is deterministic by construction (cpu/cpu.cpp: no atomics, fixed tile order),
//     and its forward of the rows [a, b) runs exactly the forward's own query tiles when a and b
//     are multiples of the tile height Br (or b = N): the tiles are self-contained (each walks
//     every key tile in the same order with the same shapes), so the rows come out bitwise equal;
//   * reference/ attention is a fixed sequence of Eigen calls per (b, h).
#include "layer.hpp"

#include "burstlab/block_split.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "burstlab/error.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/names.hpp"
#include "reference.hpp"

namespace burstlab::layer {

void validate(const Shape& s) {
  validate(s.p);
  if (s.p.N_k != s.p.N_q)
    fail("N_k (", s.p.N_k, ") must equal N_q (", s.p.N_q, "): the layer's attention is self-attention (spec §11.1)");
  if (s.D < 1) fail("D (", s.D, ") must be >= 1");
  if (s.F < 1) fail("F (", s.F, ") must be >= 1");
}

namespace {

void check_size(const char* name, size_t have, const char* dims, int64_t a, int64_t b) {
  if (static_cast<int64_t>(have) != a * b)
    fail(name, " has ", have, " elements; ", dims, " = (", a, ", ", b, ") needs ", a * b);
}
void check_size3(const char* name, size_t have, const char* dims, int64_t a, int64_t b, int64_t c) {
  if (static_cast<int64_t>(have) != a * b * c)
    fail(name, " has ", have, " elements; ", dims, " = (", a, ", ", b, ", ", c, ") needs ", a * b * c);
}

}  // namespace

template <class T>
void validate_weights(const Shape& s, const Weights<T>& w) {
  validate(s);
  const int64_t qd = s.p.H_q * s.p.d, kd = s.p.H_kv * s.p.d;
  check_size("Wq", w.Wq.size(), "(D, H_q d)", s.D, qd);
  check_size("Wk", w.Wk.size(), "(D, H_kv d)", s.D, kd);
  check_size("Wv", w.Wv.size(), "(D, H_kv d)", s.D, kd);
  check_size("Wo", w.Wo.size(), "(H_q d, D)", qd, s.D);
  check_size("W1", w.W1.size(), "(D, F)", s.D, s.F);
  check_size("W2", w.W2.size(), "(F, D)", s.F, s.D);
}

template <class T>
std::vector<T> make_values(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(z(gen));
  return v;
}

template <class T>
Weights<T> make_weights(const Shape& s, uint64_t seed) {
  validate(s);
  const int64_t qd = s.p.H_q * s.p.d, kd = s.p.H_kv * s.p.d;
  // N(0, 1 / fan_in): activations stay O(1) through the layer.
  auto w = [&](int64_t fan_in, int64_t fan_out, uint64_t k) {
    std::vector<T> v = make_values<T>(fan_in * fan_out, seed * 16 + k);
    const double c = 1.0 / std::sqrt(double(fan_in));
    for (T& x : v) x = static_cast<T>(double(x) * c);
    return v;
  };
  return Weights<T>{w(s.D, qd, 1), w(s.D, kd, 2), w(s.D, kd, 3), w(qd, s.D, 4), w(s.D, s.F, 5), w(s.F, s.D, 6)};
}

constexpr Named<Placement> kPlacementNames[] = {
    {Placement::None, "none"}, {Placement::Layer, "layer"}, {Placement::Remat, "remat"}, {Placement::Sequence, "sequence"}};

std::string to_string(Placement x) { return name_of(x, kPlacementNames); }

Placement parse_placement(const std::string& s) { return parse_named(s, kPlacementNames, "placement"); }

void validate(const Shape& s, const Checkpointing& c, int64_t row_quantum) {
  validate(s);
  const int64_t N = s.p.N_q;
  if (c.placement != Placement::Sequence) {
    if (!c.bounds.empty() || !c.keep.empty())
      fail("bounds and keep are fields of the sequence placement; placement is ", to_string(c.placement));
    return;
  }
  if (c.bounds.size() < 2) fail("bounds (", c.bounds.size(), " entries) must hold at least 0 and N (", N, ")");
  if (c.bounds.front() != 0) fail("bounds[0] (", c.bounds.front(), ") must be 0");
  if (c.bounds.back() != N) fail("bounds[", c.bounds.size() - 1, "] (", c.bounds.back(), ") must be N (", N, ")");
  for (size_t k = 1; k < c.bounds.size(); ++k)
    if (c.bounds[k] <= c.bounds[k - 1])
      fail("bounds[", k, "] (", c.bounds[k], ") must be greater than bounds[", k - 1, "] (", c.bounds[k - 1], ")");
  if (c.keep.size() != c.bounds.size() - 1)
    fail("keep (", c.keep.size(), " entries) must have one entry per segment (", c.bounds.size() - 1, ")");
  if (row_quantum < 1) fail("row_quantum (", row_quantum, ") must be >= 1");
  const int64_t q = std::min(row_quantum, N);
  for (size_t k = 0; k < c.keep.size(); ++k) {
    if (c.keep[k] > 1) fail("keep[", k, "] (", int(c.keep[k]), ") must be 0 (recompute) or 1 (keep)");
    if (c.keep[k]) continue;
    for (const int64_t e : {c.bounds[k], c.bounds[k + 1]})
      if (e % q != 0 && e != N)
        fail("bound ", e, " of recomputed segment ", k, " must be a multiple of the attention's query tile (", q,
             ") or N (", N, "): the recompute then replays the forward's own tiles (spec §11.2)");
  }
}

int64_t rows_pairs(const Problem& p, int64_t a, int64_t b) {
  const MaskData md = compile_mask(p);
  return count_visible(md.params(), a, b, 0, p.N_k);
}

std::vector<int64_t> segment_bounds(int64_t N, int64_t rows) {
  if (N < 1) fail("N (", N, ") must be >= 1");
  if (rows < 1) fail("rows (", rows, ") per segment must be >= 1");
  std::vector<int64_t> b;
  for (int64_t a = 0; a < N; a += rows) b.push_back(a);
  b.push_back(N);
  return b;
}

Checkpointing sequence_checkpointing(const Problem& p, const std::vector<int64_t>& bounds, int64_t keep_rows) {
  Checkpointing c;
  c.placement = Placement::Sequence;
  c.bounds = bounds;
  c.keep.assign(bounds.size() > 0 ? bounds.size() - 1 : 0, 0);
  Shape s;
  s.p = p;
  validate(s, c, 1);
  if (keep_rows < 0 || keep_rows > p.N_q) fail("keep_rows (", keep_rows, ") must lie in [0, N = ", p.N_q, "]");
  const MaskData md = compile_mask(p);
  struct Seg {
    size_t k;
    int64_t pairs, rows;
  };
  std::vector<Seg> seg;
  for (size_t k = 0; k + 1 < bounds.size(); ++k)
    seg.push_back({k, count_visible(md.params(), bounds[k], bounds[k + 1], 0, p.N_k), bounds[k + 1] - bounds[k]});
  std::sort(seg.begin(), seg.end(), [](const Seg& a, const Seg& b) {
    return a.pairs != b.pairs ? a.pairs > b.pairs : a.k > b.k;
  });
  int64_t kept = 0;
  for (const Seg& x : seg)
    if (kept + x.rows <= keep_rows) {
      c.keep[x.k] = 1;
      kept += x.rows;
    }
  return c;
}

int64_t saved_bytes(const Shape& s, Placement placement, int64_t n_keep, int64_t elem_bytes) {
  validate(s);
  const int64_t BN = tokens(s), qd = s.p.H_q * s.p.d, kd = s.p.H_kv * s.p.d, H = s.p.H_q, B = s.p.B;
  int64_t e = 0;
  switch (placement) {  // eq. (11.10)
    case Placement::None: e = BN * (2 * s.D + 2 * qd + 2 * kd + 2 * s.F) + BN * H; break;
    case Placement::Layer: e = BN * s.D; break;
    case Placement::Remat: e = BN * (s.D + qd) + BN * H; break;
    case Placement::Sequence: e = BN * s.D + B * n_keep * (qd + H); break;
  }
  return e * elem_bytes;
}

template <class T>
int64_t Saved<T>::bytes() const {
  size_t n = 0;
  for (const std::vector<T>* v : {&x, &Q, &K, &V, &A, &LSE, &h, &u, &g}) n += v->size();
  return static_cast<int64_t>(n * sizeof(T));
}

// ---------------------------------------------------------------------------- attention

template <class T>
AttentionOps<T> cpu_attention(cpu::Tiles tiles) {
  cpu::validate_tiles(tiles);
  AttentionOps<T> a;
  a.name = "cpu";
  a.row_quantum = tiles.Br;
  a.forward = [tiles](const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                      View3<T> LSE) { cpu::forward<T>(p, Q, K, V, O, LSE, tiles); };
  a.forward_rows = [tiles](const Problem& p, Positions rows, View4<const T> Q, View4<const T> K, View4<const T> V,
                           View4<T> O, View3<T> LSE) {
    const MaskData md = compile_mask(p);
    cpu::forward_block<T>(p, md.params(), rows, contiguous(0, p.N_k), Q, K, V, O, LSE, tiles);
  };
  a.backward = [tiles](const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> O,
                       View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK, View4<T> dV) {
    cpu::backward<T>(p, Q, K, V, O, dO, LSE, dQ, dK, dV, tiles);
  };
  return a;
}

template <class T>
AttentionOps<T> reference_attention() {
  AttentionOps<T> a;
  a.name = "reference";
  a.forward = [](const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O, View3<T> LSE) {
    reference::forward<T>(p, Q, K, V, O, LSE);
  };
  a.backward = [](const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<const T> O,
                  View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK, View4<T> dV) {
    reference::backward<T>(p, Q, K, V, O, dO, LSE, dQ, dK, dV);
  };
  return a;
}

// ---------------------------------------------------------------------------- dense parts

namespace {

// A thread team only when there is enough work: small products (the tests' layers) would pay a
// team's start and barrier per call, and far more on a loaded machine. Bits do not depend on it.
inline bool worth_threads(int64_t m, int64_t k, int64_t n) { return double(m) * double(k) * double(n) >= 1 << 20; }

// C (rows, n), row r = sum over s = 0, 1, ... of A[r a_r + s a_s] B[s, :], in that order, by one
// thread: the product and the weight-gradient product below, with A read straight or transposed.
template <class T>
void sum_scaled_rows(const T* A, int64_t a_r, int64_t a_s, const T* B, T* C, int64_t rows, int64_t inner, int64_t n) {
#pragma omp parallel for schedule(static) if (worth_threads(rows, inner, n))
  for (int64_t r = 0; r < rows; ++r) {
    T* c = C + r * n;
    for (int64_t j = 0; j < n; ++j) c[j] = T(0);
    for (int64_t s = 0; s < inner; ++s) {
      const T a = A[r * a_r + s * a_s];
      const T* b = B + s * n;
      for (int64_t j = 0; j < n; ++j) c[j] += a * b[j];
    }
  }
}
// C (m, n) = A (m, k) B (k, n). Row i of C by one thread, c_ij summed over k in order.
template <class T>
void matmul(const T* A, const T* B, T* C, int64_t m, int64_t k, int64_t n) {
  sum_scaled_rows(A, k, 1, B, C, m, k, n);
}
// C (k, n) = A^T B with A (m, k), B (m, n): a weight gradient, summed over the m tokens in order.
template <class T>
void matmul_tn(const T* A, const T* B, T* C, int64_t m, int64_t k, int64_t n) {
  sum_scaled_rows(A, 1, k, B, C, k, m, n);
}
// C (m, k) = A B^T with A (m, n), B (k, n): a gradient through a weight.
template <class T>
void matmul_nt(const T* A, const T* B, T* C, int64_t m, int64_t k, int64_t n) {
#pragma omp parallel for schedule(static) if (worth_threads(m, k, n))
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < k; ++t) {
      const T* a = A + i * n;
      const T* b = B + t * n;
      T s = T(0);
      for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
      C[i * k + t] = s;
    }
}

// Rows of the kept segments (sequence placement).
int64_t kept_rows(const Checkpointing& c) {
  int64_t n = 0;
  for (size_t k = 0; k < c.keep.size(); ++k)
    if (c.keep[k]) n += c.bounds[k + 1] - c.bounds[k];
  return n;
}

// The kept segments' rows between the full activations A (B, N, H_q d), LSE (B, H_q, N) and the
// saved ones, kept_A (B, n_keep, H_q d), kept_LSE (B, H_q, n_keep): Save copies full -> saved,
// otherwise saved -> full.
template <bool Save, class Full, class Kept>
void copy_kept(const Checkpointing& c, int64_t B, int64_t N, int64_t H, int64_t qd, Full& A, Full& LSE, Kept& kept_A,
               Kept& kept_LSE) {
  const int64_t n_keep = kept_rows(c);
  auto copy = [](auto full, auto kept, int64_t n) {
    if constexpr (Save) std::copy_n(full, n, kept);
    else std::copy_n(kept, n, full);
  };
  for (int64_t b = 0; b < B; ++b) {
    int64_t r = 0;
    for (size_t k = 0; k < c.keep.size(); ++k) {
      if (!c.keep[k]) continue;
      const int64_t i0 = c.bounds[k], n = c.bounds[k + 1] - i0;
      copy(A.begin() + (b * N + i0) * qd, kept_A.begin() + (b * n_keep + r) * qd, n * qd);
      for (int64_t h = 0; h < H; ++h)
        copy(LSE.begin() + (b * H + h) * N + i0, kept_LSE.begin() + (b * H + h) * n_keep + r, n);
      r += n;
    }
  }
}

template <class T>
T sigmoid(T u) {
  return T(1) / (T(1) + std::exp(-u));
}

// Views of the row-major activations: Q, A (B, N, H_q d) are (B, H_q, N, d) in BSHD.
template <class T>
View4<T> heads(std::vector<T>& x, const Shape& s, int64_t H) {
  return view4(x.data(), Layout::BSHD, s.p.B, H, s.p.N_q, s.p.d);
}
template <class T>
View4<const T> heads(const std::vector<T>& x, const Shape& s, int64_t H) {
  return as_const(view4(const_cast<T*>(x.data()), Layout::BSHD, s.p.B, H, s.p.N_q, s.p.d));
}

// Everything between x and y (eq. 11.1-11.5) that a placement may keep or recompute.
template <class T>
struct Acts {
  std::vector<T> Q, K, V, A, LSE, h, u, g;
};

// eq. (11.1): Q = x Wq, K = x Wk, V = x Wv.
template <class T>
void project(const Shape& s, const Weights<T>& w, const std::vector<T>& x, Acts<T>& a) {
  const int64_t BN = tokens(s), qd = s.p.H_q * s.p.d, kd = s.p.H_kv * s.p.d;
  a.Q.resize(BN * qd);
  a.K.resize(BN * kd);
  a.V.resize(BN * kd);
  matmul(x.data(), w.Wq.data(), a.Q.data(), BN, s.D, qd);
  matmul(x.data(), w.Wk.data(), a.K.data(), BN, s.D, kd);
  matmul(x.data(), w.Wv.data(), a.V.data(), BN, s.D, kd);
}

// eq. (11.2): the whole-sequence attention forward.
template <class T>
void attend(const Shape& s, const AttentionOps<T>& attn, Acts<T>& a, Counters& count) {
  a.A.resize(tokens(s) * s.p.H_q * s.p.d);
  a.LSE.resize(s.p.B * s.p.H_q * s.p.N_q);
  attn.forward(s.p, heads(std::as_const(a.Q), s, s.p.H_q), heads(std::as_const(a.K), s, s.p.H_kv),
               heads(std::as_const(a.V), s, s.p.H_kv), heads(a.A, s, s.p.H_q),
               view3(a.LSE.data(), s.p.B, s.p.H_q, s.p.N_q));
  count.attention_forwards += 1;
  count.forward_rows += s.p.N_q;
  count.forward_pairs += visible_pairs(s.p);
}

// eq. (11.3)-(11.4): h = x + A Wo, u = h W1, g = silu(u).
template <class T>
void mlp_inputs(const Shape& s, const Weights<T>& w, const std::vector<T>& x, const std::vector<T>& A, Acts<T>& a) {
  const int64_t BN = tokens(s), qd = s.p.H_q * s.p.d;
  a.h.resize(BN * s.D);
  matmul(A.data(), w.Wo.data(), a.h.data(), BN, qd, s.D);
  for (size_t e = 0; e < a.h.size(); ++e) a.h[e] = x[e] + a.h[e];
  a.u.resize(BN * s.F);
  a.g.resize(BN * s.F);
  matmul(a.h.data(), w.W1.data(), a.u.data(), BN, s.D, s.F);
  for (size_t e = 0; e < a.u.size(); ++e) a.g[e] = a.u[e] * sigmoid(a.u[e]);
}

}  // namespace

// ---------------------------------------------------------------------------- forward, backward

template <class T>
std::vector<T> forward(const Shape& s, const Weights<T>& w, const std::vector<T>& x, const Checkpointing& ckpt,
                       const AttentionOps<T>& attn, Saved<T>& saved, Counters& count) {
  validate_weights(s, w);
  validate(s, ckpt, attn.row_quantum);
  check_size("x", x.size(), "(B N, D)", tokens(s), s.D);
  const bool recomputes_rows =
      ckpt.placement == Placement::Sequence && std::count(ckpt.keep.begin(), ckpt.keep.end(), 0) > 0;
  if (recomputes_rows && !attn.forward_rows)
    fail("attention '", attn.name, "' has no forward over a subset of query rows; the sequence placement "
         "recomputes some (use cpu, or keep every segment)");
  Acts<T> a;
  project(s, w, x, a);
  attend(s, attn, a, count);
  mlp_inputs(s, w, x, a.A, a);
  const int64_t BN = tokens(s);
  std::vector<T> y(BN * s.D);
  matmul(a.g.data(), w.W2.data(), y.data(), BN, s.F, s.D);  // eq. (11.5): y = h + g W2
  for (size_t e = 0; e < y.size(); ++e) y[e] = a.h[e] + y[e];

  saved = Saved<T>{};
  saved.ckpt = ckpt;
  saved.x = x;
  switch (ckpt.placement) {
    case Placement::None:
      saved.Q = std::move(a.Q); saved.K = std::move(a.K); saved.V = std::move(a.V);
      saved.A = std::move(a.A); saved.LSE = std::move(a.LSE);
      saved.h = std::move(a.h); saved.u = std::move(a.u); saved.g = std::move(a.g);
      break;
    case Placement::Layer:
      break;
    case Placement::Remat:
      saved.A = std::move(a.A); saved.LSE = std::move(a.LSE);
      break;
    case Placement::Sequence: {  // the kept segments' rows, in order
      const int64_t B = s.p.B, N = s.p.N_q, H = s.p.H_q, qd = H * s.p.d;
      const int64_t n_keep = kept_rows(ckpt);
      saved.A.resize(B * n_keep * qd);   // (B, n_keep, H_q d)
      saved.LSE.resize(B * H * n_keep);  // (B, H_q, n_keep)
      copy_kept<true>(ckpt, B, N, H, qd, a.A, a.LSE, saved.A, saved.LSE);
      break;
    }
  }
  count.saved_bytes = saved.bytes();
  return y;
}

template <class T>
Grads<T> backward(const Shape& s, const Weights<T>& w, const Saved<T>& saved, const std::vector<T>& dy,
                  const AttentionOps<T>& attn, Counters& count) {
  validate_weights(s, w);
  const Checkpointing& ckpt = saved.ckpt;
  validate(s, ckpt, attn.row_quantum);
  const int64_t B = s.p.B, N = s.p.N_q, H = s.p.H_q, BN = tokens(s), qd = H * s.p.d, kd = s.p.H_kv * s.p.d;
  check_size("saved.x", saved.x.size(), "(B N, D)", BN, s.D);
  check_size("dy", dy.size(), "(B N, D)", BN, s.D);
  const std::vector<T>& x = saved.x;

  // The activations: kept ones read in place, the others recomputed into `a` (§11.2).
  Acts<T> a;
  switch (ckpt.placement) {
    case Placement::None:
      check_size("saved.Q", saved.Q.size(), "(B N, H_q d)", BN, qd);
      check_size("saved.K", saved.K.size(), "(B N, H_kv d)", BN, kd);
      check_size("saved.V", saved.V.size(), "(B N, H_kv d)", BN, kd);
      check_size("saved.A", saved.A.size(), "(B N, H_q d)", BN, qd);
      check_size3("saved.LSE", saved.LSE.size(), "(B, H_q, N)", B, H, N);
      check_size("saved.h", saved.h.size(), "(B N, D)", BN, s.D);
      check_size("saved.u", saved.u.size(), "(B N, F)", BN, s.F);
      check_size("saved.g", saved.g.size(), "(B N, F)", BN, s.F);
      break;
    case Placement::Layer:
      project(s, w, x, a);
      attend(s, attn, a, count);  // the second attention forward of layer-boundary checkpointing
      mlp_inputs(s, w, x, a.A, a);
      break;
    case Placement::Remat:
      check_size("saved.A", saved.A.size(), "(B N, H_q d)", BN, qd);
      check_size3("saved.LSE", saved.LSE.size(), "(B, H_q, N)", B, H, N);
      project(s, w, x, a);
      mlp_inputs(s, w, x, saved.A, a);
      break;
    case Placement::Sequence: {
      const int64_t n_keep = kept_rows(ckpt);
      check_size3("saved.A", saved.A.size(), "(B, n_keep, H_q d)", B, n_keep, qd);
      check_size3("saved.LSE", saved.LSE.size(), "(B, H_q, n_keep)", B, H, n_keep);
      project(s, w, x, a);
      a.A.resize(BN * qd);
      a.LSE.resize(B * H * N);
      const View4<T> A4 = heads(a.A, s, H);
      const View3<T> L3 = view3(a.LSE.data(), B, H, N);
      copy_kept<false>(ckpt, B, N, H, qd, a.A, a.LSE, saved.A, saved.LSE);  // kept rows back in place
      for (size_t k = 0; k < ckpt.keep.size(); ++k) {  // the other rows' attention forward
        if (ckpt.keep[k]) continue;
        if (!attn.forward_rows)
          fail("attention '", attn.name, "' has no forward over a subset of query rows; the sequence placement "
               "recomputes some (use cpu, or keep every segment)");
        const int64_t i0 = ckpt.bounds[k], n = ckpt.bounds[k + 1] - i0;
        attn.forward_rows(s.p, Positions{i0, n, nullptr}, slice_rows(heads(std::as_const(a.Q), s, H), i0, n),
                          heads(std::as_const(a.K), s, s.p.H_kv), heads(std::as_const(a.V), s, s.p.H_kv),
                          slice_rows(A4, i0, n), slice_rows(L3, i0, n));
        count.row_forwards += 1;
        count.forward_rows += n;
        count.forward_pairs += rows_pairs(s.p, i0, i0 + n);
      }
      mlp_inputs(s, w, x, a.A, a);
      break;
    }
  }
  const bool none = ckpt.placement == Placement::None;
  const bool kept_A = none || ckpt.placement == Placement::Remat;
  const std::vector<T>& Q = none ? saved.Q : a.Q;
  const std::vector<T>& K = none ? saved.K : a.K;
  const std::vector<T>& V = none ? saved.V : a.V;
  const std::vector<T>& A = kept_A ? saved.A : a.A;
  const std::vector<T>& LSE = kept_A ? saved.LSE : a.LSE;
  const std::vector<T>& h = none ? saved.h : a.h;
  const std::vector<T>& u = none ? saved.u : a.u;
  const std::vector<T>& g = none ? saved.g : a.g;

  Grads<T> gr;
  // eq. (11.6): the MLP.
  gr.dW2.resize(s.F * s.D);
  matmul_tn(g.data(), dy.data(), gr.dW2.data(), BN, s.F, s.D);
  std::vector<T> du(BN * s.F);
  matmul_nt(dy.data(), w.W2.data(), du.data(), BN, s.F, s.D);  // dg = dy W2^T
  for (size_t e = 0; e < du.size(); ++e) {
    const T sg = sigmoid(u[e]);
    du[e] = du[e] * (sg * (T(1) + u[e] * (T(1) - sg)));  // silu'(u) = sigma(u) (1 + u (1 - sigma(u)))
  }
  gr.dW1.resize(s.D * s.F);
  matmul_tn(h.data(), du.data(), gr.dW1.data(), BN, s.D, s.F);
  std::vector<T> dh(BN * s.D);
  matmul_nt(du.data(), w.W1.data(), dh.data(), BN, s.D, s.F);
  for (size_t e = 0; e < dh.size(); ++e) dh[e] = dy[e] + dh[e];
  // eq. (11.7): the output projection.
  gr.dWo.resize(qd * s.D);
  matmul_tn(A.data(), dh.data(), gr.dWo.data(), BN, qd, s.D);
  std::vector<T> dA(BN * qd);
  matmul_nt(dh.data(), w.Wo.data(), dA.data(), BN, qd, s.D);
  // eq. (11.8): the attention backward with the forward's (or the recomputed, bitwise equal) A, LSE.
  std::vector<T> dQ(BN * qd), dK(BN * kd), dV(BN * kd);
  attn.backward(s.p, heads(Q, s, H), heads(K, s, s.p.H_kv), heads(V, s, s.p.H_kv), heads(A, s, H),
                heads(std::as_const(dA), s, H), as_const(view3(const_cast<T*>(LSE.data()), B, H, N)),
                heads(dQ, s, H), heads(dK, s, s.p.H_kv), heads(dV, s, s.p.H_kv));
  count.attention_backwards += 1;
  // eq. (11.9): the projections, dx summed in the order dh, Q, K, V.
  gr.dWq.resize(s.D * qd);
  gr.dWk.resize(s.D * kd);
  gr.dWv.resize(s.D * kd);
  matmul_tn(x.data(), dQ.data(), gr.dWq.data(), BN, s.D, qd);
  matmul_tn(x.data(), dK.data(), gr.dWk.data(), BN, s.D, kd);
  matmul_tn(x.data(), dV.data(), gr.dWv.data(), BN, s.D, kd);
  std::vector<T> t(BN * s.D);
  gr.dx = dh;
  matmul_nt(dQ.data(), w.Wq.data(), t.data(), BN, s.D, qd);
  for (size_t e = 0; e < t.size(); ++e) gr.dx[e] += t[e];
  matmul_nt(dK.data(), w.Wk.data(), t.data(), BN, s.D, kd);
  for (size_t e = 0; e < t.size(); ++e) gr.dx[e] += t[e];
  matmul_nt(dV.data(), w.Wv.data(), t.data(), BN, s.D, kd);
  for (size_t e = 0; e < t.size(); ++e) gr.dx[e] += t[e];
  return gr;
}

#define BURSTLAB_LAYER_INST(T)                                                                                  \
  template void validate_weights<T>(const Shape&, const Weights<T>&);                                          \
  template Weights<T> make_weights<T>(const Shape&, uint64_t);                                                 \
  template std::vector<T> make_values<T>(int64_t, uint64_t);                                                   \
  template struct Saved<T>;                                                                                    \
  template AttentionOps<T> cpu_attention<T>(cpu::Tiles);                                                       \
  template AttentionOps<T> reference_attention<T>();                                                          \
  template std::vector<T> forward<T>(const Shape&, const Weights<T>&, const std::vector<T>&, const Checkpointing&, \
                                     const AttentionOps<T>&, Saved<T>&, Counters&);                           \
  template Grads<T> backward<T>(const Shape&, const Weights<T>&, const Saved<T>&, const std::vector<T>&,        \
                                const AttentionOps<T>&, Counters&);
BURSTLAB_LAYER_INST(float)
BURSTLAB_LAYER_INST(double)

}  // namespace burstlab::layer
