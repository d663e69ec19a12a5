/* burstlab/plugin.h — the engine plug-in ABI: a shared library that implements Engine<T>'s block
 * operations (burstlab/engine.hpp, spec §7.3) in plain C, so that burstlab runs its kernel alone
 * and under every distributed schedule (spec §7), and judges it against the fp64 oracle (spec §9).
 *
 * A plug-in exports one symbol, BURSTLAB_PLUGIN_SYMBOL:
 *     const burstlab_api_v1* burstlab_plugin_v1(const burstlab_host_v1* host);
 * burstlab calls it once after dlopen() and refuses the library (exit 2, naming its path) when the
 * symbol is missing, it returns NULL, its abi_version differs from BURSTLAB_PLUGIN_ABI_VERSION, or
 * a required entry is NULL. The library stays loaded for the life of the process.
 *
 * Memory: the plug-in owns it. Every pointer in a call is in the plug-in's memory (from its
 * allocate) unless named host: memory = BURSTLAB_MEMORY_HOST (plain host pointers; burstlab's
 * transports memcpy them) or BURSTLAB_MEMORY_DEVICE (CUDA device pointers of the current device;
 * then transport_copy and transport_poison are required, and NCCL can move the buffers).
 *
 * Threads: one engine (create) may serve several ranks at once (SimComm runs each rank on its own
 * thread), so every entry may be called concurrently from several threads on one engine. Calls of
 * one thread run in issue order; synchronize waits for the calling thread's earlier calls.
 *
 * Errors: every entry returns a burstlab_code and, unless BURSTLAB_OK, writes a NUL-terminated
 * message into status->message (at most BURSTLAB_MESSAGE_BYTES bytes, truncated). Never let a C++
 * exception or a longjmp cross this boundary. BURSTLAB_DECLINED means "this call is outside what I
 * run" (a mask kind, a dtype, indexed positions...): the message is the reason, and burstlab reports
 * "plugin NAME declined ENTRY: REASON" instead of producing output; BURSTLAB_ERROR is a failure.
 * A declined call writes nothing: burstlab may run the same work another way (a block over indexed
 * positions that does not split into a few runs is offered whole first, then by its contiguous
 * parts however short).
 *
 * Types (spec §9.1): T stores Q, K, V, O, dO (the engine's dtype); A = fp64 when T is fp64, else
 * fp32, holds LSE, D and the gradients dQ, dK, dV (never rounded to 16 bits between blocks).
 * Views are logical (B, H, N, d) or (B, H, N) tensors with element strides, any layout.
 * Masks and positions are GLOBAL (spec §3, §6.1): a block's query and key rows carry their global
 * positions, and the mask is evaluated on them.
 */
#ifndef BURSTLAB_PLUGIN_H
#define BURSTLAB_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BURSTLAB_PLUGIN_ABI_VERSION 1
#define BURSTLAB_PLUGIN_SYMBOL "burstlab_plugin_v1"
#define BURSTLAB_MESSAGE_BYTES 512

typedef enum { BURSTLAB_OK = 0, BURSTLAB_DECLINED = 1, BURSTLAB_ERROR = 2 } burstlab_code;

/* Storage dtypes, in burstlab's order (precision.hpp's Dtype). The plug-in's dtypes field is a
 * bit set: (1u << BURSTLAB_F32) | ... */
typedef enum { BURSTLAB_F64 = 0, BURSTLAB_F32 = 1, BURSTLAB_BF16 = 2, BURSTLAB_F16 = 3 } burstlab_dtype;

typedef enum { BURSTLAB_MEMORY_HOST = 0, BURSTLAB_MEMORY_DEVICE = 1 } burstlab_memory;
typedef enum { BURSTLAB_PASS_FORWARD = 0, BURSTLAB_PASS_BACKWARD = 1 } burstlab_pass;

typedef struct {
  char message[BURSTLAB_MESSAGE_BYTES];
} burstlab_status;

/* The problem of a block call (spec §1): scale is resolved (1/sqrt(d) when the user gave none).
 * q-head h reads kv-head h / (H_q / H_kv). */
