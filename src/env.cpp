// src/env.cpp — the table of environment variables (burstlab/env.hpp) and its getters, the only
// place the C++ code calls getenv.
#include "burstlab/env.hpp"

#include <cstdlib>
#include <stdexcept>

#include "burstlab/error.hpp"

namespace burstlab::env {

namespace {

constexpr const char* kMpiWorld = "nccl/mpi_world.cpp";
constexpr const char* kFaults = "tests/nccl/mpi_nccl.sh";

}  // namespace

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = {
      // ---- read by the C++ code (through this file)
      {"BURSTLAB_REQUIRE_GPU", Kind::Flag, "0",
       "tests/util/gpu_skip.hpp, tools/cmd_suite.cpp, tests/nccl/mpi_nccl.sh, python/tests/conftest.py",
       "1: a GPU test or a `burstlab suite` run that would skip for want of a GPU fails instead"},
      {"BURSTLAB_MEMORY_AVAILABLE", Kind::Text, "", "src/memory.cpp",
       "bytes the memory check takes as available, instead of MemAvailable, ulimit -v and cgroup limits"},
      {"BURSTLAB_CUDA_CACHE", Kind::Flag, "1", "cuda/cuda_engine.cu",
       "0: the CUDA engine frees each buffer with cudaFree instead of caching freed blocks (so "
       "compute-sanitizer sees every free)"},
      {"BURSTLAB_TEST_BROKEN_IMPL", Kind::Flag, "0", "tools/impls.cpp",
       "1: adds the implementation `broken` (cpu with one wrong element), for tests of a failing check"},
      {"BURSTLAB_TEST_BROKEN_TABLE1", Kind::Flag, "0", "tools/cmd_simulate.cpp",
       "1: `simulate` moves every Table 1 closed form by one part in 1e6, for tests of a mismatch"},
      {"BURSTLAB_V2_CFG", Kind::Integer, "0", "cuda/v2_fwd.cu",
       "v2 forward: 1, 2, 3 force one compiled configuration; 0 the default (benchmark only, cuda/README.md)"},
      {"BURSTLAB_V3_CFG", Kind::Integer, "0", "cuda/v3_fwd.cu",
       "v3 forward: 1, 2 force one compiled configuration; 0 the default (benchmark only, cuda/README.md)"},
      {"BURSTLAB_V3_BWD_CFG", Kind::Integer, "0", "cuda/v3_bwd.cu",
       "v3 backward: 1 forces the other configuration; 0 the default (benchmark only, cuda/README.md)"},
      {"BURSTLAB_V4_CFG", Kind::Integer, "0", "cuda/fwd_ws.cuh",
       "persistent forwards (v4): 1 .. 5 force one configuration; 0 the default (benchmark, tests)"},
      {"BURSTLAB_V4_GRID", Kind::Integer, "0", "cuda/fwd_ws.cuh",
       "persistent forwards: n > 0 at most n CTAs, -1 one CTA per item; 0 as many as fit at once"},
      {"BURSTLAB_V4_TAIL", Kind::Integer, "0", "cuda/fwd_ws.cuh",
       "persistent forwards: n > 0 the last n (b, h) as the tail, -1 no tail; 0 about two waves"},
      {"BURSTLAB_V4_EPILOGUE", Kind::Integer, "1", "cuda/fwd_ws.cuh",
       "v4 forward: 1 (the default) writes O through the item's Q buffer by TMA stores (two-Q-buffer shapes, not a "
       "merge into a running partial); 0 from registers (benchmark, tests)"},
      {"BURSTLAB_V4_BWD_CFG", Kind::Integer, "0", "cuda/v4_bwd.cu",
       "v4 backward: 1 forces the other one-pass shape; 0 the default (benchmark only, cuda/README.md)"},
      {"OMPI_COMM_WORLD_SIZE", Kind::Integer, "1", kMpiWorld, "set by Open MPI's mpirun: the number of processes"},
      {"OMPI_COMM_WORLD_RANK", Kind::Integer, "0", kMpiWorld, "set by Open MPI's mpirun: this process's rank"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", Kind::Integer, "1", "src/memory.cpp",
       "set by Open MPI's mpirun: the processes on this host, which share its memory in the memory refusals"},
      {"MPI_LOCALNRANKS", Kind::Integer, "1", "src/memory.cpp",
       "set by MPICH's mpiexec: the processes on this host (as OMPI_COMM_WORLD_LOCAL_SIZE)"},
      {"PMIX_SIZE", Kind::Integer, "1", kMpiWorld, "set by a PMIx launcher: the number of processes"},
      {"PMIX_RANK", Kind::Integer, "0", kMpiWorld, "set by a PMIx launcher: this process's rank"},
      {"PMI_SIZE", Kind::Integer, "1", kMpiWorld, "set by a PMI launcher: the number of processes"},
      {"PMI_RANK", Kind::Integer, "0", kMpiWorld, "set by a PMI launcher: this process's rank"},
      // ---- read by scripts, the Python package and its tests, the notebooks
      {"BURSTLAB_BIN", Kind::Text, "../build/default/tools/burstlab (notebooks)",
       "python/tests/conftest.py, notebooks/*.ipynb",
       "the burstlab executable the notebooks and the Python round-trip tests run (ctest sets it)"},
      {"BURSTLAB_SAME_BUILD", Kind::Flag, "0", "python/tests/conftest.py",
       "1: the Python module and BURSTLAB_BIN come from one build (ctest sets it)"},
      {"BURSTLAB_FIGURES", Kind::Text, "notebook-figures/ beside the burstlab executable", "notebooks/*.ipynb",
       "where the notebooks write their figures"},
      {"BURSTLAB_CUDA", Kind::Text, "auto (scripts/main), OFF (setup.py)", "scripts/main, setup.py",
       "1/ON: build the CUDA layer; 0/OFF: leave it out; scripts/main probes for a GPU when unset"},
      {"BURSTLAB_NATIVE", Kind::Text, "OFF", "setup.py", "ON: pip install compiles for this CPU (-march=native)"},
      {"BURSTLAB_CMAKE_ARGS", Kind::Text, "", "setup.py", "extra CMake arguments of pip install"},
      {"BURSTLAB_PIP_PROGRESS", Kind::Flag, "1", "setup.py", "0: pip install keeps the build's steps off the terminal"},
      {"BURSTLAB_NO_APT", Kind::Flag, "0", "scripts/bootstrap", "1: bootstrap installs no packages"},
      {"OUT", Kind::Text, "build/<script name> (scripts), /tmp (mpi_nccl.sh)", "scripts/gpu-check, scripts/lmhead-check, scripts/nccl-check, tests/nccl/mpi_nccl.sh",
       "the folder for the GPU check scripts' logs (mpi_nccl.sh: the soak series)"},
      {"BENCH_ARGS", Kind::Text, "", "scripts/gpu-check", "extra arguments for both sides of the GPU benchmark"},
      {"NCCL_CHECK_FAULTS", Kind::Flag, "1", "scripts/nccl-check", "0: nccl-check skips the fault matrix"},
      {"NCCL_CHECK_SOAK", Kind::Flag, "1", "scripts/nccl-check", "0: nccl-check skips the soak"},
      {"NCCL_CHECK_ENGINE", Kind::Flag, "1", "scripts/nccl-check", "0: nccl-check skips test_cuda_engine"},
      {"NCCL_CHECK_PLUGIN", Kind::Flag, "1", "scripts/nccl-check",
       "0: nccl-check skips conform of the cuDNN plug-in under every algorithm"},
      {"CUDNN_ROOT", Kind::Text, "the Python environment's nvidia.cudnn", "scripts/nccl-check",
       "cuDNN (include/cudnn.h, lib/libcudnn.so) for plugins/cudnn, passed to CMake"},
      {"CUDNN_FRONTEND_INCLUDE_DIR", Kind::Text, "the Python environment's site-packages/include (CMake)",
       "scripts/nccl-check", "the folder holding cudnn_frontend.h, passed to CMake"},
      {"LD_LIBRARY_PATH", Kind::Text, "", "scripts/nccl-check",
       "read by the loader; nccl-check puts $CUDNN_ROOT/lib first (cuDNN loads its engines from there)"},
      {"CUDA_VISIBLE_DEVICES", Kind::Text, "every GPU", "scripts/steps.sh",
       "read by CUDA: the GPUs a process sees; steps.sh counts them for nccl-check's 2-GPU plug-in step "
       "and gpu-check's two-GPU tests"},
      {"SOAK_PASSES", Kind::Integer, "200", kFaults, "the soak's timed passes per algorithm"},
      {"SOAK_SLACK_MIB", Kind::Integer, "64", kFaults, "how far the soak's memory may drift (MiB)"},
      {"FAULT_BOUND_S", Kind::Integer, "30", kFaults, "seconds a fault-matrix run may take"},
      {"FAULT_LAUNCH", Kind::Text, "mpirun threads", kFaults, "the fault matrix's launches (a subset)"},
      {"FAULT_ALGOS", Kind::Text, "every algorithm", kFaults, "the fault matrix's algorithms (a subset)"},
      {"FAULT_KINDS", Kind::Text, "throw hang", kFaults, "the fault matrix's fault kinds (a subset)"},
      {"FAULT_HANG_TIMEOUT", Kind::Integer, "5", kFaults, "the --timeout of the fault matrix's hang runs (s)"},
      {"LOCAL_RANK", Kind::Integer, "0", "scripts/bench_cp_torch.py, examples/check_torch_cp.py",
       "set by torchrun: this process's GPU"},
      {"RANK", Kind::Integer, "", "examples/check_torch_cp.py", "set by torchrun: this process's rank (required)"},
      {"WORLD_SIZE", Kind::Integer, "", "examples/check_torch_cp.py",
       "set by torchrun: the number of processes (required)"},
      {"BURSTLAB", Kind::Text, "build/gpu/tools/burstlab", "scripts/bench-cp",
       "the burstlab executable scripts/bench-cp runs (its --burstlab wins)"},
      {"NCCL_NVLS_ENABLE", Kind::Flag, "0", "scripts/bench-cp",
       "read by NCCL; scripts/bench-cp, bench_cp_torch.py and check_torch_cp.py set 0 when unset"},
  };
  return table;
}

