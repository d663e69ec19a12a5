// tests/plugin/engine_plugin.cpp — an engine plug-in (include/burstlab/plugin.h) over one of the
// project's own engines, built as a shared library: the proof that the ABI carries every Engine
// call, and the template for writing one. By default the CPU engine (cpu/cpu_engine.hpp: fp64,
// fp32, host memory); with BURSTLAB_TEST_PLUGIN_CUDA the CUDA engine (cuda/cuda_engine.hpp: every
// dtype, device memory, the transport's copies), which takes the device path of SimComm and NCCL.
// Test builds (compile definitions) exercise burstlab's side of failures:
//   BURSTLAB_TEST_DECLINE_DOCUMENT   declines document masks (in supports and in every block)
//   BURSTLAB_TEST_DECLINE_INDEXED    declines blocks whose positions are indexed (zigzag, striped)
//   BURSTLAB_TEST_NO_BACKWARD        declines every backward (supports and backward_block)
//   BURSTLAB_TEST_ABI_VERSION=n      reports ABI version n
//   BURSTLAB_TEST_NO_ENTRY           exports no entry point
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "burstlab/plugin.h"
#ifdef BURSTLAB_TEST_PLUGIN_CUDA
#include "cuda_engine.hpp"
#else
#include "cpu_engine.hpp"
#endif

#define BURSTLAB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using namespace burstlab;

#ifdef BURSTLAB_TEST_PLUGIN_CUDA
constexpr uint32_t kDtypes = (1u << BURSTLAB_F64) | (1u << BURSTLAB_F32) | (1u << BURSTLAB_BF16) | (1u << BURSTLAB_F16);
template <class T>
std::unique_ptr<Engine<T>> make() { return cuda::make_engine<T>(); }
#else
constexpr uint32_t kDtypes = (1u << BURSTLAB_F64) | (1u << BURSTLAB_F32);
template <class T>
std::unique_ptr<Engine<T>> make() {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) return cpu::make_engine<T>();
  else return nullptr;
}
#endif

// One plug-in engine: the project's engine of its dtype, and the buffers it handed out (the
// Engine owns memory through shared_ptr; the ABI through raw pointers).
struct Plugged {
  burstlab_dtype dtype;
  std::unique_ptr<Engine<double>> f64;
  std::unique_ptr<Engine<float>> f32;
  std::unique_ptr<Engine<bf16_t>> bf16;
  std::unique_ptr<Engine<f16_t>> f16;
  std::mutex m;
  std::unordered_map<void*, std::shared_ptr<void>> buffers;
};

// The prepared mask: the engine's own (its arrays in engine memory) and the host arrays it came
// from, to tell a call's doc/block pointers (host) apart.
struct Prepared {
  MaskData host;
  PreparedMask engine;
};

// Catches everything: no exception crosses the C boundary.
template <class F>
int guarded(burstlab_status* st, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::snprintf(st->message, sizeof st->message, "%s", e.what());
  } catch (...) {
    std::snprintf(st->message, sizeof st->message, "unknown exception");
  }
  return BURSTLAB_ERROR;
}
int decline(burstlab_status* st, const char* why) {
  std::snprintf(st->message, sizeof st->message, "%s", why);
  return BURSTLAB_DECLINED;
}

// Calls f with the engine of the plug-in engine's dtype.
template <class F>
int with_engine(void* engine, F&& f) {
  Plugged& c = *static_cast<Plugged*>(engine);
  switch (c.dtype) {
    case BURSTLAB_F64: f(*c.f64); break;
    case BURSTLAB_F32: f(*c.f32); break;
    case BURSTLAB_BF16: f(*c.bf16); break;
    case BURSTLAB_F16: f(*c.f16); break;
  }
  return BURSTLAB_OK;
}
template <class T>
T storage_of(const Engine<T>&);  // the storage type of an engine, in decltype only
#define STORAGE(e) decltype(storage_of(e))

Dtype of(burstlab_dtype t) { return static_cast<Dtype>(t); }  // the same order (plugin.h)

