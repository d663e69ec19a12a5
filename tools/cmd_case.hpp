// tools/cmd_case.hpp — `burstlab gen`, `oracle`, `check` (cmd_case.cpp) and `conform`
// (cmd_conform.cpp) over case directories (docs/conformance.md), and what they share.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "case.hpp"  // check::CaseMeta
#include "common.hpp"
#include "resources.hpp"

namespace burstlab::tools {
std::vector<Command> add_case_commands(CLI::App& app);
Command add_conform_command(CLI::App& app);

// "fp64,fp32" -> dtypes; throws Error naming "dtype" when it names none.
std::vector<Dtype> parse_dtypes(const std::string& list);
// A directory is one case (case.json) or a suite (subdirectories with case.json, sorted).
std::vector<std::string> case_dirs(const std::string& dir);
// Refuses (exit 2) before any case is read beyond its case.json when one would not fit in memory
// (resources.hpp): the case, its step, what is available, and what fits instead (`other`: a
// further way). LM head cases are not estimated here.
using CaseNeed = std::function<MemNeed(const check::CaseMeta& m, int threads)>;
void require_case_fits(const check::CaseMeta& m, int threads, const MemAvailable& avail, const CaseNeed& need,
                       const std::function<std::string()>& other = {});
std::string fmt_ratio(double x);  // "1.2e-01", "inf"

// The memory of one case of these subcommands (case_need.cpp): the peak over its steps.
// `oracle`: read_case (the inputs in fp64, one file's bytes while it is parsed), compute_expected
// (oracle_need, then the copies of its outputs), write_expected (one output file's bytes).
MemNeed oracle_case_need(const Problem& p, Dtype dtype, bool backward, int threads);
// `check`: the inputs, expected/ and the candidate's outputs in fp64, then check_candidate's §9
// bounds (forward_bounds, backward_bounds: their N_q x N_k fp64 per thread).
MemNeed check_case_need(const Problem& p, Dtype dtype, bool backward, int threads);
// `conform`: the inputs, the expected outputs (computed by the oracle, or read from expected/),
// then per column its run (Footprint; none for a column without one) and the check of its outputs
// with the run still alive.
struct ConformColumn {
  std::string name;
  Footprint footprint;
};
MemNeed conform_case_need(const Problem& p, Dtype dtype, bool backward, bool expected_on_disk,
                          const std::vector<ConformColumn>& columns, int threads);
// What fits instead, for a subcommand whose problem is fixed by a case file: "it fits with
// --threads 1" (when it does), `other` (a further way, already checked by the caller), and the
// largest N_q = N_k of the case's B, H_q, H_kv, d that fits. need(p, threads); every suggestion
// within advice_budget.
std::string case_advice(const Problem& p, int threads, const MemAvailable& available,
                        const std::function<MemNeed(const Problem&, int)>& need, const std::string& other = "");

}  // namespace burstlab::tools
