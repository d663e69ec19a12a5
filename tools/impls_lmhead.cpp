// tools/impls_lmhead.cpp — the LM head + cross-entropy's implementations (spec §10) in the
// registry (impls.hpp): reference (the N x V logits), cpu (tiled), and with CUDA the cuda layer's
// variants. Each prepares a Runner over its own copies of the inputs, outputs poisoned (NaN, §9.3).
#include <chrono>
#include <functional>
#include <limits>
#include <memory>

#include "burstlab/dispatch.hpp"
#include "burstlab/error.hpp"
#include "cpu_lmhead.hpp"
#ifdef BURSTLAB_HAVE_CUDA
#include "cuda_lmhead.hpp"
#endif
#include "impls.hpp"
#include "reference_lmhead.hpp"

namespace burstlab::tools {

cpu::LmHeadTiles lmhead_tiles(const ImplOptions& o) {
  cpu::LmHeadTiles t;
  if (o.Br > 0) t.Br = o.Br;
  if (o.Bv > 0) t.Bv = o.Bv;
  return t;
}

namespace {

// Host state of one run in storage T, accumulation A (LSE and L).
template <class T, class A>
struct State {
  LmHeadProblem p;
  Matrix<T> H, W, dH, dW;  // (N, d), (V, d), (N, d), (V, d)
  std::vector<int64_t> y;  // (N)
  std::vector<A> LSE;      // (N)
  A L = std::numeric_limits<A>::quiet_NaN();
  double g = 1;
  cpu::LmHeadTiles tiles;
};
template <class T, class A>
std::shared_ptr<State<T, A>> make_state(const LmHeadProblem& p, const LmHeadInputs& in, double g,
                                        const cpu::LmHeadTiles& tiles) {
  auto s = std::make_shared<State<T, A>>();
  s->p = p;
  s->H = convert<T>(in.H);
  s->W = convert<T>(in.W);
  s->y = in.y;
  s->g = g;
  s->tiles = tiles;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  s->dH = make_matrix<T>(p.N, p.d, from_double<T>(nan));
  s->dW = make_matrix<T>(p.V, p.d, from_double<T>(nan));
  s->LSE.assign(static_cast<size_t>(p.N), static_cast<A>(nan));
  return s;
}
template <class T, class A>
void add_fetch(Runner& r, const std::shared_ptr<State<T, A>>& s) {
  r.fetch_loss = [s](double& L, std::vector<double>& LSE) {
    L = static_cast<double>(s->L);
    LSE.assign(s->LSE.begin(), s->LSE.end());
  };
  r.fetch_grads = [s](Matrix<double>& dH, Matrix<double>& dW) {
    dH = convert<double>(s->dH);
    dW = convert<double>(s->dW);
  };
}

template <class T>
Runner reference_runner(const LmHeadProblem& p, const LmHeadInputs& in, double g) {
  auto s = make_state<T, T>(p, in, g, {});
  Runner r;
  r.forward = timed([s] { s->L = reference::lmhead_forward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data()); });
  r.backward = timed([s] {
    reference::lmhead_backward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data(), static_cast<T>(s->g),
                                  s->dH.view(), s->dW.view());
  });
  r.fused = [f = r.forward, b = r.backward] { return f() + b(); };  // the reference has no fused call
  add_fetch(r, s);
  return r;
}

template <class T>
Runner cpu_runner(const LmHeadProblem& p, const LmHeadInputs& in, double g, const cpu::LmHeadTiles& tiles) {
  auto s = make_state<T, acc_t<T>>(p, in, g, tiles);
  Runner r;
  r.forward = timed([s] { s->L = cpu::lmhead_forward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data(), s->tiles); });
  r.backward = timed([s] {
    cpu::lmhead_backward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data(), s->g, s->dH.view(), s->dW.view(),
                            s->tiles);
  });
  r.fused = timed([s] {
    s->L = cpu::lmhead_fused<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->g, s->LSE.data(), s->dH.view(),
                                s->dW.view(), s->tiles);
  });
  add_fetch(r, s);
  return r;
}

