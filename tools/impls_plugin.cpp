// tools/impls_plugin.cpp — `--impl plugin:PATH.so`: an engine plug-in (include/burstlab/plugin.h,
// plugin/) as an implementation. Alone it runs the whole problem as one forward and one backward
// block through its engine; its engine makers let `run --algo` run it under every schedule, on
// SimComm, and on NCCL when its memory is device memory. Loaded once per path per process.
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "burstlab/dispatch.hpp"
#include "burstlab/error.hpp"
#include "impls.hpp"
#include "plugin_engine.hpp"

namespace burstlab::tools {

const Impl* plugin_impl(const std::string& name);  // find_impls' hook (impls.cpp)

namespace {

constexpr const char* kPrefix = "plugin:";

// Inputs and outputs in the plug-in's memory, in the inputs' layout; LSE (B, H_q, N_q) and the
// gradients in A.
template <class T>
Runner plugin_runner(const std::shared_ptr<const plugin::Library>& lib, const Problem& p, const Inputs& in) {
  using A = acc_t<T>;
  struct S {
    Problem p;
    Layout layout = Layout::BHSD;
    std::unique_ptr<Engine<T>> e;
    PreparedMask mask;
    Buffer<T> Q, K, V, dO, O;
    Buffer<A> LSE, D, dQ, dK, dV;
    View4<T> q_side(T* x) const { return view4(x, layout, p.B, p.H_q, p.N_q, p.d); }
    View4<T> kv_side(T* x) const { return view4(x, layout, p.B, p.H_kv, p.N_k, p.d); }
    View4<A> q_grad(A* x) const { return view4(x, layout, p.B, p.H_q, p.N_q, p.d); }
    View4<A> kv_grad(A* x) const { return view4(x, layout, p.B, p.H_kv, p.N_k, p.d); }
    View3<A> rows(A* x) const { return view3(x, p.B, p.H_q, p.N_q); }
  };
  auto s = std::make_shared<S>();
  s->p = p;
  s->layout = in.Q.layout();
  s->e = plugin::make_engine<T>(lib);
  Engine<T>& e = *s->e;
  s->mask = e.prepare(compile_mask(p));
  const auto put = [&e](Buffer<T>& b, const AnyTensor4& x) {
    const std::vector<T> h = x.as<T>().data;  // rounded to T, the inputs' layout
    b = alloc<T>(e, static_cast<int64_t>(h.size()));
    upload(e, b.data, h.data(), b.n);
  };
  put(s->Q, in.Q);
  put(s->K, in.K);
  put(s->V, in.V);
  put(s->dO, in.dO);
  const int64_t nq = static_cast<int64_t>(in.Q.size()), nk = static_cast<int64_t>(in.K.size());
  const int64_t rows = p.B * p.H_q * p.N_q;
  s->O = alloc<T>(e, nq);
  s->LSE = alloc<A>(e, rows);
  s->D = alloc<A>(e, rows);
  s->dQ = alloc<A>(e, nq);
  s->dK = alloc<A>(e, nk);
  s->dV = alloc<A>(e, nk);
  // Outputs poisoned (spec §9.3): an element the plug-in never writes fails the check.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto* b : {&s->dQ, &s->dK, &s->dV, &s->LSE}) fill(e, b->data, b->n, nan);
  fill(e, s->O.data, s->O.n, nan);
  e.synchronize();

  Runner r;
  r.forward = timed([s] {
    S& c = *s;
    c.e->forward_block(c.p, c.mask, contiguous(0, c.p.N_q), contiguous(0, c.p.N_k), as_const(c.q_side(c.Q.data)),
                       as_const(c.kv_side(c.K.data)), as_const(c.kv_side(c.V.data)), c.q_side(c.O.data),
                       c.rows(c.LSE.data), false);
    c.e->synchronize();
  });
  r.backward = timed([s] {
    S& c = *s;
    Engine<T>& en = *c.e;
    en.compute_D(as_const(c.q_side(c.O.data)), as_const(c.q_side(c.dO.data)), c.rows(c.D.data));
    for (auto* b : {&c.dQ, &c.dK, &c.dV}) fill(en, b->data, b->n, 0.0);  // backward_block accumulates
    en.backward_block(c.p, c.mask, contiguous(0, c.p.N_q), contiguous(0, c.p.N_k), as_const(c.q_side(c.Q.data)),
                      as_const(c.kv_side(c.K.data)), as_const(c.kv_side(c.V.data)), as_const(c.q_side(c.dO.data)),
                      as_const(c.rows(c.LSE.data)), as_const(c.rows(c.D.data)), c.q_grad(c.dQ.data),
                      c.kv_grad(c.dK.data), c.kv_grad(c.dV.data));
    en.synchronize();
  });
  // Downloaded as stored, widened to double (exact) in the same layout.
  const auto fetch4 = [s](const auto& b, int64_t H, int64_t N) {
    using U = std::remove_reference_t<decltype(*b.data)>;
    std::vector<U> h(static_cast<size_t>(b.n));
    download(*s->e, h.data(), b.data, b.n);
    Tensor4<double> x = make_tensor4<double>(s->layout, s->p.B, H, N, s->p.d);
    for (size_t i = 0; i < h.size(); ++i) x.data[i] = to_double(h[i]);
    return x;
  };
  r.fetch_forward = [s, fetch4](Tensor4<double>& O, Tensor3<double>& LSE) {
    O = fetch4(s->O, s->p.H_q, s->p.N_q);
    std::vector<A> h(static_cast<size_t>(s->LSE.n));
    download(*s->e, h.data(), s->LSE.data, s->LSE.n);
    LSE = make_tensor3<double>(s->p.B, s->p.H_q, s->p.N_q);
    for (size_t i = 0; i < h.size(); ++i) LSE.data[i] = static_cast<double>(h[i]);
  };
  r.fetch_backward = [s, fetch4](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
    dQ = fetch4(s->dQ, s->p.H_q, s->p.N_q);
    dK = fetch4(s->dK, s->p.H_kv, s->p.N_k);
    dV = fetch4(s->dV, s->p.H_kv, s->p.N_k);
  };
  return r;
}

Impl make_plugin_impl(const std::string& name) {
  const std::shared_ptr<const plugin::Library> lib = plugin::load(name.substr(std::string(kPrefix).size()));
  Impl m;
  m.name = name;
  m.about = std::string("engine plug-in ") + lib->name + (lib->api->about ? std::string(": ") + lib->api->about : "") +
            (lib->device ? " (device memory)" : " (host memory)");
  m.dtypes = lib->dtypes;
  m.suite_dtypes = lib->dtypes;
  // A plug-in whose supports runs the forward of a plain problem and declines its backward has no
  // backward pass (`--pass fwd`; suite runs its forward). A declined forward (no GPU, say) decides
  // nothing here: check() reports it.
  Problem plain;
  plain.N_q = plain.N_k = 128;
  plain.d = 64;
  const MaskData none = compile_mask(plain);
  bool forward = true;
  try {
    plugin::check_supports(*lib, plain, lib->dtypes.front(), none, false);
  } catch (const Error&) {
    forward = false;
  }
  if (forward) try {
      plugin::check_supports(*lib, plain, lib->dtypes.front(), none, true);
    } catch (const Error&) {
      m.has_backward = false;
    }
  // The plug-in's own refusals (plugin.h's supports) before anything runs: a decline is bad input.
  m.check = [lib, backward = m.has_backward](const Problem& p, Dtype dtype, const ImplOptions&) {
    const MaskData mask = compile_mask(p);
    plugin::check_supports(*lib, p, dtype, mask, false);
    if (backward) plugin::check_supports(*lib, p, dtype, mask, true);
  };
  m.prepare = [lib](const Problem& p, const Inputs& in, const ImplOptions&) {
    return dispatch_dtype(in.dtype, [&](auto tag) { return plugin_runner<typename decltype(tag)::type>(lib, p, in); });
  };
  for (Dtype t : lib->dtypes) {
    switch (t) {
      case Dtype::F64: m.engines.f64 = [lib](const ImplOptions&) { return plugin::make_engine<double>(lib); }; break;
      case Dtype::F32: m.engines.f32 = [lib](const ImplOptions&) { return plugin::make_engine<float>(lib); }; break;
      case Dtype::BF16: m.engines.bf16 = [lib](const ImplOptions&) { return plugin::make_engine<bf16_t>(lib); }; break;
      case Dtype::F16: m.engines.f16 = [lib](const ImplOptions&) { return plugin::make_engine<f16_t>(lib); }; break;
    }
  }
  if (lib->device) {  // SimComm and NCCL move the plug-in's device buffers
    m.engines.copy = [lib](void* dst, const void* src, int64_t bytes) { plugin::transport_copy(*lib, dst, src, bytes); };
    m.engines.poison = [lib](void* dst, int64_t bytes) { plugin::transport_poison(*lib, dst, bytes); };
  }
  m.engines.footprint.what = "plugin " + lib->name + " (its own workspace is not counted)";
  m.engines.footprint.device = lib->device;
  m.engines.footprint.block_call = [](const Problem&, int64_t, Dtype, const ImplOptions&, int) { return int64_t{0}; };
  return m;
}

}  // namespace

// nullptr unless name is plugin:PATH; the Impl lives for the process (find_impls hands out pointers).
const Impl* plugin_impl(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return nullptr;
  static std::deque<Impl> loaded;
  for (const Impl& m : loaded)
    if (m.name == name) return &m;
  try {
    loaded.push_back(make_plugin_impl(name));
  } catch (const Error& e) {
    fail("impl (", name, "): ", e.what());
  }
  return &loaded.back();
}

}  // namespace burstlab::tools
