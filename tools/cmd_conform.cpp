// tools/cmd_conform.cpp — `burstlab conform`: every built-in implementation (and every algorithm of
// the table on each engine) over the case suite, one PASS/FAIL matrix (docs/conformance.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "algorithm.hpp"  // the schedules of spec §7: algorithms()
#include "burstlab/dispatch.hpp"
#include "burstlab/error.hpp"
#include "case.hpp"
#include "cmd_case.hpp"
#include "common.hpp"
#include "gather.hpp"
#include "lmhead_case.hpp"
#include "npy.hpp"
#include "resources.hpp"
#include "session.hpp"

namespace burstlab::tools {
namespace {

namespace fs = std::filesystem;
using check::CaseData;
using check::CaseMeta;

// ---- conform -----------------------------------------------------------------------------------
// A column of the matrix. prepare() validates and sets up one case (throws Error when the column
// cannot run that problem: cell "n/a"); the closure it returns runs it (any throw: cell FAIL).
using RunFn = std::function<check::Candidate()>;
struct Column {
  std::string name;
  std::vector<Dtype> dtypes;
  std::function<RunFn(const CaseData& cd)> prepare;
  Footprint footprint;  // host bytes of its run (resources.hpp); empty: not estimated
};

check::Candidate candidate_of(Dtype t, Layout layout) {
  check::Candidate c;
  c.dtype = t;
  c.layout = layout;
  return c;
}

Column impl_column(const Impl& m) {
  Column col;
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
    const auto res = s->session->result();
    check::Candidate c = candidate_of(t, Layout::BHSD);
    c.O = widen(dist::gather(res.O, res.qp));
    c.LSE = widen(dist::gather(res.LSE, res.qp));
    c.dQ = widen(dist::gather(res.dQ, res.qp));
    c.dK = widen(dist::gather(res.dK, res.kp));
    c.dV = widen(dist::gather(res.dV, res.kp));
    c.has_O = c.has_LSE = c.has_dQ = c.has_dK = c.has_dV = true;
    return c;
  };
}

// A Session of options o with the engine of `mk` for the case's dtype.
RunFn dist_prepare_any(const CaseData& cd, const dist::AlgoOptions& o, const EngineMakers& mk, const ImplOptions& io) {
  return dispatch_dtype(cd.meta.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return dist_prepare<T, dist::Session<T>>(cd, o, mk.make<T>(io), mk);
  });
}