Problem problem_of(const burstlab_problem& c) {
  Problem p;
  p.B = c.B;
  p.H_q = c.H_q;
  p.H_kv = c.H_kv;
  p.N_q = c.N_q;
  p.N_k = c.N_k;
  p.d = c.d;
  p.scale = c.scale;
  return p;
}
// A block's problem, with a MaskSpec that has the parts the call's compiled mask has (band,
// documents, block-sparse tiles): the CUDA engine checks that the two agree. The compiled arrays,
// not this spec, decide visibility.
Problem problem_of(const burstlab_block& b) {
  Problem p = problem_of(b.problem);
  const burstlab_mask& m = b.mask;
  p.mask.window_left = m.left;
  p.mask.window_right = m.right;
  if (m.doc) {
    p.mask.q_segment.assign(size_t(m.N_q), 0);
    p.mask.k_segment.assign(size_t(m.N_k), 0);
  }
  if (m.block) {
    p.mask.block_q = m.block_q;
    p.mask.block_k = m.block_k;
    p.mask.block_mask.assign(size_t((m.N_q + m.block_q - 1) / m.block_q * m.n_block_k), 1);
  }
  return p;
}
MaskParams mask_of_host(const burstlab_mask& c) {
  MaskParams m;
  m.N_q = c.N_q;
  m.N_k = c.N_k;
  m.left = c.left;
  m.right = c.right;
  m.doc = reinterpret_cast<const RowDoc*>(c.doc);
  m.block = c.block;
  m.block_q = c.block_q;
  m.block_k = c.block_k;
  m.n_block_k = c.n_block_k;
  return m;
}
// The call's mask in the engine's memory: its band and extents, the prepared arrays (a call's
// doc/block are the prepared host arrays, plugin.h).
PreparedMask mask_of(const burstlab_block& b) {
  const Prepared& pr = *static_cast<const Prepared*>(b.prepared);
  PreparedMask m = pr.engine;
  const MaskParams call = mask_of_host(b.mask);
  m.params.N_q = call.N_q;
  m.params.N_k = call.N_k;
  m.params.left = call.left;
  m.params.right = call.right;
  if (!call.doc) m.params.doc = nullptr;
  if (!call.block) m.params.block = nullptr;
  return m;
}
Positions positions_of(const burstlab_positions& c) { return Positions{c.start, c.n, c.index}; }
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

// What this build runs; nullptr when it runs the call.
const char* refusal(const burstlab_mask& m, bool q_indexed, bool k_indexed) {
#ifdef BURSTLAB_TEST_DECLINE_DOCUMENT
  if (m.doc) return "document masks (segment ids) are not supported by this build";
#endif
#ifdef BURSTLAB_TEST_DECLINE_INDEXED
  if (q_indexed || k_indexed) return "indexed positions (a zigzag or striped shard) are not supported by this build";
#endif
  (void)m, (void)q_indexed, (void)k_indexed;
  return nullptr;
}

bool runs(burstlab_dtype t) { return (kDtypes >> t) & 1u; }

int create(burstlab_dtype dtype, void** engine, burstlab_status* st) {
  return guarded(st, [&] {
    if (!runs(dtype)) return decline(st, "this build does not run that dtype");
    auto c = std::make_unique<Plugged>();
    c->dtype = dtype;
    switch (dtype) {
      case BURSTLAB_F64: c->f64 = make<double>(); break;
      case BURSTLAB_F32: c->f32 = make<float>(); break;
      case BURSTLAB_BF16: c->bf16 = make<bf16_t>(); break;
      case BURSTLAB_F16: c->f16 = make<f16_t>(); break;
    }
    *engine = c.release();
    return int(BURSTLAB_OK);
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
    return int(BURSTLAB_OK);
  });
}
void release_memory(void* engine, void* ptr) {
  Plugged& c = *static_cast<Plugged*>(engine);
  std::shared_ptr<void> hold;  // freed outside the lock
  std::lock_guard<std::mutex> lock(c.m);
  auto it = c.buffers.find(ptr);
  if (it == c.buffers.end()) return;
  hold = std::move(it->second);
  c.buffers.erase(it);
}
int upload(void* engine, void* dst, const void* host, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.upload(dst, host, bytes); }); });
}
int download(void* engine, void* host, const void* src, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.download(host, src, bytes); }); });
}
int copy(void* engine, void* dst, const void* src, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.copy(dst, src, bytes); }); });
}
int fill(void* engine, void* dst, int64_t n, burstlab_dtype t, double value, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.fill(dst, n, of(t), value); }); });
}
int add(void* engine, void* acc, const void* in, int64_t n, burstlab_dtype t, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.add(acc, in, n, of(t)); }); });
}
int synchronize(void* engine, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.synchronize(); }); });
}

// The engine places the mask (the CUDA engine: on the device) from a MaskData rebuilt from the
// host arrays.
int prepare(void* engine, const burstlab_mask* mask, void** prepared, burstlab_status* st) {
  return guarded(st, [&] {
    auto pr = std::make_unique<Prepared>();
    pr->host.base = mask_of_host(*mask);
    pr->host.base.doc = nullptr;
    pr->host.base.block = nullptr;
    if (mask->doc) pr->host.doc.assign(reinterpret_cast<const RowDoc*>(mask->doc), reinterpret_cast<const RowDoc*>(mask->doc) + mask->N_q);
    if (mask->block) {
      const int64_t rows = (mask->N_q + mask->block_q - 1) / mask->block_q;
      pr->host.block.assign(mask->block, mask->block + rows * mask->n_block_k);
    }
    with_engine(engine, [&](auto& e) { pr->engine = e.prepare(pr->host); });
    *prepared = pr.release();
    return int(BURSTLAB_OK);
  });
}
void release(void*, void* prepared) { delete static_cast<Prepared*>(prepared); }

