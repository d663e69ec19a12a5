// tools/dist_report.cpp — the bytes and scaling tables of `run --algo`.
#include "dist_report.hpp"

#include <algorithm>
#include <cstdio>

namespace burstlab::tools {

namespace {

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

}  // namespace

bool bytes_report(const std::vector<DistReport>& reports, const DistFlags& f, Json& header, bool json,
                  const std::vector<Result>& rs) {
  if (reports.empty()) return true;
  const bool nccl = f.transport == Transport::Nccl;
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
  for (const DistReport& r : reports) {
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
        const int G = r.plan.qp.G, g = f.gpus_per_node;
        const bool ring_like = dist::find_algorithm(r.plan.o.algo).ring_links;  // one link per direction
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
  header["distributed"] = {{"algo", f.algo}, {"world", world_of(f)}, {"partition", f.partition},
                           {"gpus_per_node", f.gpus_per_node}, {"transport", reports.front().transport},
                           {"bytes", t.json()}, {"bytes_match_closed_forms", ok}};
  if (!sc.rows.empty()) header["distributed"]["scaling"] = sc.json();
  if (!exposed_steps.empty()) header["distributed"]["exposed"] = exposed_steps;
  if (!json) {
    std::printf("distributed: %s, G=%d, partition %s, %s%s%s; bytes per rank per phase vs spec §7.5%s:\n",
                f.algo.c_str(), world_of(f), f.partition.c_str(), reports.front().transport.c_str(),
                f.poison ? " (poison)" : "", f.reorder ? " (reorder)" : "",
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

}  // namespace burstlab::tools
