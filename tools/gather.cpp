// tools/gather.cpp — a distributed run's shards back into global fp64 tensors, or only the pieces
// the row-sampled check reads (spec §9.11).
#include "gather.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "burstlab/error.hpp"

namespace burstlab::tools {

template <class T>
GatheredOutputs gather_outputs(const dist::DistResult<T>& res, bool forward, bool backward) {
  GatheredOutputs g;
  if (forward) {
    g.O = widen(dist::gather(res.O, res.qp));
    g.LSE = widen(dist::gather(res.LSE, res.qp));
  }
  if (backward) {
    g.dQ = widen(dist::gather(res.dQ, res.qp));
    g.dK = widen(dist::gather(res.dK, res.kp));
    g.dV = widen(dist::gather(res.dV, res.kp));
  }
  return g;
}
template GatheredOutputs gather_outputs<double>(const dist::DistResult<double>&, bool, bool);
template GatheredOutputs gather_outputs<float>(const dist::DistResult<float>&, bool, bool);
template GatheredOutputs gather_outputs<bf16_t>(const dist::DistResult<bf16_t>&, bool, bool);
template GatheredOutputs gather_outputs<f16_t>(const dist::DistResult<f16_t>&, bool, bool);

namespace {

const char* name_of(dist::Output which) {  // dist::Output's order
  static const char* const names[] = {"O", "LSE", "dQ", "dK", "dV"};
  return names[static_cast<int>(which)];
}

template <class U>
void widen_into(const U* x, int64_t n, double* out) {
  for (int64_t e = 0; e < n; ++e) out[e] = burstlab::to_double(x[e]);
}

}  // namespace

template <class T>
ReadOutput session_reader(const dist::Session<T>& s) {
  return [&s](int r, dist::Output which, int64_t at, int64_t n, double* out) {
    auto read = [&](auto tag) {
      std::vector<decltype(tag)> x(static_cast<size_t>(n));
      s.read_output(r, which, at, n, x.data());
      widen_into(x.data(), n, out);
    };
    if (which == dist::Output::O) read(T{});
    else read(acc_t<T>{});
  };
}

template <class T>
ReadOutput result_reader(const dist::DistResult<T>& res) {
  return [&res](int r, dist::Output which, int64_t at, int64_t n, double* out) {
    auto read = [&](const auto& tensors) {
      if (r < 0 || r >= static_cast<int>(tensors.size()))
        fail("result_reader: rank ", r, " of ", tensors.size(), " has no ", name_of(which));
      const auto& x = tensors[size_t(r)].data;
      if (at < 0 || n < 0 || size_t(at + n) > x.size())
        fail("result_reader: elements [", at, ", ", at + n, ") of rank ", r, "'s ", name_of(which), " (", x.size(), ")");
      widen_into(x.data() + at, n, out);
    };
    switch (which) {
      case dist::Output::O: return read(res.O);
      case dist::Output::LSE: return read(res.LSE);
      case dist::Output::dQ: return read(res.dQ);
      case dist::Output::dK: return read(res.dK);
      case dist::Output::dV: return read(res.dV);
    }
  };
}

#define BURSTLAB_GATHER_INST(T)                                           \
  template ReadOutput session_reader<T>(const dist::Session<T>&);        \
  template ReadOutput result_reader<T>(const dist::DistResult<T>&);
BURSTLAB_GATHER_INST(double)
BURSTLAB_GATHER_INST(float)
BURSTLAB_GATHER_INST(bf16_t)
BURSTLAB_GATHER_INST(f16_t)
#undef BURSTLAB_GATHER_INST

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Rows of O read at a time for D: the host holds one block of a rank's rows, never its shard.
constexpr int64_t kBlockRows = 1024;

void put(std::vector<char>& b, const double* v, int64_t n) {
  const char* x = reinterpret_cast<const char*>(v);
  b.insert(b.end(), x, x + n * int64_t(sizeof(double)));
}
// Reads back what put wrote, for rank r's bytes.
struct Take {
  const std::vector<char>& b;
  int r;
  size_t at = 0;
  void operator()(double* v, int64_t n) {
    const size_t bytes = size_t(n) * sizeof(double);
    if (at + bytes > b.size()) fail("rank ", r, "'s sampled outputs are truncated (", b.size(), " bytes)");
    std::memcpy(v, b.data() + at, bytes);
    at += bytes;
  }
  void done() const {
    if (at != b.size()) fail("rank ", r, "'s sampled outputs hold ", b.size() - at, " bytes more than expected");
  }
};

// The ids (rows or columns) whose position rank r holds under part: (index in ids, local index),
// in the ids' order. Every process computes it for every rank, so no index crosses processes.
template <class Id, class N>
std::vector<std::pair<size_t, int64_t>> owned(const std::vector<Id>& ids, const dist::Partition& part, int r, N n_of) {
  std::vector<std::pair<size_t, int64_t>> out;
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t n = n_of(ids[t]);
    if (part.owner_of[size_t(n)] == r) out.push_back({t, part.local_of[size_t(n)]});
  }
  return out;
}
const auto row_i = [](const RowId& x) { return x.i; };
const auto column_j = [](const ColumnId& x) { return x.j; };

