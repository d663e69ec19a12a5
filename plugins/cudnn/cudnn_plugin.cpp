// plugins/cudnn/cudnn_plugin.cpp — an engine plug-in (include/burstlab/plugin.h) whose blocks run
// cuDNN's fused attention (SDPA through cudnn-frontend's graph API): forward blocks with cuDNN's
// softmax statistics as LSE, so the schedules merge its partials (eq. 4.5-4.7); backward blocks
// given the rows' global LSE and D, cuDNN's 16-bit block gradients accumulated into fp32. Memory,
// the mask, the merge and D run on burstlab's CUDA engine (cuda/cuda_engine.hpp): device memory,
// bf16 and fp16. A banded block is cut to the rows and keys that see each other, where the band
// is cuDNN's (bounds about a top-left or bottom-right diagonal); rows that see no key get the
// identity from the engine. Declined, with the reason: documents and block-sparse masks, indexed
// positions (burstlab then offers the block's contiguous parts), a window with more rows than
// keys, d not a multiple of 8 or above 256, non-unit innermost strides.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "burstlab/plugin.h"
#include "band.hpp"
#include "cuda_engine.hpp"
#include "cudnn_kernels.hpp"

#define BURSTLAB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using namespace burstlab;
namespace fe = cudnn_frontend;

// ---- status helpers: no exception crosses the C boundary
struct Declined {
  std::string why;
};
template <class F>
int guarded(burstlab_status* st, F&& f) {
  try {
    f();
    return BURSTLAB_OK;
  } catch (const Declined& d) {
    std::snprintf(st->message, sizeof st->message, "%s", d.why.c_str());
    return BURSTLAB_DECLINED;
  } catch (const std::exception& e) {
    std::snprintf(st->message, sizeof st->message, "%s", e.what());
  } catch (...) {
    std::snprintf(st->message, sizeof st->message, "unknown exception");
  }
  return BURSTLAB_ERROR;
}
[[noreturn]] void decline(const std::string& why) { throw Declined{why}; }
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check_fe(fe::error_t e, const char* what) {  // by value: get_message() is not const
  if (e.is_bad()) throw std::runtime_error(std::string("cudnn-frontend ") + what + ": " + e.get_message());
}

// ---- one plug-in engine: burstlab's CUDA engine of the dtype, and the buffers it handed out
struct Plugged {
  burstlab_dtype dtype;
  std::unique_ptr<Engine<bf16_t>> bf16;
  std::unique_ptr<Engine<f16_t>> f16;
  std::mutex m;
  std::unordered_map<void*, std::shared_ptr<void>> buffers;
};
template <class F>
void with_engine(void* engine, F&& f) {
  Plugged& c = *static_cast<Plugged*>(engine);
  if (c.dtype == BURSTLAB_BF16) f(*c.bf16);
  else f(*c.f16);
}
template <class T>
T storage_of(const Engine<T>&);
#define STORAGE(e) decltype(storage_of(e))

struct Prepared {
  MaskData host;
  PreparedMask engine;
};

Dtype of(burstlab_dtype t) { return static_cast<Dtype>(t); }
Problem problem_of(const burstlab_problem& c) {
  Problem p;
  p.B = c.B, p.H_q = c.H_q, p.H_kv = c.H_kv, p.N_q = c.N_q, p.N_k = c.N_k, p.d = c.d;
  p.scale = c.scale;
  return p;
}
MaskParams host_mask(const burstlab_mask& c) {
  MaskParams m;
  m.N_q = c.N_q, m.N_k = c.N_k, m.left = c.left, m.right = c.right;
  m.doc = reinterpret_cast<const RowDoc*>(c.doc);
  m.block = c.block;
  m.block_q = c.block_q, m.block_k = c.block_k, m.n_block_k = c.n_block_k;
  return m;
}
template <class U>
View4<U> view_of(const burstlab_view4& c) {
  View4<U> v;
  v.data = static_cast<U*>(c.data);
  for (int i = 0; i < 4; ++i) v.dim[i] = c.dim[i], v.stride[i] = c.stride[i];
  return v;
}
template <class U>
View3<U> view_of(const burstlab_view3& c) {
  View3<U> v;
  v.data = static_cast<U*>(c.data);
  for (int i = 0; i < 3; ++i) v.dim[i] = c.dim[i], v.stride[i] = c.stride[i];
  return v;
}

