// cuda/cuda_engine.hpp — the Engine (burstlab/engine.hpp, spec §7.3) over this layer: device
// memory, blocks by forward_block / backward_block, merge and D as kernels. Storage fp32, bf16_t,
// f16_t (fp64 too); A = acc_t<T>: LSE, D and the gradient partials stay fp32 (spec §9.1).
// One engine may serve many threads at once (SimComm's ranks): each calling thread gets its own
// compute stream, so calls of one thread run in order and those of different threads overlap;
// synchronize() waits for the calling thread's stream. The engine uses the current device.
#pragma once

#include <memory>

#include "burstlab/engine.hpp"
#include "cuda.hpp"

namespace burstlab::cuda {

template <class T>
std::unique_ptr<Engine<T>> make_engine(Variant forward = Variant::Auto);

// The calling thread's compute stream of an engine made by make_engine (a cudaStream_t), for a
// library that queues its own kernels in the engine's order (plugins/cudnn); throws for any other
// engine.
template <class T>
void* stream_of(const Engine<T>& e);
// Device memory of such an engine that ONLY the calling thread's stream will read and write
// until it is freed (a library's per-call scratch): unlike allocate, it may take a block that
// stream freed while work on it is still queued, without the host waiting for that work.
template <class T>
std::shared_ptr<void> scratch_of(Engine<T>& e, int64_t bytes);

// Device-to-device copies and 0xff poisoning for a transport over this device's memory
// (dist::SimOptions::memory): each call runs on a stream of the calling (transfer) thread and
// returns when done.
void transport_copy(void* dst, const void* src, int64_t bytes);
void transport_poison(void* dst, int64_t bytes);

}  // namespace burstlab::cuda
