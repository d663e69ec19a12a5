// python/src/core.cpp — burstlab._core: the fp64 oracle (reference/), the checker and case files
// (check/), and the cpu layer as the operator's CPU kernel, over NumPy arrays of any strides.
// The Python package (python/burstlab) turns PyTorch tensors and DLPack producers into NumPy
// arrays (no copy on the CPU) and calls these functions; it adds no numerics of its own.
// Every burstlab::Error reaches Python as burstlab.Error, a subclass of ValueError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <omp.h>

#include <algorithm>
#include <random>
#include <set>
#include <type_traits>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "burstlab/problem.hpp"
#include "case.hpp"
#include "cpu.hpp"
#include "impls.hpp"  // tools/: ImplOptions
#include "reference.hpp"
#include "resources.hpp"  // tools/: the command line's memory estimates, one formula for both
#include "rows.hpp"       // reference/: the row-sampled oracle (spec §9.11)

namespace py = pybind11;

namespace burstlab::python {
namespace {

using py_arrays::In4;
using Arr = std::optional<py::array>;

// ---- the problem from the arrays' shapes ----------------------------------------------------
std::string dims_str(const int64_t d[4]) {
  return "(B=" + std::to_string(d[0]) + ", H=" + std::to_string(d[1]) + ", N=" + std::to_string(d[2]) +
         ", d=" + std::to_string(d[3]) + ")";
}

// q (B, H_q, N_q, d), k and v (B, H_kv, N_k, d) in logical order; names the argument that
// disagrees and the axis. validate() then checks H_q % H_kv, the scale and the mask (§1.4).
Problem problem_of(const View4<const double>& q, const View4<const double>& k, const View4<const double>& v,
                   const std::string& mask_json, std::optional<double> scale) {
  for (int a = 0; a < 4; ++a)
    if (k.dim[a] != v.dim[a])
      fail("v ", dims_str(v.dim), " must have the shape of k ", dims_str(k.dim));
  if (k.dim[0] != q.dim[0]) fail("k's B (", k.dim[0], ") must equal q's B (", q.dim[0], ")");
  if (k.dim[3] != q.dim[3]) fail("k's d (", k.dim[3], ") must equal q's d (", q.dim[3], ")");
  Problem p;
  p.B = q.dim[0];
  p.H_q = q.dim[1];
  p.N_q = q.dim[2];
  p.d = q.dim[3];
  p.H_kv = k.dim[1];
  p.N_k = k.dim[2];
  p.scale = scale;
  p.mask = check::parse_mask_json(mask_json, "mask");
  validate(p);
  return p;
}

void same_dims(const char* name, const int64_t* got, const int64_t* want, const char* like, int rank = 4) {
  for (int a = 0; a < rank; ++a)
    if (got[a] != want[a]) {
      std::string g = "(", w = "(";
      for (int b = 0; b < rank; ++b) {
        g += (b ? ", " : "") + std::to_string(got[b]);
        w += (b ? ", " : "") + std::to_string(want[b]);
      }
      fail(name, " has logical shape (B, H, N", rank == 4 ? ", d" : "", ") = ", g, ") but must match ", like, " ", w,
           ")");
    }
}

py::array_t<double> new4(Layout layout, int64_t B, int64_t H, int64_t N, int64_t d) {
  if (layout == Layout::BSHD) return py::array_t<double>({B, N, H, d});
  return py::array_t<double>({B, H, N, d});
}
View4<double> view_of(py::array_t<double>& a, Layout layout, int64_t B, int64_t H, int64_t N, int64_t d) {
  return view4<double>(a.mutable_data(), layout, B, H, N, d);
}

// The problem from the arrays' shapes alone, before any of them is converted (copied).
Problem problem_of_shapes(const py::array& q, const py::array& k, const py::array& v, Layout layout,
                          const std::string& mask_json, std::optional<double> scale) {
  View4<const double> Q, K, V;
  py_arrays::logical_dims(q, layout, "q", Q.dim);
  py_arrays::logical_dims(k, layout, "k", K.dim);
  py_arrays::logical_dims(v, layout, "v", V.dim);
  return problem_of(Q, K, V, mask_json, scale);
}

// ---- memory: refused before allocating, as the command line refuses ----------------------------
// A problem whose estimate exceeds what the machine has would end in std::bad_alloc (or the
// OOM killer) minutes into the run; it is refused up front with what fits instead.
struct NotEnoughMemory : Error {
  using Error::Error;
};

// Threads the oracle's OpenMP regions run on in this process (each holds its own N_q x N_k).
int omp_threads() { return std::max(1, omp_get_max_threads()); }

// A call's peak bytes for problem p, with or without its backward.
using NeedOf = std::function<tools::MemNeed(const Problem& p, bool backward)>;

// Throws NotEnoughMemory ("not enough memory for <step>: <need> needed, <available> available
// (<source>); the largest part: ...; it fits with ...") when need(p, backward) exceeds what is
// available. The advice: the largest N_q = N_k that fits and, for a backward, `forward_only`
// (how the caller drops it, e.g. "without do") when the forward alone fits.
void require_fits(const Problem& p, bool backward, const NeedOf& need, const std::string& forward_only) {
  const tools::MemAvailable avail = tools::memory_available();
  const tools::MemNeed n = need(p, backward);
  if (avail.bytes < 0 || n.bytes <= avail.bytes) return;
  // The suggestion keeps 10% headroom: what is available moves between two calls.
  const int64_t budget = avail.bytes / 10 * 9;
  auto fits = [&](const Problem& x, bool bwd) { return need(x, bwd).bytes <= budget; };
  std::vector<std::string> ways;
  const int64_t c = tools::largest_fitting_length(p.N_q, p.N_k, [&](int64_t nq, int64_t nk) {
    Problem x = p;
    x.N_q = nq;  // the estimate reads the lengths; the mask's arrays keep their size
    x.N_k = nk;
    return fits(x, backward);
  });
  if (c > 0)
    ways.push_back("N_q and N_k up to " + std::to_string(c) + " (B, H, d as they are)");
  if (backward && !forward_only.empty() && fits(p, false))
    ways.push_back(forward_only + " (the forward alone: " + tools::format_bytes(need(p, false).bytes) + ")");
  std::string advice;
  for (size_t i = 0; i < ways.size(); ++i) advice += (i == 0 ? "it fits with " : ", or ") + ways[i];
  if (ways.empty()) advice = "it does not fit even with N_q = N_k = 1: use fewer heads, a smaller batch or d";
  try {
    tools::require_memory(n, avail, [&] { return advice; });
  } catch (const Error& e) {
    throw NotEnoughMemory(e.what());
  }
}

// The bare oracle holds what `burstlab run --impl reference --dtype fp64` holds (its copies of
// the inputs and outputs, reference<fp64>'s N_q x N_k per thread): the same formula.
tools::MemNeed oracle_call_need(const Problem& p, bool backward) {
  return tools::make_need("the fp64 oracle (reference<fp64>)",
                          tools::reference_footprint(p, Dtype::F64, tools::ImplOptions{}, backward, omp_threads()));
}

// check/'s compute_expected: the oracle with its §9 bounds (as `burstlab check` and `run`), over
// `extra` (the fp64 copies the caller holds next to it).
tools::MemNeed expected_need(const Problem& p, bool backward, const std::vector<tools::MemPart>& extra) {
  const tools::MemNeed o = tools::oracle_need(p, backward, omp_threads());
  std::vector<tools::MemPart> parts = extra;
  parts.insert(parts.end(), o.parts.begin(), o.parts.end());
  return tools::make_need(o.step, parts);
}

// ---- oracle: reference<double> on the caller's arrays (spec §2, §5) ------------------------
py::tuple oracle(const py::array& q, const py::array& k, const py::array& v, const Arr& dO,
                 const std::string& mask_json, std::optional<double> scale, const std::string& layout_s) {
  const Layout layout = parse_layout(layout_s);
  const Problem p = problem_of_shapes(q, k, v, layout, mask_json, scale);
  require_fits(p, dO.has_value(), oracle_call_need, "without do");
  const In4 Q = py_arrays::in4(q, layout, "q"), K = py_arrays::in4(k, layout, "k"), V = py_arrays::in4(v, layout, "v");
  std::optional<In4> dO_in;
  if (dO) {
    dO_in = py_arrays::in4(*dO, layout, "do");
    same_dims("do", dO_in->view.dim, Q.view.dim, "q");
  }
  py::array_t<double> O = new4(layout, p.B, p.H_q, p.N_q, p.d);
  py::array_t<double> LSE({p.B, p.H_q, p.N_q});
  View4<double> Ov = view_of(O, layout, p.B, p.H_q, p.N_q, p.d);
  View3<double> Lv = view3<double>(LSE.mutable_data(), p.B, p.H_q, p.N_q);
  if (!dO_in) {
    {
      py::gil_scoped_release unlocked;
      reference::forward<double>(p, Q.view, K.view, V.view, Ov, Lv);
    }
    return py::make_tuple(O, LSE);
  }
  py::array_t<double> dQ = new4(layout, p.B, p.H_q, p.N_q, p.d);
  py::array_t<double> dK = new4(layout, p.B, p.H_kv, p.N_k, p.d);
  py::array_t<double> dV = new4(layout, p.B, p.H_kv, p.N_k, p.d);
  View4<double> dQv = view_of(dQ, layout, p.B, p.H_q, p.N_q, p.d);
  View4<double> dKv = view_of(dK, layout, p.B, p.H_kv, p.N_k, p.d);
  View4<double> dVv = view_of(dV, layout, p.B, p.H_kv, p.N_k, p.d);
  {
    py::gil_scoped_release unlocked;
    reference::forward<double>(p, Q.view, K.view, V.view, Ov, Lv);
    reference::backward<double>(p, Q.view, K.view, V.view, as_const(Ov), dO_in->view, as_const(Lv), dQv, dKv, dVv);
  }
  return py::make_tuple(O, LSE, dQ, dK, dV);
}

// ---- check: check/'s checker on arrays ------------------------------------------------------
check::Conventions conventions(const std::string& lse_empty, const std::string& lse_base) {
  check::Conventions c;
  if (lse_empty == "+inf" || lse_empty == "inf") c.empty_lse_pos_inf = true;
  else if (lse_empty != "-inf") fail("lse_empty (", lse_empty, ") must be \"-inf\" or \"+inf\"");
  if (lse_base == "2") c.lse_log2 = true;
  else if (lse_base != "e") fail("lse_base (", lse_base, ") must be \"e\" or \"2\"");
  return c;
}

// The candidate's arrays, shapes checked against the case's problem, stored in `layout`.
check::Candidate candidate_of(const check::CaseMeta& m, Layout layout, const Arr& out, const Arr& lse, const Arr& dq,
                              const Arr& dk, const Arr& dv, const check::Conventions& conv) {
  const Problem& p = m.p;
  check::Candidate c;
  c.layout = layout;
  int64_t qs[4], ks[4], rs[3];
  expect_q_side(p, qs);
  expect_kv_side(p, ks);
  expect_rows(p, rs);
  auto get4 = [&](const Arr& a, const char* name, const int64_t* want, const char* like, bool* has) {
    if (!a) return Tensor4<double>{};
    const In4 x = py_arrays::in4(*a, layout, name);
    same_dims(name, x.view.dim, want, like);
    *has = true;
    return py_arrays::to_tensor4(x.view, layout);
  };
  c.O = get4(out, "out", qs, "q", &c.has_O);
  c.dQ = get4(dq, "dq", qs, "q", &c.has_dQ);
  c.dK = get4(dk, "dk", ks, "k", &c.has_dK);
  c.dV = get4(dv, "dv", ks, "k", &c.has_dV);
  if (lse) {
    c.LSE = py_arrays::to_tensor3(*lse, "lse");
    const int64_t got[3] = {c.LSE.B, c.LSE.H, c.LSE.N};
    same_dims("lse", got, rs, "(B, H_q, N_q)", 3);
    check::convert_lse(c.LSE, conv);
    c.has_LSE = true;
  }
  return c;
}

// Keeps the tensors the caller passed (the others are not part of the question asked).
void keep_given(check::CheckResult& r, const check::Candidate& c) {
  std::vector<check::TensorCheck> keep;
  for (const check::TensorCheck& t : r.tensors) {
    const std::string& n = t.m.tensor;
    const bool given = (n == "O" && c.has_O) || (n == "LSE" && c.has_LSE) || (n == "dQ" && c.has_dQ) ||
                       (n == "dK" && c.has_dK) || (n == "dV" && c.has_dV);
    if (given) keep.push_back(t);
  }
  r.tensors = keep;
}

check::CheckResult check_arrays(const py::array& q, const py::array& k, const py::array& v, const Arr& dO,
                                const std::string& mask_json, std::optional<double> scale,
                                const std::string& layout_s, const std::string& input_dtype, const Arr& out,
                                const Arr& lse, const Arr& dq, const Arr& dk, const Arr& dv,
                                const std::string& dtype, const std::string& lse_empty, const std::string& lse_base,
                                int max_list, const std::string& name) {
  if (max_list < 0) fail("max_list (", max_list, ") must be >= 0");
  const Layout layout = parse_layout(layout_s);
  const check::Conventions conv = conventions(lse_empty, lse_base);
  const bool backward = dq || dk || dv;
  if (backward && !dO) fail("do is required to check dq, dk or dv (the oracle's backward needs dO)");
  if (!out && !lse && !backward) fail("nothing to check: give out, lse, dq, dk or dv");
  // Held next to the oracle: the fp64 copies of the inputs (cd.in) and of the candidate's tensors.
  auto need = [&](const Problem& x, bool bwd) {
    const int64_t Eq = tools::bytes_mul(tools::bytes_mul(x.B, x.H_q), tools::bytes_mul(x.N_q, x.d));
    const int64_t Ek = tools::bytes_mul(tools::bytes_mul(x.B, x.H_kv), tools::bytes_mul(x.N_k, x.d));
    const int64_t Er = tools::bytes_mul(tools::bytes_mul(x.B, x.H_q), x.N_q);
    int64_t cand = tools::bytes_add(out ? Eq : 0, lse ? Er : 0);
    if (bwd) cand = tools::bytes_add(cand, tools::bytes_add(dq ? Eq : 0, tools::bytes_mul(int64_t(!!dk) + !!dv, Ek)));
    std::vector<tools::MemPart> held = tools::inputs_footprint(x, Dtype::F64);
    held.push_back({"the candidate's tensors in fp64", tools::bytes_mul(8, cand)});
    return expected_need(x, bwd, held);
  };
  require_fits(problem_of_shapes(q, k, v, layout, mask_json, scale), backward, need,
               out || lse ? "without dq, dk, dv" : "");
  const In4 Q = py_arrays::in4(q, layout, "q"), K = py_arrays::in4(k, layout, "k"), V = py_arrays::in4(v, layout, "v");
  check::CaseData cd;
  cd.meta.p = problem_of(Q.view, K.view, V.view, mask_json, scale);
  cd.meta.p.scale = scale_of(cd.meta.p);  // explicit, as in a case file
  cd.meta.layout = layout;
  cd.meta.dtype = parse_dtype(input_dtype);
  cd.meta.backward = backward;
  cd.meta.name = name.empty() ? shape_string(cd.meta.p) + " mask=" + describe(cd.meta.p.mask) : name;
  cd.in.dtype = cd.meta.dtype;
  cd.in.Q = py_arrays::to_tensor4(Q.view, layout);
  cd.in.K = py_arrays::to_tensor4(K.view, layout);
  cd.in.V = py_arrays::to_tensor4(V.view, layout);
  const Problem& p = cd.meta.p;
  if (backward) {
    const In4 D = py_arrays::in4(*dO, layout, "do");
    same_dims("do", D.view.dim, Q.view.dim, "q");
    cd.in.dO = py_arrays::to_tensor4(D.view, layout);
  } else {
    cd.in.dO = make_tensor4<double>(layout, p.B, p.H_q, p.N_q, p.d);
  }
  const check::Candidate c = candidate_of(cd.meta, layout, out, lse, dq, dk, dv, conv);
  const Dtype t = parse_dtype(dtype);
  py::gil_scoped_release unlocked;
  const check::Expected e = check::compute_expected(cd);
  check::CheckResult r = check::check_candidate(cd, e, c, t, max_list);
  keep_given(r, c);
  return r;
}

// ---- the row-sampled oracle (reference/rows.hpp, spec §9.11) on arrays -------------------------
// K query rows (O, LSE, dQ) exactly from the inputs and K key columns' dK, dV given the
// candidate's own O and LSE, as `burstlab run --check-rows K`: O(K N d) work, no N_q x N_k buffer.
// Inputs are global; a candidate may be one rank's shard whose rows are the global positions
// `q_positions` (O, LSE, dQ) or `k_positions` (dK, dV), the same for every (b, h).

// Global positions of a shard's rows: distinct, in [0, N); empty when the tensor is global.
std::vector<int64_t> positions_of(const std::optional<py::array_t<int64_t, py::array::forcecast>>& a, const char* name,
                                  int64_t N, const char* axis) {
  std::vector<int64_t> out;
  if (!a) return out;
  if (a->ndim() != 1) fail(name, " has shape ", py_arrays::shape_str(*a), ": one global position per row expected");
  auto r = a->unchecked<1>();
  std::set<int64_t> seen;
  for (py::ssize_t t = 0; t < r.shape(0); ++t) {
    const int64_t x = r(t);
    if (x < 0 || x >= N) fail(name, "[", t, "] (", x, ") must lie in [0, ", axis, ") = [0, ", N, ")");
    if (!seen.insert(x).second) fail(name, "[", t, "] (", x, ") repeats a position");
    out.push_back(x);
  }
  if (out.empty()) fail(name, " is empty: a shard holds at least one row");
  return out;
}

// n of R flattened (b, h, local row) indices of a shard: the first and the last, floor(n/2)
// evenly spaced, the rest uniformly at random (choose_sample's rule without the mask's
// special rows, which a shard may not hold); sorted, distinct.
std::vector<int64_t> pick_local(int64_t R, int64_t n, uint64_t seed) {
  std::vector<int64_t> out;
  if (n >= R) {
    for (int64_t f = 0; f < R; ++f) out.push_back(f);
    return out;
  }
  std::set<int64_t> s = {0, R - 1};
  const int64_t even = n / 2;
  for (int64_t k = 0; k < even && int64_t(s.size()) < n; ++k)
    s.insert(even == 1 ? 0 : static_cast<int64_t>((static_cast<__int128>(k) * (R - 1)) / (even - 1)));
  std::mt19937_64 rng(seed ^ 0x5AAD5EEDull);
  std::uniform_int_distribution<int64_t> any(0, R - 1);
  while (int64_t(s.size()) < n) s.insert(any(rng));
  while (int64_t(s.size()) > n) s.erase(std::prev(s.end()));  // n == 1: keep the first
  return std::vector<int64_t>(s.begin(), s.end());
}

// The sampled rows (RowId) or columns (ColumnId) and the candidate's own index of each: the CLI's
// sample over the global problem when pos is empty, else n of the shard's B x H x n_local rows
// (pick_local) at their global positions pos.
template <class Id>
void sample_of(const Problem& p, const std::vector<int64_t>& pos, int64_t H, int64_t n_local, int64_t n,
               uint64_t seed, std::vector<Id>* ids, std::vector<int64_t>* local) {
  if (pos.empty()) {
    const Sample s = choose_sample(p, n, seed);
    if constexpr (std::is_same_v<Id, RowId>) {
      *ids = s.rows;
      for (const RowId& x : s.rows) local->push_back(x.i);
    } else {
      *ids = s.columns;
      for (const ColumnId& x : s.columns) local->push_back(x.j);
    }
    return;
  }
  for (int64_t f : pick_local(p.B * H * n_local, n, seed)) {
    const int64_t b = f / (H * n_local), h = (f / n_local) % H, m = f % n_local;
    ids->push_back({b, h, pos[m]});
    local->push_back(m);
  }
}

// A 4-D array read where it lies, in its dtype and strides (reference/rows.hpp's Stored4): the
// sampled check reads K rows and K columns' worth of it, widened to fp64 element by element, so
// neither the inputs nor the candidate's tensors are copied.
Stored4 stored4(const py::array& a, Layout layout, const char* name) {
  Stored4 e;
  e.dtype = py_arrays::dtype_of_array(a, name);
  py_arrays::logical_dims(a, layout, name, e.dim);
  const bool bshd = layout == Layout::BSHD;
  const int64_t st[4] = {a.strides(0), a.strides(bshd ? 2 : 1), a.strides(bshd ? 1 : 2), a.strides(3)};
  for (int k = 0; k < 4; ++k) e.bytes[k] = st[k];
  e.base = static_cast<const char*>(a.data());
  return e;
}

// q, k, v (and do) where they lie, shapes checked against the problem; dtype: the candidate's.
StoredInputs stored_inputs(const py::array& q, const py::array& k, const py::array& v, const Arr& dO, Layout layout,
                           Dtype dtype) {
  StoredInputs in;
  in.dtype = dtype;
  in.Q = stored4(q, layout, "q");
  in.K = stored4(k, layout, "k");
  in.V = stored4(v, layout, "v");
  if (dO) {
    in.dO = stored4(*dO, layout, "do");
    same_dims("do", in.dO.dim, in.Q.dim, "q");
  }
  return in;
}

// One tensor's verdict on sampled elements; `local` maps a sampled (b, h, global n) to the
// candidate's row; coordinates are reported global.
struct SampledTensor {
  check::TensorCheck tc;
  int max_list;
  const char* const* names;
  SampledTensor(const char* tensor, int max_list_, const char* const* names_) : max_list(max_list_), names(names_) {
    tc.m.tensor = tensor;
  }
  // The d elements of sampled row s, (b, h, n_global, :), of an optional 4-D candidate c, read at
  // its own row n, against want and bound (d-wide rows).
  template <class C>
  void add_row(const C& c, int64_t b, int64_t h, int64_t n, int64_t n_global, int64_t d,
               const std::vector<double>& want, const std::vector<double>& bound, size_t s) {
    if (!c) return;
    for (int64_t k = 0; k < d; ++k) {
      const int64_t idx[4] = {b, h, n_global, k};
      add((*c)(b, h, n, k), want[s * d + k], bound[s * d + k], idx, 4);
    }
  }
  void add(double got, double want, double bound, const int64_t* idx, int rank) {
    Metrics one;
    compare_element(one, got, want, bound, idx, rank, names);
    compare_element(tc.m, got, want, bound, idx, rank, names);
    if (one.wrong && int(tc.where.size()) < max_list) {
      tc.mismatches.push_back(one.first_wrong);
      check::Mismatch mm;
      for (int a = 0; a < rank; ++a) mm.index[a] = idx[a];
      mm.rank = rank;
      mm.got = got;
      mm.want = want;
      mm.bound = bound;
      tc.where.push_back(mm);
    }
  }
};

// What the sampled check holds next to the caller's arrays (read in place, never widened
// whole): the sampled oracle (tools/resources.cpp, the estimate of `run --check-rows`) and
// `copy_bytes` of fp64 copies (the candidate's LSE rows).
tools::MemNeed sampled_need(const Problem& x, int64_t K, bool bwd, int64_t copy_bytes) {
  const tools::MemNeed o = tools::sampled_oracle_need(x, K, bwd, omp_threads());
  std::vector<tools::MemPart> parts;
  if (copy_bytes > 0) parts.push_back({"the candidate's LSE in fp64", copy_bytes});
  parts.insert(parts.end(), o.parts.begin(), o.parts.end());
  return tools::make_need(o.step, parts);
}

check::CheckResult check_sampled_arrays(const py::array& q, const py::array& k, const py::array& v, const Arr& dO,
                                        const std::string& mask_json, std::optional<double> scale,
                                        const std::string& layout_s, const Arr& out, const Arr& lse,
                                        const Arr& dq, const Arr& dk, const Arr& dv, const std::string& dtype,
                                        const std::string& lse_empty, const std::string& lse_base, int max_list,
                                        const std::string& name, int64_t K, uint64_t seed,
                                        const std::optional<py::array_t<int64_t, py::array::forcecast>>& q_pos,
                                        const std::optional<py::array_t<int64_t, py::array::forcecast>>& k_pos) {
  if (max_list < 0) fail("max_list (", max_list, ") must be >= 0");
  if (K < 1) fail("check_rows (", K, ") must be >= 1");
  const Layout layout = parse_layout(layout_s);
  const check::Conventions conv = conventions(lse_empty, lse_base);
  const bool rows_bwd = dq.has_value(), cols = dk || dv;
  if ((rows_bwd || cols) && !dO) fail("do is required to check dq, dk or dv (the oracle's backward needs dO)");
  if (!out && !lse && !rows_bwd && !cols) fail("nothing to check: give out, lse, dq, dk or dv");
  if (cols && (!out || !lse))
    fail("dk, dv are checked given the candidate's own O and LSE (spec §9.11): pass out= and lse= too");
  if (cols && q_pos)
    fail("dk, dv are checked against the candidate's O and LSE over all N_q rows: pass out= and lse= gathered "
         "(without q_positions), or check dk, dv in a call of their own");
  const Problem p0 = problem_of_shapes(q, k, v, layout, mask_json, scale);
  const std::vector<int64_t> qp = positions_of(q_pos, "q_positions", p0.N_q, "N_q");
  const std::vector<int64_t> kp = positions_of(k_pos, "k_positions", p0.N_k, "N_k");
  const int64_t nq = qp.empty() ? p0.N_q : int64_t(qp.size()), nk = kp.empty() ? p0.N_k : int64_t(kp.size());
  auto need = [&](const Problem& x, bool bwd) {
    // Every array is read where it lies; copied: the candidate's lse (its nq rows) in fp64.
    const double fq = double(nq) / double(p0.N_q);
    const int64_t Er = int64_t(fq * double(tools::bytes_mul(tools::bytes_mul(x.B, x.H_q), x.N_q)));
    return sampled_need(x, K, bwd, lse ? tools::bytes_mul(8, Er) : 0);
  };
  require_fits(p0, rows_bwd || cols, need, "");
  Problem p = p0;
  p.scale = scale_of(p);
  const Dtype t = parse_dtype(dtype);
  const StoredInputs in = stored_inputs(q, k, v, dO, layout, t);
  // The candidate's tensors, shapes checked: rows nq (q side), nk (kv side).
  const int64_t qs[4] = {p.B, p.H_q, nq, p.d}, ks[4] = {p.B, p.H_kv, nk, p.d}, rs[3] = {p.B, p.H_q, nq};
  const char* q_like = qp.empty() ? "(B, H_q, N_q, d)" : "(B, H_q, len(q_positions), d)";
  const char* k_like = kp.empty() ? "(B, H_kv, N_k, d)" : "(B, H_kv, len(k_positions), d)";
  auto get4 = [&](const Arr& a, const char* n, const int64_t* want, const char* like) -> std::optional<Stored4> {
    if (!a) return std::nullopt;
    Stored4 x = stored4(*a, layout, n);
    same_dims(n, x.dim, want, like);
    return x;
  };
  const std::optional<Stored4> cO = get4(out, "out", qs, q_like), cdQ = get4(dq, "dq", qs, q_like);
  const std::optional<Stored4> cdK = get4(dk, "dk", ks, k_like), cdV = get4(dv, "dv", ks, k_like);
  Tensor3<double> cL;
  if (lse) {
    cL = py_arrays::to_tensor3(*lse, "lse");
    const int64_t got[3] = {cL.B, cL.H, cL.N};
    same_dims("lse", got, rs, qp.empty() ? "(B, H_q, N_q)" : "(B, H_q, len(q_positions))", 3);
    check::convert_lse(cL, conv);
  }

  check::CheckResult r;
  r.dtype = t;
  r.case_name = (name.empty() ? shape_string(p) + " mask=" + describe(p.mask) : name) + " (sampled, K=" +
                std::to_string(K) + ")";
  py::gil_scoped_release unlocked;
  static const char* const bhik[] = {"b", "h", "i", "k"};
  static const char* const bhjk[] = {"b", "h", "j", "k"};
  static const char* const bhi[] = {"b", "h", "i"};
  if (out || lse || dq) {
    // Rows: the CLI's sample over the global problem, or the shard's rows at their positions.
    std::vector<RowId> rows;
    std::vector<int64_t> local;  // the candidate's row of each sampled row
    sample_of(p, qp, p.H_q, nq, K, seed, &rows, &local);
    const RowOracle want = row_oracle(p, in, rows, dq.has_value());
    SampledTensor tO("O", max_list, bhik), tdQ("dQ", max_list, bhik);
    SampledTensor tL("LSE", max_list, bhi);
    for (size_t s = 0; s < rows.size(); ++s) {
      const int64_t b = rows[s].b, h = rows[s].h, n = local[s];
      tO.add_row(cO, b, h, n, rows[s].i, p.d, want.O, want.bound_O, s);
      tdQ.add_row(cdQ, b, h, n, rows[s].i, p.d, want.dQ, want.bound_dQ, s);
      const int64_t idx[3] = {b, h, rows[s].i};
      if (lse) tL.add(cL.data[(b * p.H_q + h) * nq + n], want.LSE[s], want.bound_LSE[s], idx, 3);
    }
    if (out) r.tensors.push_back(tO.tc);
    if (lse) r.tensors.push_back(tL.tc);
    if (dq) r.tensors.push_back(tdQ.tc);
  }
  if (cols) {
    std::vector<ColumnId> columns;
    std::vector<int64_t> local;
    sample_of(p, kp, p.H_kv, nk, K, seed, &columns, &local);
    const View3<const double> Lv = view3<const double>(cL.data.data(), cL.B, cL.H, cL.N);
    const ColumnOracle want = column_oracle(p, in, *cO, Lv, columns);
    SampledTensor tdK("dK", max_list, bhjk), tdV("dV", max_list, bhjk);
    for (size_t s = 0; s < columns.size(); ++s) {
      const int64_t b = columns[s].b, h = columns[s].h, n = local[s];
      tdK.add_row(cdK, b, h, n, columns[s].j, p.d, want.dK, want.bound_dK, s);
      tdV.add_row(cdV, b, h, n, columns[s].j, p.d, want.dV, want.bound_dV, s);
    }
    if (dk) r.tensors.push_back(tdK.tc);
    if (dv) r.tensors.push_back(tdV.tc);
  }
  return r;
}

// The sampled oracle's values themselves: rows (n, 3) = (b, h, i) with O (n, d), LSE (n), dQ (n, d)
// and their §9 bounds for a candidate of `dtype`; with out and lse (the candidate's own, global)
// also columns (n, 3) = (b, h_kv, j) with dK, dV and their conditional bounds.
py::dict sampled_oracle_arrays(const py::array& q, const py::array& k, const py::array& v, const Arr& dO,
                               const std::string& mask_json, std::optional<double> scale, const std::string& layout_s,
                               int64_t K, uint64_t seed, const Arr& out, const Arr& lse, const std::string& dtype,
                               const std::string& lse_empty, const std::string& lse_base) {
  if (K < 1) fail("check_rows (", K, ") must be >= 1");
  const Layout layout = parse_layout(layout_s);
  const check::Conventions conv = conventions(lse_empty, lse_base);
  if (bool(out) != bool(lse)) fail("out and lse go together: the columns' dK, dV are computed given both (§9.11)");
  const bool cols = out.has_value();
  if (cols && !dO) fail("do is required for the columns' dK, dV (given out and lse)");
  const Problem p0 = problem_of_shapes(q, k, v, layout, mask_json, scale);
  auto need = [&](const Problem& x, bool bwd) {
    // Every array is read where it lies; copied: lse in fp64.
    const int64_t Er = tools::bytes_mul(tools::bytes_mul(x.B, x.H_q), x.N_q);
    return sampled_need(x, K, bwd, cols ? tools::bytes_mul(8, Er) : 0);
  };
  require_fits(p0, dO.has_value(), need, "without do");
  Problem p = p0;
  p.scale = scale_of(p);
  const Dtype t = parse_dtype(dtype);
  const StoredInputs in = stored_inputs(q, k, v, dO, layout, t);
  Stored4 cO;
  Tensor3<double> cL;
  if (cols) {
    cO = stored4(*out, layout, "out");
    same_dims("out", cO.dim, in.Q.dim, "q");
    cL = py_arrays::to_tensor3(*lse, "lse");
    int64_t rs[3];
    expect_rows(p, rs);
    const int64_t got[3] = {cL.B, cL.H, cL.N};
    same_dims("lse", got, rs, "(B, H_q, N_q)", 3);
    check::convert_lse(cL, conv);
  }
  Sample s;
  RowOracle ro;
  ColumnOracle co;
  {
    py::gil_scoped_release unlocked;
    s = choose_sample(p, K, seed);
    ro = row_oracle(p, in, s.rows, dO.has_value());
    if (cols) co = column_oracle(p, in, cO, view3<const double>(cL.data.data(), cL.B, cL.H, cL.N), s.columns);
  }
  auto mat = [](const std::vector<double>& x, int64_t n, int64_t d) {
    py::array_t<double> a(std::vector<py::ssize_t>{n, d});
    std::copy(x.begin(), x.end(), a.mutable_data());
    return a;
  };
  auto vec = [](const std::vector<double>& x) {
    py::array_t<double> a(std::vector<py::ssize_t>{py::ssize_t(x.size())});
    std::copy(x.begin(), x.end(), a.mutable_data());
    return a;
  };
  // (n, 3) = (b, h, i of a row or j of a column) per sampled row or column.
  auto ids = [](const auto& xs, auto pos) {
    py::array_t<int64_t> a(std::vector<py::ssize_t>{py::ssize_t(xs.size()), 3});
    for (size_t r = 0; r < xs.size(); ++r) {
      a.mutable_at(r, 0) = xs[r].b;
      a.mutable_at(r, 1) = xs[r].h;
      a.mutable_at(r, 2) = pos(xs[r]);
    }
    return a;
  };
  const int64_t n = int64_t(s.rows.size());
  py::dict res;
  res["rows"] = ids(s.rows, [](const RowId& x) { return x.i; });
  res["O"] = mat(ro.O, n, p.d);
  res["LSE"] = vec(ro.LSE);
  res["bound_O"] = mat(ro.bound_O, n, p.d);
  res["bound_LSE"] = vec(ro.bound_LSE);
  if (dO) {
    res["dQ"] = mat(ro.dQ, n, p.d);
    res["bound_dQ"] = mat(ro.bound_dQ, n, p.d);
  }
  if (cols) {
    const int64_t m = int64_t(s.columns.size());
    res["columns"] = ids(s.columns, [](const ColumnId& x) { return x.j; });
    res["dK"] = mat(co.dK, m, p.d);
    res["dV"] = mat(co.dV, m, p.d);
    res["bound_dK"] = mat(co.bound_dK, m, p.d);
    res["bound_dV"] = mat(co.bound_dV, m, p.d);
  }
  return res;
}

// A case (check/case.hpp) with its expected outputs once known.
struct PyCase {
  check::CaseData data;
  std::optional<check::Expected> expected;
};

const check::Expected& expected_of(PyCase& c) {
  if (!c.expected) {
    require_fits(c.data.meta.p, c.data.meta.backward,
                 [](const Problem& x, bool bwd) { return expected_need(x, bwd, {}); }, "");
    py::gil_scoped_release unlocked;
    c.expected = check::compute_expected(c.data);
  }
  return *c.expected;
}

check::CheckResult check_case(PyCase& cs, const Arr& out, const Arr& lse, const Arr& dq, const Arr& dk, const Arr& dv,
                              const std::string& dtype, const std::string& lse_empty, const std::string& lse_base,
                              const std::string& layout_s, int max_list) {
  if (max_list < 0) fail("max_list (", max_list, ") must be >= 0");
  const check::Conventions conv = conventions(lse_empty, lse_base);
  const Layout layout = layout_s.empty() ? cs.data.meta.layout : parse_layout(layout_s);
  if ((dq || dk || dv) && !cs.data.meta.backward) fail("case ", cs.data.meta.name, " has no backward (no dO): no dq, dk, dv to check");
  const check::Candidate c = candidate_of(cs.data.meta, layout, out, lse, dq, dk, dv, conv);
  if (!c.has_O && !c.has_LSE && !c.has_dQ && !c.has_dK && !c.has_dV) fail("nothing to check: give out, lse, dq, dk or dv");
  Dtype t = cs.data.meta.dtype;
  if (!dtype.empty()) t = parse_dtype(dtype);
  const check::Expected& e = expected_of(cs);
  py::gil_scoped_release unlocked;
  check::CheckResult r = check::check_candidate(cs.data, e, c, t, max_list);
  keep_given(r, c);
  return r;
}

// A tensor of a case as a NumPy view (fp64, in the case's layout) that keeps the case alive.
py::array view4_of(const Tensor4<double>& t, py::handle owner) {
  std::vector<py::ssize_t> shape = t.layout == Layout::BSHD ? std::vector<py::ssize_t>{t.B, t.N, t.H, t.d}
                                                             : std::vector<py::ssize_t>{t.B, t.H, t.N, t.d};
  return py::array_t<double>(shape, t.data.data(), owner);
}
// An input of a case in fp64: a view when it is held in fp64, else a widened copy of its own
// (generated inputs are held in their dtype's storage type; NumPy has no bf16).
py::array view4_of(const AnyTensor4& a, py::handle owner) {
  if (const auto* t = std::get_if<Tensor4<double>>(&a.t)) return view4_of(*t, owner);
  const Tensor4<double> t = a.as<double>();
  std::vector<py::ssize_t> shape = t.layout == Layout::BSHD ? std::vector<py::ssize_t>{t.B, t.N, t.H, t.d}
                                                             : std::vector<py::ssize_t>{t.B, t.H, t.N, t.d};
  return py::array_t<double>(shape, t.data.data());  // copies
}
py::array view3_of(const Tensor3<double>& t, py::handle owner) {
  return py::array_t<double>(std::vector<py::ssize_t>{t.B, t.H, t.N}, t.data.data(), owner);
}

// ---- the operator's CPU kernel: cpu/ (fp32, fp64) into caller-owned memory ------------------
template <class T>
void cpu_forward_t(const py::array& q, const py::array& k, const py::array& v, const py::array& o,
                   const py::array& lse, const Problem& p, Layout layout) {
  const View4<const T> Q = as_const(py_arrays::out4<T>(q, layout, "q"));
  const View4<const T> K = as_const(py_arrays::out4<T>(k, layout, "k"));
  const View4<const T> V = as_const(py_arrays::out4<T>(v, layout, "v"));
  const View4<T> O = py_arrays::out4<T>(o, layout, "out");
  const View3<T> L = py_arrays::out3<T>(lse, "lse");
  py::gil_scoped_release unlocked;
  cpu::forward<T>(p, Q, K, V, O, L);
}
template <class T>
void cpu_backward_t(const py::array& q, const py::array& k, const py::array& v, const py::array& o,
                    const py::array& dO, const py::array& lse, const py::array& dq, const py::array& dk,
                    const py::array& dv, const Problem& p, Layout layout) {
  const View4<const T> Q = as_const(py_arrays::out4<T>(q, layout, "q"));
  const View4<const T> K = as_const(py_arrays::out4<T>(k, layout, "k"));
  const View4<const T> V = as_const(py_arrays::out4<T>(v, layout, "v"));
  const View4<const T> O = as_const(py_arrays::out4<T>(o, layout, "out"));
  const View4<const T> D = as_const(py_arrays::out4<T>(dO, layout, "do"));
  const View3<const T> L = as_const(py_arrays::out3<T>(lse, "lse"));
  const View4<T> dQ = py_arrays::out4<T>(dq, layout, "dq");
  const View4<T> dK = py_arrays::out4<T>(dk, layout, "dk");
  const View4<T> dV = py_arrays::out4<T>(dv, layout, "dv");
  py::gil_scoped_release unlocked;
  cpu::backward<T>(p, Q, K, V, O, D, L, dQ, dK, dV);
}

// The problem of the operator's call: shapes from q and k (arrays of T, any strides).
Problem op_problem(const py::array& q, const py::array& k, Layout layout, const std::string& mask_json,
                   std::optional<double> scale) {
  int64_t qd[4], kd[4];
  py_arrays::logical_dims(q, layout, "q", qd);
  py_arrays::logical_dims(k, layout, "k", kd);
  View4<const double> Q, K;
  for (int a = 0; a < 4; ++a) { Q.dim[a] = qd[a]; K.dim[a] = kd[a]; }
  return problem_of(Q, K, K, mask_json, scale);
}
Dtype op_dtype(const py::array& q) {
  const Dtype t = py_arrays::dtype_of_array(q, "q");
  if (t != Dtype::F32 && t != Dtype::F64)
    fail("q has dtype ", to_string(t), ": the cpu layer runs fp32 and fp64 (bf16/fp16 run on CUDA tensors)");
  return t;
}

}  // namespace
}  // namespace burstlab::python

