// tests/cpu/cpu_check.hpp — running cpu/ on harness inputs and checking it against the oracle
// (spec §9.4). Shared by tests/cpu, tests/slow and tests/property.
#pragma once

#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "burstlab/merge.hpp"
#include "burstlab/problem.hpp"
#include "cpu.hpp"
#include "harness.hpp"
#include "tolerance.hpp"

namespace burstlab::cputest {

// A case of the sweeps: one problem, one input draw, one tile choice.
struct Case {
  Problem p;
  Layout layout = Layout::BHSD;
  Dtype dtype = Dtype::F64;
  Values values = Values::Normal;
  uint64_t seed = 1;
  cpu::Tiles tiles{};
  std::string mask_spec = "none";
};

// A case of a sweep with its gtest parameter name.
struct NamedCase {
  Case c;
  std::string name;
};
inline void PrintTo(const NamedCase& s, std::ostream* os) { *os << s.name; }

inline std::string describe(const Case& c) {
  return shape_string(c.p) + " mask=" + c.mask_spec + " (" + burstlab::describe(c.p.mask) + ") " +
         to_string(c.dtype) + " " + to_string(c.layout) + " values=" + to_string(c.values) +
         " Br=" + std::to_string(c.tiles.Br) + " Bc=" + std::to_string(c.tiles.Bc) +
         " seed=" + std::to_string(c.seed);
}

// cpu::forward (and cpu::backward on its own O, LSE) in precision T on the case's inputs, outputs
// poisoned first (spec §9.3), checked against the oracle. One Metrics per tensor.
template <class T>
std::vector<Metrics> run_and_check(const Problem& p, const Inputs& in, const Oracle& want,
                                   cpu::Tiles tiles, bool backward) {
  const Tensor4<T> Q = convert<T>(in.Q), K = convert<T>(in.K), V = convert<T>(in.V),
                   dO = convert<T>(in.dO);
  const Layout L = in.Q.layout();
  Tensor4<T> O = make_tensor4<T>(L, p.B, p.H_q, p.N_q, p.d);  // (B, H_q, N_q, d)
  Tensor3<T> LSE = make_tensor3<T>(p.B, p.H_q, p.N_q);        // (B, H_q, N_q)
  poison(O);
  poison(LSE);
  cpu::forward<T>(p, Q.view(), K.view(), V.view(), O.view(), LSE.view(), tiles);
  std::vector<Metrics> ms = check_forward<T>(want, O, LSE);
  if (!backward) return ms;
  Tensor4<T> dQ = make_tensor4<T>(L, p.B, p.H_q, p.N_q, p.d);
  Tensor4<T> dK = make_tensor4<T>(in.K.layout(), p.B, p.H_kv, p.N_k, p.d);
  Tensor4<T> dV = make_tensor4<T>(in.V.layout(), p.B, p.H_kv, p.N_k, p.d);
  poison(dQ);
  poison(dK);
  poison(dV);
  cpu::backward<T>(p, Q.view(), K.view(), V.view(), as_const(O.view()), dO.view(),
                   as_const(LSE.view()), dQ.view(), dK.view(), dV.view(), tiles);
  const std::vector<Metrics> mb = check_backward<T>(want, dQ, dK, dV);
  ms.insert(ms.end(), mb.begin(), mb.end());
  return ms;
}

inline std::vector<Metrics> run_case(const Case& c, bool backward) {
  const Inputs in = make_inputs(c.p, c.layout, c.dtype, c.seed, c.values);
  const Oracle want = run_oracle(c.p, in, backward);
  if (c.dtype == Dtype::F64) return run_and_check<double>(c.p, in, want, c.tiles, backward);
  return run_and_check<float>(c.p, in, want, c.tiles, backward);
}

// ---- blocks over positions (spec §6.1-§6.2)

// Rows `pos` of x (B, H, N, d) gathered into a new (B, H, pos.size(), d) tensor.
template <class T>
Tensor4<T> gather_rows(const Tensor4<T>& x, const std::vector<int64_t>& pos) {
  Tensor4<T> y = make_tensor4<T>(x.layout, x.B, x.H, static_cast<int64_t>(pos.size()), x.d);
  const View4<const T> src = x.view();
  const View4<T> dst = y.view();
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < pos.size(); ++n)
        for (int64_t k = 0; k < x.d; ++k) dst(b, h, n, k) = src(b, h, pos[n], k);
  return y;
}
// x[rows pos] += y (B, H, pos.size(), d).
template <class T>
void scatter_add_rows(Tensor4<T>& x, const Tensor4<T>& y, const std::vector<int64_t>& pos) {
  const View4<T> dst = x.view();
  const View4<const T> src = y.view();
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < pos.size(); ++n)
        for (int64_t k = 0; k < x.d; ++k) dst(b, h, pos[n], k) += src(b, h, n, k);
}
template <class T>
void scatter_rows(Tensor4<T>& x, const Tensor4<T>& y, const std::vector<int64_t>& pos) {
  const View4<T> dst = x.view();
  const View4<const T> src = y.view();
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < pos.size(); ++n)
        for (int64_t k = 0; k < x.d; ++k) dst(b, h, pos[n], k) = src(b, h, n, k);
}
template <class T>
void scatter_rows3(Tensor3<T>& x, const Tensor3<T>& y, const std::vector<int64_t>& pos) {
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < pos.size(); ++n) x.view()(b, h, pos[n]) = y.view()(b, h, n);
}
template <class T>
Tensor3<T> gather_rows3(const Tensor3<T>& x, const std::vector<int64_t>& pos) {
  Tensor3<T> y = make_tensor3<T>(x.B, x.H, static_cast<int64_t>(pos.size()));
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < pos.size(); ++n) y.view()(b, h, n) = x.view()(b, h, pos[n]);
  return y;
}

