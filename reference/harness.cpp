// reference/harness.cpp — seeded inputs, generated masks, poisoning, and the oracle with its §9
// bounds (spec §9.4-§9.5). Deterministic: every tensor and every mask part draws from its own
// std::mt19937_64 stream, seeded from (seed, stream id) through splitmix64, so adding a tensor or
// changing one part never shifts the values of another.
#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include <omp.h>
#include <sstream>

#include "burstlab/error.hpp"
#include "burstlab/names.hpp"
#include "reference.hpp"
#include "fill.hpp"
#include "streams.hpp"

namespace burstlab {
namespace {

using reference::stream;
enum StreamId : uint64_t { kQ = 1, kK = 2, kV = 3, kdO = 4, kDocQ = 11, kDocK = 12, kBlock = 21 };

[[noreturn]] void bad_part(const std::string& spec, const std::string& part, const char* form) {
  fail("mask (", spec, ") part '", part, "' must be ", form);
}

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}
bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

// n_docs - 1 sorted cut points in [0, N]: document t is [c[t], c[t+1]) (possibly empty).
std::vector<int64_t> random_cuts(int64_t n_docs, int64_t N, std::mt19937_64& rng) {
  std::vector<int64_t> c(static_cast<size_t>(n_docs + 1));
  std::uniform_int_distribution<int64_t> u(0, N);
  c[0] = 0;
  c[n_docs] = N;
  for (int64_t t = 1; t < n_docs; ++t) c[t] = u(rng);
  std::sort(c.begin() + 1, c.end() - 1);
  return c;
}

std::vector<int32_t> segments_from_cuts(const std::vector<int64_t>& c, int64_t N) {
  std::vector<int32_t> s(static_cast<size_t>(N));
  for (size_t t = 0; t + 1 < c.size(); ++t)
    for (int64_t x = c[t]; x < c[t + 1]; ++x) s[x] = static_cast<int32_t>(t);
  return s;
}

}  // namespace

constexpr Named<Values> kValuesNames[] = {
    {Values::Normal, "normal"}, {Values::Large, "large"}, {Values::Ties, "ties"}, {Values::WideV, "widev"}};

std::string to_string(Values v) { return name_of(v, kValuesNames); }
Values parse_values(const std::string& s) { return parse_named(s, kValuesNames, "values"); }

// Value modes (spec §9.5):
//   Normal  Q, K, V, dO ~ N(0, 1).
//   Large   Q, K ~ c N(0, 1) with c = 2 sqrt(1e3 / (|scale| sqrt(d))): then scale q.k ~
//           c^2 |scale| sqrt(d) N(0, 1) = 4e3 N(0, 1), so a typical |scale q.k| is ~2.7e3 (the
//           median of |N(0,1)| is 0.67) and most pairs reach 1e3. V, dO ~ N(0, 1).
//   Ties    Q, K uniform on {-1, 0.5, 1} (exact in every dtype); V, dO ~ N(0, 1).
//   WideV   Q, K ~ N(0, 1); V, dO = random sign * 10^U(-6, 6). For F16 (max 65504) the exponent
//           range is U(-4, 1.5) so that V, dO, dP = dO V^T and the gradients stay finite in fp16.
double qk_multiplier(const Problem& p, Values values) {
  if (values != Values::Large) return 1.0;
  double s = std::fabs(scale_of(p));
  if (!(s > 0)) s = 1.0 / std::sqrt(double(p.d));  // scale 0: use the default's magnitude
  return 2.0 * std::sqrt(1e3 / (s * std::sqrt(double(p.d))));
}

