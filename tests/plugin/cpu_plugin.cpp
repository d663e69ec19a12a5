// tests/plugin/cpu_plugin.cpp — an engine plug-in (include/burstlab/plugin.h) over the project's
// own CPU engine (cpu/cpu_engine.hpp), built as a shared library: the proof that the ABI carries
// every Engine call, and the template for writing one. fp64 and fp32, host memory.
// Test builds (compile definitions) exercise burstlab's side of failures:
//   BURSTLAB_TEST_DECLINE_DOCUMENT   declines document masks (in supports and in every block)
//   BURSTLAB_TEST_DECLINE_INDEXED    declines blocks whose positions are indexed (zigzag, striped)
//   BURSTLAB_TEST_ABI_VERSION=n      reports ABI version n
//   BURSTLAB_TEST_NO_ENTRY           exports no entry point
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>

#include "burstlab/plugin.h"
#include "cpu_engine.hpp"

#define BURSTLAB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using namespace burstlab;

struct CpuPlugin {
  burstlab_dtype dtype;
  std::unique_ptr<Engine<double>> f64;
  std::unique_ptr<Engine<float>> f32;
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
  CpuPlugin& c = *static_cast<CpuPlugin*>(engine);
  if (c.dtype == BURSTLAB_F64) f(*c.f64);
  else f(*c.f32);
  return BURSTLAB_OK;
}

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
MaskParams mask_of(const burstlab_mask& c) {
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

int create(burstlab_dtype dtype, void** engine, burstlab_status* st) {
  return guarded(st, [&] {
    if (dtype != BURSTLAB_F64 && dtype != BURSTLAB_F32) return decline(st, "dtype is not fp64 or fp32");
    auto c = std::make_unique<CpuPlugin>();
    c->dtype = dtype;
    if (dtype == BURSTLAB_F64) c->f64 = cpu::make_engine<double>();
    else c->f32 = cpu::make_engine<float>();
    *engine = c.release();
    return int(BURSTLAB_OK);
  });
}
void destroy(void* engine) { delete static_cast<CpuPlugin*>(engine); }

int allocate(void*, int64_t bytes, void** ptr, burstlab_status* st) {
  return guarded(st, [&] {
    const size_t n = static_cast<size_t>((bytes > 0 ? bytes : 1) + 63) / 64;
    *ptr = ::operator new[](n * 64, std::align_val_t(64));
    return int(BURSTLAB_OK);
  });
}
void release_memory(void*, void* ptr) { ::operator delete[](ptr, std::align_val_t(64)); }
int memcopy(void*, void* dst, const void* src, int64_t bytes, burstlab_status*) {
  std::memmove(dst, src, static_cast<size_t>(bytes));
  return BURSTLAB_OK;
}
int upload(void* e, void* dst, const void* host, int64_t bytes, burstlab_status* st) { return memcopy(e, dst, host, bytes, st); }
int download(void* e, void* host, const void* src, int64_t bytes, burstlab_status* st) { return memcopy(e, host, src, bytes, st); }
int fill(void* engine, void* dst, int64_t n, burstlab_dtype t, double value, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.fill(dst, n, of(t), value); }); });
}
int add(void* engine, void* acc, const void* in, int64_t n, burstlab_dtype t, burstlab_status* st) {
  return guarded(st, [&] { return with_engine(engine, [&](auto& e) { e.add(acc, in, n, of(t)); }); });
}

// The CPU engine reads the mask from the call (mask_of); nothing to place.
int prepare(void*, const burstlab_mask*, void** prepared, burstlab_status*) {
  static int token;
  *prepared = &token;
  return BURSTLAB_OK;
}
void release(void*, void*) {}

int forward_block(void* engine, const burstlab_block* b, int accumulate, burstlab_status* st) {
  if (const char* why = refusal(b->mask, b->q.index != nullptr, b->k.index != nullptr)) return decline(st, why);
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = typename std::remove_reference_t<decltype(e)>::A;  // A == T for fp64, fp32
      PreparedMask m;
      m.params = mask_of(b->mask);
      e.forward_block(problem_of(b->problem), m, positions_of(b->q), positions_of(b->k), view_of<const T>(b->Q),
                      view_of<const T>(b->K), view_of<const T>(b->V), view_of<T>(b->O), view_of<T>(b->LSE),
                      accumulate != 0);
    });
  });
}
int merge(void* engine, burstlab_dtype, burstlab_view4 O, burstlab_view3 LSE, burstlab_view4 O_part,
          burstlab_view3 LSE_part, burstlab_status* st) {
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = typename std::remove_reference_t<decltype(e)>::A;
      e.merge(view_of<T>(O), view_of<T>(LSE), view_of<const T>(O_part), view_of<const T>(LSE_part));
    });
  });
}
int compute_D(void* engine, burstlab_dtype, burstlab_view4 O, burstlab_view4 dO, burstlab_view3 D, burstlab_status* st) {
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = typename std::remove_reference_t<decltype(e)>::A;
      e.compute_D(view_of<const T>(O), view_of<const T>(dO), view_of<T>(D));
    });
  });
}
int backward_block(void* engine, const burstlab_block* b, burstlab_status* st) {
  if (const char* why = refusal(b->mask, b->q.index != nullptr, b->k.index != nullptr)) return decline(st, why);
  return guarded(st, [&] {
    return with_engine(engine, [&](auto& e) {
      using T = typename std::remove_reference_t<decltype(e)>::A;
      PreparedMask m;
      m.params = mask_of(b->mask);
      e.backward_block(problem_of(b->problem), m, positions_of(b->q), positions_of(b->k), view_of<const T>(b->Q),
                       view_of<const T>(b->K), view_of<const T>(b->V), view_of<const T>(b->dO),
                       view_of<const T>(b->LSE), view_of<const T>(b->D), view_of<T>(b->dQ), view_of<T>(b->dK),
                       view_of<T>(b->dV));
    });
  });
}
int supports(const burstlab_query* q, burstlab_status* st) {
  if (q->dtype != BURSTLAB_F64 && q->dtype != BURSTLAB_F32) return decline(st, "dtype is not fp64 or fp32");
  if (const char* why = refusal(q->mask, q->q_indexed != 0, q->k_indexed != 0)) return decline(st, why);
  return BURSTLAB_OK;
}

burstlab_api_v1 make_table() {
  burstlab_api_v1 t;
  std::memset(&t, 0, sizeof t);
#ifdef BURSTLAB_TEST_ABI_VERSION
  t.abi_version = BURSTLAB_TEST_ABI_VERSION;
#else
  t.abi_version = BURSTLAB_PLUGIN_ABI_VERSION;
#endif
  t.name = "cpu-example";
  t.about = "the project's CPU engine (cpu/) behind the C ABI";
  t.dtypes = (1u << BURSTLAB_F64) | (1u << BURSTLAB_F32);
  t.memory = BURSTLAB_MEMORY_HOST;
  t.create = create;
  t.destroy = destroy;
  t.allocate = allocate;
  t.release_memory = release_memory;
  t.upload = upload;
  t.download = download;
  t.copy = memcopy;
  t.fill = fill;
  t.add = add;
  t.synchronize = nullptr;  // every call completes before it returns
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
BURSTLAB_EXPORT int burstlab_not_a_plugin() { return 0; }
#endif
