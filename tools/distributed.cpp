// tools/distributed.cpp — `burstlab run --algo ...` and `burstlab schedule` (spec §7).
#include "distributed.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "algos.hpp"  // double-ring, ulysses, allgather (spec §7.7-7.9)
#include "cmd_simulate.hpp"
#include "common.hpp"
#include "cpu_engine.hpp"
#include "partition.hpp"
#include "schedule.hpp"
#include "sim_run.hpp"
#include "table.hpp"

namespace burstlab::tools {

namespace {

struct DistFlags {
  std::string algo;  // empty: single device
  int world = 4;
  std::string partition = "contiguous";
  int gpus_per_node = 0;
  bool poison = false, reorder = false;
  std::string grid;  // attention2d: "RxC" (empty: the most square grid)
  bool overlap = false;  // attention2d: Attention2D-O
};

// What one wrapped run leaves for the bytes table.
struct DistReport {
  std::string impl;
  Dtype dtype = Dtype::F64;
  Problem p;
  dist::Partition qp, kp;
  std::vector<std::vector<dist::Transfer>> logs;
  bool fwd = false, bwd = false;
};

struct DistState {
  DistFlags f;
  std::vector<DistReport> reports;
};

dist::DistOptions options_of(const DistFlags& f) {
  dist::DistOptions o;
  o.algo = dist::is_ext_algo(f.algo) ? dist::Algo::Burst : dist::parse_algo(f.algo);  // ext: ext_options_of
  o.partition = dist::parse_partition(f.partition);
  if (f.world < 1) fail("world (", f.world, ") must be >= 1");
  if (f.gpus_per_node < 0) fail("gpus-per-node (", f.gpus_per_node, ") must be >= 0 (0 = one node)");
  o.world = f.world;
  o.sim.poison = f.poison;
  o.sim.reorder = f.reorder;
  o.sim.gpus_per_node = f.gpus_per_node;
  o.backward = true;
  return o;
}

// double-ring, ulysses, allgather (distributed/algos.hpp): the same flags.
dist::ExtOptions ext_options_of(const DistFlags& f) {
  const dist::DistOptions d = options_of(f);
  dist::ExtOptions o;
  o.algo = dist::parse_ext_algo(f.algo);
  o.partition = d.partition;
  o.world = d.world;
  o.gpus_per_node = f.gpus_per_node;
  o.sim = d.sim;
  if (o.algo == dist::ExtAlgo::Attention2D) {
    o.grid = f.grid.empty() ? dist::default_grid(o.world) : dist::parse_grid(f.grid);
    o.overlap = f.overlap;
    if (o.grid.size() != o.world)
      fail("grid (", f.grid, " = ", o.grid.size(), " ranks) must have world (", o.world, ") ranks");
    if (o.partition != dist::PartitionKind::Striped)
      fail("attention2d needs --partition striped (the cyclic distribution), not ", f.partition);
  }
  return o;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <class T>
Runner dist_runner(const Problem& p, const Inputs& in, const ImplOptions& opt, std::shared_ptr<DistState> st,
                   const std::string& name) {
  cpu::Tiles tiles;
  if (opt.Br) tiles.Br = opt.Br;
  if (opt.Bc) tiles.Bc = opt.Bc;
  struct S {
    std::unique_ptr<dist::Engine<T>> engine;
    std::unique_ptr<dist::SimSession<T>> session;
    std::unique_ptr<dist::ExtSession<T>> ext;  // double-ring, ulysses, allgather
    size_t report = 0;
    void forward() { ext ? ext->forward() : session->forward(); }
    void backward() { ext ? ext->backward() : session->backward(); }
    dist::DistResult<T> result() const { return ext ? ext->result() : session->result(); }
    const dist::Partition& qp() const { return ext ? ext->qp() : session->qp(); }
    const dist::Partition& kp() const { return ext ? ext->kp() : session->kp(); }
  };
  auto s = std::make_shared<S>();
  s->engine = dist::make_cpu_engine<T>(tiles);
  if (dist::is_ext_algo(st->f.algo))
    s->ext = std::make_unique<dist::ExtSession<T>>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(),
                                                   ext_options_of(st->f), *s->engine);
  else
    s->session = std::make_unique<dist::SimSession<T>>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(),
                                                        options_of(st->f), *s->engine);
  DistReport rep;
  rep.impl = name;
  rep.dtype = in.dtype;
  rep.p = p;
  rep.qp = s->qp();
  rep.kp = s->kp();
  st->reports.push_back(rep);
  s->report = st->reports.size() - 1;
  auto keep_logs = [s, st](bool fwd, bool bwd) {
    DistReport& r = st->reports[s->report];
    r.logs = s->result().logs;
    r.fwd = r.fwd || fwd;
    r.bwd = r.bwd || bwd;
  };
  Runner r;
  r.forward = [s] {
    const auto t0 = std::chrono::steady_clock::now();
    s->forward();
    return ms_since(t0);
  };
  r.backward = [s] {
    const auto t0 = std::chrono::steady_clock::now();
    s->backward();
    return ms_since(t0);
  };
  r.fetch_forward = [s, keep_logs](Tensor4<double>& O, Tensor3<double>& LSE) {
    const dist::DistResult<T> res = s->result();
    O = to_double(dist::gather(res.O, res.qp));
    LSE = to_double(dist::gather(res.LSE, res.qp));
    keep_logs(true, false);
  };
  r.fetch_backward = [s, keep_logs](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
    const dist::DistResult<T> res = s->result();
    dQ = to_double(dist::gather(res.dQ, res.qp));
    dK = to_double(dist::gather(res.dK, res.kp));
    dV = to_double(dist::gather(res.dV, res.kp));
    keep_logs(false, true);
  };
  return r;
}

Impl wrap(const Impl& base, std::shared_ptr<DistState> st) {
  const DistFlags& f = st->f;
  Impl m;
  m.name = f.algo + "/" + base.name;
  m.about = f.algo + " attention on SimComm, G=" + std::to_string(f.world) + ", " + f.partition + ", cpu engine";
  m.dtypes = {Dtype::F64, Dtype::F32};
  m.suite_dtypes = m.dtypes;
  m.has_backward = true;
  m.check = [base, st](const Problem& p, Dtype dtype, const ImplOptions& opt) {
    if (base.check) base.check(p, dtype, opt);
    const dist::DistOptions o = options_of(st->f);
    if (st->f.algo == "ulysses") dist::check_ulysses(p, o.world);  // H % G == 0
    if (dist::is_ext_algo(st->f.algo)) ext_options_of(st->f);      // grid, partition
    if (st->f.algo == "double-ring")
      dist::check_double_ring(o.world, st->f.gpus_per_node > 0 ? st->f.gpus_per_node : o.world);
    dist::make_partition(o.partition, p.N_q, o.world, "N_q");  // throws naming the length
    dist::make_partition(o.partition, p.N_k, o.world, "N_k");
    if (st->f.algo == "distflash")  // contiguous partition, causal-type mask
      dist::check_distflash(compile_mask(p), dist::make_partition(o.partition, p.N_q, o.world, "N_q"),
                            dist::make_partition(o.partition, p.N_k, o.world, "N_k"));
  };
  const std::string name = m.name;
  m.prepare = [st, name](const Problem& p, const Inputs& in, const ImplOptions& opt) {
    return in.dtype == Dtype::F64 ? dist_runner<double>(p, in, opt, st, name)
                                  : dist_runner<float>(p, in, opt, st, name);
  };
  return m;
}

// Bytes per rank per phase, measured on SimComm, next to the closed forms of spec §7.5.
// Returns false when any measured count differs from its closed form.
bool bytes_report(const DistState& st, Json& header, bool json) {
  if (st.reports.empty()) return true;
  const bool ext = dist::is_ext_algo(st.f.algo);
  const dist::Algo algo = ext ? dist::Algo::Burst : dist::parse_algo(st.f.algo);
  Table t;
  t.columns = {{"impl", "impl", true},          {"dtype", "dtype", true},
               {"rank", "rank"},                {"phase", "phase", true},
               {"link", "link", true},          {"sent", "sent(B)"},
               {"sent_closed_form", "=§7.5(B)"}, {"recv", "recv(B)"},
               {"recv_closed_form", "=§7.5(B)"}, {"match", "match", true}};
  bool ok = true;
  for (const DistReport& r : st.reports) {
    const int64_t eb = r.dtype == Dtype::F64 ? 8 : 4;
    for (dist::Phase ph : {dist::Phase::Forward, dist::Phase::Backward}) {
      if ((ph == dist::Phase::Forward && !r.fwd) || (ph == dist::Phase::Backward && !r.bwd)) continue;
      for (int k = 0; k < r.qp.G; ++k) {
        const dist::ByteTotals b = dist::totals(r.logs.at(k), ph);
        const int64_t cs = ext ? dist::ext_closed_form_bytes(ext_options_of(st.f), ph, r.p, r.qp, r.kp, k, true, eb)
                               : dist::closed_form_bytes(algo, ph, r.p, r.qp, r.kp, k, true, eb);
        const int64_t cr = ext ? dist::ext_closed_form_bytes(ext_options_of(st.f), ph, r.p, r.qp, r.kp, k, false, eb)
                               : dist::closed_form_bytes(algo, ph, r.p, r.qp, r.kp, k, false, eb);
        const bool match = b.sent == cs && b.recv == cr;
        ok = ok && match;
        const int G = r.qp.G, g = st.f.gpus_per_node;
        const bool inter = g > 0 && k / g != ((k + 1) % G) / g;
        t.add({text(r.impl), text(to_string(r.dtype)), integer(k), text(dist::to_string(ph)),
               text(G == 1 || ext ? "-" : inter ? "inter" : "intra"), integer(b.sent), integer(cs), integer(b.recv),
               integer(cr), text(match ? "yes" : "NO")});
      }
    }
  }
  header["distributed"] = {{"algo", st.f.algo},
                           {"world", st.f.world},
                           {"partition", st.f.partition},
                           {"gpus_per_node", st.f.gpus_per_node},
                           {"bytes", t.json()},
                           {"bytes_match_closed_forms", ok}};
  if (!json) {
    std::printf("distributed: %s, G=%d, partition %s, SimComm%s%s; bytes per rank per phase vs spec §7.5:\n",
                st.f.algo.c_str(), st.f.world, st.f.partition.c_str(), st.f.poison ? " (poison)" : "",
                st.f.reorder ? " (reorder)" : "");
    t.print(stdout);
    if (!ok) std::printf("FAIL: measured bytes differ from the closed forms of spec §7.5\n");
    std::printf("\n");
  }
  return ok;
}

void add_schedule_command(CLI::App& app) {
  struct State {
    ShapeFlags shape;
    RunFlags run;
    DistFlags dist;
  };
  auto s = std::make_shared<State>();
  s->shape.N_q = s->shape.N_k = 16;
  s->shape.H_q = s->shape.H_kv = 1;
  s->shape.d = {64};
  s->shape.mask = "causal";
  s->run.dtype = "fp32";
  s->dist.algo = "burst";
  s->dist.world = 4;
  CLI::App* sub = app.add_subcommand(
      "schedule", "Print a distributed schedule step by step: what each rank computes and sends (spec §7)");
  add_shape_flags(sub, s->shape, false);
  add_dtype_flag(sub, s->run);
  add_pass_flag(sub, s->run);
  sub->add_option("--algo", s->dist.algo, "ring | burst | double-ring")->capture_default_str();
  sub->add_option("--gpus-per-node", s->dist.gpus_per_node, "double-ring: GPUs per node K (must divide --world)")
      ->capture_default_str();
  sub->add_option("--world", s->dist.world, "ranks G")->capture_default_str();
  sub->add_option("--partition", s->dist.partition, "contiguous | zigzag | striped")->capture_default_str();
  sub->footer(
      "Each step lists, per rank, the blocks Q[chunk]xK[chunk](visible pairs) it computes (blocks the\n"
      "mask hides are skipped), what it sends and receives (bytes at the --dtype width), then the\n"
      "per-rank work and bytes next to the closed forms of spec §7.5.\n\n"
      "Examples:\n"
      "  burstlab schedule --algo ring --world 4 --partition zigzag --mask causal --nq 16 --nk 16\n"
      "  burstlab schedule --algo burst --world 3 --partition striped --pass bwd --hq 4 --hkv 1");
  sub->callback([s] {
    try {
      const ShapeFlags& f = s->shape;
      const double* scale = *f.scale_opt ? &f.scale : nullptr;
      const Problem p = make_problem(f.B, f.H_q, f.H_kv, f.N_q, f.N_k, f.d.at(0), f.mask, f.seed, scale);
      const Passes pass = parse_pass(s->run.pass);
      const Dtype dt = parse_dtype(s->run.dtype);
      if (dt != Dtype::F64 && dt != Dtype::F32) fail("dtype (", s->run.dtype, ") must be fp64 or fp32 here");
      const dist::DistOptions o = options_of(s->dist);
      const dist::Partition qp = dist::make_partition(o.partition, p.N_q, o.world, "N_q");
      const dist::Partition kp = dist::make_partition(o.partition, p.N_k, o.world, "N_k");
      const MaskData md = compile_mask(p);
      const int64_t eb = dt == Dtype::F64 ? 8 : 4;
      std::printf("burstlab schedule: %s mask=%s\n", shape_string(p).c_str(), describe(p.mask).c_str());
      for (int r = 0; r < o.world; ++r) {
        std::printf("  rank %d holds q", r);
        for (int c : qp.rank_chunks[r]) std::printf(" %s", dist::chunk_name(qp.chunks[c]).c_str());
        std::printf(", kv");
        for (int c : kp.rank_chunks[r]) std::printf(" %s", dist::chunk_name(kp.chunks[c]).c_str());
        std::printf("\n");
      }
      if (s->dist.algo == "double-ring") {  // spec §7.9: BurstAttention traffic on the two-level ring
        print_double_ring(p, md, qp, kp, eb, s->dist.gpus_per_node > 0 ? s->dist.gpus_per_node : o.world, pass.fwd,
                          pass.bwd);
        return;
      }
      if (pass.fwd)
        std::printf("\n%s", dist::trace(dist::make_schedule(o.algo, dist::Phase::Forward, p, md, qp, kp), p, qp, kp, eb).c_str());
      if (pass.bwd)
        std::printf("\n%s", dist::trace(dist::make_schedule(o.algo, dist::Phase::Backward, p, md, qp, kp), p, qp, kp, eb).c_str());
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());  // main() prints it and exits 2
    }
  });
}

}  // namespace