int forward_block(void* engine, const burstlab_block* b, int accumulate, burstlab_status* st) {
  if (const char* why = refusal(b->mask, b->q.index != nullptr, b->k.index != nullptr)) return decline(st, why);
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      using A = acc_t<T>;
      e.forward_block(problem_of(*b), mask_of(*b), positions_of(b->q), positions_of(b->k),
                      view_of<const T>(b->Q), view_of<const T>(b->K), view_of<const T>(b->V), view_of<T>(b->O),
                      view_of<A>(b->LSE), accumulate != 0);
    });
  });
}
int merge(void* engine, burstlab_dtype, burstlab_view4 O, burstlab_view3 LSE, burstlab_view4 O_part,
          burstlab_view3 LSE_part, burstlab_status* st) {
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      using A = acc_t<T>;
      e.merge(view_of<T>(O), view_of<A>(LSE), view_of<const T>(O_part), view_of<const A>(LSE_part));
    });
  });
}
int compute_D(void* engine, burstlab_dtype, burstlab_view4 O, burstlab_view4 dO, burstlab_view3 D, burstlab_status* st) {
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      e.compute_D(view_of<const T>(O), view_of<const T>(dO), view_of<acc_t<T>>(D));
    });
  });
}
int backward_block(void* engine, const burstlab_block* b, burstlab_status* st) {
#ifdef BURSTLAB_TEST_NO_BACKWARD
  return decline(st, "this build has no backward");
#endif
  if (const char* why = refusal(b->mask, b->q.index != nullptr, b->k.index != nullptr)) return decline(st, why);
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = STORAGE(e);
      using A = acc_t<T>;
      e.backward_block(problem_of(*b), mask_of(*b), positions_of(b->q), positions_of(b->k),
                       view_of<const T>(b->Q), view_of<const T>(b->K), view_of<const T>(b->V),
                       view_of<const T>(b->dO), view_of<const A>(b->LSE), view_of<const A>(b->D), view_of<A>(b->dQ),
                       view_of<A>(b->dK), view_of<A>(b->dV));
    });
  });
}
int supports(const burstlab_query* q, burstlab_status* st) {
  if (!runs(q->dtype)) return decline(st, "this build does not run that dtype");
#ifdef BURSTLAB_TEST_NO_BACKWARD
  if (q->pass == BURSTLAB_PASS_BACKWARD) return decline(st, "this build has no backward");
#endif
#ifdef BURSTLAB_TEST_PLUGIN_CUDA
  std::string why;
  if (!cuda::gpu_available(&why)) return decline(st, ("no usable GPU: " + why).c_str());
#endif
  if (const char* why = refusal(q->mask, q->q_indexed != 0, q->k_indexed != 0)) return decline(st, why);
  return BURSTLAB_OK;
}

#ifdef BURSTLAB_TEST_PLUGIN_CUDA
int transport_copy(void* dst, const void* src, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] {
    cuda::transport_copy(dst, src, bytes);
    return int(BURSTLAB_OK);
  });
}
int transport_poison(void* dst, int64_t bytes, burstlab_status* st) {
  return guarded(st, [&] {
    cuda::transport_poison(dst, bytes);
    return int(BURSTLAB_OK);
  });
}
#endif

burstlab_api_v1 make_table() {
  burstlab_api_v1 t;
  std::memset(&t, 0, sizeof t);
#ifdef BURSTLAB_TEST_ABI_VERSION
  t.abi_version = BURSTLAB_TEST_ABI_VERSION;
#else
  t.abi_version = BURSTLAB_PLUGIN_ABI_VERSION;
#endif
#ifdef BURSTLAB_TEST_PLUGIN_CUDA
  t.name = "cuda-example";
  t.about = "the project's CUDA engine (cuda/) behind the C ABI";
  t.memory = BURSTLAB_MEMORY_DEVICE;
  t.transport_copy = transport_copy;
  t.transport_poison = transport_poison;
#else
  t.name = "cpu-example";
  t.about = "the project's CPU engine (cpu/) behind the C ABI";
  t.memory = BURSTLAB_MEMORY_HOST;
#endif
  t.dtypes = kDtypes;
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
  return t;
}

}  // namespace

#ifndef BURSTLAB_TEST_NO_ENTRY
BURSTLAB_EXPORT const burstlab_api_v1* burstlab_plugin_v1(const burstlab_host_v1* host) {
  (void)host;  // a plug-in built for this ABI needs nothing more of its host
  static const burstlab_api_v1 table = make_table();
  return &table;
}
#else
BURSTLAB_EXPORT int burstlab_not_a_plugin() { return make_table().abi_version != 0; }  // the table, under another name
#endif
