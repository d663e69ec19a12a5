// tools/distributed.cpp — `burstlab run --algo ...` and `burstlab schedule` (spec §7).
#include "distributed.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "algorithm.hpp"
#include "cmd_simulate.hpp"
#include "common.hpp"
#include "distflash.hpp"
#include "double_ring.hpp"
#include "partition.hpp"
#include "schedule.hpp"
#include "sim_run.hpp"
#include "svg.hpp"
#include "table.hpp"
#ifdef BURSTLAB_HAVE_NCCL
#include "nccl_run.hpp"
#endif

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
  int nodes = 0;  // --nodes M: world = M x gpus_per_node (0: use --world)
  bool world_given = false;  // --world on the command line (else --grid may imply it)
  int ulysses_degree = 0;    // usp: ranks per Ulysses group (0: --gpus-per-node)
  std::string base = "burst";  // double-ring, usp: the ring's traffic
  std::string transport = "sim";  // sim (SimComm) | nccl (NcclComm, a rank per GPU)
  double timeout = 120.0;         // nccl: the watchdog's bound on one wait (s)
  std::string inject;             // nccl: --inject-failure RANK:STEP[:bwd][:hang]
  bool single = false;            // --single: also the whole problem on one device
};

// R x C of --grid RxC, at most kMaxWorld ranks (before Grid::size() multiplies two ints).
int grid_ranks(const std::string& grid) {
  const dist::Grid g = dist::parse_grid(grid);
  const int64_t ranks = int64_t(g.p_r) * g.p_c;
  if (ranks > kMaxWorld) fail("grid (", grid, " = ", ranks, " ranks) must have at most ", kMaxWorld, " ranks");
  return static_cast<int>(ranks);
}

// G: --world, or --nodes x --gpus-per-node when --nodes is given (docs/design.md §8),
// or R x C of --grid RxC when --world is not given, or mpirun's process count (--transport nccl).
int world_of(const DistFlags& f) {
#ifdef BURSTLAB_HAVE_NCCL
  // Under mpirun the world is the processes it started, unless the flags name one.
  if (f.transport == "nccl" && launched_by_mpi() && f.nodes == 0 && !f.world_given && f.grid.empty())
    return mpi_size();
#endif
  if (f.nodes == 0 && !f.world_given && !f.grid.empty()) return grid_ranks(f.grid);
  if (f.nodes == 0) return f.world;
  if (f.nodes < 1) fail("nodes (", f.nodes, ") must be >= 1");
  if (f.gpus_per_node < 1)
    fail("nodes (", f.nodes, ") needs --gpus-per-node (", f.gpus_per_node, ") >= 1: world = nodes x gpus-per-node");
  const int64_t world = int64_t(f.nodes) * f.gpus_per_node;
  if (world > kMaxWorld)
    fail("world (nodes x gpus-per-node = ", f.nodes, " x ", f.gpus_per_node, " = ", world, ") must be <= ", kMaxWorld);
  return static_cast<int>(world);
}

// What one wrapped run leaves for the bytes table.
struct DistReport {
  std::string impl;
  Dtype dtype = Dtype::F64;
  dist::Plan plan;
  std::vector<std::vector<dist::Transfer>> logs;
  bool fwd = false, bwd = false;
  std::string transport = "SimComm";
  std::vector<std::vector<double>> exposed_fwd, exposed_bwd;  // nccl: [rank][step] ms blocked in waits
};

struct DistState {
  DistFlags f;
  std::vector<DistReport> reports;
};

