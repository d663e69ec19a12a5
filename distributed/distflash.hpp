// distributed/distflash.hpp — DistFlashAttn's load-balanced causal schedule (Algorithm 2;
// spec §7.12). Contiguous partition, P ranks, a mask under which no query sees a key of a later
// rank (causal and its restrictions). Block (a, b) = rank a's queries x rank b's keys, b <= a.
//   step 0:      every rank computes its diagonal block (a, a);
//   step t = 1 .. floor(P/2):
//     owner:     rank a >= t computes (a, a - t), fetching K, V from a - t;
//     helper:    when t < P - t, the ranks h < t (idle otherwise) compute (h + P - t, h): the
//                block of distance P - t, with their own K, V and the owner's Q (fetched); the
//                partial (O, LSE) goes back to the owner, which merges it (4.5).
// Every block b <= a is computed exactly once; for odd P every rank is busy at every step. The
// backward mirrors it: an owner sends the dK, dV partial of (a, b) back to b; a helper sends the
// dQ partial back to a (fetching Q, dO, LSE, D); sums in step order (bitwise reproducible).
#pragma once

#include <cstdint>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"

namespace burstlab::dist {

enum class FlashRole { Idle, Owner, Helper };

struct FlashStep {
  FlashRole role = FlashRole::Idle;
  int q = -1, k = -1;   // the block this rank computes (q rank's queries x k rank's keys)
  int kv_dst = -1;      // sends its K, V to this owner (and, backward, gets the dK, dV partial back)
  int q_dst = -1;       // sends its Q to this helper and gets the (O, LSE) / dQ partial back
};

struct FlashSchedule {
  int P = 1;
  std::vector<std::vector<FlashStep>> steps;  // [rank][step], 1 + floor(P/2) steps
};

FlashSchedule make_distflash_schedule(int P);

// Idle fraction as the paper counts it (eq. 2): idle (rank, step) slots over P^2, the
// worker-steps of the unbalanced ring (which this normalization gives (P^2 - P) / 2P^2).
double distflash_idle_fraction(const FlashSchedule& s);

// Throws Error unless the partitions are contiguous and no query sees a key of a later rank.
void check_distflash(const MaskData& mask, const Partition& qp, const Partition& kp);

template <class T>
void run_distflash(Phase phase, Communicator& comm, Engine<T>& engine, const Problem& p, const PreparedMask& mask,
                   const FlashSchedule& s, const Partition& qp, const Partition& kp, Shard<T>& shard);

// Closed form (spec eq. 7.24-7.25), from the step counts of the rules above.
int64_t distflash_bytes(Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r, bool sent,
                        ElemBytes elem_bytes);

}  // namespace burstlab::dist
