// tools/impls.hpp — the registry of implementations the `burstlab` tool can run and check, for
// both operators: attention (spec §1-§9) and the fused LM head + cross-entropy (spec §10).
// An implementation is plain data: a name, its operator, the dtypes it runs, and a `prepare`
// function that takes seeded inputs and returns closures that run its passes. A new layer plugs
// in by adding an entry in impls.cpp (the LM head's: impls_lmhead.cpp); `run`, `suite`, `bench`
// and `conform` pick it up through run_case (common.hpp) without other changes.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/lmhead.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "cpu.hpp"         // Tiles
#include "cpu_lmhead.hpp"  // LmHeadTiles
#include "harness.hpp"
#include "lmhead_check.hpp"  // LmHeadInputs
#include "resources.hpp"     // Footprint
#include "rows.hpp"          // Sample, SampledOutputs, RunRows

namespace burstlab::tools {

// What an implementation computes.
enum class Operator { Attention, LmHeadCe };
std::string to_string(Operator op);             // "attention", "lmhead-ce"
Operator parse_operator(const std::string& s);  // throws Error naming "op"

// Knobs an implementation may honour. 0 = the implementation's default.
struct ImplOptions {
  int64_t Br = 0;  // query rows per tile (--br); the LM head: rows per tile or chunk
  int64_t Bc = 0;  // keys per tile (--bc)
  int64_t Bv = 0;  // the LM head: vocabulary entries per tile (--bv)
};

// One prepared run: the implementation has converted the inputs to its dtype, placed them where
// it computes (host or device) and poisoned its outputs (NaN, spec §9.3).
//   forward()  runs the forward once and returns its time in ms (host clock on a CPU; a device
//              timer is fine on a GPU). Synchronous: results are complete on return.
//   backward() runs the backward once, from the impl's OWN O and LSE of the last forward()
//              (spec §9.6: the candidate backward uses its own forward); returns ms.
//              Empty when the implementation has no backward.
//   fused()    the LM head: forward and backward in one call; returns ms.
//   fetch_*()  copy the outputs back as double (exact for every dtype): attention's O, LSE and
//              dQ, dK, dV; the LM head's L, LSE (N) and dH (N, d), dW (V, d).
struct Runner {
  std::function<double()> forward;
  std::function<double()> backward;
  std::function<double()> fused;
  std::function<void(Tensor4<double>& O, Tensor3<double>& LSE)> fetch_forward;
  std::function<void(Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV)> fetch_backward;
  // What the row-sampled check (spec §9.11) reads, where an implementation provides it (a
  // distributed run: only the sample and the rows' LSE and D cross processes, gather.hpp);
  // otherwise run_case takes it from fetch_forward / fetch_backward. columns: also the RunRows
  // of this forward for the backward's column check.
  std::function<void(const Sample& s, bool columns, SampledOutputs& got, RunRows& run)> fetch_sampled_forward;
  std::function<void(const Sample& s, SampledOutputs& got)> fetch_sampled_backward;
  std::function<void(double& L, std::vector<double>& LSE)> fetch_loss;
  std::function<void(Matrix<double>& dH, Matrix<double>& dW)> fetch_grads;
  int64_t dW_roundings = 1;              // r_W of (10.21): partial sums of dW rounded to the storage type
  std::function<int64_t()> device_peak;  // measured device workspace of the last call (a GPU layer)
};

// The LM head's entry points of an implementation (Impl::op == Operator::LmHeadCe), as Impl's
// attention ones: check, prepare (g: the incoming gradient dL), the host footprint, and the device
// bytes a forward or fused call allocates beyond its arguments (empty: a host layer).
struct LmHeadEntry {
  std::function<void(const LmHeadProblem& p, Dtype dtype)> check;
  std::function<Runner(const LmHeadProblem& p, const LmHeadInputs& in, double g, const ImplOptions& opt)> prepare;
  std::function<std::vector<MemPart>(const LmHeadProblem& p, Dtype dtype, const ImplOptions& opt, int threads)>
      footprint;
  std::function<int64_t(const LmHeadProblem& p, const ImplOptions& opt, bool backward)> device_bytes;
};

// The Engine (burstlab/engine.hpp) an implementation provides for the distributed schedules,
// per storage dtype (an empty maker: that dtype has no engine), and how a transport in this
// process reaches the engine's memory (empty: host memcpy / memset).
struct EngineMakers {
  std::function<std::unique_ptr<Engine<double>>(const ImplOptions&)> f64;
  std::function<std::unique_ptr<Engine<float>>(const ImplOptions&)> f32;
  std::function<std::unique_ptr<Engine<bf16_t>>(const ImplOptions&)> bf16;
  std::function<std::unique_ptr<Engine<f16_t>>(const ImplOptions&)> f16;
  std::function<void(void* dst, const void* src, int64_t bytes)> copy;
  std::function<void(void* buf, int64_t bytes)> poison;
  EngineFootprint footprint;  // what a rank's engine allocates per block call (resources.hpp)
  bool any() const { return f64 || f32 || bf16 || f16; }
  template <class T>
  std::unique_ptr<Engine<T>> make(const ImplOptions& o) const {  // the maker of T, called
    if constexpr (std::is_same_v<T, double>) return f64(o);
    else if constexpr (std::is_same_v<T, float>) return f32(o);
    else if constexpr (std::is_same_v<T, bf16_t>) return bf16(o);
    else return f16(o);
  }
  std::vector<Dtype> dtypes() const;
};

struct Impl {
  std::string name;                 // what --impl takes: "reference", "cpu", ...
  std::string about;                // one line for --help
  Operator op = Operator::Attention;
  std::vector<Dtype> dtypes;        // storage dtypes it runs
  std::vector<Dtype> suite_dtypes;  // the ones `burstlab suite` covers (subset of dtypes)
  bool has_backward = true;
  // Throws Error (naming the field and value) when the implementation cannot run this problem
  // with these options, beyond validate(p); may be empty. Called before anything is printed.
  std::function<void(const Problem& p, Dtype dtype, const ImplOptions& opt)> check;
  // inputs.dtype is one of `dtypes`; p is valid and passed check().
  std::function<Runner(const Problem& p, const Inputs& inputs, const ImplOptions& opt)> prepare;
  // The memory a prepared run holds at its peak (its copies in its dtype, what fetch_* returns,
  // its layer's workspace on `threads` OpenMP threads; a GPU layer's device memory as parts marked
  // device). `run` and `bench` refuse a problem whose host bytes do not fit before allocating
  // anything (resources.hpp). Empty: counted as nothing.
  Footprint footprint;
  Footprint sampled_footprint;  // the same under `--check-rows` when fetch_sampled_* serve the check; empty: footprint
  std::function<MemAvailable()> device_memory;  // a GPU layer: the device memory free now
  EngineMakers engines;             // `--algo` runs its schedules on these (cpu, cuda)
  LmHeadEntry lmhead;               // op == LmHeadCe: its entry points (check, prepare, footprint above unused)
};

// Every implementation built into this binary, of every operator, in table order.
const std::vector<Impl>& registry();
std::string registry_names(Operator op = Operator::Attention);  // "reference, cpu"
// The LM head's entries (impls_lmhead.cpp), appended to the registry. The cpu layer's tiles of
// the knobs (attention: Br, Bc; the LM head: Br, Bv; 0: its defaults).
void add_lmhead_impls(std::vector<Impl>& r);
inline cpu::Tiles cpu_tiles(const ImplOptions& o) {
  cpu::Tiles t;
  if (o.Br > 0) t.Br = o.Br;
  if (o.Bc > 0) t.Bc = o.Bc;
  return t;
}
cpu::LmHeadTiles lmhead_tiles(const ImplOptions& opt);

// "a,,b" -> {"a", "b"}: the entries of a comma-separated list, empty ones dropped (keep_empty: kept).
std::vector<std::string> split_commas(const std::string& list, bool keep_empty = false);
// "a, b,c" -> {"a", "b", "c"}, entries trimmed: the list syntax of --impl and --algo. An empty
// entry is an Error naming `field`, the list and what it may hold (`known`).
std::vector<std::string> split_list(const std::string& list, const char* field, const std::string& known);

// Looks up a comma-separated list ("reference,cpu") among the implementations of `op`; throws
// Error naming an unknown entry.
std::vector<const Impl*> find_impls(const std::string& list, Operator op = Operator::Attention);
// Throws Error unless `impl` runs `dtype` ("impl cpu does not run dtype bf16; it runs fp64,
// fp32"), then impl.check(p, dtype, opt) (the LM head's: impl.lmhead.check(p, dtype)).
void check_impl(const Impl& impl, const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward);
void check_impl(const Impl& impl, const LmHeadProblem& p, Dtype dtype);

std::string dtype_list(const std::vector<Dtype>& ts);  // "fp64, fp32"
double ms_since(std::chrono::steady_clock::time_point t0);  // host clock, milliseconds
std::function<double()> timed(std::function<void()> call);  // a pass: runs call, returns its ms

}  // namespace burstlab::tools
