// reference/rows.cpp — the row-sampled oracle (spec §9.11). One row or one column at a time,
// O(N d) each, in fp64 with plain loops over the strided views: obviously right, and no N_q x N_k
// buffer anywhere. The row bounds evaluate eq. (9.2)-(9.9) for one row exactly as tolerance.cpp
// does for all of them (tests/reference/test_rows.cpp holds the two equal).
#include "rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/parallel.hpp"

namespace burstlab {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kNinf = -std::numeric_limits<double>::infinity();

// Which rows see no key and which keys no row sees, exactly, in O(N_q + N_k + blocks): band and
// document give each row one interval [lo_i, hi_i) (eq. 3.4); the block bits are read through
// per-block-row prefix counts.
struct Visibility {
  std::vector<char> row_sees;  // (N_q)
  std::vector<char> key_seen;  // (N_k)
};
Visibility visibility(const MaskParams& m) {
  Visibility v;
  v.row_sees.assign(static_cast<size_t>(m.N_q), 0);
  v.key_seen.assign(static_cast<size_t>(m.N_k), 0);
  std::vector<int64_t> cover(static_cast<size_t>(m.N_k) + 1, 0);  // difference array over keys
  if (!m.block) {
    for (int64_t i = 0; i < m.N_q; ++i) {
      int64_t lo, hi;
      row_range(m, i, &lo, &hi);
      if (lo >= hi) continue;
      v.row_sees[i] = 1;
      ++cover[lo];
      --cover[hi];
    }
  } else {
    const int64_t nbk = m.n_block_k, nbq = (m.N_q + m.block_q - 1) / m.block_q;
    std::vector<int64_t> pre(static_cast<size_t>(nbk) + 1);  // set bits of one block row, prefix counts
    for (int64_t br = 0; br < nbq; ++br) {
      const uint8_t* bits = m.block + br * nbk;
      pre[0] = 0;
      for (int64_t c = 0; c < nbk; ++c) pre[c + 1] = pre[c] + (bits[c] ? 1 : 0);
      // Rows of this block row: their intervals (lo non-decreasing, §3.4) merged into disjoint runs.
      std::vector<std::pair<int64_t, int64_t>> runs;
      for (int64_t i = br * m.block_q; i < std::min(m.N_q, (br + 1) * m.block_q); ++i) {
        int64_t lo, hi;
        row_range(m, i, &lo, &hi);
        if (lo >= hi) continue;
        v.row_sees[i] = pre[(hi - 1) / m.block_k + 1] - pre[lo / m.block_k] > 0;
        if (!runs.empty() && lo <= runs.back().second)
          runs.back().second = std::max(runs.back().second, hi);
        else
          runs.push_back({lo, hi});
      }
      for (const auto& [a, z] : runs)
        for (int64_t c = a / m.block_k; c <= (z - 1) / m.block_k; ++c)
          if (bits[c]) {
            ++cover[std::max(a, c * m.block_k)];
            --cover[std::min(z, (c + 1) * m.block_k)];
          }
    }
  }
  int64_t run = 0;
  for (int64_t j = 0; j < m.N_k; ++j) {
    run += cover[j];
    v.key_seen[j] = run > 0;
  }
  return v;
}

// n of R flattened indices (all when n >= R): `first` (in priority order) while there is room,
// then floor(n/2) evenly spaced over [0, R), then uniform random ones; sorted, distinct.
std::vector<int64_t> pick(int64_t R, int64_t n, const std::vector<int64_t>& first, std::mt19937_64& rng) {
  std::set<int64_t> s;
  if (n >= R) {
    std::vector<int64_t> all(static_cast<size_t>(R));
    for (int64_t f = 0; f < R; ++f) all[f] = f;
    return all;
  }
  for (int64_t f : first)
    if (int64_t(s.size()) < n) s.insert(f);
  const int64_t even = n / 2;
  for (int64_t k = 0; k < even && int64_t(s.size()) < n; ++k)
    s.insert(even == 1 ? 0 : static_cast<int64_t>((static_cast<__int128>(k) * (R - 1)) / (even - 1)));
  std::uniform_int_distribution<int64_t> any(0, R - 1);
  while (int64_t(s.size()) < n) s.insert(any(rng));
  return std::vector<int64_t>(s.begin(), s.end());
}

// The flattened indices of the first position that `ok` rejects and of a random one (empty when
// every position passes): positions p < N in (b, h) = (0, 0) and a random (b, h) of BH.
std::vector<int64_t> rejected(const std::vector<char>& ok, int64_t BH, std::mt19937_64& rng) {
  const int64_t N = static_cast<int64_t>(ok.size());
  std::vector<int64_t> bad;
  for (int64_t p = 0; p < N; ++p)
    if (!ok[p]) bad.push_back(p);
  if (bad.empty()) return {};
  const int64_t r = bad[std::uniform_int_distribution<size_t>(0, bad.size() - 1)(rng)];
  const int64_t bh = std::uniform_int_distribution<int64_t>(0, BH - 1)(rng);
  return {bad.front(), bh * N + r};
}

// max_j |V_jk| (d) and max_{j,k} |K_jk| over all keys of one kv-head (the choices of
// tolerance.cpp for eq. 9.3 and 9.9).
struct KvMax {
  std::vector<double> maxV;
  double maxK = 0;
};
template <class A>
std::map<int64_t, KvMax> kv_maxima(const Problem& p, const A& K, const A& V, const std::vector<RowId>& rows) {
  const int64_t G = group_size(p);
  std::map<int64_t, KvMax> out;
  for (const RowId& r : rows) out[r.b * p.H_kv + kv_head(r.h, G)];
  std::vector<std::pair<const int64_t, KvMax>*> heads;
  for (auto& e : out) heads.push_back(&e);
  // A kv-head per thread, each scanned in the same order: at 1M tokens every head's N_k d keys
  // and values, read one after another, took most of the sampled oracle's time.
  const int64_t nh = static_cast<int64_t>(heads.size());
#pragma omp parallel for schedule(dynamic) if (nh > 1)
  for (int64_t t = 0; t < nh; ++t) {
    const int64_t bk = heads[size_t(t)]->first, b = bk / p.H_kv, hk = bk % p.H_kv;
    KvMax& m = heads[size_t(t)]->second;
    m.maxV.assign(static_cast<size_t>(p.d), 0.0);
    for (int64_t j = 0; j < p.N_k; ++j)
      for (int64_t k = 0; k < p.d; ++k) {
        m.maxV[k] = std::max(m.maxV[k], std::fabs(V(b, hk, j, k)));
        m.maxK = std::max(m.maxK, std::fabs(K(b, hk, j, k)));
      }
  }
  return out;
}

}  // namespace

