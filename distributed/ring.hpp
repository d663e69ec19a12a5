// distributed/ring.hpp — the executors: run a ring schedule (schedule.hpp) on one rank, with an
// Engine for compute and a Communicator for transfers (spec §7.3). Written once for every
// engine and transport.
//
// Double buffering (§7.3): every travelling tensor has two slots. At step t the rank computes on
// slot t % 2 (at t = 0 on its home tensors); the receives for step t + 1 (into slot (t+1) % 2)
// and the sends of read-only tensors are posted BEFORE the compute of step t, so on SimComm the
// transfer threads copy while the rank computes. Accumulated tensors (dK, dV or dQ) are sent
// after the compute that updates them. A step ends by waiting on all its requests, except the
// double ring's prefetched inter-node hops (Message::lands > 0, spec §7.9): they go into two
// extra inter-node slots per tensor and are waited for only before the step that reads them.
#pragma once

#include <cstdint>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/engine.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "schedule.hpp"

namespace burstlab::dist {

// One rank's local tensors in engine memory, BHSD over its local length:
// Q, dO, O, dQ (B, H_q, n_q, d); LSE (B, H_q, n_q); K, V, dK, dV (B, H_kv, n_k, d).
// Storage T for inputs and O; A = acc_t<T> for LSE and the gradients (spec §9.1).
template <class T>
struct Shard {
  using A = acc_t<T>;
  int64_t n_q = 0, n_k = 0;
  Buffer<T> Q, K, V, dO;   // inputs (dO for the backward only)
  Buffer<T> O;             // forward output; backward input
  Buffer<A> LSE;
  Buffer<A> dQ, dK, dV;    // backward outputs
  Buffer<A> D;             // (B, H_q, n_q), eq. (5.1): the ring backward computes it from O, dO
                           // unless given (a schedule that moved D instead of O, e.g. usp)
};

// One pass of either algorithm (§7.2) on one rank, its phase s.phase. Forward: fills (allocating
// if empty) shard.O, shard.LSE. Backward (RingAttention or BurstAttention per s.algo): needs Q, K,
// V, dO and the forward's O, LSE; fills (allocating if empty) shard.dQ, dK, dV.
template <class T>
void run_ring(const Schedule& s, Communicator& comm, Engine<T>& engine, const Problem& p, const PreparedMask& mask,
              const Partition& qp, const Partition& kp, Shard<T>& shard);

struct Plan;  // algorithm.hpp
// The pass of ring, burst and double-ring in the algorithm table (algorithm.hpp's PassFn): run_ring
// on plan.fwd or plan.bwd, which must be of `phase`.
template <class T>
void ring_pass(Phase phase, const Plan& plan, Communicator& comm, Engine<T>& engine, const PreparedMask& mask,
               Shard<T>& shard);

}  // namespace burstlab::dist
