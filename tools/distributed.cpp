// tools/distributed.cpp — `burstlab run --algo ...` (spec §7): each selected engine wrapped as a
// distributed implementation whose runner holds one Session on the World --transport names
// (SimComm, or NCCL as threads or under mpirun).
#include "distributed.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "burstlab/dispatch.hpp"
#include "burstlab/error.hpp"
#include "algorithm.hpp"
#include "common.hpp"
#include "dist_flags.hpp"
#include "dist_report.hpp"
#include "gather.hpp"
#include "session.hpp"
#ifdef BURSTLAB_HAVE_NCCL
#include "thread_world.hpp"  // nccl_world
#endif

namespace burstlab::tools {

// The flags `run` was given and what each wrapped run leaves for the bytes table.
struct DistRun {
  DistFlags f;
  std::vector<DistReport> reports;
  std::vector<const CLI::Option*> with_algo;  // the flags that mean nothing without --algo
};

namespace {

// The world the ranks talk over, as --transport says.
std::shared_ptr<dist::World> make_world(const DistFlags& f, const dist::AlgoOptions& o) {
#ifdef BURSTLAB_HAVE_NCCL
  if (f.transport == Transport::Nccl) return nccl::nccl_world(o.world, o.gpus_per_node, f.timeout, f.inject);
#else
  (void)f;  // without NCCL, --transport nccl is refused when parsed (dist_flags.cpp)
#endif
  return std::make_shared<dist::SimWorld>(o.world, dist::sim_options(o));
}

// One Session on the transport's World: one plan, one engine per device, every pass timed
// whole; each fetch (a collective under mpirun) keeps the logs and exposed wait times for the
// bytes table and gathers every rank's outputs for the full oracle, or for the row-sampled check
// (spec §9.11) only the sample's rows and columns and the rows' LSE and D (gather.hpp).
template <class T>
Runner dist_runner(const Problem& p, const Inputs& in, const ImplOptions& opt, std::shared_ptr<DistRun> st,
                   const DistFlags& f, const std::string& name, const EngineMakers& mk) {
  struct S {
    std::shared_ptr<dist::World> world;  // outlives the session
    std::unique_ptr<dist::Session<T>> session;
    size_t report = 0;
  };
  auto s = std::make_shared<S>();
  dist::AlgoOptions o = options_of(f);
  o.sim.memory.copy = mk.copy;  // where the engine's buffers live, for SimComm
  o.sim.memory.poison = mk.poison;
  s->world = make_world(f, o);
  s->session = std::make_unique<dist::Session<T>>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o,
                                                  *s->world, [&] { return mk.make<T>(opt); });
  DistReport rep;
  rep.impl = name;
  rep.dtype = in.dtype;
  rep.plan = s->session->plan();
  if (f.transport == Transport::Nccl) rep.transport = "NCCL (" + s->world->describe() + ")";
  st->reports.push_back(rep);
  s->report = st->reports.size() - 1;
  // A failure while fetching (after the passes) still tells the other processes.
  auto fetch = [s, st](dist::Phase phase, bool outputs, const std::function<void(const dist::DistResult<T>&)>& take) {
    try {
      const dist::DistResult<T> res = s->session->result(outputs);
      take(res);
      DistReport& r = st->reports[s->report];
      r.logs = res.logs;
      if (phase == dist::Phase::Forward) {
        r.fwd = true;
        r.exposed_fwd = s->world->exposed_ms(phase);
      } else {
        r.bwd = true;
        r.exposed_bwd = s->world->exposed_ms(phase);
      }
    } catch (const std::exception& e) {
      s->world->failed(e.what());
      throw;
    }
  };
  Runner r;
  r.forward = timed([s] { s->session->forward(); });
  r.backward = timed([s] { s->session->backward(); });
  r.fetch_forward = [fetch](Tensor4<double>& O, Tensor3<double>& LSE) {
    fetch(dist::Phase::Forward, true, [&](const dist::DistResult<T>& res) {
      GatheredOutputs g = gather_outputs(res, true, false);
      O = std::move(g.O);
      LSE = std::move(g.LSE);
    });
  };
  r.fetch_backward = [fetch](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
    fetch(dist::Phase::Backward, true, [&](const dist::DistResult<T>& res) {
      GatheredOutputs g = gather_outputs(res, false, true);
      dQ = std::move(g.dQ);
      dK = std::move(g.dK);
      dV = std::move(g.dV);
    });
  };
  // The sampled check's reads: the held ranks' rows from engine memory, the logs alone gathered.
  const AnyView4 dO = in.dO.view();
  r.fetch_sampled_forward = [fetch, s, p, dO](const Sample& smp, bool columns, SampledOutputs& got, RunRows& run) {
    fetch(dist::Phase::Forward, false, [&](const dist::DistResult<T>& res) {
      sampled_forward(*s->world, p, res.qp, smp, session_reader(*s->session), dO, got, columns ? &run : nullptr);
    });
  };
  r.fetch_sampled_backward = [fetch, s, p](const Sample& smp, SampledOutputs& got) {
    fetch(dist::Phase::Backward, false, [&](const dist::DistResult<T>& res) {
      sampled_backward(*s->world, p, res.qp, res.kp, smp, session_reader(*s->session), got);
    });
  };
  return r;
}

// `base` run distributed with one algorithm of --algo (f.algo is that one name).
Impl wrap(const Impl& base, std::shared_ptr<DistRun> st, const DistFlags& f) {
  Impl m;
  m.name = f.algo + "/" + base.name;
  m.about = f.algo + " attention on " + (f.transport == Transport::Nccl ? "NCCL" : "SimComm") + ", G=" +
            std::to_string(world_of(f)) + ", " + f.partition + ", " + base.name + " engine";
  m.dtypes = base.engines.dtypes();
  m.suite_dtypes = m.dtypes;
  m.has_backward = true;
  m.check = [base, f](const Problem& p, Dtype dtype, const ImplOptions& opt) {
    if (base.check) base.check(p, dtype, opt);
    dist::make_plan(p, options_of(f));  // the algorithm's requirements: partitions, heads, grid, mask
  };
  const int kv_shards = dist::held_kv_shards(options_of(f));
  const int G = world_of(f), per_device = ranks_per_device(f);
  m.footprint = distributed_footprint(kv_shards, G, base.engines.footprint, false, per_device);
  m.sampled_footprint = distributed_footprint(kv_shards, G, base.engines.footprint, true, per_device);
  const std::string name = m.name;
  const EngineMakers mk = base.engines;
  m.prepare = [st, f, name, mk](const Problem& p, const Inputs& in, const ImplOptions& opt) {
    return dispatch_dtype(in.dtype, [&](auto tag) {
      return dist_runner<typename decltype(tag)::type>(p, in, opt, st, f, name, mk);
    });
  };
  return m;
}

}  // namespace