#ifdef BURSTLAB_HAVE_CUDA
// DT: the storage type (bf16_t, f16_t) of host copies and device buffers alike. Every call
// synchronizes (the entry points do), so host timing is the call's time.
template <class DT>
Runner cuda_runner(const LmHeadProblem& p, const LmHeadInputs& in, double g, const ImplOptions& k, int variant) {
  struct S {
    LmHeadProblem p;
    double g = 1;
    cuda::LmHeadOptions opt;
    cuda::DeviceBuffer<DT> H, W, dH, dW;  // (N, d), (V, d), (N, d), (V, d)
    cuda::DeviceBuffer<int64_t> y;        // (N)
    cuda::DeviceBuffer<float> LSE;        // (N)
    float L = std::numeric_limits<float>::quiet_NaN();
    int64_t peak = -1;                    // the last call's pool high-water mark
  };
  auto s = std::make_shared<S>();
  s->p = p;
  s->g = g;
  s->opt.chunk_rows = k.Br;
  s->opt.variant = variant;
  auto upload = [](cuda::DeviceBuffer<DT>& buf, const Matrix<double>& m) {
    const Matrix<DT> h = convert<DT>(m);
    buf = cuda::DeviceBuffer<DT>(h.data.size());
    buf.upload(h.data.data(), h.data.size());
  };
  upload(s->H, in.H);
  upload(s->W, in.W);
  s->dH = cuda::DeviceBuffer<DT>(static_cast<size_t>(p.N * p.d));
  s->dW = cuda::DeviceBuffer<DT>(static_cast<size_t>(p.V * p.d));
  s->y = cuda::DeviceBuffer<int64_t>(in.y.size());
  s->y.upload(in.y.data(), in.y.size());
  s->LSE = cuda::DeviceBuffer<float>(static_cast<size_t>(p.N));
  s->dH.poison();
  s->dW.poison();
  s->LSE.poison();
  auto H = [s] { return view2<const DT>(s->H.data(), s->p.N, s->p.d); };
  auto W = [s] { return view2<const DT>(s->W.data(), s->p.V, s->p.d); };
  auto dH = [s] { return view2<DT>(s->dH.data(), s->p.N, s->p.d); };
  auto dW = [s] { return view2<DT>(s->dW.data(), s->p.V, s->p.d); };
  // Every call starts the pool's high-water mark afresh (nothing of ours is live between calls).
  auto pooled = [s](std::function<void()> call) {
    return timed([s, call] {
      cuda::reset_pool_peak();
      call();
      s->peak = cuda::pool_peak_bytes();
    });
  };
  Runner r;
  r.forward = pooled([s, H, W] { s->L = cuda::lmhead_forward<DT>(s->p, H(), W(), s->y.data(), s->LSE.data(), s->opt); });
  r.backward = pooled([s, H, W, dH, dW] {
    cuda::lmhead_backward<DT>(s->p, H(), W(), s->y.data(), s->LSE.data(), s->g, dH(), dW(), s->opt);
  });
  r.fused = pooled([s, H, W, dH, dW] {
    s->L = cuda::lmhead_fused<DT>(s->p, H(), W(), s->y.data(), s->g, s->LSE.data(), dH(), dW(), s->opt);
  });
  r.device_peak = [s] { return s->peak; };
  {
    const int v = cuda::lmhead_variant<DT>(p, view2<DT>(s->dH.data(), p.N, p.d), view2<DT>(s->dW.data(), p.V, p.d),
                                           s->opt);
    r.dW_roundings = cuda::lmhead_dW_roundings(p, v, s->opt);
  }
  r.fetch_loss = [s](double& L, std::vector<double>& LSE) {
    L = s->L;
    std::vector<float> h(static_cast<size_t>(s->p.N));
    s->LSE.download(h.data(), h.size());
    LSE.assign(h.begin(), h.end());
  };
  r.fetch_grads = [s](Matrix<double>& dH, Matrix<double>& dW) {
    auto fetch = [](const cuda::DeviceBuffer<DT>& buf, int64_t rows, int64_t cols) {
      Matrix<DT> h = make_matrix<DT>(rows, cols);
      buf.download(h.data.data(), h.data.size());
      return convert<double>(h);
    };
    dH = fetch(s->dH, s->p.N, s->p.d);
    dW = fetch(s->dW, s->p.V, s->p.d);
  };
  return r;
}
#endif

// Inputs and outputs of a run in its dtype, and what fetch_* returns in fp64.
std::vector<MemPart> io_parts(const LmHeadProblem& p, Dtype t, int64_t acc_bytes) {
  const int64_t Nd = bytes_mul(p.N, p.d), Vd = bytes_mul(p.V, p.d), s = bytes_of(t);
  return {{"H, W and dH, dW in " + to_string(t), bytes_mul(2 * s, bytes_add(Nd, Vd))},
          {"labels y and LSE", bytes_mul(8 + acc_bytes, p.N)},
          {"fetched fp64 copies of LSE, dH, dW", bytes_mul(8, bytes_add(p.N, bytes_add(Nd, Vd)))}};
}

}  // namespace