Sample choose_sample(const Problem& p, int64_t K, uint64_t seed) {
  validate(p);
  if (K < 1) fail("check-rows (", K, ") must be >= 1");
  const MaskData md = compile_mask(p);
  const Visibility vis = visibility(md.params());
  std::mt19937_64 rng(seed ^ 0x5EED5A3B1E5ull);
  Sample s;
  {
    const int64_t R = p.B * p.H_q * p.N_q;
    std::vector<int64_t> first = {0, R - 1};
    for (int64_t f : rejected(vis.row_sees, p.B * p.H_q, rng)) first.push_back(f);
    for (int64_t f : pick(R, K, first, rng)) s.rows.push_back({f / (p.H_q * p.N_q), (f / p.N_q) % p.H_q, f % p.N_q});
  }
  {
    const int64_t R = p.B * p.H_kv * p.N_k;
    std::vector<int64_t> first = {0, R - 1};
    for (int64_t f : rejected(vis.key_seen, p.B * p.H_kv, rng)) first.push_back(f);
    for (int64_t f : pick(R, K, first, rng))
      s.columns.push_back({f / (p.H_kv * p.N_k), (f / p.N_k) % p.H_kv, f % p.N_k});
  }
  return s;
}

namespace {
// The oracles over any element accessor A returning fp64 (Stored4 of inputs of any storage type,
// a View4<const double> of a run's O): one body, so every form gives the same bits for the same
// values.

// eq. (2.1)-(2.4) and (5.1)-(5.6) for each sampled row, with eq. (9.3), (9.4), (9.9).
template <class A>
RowOracle row_oracle_on(const Problem& p, Dtype dtype, const A& Q, const A& K, const A& V, const A& dO,
                        const std::vector<RowId>& rows, bool backward) {
  const MaskData md = compile_mask(p);
  const MaskParams mask = md.params();
  const RuleConstants c = rule_constants(dtype);
  const int64_t G = group_size(p), N_k = p.N_k, d = p.d, n = static_cast<int64_t>(rows.size());
  const double scale = scale_of(p), ascale = std::fabs(scale);
  const double g_d = c.gamma(double(d)), g_k = c.gamma(double(N_k) + 2);
  for (const RowId& r : rows)
    if (r.b < 0 || r.b >= p.B || r.h < 0 || r.h >= p.H_q || r.i < 0 || r.i >= p.N_q)
      fail("row (b=", r.b, ", h=", r.h, ", i=", r.i, ") must lie in (B, H_q, N_q) = (", p.B, ", ", p.H_q, ", ", p.N_q, ")");
  const std::map<int64_t, KvMax> kvmax = kv_maxima(p, K, V, rows);

  RowOracle out;
  out.rows = rows;
  out.O.assign(static_cast<size_t>(n * d), 0.0);
  out.bound_O.assign(static_cast<size_t>(n * d), 0.0);
  out.LSE.assign(static_cast<size_t>(n), kNinf);
  out.bound_LSE.assign(static_cast<size_t>(n), 0.0);
  if (backward) {
    out.dQ.assign(static_cast<size_t>(n * d), 0.0);
    out.bound_dQ.assign(static_cast<size_t>(n * d), c.tiny_s);  // empty rows: expected 0 exactly
  }
  FirstError err;  // O(N_k) per thread (the row's logits)
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (int64_t r = 0; r < n; ++r) err.run([&] {
    const int64_t b = rows[r].b, h = rows[r].h, i = rows[r].i, hk = kv_head(h, G);
    const KvMax& km = kvmax.at(b * p.H_kv + hk);
    int64_t lo, hi;
    row_range(mask, i, &lo, &hi);
    std::vector<int64_t> J;  // V_i (eq. 2.2)
    for (int64_t j = lo; j < hi; ++j)
      if (visible(mask, i, j)) J.push_back(j);
    if (J.empty()) return;  // empty row (§2.3): O = 0, LSE = -inf, dQ = 0, as initialized
    // eq. (2.1) S_ij and eq. (9.1) a_i
    // Row i's Q (and dO) read once (as fp64) rather than at every key: at 1M tokens a row sees
    // up to a million keys.
    std::vector<double> Qi(static_cast<size_t>(d)), dOi(static_cast<size_t>(backward ? d : 0));
    for (int64_t k = 0; k < d; ++k) Qi[k] = Q(b, h, i, k);
    if (backward)
      for (int64_t k = 0; k < d; ++k) dOi[k] = dO(b, h, i, k);
    std::vector<double> S(J.size());
    double m = kNinf, a_i = 0;
    for (size_t t = 0; t < J.size(); ++t) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < d; ++k) {
        const double Kk = K(b, hk, J[t], k);
        s += Qi[k] * Kk;
        a += std::fabs(Qi[k]) * std::fabs(Kk);
      }
      S[t] = scale * s;
      m = std::max(m, S[t]);
      a_i = std::max(a_i, ascale * a);
    }
    // eq. (2.3)-(2.4): the softmax as reference.cpp computes it (exp(S - m) / l)
    double l = 0;
    for (double s : S) l += std::exp(s - m);
    const double L = m + std::log(l);
    double* O = &out.O[r * d];
    std::vector<double> PV(static_cast<size_t>(d), 0.0);  // (P|V|)_ik
    for (size_t t = 0; t < J.size(); ++t) {
      const double P = std::exp(S[t] - m) / l;
      for (int64_t k = 0; k < d; ++k) {
        const double Vk = V(b, hk, J[t], k);
        O[k] += P * Vk;
        PV[k] += P * std::fabs(Vk);
      }
    }
    out.LSE[r] = L;
    const double eta = rule_eta(c, d, N_k, a_i);  // eq. (9.2)
    out.bound_LSE[r] = kRuleSafety * (eta + 2 * c.u_a * std::fabs(L) + c.tiny_a);  // eq. (9.4)
    for (int64_t k = 0; k < d; ++k)  // eq. (9.3)
      out.bound_O[r * d + k] =
          kRuleSafety * ((2 * eta + c.u_s) * PV[k] + double(N_k) * c.tiny_a * km.maxV[k] + c.tiny_s);
    if (!backward) return;

    // eq. (5.1)-(5.6) with P recomputed from LSE (5.2), and eq. (9.5)-(9.7), (9.9), as
    // backward_bounds does: the O bound inside dD from the recomputed P.
    std::vector<double> P(J.size());
    for (size_t t = 0; t < J.size(); ++t) P[t] = std::exp(S[t] - L);
    std::vector<double> PVb(static_cast<size_t>(d), 0.0);
    for (size_t t = 0; t < J.size(); ++t)
      for (int64_t k = 0; k < d; ++k) PVb[k] += P[t] * std::fabs(V(b, hk, J[t], k));
    double D = 0, dD_a = 0, dD_b = 0;
    for (int64_t k = 0; k < d; ++k) {
      const double bO = (2 * eta + c.u_s) * PVb[k] + double(N_k) * c.tiny_a * km.maxV[k] + c.tiny_s;
      D += dOi[k] * O[k];  // eq. (5.1)
      dD_a += std::fabs(dOi[k]) * bO;
      dD_b += std::fabs(dOi[k]) * std::fabs(O[k]);
    }
    const double dD = dD_a + g_d * dD_b;                     // eq. (9.6)
    const double pi = 2 * eta + 2 * c.u_a * std::fabs(L);    // eq. (9.5)
    std::vector<double> dQ(static_cast<size_t>(d), 0.0), EK(static_cast<size_t>(d), 0.0),
        dSK(static_cast<size_t>(d), 0.0);
    for (size_t t = 0; t < J.size(); ++t) {
      const int64_t j = J[t];
      double dP = 0, dOV = 0;
      for (int64_t k = 0; k < d; ++k) {
        const double Vk = V(b, hk, j, k);
        dP += dOi[k] * Vk;  // eq. (5.4)
        dOV += std::fabs(dOi[k]) * std::fabs(Vk);
      }
      const double dS = P[t] * (dP - D);  // eq. (5.5)
      const double E = P[t] * ((pi + 2 * c.u_a + c.u_P) * std::fabs(dP - D) + g_d * dOV + dD);  // eq. (9.7)
      for (int64_t k = 0; k < d; ++k) {
        const double Kjk = K(b, hk, j, k);
        dQ[k] += dS * Kjk;
        EK[k] += E * std::fabs(Kjk);
        dSK[k] += std::fabs(dS) * std::fabs(Kjk);
      }
    }
    for (int64_t k = 0; k < d; ++k) {
      out.dQ[r * d + k] = scale * dQ[k];  // eq. (5.6)
      out.bound_dQ[r * d + k] =           // eq. (9.9)
          kRuleSafety * (ascale * (EK[k] + (g_k + c.u_s) * dSK[k]) + double(N_k) * c.tiny_a * km.maxK * ascale + c.tiny_s);
    }
  });
  err.rethrow();
  return out;
}