Inputs make_inputs(const Problem& p, Layout layout, Dtype dtype, uint64_t seed, Values values) {
  validate(p);
  Inputs in;
  in.dtype = dtype;
  in.Q = AnyTensor4::zeros(dtype, layout, p.B, p.H_q, p.N_q, p.d);
  in.K = AnyTensor4::zeros(dtype, layout, p.B, p.H_kv, p.N_k, p.d);
  in.V = AnyTensor4::zeros(dtype, layout, p.B, p.H_kv, p.N_k, p.d);
  in.dO = AnyTensor4::zeros(dtype, layout, p.B, p.H_q, p.N_q, p.d);
  const double qk_mult = qk_multiplier(p, values);
  // Each draw calls normal once, or never (fill.hpp). Logical order (b, h, n, k): BSHD and BHSD
  // inputs of one seed hold the same values; inputs are never zero (spec §9.5).
  auto qk_draw = [&](std::mt19937_64& r, auto& normal) -> double {
    static const double choices[3] = {-1.0, 0.5, 1.0};
    if (values == Values::Ties) return choices[std::uniform_int_distribution<int>(0, 2)(r)];
    return qk_mult * normal(r);
  };
  const double lo = dtype == Dtype::F16 ? -4.0 : -6.0, hi = dtype == Dtype::F16 ? 1.5 : 6.0;
  auto v_draw = [&](std::mt19937_64& r, auto& normal) -> double {
    if (values != Values::WideV) return normal(r);
    const double e = std::uniform_real_distribution<double>(lo, hi)(r);
    const double sign = std::uniform_int_distribution<int>(0, 1)(r) ? 1.0 : -1.0;
    return sign * std::pow(10.0, e);
  };
  // The four tensors side by side (up to 4 threads of the OpenMP team), then stitched in order;
  // each in dtype's storage type, which holds its rounded values exactly.
  AnyTensor4* const t[4] = {&in.Q, &in.K, &in.V, &in.dO};
  const StreamId id[4] = {kQ, kK, kV, kdO};
  reference::Filled f[4];
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min(4, omp_get_max_threads()))
  for (int i = 0; i < 4; ++i)
    f[i] = t[i]->visit([&](auto& x) {
      return i < 2 ? reference::fill_alone(x, dtype, stream(seed, id[i]), qk_draw)
                   : reference::fill_alone(x, dtype, stream(seed, id[i]), v_draw);
    });
  reference::Carry c;
  for (int i = 0; i < 4; ++i)
    c = t[i]->visit([&](auto& x) {
      return i < 2 ? reference::stitch(x, dtype, f[i], c, qk_draw) : reference::stitch(x, dtype, f[i], c, v_draw);
    });
  return in;
}

Inputs as_fp64(Inputs in) {
  for (AnyTensor4* t : {&in.Q, &in.K, &in.V, &in.dO})
    if (t->dtype() != Dtype::F64) *t = t->as<double>();  // the narrower one freed as it is replaced
  return in;
}

namespace {
// x's elements as U, each converted once.
template <class U, class T>
std::vector<U> cast_all(const std::vector<T>& x) {
  std::vector<U> y(x.size());
  for (size_t e = 0; e < x.size(); ++e) y[e] = static_cast<U>(x[e]);
  return y;
}
// x's shape (and layout) with the elements data.
template <class U, class T>
Tensor4<U> like(const Tensor4<T>& x, std::vector<U> data) {
  return Tensor4<U>{std::move(data), x.layout, x.B, x.H, x.N, x.d};
}
template <class U, class T>
Tensor3<U> like(const Tensor3<T>& x, std::vector<U> data) {
  return Tensor3<U>{std::move(data), x.B, x.H, x.N};
}
}  // namespace

template <class T>
Tensor4<T> convert(const Tensor4<double>& x) { return like(x, cast_all<T>(x.data)); }
template <class T>
Tensor3<T> convert(const Tensor3<double>& x) { return like(x, cast_all<T>(x.data)); }
template <class T>
Tensor4<double> to_double(const Tensor4<T>& x) { return like(x, cast_all<double>(x.data)); }
template <class T>
Tensor3<double> to_double(const Tensor3<T>& x) { return like(x, cast_all<double>(x.data)); }
template <class T>
void poison(Tensor4<T>& x) { std::fill(x.data.begin(), x.data.end(), std::numeric_limits<T>::quiet_NaN()); }
template <class T>
void poison(Tensor3<T>& x) { std::fill(x.data.begin(), x.data.end(), std::numeric_limits<T>::quiet_NaN()); }

