// burstlab/memory.hpp — what the machine has, and the refusal (exit 2, before anything big is
// allocated) when an estimate in footprint.hpp's words exceeds it. The command line and the Python
// package refuse with the same probe and the same message.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "burstlab/footprint.hpp"

namespace burstlab {

struct MemAvailable {
  int64_t bytes = -1;  // -1: unknown (then nothing is refused)
  // "MemAvailable", "cgroup memory.max", "cgroup memory.limit_in_bytes" (each followed, under
  // mpirun, by " / <n> processes of this host (mpirun)"), "RLIMIT_AS: ulimit -v <kB> kB less the
  // <bytes> this process maps ...", "BURSTLAB_MEMORY_AVAILABLE"
  std::string source;
};
// BURSTLAB_MEMORY_AVAILABLE (bytes) when set; else the smallest of /proc/meminfo's MemAvailable,
// the address-space limit (RLIMIT_AS, `ulimit -v`) less what the process maps already and what
// `threads` threads will map, and what the process's cgroup (v2 memory.max, v1
// memory.limit_in_bytes, itself or an ancestor) still allows: limit - usage + inactive file cache.
// The host's figures (MemAvailable, cgroup) are divided among the processes an MPI launcher
// started on this host (local_processes). Throws Error on a malformed BURSTLAB_MEMORY_AVAILABLE.
MemAvailable memory_available(int threads);
// The processes of this launch on this host: OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI) or
// MPI_LOCALNRANKS (MPICH), else 1.
int local_processes();
// RLIMIT_AS's soft limit less the process's mapped size (/proc/self/statm) and the address space
// `threads` threads will map beyond the first (stacks, malloc arenas); bytes -1 when there is no
// limit (or the mapped size cannot be read).
MemAvailable address_space_available(int threads);
// Parsers, exposed for tests: "MemAvailable: 123 kB" -> bytes (-1 when absent); a cgroup
// directory's limit left (-1 when unlimited or unreadable); /proc/self/statm's first field (the
// mapped size in pages) -> bytes (-1 when malformed).
int64_t parse_meminfo_available(const std::string& meminfo);
int64_t cgroup_dir_available(const std::string& dir);
int64_t parse_statm_size(const std::string& statm, int64_t page_bytes);

// Throws Error when need's host (device: its device) bytes exceed what is available: "not enough
// [device ]memory for <step>: <need> needed, <available> available (<source>); the largest part:
// <part>; <advice>". advice() is called only then; it says what to do instead.
void require_memory(const MemNeed& need, const MemAvailable& available, const std::function<std::string()>& advice,
                    bool device = false);
// What a suggestion ("it fits with ...") may need at most: 90% of what is available now. The
// run it suggests starts later, when MemAvailable has moved; a suggestion at 100% left none of
// that headroom and could itself be refused.
int64_t advice_budget(const MemAvailable& available);
// "it fits with A, with B, or with C": the ways a refusal names, in order; empty when none.
std::string fits_with(const std::vector<std::string>& ways);
// The largest c (rounded down to 3 significant digits) such that fits(min(N_q, c), min(N_k, c));
// 0 when not even c = 1 fits. fits must be monotone in c; the returned c is checked with fits.
int64_t largest_fitting_length(int64_t N_q, int64_t N_k, const std::function<bool(int64_t, int64_t)>& fits);

}  // namespace burstlab
