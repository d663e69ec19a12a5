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

template <class T>
ExtSession<T>::ExtSession(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
                          View4<const double> dO, const ExtOptions& o, Engine<T>& e)
    : p_(p), o_(o), e_(e) {
  validate_views(p, Q, K, V);
  if (o.backward) validate_q_side(p, "dO", dO);
  const int G = o.world;
  if (o.algo == ExtAlgo::Ulysses) check_ulysses(p, G);
  res_.qp = make_partition(o.partition, p.N_q, G, "N_q");
  res_.kp = make_partition(o.partition, p.N_k, G, "N_k");
  mask_ = compile_mask(p);
  prepared_ = e.prepare(mask_);
  if (o.algo == ExtAlgo::Attention2D) check_attention2d(grid_of(o), G, res_.qp, res_.kp);
  if (o.algo == ExtAlgo::DistFlash) {
    check_distflash(mask_, res_.qp, res_.kp);
    flash_ = make_distflash_schedule(G);
  }
  if (o_.gpus_per_node > 0) o_.sim.gpus_per_node = o_.gpus_per_node;
  if (o.algo == ExtAlgo::DoubleRing) {
    res_.fwd = make_double_ring_schedule(o.base, Phase::Forward, p, mask_, res_.qp, res_.kp, gpn(o), o.prefetch_inter);
    if (o.backward)
      res_.bwd = make_double_ring_schedule(o.base, Phase::Backward, p, mask_, res_.qp, res_.kp, gpn(o), o.prefetch_inter);
  }
  shards_ = upload_shards(e, Q, K, V, dO, res_.qp, res_.kp, o.backward);
  res_.logs.assign(G, {});
}

template <class T>
void ExtSession<T>::run(Phase phase) {
  run_pass(o_.world, o_.sim, phase, res_.logs, errors_, [&](Communicator& comm) {
    Shard<T>& x = shards_[comm.rank()];
    const bool fwd = phase == Phase::Forward;
    switch (o_.algo) {
      case ExtAlgo::DoubleRing:
        if (fwd) run_forward(res_.fwd, comm, e_, p_, prepared_, res_.qp, res_.kp, x);
        else run_backward(res_.bwd, comm, e_, p_, prepared_, res_.qp, res_.kp, x);
        break;
      case ExtAlgo::Ulysses:
        if (fwd) ulysses_forward(comm, e_, p_, prepared_, res_.qp, res_.kp, x);
        else ulysses_backward(comm, e_, p_, prepared_, res_.qp, res_.kp, x);
        break;
      case ExtAlgo::AllGather:
        if (fwd) allgather_forward(comm, e_, p_, prepared_, res_.qp, res_.kp, x);
        else allgather_backward(comm, e_, p_, prepared_, res_.qp, res_.kp, x);
        break;
      case ExtAlgo::Attention2D:
        if (fwd && o_.overlap) attention2d_o_forward(comm, e_, p_, prepared_, grid_of(o_), res_.qp, res_.kp, x);
        else if (fwd) attention2d_forward(comm, e_, p_, prepared_, grid_of(o_), res_.qp, res_.kp, x);
        else if (o_.overlap) attention2d_o_backward(comm, e_, p_, prepared_, grid_of(o_), res_.qp, res_.kp, x);
        else attention2d_backward(comm, e_, p_, prepared_, grid_of(o_), res_.qp, res_.kp, x);
        break;
      case ExtAlgo::DistFlash:
        if (fwd) distflash_forward(comm, e_, p_, prepared_, flash_, res_.qp, res_.kp, x);
        else distflash_backward(comm, e_, p_, prepared_, flash_, res_.qp, res_.kp, x);
        break;
    }
    e_.synchronize();  // this rank's engine work is complete before the pass ends
  });
}

template <class T>
void ExtSession<T>::forward() {
  have_forward_ = false;
  run(Phase::Forward);
  have_forward_ = true;
}

template <class T>
void ExtSession<T>::backward() {
  check_can_backward("ExtSession", o_.backward, have_forward_);
  run(Phase::Backward);
}

template <class T>
DistResult<T> ExtSession<T>::result() const {
  DistResult<T> res = res_;
  download_outputs(e_, p_, shards_, o_.backward, res);
  return res;
}

template <class T>
DistResult<T> run_sim_ext(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
                          View4<const double> dO, const ExtOptions& o, Engine<T>& e,
                          std::vector<std::string>* rank_errors) {
  ExtSession<T> s(p, Q, K, V, dO, o, e);
  return run_passes(s, o.backward, rank_errors);
}

template class ExtSession<float>;
template class ExtSession<double>;
template class ExtSession<bf16_t>;
template class ExtSession<f16_t>;
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