// Packed: (B, H, n, d) and (B, H, n) with row-major strides (a batch of one may have any stride[0]).
bool packed(const burstlab_view4& v) {
  const int64_t n = v.dim[2], d = v.dim[3];
  return v.stride[3] == 1 && v.stride[2] == d && v.stride[1] == n * d &&
         (v.dim[0] == 1 || v.stride[0] == v.dim[1] * n * d);
}
bool packed(const burstlab_view3& v) {
  return v.stride[2] == 1 && v.stride[1] == v.dim[2] && (v.dim[0] == 1 || v.stride[0] == v.dim[1] * v.dim[2]);
}

// Rows [at, at + n) of a (B, H, N, d) or (B, H, N) view of elements of `bytes` bytes.
burstlab_view4 rows(burstlab_view4 v, int64_t at, int64_t n, int64_t bytes) {
  v.data = static_cast<char*>(v.data) + at * v.stride[2] * bytes;
  v.dim[2] = n;
  return v;
}
burstlab_view3 rows(burstlab_view3 v, int64_t at, int64_t n) {
  v.data = static_cast<char*>(v.data) + at * v.stride[2] * int64_t(sizeof(float));
  v.dim[2] = n;
  return v;
}

// ---- what cuDNN runs, decided on the host from the call alone (band.hpp)
using cudnn_plugin::Band;

const char* refusal(burstlab_dtype t, const burstlab_problem& p, const burstlab_mask& m, bool indexed) {
  if (t != BURSTLAB_BF16 && t != BURSTLAB_F16) return "cuDNN's fused attention runs bf16 and fp16 here";
  if (p.d % 8 != 0 || p.d > 256) return "cuDNN's fused attention needs d a multiple of 8, at most 256";
  if (m.doc) return "document masks (segment ids) are not expressed to cuDNN by this plug-in";
  if (m.block) return "block-sparse masks are not expressed to cuDNN by this plug-in";
  if (indexed) return "indexed positions (a zigzag or striped shard that does not split into contiguous runs)";
  if (p.N_q > p.N_k && m.left >= 0)
    return "a window (left-bounded band) with more queries than keys (N_q > N_k): cuDNN runs such a band only with "
           "N_q <= N_k";
  return nullptr;
}

Band band_of(const burstlab_block& b) {
  const Band band = cudnn_plugin::band_of(host_mask(b.mask), b.q.start, b.q.n, b.k.start, b.k.n);
  if (!band.declined.empty()) decline(band.declined);
  return band;
}

// The block cut to band's rows and keys (both passes' views; positions contiguous).
burstlab_block cut(const burstlab_block& b, const Band& band) {
  const int64_t t = 2;  // bf16, fp16
  const int64_t a = int64_t(sizeof(float));
  burstlab_block c = b;
  c.q.start += band.q_at, c.q.n = band.q_n;
  c.k.start += band.k_at, c.k.n = band.k_n;
  c.Q = rows(b.Q, band.q_at, band.q_n, t), c.O = rows(b.O, band.q_at, band.q_n, t), c.dO = rows(b.dO, band.q_at, band.q_n, t);
  c.LSE = rows(b.LSE, band.q_at, band.q_n), c.D = rows(b.D, band.q_at, band.q_n);
  c.dQ = rows(b.dQ, band.q_at, band.q_n, a);
  c.K = rows(b.K, band.k_at, band.k_n, t), c.V = rows(b.V, band.k_at, band.k_n, t);
  c.dK = rows(b.dK, band.k_at, band.k_n, a), c.dV = rows(b.dV, band.k_at, band.k_n, a);
  return c;
}

