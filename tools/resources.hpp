// tools/resources.hpp — memory: what a checked run needs, what the machine has, and the refusal
// (exit 2, before anything big is allocated) when the first exceeds the second. One place for
// every estimate: the inputs, the fp64 oracle (reference<double> materializes N_q x N_k per
// (b, h) and thread; its §9 bounds up to six of them), and one plain function per
// implementation (Impl::footprint in impls.hpp). Each formula cites the allocations it mirrors;
// tests/tools/test_resources.cpp holds the oracle, reference and cpu formulas against heap peaks
// measured by memcount.cpp, so a layer that starts allocating more fails a test.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"

namespace burstlab::tools {

struct Case;          // common.hpp
struct MemAvailable;  // below
struct Impl;         // impls.hpp
struct ImplOptions;  // impls.hpp

// ---------------------------------------------------------------- byte counts
// Counts saturate at kTooMany instead of overflowing int64 (which would be UB): such a problem
// needs "more than 9.2 EB" and is refused like any other that does not fit.
constexpr int64_t kTooMany = std::numeric_limits<int64_t>::max();
int64_t bytes_mul(int64_t a, int64_t b);  // a, b >= 0
int64_t bytes_add(int64_t a, int64_t b);
std::string format_bytes(int64_t bytes);  // SI units: "320.0 GB", "512 bytes", "more than 9.2 EB"

// ---------------------------------------------------------------- estimates
// Host buffers that are live together: what they are, and their bytes.
struct MemPart {
  std::string what;
  int64_t bytes = 0;
};
// The peak of a run: the step at which it is reached, the parts live then (largest first) and
// their sum.
struct MemNeed {
  std::string step;
  std::vector<MemPart> parts;
  int64_t bytes = 0;
};
MemNeed make_need(std::string step, std::vector<MemPart> parts);  // sorts the parts, sums them
const MemNeed& peak_of(const MemNeed& a, const MemNeed& b);       // the larger (a on ties)

// OpenMP threads a region of `items` work items runs on: min(threads, items), or 1 when the
// layer keeps the region serial (reference.cpp and tolerance.cpp: worth_threads).
int64_t oracle_threads(const Problem& p, int64_t items, int threads);

// make_inputs (harness.cpp): Q, K, V, dO in fp64.
std::vector<MemPart> inputs_footprint(const Problem& p);
// What run_oracle returns and keeps for the comparisons: O, LSE (and dQ, dK, dV) in fp64 with
// their §9 bounds.
std::vector<MemPart> oracle_kept(const Problem& p, bool backward);
// run_oracle's peak (harness.cpp): reference<double> forward and backward (reference.cpp), then
// forward_bounds and backward_bounds (tolerance.cpp), each with its per-thread N_q x N_k
// workspace, on top of what it keeps.
MemNeed oracle_need(const Problem& p, bool backward, int threads);

// The row-sampled oracle (reference/rows.cpp, spec §9.11) on K rows and K columns: no N_q x N_k
// buffer; the mask's row and key visibility, D of the run for the sampled columns' q-heads, a
// row's logits per thread, and what it keeps (K rows and columns with their bounds).
std::vector<MemPart> sampled_oracle_kept(const Problem& p, int64_t K, bool backward);
MemNeed sampled_oracle_need(const Problem& p, int64_t K, bool backward, int threads);

// Implementation footprints (Impl::footprint): the run's own copies of the inputs and outputs in
// its dtype, the fp64 copies fetch_* returns, and its workspace at `threads` OpenMP threads.
std::vector<MemPart> reference_footprint(const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward,
                                         int threads);
std::vector<MemPart> cpu_footprint(const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward,
                                   int threads);
// cuda: HOST bytes only (a staging copy per tensor and the fetched fp64 outputs); device memory
// is not estimated (cudaMalloc failures are reported by the layer).
std::vector<MemPart> cuda_host_footprint(const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward,
                                         int threads);
// `run --algo` on SimComm (tools/distributed.cpp): the ranks' shards, their circulating blocks
// (all of K, V, dK, dV on every rank when gathers_kv, dist::Algorithm's field: allgather and
// attention2d; two blocks in flight per rank otherwise), the gathered results, and each rank's
// cpu engine scratch. A bound, not a measured figure.
using Footprint = std::function<std::vector<MemPart>(const Problem& p, Dtype dtype, const ImplOptions& opt,
                                                     bool backward, int threads)>;
Footprint distributed_footprint(bool gathers_kv, int world);

// run_case's peak (common.hpp): inputs and the oracle (the sampled one with Case::check_rows);
// then, one implementation at a time, its footprint next to the inputs and what the oracle keeps
// (with check_rows and a backward also the candidate's fp64 O, LSE, read by the column check).
MemNeed case_need(const Case& c, const std::vector<const Impl*>& impls, int threads);

// ---------------------------------------------------------------- the case subcommands
// (cmd_case.cpp). Each is the peak over the steps of one case; the cases of a suite run one
// after the other.
// `oracle`: read_case (the inputs in fp64, one file's bytes while it is parsed), compute_expected
// (oracle_need, then the copies of its outputs), write_expected (one output file's bytes).
MemNeed oracle_case_need(const Problem& p, Dtype dtype, bool backward, int threads);
// `check`: the inputs, expected/ and the candidate's outputs in fp64, then check_candidate's §9
// bounds (forward_bounds, backward_bounds: their N_q x N_k fp64 per thread).
MemNeed check_case_need(const Problem& p, Dtype dtype, bool backward, int threads);
// `conform`: the inputs, the expected outputs (computed by the oracle, or read from expected/),
// then per column its run (Footprint; none for a column without one) and the check of its outputs
// with the run still alive.
struct ConformColumn {
  std::string name;
  Footprint footprint;
};
MemNeed conform_case_need(const Problem& p, Dtype dtype, bool backward, bool expected_on_disk,
                          const std::vector<ConformColumn>& columns, int threads);
// What fits instead, for a subcommand whose problem is fixed by a case file: "it fits with
// --threads 1" (when it does), `other` (a further way, already checked by the caller), and the
// largest N_q = N_k of the case's B, H_q, H_kv, d that fits. need(p, threads); every suggestion
// within advice_budget.
std::string case_advice(const Problem& p, int threads, const MemAvailable& available,
                        const std::function<MemNeed(const Problem&, int)>& need, const std::string& other = "");

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
// allows: limit - usage + inactive file cache. Throws Error on a malformed
// BURSTLAB_MEMORY_AVAILABLE.
MemAvailable memory_available();
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
// What a suggestion ("it fits with ...") may need at most: 90% of what is available now. The
// run it suggests starts later, when MemAvailable has moved; a suggestion at 100% left none of
// that headroom and could itself be refused.
int64_t advice_budget(const MemAvailable& available);
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
