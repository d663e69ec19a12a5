// distributed/double_ring.hpp — the topology-aware double ring (BurstEngine §3.1, LoongTrain's
// DoubleRing; spec §7.9). G = M x K ranks, M nodes of K GPUs; rank r = n K + g is GPU g of node
// n. A shard makes K-1 intra-node hops (g -> g+1 inside node n), then one inter-node hop
// (n, g) -> (n+1, g+1); repeated M times, every shard visits every rank once:
//   at step t = a K + b, rank (n, g) holds shard ((n - a) mod M) K + (g - b) mod K.
// Per rank and phase the travelling tensors make G - M intra-node hops and M - 1 inter-node
// hops (accumulated ones one more inter-node hop home): Table 1's (N - N_inter) intra and
// N_inter inter transfers. Every rank crosses nodes in the same steps, so all NICs of a node
// work at once (BurstEngine Fig. 4). With prefetch_inter (the default), the read-only tensors'
// inter-node hop is BurstEngine's separate inter-node buffer (Fig. 5): at the start of round a
// (step aK) rank (n, g) posts the shard it holds to (n+1, g), into that rank's inter-node slots,
// and the transfer stays in flight during the K intra-node steps; (n+1, g) computes on it at step
// (a+1)K. The shard held at every step, hence every block and merge, is unchanged (bitwise equal
// results); accumulated tensors (dQ; dK, dV) keep the one-hop-per-step path, since they are still
// being accumulated during the round. The schedule is an
// ordinary Schedule (schedule.hpp) with base algo Ring or Burst (which tensors travel: the
// backward uses BurstAttention's traffic by default), so ring.hpp's executor runs it unchanged.
#pragma once

#include <cstdint>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "schedule.hpp"

namespace burstlab::dist {

// Throws Error unless gpus_per_node >= 1 divides G (names both).
void check_double_ring(int G, int gpus_per_node);

// Shard rank r holds at step t (the formula above); K = gpus_per_node, M = G / K.
int double_ring_shard(int r, int t, int G, int gpus_per_node);
// True when the hop rank r makes after step t crosses nodes (t mod K == K-1, and M > 1).
bool double_ring_inter_hop(int t, int G, int gpus_per_node);

// Throws Error unless gpus_per_node >= 1 divides qp.G.
// prefetch_inter: see above (only changes anything when M > 1 and K > 1).
Schedule make_double_ring_schedule(Algo base, Phase phase, const Problem& p, const MaskData& mask,
                                   const Partition& qp, const Partition& kp, int gpus_per_node,
                                   bool prefetch_inter = true);

// Closed form (spec §7.9, eq. 7.14-7.15): bytes rank r sends (sent) or receives over link class `link`
// (0 intra, 1 inter, -1 both) in one phase of the double ring with base algo `base`.
int64_t double_ring_bytes(Algo base, Phase phase, const Problem& p, const Partition& qp, const Partition& kp,
                          int r, bool sent, ElemBytes elem_bytes, int gpus_per_node, int link,
                          bool prefetch_inter = true);

}  // namespace burstlab::dist