void add_lmhead_impls(std::vector<Impl>& v) {
  Impl ref;
  ref.op = Operator::LmHeadCe;
  ref.name = "reference";
  ref.about = "naive: materializes the N x V logits (reference/reference_lmhead.cpp); fp64 is the oracle";
  ref.dtypes = {Dtype::F64, Dtype::F32};
  ref.lmhead.prepare = [](const LmHeadProblem& p, const LmHeadInputs& in, double g, const ImplOptions&) {
    return in.dtype == Dtype::F64 ? reference_runner<double>(p, in, g) : reference_runner<float>(p, in, g);
  };
  ref.lmhead.footprint = [](const LmHeadProblem& p, Dtype t, const ImplOptions&, int) {
    std::vector<MemPart> parts = io_parts(p, t, bytes_of(t));
    // z (N, V) in T, and Eigen's dH, dW temporaries before they are stored.
    parts.push_back({"reference: the N x V logits", bytes_mul(bytes_of(t), bytes_mul(p.N, p.V))});
    parts.push_back({"reference: dH, dW temporaries", bytes_mul(bytes_of(t), bytes_mul(p.N + p.V, p.d))});
    return parts;
  };
  v.push_back(ref);
  Impl cpu;
  cpu.op = Operator::LmHeadCe;
  cpu.name = "cpu";
  cpu.about = "tiled over rows and vocabulary, online log-sum-exp, no N x V buffer (cpu/cpu_lmhead.cpp)";
  cpu.dtypes = {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16};
  cpu.lmhead.prepare = [](const LmHeadProblem& p, const LmHeadInputs& in, double g, const ImplOptions& k) {
    return dispatch_dtype(in.dtype, [&](auto t) { return cpu_runner<typename decltype(t)::type>(p, in, g, lmhead_tiles(k)); });
  };
  cpu.lmhead.footprint = [](const LmHeadProblem& p, Dtype t, const ImplOptions& k, int threads) {
    std::vector<MemPart> parts = io_parts(p, t, t == Dtype::F64 ? 8 : 4);
    parts.push_back({"cpu: workspace (Br x V logits, per-thread dH partials, fp32 W and dW for 16-bit storage)",
                     cpu::lmhead_workspace_bytes(p, t, true, lmhead_tiles(k), threads)});
    return parts;
  };
  v.push_back(cpu);
#ifdef BURSTLAB_HAVE_CUDA
  // "cuda" is the variant the entry points pick (variant 0); cuda-vN names one.
  struct GpuVariant {
    int variant;
    const char* name;
    const char* about;
  };
  const GpuVariant gpus[] = {
      {0, "cuda", "the variant the cuda layer picks (cuda-v3 for contiguous outputs)"},
      {1, "cuda-v1", "own mma.sync products, dz buffer and fp32 dW accumulator (cuda/lmhead_v1.cu)"},
      {2, "cuda-v2", "cuBLAS products, one-read row pass, v1's buffers (cuda/lmhead_v2.cu)"},
      {3, "cuda-v3", "v2 with dz over the logits and dW summed in the storage type per chunk (cuda/lmhead_v2.cu)"}};
  for (const GpuVariant& gv : gpus) {
    Impl gpu;
    gpu.op = Operator::LmHeadCe;
    gpu.name = gv.name;
    gpu.about = gv.about;
    gpu.dtypes = {Dtype::BF16, Dtype::F16};
    const std::string name = gv.name;
    gpu.lmhead.check = [name](const LmHeadProblem& p, Dtype) {
      std::string why;
      if (!cuda::gpu_available(&why)) fail("impl ", name, " cannot run: no usable GPU (", why, ")");
      if (p.d % 8) fail("d (", p.d, ") must be a multiple of 8 for impl ", name);
    };
    const int variant = gv.variant;
    gpu.lmhead.prepare = [variant](const LmHeadProblem& p, const LmHeadInputs& in, double g, const ImplOptions& k) {
      if (in.dtype == Dtype::BF16) return cuda_runner<bf16_t>(p, in, g, k, variant);
      return cuda_runner<f16_t>(p, in, g, k, variant);
    };
    gpu.lmhead.footprint = [](const LmHeadProblem& p, Dtype t, const ImplOptions&, int) {
      std::vector<MemPart> parts = io_parts(p, t, 4);
      parts.push_back({"cuda: host staging copies of H, W, dH, dW in " + to_string(t),
                       bytes_mul(2 * bytes_of(t), bytes_mul(p.N + p.V, p.d))});
      return parts;
    };
    gpu.lmhead.device_bytes = [variant](const LmHeadProblem& p, const ImplOptions& k, bool backward) {
      cuda::LmHeadOptions o;
      o.chunk_rows = k.Br;
      o.variant = variant;
      const int v = cuda::lmhead_variant<bf16_t>(p, View2<bf16_t>(), View2<bf16_t>(), o);
      return cuda::lmhead_workspace_bytes(p, v, backward, o);
    };
    v.push_back(gpu);
  }
#endif
}

}  // namespace burstlab::tools