void validate_columns(const Problem& p, const std::vector<ColumnId>& columns) {
  for (const ColumnId& q : columns)
    if (q.b < 0 || q.b >= p.B || q.h < 0 || q.h >= p.H_kv || q.j < 0 || q.j >= p.N_k)
      fail("column (b=", q.b, ", h=", q.h, ", j=", q.j, ") must lie in (B, H_kv, N_k) = (", p.B, ", ", p.H_kv, ", ",
           p.N_k, ")");
}

// RunRows of a run's O (any accessor) and LSE: each row's d values of dO and O through row_D.
template <class A, class OA>
RunRows run_rows_on(const Problem& p, const A& dO, const OA& O, View3<const double> LSE,
                    const std::vector<ColumnId>& columns) {
  validate_columns(p, columns);
  const int64_t N_q = p.N_q, d = p.d;
  RunRows run;
  run.heads = column_heads(p, columns);
  const int64_t nh = static_cast<int64_t>(run.heads.size());
  run.LSE.assign(static_cast<size_t>(nh * N_q), 0.0);
  run.D.assign(static_cast<size_t>(nh * N_q), 0.0);
  run.Dmag.assign(static_cast<size_t>(nh * N_q), 0.0);
  FirstError err;
#pragma omp parallel for schedule(static) if (nh * N_q * d >= 65536)
  for (int64_t t = 0; t < nh; ++t) err.run([&] {
    const int64_t b = run.heads[t] / p.H_q, h = run.heads[t] % p.H_q;
    std::vector<double> dOr(static_cast<size_t>(d)), Or(static_cast<size_t>(d));
    for (int64_t i = 0; i < N_q; ++i) {
      for (int64_t k = 0; k < d; ++k) {
        dOr[k] = dO(b, h, i, k);
        Or[k] = O(b, h, i, k);
      }
      row_D(dOr.data(), Or.data(), d, &run.D[t * N_q + i], &run.Dmag[t * N_q + i]);
      run.LSE[t * N_q + i] = LSE(b, h, i);
    }
  });
  err.rethrow();
  return run;
}

