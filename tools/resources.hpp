// tools/resources.hpp — memory: what a checked run needs, what the machine has, and the refusal
// (exit 2, before anything big is allocated) when the first exceeds the second. Each layer
// states what its calls allocate (reference/reference_footprint.hpp: the oracle too,
// cpu/cpu_footprint.hpp, cuda/cuda_footprint.hpp); this file adds what the tool itself holds
// (the fp64 inputs, its runners' copies, fetched outputs, case files), composes the steps of each
// subcommand, and compares the host peak with what is available. tests/tools/test_resources.cpp
// holds the estimates against heap peaks measured by memcount.cpp.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "burstlab/footprint.hpp"
#include "burstlab/lmhead.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "reference_footprint.hpp"

namespace burstlab::tools {

struct Case;          // common.hpp
struct MemAvailable;  // below
struct Impl;         // impls.hpp
struct ImplOptions;  // impls.hpp

// The words of every estimate (burstlab/footprint.hpp) and the layers' own (reference/, cpu/).
using burstlab::bytes_add;
using burstlab::bytes_mul;
using burstlab::format_bytes;
using burstlab::kTooMany;
using burstlab::make_need;
using burstlab::MemNeed;
using burstlab::MemPart;
using burstlab::peak_of;
using reference::lmhead_oracle_need;
using reference::oracle_kept;
using reference::oracle_need;
using reference::sampled_oracle_kept;
using reference::sampled_oracle_need;

// ---------------------------------------------------------------- the tool's runs
// make_inputs (harness.cpp): Q, K, V, dO in fp64.
std::vector<MemPart> inputs_footprint(const Problem& p);
// Implementation footprints (Impl::footprint): the run's own copies of the inputs and outputs in
// its dtype, the fp64 copies fetch_* returns, and its workspace at `threads` OpenMP threads.
std::vector<MemPart> reference_footprint(const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward,
                                         int threads);
std::vector<MemPart> cpu_footprint(const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward,
                                   int threads);
// cuda: its host bytes (a staging copy per tensor and the fetched fp64 outputs); impls.cpp adds
// the device memory the cuda layer says its calls take (cuda/cuda_footprint.hpp).
std::vector<MemPart> cuda_host_footprint(const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward,
                                         int threads);
// `run --algo` on SimComm (tools/distributed.cpp): the ranks' shards, their circulating blocks
// (all of K, V, dK, dV on every rank when gathers_kv, dist::Algorithm's field: allgather and
// attention2d; two blocks in flight per rank otherwise), the gathered results, and each rank's
// engine workspace, as the engine's layer states it (EngineFootprint; device: the shards and
// blocks live in device memory). A bound, not a measured figure.
using Footprint = std::function<std::vector<MemPart>(const Problem& p, Dtype dtype, const ImplOptions& opt,
                                                     bool backward, int threads)>;
struct EngineFootprint {
  std::string what;     // "cpu engine tiles and GEMM packing"
  bool device = false;  // the engine's buffers are device memory
  // Bytes one rank's engine allocates for a block call over `rows` query rows (the most of
  // forward_block and backward_block), on `threads` OpenMP threads.
  std::function<int64_t(const Problem& p, int64_t rows, Dtype dtype, const ImplOptions& opt, int threads)> block_call;
};
EngineFootprint cpu_engine_footprint();  // cpu/cpu_footprint.hpp's block_call_bytes
// sampled: the run's row-sampled check reads only the sample and the rows' LSE, D through the World
// (Runner::fetch_sampled_*, gather.hpp) instead of downloading and gathering every output.
Footprint distributed_footprint(bool gathers_kv, int world, const EngineFootprint& engine, bool sampled = false);

// run_case's peak (common.hpp): inputs and the oracle (the sampled one with Case::check_rows);
// then, one implementation at a time, its footprint next to the inputs and what the oracle keeps
// (with check_rows and a backward also the candidate's fp64 O, LSE, read by the column check).
// For the LM head (Case::op): its oracle and bounds, then each impl next to what the oracle keeps.
MemNeed case_need(const Case& c, const std::vector<const Impl*>& impls, int threads);

// ---------------------------------------------------------------- what the machine has
struct MemAvailable {
  int64_t bytes = -1;  // -1: unknown (then nothing is refused)
  // "MemAvailable", "cgroup memory.max", "RLIMIT_AS: ulimit -v <kB> kB less the <bytes> this
  // process maps", "BURSTLAB_MEMORY_AVAILABLE"
  std::string source;
};
// BURSTLAB_MEMORY_AVAILABLE (bytes) when set; else the smallest of /proc/meminfo's MemAvailable,
// the address-space limit (RLIMIT_AS, `ulimit -v`) less what the process maps already, and what
// the process's cgroup (v2 memory.max, v1 memory.limit_in_bytes, itself or an ancestor) still
// allows: limit - usage + inactive file cache. The host's figures (MemAvailable, cgroup) are
// divided among the processes an MPI launcher started on this host (local_processes). Throws
// Error on a malformed BURSTLAB_MEMORY_AVAILABLE.
MemAvailable memory_available();
// The processes of this launch on this host: OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI) or
// MPI_LOCALNRANKS (MPICH), else 1.
int local_processes();
// RLIMIT_AS's soft limit less the process's mapped size (/proc/self/statm) and the address space
// `threads` OpenMP threads will map beyond the first (stacks, malloc arenas; 0: OpenMP's current
// team size); bytes -1 when there is no limit (or the mapped size cannot be read).
MemAvailable address_space_available(int threads = 0);
// Parsers, exposed for tests: "MemAvailable: 123 kB" -> bytes (-1 when absent); a cgroup
// directory's limit left (-1 when unlimited or unreadable); /proc/self/statm's first field (the
// mapped size in pages) -> bytes (-1 when malformed).
int64_t parse_meminfo_available(const std::string& meminfo);
int64_t cgroup_dir_available(const std::string& dir);
int64_t parse_statm_size(const std::string& statm, int64_t page_bytes);

// ---------------------------------------------------------------- the refusal
// Throws Error (exit 2) when need.bytes exceeds what is available: "not enough memory for
// <step>: <need> needed, <available> available (<source>); the largest part: <part>; <advice>".
// advice() is called only then; it says what to do instead, with flags the subcommand has.
void require_memory(const MemNeed& need, const MemAvailable& available, const std::function<std::string()>& advice);
// The same for the device memory of each implementation that has some (Impl::device_memory: what
// its GPU has free), from the device parts of its footprint: "not enough device memory for impl
// cuda (bf16): <need> needed, <free> available (cudaMemGetInfo ...); the largest part: ...".
void require_device_memory(const Case& c, const std::vector<const Impl*>& impls, int threads);
// What a suggestion ("it fits with ...") may need at most: 90% of what is available now. The
// run it suggests starts later, when MemAvailable has moved; a suggestion at 100% left none of
// that headroom and could itself be refused.
int64_t advice_budget(const MemAvailable& available);
// "it fits with A, with B, or with C": the ways a refusal names, in order; empty when none.
std::string fits_with(const std::vector<std::string>& ways);
// The largest c (rounded down to 3 significant digits) such that fits(min(N_q, c), min(N_k, c));
// 0 when not even c = 1 fits. fits must be monotone in c; the returned c is checked with fits.
int64_t largest_fitting_length(int64_t N_q, int64_t N_k, const std::function<bool(int64_t, int64_t)>& fits);

// ---------------------------------------------------------------- out of memory anyway
// Names the step under way (and its estimated bytes) for the message of an allocation failure
// the estimate did not foresee. The innermost Allocating that an exception unwinds through is
// remembered; out_of_memory_message() reports it.
class Allocating {
 public:
  Allocating(std::string what, int64_t bytes);
  ~Allocating();
  Allocating(const Allocating&) = delete;
  Allocating& operator=(const Allocating&) = delete;

 private:
  std::string what_;
  int64_t bytes_;
  int uncaught_;
};
// "out of memory (std::bad_alloc) while <step> (estimated <bytes>); <available> available
// (<source>); <advice>". Forgets the remembered step.
std::string out_of_memory_message(const std::exception& e, const std::string& advice = "");

}  // namespace burstlab::tools
