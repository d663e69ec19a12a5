// cpu/cpu_engine.hpp — the Engine (burstlab/engine.hpp, spec §7.3) over this layer: host memory,
// blocks by forward_block / backward_block (LAO on a CPU). fp32 and fp64 (A = T). Stateless
// apart from its tile sizes, so one engine may serve every simulated rank's thread at once.
#pragma once

#include <memory>

#include "burstlab/engine.hpp"
#include "cpu.hpp"

namespace burstlab::cpu {

template <class T>
std::unique_ptr<Engine<T>> make_engine(Tiles tiles = {});

}  // namespace burstlab::cpu
