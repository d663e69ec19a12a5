// distributed/partition.cpp — spec §7.1.
#include "partition.hpp"

#include <algorithm>

#include "burstlab/error.hpp"
#include "burstlab/names.hpp"

namespace burstlab::dist {

constexpr Named<PartitionKind> kPartitionNames[] = {
    {PartitionKind::Contiguous, "contiguous"}, {PartitionKind::Zigzag, "zigzag"}, {PartitionKind::Striped, "striped"}};

std::string to_string(PartitionKind k) { return name_of(k, kPartitionNames); }

PartitionKind parse_partition(const std::string& s) { return parse_named(s, kPartitionNames, "partition"); }

int64_t Partition::max_local_size() const {
  int64_t m = 0;
  for (const auto& p : positions) m = std::max<int64_t>(m, static_cast<int64_t>(p.size()));
  return m;
}
int64_t Partition::max_chunk_size() const {
  int64_t m = 0;
  for (const auto& c : chunks) m = std::max(m, c.n);
  return m;
}

Positions Partition::chunk_positions(int c) const {
  const Chunk& ch = chunks.at(c);
  if (ch.step == 1) return contiguous(ch.start, ch.n);
  return Positions{ch.start, ch.n, positions[ch.rank].data() + ch.local_start};
}

Partition make_partition(PartitionKind kind, int64_t N, int G, const char* what) {
  if (G < 1) fail("world size G (", G, ") must be >= 1");
  const int C = kind == PartitionKind::Zigzag ? 2 * G : G;
  if (N < C)
    fail(what, " (", N, ") cannot be split by the ", to_string(kind), " partition over G = ", G,
         " ranks: it needs ", C, " non-empty chunks, so ", what, " >= ", C);
  Partition p;
  p.kind = kind;
  p.G = G;
  p.N = N;
  p.chunks.resize(C);
  p.rank_chunks.assign(G, {});
  p.positions.assign(G, {});
  auto bound = [&](int64_t c) { return c * N / C; };  // floor(cN / C)
  for (int c = 0; c < C; ++c) {
    Chunk& ch = p.chunks[c];
    ch.id = c;
    if (kind == PartitionKind::Striped) {
      ch.rank = c;
      ch.start = c;
      ch.step = G;
      ch.n = (N - c + G - 1) / G;  // positions c, c+G, ... < N
    } else {
      ch.rank = (kind == PartitionKind::Zigzag && c >= G) ? 2 * G - 1 - c : c;
      ch.start = bound(c);
      ch.step = 1;
      ch.n = bound(c + 1) - bound(c);
    }
  }
  // Local order: contiguous/striped one chunk; zigzag chunk r then chunk 2G-1-r.
  for (int r = 0; r < G; ++r) {
    if (kind == PartitionKind::Zigzag) p.rank_chunks[r] = {r, 2 * G - 1 - r};
    else p.rank_chunks[r] = {r};
    for (int c : p.rank_chunks[r]) {
      Chunk& ch = p.chunks[c];
      ch.local_start = static_cast<int64_t>(p.positions[r].size());
      for (int64_t k = 0; k < ch.n; ++k) p.positions[r].push_back(ch.global(k));
    }
  }
  p.owner_of.assign(N, -1);
  p.local_of.assign(N, -1);
  for (int r = 0; r < G; ++r)
    for (int64_t l = 0; l < p.local_size(r); ++l) {
      const int64_t i = p.positions[r][l];
      p.owner_of[i] = r;
      p.local_of[i] = l;
    }
  return p;
}

}  // namespace burstlab::dist