PYBIND11_MODULE(_core, m) {
  using namespace burstlab;
  using namespace burstlab::python;
  m.doc() = "burstlab's C++ layers for Python: the fp64 oracle, the checker, case files, the cpu layer";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);
  // Both ValueError (bad input, as the command line's exit 2) and MemoryError (what `except
  // MemoryError` expects). Module-local: local translators run before the global ones, among
  // which _cuda's catches every burstlab::Error.
  py::register_local_exception<NotEnoughMemory>(m, "NotEnoughMemory",
                                                py::make_tuple(m.attr("Error"), py::handle(PyExc_MemoryError)));

  m.def("oracle", &oracle, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("do_"), py::arg("mask"),
        py::arg("scale"), py::arg("layout"),
        "reference<double> (the oracle): (O, LSE) or (O, LSE, dQ, dK, dV), fp64, in the inputs' layout");
  m.def("parse_mask", [](const std::string& text) { return check::mask_json(check::parse_mask_json(text, "mask")); },
        "the mask JSON object parsed strictly and written back (burstlab.Error names a bad field)");
  m.def("describe_mask", [](const std::string& text) { return describe(check::parse_mask_json(text, "mask")); });
  m.def("make_mask", [](const std::string& spec, int64_t N_q, int64_t N_k, uint64_t seed) {
    return check::mask_json(make_mask(spec, N_q, N_k, seed));
  }, py::arg("spec"), py::arg("N_q"), py::arg("N_k"), py::arg("seed"));

  m.def("mask_dense", [](const std::string& text, int64_t N_q, int64_t N_k) {
    Problem p;
    p.N_q = N_q;
    p.N_k = N_k;
    p.mask = check::parse_mask_json(text, "mask");
    validate(p);
    const MaskData md = compile_mask(p);
    const MaskParams mp = md.params();
    py::array_t<bool> out({N_q, N_k});
    auto w = out.mutable_unchecked<2>();
    for (int64_t i = 0; i < N_q; ++i)
      for (int64_t j = 0; j < N_k; ++j) w(i, j) = visible(mp, i, j);
    return out;
  }, py::arg("mask"), py::arg("N_q"), py::arg("N_k"), "(N_q, N_k) bool: visible(i, j) of spec eq. 3.5");

  py::class_<check::Mismatch>(m, "Mismatch")
      .def_property_readonly("index", [](const check::Mismatch& x) {
        py::tuple t(x.rank);
        for (int a = 0; a < x.rank; ++a) t[a] = x.index[a];
        return t;
      }, "(b, h, i, k) for O and dQ; (b, h, j, k) for dK and dV; (b, h, i) for LSE")
      .def_readonly("got", &check::Mismatch::got)
      .def_readonly("want", &check::Mismatch::want)
      .def_readonly("bound", &check::Mismatch::bound)
      .def("__repr__", [](const check::Mismatch& x) {
        std::string s = "Mismatch(index=(";
        for (int a = 0; a < x.rank; ++a) s += (a ? ", " : "") + std::to_string(x.index[a]);
        return s + "), got=" + std::string(py::repr(py::float_(x.got))) + ", want=" +
               std::string(py::repr(py::float_(x.want))) + ", bound=" + std::string(py::repr(py::float_(x.bound))) + ")";
      });
  py::class_<check::TensorCheck>(m, "TensorCheck", "One tensor's verdict (spec §9.3)")
      .def_property_readonly("name", [](const check::TensorCheck& t) { return t.m.tensor; })
      .def_property_readonly("max_abs", [](const check::TensorCheck& t) { return t.m.max_abs; })
      .def_property_readonly("max_rel", [](const check::TensorCheck& t) { return t.m.max_rel; })
      .def_property_readonly("err_bound", [](const check::TensorCheck& t) { return t.m.err_bound; },
                             "max over elements of |got - want| / bound")
      .def_property_readonly("wrong", [](const check::TensorCheck& t) { return t.m.wrong; }, "#wrong")
      .def_property_readonly("checked", [](const check::TensorCheck& t) { return t.m.checked; })
      .def_readonly("missing", &check::TensorCheck::missing)
      .def_property_readonly("passed", &check::TensorCheck::pass)
      .def_readonly("mismatches", &check::TensorCheck::where, "the first mismatches (max_list of them)")
      .def_readonly("mismatch_lines", &check::TensorCheck::mismatches)
      .def("__repr__", [](const check::TensorCheck& t) {
        return "<TensorCheck " + t.m.tensor + (t.pass() ? " PASS" : " FAIL") + " err/bound=" +
               std::string(py::repr(py::float_(t.m.err_bound))) + " #wrong=" + std::to_string(t.m.wrong) + ">";
      });
  py::class_<check::CheckResult>(m, "CheckResult",
                                 "The checker's verdict: per tensor max_abs, max_rel, err/bound, #wrong, mismatches")
      .def_readonly("case_name", &check::CheckResult::case_name)
      .def_property_readonly("dtype", [](const check::CheckResult& r) { return to_string(r.dtype); },
                             "the precision whose §9 bound was applied")
      .def_readonly("tensors", &check::CheckResult::tensors)
      .def_property_readonly("passed", &check::CheckResult::pass)
      .def_property_readonly("worst_err_bound", &check::CheckResult::worst_err_bound)
      .def("__bool__", &check::CheckResult::pass)
      .def("__str__", &check::format_check)
      .def("__repr__", [](const check::CheckResult& r) {
        return std::string("<CheckResult ") + (r.pass() ? "PASS" : "FAIL") + " " + r.case_name + ">";
      })
      .def("json", &check::check_json, "one JSON object, as `burstlab check --json` prints")
      .def("__getitem__", [](const check::CheckResult& r, const std::string& name) {
        for (const check::TensorCheck& t : r.tensors)
          if (t.m.tensor == name) return t;
        throw py::key_error("no tensor '" + name + "' in this result");
      });

  m.def("check", &check_arrays, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("do_"), py::arg("mask"),
        py::arg("scale"), py::arg("layout"), py::arg("input_dtype"), py::arg("out"), py::arg("lse"), py::arg("dq"),
        py::arg("dk"), py::arg("dv"), py::arg("dtype"), py::arg("lse_empty"), py::arg("lse_base"),
        py::arg("max_list"), py::arg("name"));

  m.def("check_sampled", &check_sampled_arrays, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("do_"),
        py::arg("mask"), py::arg("scale"), py::arg("layout"), py::arg("out"), py::arg("lse"), py::arg("dq"),
        py::arg("dk"), py::arg("dv"), py::arg("dtype"), py::arg("lse_empty"), py::arg("lse_base"),
        py::arg("max_list"), py::arg("name"), py::arg("check_rows"), py::arg("seed"), py::arg("q_positions"),
        py::arg("k_positions"));
  m.def("sampled_oracle", &sampled_oracle_arrays, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("do_"),
        py::arg("mask"), py::arg("scale"), py::arg("layout"), py::arg("check_rows"), py::arg("seed"),
        py::arg("out"), py::arg("lse"), py::arg("dtype"), py::arg("lse_empty"), py::arg("lse_base"));

  py::class_<PyCase>(m, "CaseData")
      .def_property_readonly("json", [](const PyCase& c) { return check::case_json(c.data.meta); })
      .def_property_readonly("name", [](const PyCase& c) { return c.data.meta.name; })
      .def_property_readonly("q", [](py::object self) { return view4_of(self.cast<PyCase&>().data.in.Q, self); })
      .def_property_readonly("k", [](py::object self) { return view4_of(self.cast<PyCase&>().data.in.K, self); })
      .def_property_readonly("v", [](py::object self) { return view4_of(self.cast<PyCase&>().data.in.V, self); })
      .def_property_readonly("do", [](py::object self) -> py::object {
        PyCase& c = self.cast<PyCase&>();
        if (!c.data.meta.backward) return py::none();
        return view4_of(c.data.in.dO, self);
      })
      .def_property_readonly("has_expected", [](const PyCase& c) { return c.expected.has_value(); })
      .def("expected", [](py::object self) -> py::tuple {
        PyCase& c = self.cast<PyCase&>();
        const check::Expected& e = expected_of(c);
        if (!c.data.meta.backward) return py::make_tuple(view4_of(e.O, self), view3_of(e.LSE, self));
        return py::make_tuple(view4_of(e.O, self), view3_of(e.LSE, self), view4_of(e.dQ, self),
                              view4_of(e.dK, self), view4_of(e.dV, self));
      }, "the fp64 oracle's (O, LSE[, dQ, dK, dV]), computed once")
      .def("check", &check_case, py::arg("out"), py::arg("lse"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
           py::arg("dtype"), py::arg("lse_empty"), py::arg("lse_base"), py::arg("layout"), py::arg("max_list"));

  m.def("read_case", [](const std::string& dir) {
    PyCase c;
    c.data = check::read_case(dir);
    if (check::has_expected(dir)) c.expected = check::read_expected(dir, c.data.meta);
    return c;
  }, py::arg("dir"), "a case directory (case.json, q k v dO .npy, and expected/ when present)");
  m.def("write_case", [](PyCase& c, const std::string& dir, bool expected) {
    check::write_case(dir, c.data);
    if (expected) check::write_expected(dir, c.data, expected_of(c));
  }, py::arg("case"), py::arg("dir"), py::arg("expected"));
  m.def("suite", [](bool quick, const std::string& dtype) {
    std::vector<PyCase> out;
    for (const check::CaseMeta& meta : check::suite(quick, parse_dtype(dtype))) {
      PyCase c;
      c.data = check::make_case(meta);
      out.push_back(std::move(c));
    }
    return out;
  }, py::arg("quick"), py::arg("dtype"), "the curated conformance suite (as `burstlab gen`)");

  m.def("cpu_forward", [](const py::array& q, const py::array& k, const py::array& v, const py::array& o,
                          const py::array& lse, const std::string& mask_json, std::optional<double> scale,
                          const std::string& layout_s) {
    const Layout layout = parse_layout(layout_s);
    const Problem p = op_problem(q, k, layout, mask_json, scale);
    if (op_dtype(q) == Dtype::F64) cpu_forward_t<double>(q, k, v, o, lse, p, layout);
    else cpu_forward_t<float>(q, k, v, o, lse, p, layout);
  });
  m.def("cpu_backward", [](const py::array& q, const py::array& k, const py::array& v, const py::array& o,
                           const py::array& dO, const py::array& lse, const py::array& dq, const py::array& dk,
                           const py::array& dv, const std::string& mask_json, std::optional<double> scale,
                           const std::string& layout_s) {
    const Layout layout = parse_layout(layout_s);
    const Problem p = op_problem(q, k, layout, mask_json, scale);
    if (op_dtype(q) == Dtype::F64) cpu_backward_t<double>(q, k, v, o, dO, lse, dq, dk, dv, p, layout);
    else cpu_backward_t<float>(q, k, v, o, dO, lse, dq, dk, dv, p, layout);
  });
}