// The flags as the options of the algorithm table (distributed/algorithm.hpp); --overlap turns
// attention2d into attention2d-o. Throws Error naming a bad flag.
dist::AlgoOptions options_of(const DistFlags& f) {
  dist::AlgoOptions o;
  o.algo = f.algo == "attention2d" && f.overlap ? "attention2d-o" : f.algo;
  dist::find_algorithm(o.algo);
  if (f.overlap && f.algo != "attention2d") fail("overlap is an attention2d option, not one of ", f.algo);
  o.partition = dist::parse_partition(f.partition);
  o.world = world_of(f);
  if (o.world < 1) fail("world (", o.world, ") must be >= 1");
  if (f.gpus_per_node < 0) fail("gpus-per-node (", f.gpus_per_node, ") must be >= 0 (0 = one node)");
  o.gpus_per_node = f.gpus_per_node;
  o.ulysses_degree = f.ulysses_degree;
  if (f.ulysses_degree < 0) fail("ulysses-degree (", f.ulysses_degree, ") must be >= 1");
  o.base = dist::parse_algo(f.base);
  o.sim.poison = f.poison;
  o.sim.reorder = f.reorder;
  o.sim.gpus_per_node = f.gpus_per_node;
  o.backward = true;
  if (!f.grid.empty()) {
    if (o.algo != "attention2d" && o.algo != "attention2d-o")
      fail("grid (", f.grid, ") is an attention2d and attention2d-o option, not one of ", f.algo);
    grid_ranks(f.grid);
    o.grid = dist::parse_grid(f.grid);
    if (o.grid.size() != o.world)
      fail("grid (", f.grid, " = ", o.grid.size(), " ranks) must have world (", o.world, ") ranks");
  }
  if (f.transport != "sim" && f.transport != "nccl") fail("transport (", f.transport, ") must be sim or nccl");
  if (f.transport == "sim" && !f.inject.empty())
    fail("inject-failure (", f.inject, ") is a --transport nccl option (SimComm: tests inject with SimOptions)");
#ifndef BURSTLAB_HAVE_NCCL
  if (f.transport == "nccl")
    fail("transport (nccl) needs a build with CUDA and NCCL; this binary has no NCCL transport (see the CMake "
         "feature summary)");
#endif
  if ((o.algo == "attention2d" || o.algo == "attention2d-o") && o.partition != dist::PartitionKind::Striped)
    fail(o.algo, " needs --partition striped (the cyclic distribution), not ", f.partition);
  return o;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <class U>
Tensor4<double> widen(const Tensor4<U>& x) {
  Tensor4<double> y = make_tensor4<double>(x.layout, x.B, x.H, x.N, x.d);
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = burstlab::to_double(x.data[i]);
  return y;
}
template <class U>
Tensor3<double> widen(const Tensor3<U>& x) {
  Tensor3<double> y = make_tensor3<double>(x.B, x.H, x.N);
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = burstlab::to_double(x.data[i]);
  return y;
}

}  // namespace

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

namespace {

template <class T>
Runner dist_runner(const Problem& p, const Inputs& in, const ImplOptions& opt, std::shared_ptr<DistState> st,
                   const DistFlags& f, const std::string& name, std::unique_ptr<Engine<T>> engine,
                   const EngineMakers& mk) {
  struct S {
    std::unique_ptr<Engine<T>> engine;
    std::unique_ptr<dist::Session<T>> session;
    size_t report = 0;
    void forward() { session->forward(); }
    void backward() { session->backward(); }
    dist::DistResult<T> result() const { return session->result(); }
  };
#ifdef BURSTLAB_HAVE_NCCL
  if (f.transport == "nccl") {
    engine.reset();  // each rank makes its own, on its own GPU
    auto nd = std::make_shared<NcclDist>(nccl_dist(p, in, opt, options_of(f), mk, {f.timeout, f.inject}));
    DistReport rep;
    rep.impl = name;
    rep.dtype = in.dtype;
    rep.plan = nd->plan;
    rep.transport = "NCCL (" + nd->launch + ")";
    st->reports.push_back(rep);
    const size_t k = st->reports.size() - 1;
    Runner r = nd->run;
    r.fetch_forward = [nd, st, k](Tensor4<double>& O, Tensor3<double>& LSE) {
      nd->run.fetch_forward(O, LSE);
      DistReport& x = st->reports[k];
      x.logs = nd->logs();
      x.fwd = true;
      x.exposed_fwd = nd->exposed_ms(dist::Phase::Forward);
    };
    r.fetch_backward = [nd, st, k](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
      nd->run.fetch_backward(dQ, dK, dV);
      DistReport& x = st->reports[k];
      x.logs = nd->logs();
      x.bwd = true;
      x.exposed_bwd = nd->exposed_ms(dist::Phase::Backward);
    };
    return r;
  }
#endif
  (void)opt;
  auto s = std::make_shared<S>();
  s->engine = std::move(engine);
  dist::AlgoOptions o = options_of(f);
  o.sim.memory.copy = mk.copy;  // where the engine's buffers live, for the transport
  o.sim.memory.poison = mk.poison;
  s->session = std::make_unique<dist::Session<T>>(p, in.Q.view(), in.K.view(), in.V.view(), in.dO.view(), o,
                                                  *s->engine);
  DistReport rep;
  rep.impl = name;
  rep.dtype = in.dtype;
  rep.plan = s->session->plan();
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
    GatheredOutputs g = gather_outputs(s->result(), true, false);
    O = std::move(g.O);
    LSE = std::move(g.LSE);
    keep_logs(true, false);
  };
  r.fetch_backward = [s, keep_logs](Tensor4<double>& dQ, Tensor4<double>& dK, Tensor4<double>& dV) {
    GatheredOutputs g = gather_outputs(s->result(), false, true);
    dQ = std::move(g.dQ);
    dK = std::move(g.dK);
    dV = std::move(g.dV);
    keep_logs(false, true);
  };
  return r;
}

