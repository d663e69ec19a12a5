// plugin/plugin_engine.hpp — an Engine<T> (burstlab/engine.hpp) over a shared library that
// implements the C ABI of burstlab/plugin.h: load() dlopen()s it and checks it, make_engine<T>()
// forwards every Engine call to it. A call the plug-in declines is an Error naming the plug-in,
// the entry and its reason; any other failure a std::runtime_error with its message.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/plugin.h"
#include "burstlab/precision.hpp"

namespace burstlab::plugin {

// A loaded plug-in. Never unloaded: its threads (OpenMP, CUDA) may outlive any one engine.
struct Library {
  std::string path;                            // as given to load()
  const burstlab_api_v1* api = nullptr;     // the table its entry point returned
  std::string name;                            // api->name
  std::vector<Dtype> dtypes;                   // api->dtypes, in Dtype order
  bool device = false;                         // api->memory == BURSTLAB_MEMORY_DEVICE
};

// dlopen(path) and the checks of plugin.h (the entry point, its ABI version, the entries the
// memory kind requires); throws Error naming the path and what is wrong.
std::shared_ptr<const Library> load(const std::string& path);

// A new engine of storage type T (a dtype the plug-in lists; else Error).
template <class T>
std::unique_ptr<Engine<T>> make_engine(std::shared_ptr<const Library> lib);

// Throws Error with the plug-in's reason when its `supports` declines the whole problem p as one
// forward or backward block over contiguous positions; nothing when it has no `supports`.
void check_supports(const Library& lib, const Problem& p, Dtype dtype, const MaskData& mask, bool backward);

// The transport's device copies and 0xff fills (a device plug-in's transport_copy/_poison).
void transport_copy(const Library& lib, void* dst, const void* src, int64_t bytes);
void transport_poison(const Library& lib, void* dst, int64_t bytes);

// The C forms of the contract's types (shared with plug-ins written in C++).
burstlab_problem to_c(const Problem& p);
burstlab_mask to_c(const MaskParams& m);
burstlab_positions to_c(Positions q);
burstlab_dtype to_c(Dtype t);

}  // namespace burstlab::plugin