// Grammar: '+'-joined parts, each one of
//   none | causal | window:L,R | document[:n_docs] | block[:BQxBK[@density]]
// Defaults: document -> 3 documents; block -> BQ = ceil(N_q/4), BK = ceil(N_k/4) (a ~4x4 grid
// whatever the lengths), density 0.5.
// Documents: random query cut points; key cut points follow them (scaled to N_k, jittered by up to
// 2 positions), so a document's q and k lengths differ and some documents may be empty on one
// side; with n_docs >= 2 the document with the fewest queries is forced to have >= 1 query and
// 0 keys, so fully masked rows always exist (and are few).
// Block: each bit visible with probability `density`; with >= 2 block rows one random block row
// is all zero (fully masked rows).
MaskSpec make_mask(const std::string& spec, int64_t N_q, int64_t N_k, uint64_t seed) {
  static const char* kParts = "none, causal, window:L,R, document[:n_docs], block[:BQxBK[@density]]";
  if (N_q < 1) fail("N_q (", N_q, ") must be >= 1");
  if (N_k < 1) fail("N_k (", N_k, ") must be >= 1");
  if (spec.empty()) fail("mask () is empty; parts: ", kParts);
  MaskSpec m;
  bool seen_causal = false, seen_window = false, seen_doc = false, seen_block = false;
  size_t start = 0;
  while (true) {
    const size_t plus = spec.find('+', start);
    const std::string part = spec.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
    if (part.empty()) fail("mask (", spec, ") has an empty part; parts: ", kParts);
    const size_t colon = part.find(':');
    const std::string head = part.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : part.substr(colon + 1);
    const bool has_arg = colon != std::string::npos;
    auto once = [&](bool& seen) {
      if (seen) fail("mask (", spec, ") gives part '", head, "' twice");
      seen = true;
    };
    if (head == "none" && !has_arg) {
      // no constraint
    } else if (head == "causal" && !has_arg) {
      once(seen_causal);
      m.causal = true;
    } else if (head == "window") {
      once(seen_window);
      const size_t comma = arg.find(',');
      int64_t L, R;
      if (!has_arg || comma == std::string::npos || !parse_int(arg.substr(0, comma), &L) ||
          !parse_int(arg.substr(comma + 1), &R) || L < -1 || R < -1)
        bad_part(spec, part, "window:L,R with integers L, R >= -1 (-1 = unbounded)");
      m.window_left = L;
      m.window_right = R;
    } else if (head == "document") {
      once(seen_doc);
      int64_t n_docs = 3;
      if (has_arg && (!parse_int(arg, &n_docs) || n_docs < 1 || n_docs > (int64_t(1) << 30)))
        bad_part(spec, part, "document[:n_docs] with an integer n_docs >= 1");
      std::mt19937_64 rq = stream(seed, kDocQ), rk = stream(seed, kDocK);
      std::vector<int64_t> cq = random_cuts(n_docs, N_q, rq), ck(cq.size());
      // key cuts follow the query cuts (scaled to N_k) with a jitter of up to 2 positions, so
      // documents overlap sensibly but their q and k lengths differ
      std::uniform_int_distribution<int64_t> jitter(-2, 2);
      ck[0] = 0;
      ck[n_docs] = N_k;
      for (int64_t t = 1; t < n_docs; ++t)
        ck[t] = std::clamp<int64_t>(static_cast<int64_t>(std::llround(double(cq[t]) * double(N_k) / double(N_q))) +
                                        jitter(rk), 0, N_k);
      std::sort(ck.begin() + 1, ck.end() - 1);
      if (n_docs >= 2) {
        // the document with the fewest queries (first on ties) gets >= 1 query and 0 keys
        int64_t e = 0;
        for (int64_t t = 1; t < n_docs; ++t)
          if (cq[t + 1] - cq[t] < cq[e + 1] - cq[e]) e = t;
        if (cq[e + 1] == cq[e]) {  // take one query from a neighbour
          if (cq[e] > 0) {
            cq[e] -= 1;
            for (int64_t t = 1; t < e; ++t) cq[t] = std::min(cq[t], cq[e]);
          } else {
            cq[e + 1] = 1;
            for (int64_t t = e + 2; t < n_docs; ++t) cq[t] = std::max(cq[t], cq[e + 1]);
          }
        }
        // its keys go to the next document (cuts stay sorted); the last one's go to the previous
        if (e + 1 < n_docs) ck[e + 1] = ck[e];
        else ck[e] = N_k;
      }
      m.q_segment = segments_from_cuts(cq, N_q);
      m.k_segment = segments_from_cuts(ck, N_k);
    } else if (head == "block") {
      once(seen_block);
      int64_t bq = (N_q + 3) / 4, bk = (N_k + 3) / 4;
      double density = 0.5;
      if (has_arg) {
        const size_t at = arg.find('@');
        const std::string dims = arg.substr(0, at);
        const size_t xx = dims.find('x');
        bool ok = xx != std::string::npos && parse_int(dims.substr(0, xx), &bq) &&
                  parse_int(dims.substr(xx + 1), &bk) && bq >= 1 && bk >= 1;
        if (at != std::string::npos) ok = ok && parse_double(arg.substr(at + 1), &density) && density >= 0 && density <= 1;
        if (!ok) bad_part(spec, part, "block[:BQxBK[@density]] with integers BQ, BK >= 1 and density in [0, 1]");
      }
      const int64_t nbq = (N_q + bq - 1) / bq, nbk = (N_k + bk - 1) / bk;
      std::mt19937_64 rb = stream(seed, kBlock);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      m.block_q = bq;
      m.block_k = bk;
      m.block_mask.resize(static_cast<size_t>(nbq * nbk));
      for (auto& bit : m.block_mask) bit = u(rb) < density ? 1 : 0;
      if (nbq >= 2) {
        const int64_t r = std::uniform_int_distribution<int64_t>(0, nbq - 1)(rb);
        for (int64_t c = 0; c < nbk; ++c) m.block_mask[r * nbk + c] = 0;
      }
    } else {
      fail("mask (", spec, ") has unknown part '", part, "'; parts: ", kParts);
    }
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return m;
}

Oracle run_oracle(const Problem& p, const Inputs& inputs, bool backward) {
  validate(p);
  // The inputs in fp64: themselves when held so, else widened copies (exact).
  Tensor4<double> copies[4];
  struct {
    View4<const double> Q, K, V, dO;
    Dtype dtype;
  } const in{f64_view(inputs.Q, copies[0]), f64_view(inputs.K, copies[1]), f64_view(inputs.V, copies[2]),
             backward ? f64_view(inputs.dO, copies[3]) : View4<const double>{}, inputs.dtype};
  Oracle o;
  const Layout layout = inputs.Q.layout();
  o.O = make_tensor4<double>(layout, p.B, p.H_q, p.N_q, p.d);
  o.LSE = make_tensor3<double>(p.B, p.H_q, p.N_q);
  reference::forward<double>(p, in.Q, in.K, in.V, o.O.view(), o.LSE.view());
  o.fwd = forward_bounds(p, in.dtype, in.Q, in.K, in.V);
  if (backward) {
    o.dQ = make_tensor4<double>(layout, p.B, p.H_q, p.N_q, p.d);
    o.dK = make_tensor4<double>(inputs.K.layout(), p.B, p.H_kv, p.N_k, p.d);
    o.dV = make_tensor4<double>(inputs.V.layout(), p.B, p.H_kv, p.N_k, p.d);
    const Tensor4<double>& O = o.O;
    const Tensor3<double>& L = o.LSE;
    reference::backward<double>(p, in.Q, in.K, in.V, O.view(), in.dO,
                                L.view(), o.dQ.view(), o.dK.view(), o.dV.view());
    o.bwd = backward_bounds(p, in.dtype, in.Q, in.K, in.V, O.view(),
                            in.dO, L.view());
  }
  return o;
}

template <class T>
std::vector<Metrics> check_forward(const Oracle& want, const Tensor4<T>& O, const Tensor3<T>& LSE) {
  std::vector<Metrics> out;
  out.push_back(compare<T>("O", O.view(), want.O.view(), want.fwd.O.view()));
  out.push_back(compare<T>("LSE", LSE.view(), want.LSE.view(), want.fwd.LSE.view()));
  return out;
}

template <class T>
std::vector<Metrics> check_backward(const Oracle& want, const Tensor4<T>& dQ, const Tensor4<T>& dK,
                                    const Tensor4<T>& dV) {
  if (want.dQ.data.empty()) fail("check_backward: the oracle was run with backward = false");
  std::vector<Metrics> out;
  if (!dQ.data.empty()) out.push_back(compare<T>("dQ", dQ.view(), want.dQ.view(), want.bwd.dQ.view()));
  if (!dK.data.empty()) out.push_back(compare<T>("dK", dK.view(), want.dK.view(), want.bwd.dK.view()));
  if (!dV.data.empty()) out.push_back(compare<T>("dV", dV.view(), want.dV.view(), want.bwd.dV.view()));
  return out;
}

#define BURSTLAB_HARNESS_INSTANTIATE(T)                                                            \
  template Tensor4<T> convert<T>(const Tensor4<double>&);                                          \
  template Tensor3<T> convert<T>(const Tensor3<double>&);                                          \
  template Tensor4<double> to_double<T>(const Tensor4<T>&);                                        \
  template Tensor3<double> to_double<T>(const Tensor3<T>&);                                        \
  template void poison<T>(Tensor4<T>&);                                                            \
  template void poison<T>(Tensor3<T>&);                                                            \
  template std::vector<Metrics> check_forward<T>(const Oracle&, const Tensor4<T>&, const Tensor3<T>&); \
  template std::vector<Metrics> check_backward<T>(const Oracle&, const Tensor4<T>&, const Tensor4<T>&, \
                                                  const Tensor4<T>&);
BURSTLAB_HARNESS_INSTANTIATE(float)
BURSTLAB_HARNESS_INSTANTIATE(double)
#undef BURSTLAB_HARNESS_INSTANTIATE

}  // namespace burstlab
