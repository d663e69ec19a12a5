// tools/common.hpp — what the subcommands share: the flag vocabulary (docs/design.md §8),
// building a validated Problem from it, checking implementations against the
// oracle (verify before you time), result tables, and progress lines.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "harness.hpp"
#include "impls.hpp"
#include "table.hpp"

namespace burstlab::tools {

// Exit codes of every subcommand.
constexpr int kExitPass = 0;      // every check passed
constexpr int kExitFail = 1;      // a check failed (or an implementation threw while running)
constexpr int kExitBadInput = 2;  // bad flags or a problem no implementation may run

// The shared flags. Defaults are set by the subcommand before add_*_flags().
struct ShapeFlags {
  int64_t B = 1, H_q = 4, H_kv = 2, N_q = 113, N_k = 203;
  std::vector<int64_t> d = {64};
  std::string mask = "none";
  double scale = 0;
  CLI::Option* scale_opt = nullptr;  // set when --scale was declared
  uint64_t seed = 1;
};
struct RunFlags {
  std::string dtype = "fp32";
  std::string layout = "BHSD";
  std::string values = "normal";
  std::string impl = "reference,cpu";
  std::string pass = "both";
  int64_t Br = 0, Bc = 0;
  int threads = 0;  // 0 = OpenMP's default
  int64_t check_rows = 0;  // > 0: the row-sampled oracle (spec §9.11) instead of the full one
  bool json = false;
  bool verbose = false;
};

// Numeric flags are checked on the text as typed, before CLI11 converts it: CLI11 2.1 reads
// 99999999999999999999 as INT64_MAX, -1 into an unsigned field as 2^64 - 1, 010 as octal and 0x10
// as hex. A refused value is "<field> (<text>) must be ..." on stderr, exit 2 (main.cpp).
// int_range: a decimal integer in [lo, hi]; at_least replaces ">= lo" in the message (e.g.
// ">= 1, or 0 for the implementation's default"), at_most is appended after "<= hi".
CLI::Option* int_range(CLI::Option* o, const std::string& field, int64_t lo, uint64_t hi,
                       const std::string& at_least = "", const std::string& at_most = "");
// real_range: a finite number in [lo, hi] (lo_open: > lo).
CLI::Option* real_range(CLI::Option* o, const std::string& field, double lo, double hi, bool lo_open = false);
// Bounds shared by several subcommands. A tensor extent never exceeds validate()'s 2^48 elements.
// Each OpenMP thread and each simulated rank is an operating-system thread: `run --impl cpu
// --threads 100000` overflowed a stack in the OpenMP runtime (exit 139) while 1024 ran; a SimComm
// run of 256 ranks (N = 256) took 37 s and 1 GB on 2 cores, one of 1024 ranks ran past 300 s and 6 GB.
constexpr int64_t kMaxExtent = int64_t(1) << 48;
constexpr int kMaxThreads = 1024;
constexpr int kMaxWorld = 256;
constexpr int64_t kMaxRepeat = 1000000;  // --repeat, --reps
// Lower bounds that validate() checks (naming the field the same way): only a value beyond
// int64 is refused here.
constexpr int64_t kNoLowerBound = std::numeric_limits<int64_t>::min();
// An integer flag with its default shown: add_option, capture_default_str, int_range.
template <class T>
CLI::Option* int_flag(CLI::App* app, const std::string& names, T& v, const std::string& help, const std::string& field,
                      int64_t lo, uint64_t hi, const std::string& at_least = "") {
  return int_range(app->add_option(names, v, help)->capture_default_str(), field, lo, hi, at_least);
}
// A tensor extent (B, H_q, N_q, d, ...): >= 1 is validate()'s to refuse, <= 2^48 this flag's.
template <class T>
CLI::Option* extent_flag(CLI::App* app, const std::string& names, T& v, const std::string& help,
                         const std::string& field) {
  return int_flag(app, names, v, help, field, kNoLowerBound, kMaxExtent, ">= 1");
}

// -B --hq --hkv --nq --nk -d --mask --scale --seed. multi_d: -d takes a list.
void add_shape_flags(CLI::App* app, ShapeFlags& f, bool multi_d);
void add_dtype_flag(CLI::App* app, RunFlags& f);
void add_layout_flag(CLI::App* app, RunFlags& f);
void add_values_flag(CLI::App* app, RunFlags& f);
void add_impl_flag(CLI::App* app, RunFlags& f);
void add_pass_flag(CLI::App* app, RunFlags& f);
void add_tile_flags(CLI::App* app, RunFlags& f);
void add_threads_flag(CLI::App* app, RunFlags& f);
void add_json_flag(CLI::App* app, RunFlags& f);

// Validated problem (throws Error): shape first, then the mask generated from `mask_spec`
// (make_mask, deterministic in seed), then validate() of the whole.
Problem make_problem(int64_t B, int64_t H_q, int64_t H_kv, int64_t N_q, int64_t N_k, int64_t d,
                     const std::string& mask_spec, uint64_t seed, const double* scale);
// The passes to check: attention's fwd and bwd; the LM head's fwd, bwd and fused (one call).
struct Passes {
  bool fwd = true, bwd = true, fused = false;
  bool backward() const { return bwd || fused; }
};
// attention: fwd | bwd | both; lmhead-ce: fwd | bwd | fused | both (all three).
Passes parse_pass(const std::string& s, Operator op = Operator::Attention);
void apply_threads(int threads);          // --threads (0 = leave the default); OpenMP (Eigen follows it)
int max_threads();

// One checked problem: seeded inputs in `dtype`, the oracle, then each implementation
// (prepare -> forward -> fetch -> compare; backward likewise).
struct Case {
  Operator op = Operator::Attention;
  Problem p;           // attention
  LmHeadProblem lm;    // lmhead-ce
  double ignored = 0;  // lmhead-ce: fraction of rows labelled ignore_index (seeded)
  std::string mask_spec;
  Layout layout = Layout::BHSD;
  Dtype dtype = Dtype::F32;
  Values values = Values::Normal;
  uint64_t seed = 1;
  Passes pass;
  ImplOptions opt;
  // 0: the full fp64 oracle. K > 0: the row-sampled one (reference/rows.hpp, spec §9.11), K rows
  // and K columns seeded from `seed`; no N_q x N_k buffer, so huge N can be checked.
  int64_t check_rows = 0;
};
// The shape of the case's problem (shape_string of p or lm).
std::string case_shape(const Case& c);
// One row: one implementation x one pass.
struct Result {
  std::string impl;
  Dtype dtype = Dtype::F32;
  std::string shape, mask, values, layout;
  std::string pass;   // "fwd" | "bwd" | "fused"
  double ms = 0;      // best of `repeat` runs
  double flops = 0;   // forward_flops / backward_flops (spec §8)
  Metrics all;        // worst over the pass's tensors
  std::vector<Metrics> tensors;  // O, LSE | dQ, dK, dV; the LM head: L, LSE | dH, dW | all four
  std::string error;  // set when the implementation threw while running
  bool pass_ok() const { return error.empty() && all.pass(); }
};
// Runs every impl (already checked with check_impl) on the case. Oracle once per case.
// repeat >= 1: best of `repeat` timed runs; the checked outputs are those of these runs
// (poisoned once before the first, so an element no run writes stays NaN and fails). A pass
// that throws is an ERROR row, and the impl's later passes "not run" (run_case.cpp).
std::vector<Result> run_case(const Case& c, const std::vector<const Impl*>& impls, int repeat);
double best_of(const std::function<double()>& run, int repeat);  // the least of `repeat` calls' ms

// The result table, one row per Result (verbose: then one row per tensor too), and its JSON.
// rate_unit: "GFLOP/s" or "TFLOP/s" (pick_rate_unit chooses from the fastest row).
std::string pick_rate_unit(const std::vector<Result>& rs);
Table result_table(const std::vector<Result>& rs, bool verbose, bool numbered);
Json result_json(const Result& r);
// "FAIL cpu fp32 bwd dK: (b=0, ...)" lines for failing rows; empty when all pass.
std::vector<std::string> failure_notes(const std::vector<Result>& rs);

// Progress on stderr: one carriage-return line on a terminal, plain lines otherwise.
struct Progress {
  explicit Progress(int total);
  void step(const std::string& what);
  void done();
  int total, k = 0;
  bool tty;
};

}  // namespace burstlab::tools

