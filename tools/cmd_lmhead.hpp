// tools/cmd_lmhead.hpp — `burstlab run --op lmhead-ce` and `burstlab bench --op lmhead-ce`: the
// fused LM head + cross-entropy (spec §10), checked against its fp64 oracle under the §10.8 rule
// before it is timed. The shared flags keep their meaning where it carries over: N = B x nq rows
// (tokens), -d the hidden size, --dtype, --values, --impl, --pass, --br, --threads, --seed,
// --json; --vocab and the loss options are this operator's. Flags that only attention has (--hq,
// --hkv, --nk, --mask, --layout, --scale, --bc, --check-rows, --algo, ...) are refused.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "common.hpp"

namespace burstlab::tools {

struct LmHeadFlags {
  std::string op = "attention";  // attention | lmhead-ce
  int64_t V = 0;                 // --vocab (required with lmhead-ce)
  int64_t ignore_index = -100;
  double ignored = 0.1;          // fraction of rows whose label is ignore_index
  double eps = 0;                // label smoothing
  double z_loss = 0;
  std::string reduction = "mean";
  int64_t Bv = 0;                // vocabulary entries per tile (0 = default)
};
// --op, --vocab, --ignore-index, --ignore-fraction, --label-smoothing, --z-loss, --reduction, --bv.
void add_lmhead_flags(CLI::App* sub, LmHeadFlags& f);
// Parses --op. true for lmhead-ce; refuses (Error) a flag given on the command line that the
// chosen operator does not have, naming it.
bool lmhead_selected(const CLI::App* sub, const LmHeadFlags& f);

// `run --op lmhead-ce`: one seeded problem, the chosen implementations, checked and timed. Rows:
// fwd (L, LSE), bwd (dH, dW from the impl's own LSE), fused (all four from one call); --pass both
// gives all three. Exit codes as `run`.
int run_lmhead(const ShapeFlags& shape, const RunFlags& run, const LmHeadFlags& f, int repeat);
// `bench --op lmhead-ce`: verify (on the timed shape, or with N reduced), then time the forward
// and the fused forward + backward of each impl (best of reps, after one warm-up when reps > 1)
// with the peak extra heap of the timed calls.
int bench_lmhead(const ShapeFlags& shape, const RunFlags& run, const LmHeadFlags& f, int reps,
                 const std::string& verify);

}  // namespace burstlab::tools
