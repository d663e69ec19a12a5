// tools/conform_columns.cpp — the columns of `burstlab conform` (conform_columns.hpp): what each
// runs for a case, and the refusals (n/a) it decides before running.
#include "conform_columns.hpp"

#include "algorithm.hpp"  // the schedules of spec §7: algorithms()
#include "burstlab/dispatch.hpp"
#include "gather.hpp"  // gather_outputs
#include "session.hpp"

namespace burstlab::tools {
namespace {

check::Candidate candidate_of(Dtype t, Layout layout) {
  check::Candidate c;
  c.dtype = t;
  c.layout = layout;
  return c;
}

// A distributed run's outputs, gathered from the ranks' shards into global BHSD, as a candidate.
template <class T>
check::Candidate candidate_of(const dist::DistResult<T>& res, Dtype t) {
  check::Candidate c = candidate_of(t, Layout::BHSD);
  GatheredOutputs g = gather_outputs(res, true, true);
  c.O = std::move(g.O), c.LSE = std::move(g.LSE), c.dQ = std::move(g.dQ), c.dK = std::move(g.dK), c.dV = std::move(g.dV);
  c.has_O = c.has_LSE = c.has_dQ = c.has_dK = c.has_dV = true;
  return c;
}

// One distributed session (dist::Session of an algorithm of the table)
// on SimComm threads, with the engine of an implementation; outputs gathered back to global BHSD.
template <class T, class Session, class Options>
RunFn dist_prepare(const CaseData& cd, Options o, std::unique_ptr<Engine<T>> engine, const EngineMakers& mk) {
  struct S {
    std::unique_ptr<Engine<T>> engine;
    std::unique_ptr<Session> session;
  };
  auto s = std::make_shared<S>();
  s->engine = std::move(engine);
  o.sim.memory.copy = mk.copy;
  o.sim.memory.poison = mk.poison;
  s->session = std::make_unique<Session>(cd.meta.p, cd.in.Q.view(), cd.in.K.view(), cd.in.V.view(), cd.in.dO.view(),
                                         o, *s->engine);  // validates: Error = n/a
  const Dtype t = cd.meta.dtype;
  return [s, t] {
    s->session->forward();
    s->session->backward();
    return candidate_of(s->session->result(), t);
  };
}

// A Session of options o with the engine of `mk` for the case's dtype.
RunFn dist_prepare_any(const CaseData& cd, const dist::AlgoOptions& o, const EngineMakers& mk, const ImplOptions& io) {
  return dispatch_dtype(cd.meta.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return dist_prepare<T, dist::Session<T>>(cd, o, mk.make<T>(io), mk);
  });
}

// One session on the NCCL World: each rank makes its engine on its own device, then the
// forward, the backward, and every rank's outputs gathered into every process (a collective).
// Nothing here runs before the closure: the column's refusals (n/a) are decided without the World.
template <class T>
RunFn nccl_prepare(const CaseData& cd, const dist::AlgoOptions& o, const EngineMakers& mk,
                   const std::shared_ptr<Net>& net) {
  const CaseData* c = &cd;  // the closure runs while the row's case is alive
  return [c, o, mk, net] {
    dist::Session<T> session(c->meta.p, c->in.Q.view(), c->in.K.view(), c->in.V.view(), c->in.dO.view(), o,
                             *net->world, [&mk] { return mk.make<T>(ImplOptions{}); });
    session.forward();
    session.backward();
    return candidate_of(session.result(), c->meta.dtype);
  };
}

}  // namespace