// `base` run distributed with one algorithm of --algo (f.algo is that one name).
Impl wrap(const Impl& base, std::shared_ptr<DistState> st, const DistFlags& f) {
  Impl m;
  m.name = f.algo + "/" + base.name;
  m.about = f.algo + " attention on " + (f.transport == "nccl" ? "NCCL" : "SimComm") + ", G=" +
            std::to_string(world_of(f)) + ", " + f.partition + ", " + base.name + " engine";
  m.dtypes = base.engines.dtypes();
  m.suite_dtypes = m.dtypes;
  m.has_backward = true;
  m.check = [base, f](const Problem& p, Dtype dtype, const ImplOptions& opt) {
    if (base.check) base.check(p, dtype, opt);
    dist::make_plan(p, options_of(f));  // the algorithm's requirements: partitions, heads, grid, mask
  };
  m.footprint = distributed_footprint(f.algo, world_of(f));  // per-rank copies (resources.hpp)
  const std::string name = m.name;
  const EngineMakers mk = base.engines;
  m.prepare = [st, f, name, mk](const Problem& p, const Inputs& in, const ImplOptions& opt) {
    switch (in.dtype) {
      case Dtype::F64: return dist_runner<double>(p, in, opt, st, f, name, mk.f64(opt), mk);
      case Dtype::F32: return dist_runner<float>(p, in, opt, st, f, name, mk.f32(opt), mk);
      case Dtype::BF16: return dist_runner<bf16_t>(p, in, opt, st, f, name, mk.bf16(opt), mk);
      case Dtype::F16: break;
    }
    return dist_runner<f16_t>(p, in, opt, st, f, name, mk.f16(opt), mk);
  };
  return m;
}

double sum(const std::vector<double>& v) {
  double t = 0;
  for (double x : v) t += x;
  return t;
}

// The checked, timed row of `run` for (impl, dtype, pass); null when absent or failed.
const Result* find_row(const std::vector<Result>& rs, const std::string& impl, Dtype dtype, const char* pass) {
  for (const Result& r : rs)
    if (r.impl == impl && r.dtype == dtype && r.pass == pass) return r.error.empty() ? &r : nullptr;
  return nullptr;
}

