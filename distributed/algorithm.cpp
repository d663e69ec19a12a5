// distributed/algorithm.cpp — the table of algorithms (spec §7).
#include "algorithm.hpp"

#include "baselines.hpp"
#include "burstlab/error.hpp"
#include "burstlab/names.hpp"
#include "double_ring.hpp"
#include "traces.hpp"

namespace burstlab::dist {

namespace {

int gpn(const AlgoOptions& o) { return o.gpus_per_node > 0 ? o.gpus_per_node : o.world; }
bool fwd(Phase ph) { return ph == Phase::Forward; }

// ---- ring and burst (§7.2-7.6): the executor of ring.hpp on make_schedule
void prepare_ring(Plan& pl, Algo a) {
  pl.fwd = make_schedule(a, Phase::Forward, pl.p, pl.mask, pl.qp, pl.kp);
  if (pl.o.backward) pl.bwd = make_schedule(a, Phase::Backward, pl.p, pl.mask, pl.qp, pl.kp);
}
int64_t ring_bytes(const Plan& pl, Phase ph, int r, bool sent, ElemBytes w, int) {
  return closed_form_bytes(pl.fwd.algo, ph, pl.p, pl.qp, pl.kp, r, sent, w);
}
const Schedule& schedule_of(const Plan& pl, Phase ph) {
  if (!fwd(ph) && !pl.o.backward) fail("the plan of ", pl.o.algo, " has no backward (AlgoOptions::backward)");
  return fwd(ph) ? pl.fwd : pl.bwd;
}
Prediction ring_model(const Plan& pl, Phase ph, const Cluster& c, int64_t eb, bool overlap) {  // lockstep (7.18)
  SimSpec spec;
  spec.overlap = overlap;
  return simulate_schedule(schedule_of(pl, ph), pl.p, pl.qp, pl.kp, c, eb, spec);
}

// ---- the double ring (§7.9): the same executor on a two-level schedule
void prepare_double_ring(Plan& pl) {
  check_double_ring(pl.o.world, gpn(pl.o));
  pl.fwd = make_double_ring_schedule(pl.o.base, Phase::Forward, pl.p, pl.mask, pl.qp, pl.kp, gpn(pl.o), pl.o.prefetch_inter);
  if (pl.o.backward)
    pl.bwd = make_double_ring_schedule(pl.o.base, Phase::Backward, pl.p, pl.mask, pl.qp, pl.kp, gpn(pl.o),
                                       pl.o.prefetch_inter);
}
int64_t double_ring_closed(const Plan& pl, Phase ph, int r, bool sent, ElemBytes w, int link) {
  return double_ring_bytes(pl.o.base, ph, pl.p, pl.qp, pl.kp, r, sent, w, gpn(pl.o), link, pl.o.prefetch_inter);
}
// Topology-aware (7.19); gradients overlapped with burst traffic (BurstEngine), serialized with
// ring traffic (LoongTrain's DoubleRing), as BurstEngine Table 1 compares them.
Prediction double_ring_model(const Plan& pl, Phase ph, const Cluster& c, int64_t eb, bool overlap) {
  SimSpec spec;
  spec.model = CommModel::TopologyAware;
  spec.double_ring = true;
  spec.overlap_grads = pl.o.base == Algo::Burst;
  spec.overlap = overlap;
  return simulate_schedule(schedule_of(pl, ph), pl.p, pl.qp, pl.kp, c, eb, spec);
}

// ---- Ulysses (§7.7) and all-gather CP (§7.8): two collective schedules with the same
// arguments everywhere, so one set of entries serves both (U: Ulysses).
void prepare_ulysses(Plan& pl) { check_ulysses(pl.p, pl.o.world); }
void prepare_nothing(Plan&) {}
template <bool U>
struct Collective {
  template <class T>
  static void pass(Phase ph, const Plan& pl, Communicator& c, Engine<T>& e, const PreparedMask& m, Shard<T>& x) {
    run_collective(U, ph, c, e, pl.p, m, pl.qp, pl.kp, x);
  }
  static int64_t closed(const Plan& pl, Phase ph, int r, bool sent, ElemBytes w, int) {
    return (U ? &ulysses_bytes : &allgather_bytes)(ph, pl.p, pl.qp, pl.kp, r, sent, w);
  }
  static Trace trace(const Plan& pl, ElemBytes w, bool f, bool b) { return collective_trace(pl, w, f, b, U); }
  static Prediction model(const Plan& pl, Phase ph, const Cluster& c, int64_t eb, bool) {  // collective (7.20)
    return (U ? &simulate_ulysses : &simulate_allgather)(ph, pl.p, pl.mask, pl.qp, pl.kp, c, eb);
  }
};

// ---- Attention2D (§7.11) and its overlapped variant (§7.13)
void prepare_attention2d(Plan& pl) {
  pl.grid = pl.o.grid.p_r == 0 ? default_grid(pl.o.world) : pl.o.grid;
  check_attention2d(pl.grid, pl.o.world, pl.qp, pl.kp);
}
template <class T>
void attention2d_pass(Phase ph, const Plan& pl, Communicator& c, Engine<T>& e, const PreparedMask& m, Shard<T>& x) {
  run_attention2d(false, ph, c, e, pl.p, m, pl.grid, pl.qp, pl.kp, x);
}
template <class T>
void attention2d_o_pass(Phase ph, const Plan& pl, Communicator& c, Engine<T>& e, const PreparedMask& m, Shard<T>& x) {
  run_attention2d(true, ph, c, e, pl.p, m, pl.grid, pl.qp, pl.kp, x);
}
int64_t attention2d_closed(const Plan& pl, Phase ph, int r, bool sent, ElemBytes w, int) {
  return attention2d_bytes(ph, pl.p, pl.grid, pl.qp, pl.kp, r, sent, w, false);
}
int64_t attention2d_o_closed(const Plan& pl, Phase ph, int r, bool sent, ElemBytes w, int) {
  return attention2d_bytes(ph, pl.p, pl.grid, pl.qp, pl.kp, r, sent, w, true);
}
Trace attention2d_no_trace(const Plan& pl, ElemBytes w, bool f, bool b) { return attention2d_trace(pl, w, f, b, false); }
Trace attention2d_o_trace(const Plan& pl, ElemBytes w, bool f, bool b) { return attention2d_trace(pl, w, f, b, true); }
Prediction attention2d_model(const Plan& pl, Phase ph, const Cluster& c, int64_t eb, bool) {  // collective (7.20)
  return simulate_attention2d(ph, pl.p, pl.mask, pl.grid, pl.qp, pl.kp, c, eb);
}

// ---- DistFlashAttn (§7.12)
void prepare_distflash(Plan& pl) {
  check_distflash(pl.mask, pl.qp, pl.kp);
  pl.flash = make_distflash_schedule(pl.o.world);
}
template <class T>
void distflash_pass(Phase ph, const Plan& pl, Communicator& c, Engine<T>& e, const PreparedMask& m, Shard<T>& x) {
  run_distflash(ph, c, e, pl.p, m, pl.flash, pl.qp, pl.kp, x);
}
int64_t distflash_closed(const Plan& pl, Phase ph, int r, bool sent, ElemBytes w, int) {
  return distflash_bytes(ph, pl.p, pl.qp, pl.kp, r, sent, w);
}
Prediction distflash_model(const Plan& pl, Phase ph, const Cluster& c, int64_t eb, bool overlap) {  // lockstep (7.18)
  return simulate_distflash(ph, pl.p, pl.mask, pl.qp, pl.kp, c, eb, overlap);
}

// ---- USP, the head-context hybrid (§7.14): Ulysses in groups of u, a ring across groups
void prepare_usp(Plan& pl) {
  int& u = pl.o.ulysses_degree;
  if (u == 0) u = pl.o.gpus_per_node;
  if (u == 0) fail("usp needs --ulysses-degree u (or --gpus-per-node): the ranks of one Ulysses group");
  check_usp(pl.p, pl.o.world, u);
  const Problem ph = usp_head_problem(pl.p, u);
  const Partition gq = usp_group_partition(pl.qp, u), gk = usp_group_partition(pl.kp, u);
  pl.fwd = make_schedule(pl.o.base, Phase::Forward, ph, pl.mask, gq, gk);
  if (pl.o.backward) pl.bwd = make_schedule(pl.o.base, Phase::Backward, ph, pl.mask, gq, gk);
}
template <class T>
void usp_pass(Phase ph, const Plan& pl, Communicator& c, Engine<T>& e, const PreparedMask& m, Shard<T>& x) {
  if (fwd(ph)) usp_forward(c, e, pl.p, m, pl.o.ulysses_degree, pl.fwd, pl.qp, pl.kp, x);
  else usp_backward(c, e, pl.p, m, pl.o.ulysses_degree, pl.bwd, pl.qp, pl.kp, x);
}
int64_t usp_closed(const Plan& pl, Phase ph, int r, bool sent, ElemBytes w, int) {
  return usp_bytes(pl.o.base, ph, pl.p, pl.qp, pl.kp, pl.o.ulysses_degree, r, sent, w);
}
Prediction usp_model(const Plan& pl, Phase ph, const Cluster& c, int64_t eb, bool overlap) {
  return simulate_usp(ph, pl.p, pl.o.ulysses_degree, schedule_of(pl, ph), pl.qp, pl.kp, c, eb, overlap);
}

#define BURSTLAB_PASSES(f) &f<double>, &f<float>, &f<bf16_t>, &f<f16_t>

}  // namespace

const std::vector<Algorithm>& algorithms() {
  static const std::vector<Algorithm> table = {
      {"ring", "§7.2", "RingAttention: K, V travel; backward K, V, dK, dV",
       [](Plan& pl) { prepare_ring(pl, Algo::Ring); }, BURSTLAB_PASSES(ring_pass), ring_bytes, ring_trace,
       ring_model, {}, true, nullptr, false, false, false, Drawing::Ring, false, Algo::Ring},
      {"burst", "§7.2", "BurstAttention (GAO): K, V travel; backward Q, dO, D, LSE, dQ",
       [](Plan& pl) { prepare_ring(pl, Algo::Burst); }, BURSTLAB_PASSES(ring_pass), ring_bytes, ring_trace,
       ring_model, {}, true, nullptr, false, false, false, Drawing::Ring, false, Algo::Burst},
      {"double-ring", "§7.9", "topology-aware double ring (BurstEngine): intra-node rings inside an inter-node ring",
       prepare_double_ring, BURSTLAB_PASSES(ring_pass), double_ring_closed, double_ring_trace, double_ring_model, {},
       false, nullptr, false, false, true, Drawing::DoubleRing, false, {}},
      {"distflash", "§7.12", "DistFlashAttn: causal load balance, idle ranks help their owners",
       prepare_distflash, BURSTLAB_PASSES(distflash_pass), distflash_closed, distflash_trace, distflash_model,
       PartitionKind::Contiguous, false, nullptr, false, false, false, Drawing::Flash, false, {}},
      {"attention2d", "§7.11", "Attention2D-NO: Q gathered in grid rows, K, V in columns; (O, LSE) reduce-scattered",
       prepare_attention2d, BURSTLAB_PASSES(attention2d_pass), attention2d_closed, attention2d_no_trace,
       attention2d_model, PartitionKind::Striped, false, "attention2d-o", true, false, false, Drawing::None, true, {}},
      {"attention2d-o", "§7.13", "Attention2D-O: the same grid as rings that overlap transfers with compute",
       prepare_attention2d, BURSTLAB_PASSES(attention2d_o_pass), attention2d_o_closed, attention2d_o_trace, nullptr,
       PartitionKind::Striped, false, nullptr, true, false, false, Drawing::None, true, {}},
      {"ulysses", "§7.7", "DeepSpeed-Ulysses: all-to-all sequence -> heads and back",
       prepare_ulysses, BURSTLAB_PASSES(Collective<true>::pass), Collective<true>::closed, Collective<true>::trace,
       Collective<true>::model, {}, false, nullptr,
       false, false, false, Drawing::None, false, {}},
      {"allgather", "§7.8", "all-gather CP (Megatron-CP): gather K, V; reduce-scatter dK, dV",
       prepare_nothing, BURSTLAB_PASSES(Collective<false>::pass), Collective<false>::closed, Collective<false>::trace,
       Collective<false>::model, {}, false,
       nullptr, false, false, false, Drawing::None, true, {}},
      {"usp", "§7.14", "head-context hybrid (LoongTrain USP): Ulysses in groups of u ranks, a ring across groups",
       prepare_usp, BURSTLAB_PASSES(usp_pass), usp_closed, usp_trace, usp_model, {}, false, nullptr, false, true, false,
       Drawing::None, false, {}},
  };
  return table;
}

std::string algorithm_names() {
  std::string s;
  for (const Algorithm& a : algorithms()) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

const Algorithm& find_algorithm(const std::string& name) { return find_named(algorithms(), name, "algo"); }

Algo ring_traffic_of(const std::string& name) {
  std::string with;
  for (const Algorithm& a : algorithms()) {
    if (a.ring_traffic && name == a.name) return *a.ring_traffic;
    if (a.ring_traffic) with += (with.empty() ? "" : ", ") + std::string(a.name);
  }
  fail("ring (", name, ") must be one of ", with);
}

SimOptions sim_options(const AlgoOptions& o) {
  SimOptions s = o.sim;
  if (o.gpus_per_node > 0) s.gpus_per_node = o.gpus_per_node;
  return s;
}

Plan make_plan(const Problem& p, const AlgoOptions& o) {
  const Algorithm& a = find_algorithm(o.algo);
  if (o.world < 1) fail("world (", o.world, ") must be >= 1");
  if (o.gpus_per_node < 0) fail("gpus-per-node (", o.gpus_per_node, ") must be >= 0 (0 = one node)");
  Plan pl;
  pl.p = p;
  pl.o = o;
  pl.o.sim = sim_options(o);
  pl.qp = make_partition(o.partition, p.N_q, o.world, "N_q");
  pl.kp = make_partition(o.partition, p.N_k, o.world, "N_k");
  pl.mask = compile_mask(p);
  a.prepare(pl);
  return pl;
}

int64_t plan_bytes(const Plan& plan, Phase phase, int r, bool sent, ElemBytes w, int link) {
  return find_algorithm(plan.o.algo).bytes(plan, phase, r, sent, w, link);
}

int held_kv_shards(const AlgoOptions& o) {
  const Algorithm& a = find_algorithm(o.algo);
  if (!a.gathers_kv) return 2;
  if (!a.grid) return 2 * o.world - 1;
  const int p_r = (o.grid.p_r > 0 ? o.grid : default_grid(o.world)).p_r;
  return a.overlapped ? 2 * p_r : (p_r > 1 ? p_r + 3 : 2);  // -NO (it has an overlapped form), -O
}

}  // namespace burstlab::dist
