// distributed/algorithm.hpp — one descriptor per algorithm (spec §7), in one table, like
// nccl-tests' one descriptor per collective: its name, spec section, requirement check and plan,
// the per-rank pass for each storage type, and its closed-form bytes. A `Session` (session.hpp),
// `burstlab run --algo`, `conform` and the tests all iterate this table; adding an algorithm is
// adding its file and one entry in algorithm.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention2d.hpp"
#include "burstlab/engine.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "distflash.hpp"
#include "partition.hpp"
#include "ring.hpp"
#include "schedule.hpp"
#include "sim_comm.hpp"
#include "usp.hpp"

namespace burstlab::dist {

// The options of every algorithm; fields an algorithm does not use are ignored.
struct AlgoOptions {
  std::string algo = "burst";  // a name in algorithms()
  PartitionKind partition = PartitionKind::Contiguous;
  int world = 1;
  int gpus_per_node = 0;       // link classes, and the double ring's K (0 = one node)
  Algo base = Algo::Burst;     // double-ring, usp: which tensors travel (burst = BurstAttention's backward)
  bool prefetch_inter = true;  // double-ring: the separate inter-node buffer (§7.9)
  Grid grid{0, 0};             // attention2d, attention2d-o: p_r x p_c (p_r = 0: default_grid(world))
  int ulysses_degree = 0;      // usp: ranks per Ulysses group u (0: gpus_per_node)
  bool backward = true;
  SimOptions sim;              // SimComm's options (sim.gpus_per_node is set from gpus_per_node)
};

// What an algorithm sets up once per problem: the compiled mask, the partitions, and its
// schedules (those it has).
struct Plan {
  Problem p;
  AlgoOptions o;
  MaskData mask;
  Partition qp, kp;
  Schedule fwd, bwd;    // ring, burst, double-ring; usp: its ring across groups (bwd empty without a backward)
  FlashSchedule flash;  // distflash
  Grid grid;            // attention2d, attention2d-o
};

// One rank's pass of phase `phase` (forward fills shard.O, LSE; backward shard.dQ, dK, dV).
template <class T>
using PassFn = void (*)(Phase phase, const Plan& plan, Communicator& comm, Engine<T>& engine,
                        const PreparedMask& mask, Shard<T>& shard);

struct Algorithm {
  const char* name;     // what --algo takes
  const char* spec;     // its section of docs/spec.md
  const char* summary;  // what travels, one line
  // Requirement checks (an Error naming the field and its value) and the plan's schedules.
  void (*prepare)(Plan& plan);
  PassFn<double> f64;
  PassFn<float> f32;
  PassFn<bf16_t> bf16;
  PassFn<f16_t> f16;
  // The closed form of the bytes rank r sends (sent) or receives in one phase; link -1: both
  // classes, 0: intra-node, 1: inter-node (only the double ring distinguishes them).
  int64_t (*bytes)(const Plan& plan, Phase phase, int r, bool sent, ElemBytes w, int link);
};

const std::vector<Algorithm>& algorithms();
std::string algorithm_names();                          // "ring, burst, double-ring, ..."
const Algorithm& find_algorithm(const std::string& name);  // Error naming "algo" and every name

// Partitions, mask and the algorithm's checks and schedules, before anything runs.
Plan make_plan(const Problem& p, const AlgoOptions& o);

template <class T> PassFn<T> pass_of(const Algorithm& a);
template <> inline PassFn<double> pass_of<double>(const Algorithm& a) { return a.f64; }
template <> inline PassFn<float> pass_of<float>(const Algorithm& a) { return a.f32; }
template <> inline PassFn<bf16_t> pass_of<bf16_t>(const Algorithm& a) { return a.bf16; }
template <> inline PassFn<f16_t> pass_of<f16_t>(const Algorithm& a) { return a.f16; }

// Closed-form bytes of the plan's algorithm (Algorithm::bytes).
int64_t plan_bytes(const Plan& plan, Phase phase, int r, bool sent, ElemBytes w, int link = -1);

}  // namespace burstlab::dist