// Positions of a piece: contiguous when the indices are consecutive (exercises both forms).
inline Positions positions_of(const std::vector<int64_t>& pos) {
  bool contiguous_run = true;
  for (size_t k = 1; k < pos.size(); ++k) contiguous_run = contiguous_run && pos[k] == pos[k - 1] + 1;
  if (contiguous_run) return contiguous(pos.empty() ? 0 : pos[0], static_cast<int64_t>(pos.size()));
  return Positions{0, static_cast<int64_t>(pos.size()), pos.data()};
}

// Partitions of [0, N) used for blocks.
enum class Split { Contiguous, Striped, Zigzag, Random };
inline std::string to_string(Split s) {
  switch (s) {
    case Split::Contiguous: return "contiguous";
    case Split::Striped: return "striped";
    case Split::Zigzag: return "zigzag";
    case Split::Random: return "random";
  }
  return "?";
}
// `parts` pieces (some may be empty) of [0, N).
inline std::vector<std::vector<int64_t>> split_positions(int64_t N, int parts, Split how,
                                                         uint64_t seed) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(parts));
  std::mt19937_64 rng(seed);
  switch (how) {
    case Split::Contiguous: {  // random cut points, empty pieces allowed
      std::vector<int64_t> cuts{0, N};
      std::uniform_int_distribution<int64_t> u(0, N);
      for (int t = 1; t < parts; ++t) cuts.push_back(u(rng));
      std::sort(cuts.begin(), cuts.end());
      for (int t = 0; t < parts; ++t)
        for (int64_t i = cuts[t]; i < cuts[t + 1]; ++i) out[t].push_back(i);
      break;
    }
    case Split::Striped:  // i mod parts
      for (int64_t i = 0; i < N; ++i) out[i % parts].push_back(i);
      break;
    case Split::Zigzag: {  // 2*parts chunks; piece t holds chunk t and chunk 2*parts-1-t
      const int64_t chunks = 2 * parts;
      for (int64_t i = 0; i < N; ++i) {
        const int64_t c = std::min<int64_t>(i * chunks / N, chunks - 1);
        out[c < parts ? c : chunks - 1 - c].push_back(i);
      }
      break;
    }
    case Split::Random: {  // each position to a random piece, order kept
      std::uniform_int_distribution<int> u(0, parts - 1);
      for (int64_t i = 0; i < N; ++i) out[u(rng)].push_back(i);
      break;
    }
  }
  return out;
}