// Every algorithm of the table (distributed/algorithm.hpp), on the engine of each implementation
// in `engines` (the layers cpu and cuda, and the engine plug-ins --impl names). attention2d runs on
// the cyclic partition it needs, distflash on the contiguous one, usp with groups of 2 (when 2
// divides G).
std::vector<Column> dist_columns(int world, const std::string& partition, const std::vector<const Impl*>& engines) {
  std::vector<Column> out;
  for (const Impl* mp : engines) {
    const Impl& m = *mp;
    if (!m.engines.any()) continue;
    const EngineMakers mk = m.engines;
    for (const dist::Algorithm& a : dist::algorithms()) {
      const std::string name = a.name;
      dist::AlgoOptions o;
      o.algo = name;
      o.partition = dist::parse_partition(partition);
      o.world = world;
      o.backward = true;
      Column col;
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
      col.footprint = distributed_footprint(a.gathers_kv, world, mk.footprint);
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

Command add_conform(CLI::App& app) {
  struct S {
    std::string suite_dir, dtype = "fp64,fp32", impl, partition = "contiguous";
    bool full = false, json = false;
    int world = 2;
    RunFlags run;  // --threads
  };
  auto s = std::make_shared<S>();
  CLI::App* sub = app.add_subcommand(
      "conform", "Run every built-in implementation over the case suite: one PASS/FAIL matrix (worst err/bound)");
  // --case as in oracle and check (a case directory or a suite of them); --suite is its old name.
  sub->add_option("--case,--suite", s->suite_dir,
                  "a case directory, or a suite directory from `burstlab gen` (default: generate the suite in memory)");
  sub->add_flag("--full", s->full, "the full generated suite (default: the quick subset)");
  sub->add_option("--dtype", s->dtype, "dtypes of the generated suite, comma-separated: fp64, fp32, bf16, fp16 (not "
                                       "with --suite: its cases name theirs)")
      ->capture_default_str();
  sub->add_option("--impl", s->impl, "only these columns (comma-separated names as printed)");
  int_range(sub->add_option("--world", s->world, "ranks of the distributed columns (SimComm)")->capture_default_str(),
            "world", 1, kMaxWorld);
  sub->add_option("--partition", s->partition,
                  "contiguous | zigzag | striped: partition of the distributed columns (attention2d, attention2d-o: always striped)")
      ->capture_default_str();
  sub->add_flag("--json", s->json, "one JSON object per cell instead of the matrix");
  add_threads_flag(sub, s->run);
  sub->footer(
      "Cells: PASS/FAIL and the worst err/bound over O, LSE, dQ, dK, dV (spec §9); '-' = the column does\n"
      "not run that dtype; 'n/a' = it cannot run that problem (reason listed below the matrix).\n"
      "Exit: 0 every cell passed, 1 a cell failed or no cell was judged (every cell '-' or 'n/a'), 2 bad\n"
      "input: among it a case that would not fit in memory with the columns that run it (the message\n"
      "names what fits), inputs that are not finite or whose logits overflow fp64 (spec §1.4).\n\n"
      "Examples:\n"
      "  burstlab conform                                   the quick suite, generated in memory, fp64 and fp32\n"
      "  burstlab conform --case cases --impl cpu,ring       the cases `burstlab gen --out cases` wrote");
  Command c;
  c.app = sub;
  c.run = [s]() -> int {
    if (s->world < 1) fail("world (", s->world, ") must be >= 1");
    apply_threads(s->run.threads);
    std::vector<Column> cols;
    std::vector<const Impl*> engines;
    for (const Impl& m : registry()) {
      if (m.op == Operator::Attention) cols.push_back(impl_column(m));
      if (m.name == "cpu" || m.name == "cuda") engines.push_back(&m);
    }
    // An engine plug-in (plugin:PATH.so) is a column only when --impl names it, with its engine
    // under every algorithm: plugin:X keeps "plugin:X" and every "<algo>/plugin:X G=...".
    const auto is_plugin = [](const std::string& one) { return one.rfind("plugin:", 0) == 0; };
    for (size_t at = 0; at < s->impl.size();) {
      const size_t comma = std::min(s->impl.find(',', at), s->impl.size());
      const std::string one = s->impl.substr(at, comma - at);
      at = comma + 1;
      if (!is_plugin(one)) continue;
      const Impl* m = find_impls(one).at(0);
      cols.push_back(impl_column(*m));
      engines.push_back(m);
    }
    for (Column& col : dist_columns(s->world, s->partition, engines)) cols.push_back(col);
    if (!s->impl.empty()) {
      std::vector<Column> keep;
      std::string names;
      for (const Column& col : cols) names += (names.empty() ? "" : ", ") + col.name;
      size_t at = 0;
      while (at <= s->impl.size()) {
        const size_t comma = std::min(s->impl.find(',', at), s->impl.size());
        const std::string one = s->impl.substr(at, comma - at);
        at = comma + 1;
        if (one.empty()) continue;
        const auto named = [&](const Column& col) {
          return col.name == one || col.name.rfind(one + "/", 0) == 0 ||
                 (is_plugin(one) && col.name.find("/" + one + " G=") != std::string::npos);
        };
        auto it = std::find_if(cols.begin(), cols.end(), named);
        if (it == cols.end()) fail("impl (", one, ") is not a column; columns: ", names);
        for (; it != cols.end(); ++it)
          if (named(*it)) keep.push_back(*it);
      }
      cols = keep;
    }
    // Rows: cases (from disk or generated).
    std::vector<std::string> dirs;
    std::vector<CaseMeta> metas;
    if (!s->suite_dir.empty()) {
      dirs = case_dirs(s->suite_dir);
      for (const std::string& d : dirs)
        metas.push_back(check::parse_case_json(check::read_file((fs::path(d) / "case.json").string()),
                                               (fs::path(d) / "case.json").string()));
    } else {
      for (Dtype t : parse_dtypes(s->dtype)) {
        const auto part = check::suite(!s->full, t);
        metas.insert(metas.end(), part.begin(), part.end());
      }
    }
    // Every case fits with the columns that run its dtype, or nothing runs (resources.hpp).
    if (const MemAvailable avail = memory_available(); avail.bytes >= 0) {
      const int threads = max_threads();
      for (size_t r = 0; r < metas.size(); ++r) {
        const CaseMeta& m = metas[r];
        const bool on_disk = !dirs.empty() && check::has_expected(dirs[r]);
        std::vector<ConformColumn> running;
        for (const Column& col : cols)
          if (std::find(col.dtypes.begin(), col.dtypes.end(), m.dtype) != col.dtypes.end())
            running.push_back({col.name, col.footprint});
        auto need_with = [&](const std::vector<ConformColumn>& cs) {
          return [&m, on_disk, cs](const CaseMeta& x, int t) {
            return conform_case_need(x.p, m.dtype, m.backward, on_disk, cs, t);
          };
        };
        require_case_fits(m, threads, avail, need_with(running), [&]() -> std::string {
          std::string fit;  // the columns that fit on their own, when not all do
          size_t n = 0;
          for (const ConformColumn& col : running)
            if (need_with({col})(m, threads).bytes <= advice_budget(avail)) {
              fit += (fit.empty() ? "" : ",") + col.name;
              ++n;
            }
          if (n == 0 || n == running.size()) return "";
          return fit.find(' ') == std::string::npos ? "--impl " + fit : "--impl '" + fit + "'";
        });
      }
    }
    struct Cell { std::string text; bool fail = false; double worst = 0; std::string note; };
    std::vector<std::vector<Cell>> cells(metas.size(), std::vector<Cell>(cols.size()));
    std::vector<std::string> notes;
    std::map<std::pair<std::string, std::string>, std::vector<std::string>> na;  // (column, reason) -> cases
    Progress progress(static_cast<int>(metas.size()));
    int failed = 0, passed = 0;
    for (size_t r = 0; r < metas.size(); ++r) {
      progress.step(metas[r].name);
      const CaseData cd = dirs.empty() ? check::make_case(metas[r]) : check::read_case(dirs[r]);
      const check::Expected e = !dirs.empty() && check::has_expected(dirs[r])
                                    ? check::read_expected(dirs[r], cd.meta)
                                    : check::compute_expected(cd);
      for (size_t k = 0; k < cols.size(); ++k) {
        Cell& cell = cells[r][k];
        const Column& col = cols[k];
        if (std::find(col.dtypes.begin(), col.dtypes.end(), cd.meta.dtype) == col.dtypes.end()) { cell.text = "-"; continue; }
        RunFn run;
        try {
          run = col.prepare(cd);
        } catch (const Error& ex) {
          cell.text = "n/a";
          cell.note = ex.what();
          na[{col.name, ex.what()}].push_back(cd.meta.name);
          continue;
        }
        try {
          const check::CheckResult res = check::check_candidate(cd, e, run(), cd.meta.dtype);
          cell.fail = !res.pass();
          cell.worst = res.worst_err_bound();
          cell.text = std::string(cell.fail ? "FAIL " : "PASS ") + fmt_ratio(cell.worst);
          if (cell.fail)
            for (const check::TensorCheck& t : res.tensors)
              if (!t.pass()) {
                cell.note = t.m.tensor + (t.missing ? " missing" : " " + (t.mismatches.empty() ? t.m.first_wrong : t.mismatches[0]));
                notes.push_back("FAIL " + col.name + " on " + cd.meta.name + ": " + cell.note);
                break;
              }
        } catch (const std::exception& ex) {
          cell.fail = true;
          cell.worst = HUGE_VAL;
          cell.text = "FAIL error";
          cell.note = ex.what();
          notes.push_back("FAIL " + col.name + " on " + cd.meta.name + ": threw: " + ex.what());
        }
        (cell.fail ? failed : passed) += 1;
      }
    }
    progress.done();
    // A matrix of '-' and 'n/a' checked nothing: it must not pass.
    std::string nothing_judged;
    if (passed + failed == 0) {
      int dashes = 0, na_cells = 0;
      for (const auto& row : cells)
        for (const Cell& cell : row) (cell.text == "-" ? dashes : na_cells) += 1;
      std::string unrun;  // the cases' dtypes that no selected column runs
      for (const CaseMeta& m : metas) {
        const std::string t = to_string(m.dtype);
        const bool runs = std::any_of(cols.begin(), cols.end(), [&](const Column& col) {
          return std::find(col.dtypes.begin(), col.dtypes.end(), m.dtype) != col.dtypes.end();
        });
        if (!runs && ("," + unrun + ",").find("," + t + ",") == std::string::npos) unrun += (unrun.empty() ? "" : ",") + t;
      }
      std::string why;
      if (dashes)
        why += std::to_string(dashes) + " '-': " +
               (unrun.empty() ? std::string("the column does not run the case's dtype") : "no column here runs " + unrun);
      if (na_cells) why += std::string(why.empty() ? "" : "; ") + std::to_string(na_cells) + " 'n/a': the reasons above";
      nothing_judged = "FAIL: nothing was judged: none of the " + std::to_string(metas.size() * cols.size()) +
                       " cells ran (" + why +
                       "). Choose columns (--impl) and cases (--case, --dtype) that run here; bf16 and fp16 cells "
                       "need a build with CUDA on a GPU machine";
    }
    if (s->json) {
      for (size_t r = 0; r < metas.size(); ++r)
        for (size_t k = 0; k < cols.size(); ++k) {
          const Cell& cell = cells[r][k];
          Json j = {{"case", metas[r].name}, {"impl", cols[k].name}, {"cell", cell.text}, {"note", cell.note}};
          if (cell.text != "-" && cell.text != "n/a") {
            j["pass"] = !cell.fail;
            j["worst_err_bound"] = std::isfinite(cell.worst) ? Json(cell.worst) : Json("inf");
          }
          std::printf("%s\n", j.dump().c_str());
        }
      if (!nothing_judged.empty()) {
        std::fflush(stdout);
        std::fprintf(stderr, "burstlab conform: %s\n", nothing_judged.c_str());
        return kExitFail;
      }
      return failed ? kExitFail : kExitPass;
    }
    size_t w0 = 4;
    for (const CaseMeta& m : metas) w0 = std::max(w0, m.name.size());
    std::printf("%-*s", static_cast<int>(w0), "case");
    std::vector<int> w(cols.size());
    for (size_t k = 0; k < cols.size(); ++k) {
      w[k] = static_cast<int>(std::max<size_t>(cols[k].name.size(), 12));
      std::printf("  %-*s", w[k], cols[k].name.c_str());
    }
    std::printf("\n");
    for (size_t r = 0; r < metas.size(); ++r) {
      std::printf("%-*s", static_cast<int>(w0), metas[r].name.c_str());
      for (size_t k = 0; k < cols.size(); ++k) std::printf("  %-*s", w[k], cells[r][k].text.c_str());
      std::printf("\n");
    }
    for (const auto& [key, cases] : na)
      std::printf("n/a %s on %zu case%s (%s%s): %s\n", key.first.c_str(), cases.size(), cases.size() == 1 ? "" : "s",
                  cases[0].c_str(), cases.size() > 1 ? ", ..." : "", key.second.c_str());
    for (const std::string& n : notes) std::printf("%s\n", n.c_str());
    std::printf("%d passed, %d failed (cells: PASS/FAIL worst err/bound, spec §9)\n", passed, failed);
    if (!nothing_judged.empty()) {
      std::printf("%s\n", nothing_judged.c_str());
      return kExitFail;
    }
    return failed ? kExitFail : kExitPass;
  };
  return c;
}

}  // namespace

Command add_conform_command(CLI::App& app) { return add_conform(app); }

}  // namespace burstlab::tools
