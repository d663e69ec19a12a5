// tests/property/test_property.cpp — RapidCheck properties of cpu/ and the merge (spec §4.3, §6,
// §9). Random problems (shapes, GQA, every mask kind and conjunctions, tiles, layouts, values)
// shrink to a minimal failing shape: every field shrinks toward its smallest value (N -> 1,
// d -> 1, no mask part, 1 x 1 tiles...). Sizes stay small (N <= 64) so the suite runs in well
// under two minutes with RapidCheck's default 100 cases per property (RC_PARAMS overrides).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "burstlab/merge.hpp"
#include "cpu_check.hpp"
#include "testutil.hpp"

namespace burstlab::prop {

// A random problem, as plain fields that RapidCheck shrinks one by one.
struct Spec {
  int B = 1, H_kv = 1, G = 1, N_q = 1, N_k = 1, d = 1;
  bool causal = false;
  int window_left = -1, window_right = -1;  // -1 = unbounded
  int docs = 0;                             // 0 = no document mask
  bool block = false;
  int block_q = 1, block_k = 1, density10 = 5;  // density = density10 / 10
  int Br = 1, Bc = 1;
  bool bshd = false;
  int values = 0;  // Values::Normal .. WideV
  int seed = 0, mask_seed = 0;
};

std::string mask_spec(const Spec& s) {
  std::vector<std::string> parts;
  if (s.causal) parts.push_back("causal");
  if (s.window_left >= 0 || s.window_right >= 0)
    parts.push_back("window:" + std::to_string(s.window_left) + "," + std::to_string(s.window_right));
  if (s.docs > 0) parts.push_back("document:" + std::to_string(s.docs));
  if (s.block) {
    std::ostringstream os;
    os << "block:" << s.block_q << "x" << s.block_k << "@" << s.density10 / 10.0;
    parts.push_back(os.str());
  }
  if (parts.empty()) return "none";
  std::string out = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) out += "+" + parts[k];
  return out;
}

void showValue(const Spec& s, std::ostream& os) {
  os << "B=" << s.B << " H_q=" << s.H_kv * s.G << " H_kv=" << s.H_kv << " N_q=" << s.N_q
     << " N_k=" << s.N_k << " d=" << s.d << " mask=" << mask_spec(s) << " (mask_seed "
     << s.mask_seed << ") Br=" << s.Br << " Bc=" << s.Bc << " layout=" << (s.bshd ? "BSHD" : "BHSD")
     << " values=" << to_string(static_cast<Values>(s.values)) << " seed=" << s.seed;
}

Problem problem_of(const Spec& s) {
  return testutil::make_problem(s.B, s.H_kv * s.G, s.H_kv, s.N_q, s.N_k, s.d, mask_spec(s),
                                static_cast<uint64_t>(s.mask_seed));
}
cpu::Tiles tiles_of(const Spec& s) { return cpu::Tiles{s.Br, s.Bc}; }
Layout layout_of(const Spec& s) { return s.bshd ? Layout::BSHD : Layout::BHSD; }

rc::Gen<Spec> gen_spec(bool with_mask = true, bool with_values = true) {
  using namespace rc;
  return gen::build<Spec>(
      gen::set(&Spec::B, gen::inRange(1, 3)), gen::set(&Spec::H_kv, gen::inRange(1, 4)),
      gen::set(&Spec::G, gen::inRange(1, 4)), gen::set(&Spec::N_q, gen::inRange(1, 65)),
      gen::set(&Spec::N_k, gen::inRange(1, 65)), gen::set(&Spec::d, gen::inRange(1, 17)),
      gen::set(&Spec::causal, with_mask ? gen::arbitrary<bool>() : gen::just(false)),
      gen::set(&Spec::window_left, with_mask ? gen::inRange(-1, 24) : gen::just(-1)),
      gen::set(&Spec::window_right, with_mask ? gen::inRange(-1, 24) : gen::just(-1)),
      gen::set(&Spec::docs, with_mask ? gen::inRange(0, 5) : gen::just(0)),
      gen::set(&Spec::block, with_mask ? gen::arbitrary<bool>() : gen::just(false)),
      gen::set(&Spec::block_q, gen::inRange(1, 20)), gen::set(&Spec::block_k, gen::inRange(1, 20)),
      gen::set(&Spec::density10, gen::inRange(0, 11)), gen::set(&Spec::Br, gen::inRange(1, 70)),
      gen::set(&Spec::Bc, gen::inRange(1, 70)), gen::set(&Spec::bshd, gen::arbitrary<bool>()),
      gen::set(&Spec::values, with_values ? gen::inRange(0, 4) : gen::just(0)),
      gen::set(&Spec::seed, gen::inRange(0, 1000000)),
      gen::set(&Spec::mask_seed, gen::inRange(0, 1000000)));
}

