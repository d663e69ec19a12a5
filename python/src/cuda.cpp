// python/src/cuda.cpp — burstlab._cuda: the cuda layer's whole-problem forward and backward
// (cuda/cuda.hpp, spec §4-§5) on device memory that the caller owns (PyTorch's), on the caller's
// stream. No PyTorch headers: burstlab/cuda.py registers the operator with torch.library and
// passes each tensor as (data pointer, logical dims (B, H, N, d), element strides).
// A separate module from _core so that `import burstlab` never needs the CUDA runtime.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "burstlab/dispatch.hpp"
#include "burstlab/problem.hpp"
#include "case.hpp"
#include "cuda.hpp"

namespace py = pybind11;

namespace burstlab::python {
namespace {

// (data pointer, logical dims, element strides) of one device tensor.
template <int N>
using Dev = std::tuple<uintptr_t, std::array<int64_t, N>, std::array<int64_t, N>>;
using Dev4 = Dev<4>;
using Dev3 = Dev<3>;

template <class View, int N>
View view_from(const Dev<N>& t) {
  View v;
  v.data = reinterpret_cast<decltype(v.data)>(std::get<0>(t));
  for (int a = 0; a < N; ++a) {
    v.dim[a] = std::get<1>(t)[a];
    v.stride[a] = std::get<2>(t)[a];
    if (v.stride[a] < 0) fail("stride[", a, "] (", v.stride[a], ") of a tensor must be >= 0");
  }
  return v;
}
template <class T>
View4<T> view_of(const Dev4& t) {
  return view_from<View4<T>, 4>(t);
}
template <class T>
View3<T> view_of(const Dev3& t) {
  return view_from<View3<T>, 3>(t);
}

Problem problem_of(const Dev4& q, const Dev4& k, const std::string& mask_json, std::optional<double> scale) {
  const auto& qd = std::get<1>(q);
  const auto& kd = std::get<1>(k);
  if (kd[0] != qd[0]) fail("k's B (", kd[0], ") must equal q's B (", qd[0], ")");
  if (kd[3] != qd[3]) fail("k's d (", kd[3], ") must equal q's d (", qd[3], ")");
  Problem p;
  p.B = qd[0]; p.H_q = qd[1]; p.N_q = qd[2]; p.d = qd[3];
  p.H_kv = kd[1]; p.N_k = kd[2];
  p.scale = scale;
  p.mask = check::parse_mask_json(mask_json, "mask");
  validate(p);
  return p;
}

// A variant without the pass (v5, v6, v14: backward only) leaves that pass to auto, as `burstlab run
// --impl cuda-vN` does.
cuda::Options options_of(uintptr_t stream, const std::string& variant, cuda::Pass pass, bool deterministic = false) {
  cuda::Options o;
  o.variant = cuda::parse_variant(variant);
  if (o.variant != cuda::Variant::Auto) {
    const auto& passes = cuda::variant_info(o.variant).passes;
    if (std::find(passes.begin(), passes.end(), pass) == passes.end()) o.variant = cuda::Variant::Auto;
  }
  o.deterministic = deterministic;
  o.stream = reinterpret_cast<cudaStream_t>(stream);
  return o;
}

template <class T>
void forward_t(const Problem& p, const Dev4& q, const Dev4& k, const Dev4& v, const Dev4& o, const Dev3& lse,
               const cuda::Options& opt) {
  cuda::forward<T>(p, as_const(view_of<T>(q)), as_const(view_of<T>(k)), as_const(view_of<T>(v)), view_of<T>(o),
                   view_of<acc_t<T>>(lse), opt);
}
template <class T>
void backward_t(const Problem& p, const Dev4& q, const Dev4& k, const Dev4& v, const Dev4& o, const Dev4& dO,
                const Dev3& lse, const Dev4& dq, const Dev4& dk, const Dev4& dv, const cuda::Options& opt) {
  cuda::backward<T>(p, as_const(view_of<T>(q)), as_const(view_of<T>(k)), as_const(view_of<T>(v)),
                    as_const(view_of<T>(o)), as_const(view_of<T>(dO)), as_const(view_of<acc_t<T>>(lse)),
                    view_of<T>(dq), view_of<T>(dk), view_of<T>(dv), opt);
}

}  // namespace
}  // namespace burstlab::python

PYBIND11_MODULE(_cuda, m) {
  using namespace burstlab;
  using namespace burstlab::python;
  m.doc() = "burstlab's cuda layer on caller-owned device memory (the operator behind burstlab.cuda)";
  // Errors of the contract arrive as burstlab.Error (a ValueError), as from _core.
  // Held for the life of the process (a static py::object would be released after finalization).
  static PyObject* error = py::object(py::module_::import("burstlab._core").attr("Error")).release().ptr();
  py::register_exception_translator([](std::exception_ptr ep) {
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const Error& e) {
      PyErr_SetString(error, e.what());
    } catch (const cuda::CudaError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("gpu_available", [] {
    std::string why;
    const bool ok = cuda::gpu_available(&why);
    return py::make_tuple(ok, why);
  }, "(True, '') when a CUDA device can be used, else (False, why)");
  m.def("device_description", &cuda::device_description, py::arg("device") = 0);
  m.def("forward", [](const std::string& dtype, const Dev4& q, const Dev4& k, const Dev4& v, const Dev4& o,
                      const Dev3& lse, const std::string& mask_json, std::optional<double> scale, uintptr_t stream,
                      const std::string& variant) {
    const Problem p = problem_of(q, k, mask_json, scale);
    const Dtype t = parse_dtype(dtype);  // as burstlab.cuda names them (torch.float64 ... torch.float16)
    const cuda::Options opt = options_of(stream, variant, cuda::Pass::Forward);
    py::gil_scoped_release unlocked;
    dispatch_dtype(t, [&](auto tag) { forward_t<typename decltype(tag)::type>(p, q, k, v, o, lse, opt); });
  }, "O (B, H_q, N_q, d), LSE (B, H_q, N_q) <- Q, K, V (eq. 4.1-4.4), asynchronous on `stream`");
  m.def("backward", [](const std::string& dtype, const Dev4& q, const Dev4& k, const Dev4& v, const Dev4& o,
                       const Dev4& dO, const Dev3& lse, const Dev4& dq, const Dev4& dk, const Dev4& dv,
                       const std::string& mask_json, std::optional<double> scale, uintptr_t stream,
                       const std::string& variant, bool deterministic) {
    const Problem p = problem_of(q, k, mask_json, scale);
    const Dtype t = parse_dtype(dtype);
    const cuda::Options opt = options_of(stream, variant, cuda::Pass::Backward, deterministic);
    py::gil_scoped_release unlocked;
    dispatch_dtype(t, [&](auto tag) { backward_t<typename decltype(tag)::type>(p, q, k, v, o, dO, lse, dq, dk, dv, opt); });
  }, "dQ, dK, dV <- Q, K, V, O, dO, LSE (eq. 5.1-5.7; O, LSE from this layer's forward), on `stream`;\n"
     "deterministic: bitwise repeatable (v4 then runs two passes)");
}