// forward_block over every (query piece, key piece), merged over key pieces (eq. 4.5-4.7) and
// scattered back into whole (B, H_q, N_q, d) / (B, H_q, N_q) tensors.
template <class T>
void forward_by_blocks(const Problem& p, const MaskParams& mp, const Tensor4<T>& Q,
                       const Tensor4<T>& K, const Tensor4<T>& V,
                       const std::vector<std::vector<int64_t>>& q_parts,
                       const std::vector<std::vector<int64_t>>& k_parts, cpu::Tiles tiles,
                       Tensor4<T>& O, Tensor3<T>& LSE) {
  for (const auto& qp : q_parts) {
    const int64_t nq = static_cast<int64_t>(qp.size());
    if (nq == 0) continue;
    const Tensor4<T> Qb = gather_rows(Q, qp);
    Tensor4<T> Oacc = make_tensor4<T>(Q.layout, p.B, p.H_q, nq, p.d, T(0));  // the identity
    Tensor3<T> Lacc = make_tensor3<T>(p.B, p.H_q, nq, -std::numeric_limits<T>::infinity());
    for (const auto& kp : k_parts) {
      const Tensor4<T> Kb = gather_rows(K, kp), Vb = gather_rows(V, kp);
      Tensor4<T> Ob = make_tensor4<T>(Q.layout, p.B, p.H_q, nq, p.d);
      Tensor3<T> Lb = make_tensor3<T>(p.B, p.H_q, nq);
      poison(Ob);
      poison(Lb);
      cpu::forward_block<T>(p, mp, positions_of(qp), positions_of(kp), Qb.view(), Kb.view(),
                            Vb.view(), Ob.view(), Lb.view(), tiles);
      merge<T>(Oacc.view(), Lacc.view(), as_const(Ob.view()), as_const(Lb.view()));
    }
    scatter_rows(O, Oacc, qp);
    scatter_rows3(LSE, Lacc, qp);
  }
}

// backward_block over every (query piece, key piece), accumulated (spec §6.2). LSE, D global.
template <class T>
void backward_by_blocks(const Problem& p, const MaskParams& mp, const Tensor4<T>& Q,
                        const Tensor4<T>& K, const Tensor4<T>& V, const Tensor4<T>& dO,
                        const Tensor3<T>& LSE, const Tensor3<T>& D,
                        const std::vector<std::vector<int64_t>>& q_parts,
                        const std::vector<std::vector<int64_t>>& k_parts, cpu::Tiles tiles,
                        Tensor4<T>& dQ, Tensor4<T>& dK, Tensor4<T>& dV) {
  dQ = make_tensor4<T>(Q.layout, p.B, p.H_q, p.N_q, p.d, T(0));
  dK = make_tensor4<T>(K.layout, p.B, p.H_kv, p.N_k, p.d, T(0));
  dV = make_tensor4<T>(V.layout, p.B, p.H_kv, p.N_k, p.d, T(0));
  for (const auto& qp : q_parts) {
    const int64_t nq = static_cast<int64_t>(qp.size());
    const Tensor4<T> Qb = gather_rows(Q, qp), dOb = gather_rows(dO, qp);
    const Tensor3<T> Lb = gather_rows3(LSE, qp), Db = gather_rows3(D, qp);
    Tensor4<T> dQb = make_tensor4<T>(Q.layout, p.B, p.H_q, nq, p.d, T(0));
    for (const auto& kp : k_parts) {
      const int64_t nk = static_cast<int64_t>(kp.size());
      const Tensor4<T> Kb = gather_rows(K, kp), Vb = gather_rows(V, kp);
      Tensor4<T> dKb = make_tensor4<T>(K.layout, p.B, p.H_kv, nk, p.d, T(0));
      Tensor4<T> dVb = make_tensor4<T>(V.layout, p.B, p.H_kv, nk, p.d, T(0));
      cpu::backward_block<T>(p, mp, positions_of(qp), positions_of(kp), Qb.view(), Kb.view(),
                             Vb.view(), dOb.view(), Lb.view(), Db.view(), dQb.view(), dKb.view(),
                             dVb.view(), tiles);
      scatter_add_rows(dK, dKb, kp);
      scatter_add_rows(dV, dVb, kp);
    }
    scatter_add_rows(dQ, dQb, qp);
  }
}

}  // namespace burstlab::cputest