// Bytes per rank per phase, measured by the transport, next to the closed forms of spec §7.5,
// with each rank's send rate over the pass and its exposed communication (NCCL); then, with
// --single, the scaling table. Returns false when any measured count differs from its closed form.
bool bytes_report(const DistState& st, Json& header, bool json, const std::vector<Result>& rs) {
  if (st.reports.empty()) return true;
  const bool nccl = st.f.transport == "nccl";
  Table t;
  t.columns = {{"impl", "impl", true},          {"dtype", "dtype", true},
               {"rank", "rank"},                {"phase", "phase", true},
               {"link", "link", true},          {"sent", "sent(B)"},
               {"sent_closed_form", "=§7.5(B)"}, {"recv", "recv(B)"},
               {"recv_closed_form", "=§7.5(B)"}, {"match", "match", true},
               {"sent_inter", "inter(B)"},      {"send_rate_GBps", "GB/s"},
               {"exposed_ms", "exposed(ms)"}};
  Table sc;  // scaling: one device vs the distributed run, same problem, same run
  sc.columns = {{"impl", "impl", true},         {"dtype", "dtype", true},   {"pass", "pass", true},
                {"single_ms", "1 device(ms)"},  {"dist_ms", "G ranks(ms)"}, {"speedup", "T1/TG"},
                {"exposed_ms", "exposed(ms)"},  {"exposed_pct", "exposed(%)"}};
  Json exposed_steps = Json::array();
  bool ok = true;
  for (const DistReport& r : st.reports) {
    // Inputs in the storage type, statistics and gradients in its accumulation type (spec §9.1).
    const dist::ElemBytes eb(bytes_of(r.dtype), bytes_of(accumulator_of(r.dtype)));
    const std::string base = r.impl.substr(r.impl.find('/') + 1);
    double t1_sum = 0, tg_sum = 0, ex_sum = 0;
    int passes = 0;
    for (dist::Phase ph : {dist::Phase::Forward, dist::Phase::Backward}) {
      if ((ph == dist::Phase::Forward && !r.fwd) || (ph == dist::Phase::Backward && !r.bwd)) continue;
      const char* pass = ph == dist::Phase::Forward ? "fwd" : "bwd";
      const Result* row = find_row(rs, r.impl, r.dtype, pass);
      const auto& ex = ph == dist::Phase::Forward ? r.exposed_fwd : r.exposed_bwd;
      double ex_max = 0;  // the rank that waited longest
      for (int k = 0; k < r.plan.qp.G; ++k) {
        const dist::ByteTotals b = dist::totals(r.logs.at(k), ph);
        const int64_t inter = dist::totals(r.logs.at(k), ph, -1, static_cast<int>(dist::Link::Inter)).sent;
        const int64_t cs = dist::plan_bytes(r.plan, ph, k, true, eb);
        const int64_t cr = dist::plan_bytes(r.plan, ph, k, false, eb);
        const bool match = b.sent == cs && b.recv == cr;
        ok = ok && match;
        const int G = r.plan.qp.G, g = st.f.gpus_per_node;
        const bool ring_like = r.plan.o.algo == "ring" || r.plan.o.algo == "burst";  // one link per direction
        const bool inter_link = g > 0 && k / g != ((k + 1) % G) / g;
        const bool has_ex = k < static_cast<int>(ex.size());
        if (has_ex) ex_max = std::max(ex_max, sum(ex[k]));
        t.add({text(r.impl), text(to_string(r.dtype)), integer(k), text(dist::to_string(ph)),
               text(G == 1 || !ring_like ? "-" : inter_link ? "inter" : "intra"), integer(b.sent), integer(cs),
               integer(b.recv), integer(cr), text(match ? "yes" : "NO"), integer(inter),
               row && row->ms > 0 ? number(double(b.sent) / (row->ms * 1e6), "%.2f") : text("-"),
               has_ex ? number(sum(ex[k]), "%.3f") : text("-")});
        if (has_ex)
          exposed_steps.push_back({{"impl", r.impl}, {"dtype", to_string(r.dtype)}, {"phase", dist::to_string(ph)},
                                   {"rank", k}, {"ms_per_step", ex[k]}});
      }
      const Result* one = find_row(rs, base, r.dtype, pass);
      if (one && row) {
        const bool has_ex = !ex.empty();
        sc.add({text(r.impl), text(to_string(r.dtype)), text(pass), number(one->ms, "%.3f"), number(row->ms, "%.3f"),
                number(one->ms / row->ms, "%.3f"), has_ex ? number(ex_max, "%.3f") : text("-"),
                has_ex ? number(100.0 * ex_max / row->ms, "%.1f") : text("-")});
        t1_sum += one->ms;
        tg_sum += row->ms;
        ex_sum += ex_max;
        ++passes;
      }
    }
    if (passes == 2)
      sc.add({text(r.impl), text(to_string(r.dtype)), text("fwd+bwd"), number(t1_sum, "%.3f"), number(tg_sum, "%.3f"),
              number(t1_sum / tg_sum, "%.3f"), nccl ? number(ex_sum, "%.3f") : text("-"),
              nccl ? number(100.0 * ex_sum / tg_sum, "%.1f") : text("-")});
  }
  header["distributed"] = {{"algo", st.f.algo},
                           {"world", world_of(st.f)},
                           {"partition", st.f.partition},
                           {"gpus_per_node", st.f.gpus_per_node},
                           {"transport", st.reports.front().transport},
                           {"bytes", t.json()},
                           {"bytes_match_closed_forms", ok}};
  if (!sc.rows.empty()) header["distributed"]["scaling"] = sc.json();
  if (!exposed_steps.empty()) header["distributed"]["exposed"] = exposed_steps;
  if (!json) {
    std::printf("distributed: %s, G=%d, partition %s, %s%s%s; bytes per rank per phase vs spec §7.5%s:\n",
                st.f.algo.c_str(), world_of(st.f), st.f.partition.c_str(), st.reports.front().transport.c_str(),
                st.f.poison ? " (poison)" : "", st.f.reorder ? " (reorder)" : "",
                nccl ? "; GB/s = sent bytes / pass time; exposed = host ms blocked in waits after the step's compute" : "");
    t.print(stdout);
    if (!ok) std::printf("FAIL: measured bytes differ from the closed forms of spec §7.5\n");
    if (!sc.rows.empty()) {
      std::printf("\nscaling (--single): the whole problem on one device vs G ranks, best of --repeat; exposed: the "
                  "rank that waited longest, of its latest pass%s\n",
                  nccl ? "" : " (SimComm: not measured)");
      sc.print(stdout);
    }
    std::printf("\n");
  }
  return ok;
}

