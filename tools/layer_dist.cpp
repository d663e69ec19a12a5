// tools/layer_dist.cpp — spec §11.4.
#include "layer_dist.hpp"

#include "session.hpp"

namespace burstlab::tools {

namespace {

template <class T>
Tensor4<double> widen(View4<const T> v) {  // any strides -> BHSD
  Tensor4<double> t = make_tensor4<double>(Layout::BHSD, v.dim[0], v.dim[1], v.dim[2], v.dim[3]);
  const View4<double> w = t.view();
  for (int64_t b = 0; b < v.dim[0]; ++b)
    for (int64_t h = 0; h < v.dim[1]; ++h)
      for (int64_t n = 0; n < v.dim[2]; ++n)
        for (int64_t k = 0; k < v.dim[3]; ++k) w(b, h, n, k) = static_cast<double>(v(b, h, n, k));
  return t;
}
template <class T>
Tensor3<double> widen(View3<const T> v) {
  Tensor3<double> t = make_tensor3<double>(v.dim[0], v.dim[1], v.dim[2]);
  const View3<double> w = t.view();
  for (int64_t b = 0; b < v.dim[0]; ++b)
    for (int64_t h = 0; h < v.dim[1]; ++h)
      for (int64_t n = 0; n < v.dim[2]; ++n) w(b, h, n) = static_cast<double>(v(b, h, n));
  return t;
}
template <class U, class T>
void put(const Tensor4<U>& from, View4<T> to) {  // BHSD -> any strides
  const View4<const U> f = from.view();
  for (int64_t b = 0; b < to.dim[0]; ++b)
    for (int64_t h = 0; h < to.dim[1]; ++h)
      for (int64_t n = 0; n < to.dim[2]; ++n)
        for (int64_t k = 0; k < to.dim[3]; ++k) to(b, h, n, k) = static_cast<T>(f(b, h, n, k));
}

template <class T>
void add_traffic(const dist::Session<T>& s, const dist::DistResult<T>& r, dist::Phase phase, int64_t& sent,
                 int64_t& closed) {
  const dist::ElemBytes w(int64_t(sizeof(T)), int64_t(sizeof(acc_t<T>)));
  for (int rank = 0; rank < int(r.logs.size()); ++rank) {
    sent += dist::totals(r.logs[rank], phase).sent;
    closed += dist::plan_bytes(s.plan(), phase, rank, true, w);
  }
}

}  // namespace

template <class T>
layer::AttentionOps<T> distributed_attention(const dist::AlgoOptions& o, Engine<T>& engine,
                                             std::shared_ptr<DistTraffic> traffic) {
  static_assert(std::is_same_v<acc_t<T>, T>, "the layer keeps LSE in T: fp32 and fp64 only");
  layer::AttentionOps<T> a;
  a.name = o.algo + " on SimComm";
  Engine<T>* e = &engine;
  a.forward = [o, e, traffic](const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V, View4<T> O,
                              View3<T> LSE) {
    dist::AlgoOptions fo = o;
    fo.backward = false;
    const Tensor4<double> q = widen(Q), k = widen(K), v = widen(V);
    dist::Session<T> s(p, q.view(), k.view(), v.view(), View4<const double>{}, fo, *e);
    s.forward();
    const dist::DistResult<T> r = s.result();
    put(dist::gather(r.O, r.qp), O);
    const Tensor3<T> L = dist::gather(r.LSE, r.qp);
    for (int64_t b = 0; b < LSE.dim[0]; ++b)
      for (int64_t h = 0; h < LSE.dim[1]; ++h)
        for (int64_t n = 0; n < LSE.dim[2]; ++n) LSE(b, h, n) = L.view()(b, h, n);
    traffic->forward_passes += 1;
    add_traffic(s, r, dist::Phase::Forward, traffic->forward_sent, traffic->forward_closed);
  };
  a.backward = [o, e, traffic](const Problem& p, View4<const T> Q, View4<const T> K, View4<const T> V,
                               View4<const T> O, View4<const T> dO, View3<const T> LSE, View4<T> dQ, View4<T> dK,
                               View4<T> dV) {
    dist::AlgoOptions bo = o;
    bo.backward = true;
    const Tensor4<double> q = widen(Q), k = widen(K), v = widen(V), dout = widen(dO), out = widen(O);
    const Tensor3<double> lse = widen(LSE);
    dist::Session<T> s(p, q.view(), k.view(), v.view(), dout.view(), bo, *e);
    s.load_forward(out.view(), lse.view());  // the kept (or recomputed) forward: no forward pass here
    s.backward();
    const dist::DistResult<T> r = s.result();
    put(dist::gather(r.dQ, r.qp), dQ);
    put(dist::gather(r.dK, r.kp), dK);
    put(dist::gather(r.dV, r.kp), dV);
    traffic->backward_passes += 1;
    add_traffic(s, r, dist::Phase::Backward, traffic->backward_sent, traffic->backward_closed);
    int64_t stray = 0, unused = 0;
    add_traffic(s, r, dist::Phase::Forward, stray, unused);
    if (stray != 0) fail("the distributed backward sent ", stray, " forward bytes: load_forward should leave none");
  };
  return a;
}

template layer::AttentionOps<float> distributed_attention<float>(const dist::AlgoOptions&, Engine<float>&,
                                                                 std::shared_ptr<DistTraffic>);
template layer::AttentionOps<double> distributed_attention<double>(const dist::AlgoOptions&, Engine<double>&,
                                                                   std::shared_ptr<DistTraffic>);

}  // namespace burstlab::tools