void check_partition(const dist::World& w, const dist::Partition& part, int64_t N, const char* what) {
  if (part.N != N || part.G != w.size())
    fail("sampled check: the ", what, " partition (N = ", part.N, ", G = ", part.G, ") does not match (", N, ", ",
         w.size(), ")");
}
void check_sample(const Problem& p, const Sample& s) {
  for (const RowId& q : s.rows)
    if (q.b < 0 || q.b >= p.B || q.h < 0 || q.h >= p.H_q || q.i < 0 || q.i >= p.N_q)
      fail("row (b=", q.b, ", h=", q.h, ", i=", q.i, ") must lie in (B, H_q, N_q) = (", p.B, ", ", p.H_q, ", ", p.N_q, ")");
  for (const ColumnId& q : s.columns)
    if (q.b < 0 || q.b >= p.B || q.h < 0 || q.h >= p.H_kv || q.j < 0 || q.j >= p.N_k)
      fail("column (b=", q.b, ", h=", q.h, ", j=", q.j, ") must lie in (B, H_kv, N_k) = (", p.B, ", ", p.H_kv, ", ",
           p.N_k, ")");
}

// The d-wide rows of `which` at ids (d = 1: LSE's values), each from the rank that holds it, on
// every process.
template <class Id, class N>
void rows_of(dist::World& w, int64_t d, const dist::Partition& part, int64_t H, const std::vector<Id>& ids, N n_of,
             const ReadOutput& read, const std::vector<std::pair<dist::Output, std::vector<double>*>>& outs,
             const std::string& what) {
  for (const auto& o : outs) o.second->assign(ids.size() * size_t(d), kNaN);  // every id is held by one rank
  const std::vector<std::vector<char>> all = w.allgather(
      [&](int r) {
        std::vector<char> b;
        std::vector<double> row(static_cast<size_t>(d));
        const int64_t nl = part.local_size(r);
        for (const auto& [t, il] : owned(ids, part, r, n_of))
          for (const auto& o : outs) {
            read(r, o.first, ((ids[t].b * H + ids[t].h) * nl + il) * d, d, row.data());
            put(b, row.data(), d);
          }
        return b;
      },
      what);
  for (int k = 0; k < w.size(); ++k) {
    Take take{all[size_t(k)], k};
    for (const auto& [t, il] : owned(ids, part, k, n_of))
      for (const auto& o : outs) take(o.second->data() + t * size_t(d), d);
    take.done();
  }
}

}  // namespace