// RunRows must hold the sample's heads, N_q values each.
void validate_run_rows(const Problem& p, const RunRows& run, const std::vector<ColumnId>& columns) {
  if (run.heads != column_heads(p, columns))
    fail("RunRows holds ", run.heads.size(), " (b, q-head)s, not the ", column_heads(p, columns).size(),
         " of the sampled columns' groups");
  const size_t n = run.heads.size() * static_cast<size_t>(p.N_q);
  if (run.LSE.size() != n || run.D.size() != n || run.Dmag.size() != n)
    fail("RunRows: LSE, D, Dmag (", run.LSE.size(), ", ", run.D.size(), ", ", run.Dmag.size(), ") must hold ", n,
         " values (heads x N_q)");
}

// eq. (5.3), (5.7) for each sampled column from the run's LSE and D = rowsum(dO o O) of its O,
// with the conditional bounds eq. (9.10)-(9.13).
template <class A>
ColumnOracle column_oracle_on(const Problem& p, Dtype dtype, const A& Q, const A& K, const A& V, const A& dO,
                              const RunRows& run, const std::vector<ColumnId>& columns) {
  const MaskData md = compile_mask(p);
  const MaskParams mask = md.params();
  const RuleConstants c = rule_constants(dtype);
  const int64_t G = group_size(p), N_q = p.N_q, d = p.d, n = static_cast<int64_t>(columns.size());
  const double scale = scale_of(p), ascale = std::fabs(scale);
  const double g_d = c.gamma(double(d)), g_d1 = c.gamma(double(d) + 1), g_d2 = c.gamma(double(d) + 2);
  const double g_exp = c.gamma(16);
  validate_columns(p, columns);
  validate_run_rows(p, run, columns);
  // The run's N_q values of (b, q-head) bh.
  auto of = [&](const std::vector<double>& v, int64_t bh) {
    const size_t t = static_cast<size_t>(std::lower_bound(run.heads.begin(), run.heads.end(), bh) - run.heads.begin());
    return v.data() + t * static_cast<size_t>(N_q);
  };

  ColumnOracle out;
  out.columns = columns;
  out.dK.assign(static_cast<size_t>(n * d), 0.0);
  out.dV.assign(static_cast<size_t>(n * d), 0.0);
  out.bound_dK.assign(static_cast<size_t>(n * d), c.tiny_s);  // keys no row sees: expected 0 exactly
  out.bound_dV.assign(static_cast<size_t>(n * d), c.tiny_s);
  FirstError err;
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (int64_t r = 0; r < n; ++r) err.run([&] {
    const int64_t b = columns[r].b, hk = columns[r].h, j = columns[r].j;
    std::vector<double> dK(static_cast<size_t>(d), 0.0), dV(static_cast<size_t>(d), 0.0);
    std::vector<double> W(static_cast<size_t>(d), 0.0), PdO(static_cast<size_t>(d), 0.0);
    std::vector<double> EQ(static_cast<size_t>(d), 0.0), dSQ(static_cast<size_t>(d), 0.0);
    // Key j's K and V, and each visible row's Q and dO, read once (as fp64) rather than at every
    // use: at 1M tokens a column visits half a million rows.
    std::vector<double> Kj(static_cast<size_t>(d)), Vj(static_cast<size_t>(d));
    std::vector<double> Qi(static_cast<size_t>(d)), dOi(static_cast<size_t>(d));
    for (int64_t k = 0; k < d; ++k) {
      Kj[k] = K(b, hk, j, k);
      Vj[k] = V(b, hk, j, k);
    }
    double maxdO = 0, maxQ = 0;
    int64_t n_j = 0;        // visible (h, i) pairs of the group: the terms of the sums
    bool undefined = false;  // a row that sees j has a non-finite LSE: no P_ij to recompute
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hk * G + g;
      const double* Dr = of(run.D, b * p.H_q + h);
      const double* Dm = of(run.Dmag, b * p.H_q + h);
      const double* Lr = of(run.LSE, b * p.H_q + h);
      for (int64_t i = 0; i < N_q; ++i) {
        if (!visible(mask, i, j)) continue;
        const double L = Lr[i];
        if (!std::isfinite(L)) {
          undefined = true;
          continue;
        }
        for (int64_t k = 0; k < d; ++k) {
          Qi[k] = Q(b, h, i, k);
          dOi[k] = dO(b, h, i, k);
        }
        double s = 0, a = 0, dP = 0, dOV = 0;
        for (int64_t k = 0; k < d; ++k) {
          s += Qi[k] * Kj[k];
          a += std::fabs(Qi[k]) * std::fabs(Kj[k]);
          dP += dOi[k] * Vj[k];  // eq. (5.4)
          dOV += std::fabs(dOi[k]) * std::fabs(Vj[k]);
        }
        const double S = scale * s;
        const double P = std::exp(S - L);  // eq. (5.2) with the run's LSE
        const double rho = g_d2 * ascale * a + 2 * c.u_a * (std::fabs(S) + std::fabs(L)) + g_exp;  // eq. (9.10)
        const double dS = P * (dP - Dr[i]);                                                     // eq. (5.5)
        const double E =  // eq. (9.11)
            P * ((rho + 2 * c.u_a + c.u_P) * std::fabs(dP - Dr[i]) + g_d * dOV + (g_d1 + c.u_s) * Dm[i]);
        for (int64_t k = 0; k < d; ++k) {
          const double dOk = dOi[k], Qk = Qi[k];
          dV[k] += P * dOk;  // eq. (5.3)
          W[k] += P * std::fabs(dOk) * (rho + c.u_P);
          PdO[k] += P * std::fabs(dOk);
          dK[k] += dS * Qk;  // eq. (5.7)
          EQ[k] += E * std::fabs(Qk);
          dSQ[k] += std::fabs(dS) * std::fabs(Qk);
          maxdO = std::max(maxdO, std::fabs(dOk));
          maxQ = std::max(maxQ, std::fabs(Qk));
        }
        ++n_j;
      }
    }
    if (undefined) {  // fails the column (NaN is never equal), whatever the candidate holds
      for (int64_t k = 0; k < d; ++k) out.dK[r * d + k] = out.dV[r * d + k] = kNaN;
      return;
    }
    if (n_j == 0) return;  // no row sees j: dK = dV = 0 exactly, as initialized
    const double g_n = c.gamma(double(n_j) + 2);
    for (int64_t k = 0; k < d; ++k) {
      out.dV[r * d + k] = dV[k];
      out.dK[r * d + k] = scale * dK[k];
      out.bound_dV[r * d + k] =  // eq. (9.12)
          kRuleSafety * (W[k] + (g_n + c.u_s) * PdO[k] + double(n_j) * c.tiny_a * maxdO + c.tiny_s);
      out.bound_dK[r * d + k] =  // eq. (9.13)
          kRuleSafety * (ascale * (EQ[k] + (g_n + c.u_s) * dSQ[k]) + double(n_j) * c.tiny_a * ascale * maxQ + c.tiny_s);
    }
  });
  err.rethrow();
  return out;
}