// `schedule --json` of a ring-type schedule (ring, burst, double-ring; spec §7.2): per rank and
// step the blocks (chunk names, visible pairs), the masked blocks skipped, the messages with
// their bytes; per rank the work and the bytes next to the closed forms of §7.5 (flat rings).
Json schedule_json(const dist::Schedule& s, const Problem& p, const dist::Partition& qp, const dist::Partition& kp,
                   dist::ElemBytes eb, bool closed_forms) {
  const auto& items = dist::travelling_items(s.algo, s.phase);
  Json travelling = Json::array();
  for (const dist::Item& it : items) travelling.push_back(it.name);
  auto messages = [&](const std::vector<dist::Message>& ms) {
    Json a = Json::array();
    for (const dist::Message& m : ms)
      a.push_back({{"tensor", m.tensor},
                   {"shard", m.shard},
                   {"peer", m.peer},
                   {"bytes", m.elems * eb.of(items[m.item])},
                   {"after_compute", m.after_compute},
                   {"lands", m.lands}});
    return a;
  };
  Json steps = Json::array();
  for (int r = 0; r < s.G; ++r) {
    Json row = Json::array();
    for (size_t t = 0; t < s.steps[r].size(); ++t) {
      const dist::RankStep& st = s.steps[r][t];
      Json blocks = Json::array();
      int64_t pairs = 0;
      for (const dist::BlockTask& b : st.blocks) {
        blocks.push_back({{"q_chunk", b.q_chunk},
                          {"k_chunk", b.k_chunk},
                          {"q", dist::chunk_name(qp.chunks[b.q_chunk])},
                          {"k", dist::chunk_name(kp.chunks[b.k_chunk])},
                          {"pairs", b.visible}});
        pairs += b.visible;
      }
      row.push_back({{"rank", r},
                     {"step", t},
                     {"q_shard", st.q_shard},
                     {"k_shard", st.k_shard},
                     {"blocks", blocks},
                     {"pairs", pairs},
                     {"skipped", st.skipped.size()},
                     {"sends", messages(st.sends)},
                     {"recvs", messages(st.recvs)}});
    }
    steps.push_back(row);
  }
  Json ranks = Json::array();
  for (int r = 0; r < s.G; ++r) {
    const dist::Work w = dist::work(s, r);
    Json o = {{"rank", r},
              {"blocks", w.blocks},
              {"pairs", w.pairs},
              {"sent", dist::schedule_bytes(s, r, true, eb)},
              {"recv", dist::schedule_bytes(s, r, false, eb)}};
    if (closed_forms) {
      o["sent_closed_form"] = dist::closed_form_bytes(s.algo, s.phase, p, qp, kp, r, true, eb);
      o["recv_closed_form"] = dist::closed_form_bytes(s.algo, s.phase, p, qp, kp, r, false, eb);
    }
    ranks.push_back(o);
  }
  return {{"phase", dist::to_string(s.phase)}, {"travelling", travelling}, {"steps", steps}, {"ranks", ranks}};
}

// `schedule --json` of DistFlashAttn (spec §7.12): role and block per (rank, step), the idle
// fraction (7.24), bytes per rank and phase (7.25).
Json distflash_json(const dist::FlashSchedule& fs, const std::vector<std::vector<int64_t>>& pairs, const Problem& p,
                    const dist::Partition& qp, const dist::Partition& kp, int64_t eb, bool fwd, bool bwd) {
  Json steps = Json::array();
  for (int r = 0; r < fs.P; ++r) {
    Json row = Json::array();
    for (size_t t = 0; t < fs.steps[r].size(); ++t) {
      const dist::FlashStep& st = fs.steps[r][t];
      const bool idle = st.role == dist::FlashRole::Idle;
      row.push_back({{"rank", r},
                     {"step", t},
                     {"role", idle ? "idle" : st.role == dist::FlashRole::Owner ? "owner" : "helper"},
                     {"q", st.q},
                     {"k", st.k},
                     {"pairs", idle ? 0 : pairs[st.q][st.k]},
                     {"kv_dst", st.kv_dst},
                     {"q_dst", st.q_dst}});
    }
    steps.push_back(row);
  }
  Json bytes = Json::array();
  for (dist::Phase ph : {dist::Phase::Forward, dist::Phase::Backward}) {
    if ((ph == dist::Phase::Forward && !fwd) || (ph == dist::Phase::Backward && !bwd)) continue;
    for (int r = 0; r < fs.P; ++r)
      bytes.push_back({{"phase", dist::to_string(ph)},
                       {"rank", r},
                       {"sent_closed_form", dist::distflash_bytes(ph, p, qp, kp, r, true, eb)},
                       {"recv_closed_form", dist::distflash_bytes(ph, p, qp, kp, r, false, eb)}});
  }
  return {{"steps", steps}, {"idle_fraction", dist::distflash_idle_fraction(fs)}, {"bytes", bytes}};
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("svg (", path, ") cannot be opened for writing");
  f << text;
  if (!f.flush()) fail("svg (", path, ") could not be written");
}