namespace burstlab::tools {
// Prints the results (table + failure notes + "N passed, M failed", or JSON with `header`
// merged in) on stdout and returns kExitPass or kExitFail.
int report(const std::vector<Result>& rs, const RunFlags& f, bool numbered, Json header);

// `bench`'s rule, verify before timing: runs each case once (a "verify <shape>" step each) into
// `checked`; true when every row passed; else prints the rows (the table, or JSON with `header`
// and verified: false) and that no speed is reported.
bool verified(const std::vector<Case>& cases, const std::vector<const Impl*>& impls, const RunFlags& f, Json header,
              Progress& progress, std::vector<Result>& checked);

// A subcommand: its CLI11 app and what to do once parsing succeeded. run() returns the exit
// code; it throws burstlab::Error on bad input, before printing anything.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
// The subcommands' makers, one file each (main.cpp registers them; cmd_case.hpp has the case-file
// ones, cmd_simulate.hpp `simulate`).
Command add_run_command(CLI::App& app);         // cmd_run.cpp
Command add_suite_command(CLI::App& app);       // cmd_suite.cpp
Command add_bench_command(CLI::App& app);       // cmd_bench.cpp
Command add_schedule_command(CLI::App& app);    // cmd_schedule.cpp (spec §7)
Command add_checkpoint_command(CLI::App& app);  // cmd_checkpoint.cpp (spec §11)
Command add_env_command(CLI::App& app);         // cmd_env.cpp: the environment variables (burstlab/env.hpp)
}  // namespace burstlab::tools
