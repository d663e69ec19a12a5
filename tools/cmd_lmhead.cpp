// tools/cmd_lmhead.cpp — see cmd_lmhead.hpp. The LM head's implementations are a small registry
// of their own (the attention registry's Runner is shaped by Q, K, V); results reuse `run`'s
// Result rows, table and JSON.
#include "cmd_lmhead.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include "burstlab/error.hpp"
#include "burstlab/lmhead.hpp"
#include "cpu_lmhead.hpp"
#ifdef BURSTLAB_HAVE_CUDA
#include "cuda_lmhead.hpp"
#endif
#include "lmhead_check.hpp"
#include "memcount.hpp"
#include "reference_lmhead.hpp"
#include "resources.hpp"

namespace burstlab::tools {
namespace {

std::vector<Metrics> cat(std::vector<Metrics> a, const std::vector<Metrics>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---------------------------------------------------------------- implementations
// The tile knobs of a run: the cpu layer's tiles (defaults filled in) and the raw --br for layers
// with other defaults (cuda: rows per chunk; 0 = its own default).
struct LmKnobs {
  cpu::LmHeadTiles tiles;
  int64_t chunk_rows = 0;
};

// One prepared run: inputs converted to the impl's dtype, outputs poisoned (NaN, §9.3). Each
// function runs once and returns ms; backward() reads the LSE of the last forward().
struct LmHeadRunner {
  std::function<double()> forward, backward, fused;
  std::function<void(double& L, std::vector<double>& LSE)> fetch_forward;
  std::function<void(Matrix<double>& dH, Matrix<double>& dW)> fetch_backward;
  int64_t dW_roundings = 1;             // r_W of (10.21): partial sums of dW rounded to the storage type
  std::function<int64_t()> device_peak;  // measured device workspace of the last call (a GPU layer)
};
struct LmHeadImpl {
  std::string name, about;
  std::vector<Dtype> dtypes;
  // Throws Error (naming the field and value) when this implementation cannot run the problem; may
  // be empty. Called before anything is printed.
  std::function<void(const LmHeadProblem&, Dtype)> check;
  std::function<LmHeadRunner(const LmHeadProblem&, const LmHeadInputs&, double g, const LmKnobs&)> prepare;
  // Host bytes of a prepared run at its peak (inputs and outputs in its dtype, the fetched fp64
  // copies, its workspace on `threads` threads).
  std::function<std::vector<MemPart>(const LmHeadProblem&, Dtype, const LmKnobs&, int threads)> footprint;
  // Device bytes a forward (backward = false) or fused call allocates beyond its arguments
  // (empty: a host layer).
  std::function<int64_t(const LmHeadProblem&, const LmKnobs&, bool backward)> device_bytes;
};

template <class T>
Matrix<T> to_storage(const Matrix<double>& m) {
  Matrix<T> s;
  s.rows = m.rows;
  s.cols = m.cols;
  s.data.resize(m.data.size());
  for (size_t e = 0; e < m.data.size(); ++e) s.data[e] = from_double<T>(m.data[e]);
  return s;
}
template <class T>
Matrix<double> to_double(const Matrix<T>& m) {
  Matrix<double> s = make_matrix<double>(m.rows, m.cols);
  for (size_t e = 0; e < m.data.size(); ++e) s.data[e] = static_cast<double>(m.data[e]);
  return s;
}

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
  s->H = to_storage<T>(in.H);
  s->W = to_storage<T>(in.W);
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
void add_fetch(LmHeadRunner& r, const std::shared_ptr<State<T, A>>& s) {
  r.fetch_forward = [s](double& L, std::vector<double>& LSE) {
    L = static_cast<double>(s->L);
    LSE.assign(s->LSE.begin(), s->LSE.end());
  };
  r.fetch_backward = [s](Matrix<double>& dH, Matrix<double>& dW) {
    dH = to_double(s->dH);
    dW = to_double(s->dW);
  };
}

template <class T>
LmHeadRunner reference_runner(const LmHeadProblem& p, const LmHeadInputs& in, double g) {
  auto s = make_state<T, T>(p, in, g, {});
  LmHeadRunner r;
  r.forward = [s] {
    const auto t0 = std::chrono::steady_clock::now();
    s->L = reference::lmhead_forward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data());
    return ms_since(t0);
  };
  r.backward = [s] {
    const auto t0 = std::chrono::steady_clock::now();
    reference::lmhead_backward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data(), static_cast<T>(s->g),
                                  s->dH.view(), s->dW.view());
    return ms_since(t0);
  };
  r.fused = [f = r.forward, b = r.backward] { return f() + b(); };  // the reference has no fused call
  add_fetch(r, s);
  return r;
}

template <class T>
LmHeadRunner cpu_runner(const LmHeadProblem& p, const LmHeadInputs& in, double g, const cpu::LmHeadTiles& tiles) {
  auto s = make_state<T, acc_t<T>>(p, in, g, tiles);
  LmHeadRunner r;
  r.forward = [s] {
    const auto t0 = std::chrono::steady_clock::now();
    s->L = cpu::lmhead_forward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data(), s->tiles);
    return ms_since(t0);
  };
  r.backward = [s] {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::lmhead_backward<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->LSE.data(), s->g, s->dH.view(),
                            s->dW.view(), s->tiles);
    return ms_since(t0);
  };
  r.fused = [s] {
    const auto t0 = std::chrono::steady_clock::now();
    s->L = cpu::lmhead_fused<T>(s->p, s->H.view(), s->W.view(), s->y.data(), s->g, s->LSE.data(), s->dH.view(),
                                s->dW.view(), s->tiles);
    return ms_since(t0);
  };
  add_fetch(r, s);
  return r;
}

