// tools/main.cpp — the `burstlab` command line: subcommands run, suite, bench, schedule, simulate
// (one file each), gen, oracle, check, conform (cmd_case.cpp), checkpoint (cmd_checkpoint.cpp),
// env (cmd_env.cpp).
// Every subcommand is a Command (common.hpp): parsing only fills its flags; main runs the parsed
// one and turns what it returns or throws into the exit code.
// Exit codes: 0 every check passed; 1 a check failed; 2 bad input (one line on stderr naming
// the field and value, plus where to read more), including a problem that does not fit in
// memory: refused before allocating (resources.hpp), or an allocation that failed anyway
// (std::bad_alloc, std::length_error). Any other exception: 1, with its message. Nothing aborts.
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "burstlab/env.hpp"
#include "burstlab/error.hpp"
#include "cmd_case.hpp"  // gen, oracle, check, conform
#include "cmd_simulate.hpp"
#include "common.hpp"    // the other subcommands
#include "resources.hpp"
#ifdef BURSTLAB_HAVE_NCCL
#include "thread_world.hpp"  // nccl::launch, nccl::shutdown: under mpirun, tables from rank 0 only
#endif

using namespace burstlab::tools;

namespace {
int bad_input(const std::string& where, const std::string& message) {
  std::fprintf(stderr, "burstlab%s: error: %s\n  see `burstlab%s --help`\n", where.c_str(), message.c_str(),
               where.c_str());
  return kExitBadInput;
}

// An allocation failed although the estimate let the problem through (or the subcommand has
// none): exit 2, naming the step and its estimated bytes, and the size flags `app` has.
int out_of_memory(const std::string& where, const CLI::App* app, const std::exception& e) {
  std::string flags;
  for (const char* f : {"--nq", "--nk", "--threads"})
    if (app && app->get_option_no_throw(f)) flags += std::string(flags.empty() ? "" : ", ") + f;
  return bad_input(where, out_of_memory_message(e, flags.empty() ? "use a smaller problem"
                                                                 : "use a smaller problem (" + flags + ")"));
}
int other_error(const std::string& where, const std::exception& e) {
  std::fprintf(stderr, "burstlab%s: error: %s\n", where.c_str(), e.what());
  return kExitFail;
}
}  // namespace

int main(int argc, char** argv) {
#ifdef BURSTLAB_HAVE_NCCL
  // Under mpirun every process runs the same command; rank 0 alone prints (errors go to stderr
  // from every rank, each naming its rank).
  const burstlab::nccl::Launch launch = burstlab::nccl::launch();
  if (launch.by_mpi && launch.rank != 0 && !std::freopen("/dev/null", "w", stdout))
    std::fprintf(stderr, "burstlab: rank %d could not silence its stdout\n", launch.rank);
  struct Shutdown {  // MPI_Finalize (or MPI_Abort after a failure) last
    ~Shutdown() { burstlab::nccl::shutdown(); }
  } shutdown;
#endif
  // A malformed BURSTLAB_* value is bad input before anything runs (burstlab/env.hpp).
  try {
    burstlab::env::validate();
  } catch (const burstlab::Error& e) {
    return bad_input("", e.what());
  }
  CLI::App app(
      "burstlab: exact attention, one math spec (docs/spec.md), one fp64 oracle.\n"
      "Every implementation (reference, cpu, ...) is checked element by element against the fp64\n"
      "oracle with a per-element bound derived from unit roundoff (spec §9), before it is timed.",
      "burstlab");
  app.require_subcommand(1);
  app.set_version_flag("--version", "burstlab " BURSTLAB_VERSION);
  std::vector<Command> commands = {add_run_command(app), add_suite_command(app), add_bench_command(app),
                                   add_schedule_command(app), add_simulate_command(app)};
  for (const Command& c : add_case_commands(app)) commands.push_back(c);
  commands.insert(commands.end(), {add_checkpoint_command(app), add_env_command(app)});
  app.footer(
      "Examples:\n"
      "  burstlab suite                                 the conformance set (bash scripts/main)\n"
      "  burstlab run --impl cpu --mask causal --nq 1023 --nk 1023 -d 128 --dtype fp64\n"
      "  burstlab bench -d 64                           GFLOP/s vs reference and Eigen SGEMM\n"
      "  burstlab <command> --help                      the flags of one command\n"
      "Implementations built here: " + registry_names() + ". Exit: 0 pass, 1 a check failed, 2 bad input.");

  const std::vector<CLI::App*> subs = app.get_subcommands([](CLI::App*) { return true; });
  // An unknown command word: CLI11 would only say "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : subs) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known = known || sub->get_name() == argv[1];
    }
    if (!known) return bad_input("", "unknown command '" + std::string(argv[1]) + "'; commands: " + names);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Name the subcommand whose help applies (the parse may have stopped inside it).
    std::string where;
    for (const CLI::App* sub : subs)
      if (sub->parsed() || (argc > 1 && sub->get_name() == argv[1])) where = " " + sub->get_name();
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      // CLI11 2.1 joins the extras in reverse on some paths ("bf16 --dtype"): list them as typed.
      const std::vector<std::string> extras = app.remaining(true);
      if (!extras.empty()) {
        std::string list;
        for (const std::string& x : extras) list += (list.empty() ? "" : " ") + x;
        return bad_input(where, std::string(extras.size() > 1 ? "the following arguments were not expected: "
                                                              : "the following argument was not expected: ") +
                                    list);
      }
    }
    return bad_input(where, e.what());
  } catch (const std::exception& e) {  // thrown while parsing by something other than CLI11 itself
    const CLI::App* sub = nullptr;
    for (const CLI::App* a : subs)
      if (a->parsed()) sub = a;
    const std::string where = sub ? " " + sub->get_name() : "";
    if (dynamic_cast<const burstlab::Error*>(&e)) return bad_input(where, e.what());
    if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const std::length_error*>(&e))
      return out_of_memory(where, sub, e);
    return other_error(where, e);
  }
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    const std::string where = " " + c.app->get_name();
    try {
      return c.run();
    } catch (const burstlab::Error& e) {
      return bad_input(where, e.what());
    } catch (const std::exception& e) {  // std::length_error: a vector longer than max_size(), also too big
      if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const std::length_error*>(&e))
        return out_of_memory(where, c.app, e);
      return other_error(where, e);
    }
  }
  return kExitPass;  // require_subcommand(1): not reached
}
