// tools/impls.hpp — the registry of implementations the `burstlab` tool can run and check.
// An implementation is plain data: a name, the dtypes it runs, and a `prepare` function that
// takes seeded inputs (harness.hpp) and returns closures that run its forward and backward.
// A new layer plugs in by adding an entry in impls.cpp (cuda: the BURSTLAB_HAVE_CUDA block);
// `run`, `suite` and `bench` pick it up without other changes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "harness.hpp"
#include "resources.hpp"  // Footprint

namespace burstlab::tools {

// Knobs an implementation may honour. 0 = the implementation's default.
struct ImplOptions {
  int64_t Br = 0;  // query rows per tile (--br)
  int64_t Bc = 0;  // keys per tile (--bc)
};

// One prepared run: the implementation has converted the inputs to its dtype, placed them where
// it computes (host or device) and poisoned its outputs (NaN, spec §9.3).
//   forward()  runs the forward once and returns its time in ms (host clock on a CPU; a device
//              timer is fine on a GPU). Synchronous: results are complete on return.
//   backward() runs the backward once, from the impl's OWN O and LSE of the last forward()
//              (spec §9.6: the candidate backward uses its own forward); returns ms.
//              Empty when the implementation has no backward.
//   fetch_*()  copy the outputs back as double (exact for every dtype).
struct Runner {
  std::function<double()> forward;
  std::function<double()> backward;
  std::function<void(Tensor4<double>& O, Tensor3<double>& LSE)> fetch_forward;
  std::function<void(Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV)> fetch_backward;
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
  bool any() const { return f64 || f32 || bf16 || f16; }
  std::vector<Dtype> dtypes() const;
};

struct Impl {
  std::string name;                 // what --impl takes: "reference", "cpu", ...
  std::string about;                // one line for --help
  std::vector<Dtype> dtypes;        // storage dtypes it runs
  std::vector<Dtype> suite_dtypes;  // the ones `burstlab suite` covers (subset of dtypes)
  bool has_backward = true;
  // Throws Error (naming the field and value) when the implementation cannot run this problem
  // with these options, beyond validate(p); may be empty. Called before anything is printed.
  std::function<void(const Problem& p, Dtype dtype, const ImplOptions& opt)> check;
  // inputs.dtype is one of `dtypes`; p is valid and passed check().
  std::function<Runner(const Problem& p, const Inputs& inputs, const ImplOptions& opt)> prepare;
  // Host bytes a prepared run holds at its peak (its copies in its dtype, what fetch_* returns,
  // its workspace on `threads` OpenMP threads), one plain function in resources.cpp per
  // implementation. `run` and `bench` refuse a problem that does not fit before allocating
  // anything (resources.hpp). Empty: counted as nothing.
  Footprint footprint;
  EngineMakers engines;             // `--algo` runs its schedules on these (cpu, cuda)
};

// Every implementation built into this binary, in table order.
const std::vector<Impl>& registry();
std::string registry_names();  // "reference, cpu"

// "a, b,c" -> {"a", "b", "c"}, entries trimmed: the list syntax of --impl and --algo. An empty
// entry is an Error naming `field`, the list and what it may hold (`known`).
std::vector<std::string> split_list(const std::string& list, const char* field, const std::string& known);

// Looks up a comma-separated list ("reference,cpu"); throws Error naming an unknown entry.
std::vector<const Impl*> find_impls(const std::string& list);
// Throws Error unless `impl` runs `dtype` ("impl cpu does not run bf16; it runs fp64, fp32"),
// then impl.check(p, dtype, opt).
void check_impl(const Impl& impl, const Problem& p, Dtype dtype, const ImplOptions& opt, bool backward);

std::string dtype_list(const std::vector<Dtype>& ts);  // "fp64, fp32"

}  // namespace burstlab::tools