// ---- comparison helpers (for properties between two cpu results, fp64)

// |x - y| <= rtol (|x| + |y|) + atol elementwise; non-finite values must be identical.
bool close(const std::vector<double>& x, const std::vector<double>& y, double rtol, double atol,
           std::string* why) {
  if (x.size() != y.size()) { *why = "size differs"; return false; }
  for (size_t e = 0; e < x.size(); ++e) {
    const bool fx = std::isfinite(x[e]), fy = std::isfinite(y[e]);
    if (!fx || !fy) {
      if (!(x[e] == y[e])) { *why = "element " + std::to_string(e) + ": non-finite mismatch " + std::to_string(x[e]) + " vs " + std::to_string(y[e]); return false; }
      continue;
    }
    if (std::fabs(x[e] - y[e]) > rtol * (std::fabs(x[e]) + std::fabs(y[e])) + atol) {
      std::ostringstream os;
      os.precision(17);
      os << "element " << e << ": " << x[e] << " vs " << y[e];
      *why = os.str();
      return false;
    }
  }
  return true;
}
double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

// Absolute slack for gradients: the scale of the terms they sum (|dS| |K| with
// |dS| <= |dP| + |D| <= 2 d max|dO| max|V|), so cancellation to ~0 (e.g. a row with a single
// visible key, whose true dQ is 0) is compared on the terms' scale, not on the result's:
// sum_j |dS_ij| |K_jk| <= 2 d max|dO| max|V| max|K|, and dK, dV sum G N_q such rows.
double grad_atol(const Problem& p, const Inputs& in) {
  return 1e-13 * 2.0 * double(p.d) * double(group_size(p)) * double(std::max(p.N_q, p.N_k)) *
         max_abs(in.dO.f64().data) * max_abs(in.V.f64().data) *
         std::max({max_abs(in.Q.f64().data), max_abs(in.K.f64().data), 1.0});
}

// Tolerances of the cpu-vs-cpu properties below. Both sides are fp64 cpu runs on normal values
// (gen_spec(..., with_values = false)) with N_q, N_k <= 64, d <= 16, G <= 3; they differ only in
// the order or grouping of the same sums (tiles, key order, merge tree, head repetition). A sum
// of n terms reordered moves by at most gamma(n) (Higham, §9.1) times the magnitude of the terms;
// N_k <= 64 gives gamma(64) = 7.1e-15, times max|V| for O (P|V| <= max|V|, eq. 9.3); for LSE
// the relative error gamma(64) of l becomes an absolute error of log l, plus u_64 |LSE| (eq. 9.4).
// Hence atol 1e-13 max|V| for O and 1e-13 for LSE (14x that estimate); 1e-14 where only one regrouping of a 3-way merge or of per-head sums
// differs (a few u_64 of the result). Gradients sum up to G N_q = 192 rows of such terms:
// grad_atol's 1e-13 is per unit of the term scale derived above, and rtol 1e-11 covers the
// larger elements. A wrong mask or index moves an element by ~max|V| / N_k >= max|V| / 64,
// eleven orders of magnitude above these tolerances.
#define RC_ASSERT_CLOSE(x, y, rtol, atol)                 \
  do {                                                    \
    std::string why_;                                     \
    const bool ok_ = close((x), (y), (rtol), (atol), &why_); \
    if (!ok_) RC_LOG() << #x " vs " #y ": " << why_ << "\n"; \
    RC_ASSERT(ok_);                                       \
  } while (0)

