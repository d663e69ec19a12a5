// src/memory.cpp — see burstlab/memory.hpp.
#include "burstlab/memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "burstlab/env.hpp"
#include "burstlab/error.hpp"

namespace burstlab {

namespace {
bool read_text(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}
// A non-negative integer (whitespace around it allowed); false otherwise ("max", junk).
bool parse_count(const std::string& text, int64_t* out) {
  const size_t a = text.find_first_not_of(" \t\n"), b = text.find_last_not_of(" \t\n");
  if (a == std::string::npos) return false;
  const std::string t = text.substr(a, b - a + 1);
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (errno == ERANGE || v > static_cast<unsigned long long>(kTooMany)) *out = kTooMany;
  else *out = static_cast<int64_t>(v);
  return true;
}
// "key value" lines (memory.stat); -1 when absent.
int64_t stat_value(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  int64_t v;
  while (in >> k >> v)
    if (k == key) return v;
  return -1;
}
}  // namespace

int64_t parse_meminfo_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream l(line.substr(13));
    int64_t v = -1;
    std::string unit;
    if (!(l >> v) || v < 0) return -1;
    l >> unit;
    return unit == "kB" ? bytes_mul(v, 1024) : v;
  }
  return -1;
}

int64_t cgroup_dir_available(const std::string& dir) {
  std::string text;
  int64_t limit = -1, usage = -1;
  bool v2 = true;
  if (read_text(dir + "/memory.max", &text)) {  // cgroup v2; "max" = unlimited
    if (!parse_count(text, &limit)) return -1;
    if (!read_text(dir + "/memory.current", &text) || !parse_count(text, &usage)) return -1;
  } else if (read_text(dir + "/memory.limit_in_bytes", &text)) {  // cgroup v1; huge = unlimited
    v2 = false;
    if (!parse_count(text, &limit)) return -1;
    if (!read_text(dir + "/memory.usage_in_bytes", &text) || !parse_count(text, &usage)) return -1;
  } else {
    return -1;
  }
  if (limit >= (int64_t(1) << 60)) return -1;  // v1 writes "no limit" as ~2^63
  // Page cache counts as usage but is given back under pressure: add the inactive part.
  int64_t reclaimable = 0;
  if (read_text(dir + "/memory.stat", &text))
    reclaimable = std::max<int64_t>(0, stat_value(text, v2 ? "inactive_file" : "total_inactive_file"));
  return std::max<int64_t>(0, limit - std::max<int64_t>(0, usage - reclaimable));
}

int64_t parse_statm_size(const std::string& statm, int64_t page_bytes) {
  std::istringstream in(statm);
  int64_t pages = -1;
  if (!(in >> pages) || pages < 0) return -1;
  return bytes_mul(pages, page_bytes);
}

namespace {
// Address space the estimates do not see: freed blocks malloc keeps, libraries loaded later.
// Measured 2.5 to 8 MB above the estimated heap on one thread (run --impl cpu under `ulimit -v`).
constexpr int64_t kMallocSlack = int64_t(16) * 1024 * 1024;
int64_t thread_address_space(int64_t stack_bytes) {
  // glibc gives each thread that allocates its own malloc arena, a heap reserved 64 MiB at a time
  // (HEAP_MAX_SIZE); one thread's arena can hold two of them. Measured with `ulimit -v` (burstlab
  // run --impl cpu, glibc 2.36): 84 to 133 MB of address space per OpenMP thread beyond the first
  // over the estimated heap, so two heaps and the stack are reserved.
  constexpr int64_t kArena = int64_t(2) * 64 * 1024 * 1024;
  return bytes_add(stack_bytes, kArena);
}
}  // namespace

MemAvailable address_space_available(int threads) {
  MemAvailable a;
  struct rlimit lim {};
  if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return a;
  const int64_t limit =
      lim.rlim_cur > static_cast<rlim_t>(kTooMany) ? kTooMany : static_cast<int64_t>(lim.rlim_cur);
  std::string text;
  const long page = sysconf(_SC_PAGESIZE);
  const int64_t mapped = read_text("/proc/self/statm", &text) ? parse_statm_size(text, page > 0 ? page : 4096) : -1;
  if (mapped < 0) return a;  // the limit alone would overstate what is left
  // Every mapping counts against RLIMIT_AS, reserved address space that is never touched too:
  // what is mapped now is spent, and each further thread maps its stack and malloc arena.
  // Threads' stacks are RLIMIT_STACK (glibc's default stack size; 8 MiB when it is unlimited).
  struct rlimit st {};
  const int64_t stack = getrlimit(RLIMIT_STACK, &st) == 0 && st.rlim_cur != RLIM_INFINITY
                            ? static_cast<int64_t>(std::min<rlim_t>(st.rlim_cur, rlim_t(1) << 40))
                            : int64_t(8) * 1024 * 1024;
  const int64_t reserved = bytes_add(kMallocSlack, bytes_mul(std::max(threads, 1) - 1, thread_address_space(stack)));
  a.bytes = std::max<int64_t>(0, limit - bytes_add(mapped, reserved));
  a.source = "RLIMIT_AS: ulimit -v " + std::to_string(limit / 1024) + " kB less the " + format_bytes(mapped) +
             " this process maps and " + format_bytes(reserved) + " kept for malloc and " +
             (threads == 1 ? std::string("1 thread") : std::to_string(threads) + " threads");
  return a;
}

