// tools/dist_flags.cpp — the distributed flags as the algorithm table's options.
#include "dist_flags.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/memory.hpp"
#include "common.hpp"
#ifdef BURSTLAB_HAVE_NCCL
#include "thread_world.hpp"  // nccl::launch
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
  if (f.transport == Transport::Nccl && nccl::launch().by_mpi && f.nodes == 0 && !f.world_given && f.grid.empty())
    return nccl::launch().size;
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

int ranks_per_device(const DistFlags& f) {
  if (f.transport != Transport::Nccl) return world_of(f);
#ifdef BURSTLAB_HAVE_NCCL
  if (nccl::launch().by_mpi) {
    const int n = nccl::device_count();
    return n > 0 ? (local_processes() + n - 1) / n : 1;
  }
#endif
  return 1;
}

namespace {

constexpr Transport kTransports[] = {Transport::Sim, Transport::Nccl};

}  // namespace

void add_topology_flags(CLI::App& app, DistFlags& f) {
  DistFlags* fp = &f;
  app.add_option("--grid", f.grid,
                 "attention2d, attention2d-o: p_r x p_c grid, e.g. 2x3 (default: the most square); implies --world "
                 "R*C");
  app.add_flag("--overlap", f.overlap,
               "attention2d: the overlapped variant Attention2D-O, ring gather-compute-scatter (spec §7.13; = --algo "
               "attention2d-o)");
  int_flag(&app, "--world", f.world, "ranks G", "world", 1, kMaxWorld)->each([fp](const std::string&) {
    fp->world_given = true;
  });
  int_range(app.add_option("--nodes", f.nodes, "nodes M: world = M x --gpus-per-node (overrides --world)"), "nodes", 1,
            kMaxWorld);
  app.add_option("--partition", f.partition, "contiguous | zigzag | striped")->capture_default_str();
  int_flag(&app, "--gpus-per-node", f.gpus_per_node,
           "GPUs per node K (0 = one node): the intra/inter-node link of each byte count, double-ring's K (must "
           "divide --world), usp's default --ulysses-degree, --nodes' world M x K",
           "gpus-per-node", 0, kMaxWorld, ">= 0 (0 = one node)");
  int_range(app.add_option("--ulysses-degree", f.ulysses_degree,
                           "usp: ranks per Ulysses group u (divides --world, --hq and --hkv; default --gpus-per-node)"),
            "ulysses-degree", 1, kMaxWorld);
  app.add_option("--ring", f.base, "double-ring, usp: the ring's traffic, ring | burst")->capture_default_str();
}

std::string names_where(const std::function<bool(const dist::Algorithm&)>& has) {
  std::vector<std::string> ns;
  for (const dist::Algorithm& a : dist::algorithms())
    if (has(a)) ns.push_back(a.name);
  std::string s;
  for (size_t k = 0; k < ns.size(); ++k) s += (k == 0 ? "" : k + 1 == ns.size() ? " and " : ", ") + ns[k];
  return s;
}

std::string given_options(const std::vector<const CLI::Option*>& opts, int* n) {
  std::string s;
  *n = 0;
  for (const CLI::Option* o : opts) {
    if (o->count() == 0) continue;
    std::string value;
    for (const std::string& v : o->results()) value += (value.empty() ? "" : ",") + v;
    s += (s.empty() ? "" : ", ") + o->get_name() + (o->get_expected_max() == 0 ? "" : " (" + value + ")");
    ++*n;
  }
  return s;
}

const char* to_string(Transport t) { return t == Transport::Nccl ? "nccl" : "sim"; }

Transport parse_transport(const std::string& s) {
  for (Transport t : kTransports) {
    if (s != to_string(t)) continue;
#ifndef BURSTLAB_HAVE_NCCL
    if (t == Transport::Nccl)
      fail("transport (nccl) needs a build with CUDA and NCCL; this binary has no NCCL transport (see the CMake "
           "feature summary)");
#endif
    return t;
  }
  fail("transport (", s, ") must be sim or nccl");
}

dist::AlgoOptions options_of(const DistFlags& f) {
  dist::AlgoOptions o;
  const dist::Algorithm& given = dist::find_algorithm(f.algo);
  if (f.overlap && !given.overlapped)
    fail("overlap is an option of ", names_where([](const dist::Algorithm& a) { return a.overlapped != nullptr; }),
         ", not one of ", f.algo);
  const dist::Algorithm& a = f.overlap ? dist::find_algorithm(given.overlapped) : given;
  o.algo = a.name;
  o.partition = dist::parse_partition(f.partition);
  o.world = world_of(f);
  if (o.world < 1) fail("world (", o.world, ") must be >= 1");
  if (f.gpus_per_node < 0) fail("gpus-per-node (", f.gpus_per_node, ") must be >= 0 (0 = one node)");
  o.gpus_per_node = f.gpus_per_node;
  o.ulysses_degree = f.ulysses_degree;
  if (f.ulysses_degree < 0) fail("ulysses-degree (", f.ulysses_degree, ") must be >= 1");
  o.base = dist::ring_traffic_of(f.base);
  o.sim.poison = f.poison;
  o.sim.reorder = f.reorder;
  o.sim.gpus_per_node = f.gpus_per_node;
  o.backward = true;
  if (!f.grid.empty()) {
    if (!a.grid)
      fail("grid (", f.grid, ") is an ", names_where([](const dist::Algorithm& x) { return x.grid; }),
           " option, not one of ", f.algo);
    grid_ranks(f.grid);
    o.grid = dist::parse_grid(f.grid);
    if (o.grid.size() != o.world)
      fail("grid (", f.grid, " = ", o.grid.size(), " ranks) must have world (", o.world, ") ranks");
  }
  if (f.transport == Transport::Sim && !f.inject.empty())
    fail("inject-failure (", f.inject, ") is a --transport nccl option (SimComm: tests inject with SimOptions)");
  if (a.partition && o.partition != *a.partition)
    fail(o.algo, " needs --partition ", dist::to_string(*a.partition), ", not ", f.partition);
  return o;
}

}  // namespace burstlab::tools
