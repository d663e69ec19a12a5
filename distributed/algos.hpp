// distributed/algos.hpp — the schedules of spec §7.7-7.9 end to end on SimComm, like run_sim
// (sim_run.hpp) for ring and burst: double-ring, ulysses, allgather, attention2d (§7.11).
#pragma once

#include <string>
#include <vector>

#include "attention2d.hpp"
#include "distflash.hpp"
#include "baselines.hpp"  // check_ulysses, the closed forms
#include "double_ring.hpp"
#include "sim_run.hpp"

namespace burstlab::dist {

enum class ExtAlgo { DoubleRing, Ulysses, AllGather, Attention2D, DistFlash };
std::string to_string(ExtAlgo a);
bool is_ext_algo(const std::string& s);   // "double-ring|ulysses|allgather|attention2d|distflash"
ExtAlgo parse_ext_algo(const std::string& s);

struct ExtOptions {
  ExtAlgo algo = ExtAlgo::Ulysses;
  PartitionKind partition = PartitionKind::Contiguous;
  int world = 1;
  int gpus_per_node = 0;     // double ring: K (must divide world); 0 = world (one node)
  Algo base = Algo::Burst;   // double ring: which tensors travel (burst = BurstAttention backward)
  bool prefetch_inter = true;  // double ring: the separate inter-node buffer (spec §7.9; false: one hop per step)
  Grid grid{0, 0};           // attention2d: p_r x p_c (p_r = 0: default_grid(world))
  bool overlap = false;      // attention2d: the overlapped variant (Attention2D-O, §7.13)
  bool backward = true;
  SimOptions sim;            // sim.gpus_per_node is set from gpus_per_node when that is > 0
};

// As run_sim: every rank's local outputs (BHSD, partition order) and logs; fwd/bwd hold the
// double ring's schedules (empty for ulysses and allgather, which are collectives).
template <class T>
DistResult<T> run_sim_ext(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
                          View4<const double> dO, const ExtOptions& o, Engine<T>& engine,
                          std::vector<std::string>* rank_errors = nullptr);

// The algorithms of §7.7-7.13 with these options: a Session (sim_run.hpp) of the algorithm.
AlgoOptions algo_options(const ExtOptions& o);
template <class T>
class ExtSession : public Session<T> {
 public:
  ExtSession(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
             View4<const double> dO, const ExtOptions& o, Engine<T>& engine)
      : Session<T>(p, Q, K, V, dO, algo_options(o), engine) {}
};

// The closed form of the algorithm's bytes (spec 7.7-7.9) for rank r in one phase; link is
// only meaningful for the double ring (-1 = both classes).
int64_t ext_closed_form_bytes(const ExtOptions& o, Phase phase, const Problem& p, const Partition& qp,
                              const Partition& kp, int r, bool sent, ElemBytes elem_bytes, int link = -1);

}  // namespace burstlab::dist
