// tools/main.cpp — the `burstlab` command line: subcommands run, suite, bench (one file each),
// schedule and simulate (distributed.cpp, cmd_simulate.cpp), gen, oracle, check, conform (cmd_case.cpp).
// Exit codes: 0 every check passed; 1 a check failed; 2 bad input (one line on stderr naming
// the field and value, plus where to read more).
#include <cstdio>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "cmd_case.hpp"     // gen, oracle, check, conform
#include "common.hpp"
#include "distributed.hpp"  // run --algo ..., schedule, simulate

using namespace burstlab::tools;

namespace {
int bad_input(const std::string& where, const std::string& message) {
  std::fprintf(stderr, "burstlab%s: error: %s\n  see `burstlab%s --help`\n", where.c_str(), message.c_str(),
               where.c_str());
  return kExitBadInput;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "burstlab: exact attention, one math spec (docs/spec.md), one fp64 oracle.\n"
      "Every implementation (reference, cpu, ...) is checked element by element against the fp64\n"
      "oracle with a per-element bound derived from unit roundoff (spec §9), before it is timed.",
      "burstlab");
  app.require_subcommand(1);
  app.set_version_flag("--version", "burstlab " BURSTLAB_VERSION);
  RunHooks hooks;
  std::vector<Command> commands = {add_run_command(app, hooks), add_suite_command(app), add_bench_command(app)};
  add_distributed_cli(app, *commands[0].app, hooks);
  for (const Command& c : add_case_commands(app)) commands.push_back(c);
  app.footer(
      "Examples:\n"
      "  burstlab suite                                 the conformance set (bash scripts/main)\n"
      "  burstlab run --impl cpu --mask causal --nq 1023 --nk 1023 -d 128 --dtype fp64\n"
      "  burstlab bench -d 64                           GFLOP/s vs reference and Eigen SGEMM\n"
      "  burstlab <command> --help                      the flags of one command\n"
      "Implementations built here: " + registry_names() + ". Exit: 0 pass, 1 a check failed, 2 bad input.");

  // An unknown command word: CLI11 would only say "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known = known || sub->get_name() == argv[1];
    }
    if (!known) return bad_input("", "unknown command '" + std::string(argv[1]) + "'; commands: " + names);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // a callback's failed check (schedule, simulate): exit 1
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // Name the subcommand whose help applies (the parse may have stopped inside it).
    std::string where;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      if (sub->parsed() || (argc > 1 && sub->get_name() == argv[1])) where = " " + sub->get_name();
    return bad_input(where, e.what());
  }
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    try {
      return c.run();
    } catch (const burstlab::Error& e) {
      return bad_input(" " + c.app->get_name(), e.what());
    }
  }
  // schedule and simulate (distributed.cpp) ran from their callbacks during parse(); a failed check
  // there threw CLI::RuntimeError, and bad input CLI::ValidationError (exit 2 above).
  return kExitPass;
}
