// tools/layer_dist.hpp — the layer's attention (layer/layer.hpp) as a distributed attention on
// SimComm (spec §11.4). A forward is one Session's forward pass over the layer's Q, K, V; a
// backward is a fresh Session whose forward is loaded from the O and LSE the layer kept or
// recomputed (Session::load_forward), then its backward pass. So a placement that reruns the
// attention forward reruns the distributed forward, with its traffic, and one that keeps A and LSE
// never does. The bytes every pass sent are summed over ranks: measured, not modeled.
// The layer's other parts act on each token alone and move nothing under sequence parallelism;
// here they run on the whole sequence in one process.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>

#include "algorithm.hpp"
#include "burstlab/engine.hpp"
#include "layer.hpp"

namespace burstlab::tools {

struct DistTraffic {
  int64_t forward_passes = 0, backward_passes = 0;
  int64_t forward_sent = 0, backward_sent = 0;  // bytes sent, summed over ranks and passes
  int64_t forward_closed = 0, backward_closed = 0;  // the closed forms of the same passes (§7.5-7.14)
};

// No forward_rows: a distributed forward over a subset of the query rows is not a schedule here,
// so the sequence placement (when it recomputes rows) is refused by layer::forward.
template <class T>
layer::AttentionOps<T> distributed_attention(const dist::AlgoOptions& o, Engine<T>& engine,
                                             std::shared_ptr<DistTraffic> traffic);

}  // namespace burstlab::tools