typedef struct {
  int64_t B, H_q, H_kv, N_q, N_k, d;
  double scale;
} burstlab_problem;

/* Per-query document facts (spec §3.2, eq. 3.3), as mask.hpp's RowDoc. */
typedef struct {
  int64_t i_local; /* i - (first query of its document) */
  int64_t n_q;     /* queries in the document */
  int64_t k_start; /* first key of the document */
  int64_t n_k;     /* keys in the document (0: the row is empty) */
} burstlab_row_doc;

/* A compiled mask (spec §3), as mask.hpp's MaskParams: visible(i, j) iff j lies in row i's band
 * interval (eq. 3.4: diagonal i_loc + (n_k - n_q), bottom-right aligned, per document when doc is
 * set) and, when block is set, block[(i / block_q) * n_block_k + j / block_k] != 0 (eq. 3.5).
 * causal = (left -1, right 0). The arrays are HOST memory, valid until release(prepared). */
typedef struct {
  int64_t N_q, N_k;
  int64_t left, right;         /* band edges, -1 = unbounded */
  const burstlab_row_doc* doc; /* (N_q), or NULL: no document mask */
  const uint8_t* block;        /* (n_block_q, n_block_k) row-major, or NULL: no block mask */
  int64_t block_q, block_k, n_block_k;
} burstlab_mask;

/* Global positions of a block's rows (spec §6.1): [start, start + n) when index is NULL, else
 * index[0..n) (HOST memory, valid for the call). */
typedef struct {
  int64_t start;
  int64_t n;
  const int64_t* index;
} burstlab_positions;

/* Logical tensors, strides in elements. data in the plug-in's memory; may be NULL when a dim is 0. */
typedef struct {
  void* data;
  int64_t dim[4]; /* (B, H, N, d) */
  int64_t stride[4];
} burstlab_view4;
typedef struct {
  void* data;
  int64_t dim[3]; /* (B, H, N) */
  int64_t stride[3];
} burstlab_view3;

/* One block call (spec §6). Shapes: Q, O, dO (B, H_q, q.n, d); K, V (B, H_kv, k.n, d);
 * LSE, D (B, H_q, q.n) in A; dQ (B, H_q, q.n, d), dK, dV (B, H_kv, k.n, d) in A.
 * mask: this call's mask. burstlab cuts a forward block over a few position progressions into
 * blocks over contiguous positions (block_split.hpp); such a part carries its own problem and band
 * (in local indices) while doc and block, when set, are the prepared mask's own arrays. */
typedef struct {
  burstlab_problem problem;
  burstlab_dtype dtype;     /* T */
  burstlab_dtype acc_dtype; /* A */
  burstlab_mask mask;
  const void* prepared; /* what prepare() returned for the problem's mask */
  burstlab_positions q, k;
  burstlab_view4 Q, K, V;
  burstlab_view4 O;    /* forward: written (accumulate = 0) or merged into (accumulate = 1) */
  burstlab_view3 LSE;  /* forward: as O; backward: the rows' GLOBAL LSE, read */
  burstlab_view4 dO;   /* backward */
  burstlab_view3 D;    /* backward: eq. (5.1) of the rows, read */
  burstlab_view4 dQ, dK, dV; /* backward: ACCUMULATED into (+=), so blocks compose by addition */
} burstlab_block;

/* What burstlab asks before a run (supports): the whole problem's forward or backward as one
 * block over contiguous positions, or with q/k indexed positions. */
typedef struct {
  burstlab_pass pass;
  burstlab_dtype dtype;
  burstlab_problem problem;
  burstlab_mask mask;
  int q_indexed, k_indexed;
} burstlab_query;

/* What burstlab hands the plug-in at load. */
typedef struct {
  uint32_t abi_version; /* BURSTLAB_PLUGIN_ABI_VERSION of this burstlab */
  const char* version;  /* burstlab's version string */
} burstlab_host_v1;

