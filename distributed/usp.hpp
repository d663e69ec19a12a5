// distributed/usp.hpp — the head-context hybrid (USP, LoongTrain's 2D attention; BurstEngine's
// strongest baseline), spec §7.14: G = u x (G/u) ranks, rank r = g u + i is member i of group g
// (groups are consecutive ranks, e.g. the GPUs of a node). Inside a group, Ulysses: an
// all-to-all turns each member's sequence shard of all heads into the group's whole shard of
// H/u heads; across groups, a ring (burst or ring, `base`) over the G/u group shards of those
// heads, run by the ring executor on the ranks with the same i; then the all-to-all back. Needs
// u | G, u | H_q and u | H_kv.
#pragma once

#include <cstdint>

#include "burstlab/engine.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"
#include "schedule.hpp"

namespace burstlab::dist {

// Throws Error unless u >= 1, u divides G, H_q and H_kv (naming each field and value).
void check_usp(const Problem& p, int G, int u);

// The partition of the ring across groups: G/u shards, shard g = group g's members' shards laid
// end to end in member order (the layout after the group's all-to-all).
Partition usp_group_partition(const Partition& part, int u);
// The problem each ring rank solves: the H_q/u, H_kv/u heads of its member index.
Problem usp_head_problem(const Problem& p, int u);

// One rank's pass. `ring` is the schedule of the ring across groups (make_schedule on
// usp_head_problem and the group partitions, G/u ranks), of the phase.
template <class T>
void usp_forward(Communicator& comm, Engine<T>& engine, const Problem& p, const PreparedMask& mask, int u,
                 const Schedule& ring, const Partition& qp, const Partition& kp, Shard<T>& shard);
template <class T>
void usp_backward(Communicator& comm, Engine<T>& engine, const Problem& p, const PreparedMask& mask, int u,
                  const Schedule& ring, const Partition& qp, const Partition& kp, Shard<T>& shard);

// Closed form (spec 7.27): bytes rank r sends (sent) or receives in one phase.
int64_t usp_bytes(Algo base, Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int u, int r,
                  bool sent, ElemBytes w);

}  // namespace burstlab::dist