void add_schedule_command(CLI::App& app) {
  struct State {
    ShapeFlags shape;
    RunFlags run;
    DistFlags dist;
    std::string svg;  // --svg FILE
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
  sub->get_option("--dtype")->description("element width of the bytes printed: fp64 | fp32");
  add_pass_flag(sub, s->run);
  std::string algos;
  for (const dist::Algorithm& a : dist::algorithms()) algos += std::string(algos.empty() ? "" : " | ") + a.name;
  sub->add_option("--algo", s->dist.algo, algos)->capture_default_str();
  sub->add_option("--grid", s->dist.grid,
                  "attention2d, attention2d-o: p_r x p_c grid, e.g. 2x3 (default: the most square); implies --world "
                  "R*C");
  sub->add_flag("--overlap", s->dist.overlap,
                "attention2d: the overlapped variant Attention2D-O, its ring steps (spec §7.13; = --algo attention2d-o)");
  int_range(sub->add_option("--gpus-per-node", s->dist.gpus_per_node,
                            "GPUs per node K (0 = one node): double-ring's K (must divide --world), usp's default "
                            "--ulysses-degree, --nodes' world M x K")
                ->capture_default_str(),
            "gpus-per-node", 0, kMaxWorld, ">= 0 (0 = one node)");
  int_range(sub->add_option("--ulysses-degree", s->dist.ulysses_degree,
                            "usp: ranks per Ulysses group u (divides --world, --hq and --hkv; default --gpus-per-node)"),
            "ulysses-degree", 1, kMaxWorld);
  sub->add_option("--ring", s->dist.base, "double-ring, usp: the ring's traffic, ring | burst")->capture_default_str();
  int_range(sub->add_option("--world", s->dist.world, "ranks G")->capture_default_str()->each([s](const std::string&) {
    s->dist.world_given = true;
  }),
            "world", 1, kMaxWorld);
  int_range(sub->add_option("--nodes", s->dist.nodes, "nodes M: world = M x --gpus-per-node (overrides --world)"),
            "nodes", 1, kMaxWorld);
  sub->add_option("--partition", s->dist.partition, "contiguous | zigzag | striped")->capture_default_str();
  sub->add_option("--svg", s->svg,
                  "ring, burst, double-ring, distflash: also draw the schedule into this SVG file (one row per rank, "
                  "one column per step; each cell the blocks computed and what is sent)");
  sub->add_flag("--json", s->run.json,
                "print the schedule as JSON on stdout instead of the trace (ring, burst, double-ring, distflash)");
  sub->footer(
      "Each step lists, per rank, the blocks Q[chunk]xK[chunk](visible pairs) it computes (blocks the\n"
      "mask hides are skipped), what it sends and receives (bytes at the --dtype width), then the\n"
      "per-rank work and bytes next to the closed forms of spec §7.5.\n\n"
      "Examples:\n"
      "  burstlab schedule --algo ring --world 4 --partition zigzag --mask causal --nq 16 --nk 16\n"
      "  burstlab schedule --algo burst --world 3 --partition striped --pass bwd --hq 4 --hkv 1\n"
      "  burstlab schedule --algo ulysses --world 4 --hq 8 --hkv 4 --nq 16 --nk 16 -d 8   (collectives:\n"
      "  what each rank holds before/after each all-to-all, bytes per peer, spec 7.10-7.13)\n"
      "  burstlab schedule --algo usp --world 4 --ulysses-degree 2 --hq 4 --hkv 2 --nq 16 --nk 16 -d 8\n"
      "  burstlab schedule --algo burst --world 4 --pass bwd --svg burst.svg   (a picture: ranks x steps)\n"
      "  burstlab schedule --algo distflash --world 4 --json                    (the schedule as data)\n"
      "--json and --svg cover ring, burst, double-ring and distflash.");
  sub->callback([s] {
    try {
      const ShapeFlags& f = s->shape;
      const double* scale = *f.scale_opt ? &f.scale : nullptr;
      const Problem p = make_problem(f.B, f.H_q, f.H_kv, f.N_q, f.N_k, f.d.at(0), f.mask, f.seed, scale);
      const Passes pass = parse_pass(s->run.pass);
      const Dtype dt = parse_dtype(s->run.dtype);
      if (dt != Dtype::F64 && dt != Dtype::F32) fail("dtype (", s->run.dtype, ") must be fp64 or fp32 here");
      dist::AlgoOptions o = options_of(s->dist);  // names every algorithm when --algo is unknown
      o.backward = true;
      const dist::Partition qp = dist::make_partition(o.partition, p.N_q, o.world, "N_q");
      const dist::Partition kp = dist::make_partition(o.partition, p.N_k, o.world, "N_k");
      const int64_t eb = dt == Dtype::F64 ? 8 : 4;
      const std::string& algo = s->dist.algo;
      const bool as_data = algo == "ring" || algo == "burst" || algo == "double-ring" || algo == "distflash";
      if ((s->run.json || !s->svg.empty()) && !as_data)
        fail("algo (", algo, ") has no ", s->run.json ? "--json" : "--svg",
             " schedule: ring, burst, double-ring and distflash do (the others print a trace)");
      if (as_data && (s->run.json || !s->svg.empty())) {
        const MaskData md = compile_mask(p);
        const std::string title = algo + ", G=" + std::to_string(o.world) + ", " + s->dist.partition + ", " +
                                  shape_string(p) + ", mask " + describe(p.mask);
        Json out = {{"algo", algo},
                    {"world", o.world},
                    {"partition", s->dist.partition},
                    {"N_q", p.N_q},
                    {"N_k", p.N_k},
                    {"mask", describe(p.mask)},
                    {"element_bytes", eb}};
        Json q_chunks = Json::array(), k_chunks = Json::array();
        for (int r = 0; r < o.world; ++r) {
          Json qr = Json::array(), kr = Json::array();
          for (int c : qp.rank_chunks[r]) qr.push_back(dist::chunk_name(qp.chunks[c]));
          for (int c : kp.rank_chunks[r]) kr.push_back(dist::chunk_name(kp.chunks[c]));
          q_chunks.push_back(qr);
          k_chunks.push_back(kr);
        }
        out["q_chunks"] = q_chunks;
        out["k_chunks"] = k_chunks;
        if (algo == "distflash") {
          dist::check_distflash(md, qp, kp);
          const dist::FlashSchedule fs = dist::make_distflash_schedule(o.world);
          const MaskParams m = md.params();
          std::vector<std::vector<int64_t>> pairs(o.world, std::vector<int64_t>(o.world, 0));
          for (int a = 0; a < o.world; ++a)
            for (int b = 0; b < o.world; ++b)
              for (int qc : qp.rank_chunks[a])
                for (int kc : kp.rank_chunks[b]) pairs[a][b] += dist::visible_in(m, qp.chunks[qc], kp.chunks[kc]);
          out["distflash"] = distflash_json(fs, pairs, p, qp, kp, eb, pass.fwd, pass.bwd);
          if (!s->svg.empty()) write_file(s->svg, distflash_svg("burstlab schedule: " + title, fs, pairs));
        } else {
          const bool dbl = algo == "double-ring";
          const int K = s->dist.gpus_per_node > 0 ? s->dist.gpus_per_node : o.world;
          const dist::Algo base = dbl ? o.base : dist::parse_algo(algo);  // double-ring: --ring's traffic
          std::vector<dist::Schedule> scheds;
          for (dist::Phase ph : {dist::Phase::Forward, dist::Phase::Backward}) {
            if ((ph == dist::Phase::Forward && !pass.fwd) || (ph == dist::Phase::Backward && !pass.bwd)) continue;
            scheds.push_back(dbl ? dist::make_double_ring_schedule(base, ph, p, md, qp, kp, K)
                                 : dist::make_schedule(base, ph, p, md, qp, kp));
          }
          Json phases = Json::array();
          std::vector<RingPanel> panels;
          for (const dist::Schedule& sc : scheds) {
            phases.push_back(schedule_json(sc, p, qp, kp, eb, !dbl));
            panels.push_back({&sc, algo + " " + dist::to_string(sc.phase)});
          }
          out["phases"] = phases;
          if (!s->svg.empty()) write_file(s->svg, schedule_svg("burstlab schedule: " + title, panels, qp, kp, eb));
        }
        if (s->run.json) {
          std::printf("%s\n", out.dump(1).c_str());
          return;
        }
      }
      std::printf("burstlab schedule: %s mask=%s\n", shape_string(p).c_str(), describe(p.mask).c_str());
      for (int r = 0; r < o.world; ++r) {
        std::printf("  rank %d holds q", r);
        for (int c : qp.rank_chunks[r]) std::printf(" %s", dist::chunk_name(qp.chunks[c]).c_str());
        std::printf(", kv");
        for (int c : kp.rank_chunks[r]) std::printf(" %s", dist::chunk_name(kp.chunks[c]).c_str());
        std::printf("\n");
      }
      // make_plan runs the algorithm's requirement checks (an Error: exit 2).
      const dist::Plan plan = dist::make_plan(p, o);
      const dist::Trace t = dist::find_algorithm(o.algo).trace(plan, eb, pass.fwd, pass.bwd);
      std::fputs(t.text.c_str(), stdout);
      if (!t.ok) std::exit(1);
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());  // main() prints it and exits 2
    }
  });
}

}  // namespace