typedef struct burstlab_api_v1 {
  uint32_t abi_version; /* set to BURSTLAB_PLUGIN_ABI_VERSION */
  const char* name;     /* short, no spaces: "cpu-example", "cudnn" */
  const char* about;    /* one line */
  uint32_t dtypes;      /* bit set of burstlab_dtype: the storage dtypes it runs */
  int memory;           /* burstlab_memory */

  /* ---- an engine: one per storage dtype and device (the current one when created) */
  int (*create)(burstlab_dtype dtype, void** engine, burstlab_status* st);
  void (*destroy)(void* engine); /* after every buffer and prepared mask of it is released */

  /* ---- memory (contents of a fresh allocation unspecified; bytes may be 0) */
  int (*allocate)(void* engine, int64_t bytes, void** ptr, burstlab_status* st);
  void (*release_memory)(void* engine, void* ptr);
  int (*upload)(void* engine, void* dst, const void* host, int64_t bytes, burstlab_status* st);
  int (*download)(void* engine, void* host, const void* src, int64_t bytes, burstlab_status* st);
  int (*copy)(void* engine, void* dst, const void* src, int64_t bytes, burstlab_status* st);
  /* n elements of dtype t set to value rounded to t */
  int (*fill)(void* engine, void* dst, int64_t n, burstlab_dtype t, double value, burstlab_status* st);
  /* acc[i] += in[i], i < n, in dtype t */
  int (*add)(void* engine, void* acc, const void* in, int64_t n, burstlab_dtype t, burstlab_status* st);
  /* every earlier call of this thread has completed; NULL: calls complete before they return */
  int (*synchronize)(void* engine, burstlab_status* st);

  /* ---- the mask, once per problem: prepared is what block calls get back */
  int (*prepare)(void* engine, const burstlab_mask* mask, void** prepared, burstlab_status* st);
  void (*release)(void* engine, void* prepared);

  /* ---- compute over global positions */
  /* accumulate = 0: (O, LSE) <- the block's partial over keys k (rows without a visible key:
   * (0, -inf), the merge identity); 1: the partial merged into (O, LSE), eq. (4.5)-(4.7). */
  int (*forward_block)(void* engine, const burstlab_block* b, int accumulate, burstlab_status* st);
  /* (O, LSE) <- (O, LSE) (+) (O_part, LSE_part), eq. (4.5)-(4.7); O (B, H, n, d), LSE (B, H, n) */
  int (*merge)(void* engine, burstlab_dtype t, burstlab_view4 O, burstlab_view3 LSE, burstlab_view4 O_part,
               burstlab_view3 LSE_part, burstlab_status* st);
  /* eq. (5.1): D = rowsum(dO o O); O, dO (B, H_q, n, d) in T -> D (B, H_q, n) in A */
  int (*compute_D)(void* engine, burstlab_dtype t, burstlab_view4 O, burstlab_view4 dO, burstlab_view3 D,
                   burstlab_status* st);
  /* spec §6.2 with the rows' global LSE and D; accumulates into dQ, dK, dV */
  int (*backward_block)(void* engine, const burstlab_block* b, burstlab_status* st);

  /* ---- optional: BURSTLAB_DECLINED (with the reason) for a problem it will not run, asked before
   * anything runs so that burstlab refuses it up front. NULL: every problem is tried. */
  int (*supports)(const burstlab_query* q, burstlab_status* st);

  /* ---- memory = BURSTLAB_MEMORY_DEVICE only (NULL otherwise): copies and 0xff fills that
   * burstlab's transport threads make between any two buffers of the plug-in; they return when
   * done, without an engine. */
  int (*transport_copy)(void* dst, const void* src, int64_t bytes, burstlab_status* st);
  int (*transport_poison)(void* dst, int64_t bytes, burstlab_status* st);
} burstlab_api_v1;

typedef const burstlab_api_v1* (*burstlab_plugin_entry_v1)(const burstlab_host_v1* host);

#ifdef __cplusplus
}
#endif

#endif /* BURSTLAB_PLUGIN_H */
