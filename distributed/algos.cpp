// distributed/algos.cpp — spec §7.7-7.9 on SimComm.
#include "algos.hpp"

#include "baselines.hpp"
#include "burstlab/error.hpp"
#include "double_ring.hpp"

namespace burstlab::dist {

std::string to_string(ExtAlgo a) {
  switch (a) {
    case ExtAlgo::DoubleRing: return "double-ring";
    case ExtAlgo::Ulysses: return "ulysses";
    case ExtAlgo::AllGather: return "allgather";
    case ExtAlgo::Attention2D: return "attention2d";
    case ExtAlgo::DistFlash: return "distflash";
  }
  return "?";
}
bool is_ext_algo(const std::string& s) {
  return s == "double-ring" || s == "ulysses" || s == "allgather" || s == "attention2d" || s == "distflash";
}
ExtAlgo parse_ext_algo(const std::string& s) {
  if (s == "double-ring") return ExtAlgo::DoubleRing;
  if (s == "ulysses") return ExtAlgo::Ulysses;
  if (s == "allgather") return ExtAlgo::AllGather;
  if (s == "attention2d") return ExtAlgo::Attention2D;
  if (s == "distflash") return ExtAlgo::DistFlash;
  fail("algo (", s, ") must be one of double-ring, ulysses, allgather, attention2d, distflash");
}

namespace {
int gpn(const ExtOptions& o) { return o.gpus_per_node > 0 ? o.gpus_per_node : o.world; }
Grid grid_of(const ExtOptions& o) { return o.grid.p_r == 0 ? default_grid(o.world) : o.grid; }
}  // namespace

int64_t ext_closed_form_bytes(const ExtOptions& o, Phase phase, const Problem& p, const Partition& qp,
                              const Partition& kp, int r, bool sent, ElemBytes eb, int link) {
  switch (o.algo) {
    case ExtAlgo::DoubleRing: return double_ring_bytes(o.base, phase, p, qp, kp, r, sent, eb, gpn(o), link, o.prefetch_inter);
    case ExtAlgo::Ulysses: return ulysses_bytes(phase, p, qp, kp, r, sent, eb);
    case ExtAlgo::AllGather: return allgather_bytes(phase, p, qp, kp, r, sent, eb);
    case ExtAlgo::Attention2D: return attention2d_bytes(phase, p, grid_of(o), qp, kp, r, sent, eb, o.overlap);
    case ExtAlgo::DistFlash: return distflash_bytes(phase, p, qp, kp, r, sent, eb);
  }
  return 0;
}

AlgoOptions algo_options(const ExtOptions& o) {
  AlgoOptions a;
  a.algo = o.algo == ExtAlgo::Attention2D && o.overlap ? "attention2d-o" : to_string(o.algo);
  a.partition = o.partition;
  a.world = o.world;
  a.gpus_per_node = o.gpus_per_node;
  a.base = o.base;
  a.prefetch_inter = o.prefetch_inter;
  a.grid = o.grid;
  a.backward = o.backward;
  a.sim = o.sim;
  return a;
}

template <class T>
DistResult<T> run_sim_ext(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
                          View4<const double> dO, const ExtOptions& o, Engine<T>& e,
                          std::vector<std::string>* rank_errors) {
  return run_session<T>(p, Q, K, V, dO, algo_options(o), e, rank_errors);
}

#define BURSTLAB_EXT_INST(T)                                                                          \
  template DistResult<T> run_sim_ext<T>(const Problem&, View4<const double>, View4<const double>,          \
                                        View4<const double>, View4<const double>, const ExtOptions&,       \
                                        Engine<T>&, std::vector<std::string>*);
BURSTLAB_EXT_INST(float)
BURSTLAB_EXT_INST(double)
BURSTLAB_EXT_INST(bf16_t)
BURSTLAB_EXT_INST(f16_t)
#undef BURSTLAB_EXT_INST

}  // namespace burstlab::dist
