// tools/gather.cpp — a distributed run's shards back into global fp64 tensors.
#include "gather.hpp"

namespace burstlab::tools {

template <class T>
GatheredOutputs gather_outputs(const dist::DistResult<T>& res, bool forward, bool backward) {
  GatheredOutputs g;
  if (forward) {
    g.O = widen(dist::gather(res.O, res.qp));
    g.LSE = widen(dist::gather(res.LSE, res.qp));
  }
  if (backward) {
    g.dQ = widen(dist::gather(res.dQ, res.qp));
    g.dK = widen(dist::gather(res.dK, res.kp));
    g.dV = widen(dist::gather(res.dV, res.kp));
  }
  return g;
}
template GatheredOutputs gather_outputs<double>(const dist::DistResult<double>&, bool, bool);
template GatheredOutputs gather_outputs<float>(const dist::DistResult<float>&, bool, bool);
template GatheredOutputs gather_outputs<bf16_t>(const dist::DistResult<bf16_t>&, bool, bool);
template GatheredOutputs gather_outputs<f16_t>(const dist::DistResult<f16_t>&, bool, bool);

}  // namespace burstlab::tools
