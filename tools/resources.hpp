// tools/resources.hpp — memory: what a checked run needs, what the machine has, and the refusal
// (exit 2, before anything big is allocated) when the first exceeds the second. Each layer
// states what its calls allocate (reference/reference_footprint.hpp: the oracle too,
// cpu/cpu_footprint.hpp, cuda/cuda_footprint.hpp); this file adds what the tool itself holds
// (the fp64 inputs, its runners' copies, fetched outputs, case files) and composes the steps of
// each subcommand; burstlab/memory.hpp compares the host peak with what is available.
// tests/tools/test_resources.cpp holds the estimates against heap peaks measured by memcount.cpp.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "burstlab/footprint.hpp"
#include "burstlab/lmhead.hpp"
#include "burstlab/memory.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "reference_footprint.hpp"

namespace burstlab::tools {

struct Case;          // common.hpp
struct Impl;         // impls.hpp
struct ImplOptions;  // impls.hpp

// The words of every estimate (burstlab/footprint.hpp) and the layers' own (reference/, cpu/).
using burstlab::bytes_add;
using burstlab::bytes_mul;
using burstlab::format_bytes;
using burstlab::kTooMany;
using burstlab::make_need;
using burstlab::MemAvailable;
using burstlab::largest_fitting_length;
using burstlab::require_memory;
using burstlab::MemNeed;
using burstlab::MemPart;
using burstlab::peak_of;
using reference::lmhead_oracle_need;
using reference::oracle_kept;
using reference::oracle_need;
using reference::sampled_oracle_kept;
using reference::sampled_oracle_need;

// ---------------------------------------------------------------- the tool's runs
// Inputs Q, K, V, dO held in the storage type of `dtype` (make_inputs, harness.cpp: 2, 4 or 8 bytes
// an element); case files' inputs are read in fp64.
std::vector<MemPart> inputs_footprint(const Problem& p, Dtype dtype);
// run_oracle's fp64 copies of inputs held narrower than fp64 (none for fp64): Q, K, V, and dO
// for a backward.
MemPart inputs_widened(const Problem& p, Dtype dtype, bool backward);
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
// (kv_shards copies of K, V, dK, dV: dist::held_kv_shards, 2 for the rings, their own and one in
// flight, more for the algorithms that gather), the gathered results, and each rank's engine
// workspace, as the engine's layer states it (EngineFootprint; device: the shards and blocks live
// in device memory). A bound, not a measured figure.
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
// ranks_per_device: how many of the world's ranks share the device whose memory is checked (all
// G on SimComm; 1 over NCCL, one rank per GPU), so that the device parts are that device's share.
Footprint distributed_footprint(int kv_shards, int world, const EngineFootprint& engine, bool sampled = false,
                                int ranks_per_device = 0);

// run_case's peak (common.hpp): inputs and the oracle (the sampled one with Case::check_rows);
// then, one implementation at a time, its footprint next to the inputs and what the oracle keeps
// (with check_rows and a backward also the candidate's fp64 O, LSE, read by the column check).
// For the LM head (Case::op): its oracle and bounds, then each impl next to what the oracle keeps.
MemNeed case_need(const Case& c, const std::vector<const Impl*>& impls, int threads);

// ---------------------------------------------------------------- what the machine has
// burstlab/memory.hpp's probe at OpenMP's current team size.
MemAvailable memory_available();
// require_memory (burstlab/memory.hpp) for the device memory of each implementation that has some
// (Impl::device_memory: what its GPU has free), from the device parts of its footprint: "not
// enough device memory for impl cuda (bf16): <need> needed, <free> available (cudaMemGetInfo
// ...); the largest part: ...".
void require_device_memory(const Case& c, const std::vector<const Impl*>& impls, int threads);

// ---------------------------------------------------------------- out of memory anyway
// Names the step under way (and its estimated bytes) for the message of an allocation failure
// the estimate did not foresee. The innermost Allocating that an exception unwinds through is
// remembered; out_of_memory_message() reports it. A step of at least `announce_from` bytes takes
// seconds to minutes (1M tokens: minutes), so it says on stderr when it starts and how long it
// took, which is a long run's progress.
constexpr int64_t kAnnounceBytes = int64_t(1) << 30;
class Allocating {
 public:
  Allocating(std::string what, int64_t bytes, int64_t announce_from = kAnnounceBytes);
  ~Allocating();
  Allocating(const Allocating&) = delete;
  Allocating& operator=(const Allocating&) = delete;

 private:
  std::string what_;
  int64_t bytes_;
  int uncaught_;
  bool announced_;
  double t0_ = 0;
};
// "out of memory (std::bad_alloc) while <step> (estimated <bytes>); <available> available
// (<source>); <advice>". Forgets the remembered step.
std::string out_of_memory_message(const std::exception& e, const std::string& advice = "");

}  // namespace burstlab::tools