std::shared_ptr<DistRun> add_distributed_flags(CLI::App& run) {
  auto st = std::make_shared<DistRun>();
  const std::vector<const CLI::Option*> before = static_cast<const CLI::App&>(run).get_options();
  std::string algos;
  for (const dist::Algorithm& a : dist::algorithms())
    algos += std::string(algos.empty() ? "" : " | ") + a.name + " (" + a.spec + ")";
  run.add_option("--algo", st->f.algo,
                 "run every selected implementation that provides an engine (cpu; cuda: ranks as threads on one "
                 "GPU) distributed on SimComm: " + algos +
                     ". double-ring takes --gpus-per-node, attention2d --grid and --partition striped, distflash a "
                     "causal mask and --partition contiguous");
  add_topology_flags(run, st->f);
  run.add_option("--transport", st->f.transport_flag,
                 "sim: SimComm, ranks as threads of this process (--impl cpu or cuda: all on one GPU); nccl: "
                 "NcclComm, one rank per GPU (--impl cuda), as threads of this process (--world up to the GPUs "
                 "it sees) or one process per GPU under mpirun -np G")
      ->capture_default_str();
  real_range(run.add_option("--timeout", st->f.timeout,
                            "nccl: seconds one transfer or collective may take before the watchdog aborts the "
                            "communicator and every rank exits with an error naming the rank, operation, phase and step")
                 ->capture_default_str(),
             "timeout", 0, 86400, true);
  run.add_option("--inject-failure", st->f.inject,
                 "nccl: RANK:STEP[:bwd][:hang] makes that rank fail when it enters step STEP of the forward (:bwd: "
                 "of the backward); :hang makes it stop communicating instead (the others' watchdogs fire); tests "
                 "the failure paths");
  run.add_flag("--single", st->f.single,
               "--algo: also run each engine implementation on the whole problem on one device, and print the "
               "scaling table (time on one device / time distributed, per pass and fwd+bwd, with the exposed "
               "communication)");
  run.add_flag("--poison", st->f.poison, "SimComm: NaN-fill receive buffers and consumed send buffers");
  run.add_flag("--reorder", st->f.reorder, "SimComm: complete transfers in a random order");
  // Every flag added above but --algo means nothing on one device: given without --algo it is
  // refused rather than ignored.
  for (const CLI::Option* o : run.get_options())
    if (o->get_name() != "--algo" && std::find(before.begin(), before.end(), o) == before.end())
      st->with_algo.push_back(o);
  return st;
}