struct Result {
  Tensor4<double> O, dQ, dK, dV;
  Tensor3<double> LSE;
};
Result run_cpu64(const Problem& p, const Tensor4<double>& Q, const Tensor4<double>& K,
                 const Tensor4<double>& V, const Tensor4<double>& dO, cpu::Tiles t, bool bwd) {
  Result r;
  r.O = make_tensor4<double>(Q.layout, p.B, p.H_q, p.N_q, p.d);
  r.LSE = make_tensor3<double>(p.B, p.H_q, p.N_q);
  poison(r.O);
  poison(r.LSE);
  cpu::forward<double>(p, Q.view(), K.view(), V.view(), r.O.view(), r.LSE.view(), t);
  if (!bwd) return r;
  r.dQ = make_tensor4<double>(Q.layout, p.B, p.H_q, p.N_q, p.d);
  r.dK = make_tensor4<double>(K.layout, p.B, p.H_kv, p.N_k, p.d);
  r.dV = r.dK;
  poison(r.dQ);
  poison(r.dK);
  poison(r.dV);
  cpu::backward<double>(p, Q.view(), K.view(), V.view(), as_const(r.O.view()), dO.view(),
                        as_const(r.LSE.view()), r.dQ.view(), r.dK.view(), r.dV.view(), t);
  return r;
}

void assert_pass(const std::vector<Metrics>& ms) {
  const auto res = testutil::all_pass(ms);
  if (!res) RC_LOG() << res.message() << "\n";
  RC_ASSERT(static_cast<bool>(res));
}

// ---------------------------------------------------------------- cpu vs the oracle

// A generated spec run by the CPU engine in dtype dt, forward and backward, against the oracle.
void cpu_matches_oracle(Dtype dt) {
  const Spec s = *gen_spec();
  cputest::Case c;
  c.p = problem_of(s);
  c.layout = layout_of(s);
  c.dtype = dt;
  c.values = static_cast<Values>(s.values);
  c.seed = static_cast<uint64_t>(s.seed);
  c.tiles = tiles_of(s);
  assert_pass(cputest::run_case(c, true));
}

RC_GTEST_PROP(CpuProperty, MatchesOracleFp64, ()) { cpu_matches_oracle(Dtype::F64); }

RC_GTEST_PROP(CpuProperty, MatchesOracleFp32, ()) { cpu_matches_oracle(Dtype::F32); }

// ---------------------------------------------------------------- blocks and the merge

// Key pieces of [0, N_k): `parts` pieces, contiguous cuts or scattered (random assignment).
std::vector<std::vector<int64_t>> key_pieces(int64_t N_k, int parts, bool scattered, int seed) {
  return cputest::split_positions(N_k, parts,
                                  scattered ? cputest::Split::Random : cputest::Split::Contiguous,
                                  static_cast<uint64_t>(seed));
}

// forward_block over a set of keys for all queries: the partial (O, LSE) of §4.3.
struct Partial {
  Tensor4<double> O;
  Tensor3<double> L;
};
Partial partial(const Problem& p, const MaskParams& mp, const Inputs& in,
                const std::vector<int64_t>& keys, cpu::Tiles t) {
  Partial r;
  r.O = make_tensor4<double>(in.Q.layout(), p.B, p.H_q, p.N_q, p.d);
  r.L = make_tensor3<double>(p.B, p.H_q, p.N_q);
  poison(r.O);
  poison(r.L);
  const Tensor4<double> Kb = cputest::gather_rows(in.K.f64(), keys), Vb = cputest::gather_rows(in.V.f64(), keys);
  cpu::forward_block<double>(p, mp, contiguous(0, p.N_q), cputest::positions_of(keys), in.Q.f64().view(),
                             Kb.view(), Vb.view(), r.O.view(), r.L.view(), t);
  return r;
}
Partial merged(const Partial& a, const Partial& b) {
  Partial r = a;
  merge<double>(r.O.view(), r.L.view(), b.O.view(), b.L.view());
  return r;
}

// Splitting the keys anywhere (contiguous cuts or scattered positions) and merging the
// forward_block partials equals the whole: checked against the oracle and cpu::forward.
RC_GTEST_PROP(CpuProperty, SplitKeysAnywhereAndMergeEqualsWhole, ()) {
  const Spec s = *gen_spec(true, false);
  const int parts = *rc::gen::inRange(1, 6);
  const bool scattered = *rc::gen::arbitrary<bool>();
  const Problem p = problem_of(s);
  const MaskData md = compile_mask(p);
  const Inputs in = make_inputs(p, layout_of(s), Dtype::F64, static_cast<uint64_t>(s.seed));
  const Oracle want = run_oracle(p, in, false);
  Partial acc;
  acc.O = make_tensor4<double>(in.Q.layout(), p.B, p.H_q, p.N_q, p.d, 0.0);
  acc.L = make_tensor3<double>(p.B, p.H_q, p.N_q, -std::numeric_limits<double>::infinity());
  for (const auto& keys : key_pieces(p.N_k, parts, scattered, s.seed + 1))
    acc = merged(acc, partial(p, md.params(), in, keys, tiles_of(s)));
  assert_pass(check_forward<double>(want, acc.O, acc.L));
  const Result whole = run_cpu64(p, in.Q.f64(), in.K.f64(), in.V.f64(), in.dO.f64(), tiles_of(s), false);
  RC_ASSERT_CLOSE(acc.O.data, whole.O.data, 1e-12, 1e-13 * max_abs(in.V.f64().data));
  RC_ASSERT_CLOSE(acc.L.data, whole.LSE.data, 1e-13, 1e-13);
}

