// distributed/cpu_engine.hpp — the Engine over cpu/ (tiled online softmax, LAO on a CPU).
#pragma once

#include <memory>

#include "cpu.hpp"
#include "engine.hpp"

namespace burstlab::dist {

template <class T>
std::unique_ptr<Engine<T>> make_cpu_engine(cpu::Tiles tiles = {});

}  // namespace burstlab::dist