std::vector<Impl> distributed_impls(const std::shared_ptr<DistRun>& st, const std::vector<const Impl*>& impls) {
  if (st->f.algo.empty()) {
    int n = 0;
    const std::string given = given_options(st->with_algo, &n);
    if (n > 0)
      fail(given, n == 1 ? " needs" : " need", " --algo (", dist::algorithm_names(),
           "): without it `run` checks each --impl on one device");
  }
  st->f.transport = parse_transport(st->f.transport_flag);  // the one place --transport is read
  // --algo a,b,...: each selected engine runs each algorithm (validated before anything runs).
  std::vector<DistFlags> per_algo;
  const std::vector<std::string> names =
      st->f.algo.empty() ? std::vector<std::string>{} : split_list(st->f.algo, "algo", dist::algorithm_names());
  for (const std::string& a : names) {
    DistFlags fa = st->f;
    fa.algo = a;
    options_of(fa);
    per_algo.push_back(fa);
  }
  std::vector<Impl> out;
  for (const Impl* m : impls) {
    // NCCL moves device memory: only engines whose buffers live on a GPU (a transport copy).
    const bool fits = st->f.transport != Transport::Nccl || static_cast<bool>(m->engines.copy);
    if (per_algo.empty() || !m->engines.any() || !fits) {
      out.push_back(*m);
      continue;
    }
    if (st->f.single) out.push_back(*m);  // the whole problem on one device, for the scaling table
    for (const DistFlags& fa : per_algo) out.push_back(wrap(*m, st, fa));
  }
  if (!st->f.algo.empty()) {
    bool any = false;
    for (const Impl& m : out) any = any || m.name.find('/') != std::string::npos;
    if (!any) {
      std::string engines;
      for (const Impl& m : registry())
        if (m.engines.any() && (st->f.transport != Transport::Nccl || m.engines.copy))
          engines += (engines.empty() ? "" : ", ") + m.name;
      fail("algo (", st->f.algo, ") needs an implementation that provides an engine in --impl (", engines, ")");
    }
  }
  return out;
}

bool distributed_report(const DistRun& d, Json& header, bool json, const std::vector<Result>& rs) {
  return d.f.algo.empty() || bytes_report(d.reports, d.f, header, json, rs);
}

}  // namespace burstlab::tools
