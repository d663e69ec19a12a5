// tools/impls.cpp — the implementations built into this binary (see impls.hpp).
#include "impls.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "burstlab/dispatch.hpp"
#include "burstlab/error.hpp"
#include "burstlab/env.hpp"
#include "cpu.hpp"
#include "cpu_engine.hpp"
#ifdef BURSTLAB_HAVE_CUDA
#include "cuda.hpp"
#include "cuda_engine.hpp"
#include "cuda_footprint.hpp"
#endif
#include "reference.hpp"

namespace burstlab::tools {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::function<double()> timed(std::function<void()> call) {
  return [call] {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    return ms_since(t0);
  };
}

namespace {

// Host tensors of one run in storage type T. Q, O, dO, dQ (B, H_q, N_q, d) in the inputs' layout;
// K, V, dK, dV (B, H_kv, N_k, d); LSE (B, H_q, N_q).
template <class T>
struct HostState {
  Problem p;
  Tensor4<T> Q, K, V, dO, O, dQ, dK, dV;
  Tensor3<T> LSE;
};

template <class T>
Tensor4<T> poisoned_like(const AnyTensor4& x) {
  Tensor4<T> t = make_tensor4<T>(x.layout(), x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  poison(t);
  return t;
}

// Fwd: void(const Problem&, View4<const T> Q, K, V, View4<T> O, View3<T> LSE)
// Bwd: void(const Problem&, Q, K, V, O, dO, View3<const T> LSE, View4<T> dQ, dK, dV)
template <class T, class Fwd, class Bwd>
Runner host_runner(const Problem& p, const Inputs& in, Fwd fwd, Bwd bwd) {
  auto s = std::make_shared<HostState<T>>();
  s->p = p;
  s->Q = in.Q.as<T>();
  s->K = in.K.as<T>();
  s->V = in.V.as<T>();
  s->dO = in.dO.as<T>();
  s->O = poisoned_like<T>(in.Q);
  s->dQ = poisoned_like<T>(in.Q);
  s->dK = poisoned_like<T>(in.K);
  s->dV = poisoned_like<T>(in.V);
  s->LSE = make_tensor3<T>(p.B, p.H_q, p.N_q);
  poison(s->LSE);
  Runner r;
  r.forward = timed([s, fwd] {
    const HostState<T>& c = *s;
    fwd(c.p, c.Q.view(), c.K.view(), c.V.view(), s->O.view(), s->LSE.view());
  });
  r.backward = timed([s, bwd] {
    const HostState<T>& c = *s;
    bwd(c.p, c.Q.view(), c.K.view(), c.V.view(), c.O.view(), c.dO.view(), c.LSE.view(), s->dQ.view(), s->dK.view(),
        s->dV.view());
  });
  r.fetch_forward = [s](Tensor4<double>& O, Tensor3<double>& LSE) {
    O = to_double(s->O);
    LSE = to_double(s->LSE);
  };
  r.fetch_backward = [s](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
    dQ = to_double(s->dQ);
    dK = to_double(s->dK);
    dV = to_double(s->dV);
  };
  return r;
}

// ---- reference/: naive Eigen, materializes S and P (spec §2, §5)
template <class T>
Runner reference_runner(const Problem& p, const Inputs& in) {
  return host_runner<T>(
      p, in, [](const auto&... a) { reference::forward<T>(a...); },
      [](const auto&... a) { reference::backward<T>(a...); });
}

Impl reference_impl() {
  Impl m;
  m.name = "reference";
  m.about = "naive Eigen attention, materializes S and P (reference/); fp64 is the oracle";
  m.dtypes = {Dtype::F64, Dtype::F32};
  m.suite_dtypes = {Dtype::F32};  // fp64 IS the oracle: comparing it with itself proves nothing
  m.footprint = reference_footprint;
  m.prepare = [](const Problem& p, const Inputs& in, const ImplOptions&) {
    return in.dtype == Dtype::F64 ? reference_runner<double>(p, in) : reference_runner<float>(p, in);
  };
  return m;
}

// ---- cpu/: tiled online softmax, LAO on a CPU (spec §4, §5.3)
template <class T>
Runner cpu_runner(const Problem& p, const Inputs& in, cpu::Tiles t) {
  return host_runner<T>(
      p, in, [t](const auto&... a) { cpu::forward<T>(a..., t); },
      [t](const auto&... a) { cpu::backward<T>(a..., t); });
}

Impl cpu_impl() {
  Impl m;
  m.name = "cpu";
  m.about = "tiled online softmax, FlashAttention-2 style, OpenMP (cpu/); --br/--bc set tiles";
  m.dtypes = {Dtype::F64, Dtype::F32};
  m.suite_dtypes = m.dtypes;
  m.check = [](const Problem&, Dtype, const ImplOptions& o) {
    // Tiles given as 0 mean "default"; negative ones reach validate_tiles and are refused there.
    cpu::Tiles t = cpu_tiles(o);
    if (o.Br < 0) t.Br = o.Br;
    if (o.Bc < 0) t.Bc = o.Bc;
    cpu::validate_tiles(t);
  };
  m.footprint = cpu_footprint;
  m.prepare = [](const Problem& p, const Inputs& in, const ImplOptions& o) {
    return in.dtype == Dtype::F64 ? cpu_runner<double>(p, in, cpu_tiles(o))
                                  : cpu_runner<float>(p, in, cpu_tiles(o));
  };
  m.engines.footprint = cpu_engine_footprint();
  m.engines.f64 = [](const ImplOptions& o) { return cpu::make_engine<double>(cpu_tiles(o)); };
  m.engines.f32 = [](const ImplOptions& o) { return cpu::make_engine<float>(cpu_tiles(o)); };
  return m;
}

// A deliberately wrong implementation (cpu with one element of O and of dK off by 1), in the
// registry only when the environment has BURSTLAB_TEST_BROKEN_IMPL=1: tests/tools uses it to show
// that a failed check prints FAIL and exits 1, and that `bench` refuses to time it.
Impl broken_impl() {
  Impl m = cpu_impl();
  m.name = "broken";
  m.about = "TEST ONLY: cpu with O[0] and dK[0] off by 1";
  m.suite_dtypes = {Dtype::F32};
  m.prepare = [](const Problem& p, const Inputs& in, const ImplOptions& o) {
    Runner r = cpu_impl().prepare(p, in, o);
    r.fetch_forward = [f = r.fetch_forward](Tensor4<double>& O, Tensor3<double>& LSE) {
      f(O, LSE);
      O.data.at(0) += 1.0;
    };
    r.fetch_backward = [f = r.fetch_backward](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
      f(dQ, dK, dV);
      dK.data.at(0) += 1.0;
    };
    return r;
  };
  return m;
}

#ifdef BURSTLAB_HAVE_CUDA
// ---- cuda/: LAO kernels on the GPU. Inputs and outputs live on the device; the
// runner times each pass with a device synchronize around it (host clock).
template <class T>
struct CudaT4 {  // device tensor in the inputs' layout
  cuda::DeviceBuffer<T> buf;
  Layout layout = Layout::BHSD;
  int64_t B = 0, H = 0, N = 0, d = 0;
  View4<T> view() const { return view4(buf.data(), layout, B, H, N, d); }
  View4<const T> cview() const { return as_const(view()); }
};
template <class T>
CudaT4<T> cuda_like(const AnyTensor4& x, bool copy) {
  CudaT4<T> t;
  t.buf = cuda::DeviceBuffer<T>(x.size());
  t.layout = x.layout(); t.B = x.dim(0); t.H = x.dim(1); t.N = x.dim(2); t.d = x.dim(3);
  if (copy) {
    const Tensor4<T> h = x.as<T>();
    t.buf.upload(h.data.data(), h.data.size());
  } else {
    t.buf.poison();
  }
  return t;
}
template <class T>
Tensor4<double> cuda_fetch(const CudaT4<T>& t) {
  std::vector<T> h(t.buf.size());
  t.buf.download(h.data(), h.size());
  Tensor4<double> x = make_tensor4<double>(t.layout, t.B, t.H, t.N, t.d);
  for (size_t i = 0; i < h.size(); ++i) x.data[i] = to_double<T>(h[i]);
  return x;
}

template <class T>
Runner cuda_runner(const Problem& p, const Inputs& in, cuda::Variant fwd, cuda::Variant bwd) {
  using A = acc_t<T>;
  struct State {
    Problem p;
    CudaT4<T> Q, K, V, dO, O, dQ, dK, dV;
    cuda::DeviceBuffer<A> LSE;
    cuda::Options opt, bopt;
  };
  auto s = std::make_shared<State>();
  s->p = p;
  s->Q = cuda_like<T>(in.Q, true);
  s->K = cuda_like<T>(in.K, true);
  s->V = cuda_like<T>(in.V, true);
  s->dO = cuda_like<T>(in.dO, true);
  s->O = cuda_like<T>(in.Q, false);
  s->dQ = cuda_like<T>(in.Q, false);
  s->dK = cuda_like<T>(in.K, false);
  s->dV = cuda_like<T>(in.V, false);
  s->LSE = cuda::DeviceBuffer<A>(size_t(p.B * p.H_q * p.N_q));
  s->LSE.poison();
  s->opt.variant = fwd;
  s->bopt.variant = bwd;
  Runner r;
  r.forward = [s] {
    BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    cuda::forward<T>(s->p, s->Q.cview(), s->K.cview(), s->V.cview(), s->O.view(),
                     view3(s->LSE.data(), s->p.B, s->p.H_q, s->p.N_q), s->opt);
    BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    return ms_since(t0);
  };
  r.backward = [s] {
    BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    cuda::backward<T>(s->p, s->Q.cview(), s->K.cview(), s->V.cview(), s->O.cview(), s->dO.cview(),
                      as_const(view3(s->LSE.data(), s->p.B, s->p.H_q, s->p.N_q)), s->dQ.view(),
                      s->dK.view(), s->dV.view(), s->bopt);
    BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    return ms_since(t0);
  };
  r.fetch_forward = [s](Tensor4<double>& O, Tensor3<double>& LSE) {
    O = cuda_fetch(s->O);
    std::vector<A> h(s->LSE.size());
    s->LSE.download(h.data(), h.size());
    LSE = make_tensor3<double>(s->p.B, s->p.H_q, s->p.N_q);
    for (size_t i = 0; i < h.size(); ++i) LSE.data[i] = static_cast<double>(h[i]);
  };
  r.fetch_backward = [s](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
    dQ = cuda_fetch(s->dQ);
    dK = cuda_fetch(s->dK);
    dV = cuda_fetch(s->dV);
  };
  return r;
}

// fwd, bwd: the variants its forward and backward request (Auto: the table's choice per call).
Impl cuda_impl(const std::string& name, cuda::Variant fwd, cuda::Variant bwd, const std::string& about) {
  Impl m;
  m.name = name;
  m.about = about;
  m.dtypes = {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16};
  m.suite_dtypes = m.dtypes;
  m.check = [](const Problem& p, Dtype, const ImplOptions&) {
    std::string why;
    if (!cuda::gpu_available(&why)) fail("impl cuda needs a CUDA GPU (", why, ")");
    if (p.d > 1024) fail("d (", p.d, ") must be <= 1024 for impl cuda");
  };
  // The host's staging and fetched copies, then the device: the runner's tensors and what the
  // layer allocates for the variants this impl requests.
  m.footprint = [fwd, bwd](const Problem& p, Dtype dtype, const ImplOptions& o, bool backward, int threads) {
    std::vector<MemPart> parts = cuda_host_footprint(p, dtype, o, backward, threads);
    for (const std::vector<MemPart>& more :
         {cuda::call_arguments(p, dtype, backward),
          backward ? cuda::backward_workspace(p, dtype, bwd, false) : cuda::forward_workspace(p, dtype, fwd)})
      parts.insert(parts.end(), more.begin(), more.end());
    return parts;
  };
  m.prepare = [fwd, bwd](const Problem& p, const Inputs& in, const ImplOptions&) {
    return dispatch_dtype(in.dtype, [&](auto t) { return cuda_runner<typename decltype(t)::type>(p, in, fwd, bwd); });
  };
  m.engines.f64 = [fwd](const ImplOptions&) { return cuda::make_engine<double>(fwd); };
  m.engines.f32 = [fwd](const ImplOptions&) { return cuda::make_engine<float>(fwd); };
  m.engines.bf16 = [fwd](const ImplOptions&) { return cuda::make_engine<bf16_t>(fwd); };
  m.engines.f16 = [fwd](const ImplOptions&) { return cuda::make_engine<f16_t>(fwd); };
  m.device_memory = [] {
    size_t free = 0, total = 0;
    int device = 0;
    BURSTLAB_CUDA_CHECK(cudaGetDevice(&device));
    BURSTLAB_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    MemAvailable a;
    a.bytes = static_cast<int64_t>(free);
    a.source = "cudaMemGetInfo: free on device " + std::to_string(device) + " of " + format_bytes(static_cast<int64_t>(total));
    return a;
  };
  m.engines.footprint.what = "cuda engine workspace (" + cuda::to_string(fwd) + ")";
  m.engines.footprint.device = true;
  m.engines.footprint.block_call = [fwd](const Problem& p, int64_t rows, Dtype dtype, const ImplOptions&, int) {
    return cuda::block_call_bytes(p, rows, dtype, fwd, false);
  };
  m.engines.copy = cuda::transport_copy;
  m.engines.poison = cuda::transport_poison;
  return m;
}

// `cuda-vN`: one row of the variant table (cuda/variants.hpp) by name, for the passes it has
// (a pass it lacks runs auto; no backward pass: no backward). In `suite` only when it runs every d.
Impl cuda_variant_impl(const cuda::VariantInfo& v) {
  const auto has = [&v](cuda::Pass p) { return std::find(v.passes.begin(), v.passes.end(), p) != v.passes.end(); };
  const cuda::Variant fwd = has(cuda::Pass::Forward) ? v.id : cuda::Variant::Auto;
  const cuda::Variant bwd = has(cuda::Pass::Backward) ? v.id : cuda::Variant::Auto;
  const std::string name = std::string("cuda-") + v.name;
  Impl m = cuda_impl(name, fwd, bwd, std::string("LAO on the GPU, ") + v.name + " only: " + v.summary);
  m.dtypes = v.dtypes;
  m.suite_dtypes = v.d_values.empty() ? v.dtypes : std::vector<Dtype>{};
  m.has_backward = has(cuda::Pass::Backward);
  m.check = [base = m.check, name, &v, fwd, bwd](const Problem& p, Dtype dt, const ImplOptions& o) {
    base(p, dt, o);
    for (cuda::Pass pass : {cuda::Pass::Forward, cuda::Pass::Backward}) {
      if ((pass == cuda::Pass::Forward ? fwd : bwd) != v.id) continue;
      const cuda::Call c = cuda::whole_call(p, dt, pass, false);  // the runner's views: cudaMalloc'ed, contiguous
      std::string why;
      if (!cuda::supports(v, c, cuda::compute_capability(), &why)) fail("impl ", name, " cannot run this problem: ", why);
    }
  };
  return m;
}
#endif  // BURSTLAB_HAVE_CUDA

}  // namespace

std::vector<Dtype> EngineMakers::dtypes() const {
  std::vector<Dtype> t;
  if (f64) t.push_back(Dtype::F64);
  if (f32) t.push_back(Dtype::F32);
  if (bf16) t.push_back(Dtype::BF16);
  if (f16) t.push_back(Dtype::F16);
  return t;
}

namespace {

std::vector<Impl> build_registry() {
  std::vector<Impl> r;
  r.push_back(reference_impl());
  r.push_back(cpu_impl());
  if (env::flag("BURSTLAB_TEST_BROKEN_IMPL"))
    r.push_back(broken_impl());
#ifdef BURSTLAB_HAVE_CUDA
  std::string order;
  for (const cuda::VariantInfo& v : cuda::variants()) order += (order.empty() ? "" : ", ") + std::string(v.name);
  r.push_back(cuda_impl("cuda", cuda::Variant::Auto, cuda::Variant::Auto,
                        "LAO on the GPU (cuda/): per call the first of " + order +
                            " that supports it (cuda/variants.hpp)"));
  // Every variant by name, so that those auto no longer picks stay exercised.
  for (const cuda::VariantInfo* v : cuda::variants_by_number()) r.push_back(cuda_variant_impl(*v));
#endif
  add_lmhead_impls(r);
  return r;
}

}  // namespace

const std::vector<Impl>& registry() {
  static const std::vector<Impl> r = build_registry();
  return r;
}

std::string registry_names(Operator op) {
  std::string s;
  for (const Impl& m : registry())
    if (m.op == op) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}

std::string to_string(Operator op) { return op == Operator::Attention ? "attention" : "lmhead-ce"; }
Operator parse_operator(const std::string& s) {
  if (s == "attention") return Operator::Attention;
  if (s == "lmhead-ce") return Operator::LmHeadCe;
  fail("op (", s, ") must be attention or lmhead-ce");
}

std::string dtype_list(const std::vector<Dtype>& ts) {
  std::string s;
  for (Dtype t : ts) s += (s.empty() ? "" : ", ") + to_string(t);
  return s;
}

std::vector<std::string> split_commas(const std::string& list, bool keep_empty) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= list.size() && !list.empty();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (keep_empty || comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

std::vector<std::string> split_list(const std::string& list, const char* field, const std::string& known) {
  std::vector<std::string> out = list.empty() ? std::vector<std::string>{""} : split_commas(list, true);
  for (std::string& name : out) {
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name.empty()) fail(field, " (", list, ") has an empty entry; give a comma-separated list of: ", known);
  }
  return out;
}

const Impl* plugin_impl(const std::string& name);  // plugin:PATH.so (impls_plugin.cpp), else nullptr

std::vector<const Impl*> find_impls(const std::string& list, Operator op) {
  std::vector<const Impl*> out;
  const std::string known = registry_names(op);
  for (const std::string& name : split_list(list, "impl", known)) {
    const Impl* found = nullptr;
    for (const Impl& m : registry())
      if (m.name == name && m.op == op) found = &m;
    if (!found && op == Operator::Attention) found = plugin_impl(name);
    if (!found && op == Operator::Attention) fail("impl (", name, ") is not built into this binary; known: ", known);
    if (!found) fail("impl (", name, ") is not an implementation of --op ", to_string(op), "; built here: ", known);
    if (std::find(out.begin(), out.end(), found) == out.end()) out.push_back(found);
  }
  return out;
}

namespace {
void check_dtype(const Impl& impl, Dtype dtype) {
  if (std::find(impl.dtypes.begin(), impl.dtypes.end(), dtype) == impl.dtypes.end())
    fail("impl ", impl.name, " does not run dtype ", to_string(dtype), "; it runs ", dtype_list(impl.dtypes));
}
}  // namespace

void check_impl(const Impl& impl, const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward) {
  check_dtype(impl, dtype);
  if (backward && !impl.has_backward)
    fail("impl ", impl.name, " has no backward pass; use --pass fwd");
  if (impl.check) impl.check(p, dtype, opt);
}

void check_impl(const Impl& impl, const LmHeadProblem& p, Dtype dtype) {
  check_dtype(impl, dtype);
  if (impl.lmhead.check) impl.lmhead.check(p, dtype);
}

}  // namespace burstlab::tools
