// distributed/partition.hpp — how a sequence is split over G ranks (spec §7.1).
// A partition maps every global position 0 <= i < N to (rank, local index) and back. Each rank's
// shard is a list of chunks; a chunk is an arithmetic run of global positions
// (start, start + step, ...) stored at consecutive local indices. Masks are always evaluated on
// global positions, so a chunk hands its Positions (mask.hpp) to the local kernels.
//   contiguous  G chunks,  chunk c = [floor(cN/G), floor((c+1)N/G)),     rank r holds chunk r
//   zigzag      2G chunks, chunk c = [floor(cN/2G), floor((c+1)N/2G)),   rank r holds r, 2G-1-r
//   striped     G chunks,  chunk r = {r, r+G, r+2G, ...} (cyclic),       rank r holds chunk r
// Chunk sizes differ by at most one, so any N works as long as no chunk is empty: N >= G
// (contiguous, striped) and N >= 2G (zigzag); otherwise make_partition throws Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/mask.hpp"

namespace burstlab::dist {

enum class PartitionKind { Contiguous, Zigzag, Striped };
std::string to_string(PartitionKind k);
PartitionKind parse_partition(const std::string& s);  // "contiguous|zigzag|striped"

struct Chunk {
  int id = 0;               // global chunk id
  int rank = 0;             // owner
  int64_t local_start = 0;  // first local index in the owner's shard
  int64_t n = 0;            // positions in the chunk (>= 1)
  int64_t start = 0;        // first global position
  int64_t step = 1;         // global distance between consecutive positions (1, or G for striped)
  int64_t global(int64_t k) const { return start + k * step; }
};

struct Partition {
  PartitionKind kind = PartitionKind::Contiguous;
  int G = 1;
  int64_t N = 0;
  std::vector<Chunk> chunks;                      // by chunk id
  std::vector<std::vector<int>> rank_chunks;      // [rank] chunk ids in local order
  std::vector<std::vector<int64_t>> positions;    // [rank][local index] -> global position
  std::vector<int> owner_of;                      // (N) global position -> rank
  std::vector<int64_t> local_of;                  // (N) global position -> local index

  int64_t local_size(int r) const { return static_cast<int64_t>(positions[r].size()); }
  int64_t max_local_size() const;
  int64_t max_chunk_size() const;
  // Global positions of a chunk, for the local kernels. Contiguous runs have index == null;
  // strided ones point into `positions` (host memory owned by this Partition).
  Positions chunk_positions(int c) const;
};

// `what` names the length in errors ("N_q", "N_k").
Partition make_partition(PartitionKind kind, int64_t N, int G, const char* what = "N");

}  // namespace burstlab::dist