#ifdef BURSTLAB_HAVE_CUDA
// HT: the host storage type (bf16_t, f16_t), DT: the device buffers' (the same type: cuda/ takes
// the contract's). Every call synchronizes (the entry points do), so host timing is the call's time.
template <class HT, class DT>
LmHeadRunner cuda_runner(const LmHeadProblem& p, const LmHeadInputs& in, double g, const LmKnobs& k, int variant) {
  static_assert(sizeof(HT) == sizeof(DT), "host and device 16-bit types share their bits");
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
  s->opt.chunk_rows = k.chunk_rows;
  s->opt.variant = variant;
  auto upload = [](cuda::DeviceBuffer<DT>& buf, const Matrix<double>& m) {
    const Matrix<HT> h = to_storage<HT>(m);
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
  LmHeadRunner r;
  // Every call starts the pool's high-water mark afresh (nothing of ours is live between calls).
  r.forward = [s, H, W] {
    cuda::reset_pool_peak();
    const auto t0 = std::chrono::steady_clock::now();
    s->L = cuda::lmhead_forward<DT>(s->p, H(), W(), s->y.data(), s->LSE.data(), s->opt);
    const double ms = ms_since(t0);
    s->peak = cuda::pool_peak_bytes();
    return ms;
  };
  r.backward = [s, H, W] {
    cuda::reset_pool_peak();
    const auto t0 = std::chrono::steady_clock::now();
    cuda::lmhead_backward<DT>(s->p, H(), W(), s->y.data(), s->LSE.data(), s->g,
                              view2<DT>(s->dH.data(), s->p.N, s->p.d), view2<DT>(s->dW.data(), s->p.V, s->p.d),
                              s->opt);
    const double ms = ms_since(t0);
    s->peak = cuda::pool_peak_bytes();
    return ms;
  };
  r.fused = [s, H, W] {
    cuda::reset_pool_peak();
    const auto t0 = std::chrono::steady_clock::now();
    s->L = cuda::lmhead_fused<DT>(s->p, H(), W(), s->y.data(), s->g, s->LSE.data(),
                                  view2<DT>(s->dH.data(), s->p.N, s->p.d), view2<DT>(s->dW.data(), s->p.V, s->p.d),
                                  s->opt);
    const double ms = ms_since(t0);
    s->peak = cuda::pool_peak_bytes();
    return ms;
  };
  r.device_peak = [s] { return s->peak; };
  {
    const int v = cuda::lmhead_variant<DT>(p, view2<DT>(s->dH.data(), p.N, p.d), view2<DT>(s->dW.data(), p.V, p.d),
                                           s->opt);
    r.dW_roundings = cuda::lmhead_dW_roundings(p, v, s->opt);
  }
  r.fetch_forward = [s](double& L, std::vector<double>& LSE) {
    L = s->L;
    std::vector<float> h(static_cast<size_t>(s->p.N));
    s->LSE.download(h.data(), h.size());
    LSE.assign(h.begin(), h.end());
  };
  r.fetch_backward = [s](Matrix<double>& dH, Matrix<double>& dW) {
    auto fetch = [](const cuda::DeviceBuffer<DT>& buf, int64_t rows, int64_t cols) {
      Matrix<HT> h = make_matrix<HT>(rows, cols);
      buf.download(h.data.data(), h.data.size());
      return to_double(h);
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

const std::vector<LmHeadImpl>& lmhead_registry() {
  static const std::vector<LmHeadImpl> impls = [] {
    std::vector<LmHeadImpl> v;
    LmHeadImpl ref;
    ref.name = "reference";
    ref.about = "naive: materializes the N x V logits (reference/reference_lmhead.cpp); fp64 is the oracle";
    ref.dtypes = {Dtype::F64, Dtype::F32};
    ref.prepare = [](const LmHeadProblem& p, const LmHeadInputs& in, double g, const LmKnobs&) {
      return in.dtype == Dtype::F64 ? reference_runner<double>(p, in, g) : reference_runner<float>(p, in, g);
    };
    ref.footprint = [](const LmHeadProblem& p, Dtype t, const LmKnobs&, int) {
      std::vector<MemPart> parts = io_parts(p, t, bytes_of(t));
      // z (N, V) in T, and Eigen's dH, dW temporaries before they are stored.
      parts.push_back({"reference: the N x V logits", bytes_mul(bytes_of(t), bytes_mul(p.N, p.V))});
      parts.push_back({"reference: dH, dW temporaries", bytes_mul(bytes_of(t), bytes_mul(p.N + p.V, p.d))});
      return parts;
    };
    v.push_back(ref);
    LmHeadImpl cpu;
    cpu.name = "cpu";
    cpu.about = "tiled over rows and vocabulary, online log-sum-exp, no N x V buffer (cpu/cpu_lmhead.cpp)";
    cpu.dtypes = {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16};
    cpu.prepare = [](const LmHeadProblem& p, const LmHeadInputs& in, double g, const LmKnobs& k) {
      const cpu::LmHeadTiles& tiles = k.tiles;
      switch (in.dtype) {
        case Dtype::F64: return cpu_runner<double>(p, in, g, tiles);
        case Dtype::F32: return cpu_runner<float>(p, in, g, tiles);
        case Dtype::BF16: return cpu_runner<bf16_t>(p, in, g, tiles);
        case Dtype::F16: return cpu_runner<f16_t>(p, in, g, tiles);
      }
      fail("dtype (", to_string(in.dtype), ") is not run by impl cpu");
    };
    cpu.footprint = [](const LmHeadProblem& p, Dtype t, const LmKnobs& k, int threads) {
      std::vector<MemPart> parts = io_parts(p, t, t == Dtype::F64 ? 8 : 4);
      parts.push_back({"cpu: workspace (Br x V logits, per-thread dH partials, fp32 W and dW for 16-bit storage)",
                       cpu::lmhead_workspace_bytes(p, t, true, k.tiles, threads)});
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
      LmHeadImpl gpu;
      gpu.name = gv.name;
      gpu.about = gv.about;
      gpu.dtypes = {Dtype::BF16, Dtype::F16};
      const std::string name = gv.name;
      gpu.check = [name](const LmHeadProblem& p, Dtype) {
        std::string why;
        if (!cuda::gpu_available(&why)) fail("impl ", name, " cannot run: no usable GPU (", why, ")");
        if (p.d % 8) fail("d (", p.d, ") must be a multiple of 8 for impl ", name);
      };
      const int variant = gv.variant;
      gpu.prepare = [variant](const LmHeadProblem& p, const LmHeadInputs& in, double g, const LmKnobs& k) {
        if (in.dtype == Dtype::BF16) return cuda_runner<bf16_t, bf16_t>(p, in, g, k, variant);
        return cuda_runner<f16_t, f16_t>(p, in, g, k, variant);
      };
      gpu.footprint = [](const LmHeadProblem& p, Dtype t, const LmKnobs&, int) {
        std::vector<MemPart> parts = io_parts(p, t, 4);
        parts.push_back({"cuda: host staging copies of H, W, dH, dW in " + to_string(t),
                         bytes_mul(2 * bytes_of(t), bytes_mul(p.N + p.V, p.d))});
        return parts;
      };
      gpu.device_bytes = [variant](const LmHeadProblem& p, const LmKnobs& k, bool backward) {
        cuda::LmHeadOptions o;
        o.chunk_rows = k.chunk_rows;
        o.variant = variant;
        const int v = cuda::lmhead_variant<bf16_t>(p, View2<bf16_t>(), View2<bf16_t>(), o);
        return cuda::lmhead_workspace_bytes(p, v, backward, o);
      };
      v.push_back(gpu);
    }
#endif
    return v;
  }();
  return impls;
}

std::vector<const LmHeadImpl*> find_lmhead_impls(const std::string& list) {
  std::vector<const LmHeadImpl*> out;
  std::string names;
  for (const LmHeadImpl& m : lmhead_registry()) names += (names.empty() ? "" : ", ") + m.name;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = list.find(',', at);
    const std::string name = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const LmHeadImpl* found = nullptr;
    for (const LmHeadImpl& m : lmhead_registry())
      if (m.name == name) found = &m;
    if (!found) fail("impl (", name, ") is not an implementation of --op lmhead-ce; built here: ", names);
    if (std::find(out.begin(), out.end(), found) == out.end()) out.push_back(found);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}
void check_lmhead_impl(const LmHeadImpl& m, const LmHeadProblem& p, Dtype t) {
  if (std::find(m.dtypes.begin(), m.dtypes.end(), t) == m.dtypes.end())
    fail("impl ", m.name, " does not run ", to_string(t), "; it runs ", dtype_list(m.dtypes));
  if (m.check) m.check(p, t);
}

// ---------------------------------------------------------------- the problem and the check
struct LmPasses {
  bool fwd = false, bwd = false, fused = false;
};
LmPasses parse_lm_pass(const std::string& s) {
  if (s == "fwd") return {true, false, false};
  if (s == "bwd") return {false, true, false};
  if (s == "fused") return {false, false, true};
  if (s == "both") return {true, true, true};
  fail("pass (", s, ") must be fwd, bwd, fused or both (all three) with --op lmhead-ce");
}

LmHeadProblem make_lmhead_problem(const ShapeFlags& s, int64_t d, const LmHeadFlags& f) {
  if (s.B < 1) fail("B (", s.B, ") must be >= 1");
  if (s.N_q < 1) fail("nq (", s.N_q, ") must be >= 1");
  LmHeadProblem p;
  if (__builtin_mul_overflow(s.B, s.N_q, &p.N)) fail("N = B x nq (", s.B, " x ", s.N_q, ") overflows int64");
  p.d = d;
  if (f.V < 1) fail("vocab (", f.V, ") must be >= 1: --op lmhead-ce needs --vocab V");
  p.V = f.V;
  p.ignore_index = f.ignore_index;
  p.label_smoothing = f.eps;
  p.z_loss = f.z_loss;
  p.reduction = parse_reduction(f.reduction);
  validate(p);
  if (!(f.ignored >= 0 && f.ignored <= 1)) fail("ignore-fraction (", f.ignored, ") must be in [0, 1]");
  return p;
}

LmKnobs knobs_of(const RunFlags& r, const LmHeadFlags& f) {
  if (r.Br < 0) fail("br (", r.Br, ") must be >= 1, or 0 for the implementation's default");
  if (f.Bv < 0) fail("bv (", f.Bv, ") must be >= 1, or 0 for the implementation's default");
  LmKnobs k;
  if (r.Br > 0) k.tiles.Br = r.Br;
  if (f.Bv > 0) k.tiles.Bv = f.Bv;
  k.chunk_rows = r.Br;
  return k;
}

// The inputs in fp64 and the oracle with its bounds (lmhead_check.cpp): reference<double> holds
// one N x V fp64 matrix at a time; the bounds four (256 x V) chunks and three V x d matrices.
MemNeed oracle_need(const LmHeadProblem& p, bool backward) {
  const int64_t Nd = bytes_mul(p.N, p.d), Vd = bytes_mul(p.V, p.d);
  std::vector<MemPart> parts = {
      {"inputs H, W in fp64 and labels", bytes_mul(8, bytes_add(bytes_add(Nd, Vd), p.N))},
      {"oracle: LSE and its bound", bytes_mul(16, p.N)},
      {"oracle: the N x V fp64 logits", bytes_mul(8, bytes_mul(p.N, p.V))}};
  if (backward) {
    parts.push_back({"oracle: dH, dW and their bounds, fp64", bytes_mul(32, bytes_add(Nd, Vd))});
    parts.push_back({"oracle: Eigen's dH, dW temporaries", bytes_mul(8, bytes_add(Nd, Vd))});
  }
  return make_need("running the fp64 oracle", parts);
}
MemNeed bounds_need(const LmHeadProblem& p, bool backward) {
  const int64_t Vd = bytes_mul(p.V, p.d), chunk = std::min<int64_t>(256, p.N);
  // z and a (chunk x V), and for the backward E and |dz|+ too; |W|, and for the backward two V x d sums.
  std::vector<MemPart> parts = {{"bounds: (chunk x V) fp64 matrices", bytes_mul(backward ? 32 : 16, bytes_mul(chunk, p.V))},
                                {"bounds: |W| and the V x d sums", bytes_mul(backward ? 24 : 8, Vd)}};
  return make_need("computing the §10.8 bounds", parts);
}
MemNeed lmhead_case_need(const LmHeadProblem& p, Dtype t, bool backward, const std::vector<const LmHeadImpl*>& impls,
                         const LmKnobs& knobs, int threads) {
  MemNeed n = peak_of(oracle_need(p, backward), bounds_need(p, backward));
  const MemNeed kept = oracle_need(p, backward);
  for (const LmHeadImpl* m : impls) {
    std::vector<MemPart> parts = m->footprint(p, t, knobs, threads);
    for (const MemPart& k : kept.parts)
      if (k.what.find("logits") == std::string::npos && k.what.find("temporaries") == std::string::npos)
        parts.push_back(k);
    n = peak_of(n, make_need("running impl " + m->name + " (" + to_string(t) + ")", parts));
  }
  return n;
}

Result lm_row(const std::string& impl, Dtype t, const LmHeadProblem& p, Values v, const char* pass, double flops) {
  Result r;
  r.impl = impl;
  r.dtype = t;
  r.shape = shape_string(p);
  r.mask = "-";
  r.values = to_string(v);
  r.layout = "";
  r.pass = pass;
  r.flops = flops;
  return r;
}
double best_of(const std::function<double()>& run, int repeat) {
  double best = std::numeric_limits<double>::infinity();
  for (int k = 0; k < repeat; ++k) best = std::min(best, run());
  return best;
}

// Every implementation on one problem: the oracle once, then per impl the requested rows.
std::vector<Result> run_lmhead_case(const LmHeadProblem& p, Dtype dtype, Values values, uint64_t seed, double ignored,
                                    const LmPasses& ps, const std::vector<const LmHeadImpl*>& impls,
                                    const LmKnobs& knobs, int repeat) {
  const bool backward = ps.bwd || ps.fused;
  const double g = 1.0;  // dL of a loss minimized directly
  const LmHeadInputs in = [&] {
    Allocating step("generating the inputs H, W, y in fp64", 0);
    return make_lmhead_inputs(p, dtype, seed, values, ignored);
  }();
  const LmHeadOracle want = [&] {
    Allocating step("running the fp64 oracle", oracle_need(p, backward).bytes);
    return lmhead_oracle(p, in, g, backward);
  }();
  std::vector<Result> out;
  for (const LmHeadImpl* m : impls) {
    Result fwd = lm_row(m->name, dtype, p, values, "fwd", lmhead_forward_flops(p));
    Result bwd = lm_row(m->name, dtype, p, values, "bwd", lmhead_backward_flops(p));
    Result fus = lm_row(m->name, dtype, p, values, "fused", lmhead_forward_flops(p) + lmhead_backward_flops(p));
    std::vector<Result*> rows;
    if (ps.fwd) rows.push_back(&fwd);
    if (ps.bwd) rows.push_back(&bwd);
    if (ps.fused) rows.push_back(&fus);
    size_t k = 0;
    try {
      Allocating step("running impl " + m->name + " (" + to_string(dtype) + ")", 0);
      LmHeadRunner run = m->prepare(p, in, g, knobs);
      double L = 0;
      std::vector<double> LSE;
      Matrix<double> dH, dW;
      for (k = 0; k < rows.size(); ++k) {
        Result& r = *rows[k];
        if (&r == &fwd) {
          r.ms = best_of(run.forward, repeat);
          run.fetch_forward(L, LSE);
          r.tensors = check_lmhead_forward(want, L, LSE.data());
        } else if (&r == &bwd) {
          if (!ps.fwd) run.forward();  // the backward reads this implementation's own LSE
          r.ms = best_of(run.backward, repeat);
          run.fetch_backward(dH, dW);
          r.tensors = check_lmhead_backward<double>(want, dH.view(), dW.view(), run.dW_roundings);
        } else {
          r.ms = best_of(run.fused, repeat);
          run.fetch_forward(L, LSE);
          run.fetch_backward(dH, dW);
          r.tensors = cat(check_lmhead_forward(want, L, LSE.data()),
                          check_lmhead_backward<double>(want, dH.view(), dW.view(), run.dW_roundings));
        }
        r.all = combine(r.tensors.data(), static_cast<int>(r.tensors.size()));
        out.push_back(r);
      }
    } catch (const std::exception& e) {
      const bool oom = dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const std::length_error*>(&e);
      for (; k < rows.size(); ++k) {
        rows[k]->error = oom ? out_of_memory_message(e) : e.what();
        rows[k]->all.err_bound = std::numeric_limits<double>::infinity();
        out.push_back(*rows[k]);
      }
    }
  }
  return out;
}

}  // namespace

void add_lmhead_flags(CLI::App* sub, LmHeadFlags& f) {
  sub->add_option("--op", f.op, "operator: attention | lmhead-ce (the fused LM head + cross-entropy, spec §10)")
      ->capture_default_str();
  int_range(sub->add_option("--vocab", f.V, "lmhead-ce: vocabulary size V (required); rows N = B x nq, hidden size -d"),
            "vocab", 1, kMaxExtent);
  int_range(sub->add_option("--ignore-index", f.ignore_index, "lmhead-ce: the label of rows that do not count")
                ->capture_default_str(),
            "ignore-index", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  real_range(sub->add_option("--ignore-fraction", f.ignored, "lmhead-ce: fraction of rows labelled ignore-index (seeded)")
                 ->capture_default_str(),
             "ignore-fraction", 0, 1);
  // The names validate(LmHeadProblem) uses for these fields.
  real_range(sub->add_option("--label-smoothing", f.eps, "lmhead-ce: label smoothing eps in [0, 1]")->capture_default_str(),
             "label_smoothing", 0, 1);
  real_range(sub->add_option("--z-loss", f.z_loss, "lmhead-ce: z-loss weight lambda >= 0")->capture_default_str(),
             "z_loss", 0, std::numeric_limits<double>::max());
  sub->add_option("--reduction", f.reduction, "lmhead-ce: mean | sum")->capture_default_str();
  int_range(sub->add_option("--bv", f.Bv, "lmhead-ce: vocabulary entries per tile Bv (0 = the implementation's default)")
                ->capture_default_str(),
            "bv", 0, kMaxExtent, ">= 1, or 0 for the implementation's default");
}

bool lmhead_selected(const CLI::App* sub, const LmHeadFlags& f) {
  if (f.op != "attention" && f.op != "lmhead-ce") fail("op (", f.op, ") must be attention or lmhead-ce");
  const bool lm = f.op == "lmhead-ce";
  static const std::set<std::string> lm_only = {"--vocab", "--ignore-index", "--ignore-fraction", "--label-smoothing",
                                                "--z-loss", "--reduction", "--bv"};
  static const std::set<std::string> shared = {"--batch", "--nq",      "--head-dim", "--seed",   "--dtype",
                                               "--values", "--impl",   "--pass",     "--br",     "--threads",
                                               "--repeat", "--reps",   "--verify",   "--json",   "--verbose",
                                               "--help",   "--op"};
  for (const CLI::Option* o : sub->get_options()) {
    if (o->count() == 0) continue;
    const std::string n = o->get_name();
    if (lm && !shared.count(n) && !lm_only.count(n))
      fail(n, " does not apply to --op lmhead-ce (its shape: N = B x nq rows, hidden size -d, --vocab V)");
    if (!lm && lm_only.count(n)) fail(n, " applies to --op lmhead-ce only");
  }
  return lm;
}

namespace {
// "it fits with --nq X" (and --pass fwd), or what else to shrink.
std::string lmhead_advice(const ShapeFlags& s, const LmHeadProblem& p,
                          const std::function<bool(const LmHeadProblem&, bool backward)>& fits, bool backward) {
  std::vector<std::string> ways;
  if (backward && fits(p, false)) ways.push_back("--pass fwd");
  const int64_t n = largest_fitting_length(s.N_q, s.N_q, [&](int64_t nq, int64_t) {
    LmHeadProblem q = p;
    q.N = s.B * nq;
    return fits(q, backward);
  });
  if (n > 0 && n < s.N_q) ways.push_back("--nq " + std::to_string(n));
  std::string out;
  for (size_t k = 0; k < ways.size(); ++k) out += (k == 0 ? "it fits with " : ", or with ") + ways[k];
  return out.empty() ? "use a smaller --vocab or -d" : out + " (the fp64 oracle holds N x V fp64 logits)";
}
}  // namespace

int run_lmhead(const ShapeFlags& s, const RunFlags& r, const LmHeadFlags& f, int repeat) {
  // Validate everything before printing anything.
  const LmHeadProblem p = make_lmhead_problem(s, s.d.at(0), f);
  const Dtype dtype = parse_dtype(r.dtype);
  const Values values = parse_values(r.values);
  if (values == Values::WideV) fail("values (widev) does not apply to --op lmhead-ce; use normal, large or ties");
  const LmPasses ps = parse_lm_pass(r.pass);
  const LmKnobs knobs = knobs_of(r, f);
  const cpu::LmHeadTiles& tiles = knobs.tiles;
  if (repeat < 1) fail("repeat (", repeat, ") must be >= 1");
  apply_threads(r.threads);
  const std::vector<const LmHeadImpl*> impls = find_lmhead_impls(r.impl);
  for (const LmHeadImpl* m : impls) check_lmhead_impl(*m, p, dtype);
  const int threads = max_threads();
  const bool backward = ps.bwd || ps.fused;
  const MemAvailable avail = memory_available();
  auto fits = [&](const LmHeadProblem& q, bool bwd) {  // for the advice: with headroom
    return lmhead_case_need(q, dtype, bwd, impls, knobs, threads).bytes <= advice_budget(avail);
  };
  require_memory(lmhead_case_need(p, dtype, backward, impls, knobs, threads), avail,
                 [&] { return lmhead_advice(s, p, fits, backward); });

  const std::vector<Result> rs = run_lmhead_case(p, dtype, values, s.seed, f.ignored, ps, impls, knobs, repeat);
  Json header = Json::object();
  header["command"] = "run";
  header["op"] = "lmhead-ce";
  header["shape"] = shape_string(p);
  header["dtype"] = to_string(dtype);
  header["values"] = to_string(values);
  header["ignore_fraction"] = f.ignored;
  header["seed"] = s.seed;
  header["threads"] = threads;
  header["repeat"] = repeat;
  header["Br"] = tiles.Br;
  header["Bv"] = tiles.Bv;
  if (!r.json)
    std::printf("burstlab run --op lmhead-ce: %s dtype=%s values=%s ignore-fraction=%g seed=%llu threads=%d "
                "repeat=%d Br=%lld Bv=%lld (cpu tiles)\n",
                shape_string(p).c_str(), to_string(dtype).c_str(), to_string(values).c_str(), f.ignored,
                static_cast<unsigned long long>(s.seed), threads, repeat, static_cast<long long>(tiles.Br),
                static_cast<long long>(tiles.Bv));
  return report(rs, r, false, header);
}

int bench_lmhead(const ShapeFlags& s, const RunFlags& r, const LmHeadFlags& f, int reps, const std::string& verify) {
  // ---- validate everything first
  if (s.d.empty()) fail("d (none) needs at least one value");
  std::vector<LmHeadProblem> problems;
  for (int64_t d : s.d) problems.push_back(make_lmhead_problem(s, d, f));
  const Dtype dtype = parse_dtype(r.dtype);
  const Values values = parse_values(r.values);
  if (values == Values::WideV) fail("values (widev) does not apply to --op lmhead-ce; use normal, large or ties");
  const LmKnobs knobs = knobs_of(r, f);
  const cpu::LmHeadTiles& tiles = knobs.tiles;
  if (reps < 1) fail("reps (", reps, ") must be >= 1");
  if (verify != "auto" && verify != "same" && verify != "reduced")
    fail("verify (", verify, ") must be auto, same or reduced");
  if (r.threads < 0) fail("threads (", r.threads, ") must be >= 1, or 0 for all");
  const std::vector<const LmHeadImpl*> impls = find_lmhead_impls(r.impl);
  for (const LmHeadImpl* m : impls)
    for (const LmHeadProblem& p : problems) check_lmhead_impl(*m, p, dtype);
  const int threads = r.threads > 0 ? r.threads : max_threads();
  apply_threads(threads);

  // The fp64 oracle on the timed shape when N V d <= 2^30 (seconds on 2 cores); above, on the first
  // 256 rows' worth of N (same V and d: the vocabulary tiling is what the check is about).
  constexpr double kSameShapeMax = double(1 << 30);
  constexpr int64_t kReducedN = 256;
  std::vector<LmHeadProblem> checks;
  std::vector<std::string> check_shape;
  for (const LmHeadProblem& p : problems) {
    const bool same = verify == "same" || (verify == "auto" && double(p.N) * double(p.V) * double(p.d) <= kSameShapeMax);
    LmHeadProblem q = p;
    if (!same) q.N = std::min(p.N, kReducedN);
    checks.push_back(q);
    check_shape.push_back(same ? "the timed shape" : "N reduced to " + std::to_string(q.N));
  }
  const MemAvailable avail = memory_available();
  auto need = [&](const LmHeadProblem& timed, const LmHeadProblem& checked) {
    MemNeed n = lmhead_case_need(checked, dtype, true, impls, knobs, threads);
    for (const LmHeadImpl* m : impls) {
      std::vector<MemPart> parts = m->footprint(timed, dtype, knobs, threads);
      parts.push_back({"inputs H, W in fp64", bytes_mul(8, bytes_mul(timed.N + timed.V, timed.d))});
      n = peak_of(n, make_need("timing impl " + m->name + " (" + to_string(dtype) + ")", parts));
    }
    return n;
  };
  MemNeed total;
  for (size_t k = 0; k < problems.size(); ++k) total = peak_of(total, need(problems[k], checks[k]));
  require_memory(total, avail, [&] {
    auto fits = [&](const LmHeadProblem& q, bool) {
      LmHeadProblem c = q;
      if (c.N > kReducedN && verify != "same") c.N = kReducedN;
      return need(q, c).bytes <= advice_budget(avail);
    };
    return lmhead_advice(s, problems.front(), fits, false);
  });

  // ---- verify before timing: the forward and the fused call, as timed
  std::vector<Result> checked;
  Progress progress(static_cast<int>(2 * problems.size()));
  for (const LmHeadProblem& q : checks) {
    progress.step("verify " + shape_string(q));
    const auto part = run_lmhead_case(q, dtype, values, s.seed, f.ignored, {true, false, true}, impls, knobs, 1);
    checked.insert(checked.end(), part.begin(), part.end());
  }
  bool all_pass = !checked.empty();
  for (const Result& x : checked) all_pass = all_pass && x.pass_ok();
  if (!all_pass) {
    progress.done();
    Json header = {{"command", "bench"}, {"op", "lmhead-ce"}, {"verified", false},
                   {"error", "an implementation failed its check; no speed is reported"}};
    if (!r.json) std::printf("verification against the fp64 oracle FAILED: no speed is reported\n");
    report(checked, r, false, header);
    return kExitFail;
  }

  // ---- time, and count the heap of the timed calls
  struct Row {
    int64_t d;
    std::string impl, pass;
    double ms, gflops;
    int64_t extra;  // peak extra heap bytes, -1 when not counted
    int64_t device = -1;        // measured device workspace peak of the timed calls (a GPU layer), else -1
    int64_t device_model = -1;  // what the layer says it allocates (lmhead_workspace_bytes), else -1
    double vs_ref_time = NAN, vs_ref_heap = NAN;
  };
  std::vector<Row> rows;
  const bool counting = heap_counting();
  for (const LmHeadProblem& p : problems) {
    progress.step("time " + shape_string(p));
    const LmHeadInputs in = make_lmhead_inputs(p, dtype, s.seed, values, f.ignored);
    double ref_ms[2] = {NAN, NAN}, ref_extra[2] = {NAN, NAN};
    for (const LmHeadImpl* m : impls) {
      LmHeadRunner run = m->prepare(p, in, 1.0, knobs);
      for (int k = 0; k < 2; ++k) {
        const std::function<double()>& call = k == 0 ? run.forward : run.fused;
        if (reps > 1) call();  // warm-up
        double best = std::numeric_limits<double>::infinity();
        int64_t extra = -1, device = -1;
        for (int rep = 0; rep < reps; ++rep) {
          heap_reset_peak();
          const int64_t base = heap_live();
          best = std::min(best, call());
          if (counting) extra = std::max(extra, heap_peak() - base);
          if (run.device_peak) device = std::max(device, run.device_peak());
        }
        Row row;
        row.d = p.d;
        row.impl = m->name;
        row.pass = k == 0 ? "fwd" : "fused";
        row.ms = best;
        const double flops = k == 0 ? lmhead_forward_flops(p) : lmhead_forward_flops(p) + lmhead_backward_flops(p);
        row.gflops = flops / (best * 1e-3) / 1e9;
        row.extra = extra;
        row.device = device;
        if (m->device_bytes) row.device_model = m->device_bytes(p, knobs, k == 1);
        if (m->name == "reference") {
          ref_ms[k] = best;
          ref_extra[k] = counting ? double(extra) : NAN;
        }
        row.vs_ref_time = ref_ms[k] / best;                                 // NaN until reference ran
        row.vs_ref_heap = counting ? double(extra) / ref_extra[k] : NAN;
        rows.push_back(row);
      }
    }
  }
  progress.done();

  // ---- print
  Table t;
  t.columns = {{"d", "d", false},          {"impl", "impl", true},           {"pass", "pass", true},
               {"time_ms", "best(ms)", false}, {"gflops", "GFLOP/s", false},  {"peak_extra_heap_mib", "peak heap(MiB)", false},
               {"speedup_vs_reference", "x ref speed", false}, {"heap_vs_reference", "x ref heap", false},
               {"device_extra_mib", "device peak(MiB)", false}, {"device_model_mib", "device model(MiB)", false}};
  for (const Row& x : rows)
    t.add({integer(x.d), text(x.impl), text(x.pass), number(x.ms, "%.1f"), number(x.gflops, "%.2f"),
           x.extra < 0 ? missing() : number(double(x.extra) / 1048576.0, "%.1f"),
           std::isnan(x.vs_ref_time) ? missing() : number(x.vs_ref_time, "%.2f"),
           std::isnan(x.vs_ref_heap) ? missing() : number(x.vs_ref_heap, "%.4f"),
           x.device < 0 ? missing() : number(double(x.device) / 1048576.0, "%.1f"),
           x.device_model < 0 ? missing() : number(double(x.device_model) / 1048576.0, "%.1f")});
  if (r.json) {
    Json j = {{"command", "bench"}, {"op", "lmhead-ce"}, {"dtype", to_string(dtype)}, {"reps", reps},
              {"threads", threads}, {"Br", tiles.Br}, {"Bv", tiles.Bv}, {"verified", true},
              {"heap_counted", counting}};
    j["problems"] = Json::array();
    for (const LmHeadProblem& p : problems) j["problems"].push_back(shape_string(p));
    j["verify_shape"] = check_shape;
    j["verify"] = Json::array();
    for (const Result& x : checked) j["verify"].push_back(result_json(x));
    j["rows"] = t.json();
    std::printf("%s\n", j.dump(2).c_str());
    return kExitPass;
  }
  std::printf("burstlab bench --op lmhead-ce: %s, values=%s, threads=%d, Br=%lld Bv=%lld (cpu tiles), %s\n",
              to_string(dtype).c_str(), to_string(values).c_str(), threads, static_cast<long long>(tiles.Br),
              static_cast<long long>(tiles.Bv),
              reps > 1 ? format("best of %d after one warm-up", reps).c_str() : "one timed run, no warm-up");
  for (size_t k = 0; k < problems.size(); ++k)
    std::printf("  problem %s: verified against the fp64 oracle on %s\n", shape_string(problems[k]).c_str(),
                check_shape[k].c_str());
  result_table(checked, false, false).print(stdout);
  std::printf("\n");
  t.print(stdout);
  std::printf("\n");
  if (!counting) std::printf("peak extra heap: not measured (malloc interposition not in effect)\n");
  for (const LmHeadProblem& p : problems)
    std::printf("d=%lld: one N x V fp32 buffer is %.1f MiB; H is %.1f MiB and W %.1f MiB in %s\n",
                static_cast<long long>(p.d), double(p.N) * double(p.V) * 4 / 1048576.0,
                double(p.N) * double(p.d) * double(bytes_of(dtype)) / 1048576.0,
                double(p.V) * double(p.d) * double(bytes_of(dtype)) / 1048576.0, to_string(dtype).c_str());
  return kExitPass;
}

}  // namespace burstlab::tools
