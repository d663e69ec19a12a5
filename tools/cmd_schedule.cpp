// tools/cmd_schedule.cpp — `burstlab schedule`: a distributed schedule step by step (spec §7),
// as the algorithm's teaching trace, or as data (--json) and a picture (--svg) for the ring-type
// schedules and DistFlashAttn.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "algorithm.hpp"
#include "common.hpp"
#include "dist_flags.hpp"
#include "distflash.hpp"
#include "double_ring.hpp"
#include "partition.hpp"
#include "schedule.hpp"
#include "svg.hpp"
#include "table.hpp"

namespace burstlab::tools {

namespace {

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
      a.push_back({{"tensor", m.tensor}, {"shard", m.shard}, {"peer", m.peer},
                   {"bytes", m.elems * eb.of(items[m.item])}, {"after_compute", m.after_compute}, {"lands", m.lands}});
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
        blocks.push_back({{"q_chunk", b.q_chunk}, {"k_chunk", b.k_chunk}, {"q", dist::chunk_name(qp.chunks[b.q_chunk])},
                          {"k", dist::chunk_name(kp.chunks[b.k_chunk])}, {"pairs", b.visible}});
        pairs += b.visible;
      }
      row.push_back({{"rank", r}, {"step", t}, {"q_shard", st.q_shard}, {"k_shard", st.k_shard}, {"blocks", blocks},
                     {"pairs", pairs}, {"skipped", st.skipped.size()}, {"sends", messages(st.sends)},
                     {"recvs", messages(st.recvs)}});
    }
    steps.push_back(row);
  }
  Json ranks = Json::array();
  for (int r = 0; r < s.G; ++r) {
    const dist::Work w = dist::work(s, r);
    Json o = {{"rank", r}, {"blocks", w.blocks}, {"pairs", w.pairs}, {"sent", dist::schedule_bytes(s, r, true, eb)},
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
      const char* role = idle ? "idle" : st.role == dist::FlashRole::Owner ? "owner" : "helper";
      row.push_back({{"rank", r}, {"step", t}, {"role", role}, {"q", st.q}, {"k", st.k},
                     {"pairs", idle ? 0 : pairs[st.q][st.k]}, {"kv_dst", st.kv_dst}, {"q_dst", st.q_dst}});
    }
    steps.push_back(row);
  }
  Json bytes = Json::array();
  for (dist::Phase ph : {dist::Phase::Forward, dist::Phase::Backward}) {
    if ((ph == dist::Phase::Forward && !fwd) || (ph == dist::Phase::Backward && !bwd)) continue;
    for (int r = 0; r < fs.P; ++r)
      bytes.push_back({{"phase", dist::to_string(ph)}, {"rank", r},
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

}  // namespace

Command add_schedule_command(CLI::App& app) {
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
  add_topology_flags(*sub, s->dist);
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
  return {sub, [s]() -> int {
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
    const dist::Drawing drawing = dist::find_algorithm(o.algo).drawing;
    const bool as_data = drawing != dist::Drawing::None;
    if ((s->run.json || !s->svg.empty()) && !as_data)
      fail("algo (", algo, ") has no ", s->run.json ? "--json" : "--svg", " schedule: ",
           names_where([](const dist::Algorithm& a) { return a.drawing != dist::Drawing::None; }),
           " do (the others print a trace)");
    if (as_data && (s->run.json || !s->svg.empty())) {
      const MaskData md = compile_mask(p);
      const std::string title = algo + ", G=" + std::to_string(o.world) + ", " + s->dist.partition + ", " +
                                shape_string(p) + ", mask " + describe(p.mask);
      Json out = {{"algo", algo}, {"world", o.world}, {"partition", s->dist.partition}, {"N_q", p.N_q}, {"N_k", p.N_k},
                  {"mask", describe(p.mask)}, {"element_bytes", eb}};
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
      if (drawing == dist::Drawing::Flash) {
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
        const bool dbl = drawing == dist::Drawing::DoubleRing;
        const int K = s->dist.gpus_per_node > 0 ? s->dist.gpus_per_node : o.world;
        const dist::Algo base = dbl ? o.base : *dist::find_algorithm(algo).ring_traffic;  // double-ring: --ring's
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
        return kExitPass;
      }
    }
    // make_plan runs the algorithm's requirement checks (an Error: exit 2, before any output).
    const dist::Plan plan = dist::make_plan(p, o);
    const dist::Trace t = dist::find_algorithm(o.algo).trace(plan, eb, pass.fwd, pass.bwd);
    std::printf("burstlab schedule: %s mask=%s\n", shape_string(p).c_str(), describe(p.mask).c_str());
    for (int r = 0; r < o.world; ++r) {
      std::printf("  rank %d holds q", r);
      for (int c : qp.rank_chunks[r]) std::printf(" %s", dist::chunk_name(qp.chunks[c]).c_str());
      std::printf(", kv");
      for (int c : kp.rank_chunks[r]) std::printf(" %s", dist::chunk_name(kp.chunks[c]).c_str());
      std::printf("\n");
    }
    std::fputs(t.text.c_str(), stdout);
    return t.ok ? kExitPass : kExitFail;
  }};
}

}  // namespace burstlab::tools