// The merge of real partials: commutative bitwise, associative up to rounding, identity (0, -inf).
RC_GTEST_PROP(CpuProperty, MergeAlgebra, ()) {
  const Spec s = *gen_spec(true, false);
  const Problem p = problem_of(s);
  const MaskData md = compile_mask(p);
  const Inputs in = make_inputs(p, layout_of(s), Dtype::F64, static_cast<uint64_t>(s.seed));
  const auto pieces = key_pieces(p.N_k, 3, *rc::gen::arbitrary<bool>(), s.seed + 2);
  const Partial a = partial(p, md.params(), in, pieces[0], tiles_of(s));
  const Partial b = partial(p, md.params(), in, pieces[1], tiles_of(s));
  const Partial c = partial(p, md.params(), in, pieces[2], tiles_of(s));
  // commutative, bitwise
  const Partial ab = merged(a, b), ba = merged(b, a);
  RC_ASSERT(std::memcmp(ab.O.data.data(), ba.O.data.data(), ab.O.data.size() * sizeof(double)) == 0);
  RC_ASSERT(std::memcmp(ab.L.data.data(), ba.L.data.data(), ab.L.data.size() * sizeof(double)) == 0);
  // associative up to rounding
  const Partial ab_c = merged(ab, c), a_bc = merged(a, merged(b, c));
  RC_ASSERT_CLOSE(ab_c.O.data, a_bc.O.data, 1e-13, 1e-14 * max_abs(in.V.f64().data));
  RC_ASSERT_CLOSE(ab_c.L.data, a_bc.L.data, 1e-14, 1e-14);
  // identity (O = 0, LSE = -inf) on either side, bitwise
  Partial id;
  id.O = make_tensor4<double>(in.Q.layout(), p.B, p.H_q, p.N_q, p.d, 0.0);
  id.L = make_tensor3<double>(p.B, p.H_q, p.N_q, -std::numeric_limits<double>::infinity());
  for (const Partial& x : {merged(a, id), merged(id, a)}) {
    RC_ASSERT(std::memcmp(x.O.data.data(), a.O.data.data(), a.O.data.size() * sizeof(double)) == 0);
    RC_ASSERT(std::memcmp(x.L.data.data(), a.L.data.data(), a.L.data.size() * sizeof(double)) == 0);
  }
}

// ---------------------------------------------------------------- invariances

// No mask: permuting the keys (K, V rows together) changes nothing; dK, dV permute along.
RC_GTEST_PROP(CpuProperty, KeyPermutationInvarianceWithoutMask, ()) {
  const Spec s = *gen_spec(false, false);
  const Problem p = problem_of(s);
  const Inputs in = make_inputs(p, layout_of(s), Dtype::F64, static_cast<uint64_t>(s.seed));
  std::vector<int64_t> perm(static_cast<size_t>(p.N_k));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(static_cast<uint64_t>(s.seed) + 3));
  const Tensor4<double> Kp = cputest::gather_rows(in.K.f64(), perm), Vp = cputest::gather_rows(in.V.f64(), perm);
  const Result r0 = run_cpu64(p, in.Q.f64(), in.K.f64(), in.V.f64(), in.dO.f64(), tiles_of(s), true);
  const Result r1 = run_cpu64(p, in.Q.f64(), Kp, Vp, in.dO.f64(), tiles_of(s), true);
  RC_ASSERT_CLOSE(r1.O.data, r0.O.data, 1e-12, 1e-13 * max_abs(in.V.f64().data));
  RC_ASSERT_CLOSE(r1.LSE.data, r0.LSE.data, 1e-13, 1e-13);
  RC_ASSERT_CLOSE(r1.dQ.data, r0.dQ.data, 1e-11, grad_atol(p, in));
  const Tensor4<double> dK0p = cputest::gather_rows(r0.dK, perm), dV0p = cputest::gather_rows(r0.dV, perm);
  RC_ASSERT_CLOSE(r1.dK.data, dK0p.data, 1e-11, grad_atol(p, in));
  RC_ASSERT_CLOSE(r1.dV.data, dV0p.data, 1e-11, grad_atol(p, in));
}

