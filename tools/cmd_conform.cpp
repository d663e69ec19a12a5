// tools/cmd_conform.cpp — `burstlab conform`: every built-in implementation (and every algorithm of
// the table on each engine) over the case suite, one PASS/FAIL matrix (docs/conformance.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "burstlab/error.hpp"
#include "case.hpp"
#include "cmd_case.hpp"
#include "conform_columns.hpp"
#include "common.hpp"
#include "dist_flags.hpp"  // --transport, parsed as `run` parses it
#include "lmhead_case.hpp"
#include "npy.hpp"
#include "resources.hpp"
#ifdef BURSTLAB_HAVE_NCCL
#include "thread_world.hpp"  // nccl::nccl_world, launch, device_count
#endif

namespace burstlab::tools {
namespace {

namespace fs = std::filesystem;
using check::CaseData;
using check::CaseMeta;

}  // namespace

Command add_conform_command(CLI::App& app) {
  struct S {
    std::string suite_dir, dtype = "fp64,fp32", impl, partition = "contiguous";
    bool full = false, json = false;
    RunFlags run;  // --threads
    std::shared_ptr<Net> net = std::make_shared<Net>();  // --world, --transport, --gpus-per-node, ...
    std::vector<const CLI::Option*> nccl_only;  // refused with --transport sim
  };
  auto s = std::make_shared<S>();
  DistFlags& f = s->net->f;
  f.world = 2;
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
  DistFlags* fp = &f;
  int_flag(sub, "--world", f.world,
           "ranks G of the distributed columns (sim: threads of this process; nccl: one per GPU, at most the GPUs "
           "this process sees; under mpirun: mpirun's -np, the default there)",
           "world", 1, kMaxWorld)
      ->each([fp](const std::string&) { fp->world_given = true; });
  sub->add_option("--partition", s->partition,
                  "contiguous | zigzag | striped: partition of the distributed columns (attention2d, attention2d-o: always striped)")
      ->capture_default_str();
  int_flag(sub, "--gpus-per-node", f.gpus_per_node,
           "GPUs per node K (0 = one node): double-ring's K (must divide --world), the link class of each transfer; "
           "nccl: which ranks share a node (0: from the host names)",
           "gpus-per-node", 0, kMaxWorld, ">= 0 (0 = one node)");
  sub->add_option("--transport", f.transport_flag,
                  "where the distributed columns' ranks talk. sim: SimComm, ranks as threads of this process, every "
                  "engine (cpu, cuda); nccl: NcclComm, one rank per GPU, the columns of the engines in device memory "
                  "only (cuda, a device plug-in), as threads of this process or one process per GPU under mpirun -np "
                  "G (as `run --transport nccl`)")
      ->capture_default_str();
  s->nccl_only.push_back(real_range(
      sub->add_option("--timeout", f.timeout,
                      "nccl: seconds one transfer or collective may take before the watchdog aborts the "
                      "communicator and every rank exits with an error naming the rank, operation, phase and step")
          ->capture_default_str(),
      "timeout", 0, 86400, true));
  s->nccl_only.push_back(sub->add_option(
      "--inject-failure", f.inject,
      "nccl: RANK:STEP[:bwd][:hang] makes that rank fail when it enters step STEP of the forward (:bwd: of the "
      "backward) of the first cell; :hang makes it stop communicating instead; tests the failure paths (as "
      "threads, the next cell runs on a new world without it)"));
  sub->add_flag("--json", s->json, "one JSON object per cell instead of the matrix");
  add_threads_flag(sub, s->run);
  sub->footer(
      "Cells: PASS/FAIL and the worst err/bound over O, LSE, dQ, dK, dV (spec §9); '-' = the column does\n"
      "not run that dtype; 'n/a' = it cannot run that problem (reason listed below the matrix).\n"
      "Exit: 0 every cell passed, 1 a cell failed or no cell was judged (every cell '-' or 'n/a'), 2 bad\n"
      "input: among it a case that would not fit in memory with the columns that run it (the message\n"
      "names what fits), inputs that are not finite or whose logits overflow fp64 (spec §1.4).\n"
      "--json: one object per cell {case, impl, cell, note, transport, pass, worst_err_bound}; transport is\n"
      "sim or nccl for a distributed column, none for one device.\n\n"
      "--transport nccl judges every schedule through the real transport: the columns are the algorithms on\n"
      "the engines in device memory (cuda), every cell's session runs on one NCCL world made before the\n"
      "first case, and the other columns are left out. Without mpirun the ranks are threads of this process, one\n"
      "per GPU (--world at most the GPUs it sees). Under mpirun -np G every process runs the same cases and\n"
      "columns in the same order and gathers every rank's outputs; each cell's refusals (n/a) are agreed\n"
      "between the processes, rank 0 alone prints, and every process exits with the same status. A throw\n"
      "inside the world (a rank's failure, --timeout) fails that cell and aborts the communicators: as\n"
      "threads the next cell runs on a new world; under mpirun the NCCL cells after it are FAIL 'not run'\n"
      "and every process ends with a non-zero exit.\n\n"
      "Examples:\n"
      "  burstlab conform                                   the quick suite, generated in memory, fp64 and fp32\n"
      "  burstlab conform --case cases --impl cpu,ring       the cases `burstlab gen --out cases` wrote\n"
      "  burstlab conform --transport nccl --world 2 --dtype bf16             every algorithm on 2 GPUs, threads\n"
      "  mpirun -np 2 burstlab conform --transport nccl --dtype bf16,fp16     one process per GPU\n"
      "  mpirun -np 2 burstlab conform --transport nccl --case cases --impl ring,burst --partition zigzag");
  return {sub, [s]() -> int {
    const std::shared_ptr<Net> net = s->net;
    DistFlags& f = net->f;
    f.transport = parse_transport(f.transport_flag);  // nccl: refused here in a build without NCCL
    const bool nccl = f.transport == Transport::Nccl;
    if (!nccl) {
      int n = 0;
      const std::string extra = given_options(s->nccl_only, &n);
      if (n > 0)
        fail(extra, n == 1 ? " is a --transport nccl option" : " are --transport nccl options", " (the transport is ",
             f.transport_flag, ")");
    }
    f.world = world_of(f);  // under mpirun with nccl: the processes it started, unless --world says
    bool by_mpi = false;
    int mpi_rank = 0;
#ifdef BURSTLAB_HAVE_NCCL
    const nccl::Launch launch = nccl::launch();
    by_mpi = launch.by_mpi;
    mpi_rank = launch.rank;
    if (nccl && by_mpi && f.world != launch.size)
      fail("world (", f.world, ") must equal the number of processes mpirun started (", launch.size,
           "): leave --world out under mpirun, or run mpirun -np ", f.world);
    if (nccl && !f.inject.empty()) {
      const nccl::Injection in = nccl::parse_injection(f.inject);
      if (in.rank >= f.world) fail("inject-failure (", f.inject, ") names rank ", in.rank, " of a world of ", f.world);
    }
#endif
    apply_threads(s->run.threads);
    std::vector<MatrixColumn> cols;
    std::vector<const Impl*> engines;
    for (const Impl& m : registry()) {
      if (m.op == Operator::Attention && !nccl) cols.push_back(impl_column(m));
      if (m.name == "cpu" || m.name == "cuda") engines.push_back(&m);
    }
    // An engine plug-in (plugin:PATH.so) is a column only when --impl names it, with its engine
    // under every algorithm: plugin:X keeps "plugin:X" and every "<algo>/plugin:X G=...".
    const auto is_plugin = [](const std::string& one) { return one.rfind("plugin:", 0) == 0; };
    std::string host_plugins;  // --transport nccl: the plug-ins named whose memory is the host's
    for (const std::string& one : split_commas(s->impl)) {
      if (!is_plugin(one)) continue;
      const Impl* m = find_impls(one).at(0);
      if (!nccl) cols.push_back(impl_column(*m));
      else if (!m->engines.copy) host_plugins += (host_plugins.empty() ? "" : ", ") + one;
      engines.push_back(m);
    }
    for (MatrixColumn& col : dist_columns(s->partition, engines, net)) cols.push_back(col);
    if (nccl && !host_plugins.empty())
      fail("impl (", host_plugins, ") keeps its buffers in host memory: --transport nccl moves device memory "
           "only (an engine in device memory, e.g. cuda, or --transport sim)");
    if (nccl && cols.empty())
      fail("transport (nccl) needs an engine in device memory (cuda): this binary has none; use --transport sim");
    if (!s->impl.empty()) {
      std::vector<MatrixColumn> keep;
      std::string names;
      for (const MatrixColumn& col : cols) names += (names.empty() ? "" : ", ") + col.name;
      for (const std::string& one : split_commas(s->impl)) {
        const auto named = [&](const MatrixColumn& col) {
          return col.name == one || col.name.rfind(one + "/", 0) == 0 ||
                 (is_plugin(one) && col.name.find("/" + one + " G=") != std::string::npos);
        };
        auto it = std::find_if(cols.begin(), cols.end(), named);
        if (it == cols.end()) {
          if (nccl)
            fail("impl (", one, ") is not a column of --transport nccl, whose columns are the algorithms on the "
                 "engines in device memory: ", names);
          fail("impl (", one, ") is not a column; columns: ", names);
        }
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
        for (const MatrixColumn& col : cols)
          if (col.runs(m.dtype)) running.push_back({col.name, col.footprint});
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
    // The NCCL world, last before running: every flag and case above was valid in every process.
    std::string transport_line;  // the matrix's first line under NCCL
    if (nccl) {
#ifdef BURSTLAB_HAVE_NCCL
      if (const int n = nccl::device_count(); !by_mpi && n < f.world) {
        const auto gpus = [](int k) { return std::to_string(k) + (k == 1 ? " GPU" : " GPUs"); };
        fail("transport (nccl) with world (", f.world, ") needs ", gpus(f.world),
             " in this process (one rank per GPU); it sees ", n, ": ",
             n > 0 ? "use --world " + std::to_string(n) + ", or " : std::string("run it "),
             "on a machine with ", gpus(f.world), ", as threads or one process per GPU (mpirun -np ", f.world,
             " burstlab conform --transport nccl ...)");
      }
      net->world = nccl::nccl_world(f.world, f.gpus_per_node, f.timeout, f.inject);
      transport_line = "transport: NCCL (" + net->world->describe() + "), G=" + std::to_string(f.world);
#endif
    }
    struct Cell {
      std::string text;
      bool fail = false;
      double worst = 0;
      std::string note;
      void failed(const std::string& shown, const std::string& why) {
        text = shown, fail = true, worst = HUGE_VAL, note = why;
      }
    };
    std::vector<std::vector<Cell>> cells(metas.size(), std::vector<Cell>(cols.size()));
    std::vector<std::string> notes;
    std::map<std::pair<std::string, std::string>, std::vector<std::string>> na;  // (column, reason) -> cases
    // Under mpirun the processes run the same rows; rank 0 alone reports progress (as it prints).
    const bool quiet = by_mpi && mpi_rank != 0;
    Progress progress(static_cast<int>(metas.size()));
    int failed = 0, passed = 0, not_run = 0;
    std::string dead_at;  // "<column> on <case>": the NCCL cell whose throw ended the world
    try {
      for (size_t r = 0; r < metas.size(); ++r) {
        if (!quiet) progress.step(metas[r].name);
        const auto runs = [&](const MatrixColumn& col) { return col.runs(metas[r].dtype); };
        // After the world died its columns run nothing: neither the case nor its oracle is needed.
        const bool any = std::any_of(cols.begin(), cols.end(),
                                     [&](const MatrixColumn& col) { return runs(col) && !(col.on_nccl() && !net->dead.empty()); });
        std::unique_ptr<CaseData> cdp;
        std::unique_ptr<check::Expected> ep;
        if (any) {
          cdp = std::make_unique<CaseData>(dirs.empty() ? check::make_case(metas[r]) : check::read_case(dirs[r]));
          ep = std::make_unique<check::Expected>(!dirs.empty() && check::has_expected(dirs[r])
                                                     ? check::read_expected(dirs[r], cdp->meta)
                                                     : check::compute_expected(*cdp));
        }
        for (size_t k = 0; k < cols.size(); ++k) {
          Cell& cell = cells[r][k];
          const MatrixColumn& col = cols[k];
          if (!runs(col)) { cell.text = "-"; continue; }
          if (col.on_nccl() && !net->dead.empty()) {
            cell.failed("FAIL not run", "not run: the NCCL transport failed earlier (" + dead_at + ")");
            ++not_run;
            ++failed;
            continue;
          }
          const CaseData& cd = *cdp;
          RunFn run;
          std::string refusal;
          try {
            run = col.prepare(cd);
          } catch (const Error& ex) {
            refusal = ex.what();
          }
          const auto threw = [&](const std::exception& ex) {
            cell.failed("FAIL error", ex.what());
            notes.push_back("FAIL " + col.name + " on " + cd.meta.name + ": threw: " + ex.what());
          };
          // A throw inside the NCCL world: that cell fails and its communicators are aborted. As
          // threads of this process the next cell gets a new world (without the injection, which
          // fired); under mpirun the other processes are told (their next wait ends) and this one
          // ends non-zero at exit, so no further cell runs on it.
          const auto world_failed = [&](const std::exception& ex) {
            threw(ex);
            ++failed;
            net->world->failed(ex.what());
            dead_at = col.name + " on " + cd.meta.name;
#ifdef BURSTLAB_HAVE_NCCL
            if (!by_mpi) {
              try {
                net->world.reset();  // aborted communicators are freed, not finalized
                net->world = nccl::nccl_world(f.world, f.gpus_per_node, f.timeout, "");
                notes.push_back("the NCCL world was made anew after " + dead_at);
                return;
              } catch (const std::exception& again) {
                net->dead = std::string("a new world after ") + ex.what() + " failed too: " + again.what();
                return;
              }
            }
#endif
            net->dead = ex.what();
          };
          if (col.on_nccl()) {
            try {
              refusal = agreed_refusal(*net->world, refusal, "the refusals of " + col.name + " on " + cd.meta.name);
            } catch (const std::exception& ex) {
              world_failed(ex);
              continue;
            }
          }
          if (!refusal.empty()) {
            cell.text = "n/a";
            cell.note = refusal;
            na[{col.name, refusal}].push_back(cd.meta.name);
            continue;
          }
          check::Candidate got;
          try {
            got = run();
          } catch (const std::exception& ex) {
            if (col.on_nccl()) {
              world_failed(ex);
            } else {
              threw(ex);
              ++failed;
            }
            continue;
          }
          try {
            const check::CheckResult res = check::check_candidate(cd, *ep, got, cd.meta.dtype);
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
            threw(ex);
          }
          (cell.fail ? failed : passed) += 1;
        }
      }
    } catch (const std::exception& e) {
      // A throw outside a cell (reading a case, its oracle, an allocation) in one process: the
      // others are told (their next collective ends) instead of waiting for it.
      if (net->world && net->dead.empty()) net->world->failed(e.what());
      throw;
    }
    if (!quiet) progress.done();
    if (not_run > 0)
      notes.push_back("FAIL: the NCCL transport failed at " + dead_at + "; the " + std::to_string(not_run) +
                      " NCCL cell" + (not_run == 1 ? "" : "s") + " after it were not run");
    // Every process judged the same gathered outputs against the same oracle: the matrices agree,
    // and so do the exit statuses. Checked, since a process that judged otherwise would exit
    // otherwise.
    if (net->world && net->dead.empty() && by_mpi) {
      std::string digest = std::to_string(passed) + " passed, " + std::to_string(failed) + " failed";
      for (const auto& row : cells)
        for (const Cell& cell : row) digest += "|" + cell.text;
      try {
        const std::vector<std::vector<char>> all =
            net->world->allgather([&](int) { return std::vector<char>(digest.begin(), digest.end()); }, "the matrices");
        for (size_t r = 0; r < all.size(); ++r) {
          const std::string theirs(all[r].begin(), all[r].end());
          if (theirs == digest) continue;
          notes.push_back("FAIL: rank " + std::to_string(r) + " judged the matrix otherwise (" +
                          theirs.substr(0, theirs.find('|')) + ")");
          ++failed;
        }
      } catch (const std::exception& ex) {
        net->world->failed(ex.what());
        notes.push_back(std::string("FAIL: the matrices of the processes could not be compared: ") + ex.what());
        ++failed;
      }
    }
    // A matrix of '-' and 'n/a' checked nothing: it must not pass.
    std::string nothing_judged;
    if (passed + failed == 0) {
      int dashes = 0, na_cells = 0;
      for (const auto& row : cells)
        for (const Cell& cell : row) (cell.text == "-" ? dashes : na_cells) += 1;
      std::string unrun;  // the cases' dtypes that no selected column runs
      for (const CaseMeta& m : metas) {
        const std::string t = to_string(m.dtype);
        const bool runs = std::any_of(cols.begin(), cols.end(), [&](const MatrixColumn& c) { return c.runs(m.dtype); });
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
          Json j = {{"case", metas[r].name}, {"impl", cols[k].name}, {"cell", cell.text}, {"note", cell.note},
                    {"transport", cols[k].transport}};
          if (cell.text != "-" && cell.text != "n/a") {
            j["pass"] = !cell.fail;
            j["worst_err_bound"] = std::isfinite(cell.worst) ? Json(cell.worst) : Json("inf");
          }
          std::printf("%s\n", j.dump().c_str());
        }
      std::fflush(stdout);
      if (!nothing_judged.empty()) std::fprintf(stderr, "burstlab conform: %s\n", nothing_judged.c_str());
      return failed || !nothing_judged.empty() ? kExitFail : kExitPass;
    }
    if (!transport_line.empty()) std::printf("%s\n", transport_line.c_str());
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
    if (!nothing_judged.empty()) std::printf("%s\n", nothing_judged.c_str());
    return failed || !nothing_judged.empty() ? kExitFail : kExitPass;
  }};
}

}  // namespace burstlab::tools