// A Stored4 must have the shape `want` and point to data (as validate_view for views).
void validate_stored(const char* name, const Stored4& s, const int64_t* want) {
  validate_view(name, s.dim, s.base, 4, want);
}
void validate_stored_inputs(const Problem& p, const StoredInputs& in, bool backward) {
  validate(p);
  int64_t qs[4], ks[4];
  expect_q_side(p, qs);
  expect_kv_side(p, ks);
  validate_stored("Q", in.Q, qs);
  validate_stored("K", in.K, ks);
  validate_stored("V", in.V, ks);
  if (backward) validate_stored("dO", in.dO, qs);
}
}  // namespace

Stored4 stored4(const AnyView4& v) {
  return std::visit([](const auto& x) {
    using S = std::remove_const_t<std::remove_reference_t<decltype(*x.data)>>;
    Stored4 s;
    s.base = reinterpret_cast<const char*>(x.data);
    s.dtype = dtype_of<S>();
    for (int a = 0; a < 4; ++a) {
      s.dim[a] = x.dim[a];
      s.bytes[a] = x.stride[a] * int64_t(sizeof(S));
    }
    return s;
  }, v);
}
StoredInputs stored_inputs(const Inputs& in) {
  StoredInputs s;
  s.dtype = in.dtype;
  s.Q = stored4(in.Q.view());
  s.K = stored4(in.K.view());
  s.V = stored4(in.V.view());
  s.dO = stored4(in.dO.view());
  return s;
}