// ---- cuDNN handles and graphs. A handle serves one thread at a time, and a plan is built for
// one handle: handles are leased from a pool per device and kept for the process, so the ranks'
// threads of every run reuse them and their cached graphs. Each call binds its handle to the
// calling thread's stream of the CUDA engine, so cuDNN runs in the engine's order, with no host
// wait; its workspace is scratch only that stream touches (cuda::scratch_of).
struct DeviceHandle {
  int device = 0;
  cudnnHandle_t handle = nullptr;
  DeviceHandle() {
    if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) throw std::runtime_error("cudnnCreate failed");
  }
  ~DeviceHandle() {
    if (handle) cudnnDestroy(handle);
  }
};
class Lease {
 public:
  Lease() {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    std::lock_guard<std::mutex> lock(mutex());
    for (auto it = free_list().begin(); it != free_list().end(); ++it)
      if ((*it)->device == device) {
        tc_ = *it;
        free_list().erase(it);
        return;
      }
    tc_ = new DeviceHandle();  // kept for the process
    tc_->device = device;
  }
  ~Lease() {
    std::lock_guard<std::mutex> lock(mutex());
    free_list().push_back(tc_);
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  // The handle, bound to stream s for this call.
  cudnnHandle_t on(cudaStream_t s) const {
    if (cudnnSetStream(tc_->handle, s) != CUDNN_STATUS_SUCCESS) throw std::runtime_error("cudnnSetStream failed");
    return tc_->handle;
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<DeviceHandle*>& free_list() {
    static std::vector<DeviceHandle*> v;
    return v;
  }
  DeviceHandle* tc_ = nullptr;
};

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

std::vector<int64_t> dims4(const burstlab_view4& v) { return {v.dim[0], v.dim[1], v.dim[2], v.dim[3]}; }
std::vector<int64_t> strides4(const burstlab_view4& v) { return {v.stride[0], v.stride[1], v.stride[2], v.stride[3]}; }

struct Forward {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

// The band of a block as cuDNN's attributes (forward and backward have the same setters).
template <class Attributes>
void set_band(Attributes& opts, const Band& band) {
  if (band.none) return;
  opts.set_diagonal_alignment(band.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT);
  if (band.right_bound >= 0) opts.set_diagonal_band_right_bound(static_cast<int>(band.right_bound));
  if (band.left_bound >= 0) opts.set_diagonal_band_left_bound(static_cast<int>(band.left_bound));
}

// A graph built once per key (device, shapes, strides, dtype, scale, band) and kept.
template <class Build>
std::shared_ptr<Forward> cached(const std::string& key, Build&& build) {
  static std::mutex m;
  static std::map<std::string, std::shared_ptr<Forward>> cache;
  std::lock_guard<std::mutex> lock(m);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::shared_ptr<Forward> f = build();
  cache.emplace(key, f);
  return f;
}
std::string key_of(const char* pass, cudnnHandle_t handle, const burstlab_block& b, const Band& band,
                   std::initializer_list<const burstlab_view4*> views, const burstlab_view3& rows) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::ostringstream key;
  key << pass << ' ' << device << ' ' << handle << ' ' << b.dtype << ' ' << b.problem.scale << ' ' << band.none << band.bottom_right
      << ' ' << band.left_bound << ' ' << band.right_bound;
  for (const burstlab_view4* v : views)
    for (int i = 0; i < 4; ++i) key << ' ' << v->dim[i] << ':' << v->stride[i];
  for (int i = 0; i < 3; ++i) key << ' ' << rows.dim[i] << ':' << rows.stride[i];
  return key.str();
}
void finish(fe::graph::Graph& g, cudnnHandle_t handle, Forward& f) {
  check_fe(g.validate(), "validate");
  check_fe(g.build_operation_graph(handle), "build_operation_graph");
  check_fe(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  fe::error_t supported = g.check_support(handle);
  if (supported.is_bad()) decline("cuDNN has no engine for this block: " + supported.get_message());
  check_fe(g.build_plans(handle), "build_plans");
  check_fe(g.get_workspace_size(f.workspace), "get_workspace_size");
}
std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const burstlab_view4& v) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims4(v)).set_stride(strides4(v)));
}
void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, const burstlab_view4& v) {
  t->set_output(true).set_uid(uid).set_dim(dims4(v)).set_stride(strides4(v));
}
std::vector<int64_t> stats_dims(const burstlab_view3& v) { return {v.dim[0], v.dim[1], v.dim[2], 1}; }
std::vector<int64_t> stats_strides(const burstlab_view3& v) { return {v.stride[0], v.stride[1], v.stride[2], 1}; }
void io_types(fe::graph::Graph& g, burstlab_dtype t) {
  g.set_io_data_type(t == BURSTLAB_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

// dQ, dK, dV of a block (cuDNN's SDPA backward) in T, from Q, K, V, dO, the rows' LSE and a
// stand-in O (surrogate_O) whose row sums with dO are the rows' D.
std::shared_ptr<Forward> backward_graph(const burstlab_block& b, const burstlab_view4& O, const burstlab_view4& dQ,
                                        const burstlab_view4& dK, const burstlab_view4& dV, const Band& band,
                                        cudnnHandle_t handle) {
  return cached(key_of("bwd", handle, b, band, {&b.Q, &b.K, &b.V, &O, &b.dO, &dQ, &dK, &dV}, b.LSE), [&] {
    auto f = std::make_shared<Forward>();
    f->graph = std::make_shared<fe::graph::Graph>();
    fe::graph::Graph& g = *f->graph;
    io_types(g, b.dtype);
    auto Q = input(g, "Q", kQ, b.Q), K = input(g, "K", kK, b.K), V = input(g, "V", kV, b.V);
    auto Ot = input(g, "O", kO, O), dOt = input(g, "dO", kdO, b.dO);
    auto Stats = g.tensor(fe::graph::Tensor_attributes()
                              .set_name("LSE")
                              .set_uid(kStats)
                              .set_dim(stats_dims(b.LSE))
                              .set_stride(stats_strides(b.LSE))
                              .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes().set_name("block_bwd").set_attn_scale(
        static_cast<float>(b.problem.scale));
    set_band(opts, band);
    auto [gQ, gK, gV] = g.sdpa_backward(Q, K, V, Ot, dOt, Stats, opts);
    output(gQ, kdQ, dQ);
    output(gK, kdK, dK);
    output(gV, kdV, dV);
    finish(g, handle, *f);
    return f;
  });
}

std::shared_ptr<Forward> forward_graph(const burstlab_block& b, const burstlab_view4& O, const burstlab_view3& LSE,
                                       const Band& band, cudnnHandle_t handle) {
  return cached(key_of("fwd", handle, b, band, {&b.Q, &b.K, &b.V, &O}, LSE), [&] {
    auto f = std::make_shared<Forward>();
    f->graph = std::make_shared<fe::graph::Graph>();
    fe::graph::Graph& g = *f->graph;
    io_types(g, b.dtype);
    auto Q = input(g, "Q", kQ, b.Q), K = input(g, "K", kK, b.K), V = input(g, "V", kV, b.V);
    auto opts = fe::graph::SDPA_attributes().set_name("block").set_generate_stats(true).set_attn_scale(
        static_cast<float>(b.problem.scale));
    set_band(opts, band);
    auto [Out, Stats] = g.sdpa(Q, K, V, opts);
    output(Out, kO, O);
    Stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims(LSE)).set_stride(
        stats_strides(LSE));
    finish(g, handle, *f);
    return f;
  });
}

// ---- the ABI
bool runs(burstlab_dtype t) { return t == BURSTLAB_BF16 || t == BURSTLAB_F16; }

int create(burstlab_dtype dtype, void** engine, burstlab_status* st) {
  return guarded(st, [&] {
    if (!runs(dtype)) decline("cuDNN's fused attention runs bf16 and fp16 here");
    auto c = std::make_unique<Plugged>();
    c->dtype = dtype;
    if (dtype == BURSTLAB_BF16) c->bf16 = cuda::make_engine<bf16_t>();
    else c->f16 = cuda::make_engine<f16_t>();
    *engine = c.release();
  });
}
void destroy(void* engine) { delete static_cast<Plugged*>(engine); }
int allocate(void* engine, int64_t bytes, void** ptr, burstlab_status* st) {
  return guarded(st, [&] {
    Plugged& c = *static_cast<Plugged*>(engine);
    std::shared_ptr<void> hold;
    with_engine(engine, [&](auto& e) { hold = e.allocate(bytes); });
    *ptr = hold.get();
    std::lock_guard<std::mutex> lock(c.m);
    c.buffers[*ptr] = std::move(hold);
  });
}
void release_memory(void* engine, void* ptr) {
  Plugged& c = *static_cast<Plugged*>(engine);
  std::shared_ptr<void> hold;
  std::lock_guard<std::mutex> lock(c.m);
  auto it = c.buffers.find(ptr);
  if (it == c.buffers.end()) return;
  hold = std::move(it->second);
  c.buffers.erase(it);
}
int upload(void* engine, void* dst, const void* host, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { with_engine(engine, [&](auto& e) { e.upload(dst, host, bytes); }); });
}
int download(void* engine, void* host, const void* src, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { with_engine(engine, [&](auto& e) { e.download(host, src, bytes); }); });
}
int copy(void* engine, void* dst, const void* src, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { with_engine(engine, [&](auto& e) { e.copy(dst, src, bytes); }); });
}
int fill(void* engine, void* dst, int64_t n, burstlab_dtype t, double value, burstlab_status* st) {
  return guarded(st, [&] { with_engine(engine, [&](auto& e) { e.fill(dst, n, of(t), value); }); });
}
int add(void* engine, void* acc, const void* in, int64_t n, burstlab_dtype t, burstlab_status* st) {
  return guarded(st, [&] { with_engine(engine, [&](auto& e) { e.add(acc, in, n, of(t)); }); });
}
int synchronize(void* engine, burstlab_status* st) {
  return guarded(st, [&] { with_engine(engine, [&](auto& e) { e.synchronize(); }); });
}
int prepare(void* engine, const burstlab_mask* mask, void** prepared, burstlab_status* st) {
  return guarded(st, [&] {
    auto pr = std::make_unique<Prepared>();
    pr->host.base = host_mask(*mask);
    pr->host.base.doc = nullptr;
    pr->host.base.block = nullptr;
    if (mask->doc)
      pr->host.doc.assign(reinterpret_cast<const RowDoc*>(mask->doc), reinterpret_cast<const RowDoc*>(mask->doc) + mask->N_q);
    if (mask->block)
      pr->host.block.assign(mask->block, mask->block + (mask->N_q + mask->block_q - 1) / mask->block_q * mask->n_block_k);
    with_engine(engine, [&](auto& e) { pr->engine = e.prepare(pr->host); });
    *prepared = pr.release();
  });
}
void release(void*, void* prepared) { delete static_cast<Prepared*>(prepared); }

