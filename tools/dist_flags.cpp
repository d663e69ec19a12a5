// tools/dist_flags.cpp — the distributed flags as the algorithm table's options.
#include "dist_flags.hpp"

#include <cstdint>

#include "burstlab/error.hpp"
#include "common.hpp"
#ifdef BURSTLAB_HAVE_NCCL
#include "nccl_run.hpp"  // launched_by_mpi, mpi_size
#endif

namespace burstlab::tools {

int grid_ranks(const std::string& grid) {
  const dist::Grid g = dist::parse_grid(grid);
  const int64_t ranks = int64_t(g.p_r) * g.p_c;
  if (ranks > kMaxWorld) fail("grid (", grid, " = ", ranks, " ranks) must have at most ", kMaxWorld, " ranks");
  return static_cast<int>(ranks);
}

int world_of(const DistFlags& f) {
#ifdef BURSTLAB_HAVE_NCCL
  // Under mpirun the world is the processes it started, unless the flags name one.
  if (f.transport == "nccl" && launched_by_mpi() && f.nodes == 0 && !f.world_given && f.grid.empty())
    return mpi_size();
#endif
  if (f.nodes == 0 && !f.world_given && !f.grid.empty()) return grid_ranks(f.grid);
  if (f.nodes == 0) return f.world;
  if (f.nodes < 1) fail("nodes (", f.nodes, ") must be >= 1");
  if (f.gpus_per_node < 1)
    fail("nodes (", f.nodes, ") needs --gpus-per-node (", f.gpus_per_node, ") >= 1: world = nodes x gpus-per-node");
  const int64_t world = int64_t(f.nodes) * f.gpus_per_node;
  if (world > kMaxWorld)
    fail("world (nodes x gpus-per-node = ", f.nodes, " x ", f.gpus_per_node, " = ", world, ") must be <= ", kMaxWorld);
  return static_cast<int>(world);
}

dist::AlgoOptions options_of(const DistFlags& f) {
  dist::AlgoOptions o;
  o.algo = f.algo == "attention2d" && f.overlap ? "attention2d-o" : f.algo;
  dist::find_algorithm(o.algo);
  if (f.overlap && f.algo != "attention2d") fail("overlap is an attention2d option, not one of ", f.algo);
  o.partition = dist::parse_partition(f.partition);
  o.world = world_of(f);
  if (o.world < 1) fail("world (", o.world, ") must be >= 1");
  if (f.gpus_per_node < 0) fail("gpus-per-node (", f.gpus_per_node, ") must be >= 0 (0 = one node)");
  o.gpus_per_node = f.gpus_per_node;
  o.ulysses_degree = f.ulysses_degree;
  if (f.ulysses_degree < 0) fail("ulysses-degree (", f.ulysses_degree, ") must be >= 1");
  o.base = dist::parse_algo(f.base);
  o.sim.poison = f.poison;
  o.sim.reorder = f.reorder;
  o.sim.gpus_per_node = f.gpus_per_node;
  o.backward = true;
  if (!f.grid.empty()) {
    if (o.algo != "attention2d" && o.algo != "attention2d-o")
      fail("grid (", f.grid, ") is an attention2d and attention2d-o option, not one of ", f.algo);
    grid_ranks(f.grid);
    o.grid = dist::parse_grid(f.grid);
    if (o.grid.size() != o.world)
      fail("grid (", f.grid, " = ", o.grid.size(), " ranks) must have world (", o.world, ") ranks");
  }
  if (f.transport != "sim" && f.transport != "nccl") fail("transport (", f.transport, ") must be sim or nccl");
  if (f.transport == "sim" && !f.inject.empty())
    fail("inject-failure (", f.inject, ") is a --transport nccl option (SimComm: tests inject with SimOptions)");
#ifndef BURSTLAB_HAVE_NCCL
  if (f.transport == "nccl")
    fail("transport (nccl) needs a build with CUDA and NCCL; this binary has no NCCL transport (see the CMake "
         "feature summary)");
#endif
  if ((o.algo == "attention2d" || o.algo == "attention2d-o") && o.partition != dist::PartitionKind::Striped)
    fail(o.algo, " needs --partition striped (the cyclic distribution), not ", f.partition);
  return o;
}

}  // namespace burstlab::tools