namespace {
// Inputs as the problem's view checks read them: shapes, and data where there are elements.
void validate_inputs(const Problem& p, const Inputs& in, bool dO) {
  validate_views(p, shape_of(in.Q.view()), shape_of(in.K.view()), shape_of(in.V.view()));
  if (dO) validate_q_side(p, "dO", shape_of(in.dO.view()));
}
}  // namespace

RowOracle row_oracle(const Problem& p, const Inputs& in, const std::vector<RowId>& rows, bool backward) {
  validate_inputs(p, in, backward);
  const StoredInputs s = stored_inputs(in);
  return row_oracle_on(p, in.dtype, s.Q, s.K, s.V, s.dO, rows, backward);
}
RowOracle row_oracle(const Problem& p, const StoredInputs& in, const std::vector<RowId>& rows, bool backward) {
  validate_stored_inputs(p, in, backward);
  return row_oracle_on(p, in.dtype, in.Q, in.K, in.V, in.dO, rows, backward);
}

std::vector<int64_t> column_heads(const Problem& p, const std::vector<ColumnId>& columns) {
  const int64_t G = group_size(p);
  std::set<int64_t> heads;
  for (const ColumnId& q : columns)
    for (int64_t g = 0; g < G; ++g) heads.insert(q.b * p.H_q + q.h * G + g);
  return std::vector<int64_t>(heads.begin(), heads.end());
}

void row_D(const double* dO, const double* O, int64_t d, double* D, double* Dmag) {
  double s = 0, m = 0;
  for (int64_t k = 0; k < d; ++k) {
    s += dO[k] * O[k];  // eq. (5.1)
    m += std::fabs(dO[k]) * std::fabs(O[k]);
  }
  *D = s;
  *Dmag = m;
}

RunRows run_rows(const Problem& p, const AnyView4& dO, View4<const double> O, View3<const double> LSE,
                 const std::vector<ColumnId>& columns) {
  validate(p);
  validate_q_side(p, "dO", shape_of(dO));
  validate_q_side(p, "O", O);
  validate_rows(p, "LSE", LSE);
  return run_rows_on(p, stored4(dO), O, LSE, columns);
}