// One block through cuDNN into (O, LSE), or into scratch merged into them when accumulating.
int forward_block(void* engine, const burstlab_block* b, int accumulate, burstlab_status* st) {
  return guarded(st, [&] {
    if (const char* why = refusal(b->dtype, b->problem, b->mask, b->q.index || b->k.index)) decline(why);
    for (const burstlab_view4* v : {&b->Q, &b->K, &b->V, &b->O})
      if (v->stride[3] != 1) decline("cuDNN needs unit stride along d");
    const Band band = band_of(*b);
    with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      // Rows that see no key get the identity from the engine (or keep theirs when accumulating).
      const auto identity = [&](int64_t at, int64_t n) {
        if (n == 0 || accumulate) return;
        const Prepared& pr = *static_cast<const Prepared*>(b->prepared);
        PreparedMask m = pr.engine;
        const MaskParams call = host_mask(b->mask);
        m.params.N_q = call.N_q, m.params.N_k = call.N_k, m.params.left = call.left, m.params.right = call.right;
        e.forward_block(problem_of(b->problem), m, Positions{b->q.start + at, n, nullptr},
                        Positions{b->k.start, b->k.n, nullptr}, view_of<const T>(rows(b->Q, at, n, 2)),
                        view_of<const T>(b->K), view_of<const T>(b->V), view_of<T>(rows(b->O, at, n, 2)),
                        view_of<float>(rows(b->LSE, at, n)), false);
      };
      if (band.hidden) return identity(0, b->q.n);
      const burstlab_block c = cut(*b, band);
      const Lease lease;
      const auto stream = static_cast<cudaStream_t>(cuda::stream_of(e));
      const cudnnHandle_t handle = lease.on(stream);
      // cuDNN writes its output packed, (B, H_q, n, d) and (B, H_q, n): straight into the
      // caller's O and LSE when they are packed and nothing is merged, else into scratch that is
      // merged into them (accumulate) or copied into their strides (a slice of a longer shard).
      const bool direct = !accumulate && packed(c.O) && packed(c.LSE);
      burstlab_view4 O = c.O;
      burstlab_view3 LSE = c.LSE;
      std::shared_ptr<void> o_part, l_part;
      if (!direct) {
        const int64_t Bn = c.O.dim[0], H = c.O.dim[1], n = c.O.dim[2], d = c.O.dim[3];
        o_part = cuda::scratch_of(e, Bn * H * n * d * int64_t(sizeof(T)));
        l_part = cuda::scratch_of(e, Bn * H * n * int64_t(sizeof(float)));
        O = burstlab_view4{o_part.get(), {Bn, H, n, d}, {H * n * d, n * d, d, 1}};
        LSE = burstlab_view3{l_part.get(), {Bn, H, n}, {H * n, n, 1}};
      }
      const std::shared_ptr<Forward> f = forward_graph(c, O, LSE, band, handle);  // may decline: nothing written yet
      identity(0, band.q_at);
      identity(band.q_at + band.q_n, b->q.n - band.q_at - band.q_n);
      std::unordered_map<int64_t, void*> pack = {
          {kQ, c.Q.data}, {kK, c.K.data}, {kV, c.V.data}, {kO, O.data}, {kStats, LSE.data}};
      const std::shared_ptr<void> workspace = cuda::scratch_of(e, f->workspace);
      check_fe(f->graph->execute(handle, pack, workspace.get()), "execute");
      if (accumulate)
        e.merge(view_of<T>(c.O), view_of<float>(c.LSE), view_of<const T>(O), view_of<const float>(LSE));
      else if (!direct)
        cudnn_plugin::copy_rows(c.dtype, c.O, O, c.LSE, LSE, stream);
    });
  });
}
int merge(void* engine, burstlab_dtype, burstlab_view4 O, burstlab_view3 LSE, burstlab_view4 O_part,
          burstlab_view3 LSE_part, burstlab_status* st) {
  return guarded(st, [&] {
    with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      e.merge(view_of<T>(O), view_of<float>(LSE), view_of<const T>(O_part), view_of<const float>(LSE_part));
    });
  });
}
int compute_D(void* engine, burstlab_dtype, burstlab_view4 O, burstlab_view4 dO, burstlab_view3 D, burstlab_status* st) {
  return guarded(st, [&] {
    with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      e.compute_D(view_of<const T>(O), view_of<const T>(dO), view_of<float>(D));
    });
  });
}
// The block's dQ, dK, dV from cuDNN in T (scratch), then added to the caller's fp32 ones.
int backward_block(void* engine, const burstlab_block* b, burstlab_status* st) {
  return guarded(st, [&] {
    if (const char* why = refusal(b->dtype, b->problem, b->mask, b->q.index || b->k.index)) decline(why);
    for (const burstlab_view4* v : {&b->Q, &b->K, &b->V, &b->dO})
      if (v->stride[3] != 1) decline("cuDNN needs unit stride along d");
    const Band band = band_of(*b);
    if (band.hidden) return;  // no pair visible: nothing to add
    with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      const burstlab_block c = cut(*b, band);  // rows and keys outside see nothing: they add nothing
      const Lease lease;
      const auto stream = static_cast<cudaStream_t>(cuda::stream_of(e));
      const cudnnHandle_t handle = lease.on(stream);
      const int64_t Bn = c.problem.B, Hq = c.problem.H_q, Hkv = c.problem.H_kv, d = c.problem.d;
      const int64_t nq = c.q.n, nk = c.k.n;
      const auto scratch = [&](int64_t H, int64_t n, std::shared_ptr<void>& hold) {
        hold = cuda::scratch_of(e, Bn * H * n * d * int64_t(sizeof(T)));
        return burstlab_view4{hold.get(), {Bn, H, n, d}, {H * n * d, n * d, d, 1}};
      };
      std::shared_ptr<void> o_hold, q_hold, k_hold, v_hold;
      const burstlab_view4 O = scratch(Hq, nq, o_hold), dQ = scratch(Hq, nq, q_hold);
      const burstlab_view4 dK = scratch(Hkv, nk, k_hold), dV = scratch(Hkv, nk, v_hold);
      // cuDNN before 9.26 takes the backward's statistics only as a packed (B, H, n) tensor; a
      // block cut from a longer shard (block_split.hpp) has the shard's row strides.
      burstlab_block call = c;
      std::shared_ptr<void> lse_hold;
      const burstlab_view3& L = c.LSE;
      if (L.stride[2] != 1) decline("cuDNN needs unit stride along the rows of LSE");
      if (!packed(L)) {
        lse_hold = cuda::scratch_of(e, Bn * Hq * nq * int64_t(sizeof(float)));
        call.LSE = burstlab_view3{lse_hold.get(), {Bn, Hq, nq}, {Hq * nq, nq, 1}};
      }
      const std::shared_ptr<Forward> f = backward_graph(call, O, dQ, dK, dV, band, handle);
      if (lse_hold)
        for (int64_t i = 0; i < Bn; ++i)
          check_cuda(cudaMemcpy2DAsync(static_cast<float*>(lse_hold.get()) + i * Hq * nq, size_t(nq) * sizeof(float),
                                       static_cast<const float*>(L.data) + i * L.stride[0],
                                       size_t(L.stride[1]) * sizeof(float), size_t(nq) * sizeof(float), size_t(Hq),
                                       cudaMemcpyDeviceToDevice, stream),
                     "cudaMemcpy2DAsync (LSE)");
      cudnn_plugin::surrogate_O(c.dtype, c.dO, c.D, O, stream);
      std::unordered_map<int64_t, void*> pack = {{kQ, c.Q.data},  {kK, c.K.data},   {kV, c.V.data},
                                                 {kO, O.data},     {kdO, c.dO.data}, {kStats, call.LSE.data},
                                                 {kdQ, dQ.data},   {kdK, dK.data},    {kdV, dV.data}};
      const std::shared_ptr<void> workspace = cuda::scratch_of(e, f->workspace);
      check_fe(f->graph->execute(handle, pack, workspace.get()), "execute");
      cudnn_plugin::accumulate(c.dtype, c.dQ, dQ, stream);
      cudnn_plugin::accumulate(c.dtype, c.dK, dK, stream);
      cudnn_plugin::accumulate(c.dtype, c.dV, dV, stream);
    });
  });
}
int supports(const burstlab_query* q, burstlab_status* st) {
  return guarded(st, [&] {
    if (const char* why = refusal(q->dtype, q->problem, q->mask, q->q_indexed || q->k_indexed)) decline(why);
    std::string why;
    if (!cuda::gpu_available(&why)) decline("no usable GPU: " + why);
  });
}
int transport_copy(void* dst, const void* src, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { cuda::transport_copy(dst, src, bytes); });
}
int transport_poison(void* dst, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { cuda::transport_poison(dst, bytes); });
}