// O is linear in V: O(a V1 + b V2) = a O(V1) + b O(V2); LSE does not depend on V.
RC_GTEST_PROP(CpuProperty, LinearInV, ()) {
  const Spec s = *gen_spec(true, false);
  const Problem p = problem_of(s);
  const Inputs in = make_inputs(p, layout_of(s), Dtype::F64, static_cast<uint64_t>(s.seed));
  const Inputs in2 = make_inputs(p, layout_of(s), Dtype::F64, static_cast<uint64_t>(s.seed) + 7);
  const double a = *rc::gen::inRange(-20, 21) / 8.0, b = *rc::gen::inRange(-20, 21) / 8.0;
  Tensor4<double> Vc = in.V.f64();
  for (size_t e = 0; e < Vc.data.size(); ++e) Vc.data[e] = a * in.V.f64().data[e] + b * in2.V.f64().data[e];
  const Result r1 = run_cpu64(p, in.Q.f64(), in.K.f64(), in.V.f64(), in.dO.f64(), tiles_of(s), false);
  const Result r2 = run_cpu64(p, in.Q.f64(), in.K.f64(), in2.V.f64(), in.dO.f64(), tiles_of(s), false);
  const Result rc_ = run_cpu64(p, in.Q.f64(), in.K.f64(), Vc, in.dO.f64(), tiles_of(s), false);
  std::vector<double> lin(r1.O.data.size());
  for (size_t e = 0; e < lin.size(); ++e) lin[e] = a * r1.O.data[e] + b * r2.O.data[e];
  const double scale = (std::fabs(a) + std::fabs(b)) * std::max(max_abs(in.V.f64().data), max_abs(in2.V.f64().data));
  RC_ASSERT_CLOSE(rc_.O.data, lin, 0.0, 1e-13 * scale + 1e-300);
  RC_ASSERT(std::memcmp(rc_.LSE.data.data(), r1.LSE.data.data(), r1.LSE.data.size() * sizeof(double)) == 0);
}

// V = 1: O = 1 on rows that see a key, O = 0 and LSE = -inf exactly on empty rows (fp64, fp32).
RC_GTEST_PROP(CpuProperty, OnesGiveOnesOnVisibleRowsAndZeroOnEmptyRows, ()) {
  const Spec s = *gen_spec(true, false);
  const Problem p = problem_of(s);
  const MaskData md = compile_mask(p);
  const MaskParams mp = md.params();
  const Inputs in = make_inputs(p, layout_of(s), Dtype::F32, static_cast<uint64_t>(s.seed));
  auto check = [&](auto tag, double tol) {
    using T = decltype(tag);
    const Tensor4<T> Q = convert<T>(in.Q), K = convert<T>(in.K);
    const Tensor4<T> V = make_tensor4<T>(in.V.layout(), p.B, p.H_kv, p.N_k, p.d, T(1));
    Tensor4<T> O = make_tensor4<T>(in.Q.layout(), p.B, p.H_q, p.N_q, p.d);
    Tensor3<T> L = make_tensor3<T>(p.B, p.H_q, p.N_q);
    poison(O);
    poison(L);
    cpu::forward<T>(p, Q.view(), K.view(), V.view(), O.view(), L.view(), tiles_of(s));
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H_q; ++h)
        for (int64_t i = 0; i < p.N_q; ++i) {
          const bool empty = count_visible(mp, i, i + 1, 0, p.N_k) == 0;
          const T l = L.view()(b, h, i);
          const bool lse_ok = empty ? l == -std::numeric_limits<T>::infinity() : std::isfinite(l);
          RC_ASSERT(lse_ok);
          for (int64_t k = 0; k < p.d; ++k) {
            const T o = O.view()(b, h, i, k);
            if (empty) RC_ASSERT(o == T(0));
            else RC_ASSERT(std::fabs(double(o) - 1.0) <= tol);
          }
        }
  };
  // fp32: O_acc (GEMM) and l (row sums) round independently, and every rescale by alpha
  // (eq. 4.3) rounds both: a few u_f32 per key; 3e-7 = 5 u_f32 (u_f32 = 2^-24 = 6.0e-8) per key.
  // fp64: the same 5 u_64 per key is 5.6e-16 (N_k + 2) <= 3.7e-14 for N_k <= 64, under 1e-13.
  check(double(), 1e-13);
  check(float(), 3e-7 * double(p.N_k + 2));
}

