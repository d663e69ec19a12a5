// distributed/baselines.hpp — the two non-ring baselines of spec §7.7-7.8, written once against
// an Engine and a Communicator like the rings (ring.hpp), on the same Shard<T>:
//   Ulysses (DeepSpeed-Ulysses, head parallelism): an all-to-all turns each rank's sequence
//     shard of all heads into all positions of H/G heads; every rank computes full attention on
//     its heads; a second all-to-all turns (O, LSE) back into sequence shards. Needs
//     H_q % G == 0 and H_kv % G == 0 (each rank must own whole kv heads of its q heads).
//   All-gather CP (Megatron-CP style): every rank gathers all K, V and computes its own queries
//     against them; the backward gathers K, V again, computes dQ at home and partial dK, dV for
//     every key, then reduce-scatters dK, dV to their owners (sum in rank order 0..G-1).
// Shards may be ragged (any partition, N % G != 0): the collectives are written as per-(b, head)
// point-to-point messages of contiguous rows, so unequal shard lengths need no padding, and the
// rank's own piece is copied through the host (engine-agnostic).
#pragma once

#include <cstdint>

#include "burstlab/engine.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"

namespace burstlab::dist {

// Throws Error unless H_q % G == 0 and H_kv % G == 0 (names the field, its value and G).
void check_ulysses(const Problem& p, int G);

// One pass of Ulysses (ulysses true) or all-gather CP: the forward fills shard.O, shard.LSE; the
// backward needs Q, K, V, dO, O, LSE and fills dQ, dK, dV.
template <class T>
void run_collective(bool ulysses, Phase phase, Communicator& comm, Engine<T>& engine, const Problem& p,
                     const PreparedMask& mask, const Partition& qp, const Partition& kp, Shard<T>& shard);

// Closed forms (spec eq. 7.10-7.13): bytes rank r sends (sent) or receives in one
// phase; written from the formulas, not from an execution.
int64_t ulysses_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r,
                      bool sent, ElemBytes elem_bytes);
int64_t allgather_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r,
                        bool sent, ElemBytes elem_bytes);

}  // namespace burstlab::dist