ColumnOracle column_oracle(const Problem& p, const Inputs& in, const RunRows& run, const std::vector<ColumnId>& columns) {
  validate_inputs(p, in, true);
  const StoredInputs s = stored_inputs(in);
  return column_oracle_on(p, in.dtype, s.Q, s.K, s.V, s.dO, run, columns);
}
ColumnOracle column_oracle(const Problem& p, const Inputs& in, View4<const double> O, View3<const double> LSE,
                           const std::vector<ColumnId>& columns) {
  validate_inputs(p, in, true);
  validate_q_side(p, "O", O);
  validate_rows(p, "LSE", LSE);
  const StoredInputs s = stored_inputs(in);
  const RunRows run = run_rows_on(p, s.dO, O, LSE, columns);
  return column_oracle_on(p, in.dtype, s.Q, s.K, s.V, s.dO, run, columns);
}
ColumnOracle column_oracle(const Problem& p, const StoredInputs& in, const Stored4& O, View3<const double> LSE,
                           const std::vector<ColumnId>& columns) {
  validate_stored_inputs(p, in, true);
  int64_t qs[4];
  expect_q_side(p, qs);
  validate_stored("O", O, qs);
  validate_rows(p, "LSE", LSE);
  const RunRows run = run_rows_on(p, in.dO, O, LSE, columns);
  return column_oracle_on(p, in.dtype, in.Q, in.K, in.V, in.dO, run, columns);
}

namespace {
// The candidate's view must hold the sampled position (b, h, n) and rows of `d` features.
void check_holds(const char* name, const int64_t* dim, int rank, int64_t b, int64_t h, int64_t n, int64_t d) {
  const int64_t at[4] = {b, h, n, d};
  for (int a = 0; a < rank; ++a)
    if (a < 3 ? at[a] >= dim[a] : at[a] != dim[a])
      fail(name, ".dim[", a, "] (", dim[a], ") does not hold the sampled position (b=", b, ", h=", h, ", n=", n,
           ", d=", d, ")");
}

// The d-wide rows of got at (b, h, n_of(id), .) for every id, in the ids' order.
template <class Id, class N>
std::vector<double> rows_at(const char* name, const std::vector<Id>& ids, int64_t d, View4<const double> got, N n_of) {
  if (!got.data) fail(name, " (null) must point to data");
  std::vector<double> out(ids.size() * static_cast<size_t>(d));
  for (size_t r = 0; r < ids.size(); ++r) {
    const int64_t b = ids[r].b, h = ids[r].h, n = n_of(ids[r]);
    check_holds(name, got.dim, 4, b, h, n, d);
    for (int64_t k = 0; k < d; ++k) out[r * d + k] = got(b, h, n, k);
  }
  return out;
}
std::vector<double> lse_at(const std::vector<RowId>& rows, View3<const double> LSE) {
  if (!LSE.data) fail("LSE (null) must point to data");
  std::vector<double> out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowId& q = rows[r];
    check_holds("LSE", LSE.dim, 3, q.b, q.h, q.i, 0);
    out[r] = LSE(q.b, q.h, q.i);
  }
  return out;
}
// d of a sample-ordered vector of d values per id (0 without ids).
int64_t width(size_t values, size_t ids) { return ids == 0 ? 0 : static_cast<int64_t>(values / ids); }
const auto row_i = [](const RowId& x) { return x.i; };
const auto column_j = [](const ColumnId& x) { return x.j; };

// The sampled rows (or columns) got, one d-wide row per id in the ids' order, against want and
// bound; first_wrong names (b, h, n_of(id), k).
template <class Id, class N>
Metrics sampled_metrics(const char* name, const std::vector<Id>& ids, const std::vector<double>& want,
                        const std::vector<double>& bound, const std::vector<double>& got, N n_of) {
  Metrics m;
  m.tensor = name;
  if (got.size() != want.size())
    fail(name, " holds ", got.size(), " sampled values, not the ", want.size(), " of the sample");
  const int64_t d = width(want.size(), ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    const int64_t b = ids[r].b, h = ids[r].h, n = n_of(ids[r]);
    for (int64_t k = 0; k < d; ++k) {
      const int64_t idx[4] = {b, h, n, k};
      compare_element(m, got[r * d + k], want[r * d + k], bound[r * d + k], idx, 4);
    }
  }
  return m;
}
}  // namespace

SampledOutputs sampled_outputs(const Sample& s, int64_t d, View4<const double> O, View3<const double> LSE,
                               View4<const double> dQ, View4<const double> dK, View4<const double> dV) {
  SampledOutputs got;
  if (O.data) got.O = rows_at("O", s.rows, d, O, row_i);
  if (LSE.data) got.LSE = lse_at(s.rows, LSE);
  if (dQ.data) got.dQ = rows_at("dQ", s.rows, d, dQ, row_i);
  if (dK.data) got.dK = rows_at("dK", s.columns, d, dK, column_j);
  if (dV.data) got.dV = rows_at("dV", s.columns, d, dV, column_j);
  return got;
}