// GQA equals MHA with K/V repeated per q-head; dK, dV of a kv-head are the group sums.
RC_GTEST_PROP(CpuProperty, GqaEqualsMhaWithRepeatedKV, ()) {
  const Spec s = *gen_spec(true, false);
  const Problem p = problem_of(s);
  const int64_t G = group_size(p);
  const Inputs in = make_inputs(p, layout_of(s), Dtype::F64, static_cast<uint64_t>(s.seed));
  Problem pm = p;
  pm.H_kv = p.H_q;
  auto repeat = [&](const Tensor4<double>& x) {
    Tensor4<double> y = make_tensor4<double>(x.layout, p.B, p.H_q, p.N_k, p.d);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H_q; ++h)
        for (int64_t j = 0; j < p.N_k; ++j)
          for (int64_t k = 0; k < p.d; ++k) y.view()(b, h, j, k) = x.view()(b, h / G, j, k);
    return y;
  };
  const Result g = run_cpu64(p, in.Q.f64(), in.K.f64(), in.V.f64(), in.dO.f64(), tiles_of(s), true);
  const Result m = run_cpu64(pm, in.Q.f64(), repeat(in.K.f64()), repeat(in.V.f64()), in.dO.f64(), tiles_of(s), true);
  RC_ASSERT_CLOSE(g.O.data, m.O.data, 1e-13, 1e-14 * max_abs(in.V.f64().data));
  RC_ASSERT_CLOSE(g.LSE.data, m.LSE.data, 1e-14, 1e-14);
  RC_ASSERT_CLOSE(g.dQ.data, m.dQ.data, 1e-12, grad_atol(p, in));
  Tensor4<double> dKs = make_tensor4<double>(in.K.layout(), p.B, p.H_kv, p.N_k, p.d, 0.0), dVs = dKs;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H_q; ++h)
      for (int64_t j = 0; j < p.N_k; ++j)
        for (int64_t k = 0; k < p.d; ++k) {
          dKs.view()(b, h / G, j, k) += m.dK.view()(b, h, j, k);
          dVs.view()(b, h / G, j, k) += m.dV.view()(b, h, j, k);
        }
  RC_ASSERT_CLOSE(g.dK.data, dKs.data, 1e-11, grad_atol(p, in));
  RC_ASSERT_CLOSE(g.dV.data, dVs.data, 1e-11, grad_atol(p, in));
}

// Any two tile shapes give the same answer up to rounding (fp64), forward and backward.
RC_GTEST_PROP(CpuProperty, TileSizeInvariance, ()) {
  const Spec s = *gen_spec(true, false);
  const cpu::Tiles t2{*rc::gen::inRange(1, 70), *rc::gen::inRange(1, 70)};
  const Problem p = problem_of(s);
  const Inputs in = make_inputs(p, layout_of(s), Dtype::F64, static_cast<uint64_t>(s.seed));
  const Result r1 = run_cpu64(p, in.Q.f64(), in.K.f64(), in.V.f64(), in.dO.f64(), tiles_of(s), true);
  const Result r2 = run_cpu64(p, in.Q.f64(), in.K.f64(), in.V.f64(), in.dO.f64(), t2, true);
  RC_ASSERT_CLOSE(r1.O.data, r2.O.data, 1e-12, 1e-13 * max_abs(in.V.f64().data));
  RC_ASSERT_CLOSE(r1.LSE.data, r2.LSE.data, 1e-13, 1e-13);
  RC_ASSERT_CLOSE(r1.dQ.data, r2.dQ.data, 1e-11, grad_atol(p, in));
  RC_ASSERT_CLOSE(r1.dK.data, r2.dK.data, 1e-11, grad_atol(p, in));
  RC_ASSERT_CLOSE(r1.dV.data, r2.dV.data, 1e-11, grad_atol(p, in));
}

}  // namespace burstlab::prop