void sampled_forward(dist::World& w, const Problem& p, const dist::Partition& qp, const Sample& s,
                     const ReadOutput& read, const AnyView4& dO, SampledOutputs& got, RunRows* run) {
  validate(p);
  check_partition(w, qp, p.N_q, "query");
  check_sample(p, s);
  if (run) validate_q_side(p, "dO", shape_of(dO));
  rows_of(w, p.d, qp, p.H_q, s.rows, row_i, read, {{dist::Output::O, &got.O}}, "the sampled rows of O");
  rows_of(w, 1, qp, p.H_q, s.rows, row_i, read, {{dist::Output::LSE, &got.LSE}}, "the sampled rows of LSE");
  if (!run) return;
  // RunRows: per (b, q-head) of the sampled columns' groups, every rank's LSE_i, D_i and its
  // magnitude for its rows, placed at their global positions.
  const int64_t N_q = p.N_q, d = p.d;
  const Stored4 dOs = stored4(dO);  // widened to fp64 as read
  run->heads = column_heads(p, s.columns);
  const size_t nh = run->heads.size();
  run->LSE.assign(nh * size_t(N_q), kNaN);
  run->D.assign(nh * size_t(N_q), kNaN);
  run->Dmag.assign(nh * size_t(N_q), kNaN);
  for (size_t t = 0; t < nh; ++t) {
    const int64_t b = run->heads[t] / p.H_q, h = run->heads[t] % p.H_q;
    const std::vector<std::vector<char>> all = w.allgather(
        [&](int r) {
          const int64_t nl = qp.local_size(r);
          std::vector<double> L(static_cast<size_t>(nl)), D(static_cast<size_t>(nl)), Dm(static_cast<size_t>(nl));
          std::vector<double> O(static_cast<size_t>(std::min(nl, kBlockRows) * d));
          std::vector<double> dOr(static_cast<size_t>(d));
          const int64_t base = (b * p.H_q + h) * nl;  // (b, h)'s first row in the shard
          const std::vector<int64_t>& pos = qp.positions[size_t(r)];
          read(r, dist::Output::LSE, base, nl, L.data());
          for (int64_t i0 = 0; i0 < nl; i0 += kBlockRows) {
            const int64_t n = std::min(kBlockRows, nl - i0);
            read(r, dist::Output::O, (base + i0) * d, n * d, O.data());
            // One thread: a parallel region per block costs a barrier, which an oversubscribed
            // host (ranks as processes sharing the cores) stretches to milliseconds, thousands
            // of times at 1M tokens; the block's rows are a few hundred thousand multiply-adds.
            for (int64_t il = i0; il < i0 + n; ++il) {
              const int64_t i = pos[size_t(il)];
              for (int64_t k = 0; k < d; ++k) dOr[size_t(k)] = dOs(b, h, i, k);
              row_D(dOr.data(), O.data() + (il - i0) * d, d, &D[size_t(il)], &Dm[size_t(il)]);
            }
          }
          std::vector<char> bytes;
          put(bytes, L.data(), nl);
          put(bytes, D.data(), nl);
          put(bytes, Dm.data(), nl);
          return bytes;
        },
        "LSE and D of (b=" + std::to_string(b) + ", h=" + std::to_string(h) + ")");
    for (int k = 0; k < w.size(); ++k) {
      const int64_t nl = qp.local_size(k);
      Take take{all[size_t(k)], k};
      std::vector<double> v(static_cast<size_t>(nl));
      for (std::vector<double>* dst : {&run->LSE, &run->D, &run->Dmag}) {
        take(v.data(), nl);
        for (int64_t il = 0; il < nl; ++il) (*dst)[t * size_t(N_q) + size_t(qp.positions[size_t(k)][size_t(il)])] = v[size_t(il)];
      }
      take.done();
    }
  }
}

void sampled_backward(dist::World& w, const Problem& p, const dist::Partition& qp, const dist::Partition& kp,
                      const Sample& s, const ReadOutput& read, SampledOutputs& got) {
  validate(p);
  check_partition(w, qp, p.N_q, "query");
  check_partition(w, kp, p.N_k, "key");
  check_sample(p, s);
  rows_of(w, p.d, qp, p.H_q, s.rows, row_i, read, {{dist::Output::dQ, &got.dQ}}, "the sampled rows of dQ");
  rows_of(w, p.d, kp, p.H_kv, s.columns, column_j, read, {{dist::Output::dK, &got.dK}, {dist::Output::dV, &got.dV}},
          "the sampled columns of dK, dV");
}

}  // namespace burstlab::tools