burstlab_api_v1 make_table() {
  burstlab_api_v1 t;
  std::memset(&t, 0, sizeof t);
  t.abi_version = BURSTLAB_PLUGIN_ABI_VERSION;
  t.name = "cudnn";
  t.about = "cuDNN fused attention (cudnn-frontend SDPA) blocks; burstlab's CUDA engine for memory, merge and D";
  t.dtypes = (1u << BURSTLAB_BF16) | (1u << BURSTLAB_F16);
  t.memory = BURSTLAB_MEMORY_DEVICE;
  t.create = create;
  t.destroy = destroy;
  t.allocate = allocate;
  t.release_memory = release_memory;
  t.upload = upload;
  t.download = download;
  t.copy = copy;
  t.fill = fill;
  t.add = add;
  t.synchronize = synchronize;
  t.prepare = prepare;
  t.release = release;
  t.forward_block = forward_block;
  t.merge = merge;
  t.compute_D = compute_D;
  t.backward_block = backward_block;
  t.supports = supports;
  t.transport_copy = transport_copy;
  t.transport_poison = transport_poison;
  return t;
}

}  // namespace

BURSTLAB_EXPORT const burstlab_api_v1* burstlab_plugin_v1(const burstlab_host_v1*) {
  static const burstlab_api_v1 table = make_table();
  return &table;
}
