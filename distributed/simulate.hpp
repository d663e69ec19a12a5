// distributed/simulate.hpp — the alpha-beta simulator (spec §7.10). Replays a schedule (the data
// of schedule.hpp / double_ring.hpp, or a collective's per-peer messages for ulysses and
// all-gather) under a cost model and predicts time per step and in total, exposed
// communication, and bytes per link class. Nothing is executed.
//   link cost      T(bytes) = alpha + bytes / bandwidth, one model per link class (intra, inter);
//                  one message = one travelling tensor's shard (Table 1's P).
//   compute        FLOPs / F; forward 4 d FLOPs per visible (i, j) pair per q head
//                  (QK^T and PV), backward 10 d (S recomputed, dP, dV, dQ, dK); F per phase and,
//                  where measured apart, per mask class (flops_rate).
//   comm models    lockstep       (flat ring): a step lasts as long as the slowest rank's sends,
//                                 sum over its messages: one inter-node hop slows every rank;
//                  topology-aware (double ring, separate buffers): intra and inter links are
//                                 separate railways, a tensor's hops over a phase cost
//                                 max(sum intra, sum inter); accumulated tensors (gradients) cost
//                                 sum intra + sum inter unless overlap_grads (BurstEngine Fig. 5).
//                  collective     (ulysses, all-gather): per rank max(sum intra, sum inter) over
//                                 its messages, never overlapped with compute (it must finish first).
//                  usp            the all-to-all inside each group (collective), the ring across
//                                 groups (lockstep), the all-to-all back, one after the other.
//   overlap        with: a step costs max(compute, comm before) + comm after, where "after" is
//                  the traffic the executor posts after the step's compute (the backward's last
//                  partial sums, home; lockstep model); without: compute + comm. The executor's
//                  zeroing and adding of partial sums (memory passes) are not priced.
// The backward's gradients make G - 1 hops as partial sums (spec §7.3): table1 = true adds the
// first hop back, as Table 1 counts it.
// table1 = true replays with BurstEngine Table 1's accounting: every travelling tensor moves
// G times (the read-only ones' useless last hop included, on the link the return hop uses) and
// the per-row tensors D, LSE are left out; the executed schedules skip that hop (default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "attention2d.hpp"
#include "distflash.hpp"
#include "partition.hpp"
#include "schedule.hpp"
#include "usp.hpp"

namespace burstlab::dist {

struct LinkCost {
  double alpha_s = 0;       // latency per message (s)
  double bytes_per_s = 1;   // bandwidth (bytes / s)
  double time(double bytes) const { return alpha_s + bytes / bytes_per_s; }
};

struct Cluster {
  std::string name, note;
  int nodes = 1, gpus_per_node = 1;
  LinkCost intra, inter;  // inter.bytes_per_s = 0: none known (a one-node preset)
  double flops_per_s = 1e12;  // attention FLOP rate per device
  double flops_per_s_backward = 0;  // the backward's rate, when measured apart (0: flops_per_s)
  // The rates on problems without a mask (is_full), when measured apart (0: the two above): a
  // kernel's rate on a causal problem and on an unmasked one differ by up to ~12% (measured).
  double flops_per_s_full = 0, flops_per_s_backward_full = 0;
};
// Presets for the papers' clusters (bandwidths from the papers; latencies and FLOP rates are
// stated assumptions, see each note): a100-pcie (1 x 8 A100, PCIe), a100-roce (4 x 8 A100,
// 600 Gb/s RoCE per node), a800-32 / a800-64 (4 or 8 x 8 A800, NVLink 400 GB/s, 8 x 200 Gb/s IB
// per node). And the machines this project measures on, one node each: h100-x2/-x4/-x8 (H100
// SXM over NVLink) and h200-x2/-x4/-x8 (H200 over NVLink), FLOP rates measured on one GPU of
// that kind by burstlab's CUDA kernels (simulate.cpp cites each), link figures assumptions.
const std::vector<Cluster>& cluster_presets();
Cluster cluster_preset(const std::string& name);  // throws Error naming the presets

enum class CommModel { Lockstep, TopologyAware, Collective };

struct SimSpec {
  CommModel model = CommModel::Lockstep;
  bool overlap = true;
  bool overlap_grads = true;  // topology-aware: gradients overlapped (BurstEngine) or not (DoubleRing)
  bool table1 = false;
  bool double_ring = false;   // the schedule's hops follow double_ring.hpp (for the table1 return hop)
};

struct Prediction {
  std::vector<double> step_s;   // per step: max over ranks (lockstep) or compute per step
  double compute_s = 0;         // busiest rank's compute
  double comm_s = 0;            // communication time (model above)
  double total_s = 0;           // with or without overlap
  double exposed_comm_s = 0;    // total_s - compute_s
  int64_t bytes_intra = 0, bytes_inter = 0;  // sent bytes per link class, max over ranks
};

// FLOPs of one visible pair per q head: 4 d (forward), 10 d (backward).
double flops_per_pair(Phase phase, int64_t d);
// The FLOP rate that prices one phase of p: the backward's rate for the backward when set (> 0),
// and on a problem without a mask the _full rate when set (> 0).
double flops_rate(const Cluster& c, Phase phase, const Problem& p);

// Replays one phase of a ring-family schedule.
Prediction simulate_schedule(const Schedule& s, const Problem& p, const Partition& qp, const Partition& kp,
                             const Cluster& c, int64_t elem_bytes, const SimSpec& spec);
// Ulysses and all-gather CP (one phase) from their per-peer messages (baselines.hpp, spec §7.7-7.8; model 7.20).
Prediction simulate_ulysses(Phase phase, const Problem& p, const MaskData& mask, const Partition& qp,
                            const Partition& kp, const Cluster& c, int64_t elem_bytes);
Prediction simulate_allgather(Phase phase, const Problem& p, const MaskData& mask, const Partition& qp,
                              const Partition& kp, const Cluster& c, int64_t elem_bytes);

// Attention2D-NO (§7.11): rounds transpose, gathers, reduce-scatters (, transpose back), each
// max(sum intra, sum inter); never overlapped. DistFlashAttn (§7.12): lockstep per step.
Prediction simulate_attention2d(Phase phase, const Problem& p, const MaskData& mask, const Grid& g,
                                const Partition& qp, const Partition& kp, const Cluster& c, int64_t elem_bytes);
Prediction simulate_distflash(Phase phase, const Problem& p, const MaskData& mask, const Partition& qp,
                              const Partition& kp, const Cluster& c, int64_t elem_bytes, bool overlap = true);

// USP (§7.14): the all-to-all in each group of u consecutive ranks (the collective model 7.20, on
// the slowest rank), then the ring across the G/u groups (lockstep 7.18: `ring` is its schedule of
// the phase, on usp_head_problem(p, u) and the group partitions; ring rank g = world ranks g u + i),
// then the all-to-all back: total = a2a_in + ring total + a2a_back; step_s = (a2a_in, the ring's
// steps, a2a_back). Needs u | gpus_per_node (groups inside nodes) or gpus_per_node | u.
Prediction simulate_usp(Phase phase, const Problem& p, int u, const Schedule& ring, const Partition& qp,
                        const Partition& kp, const Cluster& c, int64_t elem_bytes, bool overlap = true);

// BurstEngine Table 1 (forward + backward communication time), written from the paper:
// N rounds, N_inter nodes, T = Lat + P / B per link class.
double table1_ring(int N, double T_intra, double T_inter);
double table1_double_ring(int N, int N_inter, double T_intra, double T_inter);
double table1_burst(int N, int N_inter, double T_intra, double T_inter);

}  // namespace burstlab::dist
