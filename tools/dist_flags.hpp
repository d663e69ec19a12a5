// tools/dist_flags.hpp — the distributed flags that `run` and `schedule` share (docs/design.md §8)
// and how they become the algorithm table's options (distributed/algorithm.hpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "algorithm.hpp"

namespace burstlab::tools {

// Where the ranks of `run --algo` talk: SimComm, ranks as threads of this process (distributed/),
// or NcclComm, one rank per GPU (nccl/).
enum class Transport { Sim, Nccl };
// "sim" | "nccl"; an Error naming the field and value otherwise, or for nccl in a binary without
// NCCL.
Transport parse_transport(const std::string& s);
const char* to_string(Transport t);  // "sim" | "nccl", what --transport takes

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
  std::string transport_flag = "sim";     // what --transport was given
  Transport transport = Transport::Sim;  // parse_transport(transport_flag), once flags are parsed
  double timeout = 120.0;         // nccl: the watchdog's bound on one wait (s)
  std::string inject;             // nccl: --inject-failure RANK:STEP[:bwd][:hang]
  bool single = false;            // --single: also the whole problem on one device
};

// The flags that lay the ranks out, bound to `f` (which outlives `app`): --grid, --overlap,
// --world, --nodes, --partition, --gpus-per-node, --ulysses-degree, --ring. `run` and `schedule`
// take the same ones.
void add_topology_flags(CLI::App& app, DistFlags& f);

// R x C of --grid RxC, at most kMaxWorld ranks (before Grid::size() multiplies two ints).
int grid_ranks(const std::string& grid);

// G: --world, or --nodes x --gpus-per-node when --nodes is given (docs/design.md §8),
// or R x C of --grid RxC when --world is not given, or mpirun's process count (--transport nccl).
int world_of(const DistFlags& f);

// The ranks that share one device, for the device memory check: every rank on SimComm (all on
// this process's GPU); over NCCL one (ThreadWorld gives each rank its own GPU), or under mpirun
// this host's processes over the GPUs it has (burstlab/memory.hpp's local_processes).
int ranks_per_device(const DistFlags& f);

// "a, b and c": the algorithms of the table for which `has` holds.
std::string names_where(const std::function<bool(const dist::Algorithm&)>& has);

// The options of `opts` that were on the command line, as a refusal names them: "--transport
// (nccl), --world (2)" (a flag that takes no value by its name alone); *n: how many.
std::string given_options(const std::vector<const CLI::Option*>& opts, int* n);

// The flags as the options of the algorithm table (distributed/algorithm.hpp); --overlap turns
// attention2d into attention2d-o. Throws Error naming a bad flag.
dist::AlgoOptions options_of(const DistFlags& f);

}  // namespace burstlab::tools
