// distributed/algorithm.hpp — one descriptor per algorithm (spec §7), in one table, like
// nccl-tests' one descriptor per collective: its name, spec section, requirement check and plan,
// the per-rank pass for each storage type, its closed-form bytes, its teaching trace and its
// simulator model. A `Session` (session.hpp), `burstlab run --algo`, `schedule`, `simulate`,
// `conform` and the tests all iterate this table; adding an algorithm is adding its file and one
// entry in algorithm.cpp.
#pragma once

#include <cstdint>
#include <optional>
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
#include "simulate.hpp"
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

// What `burstlab schedule --json/--svg` can draw of an algorithm's schedule.
enum class Drawing {
  None,        // the teaching trace only
  Ring,        // one ring-type Schedule per phase (ring, burst)
  DoubleRing,  // the double ring's Schedule, its traffic from AlgoOptions::base
  Flash,       // DistFlashAttn's FlashSchedule
};

// A teaching trace: the text, and whether every traced byte count equals its closed form.
struct Trace {
  std::string text;
  bool ok = true;
};

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
  // The step-by-step text of the phases asked for (traces.hpp): what each rank holds, computes
  // and sends, then its bytes next to the closed forms.
  Trace (*trace)(const Plan& plan, ElemBytes w, bool fwd, bool bwd);
  // The alpha-beta model of one phase (spec §7.10) on cluster c (nodes x gpus_per_node = world),
  // elem_bytes per element; overlap: compute and communication overlap where the model lets them.
  // Null: no model of its own (attention2d-o: §7.13).
  Prediction (*simulate)(const Plan& plan, Phase phase, const Cluster& c, int64_t elem_bytes, bool overlap);
  // The partition it requires, if any (attention2d: striped, distflash: contiguous); the
  // simulator uses it in place of --partition.
  std::optional<PartitionKind> partition;
  // It sends to one neighbour and receives from the other in every step (ring, burst): the
  // bytes table of `burstlab run` names that link intra- or inter-node.
  bool ring_links;
  // The algorithm `--overlap` turns this one into (attention2d: attention2d-o); null: none.
  const char* overlapped;
  // It takes `--grid RxC` (attention2d, attention2d-o).
  bool grid;
  // It runs Ulysses in groups of AlgoOptions::ulysses_degree ranks (usp).
  bool ulysses_groups;
  // Its rings follow the nodes: one per node of gpus_per_node ranks inside a ring across nodes
  // (double-ring).
  bool node_rings;
  // What `burstlab schedule --json/--svg` draws of it.
  Drawing drawing;
  // A rank holds many ranks' K, V shards at once (allgather's all-gather, Attention2D's column:
  // gathered by -NO, the column ring's buffer of -O): how many, held_kv_shards.
  bool gathers_kv;
  // What its ring steps carry as the executor's traffic (schedule.hpp: ring's K, V and returning
  // dK, dV; burst's Q, dO, D, LSE, dQ); double-ring's and usp's --ring names one that has it.
  std::optional<Algo> ring_traffic;
};

const std::vector<Algorithm>& algorithms();
std::string algorithm_names();                          // "ring, burst, double-ring, ..."
const Algorithm& find_algorithm(const std::string& name);  // Error naming "algo" and every name
// The executor's traffic of --ring's value (an algorithm with ring_traffic); Error naming "ring".
Algo ring_traffic_of(const std::string& name);

// Partitions, mask and the algorithm's checks and schedules, before anything runs.
Plan make_plan(const Problem& p, const AlgoOptions& o);
// The SimWorld options of a run with o (o.sim, its link classes from o.gpus_per_node).
SimOptions sim_options(const AlgoOptions& o);

template <class T> PassFn<T> pass_of(const Algorithm& a);
template <> inline PassFn<double> pass_of<double>(const Algorithm& a) { return a.f64; }
template <> inline PassFn<float> pass_of<float>(const Algorithm& a) { return a.f32; }
template <> inline PassFn<bf16_t> pass_of<bf16_t>(const Algorithm& a) { return a.bf16; }
template <> inline PassFn<f16_t> pass_of<f16_t>(const Algorithm& a) { return a.f16; }

// Closed-form bytes of the plan's algorithm (Algorithm::bytes).
int64_t plan_bytes(const Plan& plan, Phase phase, int r, bool sent, ElemBytes w, int link = -1);

// The K, V shards (and in the backward dK, dV) one rank holds at once, for the memory estimate
// of `run` and `conform`: 2 (its own and one in flight) unless the algorithm gathers
// (Algorithm::gathers_kv): allgather the G shards and the G - 1 staged on arrival; attention2d
// the p_r shards of its column, the p_r - 1 staged and the transposed one; attention2d-o its
// column buffer (p_r), the transposed shard and two staged blocks.
int held_kv_shards(const AlgoOptions& o);

}  // namespace burstlab::dist