void add_distributed_cli(CLI::App& app, CLI::App& run, RunHooks& hooks) {
  auto st = std::make_shared<DistState>();
  run.add_option("--algo", st->f.algo,
                 "run the cpu rows distributed on SimComm: ring | burst (RingAttention or BurstAttention) | double-ring "
                 "(BurstEngine topology-aware, with --gpus-per-node) | ulysses | allgather | attention2d (--grid, "
                 "--partition striped) | distflash (causal, contiguous)");
  run.add_option("--grid", st->f.grid, "attention2d: p_r x p_c grid, e.g. 2x3 (default: the most square)");
  run.add_flag("--overlap", st->f.overlap, "attention2d: the overlapped variant (ring gather-compute-scatter)");
  run.add_option("--world", st->f.world, "ranks G for --algo")->capture_default_str();
  run.add_option("--partition", st->f.partition, "contiguous | zigzag | striped, for --algo")->capture_default_str();
  run.add_option("--gpus-per-node", st->f.gpus_per_node, "link classes for --algo byte counts (0 = one node)")
      ->capture_default_str();
  run.add_flag("--poison", st->f.poison, "SimComm: NaN-fill receive buffers and consumed send buffers");
  run.add_flag("--reorder", st->f.reorder, "SimComm: complete transfers in a random order");
  hooks.wrap_impls = [st](const std::vector<const Impl*>& impls) {
    std::vector<Impl> out;
    for (const Impl* m : impls) {
      if (!st->f.algo.empty() && m->name == "cpu") out.push_back(wrap(*m, st));
      else out.push_back(*m);
    }
    if (!st->f.algo.empty()) {
      options_of(st->f);  // validates the flags before anything runs
      bool any = false;
      for (const Impl& m : out) any = any || m.name.find('/') != std::string::npos;
      if (!any) fail("algo (", st->f.algo, ") needs the cpu engine: add cpu to --impl");
    }
    return out;
  };
  hooks.after_run = [st](Json& header, bool json) { return st->f.algo.empty() || bytes_report(*st, header, json); };
  add_schedule_command(app);
  add_simulate_command(app);  // tools/cmd_simulate.cpp
}

}  // namespace burstlab::tools