std::vector<Metrics> check_rows_forward(const RowOracle& want, const SampledOutputs& got) {
  std::vector<Metrics> out;
  out.push_back(sampled_metrics("O", want.rows, want.O, want.bound_O, got.O, row_i));
  Metrics m;
  m.tensor = "LSE";
  if (got.LSE.size() != want.LSE.size())
    fail("LSE holds ", got.LSE.size(), " sampled values, not the ", want.LSE.size(), " of the sample");
  for (size_t r = 0; r < want.rows.size(); ++r) {
    const RowId& q = want.rows[r];
    const int64_t idx[3] = {q.b, q.h, q.i};
    compare_element(m, got.LSE[r], want.LSE[r], want.bound_LSE[r], idx, 3);
  }
  out.push_back(m);
  return out;
}

std::vector<Metrics> check_rows_backward(const RowOracle& want, const SampledOutputs& got) {
  if (want.dQ.size() != want.O.size()) fail("check_rows_backward: the row oracle was run with backward = false");
  return {sampled_metrics("dQ", want.rows, want.dQ, want.bound_dQ, got.dQ, row_i)};
}

std::vector<Metrics> check_columns(const ColumnOracle& want, const SampledOutputs& got) {
  return {sampled_metrics("dK", want.columns, want.dK, want.bound_dK, got.dK, column_j),
          sampled_metrics("dV", want.columns, want.dV, want.bound_dV, got.dV, column_j)};
}

std::vector<Metrics> check_rows_forward(const RowOracle& want, View4<const double> O, View3<const double> LSE) {
  SampledOutputs got;
  got.O = rows_at("O", want.rows, width(want.O.size(), want.rows.size()), O, row_i);
  got.LSE = lse_at(want.rows, LSE);
  return check_rows_forward(want, got);
}

std::vector<Metrics> check_rows_backward(const RowOracle& want, View4<const double> dQ) {
  if (want.dQ.size() != want.O.size()) fail("check_rows_backward: the row oracle was run with backward = false");
  SampledOutputs got;
  got.dQ = rows_at("dQ", want.rows, width(want.dQ.size(), want.rows.size()), dQ, row_i);
  return check_rows_backward(want, got);
}

std::vector<Metrics> check_columns(const ColumnOracle& want, View4<const double> dK, View4<const double> dV) {
  SampledOutputs got;
  got.dK = rows_at("dK", want.columns, width(want.dK.size(), want.columns.size()), dK, column_j);
  got.dV = rows_at("dV", want.columns, width(want.dV.size(), want.columns.size()), dV, column_j);
  return check_columns(want, got);
}

SampledOracle sampled_oracle(const Problem& p, const Inputs& in, int64_t K, uint64_t seed, bool backward) {
  SampledOracle s;
  s.sample = choose_sample(p, K, seed);
  s.rows = row_oracle(p, in, s.sample.rows, backward);
  return s;
}

std::vector<Metrics> check_sampled_forward(const SampledOracle& s, const SampledOutputs& got) {
  return check_rows_forward(s.rows, got);
}

std::vector<Metrics> check_sampled_backward(const SampledOracle& s, const Problem& p, const Inputs& in,
                                            const RunRows& run, const SampledOutputs& got) {
  std::vector<Metrics> out = check_rows_backward(s.rows, got);
  const ColumnOracle cols = column_oracle(p, in, run, s.sample.columns);
  for (Metrics& m : check_columns(cols, got)) out.push_back(m);
  return out;
}

std::vector<Metrics> check_sampled_forward(const SampledOracle& s, const Problem& p, View4<const double> O,
                                           View3<const double> LSE) {
  validate_q_side(p, "O", O);
  validate_rows(p, "LSE", LSE);
  return check_sampled_forward(s, sampled_outputs(s.sample, p.d, O, LSE, {}, {}, {}));
}

std::vector<Metrics> check_sampled_backward(const SampledOracle& s, const Problem& p, const Inputs& in,
                                            View4<const double> O, View3<const double> LSE,
                                            View4<const double> dQ, View4<const double> dK,
                                            View4<const double> dV) {
  validate_q_side(p, "dQ", dQ);
  validate_kv_side(p, "dK", dK);
  validate_kv_side(p, "dV", dV);
  return check_sampled_backward(s, p, in, run_rows(p, in.dO.view(), O, LSE, s.sample.columns),
                                sampled_outputs(s.sample, p.d, {}, {}, dQ, dK, dV));
}

}  // namespace burstlab