const Knob& knob(std::string_view name) {
  for (const Knob& k : knobs())
    if (name == k.name) return k;
  throw std::logic_error("environment variable " + std::string(name) +
                         " is read but not declared in src/env.cpp's table");
}

namespace {

const Knob& knob_of_kind(std::string_view name, Kind kind) {
  const Knob& k = knob(name);
  if (k.kind != kind)
    throw std::logic_error("environment variable " + std::string(name) + " is a " + to_string(k.kind) +
                           " knob, read as a " + to_string(kind));
  return k;
}

std::optional<std::string> raw(const char* name) {
  const char* e = std::getenv(name);
  if (!e || !*e) return std::nullopt;
  return std::string(e);
}

bool parse_integer(const std::string& s, int64_t* v) {
  if (s.empty()) return false;
  size_t end = 0;
  try {
    *v = std::stoll(s, &end, 10);
  } catch (const std::exception&) {
    return false;
  }
  return end == s.size();
}

}  // namespace

std::optional<std::string> text(std::string_view name) { return raw(knob(name).name); }

bool flag(std::string_view name) {
  const Knob& k = knob_of_kind(name, Kind::Flag);
  const std::string v = raw(k.name).value_or(k.fallback);
  if (v == "1") return true;
  if (v == "0") return false;
  fail(k.name, " (", v, ") must be 0 or 1");
}

int64_t integer(std::string_view name) {
  const Knob& k = knob_of_kind(name, Kind::Integer);
  const std::string v = raw(k.name).value_or(k.fallback);
  if (v.empty()) fail(k.name, " is not set (it has no default)");
  int64_t x = 0;
  if (!parse_integer(v, &x)) fail(k.name, " (", v, ") must be an integer");
  return x;
}

void validate() {
  for (const Knob& k : knobs()) {
    const std::string readers = k.read_by;
    bool cpp = false;
    for (const char* ext : {".cpp", ".hpp", ".cu", ".cuh"}) cpp = cpp || readers.find(ext) != std::string::npos;
    if (!cpp) continue;
    if (k.kind == Kind::Flag) flag(k.name);
    if (k.kind == Kind::Integer) integer(k.name);
  }
}

const char* to_string(Kind k) {
  switch (k) {
    case Kind::Flag: return "flag";
    case Kind::Integer: return "integer";
    case Kind::Text: return "text";
  }
  return "text";
}

}  // namespace burstlab::env