namespace {
// What the host's memory and this process's cgroups still allow: shared by every process there.
MemAvailable host_available() {
  MemAvailable a;
  std::string text;
  if (read_text("/proc/meminfo", &text)) {
    a.bytes = parse_meminfo_available(text);
    if (a.bytes >= 0) a.source = "MemAvailable";
  }
  // The process's cgroups (/proc/self/cgroup: "0::/path" for v2, "N:memory:/path" for v1), and
  // their ancestors: a limit anywhere above applies too.
  if (!read_text("/proc/self/cgroup", &text)) return a;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string ctrl = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    std::vector<std::string> roots;
    if (ctrl.empty()) roots = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
    else if (ctrl == "memory" || ctrl.find(",memory") != std::string::npos || ctrl.rfind("memory,", 0) == 0)
      roots = {"/sys/fs/cgroup/memory"};
    else
      continue;
    while (true) {
      for (const std::string& r : roots) {
        const int64_t left = cgroup_dir_available(r + (path == "/" ? "" : path));
        if (left >= 0 && (a.bytes < 0 || left < a.bytes)) {
          a.bytes = left;
          a.source = ctrl.empty() ? "cgroup memory.max" : "cgroup memory.limit_in_bytes";
        }
      }
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  }
  return a;
}
}  // namespace

int local_processes() {
  for (const char* n : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (env::text(n)) return static_cast<int>(std::clamp<int64_t>(env::integer(n), 1, 1 << 20));
  return 1;
}

MemAvailable memory_available(int threads) {
  MemAvailable a;
  if (const std::optional<std::string> e = env::text("BURSTLAB_MEMORY_AVAILABLE")) {
    int64_t v;
    if (!parse_count(*e, &v)) fail("BURSTLAB_MEMORY_AVAILABLE (", *e, ") must be a number of bytes");
    a.bytes = v;
    a.source = "BURSTLAB_MEMORY_AVAILABLE";
    return a;
  }
  // Every process mpirun starts on this host holds its own inputs and oracle: each gets its share.
  a = host_available();
  if (const int n = local_processes(); n > 1 && a.bytes >= 0) {
    a.bytes /= n;
    a.source += " / " + std::to_string(n) + " processes of this host (mpirun)";
  }
  if (const MemAvailable as = address_space_available(threads); as.bytes >= 0 && (a.bytes < 0 || as.bytes < a.bytes)) a = as;
  return a;
}

// ---------------------------------------------------------------- the refusal
void require_memory(const MemNeed& need, const MemAvailable& available, const std::function<std::string()>& advice,
                    bool device) {
  const int64_t bytes = device ? need.device_bytes : need.bytes;
  if (available.bytes < 0 || bytes <= available.bytes) return;
  std::string msg = std::string("not enough ") + (device ? "device " : "") + "memory for " + need.step + ": " +
                    format_bytes(bytes) + " needed, " + format_bytes(available.bytes) + " available (" +
                    available.source + ")";
  for (const MemPart& x : need.parts)  // the largest part of that memory
    if (x.device == device) {
      msg += "; the largest part: " + x.what + " = " + format_bytes(x.bytes);
      break;
    }
  const std::string what_instead = advice ? advice() : "";
  if (!what_instead.empty()) msg += "; " + what_instead;
  throw Error(msg);
}

int64_t advice_budget(const MemAvailable& available) { return available.bytes - available.bytes / 10; }

std::string fits_with(const std::vector<std::string>& ways) {
  std::string s;
  for (size_t k = 0; k < ways.size(); ++k)
    s += (k == 0 ? "it fits with " : k + 1 == ways.size() ? ", or with " : ", with ") + ways[k];
  return s;
}

int64_t largest_fitting_length(int64_t N_q, int64_t N_k, const std::function<bool(int64_t, int64_t)>& fits) {
  const int64_t hi0 = std::max(N_q, N_k);
  auto ok = [&](int64_t c) { return fits(std::min(N_q, c), std::min(N_k, c)); };
  if (!ok(1)) return 0;
  int64_t lo = 1, hi = hi0;  // ok(lo); the answer is in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (ok(mid)) lo = mid;
    else hi = mid - 1;
  }
  // 3 significant digits, rounded down: 15843 -> 15800
  int64_t unit = 1;
  while (lo / unit >= 1000) unit *= 10;
  const int64_t rounded = std::max<int64_t>(1, lo / unit * unit);
  return ok(rounded) ? rounded : lo;  // the suggestion is one the estimate accepts
}

}  // namespace burstlab