void add_distributed_cli(CLI::App& app, CLI::App& run, RunHooks& hooks) {
  auto st = std::make_shared<DistState>();
  const std::vector<const CLI::Option*> before = static_cast<const CLI::App&>(run).get_options();
  std::string algos;
  for (const dist::Algorithm& a : dist::algorithms())
    algos += std::string(algos.empty() ? "" : " | ") + a.name + " (" + a.spec + ")";
  run.add_option("--algo", st->f.algo,
                 "run every selected implementation that provides an engine (cpu; cuda: ranks as threads on one "
                 "GPU) distributed on SimComm: " + algos +
                     ". double-ring takes --gpus-per-node, attention2d --grid and --partition striped, distflash a "
                     "causal mask and --partition contiguous");
  run.add_option("--grid", st->f.grid,
                 "attention2d, attention2d-o: p_r x p_c grid, e.g. 2x3 (default: the most square); implies --world "
                 "R*C");
  run.add_flag("--overlap", st->f.overlap,
               "attention2d: the overlapped variant Attention2D-O, ring gather-compute-scatter (spec §7.13; = --algo "
               "attention2d-o)");
  int_range(run.add_option("--world", st->f.world, "ranks G for --algo")->capture_default_str()->each([st](const std::string&) {
    st->f.world_given = true;
  }),
            "world", 1, kMaxWorld);
  int_range(run.add_option("--nodes", st->f.nodes, "nodes M for --algo: world = M x --gpus-per-node (overrides --world)"),
            "nodes", 1, kMaxWorld);
  run.add_option("--partition", st->f.partition, "contiguous | zigzag | striped, for --algo")->capture_default_str();
  int_range(run.add_option("--gpus-per-node", st->f.gpus_per_node,
                           "GPUs per node K for --algo (0 = one node): the intra/inter-node link of each byte count, "
                           "double-ring's K, usp's default --ulysses-degree, --nodes' world M x K")
                ->capture_default_str(),
            "gpus-per-node", 0, kMaxWorld, ">= 0 (0 = one node)");
  int_range(run.add_option("--ulysses-degree", st->f.ulysses_degree,
                           "usp: ranks per Ulysses group u (divides --world, --hq and --hkv; default --gpus-per-node)"),
            "ulysses-degree", 1, kMaxWorld);
  run.add_option("--ring", st->f.base, "double-ring, usp: the ring's traffic, ring | burst")->capture_default_str();
  run.add_option("--transport", st->f.transport,
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
  std::vector<const CLI::Option*> with_algo;
  for (const CLI::Option* o : run.get_options())
    if (o->get_name() != "--algo" && std::find(before.begin(), before.end(), o) == before.end()) with_algo.push_back(o);
  hooks.wrap_impls = [st, with_algo](const std::vector<const Impl*>& impls) {
    if (st->f.algo.empty()) {
      std::string given;  // "--transport (nccl), --world (2)"
      int n = 0;
      for (const CLI::Option* o : with_algo) {
        if (o->count() == 0) continue;
        std::string value;
        for (const std::string& v : o->results()) value += (value.empty() ? "" : ",") + v;
        given += (given.empty() ? "" : ", ") + o->get_name() + (o->get_expected_max() == 0 ? "" : " (" + value + ")");
        ++n;
      }
      if (n > 0)
        fail(given, n == 1 ? " needs" : " need", " --algo (", dist::algorithm_names(),
             "): without it `run` checks each --impl on one device");
    }
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
      const bool fits = st->f.transport != "nccl" || static_cast<bool>(m->engines.copy);
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
          if (m.engines.any() && (st->f.transport != "nccl" || m.engines.copy))
            engines += (engines.empty() ? "" : ", ") + m.name;
        fail("algo (", st->f.algo, ") needs an implementation that provides an engine in --impl (", engines, ")");
      }
    }
    return out;
  };
  hooks.after_run = [st](Json& header, bool json, const std::vector<Result>& rs) {
    return st->f.algo.empty() || bytes_report(*st, header, json, rs);
  };
  add_schedule_command(app);
  add_simulate_command(app);  // tools/cmd_simulate.cpp
}

}  // namespace burstlab::tools
