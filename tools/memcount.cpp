// tools/memcount.cpp — see memcount.hpp. Forwarding to glibc's __libc_* entry points keeps the
// allocator itself unchanged; only two relaxed atomics are added per call.
#include "memcount.hpp"

#include <cstdlib>
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// glibc without a sanitizer (sanitizers interpose malloc themselves): count.
#define BURSTLAB_MEMCOUNT 1
#endif

#ifdef BURSTLAB_MEMCOUNT
#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

inline void count_alloc(void* p) {
  if (!p) return;
  const int64_t n = static_cast<int64_t>(malloc_usable_size(p));
  const int64_t live = g_live.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}
inline void count_free(void* p) {
  if (p) g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
}
}  // namespace

extern "C" {
void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  count_alloc(p);
  return p;
}
void* calloc(size_t n, size_t size) {
  void* p = __libc_calloc(n, size);
  count_alloc(p);
  return p;
}
void* realloc(void* old, size_t n) {
  count_free(old);
  void* p = __libc_realloc(old, n);
  if (p)
    count_alloc(p);
  else if (n != 0)
    count_alloc(old);  // failed: the old block is still live
  return p;
}
void free(void* p) {
  count_free(p);
  __libc_free(p);
}
void* memalign(size_t align, size_t n) {
  void* p = __libc_memalign(align, n);
  count_alloc(p);
  return p;
}
void* aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
int posix_memalign(void** out, size_t align, size_t n) {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  void* p = memalign(align, n);
  if (!p && n != 0) return ENOMEM;
  *out = p;
  return 0;
}
}

#endif  // BURSTLAB_MEMCOUNT

namespace burstlab::tools {
#ifndef BURSTLAB_MEMCOUNT
int64_t heap_live() { return 0; }
int64_t heap_peak() { return 0; }
void heap_reset_peak() {}
bool heap_counting() { return false; }
#else
int64_t heap_live() { return g_live.load(std::memory_order_relaxed); }
int64_t heap_peak() { return g_peak.load(std::memory_order_relaxed); }
void heap_reset_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }
bool heap_counting() {
  // Through a volatile function pointer, so the compiler cannot elide the pair.
  void* (*volatile alloc)(size_t) = &malloc;
  void (*volatile release)(void*) = &free;
  const int64_t before = heap_live();
  void* p = alloc(1 << 20);
  const bool seen = heap_live() - before >= (1 << 20);
  release(p);
  return seen;
}
#endif
}  // namespace burstlab::tools