MatrixColumn impl_column(const Impl& m) {
  MatrixColumn col;
  col.name = m.name;
  col.dtypes = m.suite_dtypes;
  col.footprint = m.footprint;
  col.prepare = [&m](const CaseData& cd) -> RunFn {
    check_impl(m, cd.meta.p, cd.meta.dtype, ImplOptions{}, m.has_backward);
    auto r = std::make_shared<Runner>(m.prepare(cd.meta.p, cd.in, ImplOptions{}));
    const bool bwd = m.has_backward && cd.meta.backward;
    const Dtype t = cd.meta.dtype;
    const Layout layout = cd.meta.layout;
    return [r, bwd, t, layout] {
      check::Candidate c = candidate_of(t, layout);
      r->forward();
      r->fetch_forward(c.O, c.LSE);
      c.has_O = c.has_LSE = true;
      if (bwd) {
        r->backward();
        r->fetch_backward(c.dQ, c.dK, c.dV);
        c.has_dQ = c.has_dK = c.has_dV = true;
      }
      return c;
    };
  };
  return col;
}

std::vector<MatrixColumn> dist_columns(const std::string& partition, const std::vector<const Impl*>& engines,
                                 const std::shared_ptr<Net>& net) {
  const int world = net->f.world;
  const bool nccl = net->f.transport == Transport::Nccl;
  const int per_device = ranks_per_device(net->f);  // the same for every column
  std::vector<MatrixColumn> out;
  for (const Impl* mp : engines) {
    const Impl& m = *mp;
    if (!m.engines.any() || (nccl && !m.engines.copy)) continue;
    const EngineMakers mk = m.engines;
    for (const dist::Algorithm& a : dist::algorithms()) {
      const std::string name = a.name;
      dist::AlgoOptions o;
      o.algo = name;
      o.partition = dist::parse_partition(partition);
      o.world = world;
      o.gpus_per_node = o.sim.gpus_per_node = net->f.gpus_per_node;
      o.backward = true;
      MatrixColumn col;
      col.name = name + "/" + m.name + " G=" + std::to_string(world);
      if (a.grid && a.partition) {  // the grid's algorithms run on their own partition whatever --partition says
        o.partition = *a.partition;
        col.name += " " + dist::to_string(o.partition);
      }
      if (a.ulysses_groups) {
        if (world % 2 != 0) continue;
        o.ulysses_degree = 2;
        col.name += " u=2";
      }
      col.dtypes = mk.dtypes();
      col.footprint = distributed_footprint(dist::held_kv_shards(o), world, mk.footprint, false, per_device);
      col.transport = to_string(net->f.transport);
      if (nccl) {
        // The engine's refusals (cuda: a GPU, d) and the algorithm's (make_plan: partition,
        // heads, mask) before any rank runs: a refusal is n/a, a throw inside the World a FAIL.
        col.prepare = [o, mk, mp, net](const CaseData& cd) -> RunFn {
          if (mp->check) mp->check(cd.meta.p, cd.meta.dtype, ImplOptions{});
          dist::make_plan(cd.meta.p, o);
          return dispatch_dtype(cd.meta.dtype, [&](auto t) {
            return nccl_prepare<typename decltype(t)::type>(cd, o, mk, net);
          });
        };
        out.push_back(col);
        continue;
      }
      // A plug-in's refusals of the whole problem (plugin.h's supports) make the cell n/a, as alone.
      const bool plugin = m.name.rfind("plugin:", 0) == 0;
      col.prepare = [o, mk, plugin, mp](const CaseData& cd) {
        if (plugin && mp->check) mp->check(cd.meta.p, cd.meta.dtype, ImplOptions{});
        return dist_prepare_any(cd, o, mk, ImplOptions{});
      };
      out.push_back(col);
    }
  }
  return out;
}

std::string agreed_refusal(dist::World& w, const std::string& mine, const std::string& what) {
  const std::string sent = "r" + mine;  // never an empty buffer through MPI
  const std::vector<std::vector<char>> all =
      w.allgather([&](int) { return std::vector<char>(sent.begin(), sent.end()); }, what);
  for (const std::vector<char>& b : all)
    if (b.size() > 1) return std::string(b.begin() + 1, b.end());
  return "";
}

}  // namespace burstlab::tools
