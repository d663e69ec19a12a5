// distributed/shard_ops.hpp — engine-side helpers the collective schedules share (baselines,
// attention2d, distflash, usp): BHSD views and row offsets, a rank's output allocation, D at home
// (5.1), sums of pieces in a fixed order (bitwise reproducible), the exchange of many row pieces
// with a peer as one message each way, and their copies in as few engine calls as their layout allows.
// Internal to the layer: only its .cpp files include it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"

// M(T) for each storage type of the contract: the explicit instantiations of the schedules.
#define BURSTLAB_FOR_EACH_STORAGE(M) M(float) M(double) M(bf16_t) M(f16_t)

namespace burstlab::dist {

template <class T>
View4<T> bhsd(T* data, int64_t B, int64_t H, int64_t n, int64_t d) {
  return view4(data, Layout::BHSD, B, H, n, d);
}

// Element offset of row `off` of (b, h) in a BHSD buffer (B, H, L, w): rows of one (b, h) are
// contiguous, so a run of rows is one message.
inline int64_t at(int64_t b, int64_t h, int64_t off, int64_t H, int64_t L, int64_t w) {
  return ((b * H + h) * L + off) * w;
}

// Rank r's local lengths n_q, n_k, and its forward outputs O (B, H_q, n_q, d), LSE (B, H_q, n_q).
template <class T>
void prepare_forward(Engine<T>& e, const Problem& p, const Partition& qp, const Partition& kp, int r, Shard<T>& x) {
  x.n_q = qp.local_size(r);
  x.n_k = kp.local_size(r);
  ensure(e, x.O, p.B * p.H_q * x.n_q * p.d);
  ensure(e, x.LSE, p.B * p.H_q * x.n_q);
}

// Rank r's local lengths, and its backward outputs dQ (B, H_q, n_q, d), dK, dV (B, H_kv, n_k, d).
template <class T>
void prepare_backward(Engine<T>& e, const Problem& p, const Partition& qp, const Partition& kp, int r, Shard<T>& x) {
  x.n_q = qp.local_size(r);
  x.n_k = kp.local_size(r);
  ensure(e, x.dQ, p.B * p.H_q * x.n_q * p.d);
  ensure(e, x.dK, p.B * p.H_kv * x.n_k * p.d);
  ensure(e, x.dV, p.B * p.H_kv * x.n_k * p.d);
}

// eq. (5.1) at home: D = rowsum(dO o O), (B, H_q, n_q); D travels instead of O, so the engine
// has finished it on return (the transport may read it next).
template <class T>
Buffer<acc_t<T>> home_D(Engine<T>& e, const Problem& p, const Shard<T>& x) {
  const int64_t B = p.B, Hq = p.H_q, n = x.n_q, d = p.d;
  Buffer<acc_t<T>> D = alloc<acc_t<T>>(e, B * Hq * n);
  e.compute_D(as_const(bhsd<T>(x.O.data, B, Hq, n, d)), as_const(bhsd<T>(x.dO.data, B, Hq, n, d)),
              view3<acc_t<T>>(D.data, B, Hq, n));
  e.synchronize();
  return D;
}

// dst (piece) <- sum of the K pieces of stage (K, piece), in piece order 0, 1, ..., K-1: the
// reduction of a sum reduce-scatter, bitwise reproducible.
template <class U, class T>
void sum_pieces(Engine<T>& e, const U* stage, int64_t K, int64_t piece, U* dst) {
  copy(e, dst, stage, piece);
  for (int64_t k = 1; k < K; ++k) add(e, dst, stage + k * piece, piece);
}

// The pieces a rank exchanges with one peer, in one order that both sides agree on: what it
// sends (from, bytes) and where what it receives goes (to, bytes).
struct PeerPieces {
  int peer = 0;
  std::vector<std::pair<const void*, int64_t>> out;
  std::vector<std::pair<void*, int64_t>> in;
};

// One engine copy of `bytes` bytes.
struct Copy {
  void* to;
  const void* from;
  int64_t bytes;
};

// The copies in order, as few engine calls as their layout allows: a run of copies of one size
// whose sources and destinations each advance by one stride (at least the size) is one
// copy_rows, as the (b, h) row blocks of a collective are; the others go one by one.
template <class T>
void copy_pieces(Engine<T>& e, const std::vector<Copy>& copies) {
  auto gap = [](const void* a, const void* b) { return static_cast<const char*>(b) - static_cast<const char*>(a); };
  for (size_t i = 0; i < copies.size();) {
    const Copy& c = copies[i];
    size_t j = i + 1;
    if (j < copies.size() && copies[j].bytes == c.bytes && c.bytes > 0) {
      const int64_t to_pitch = gap(c.to, copies[j].to), from_pitch = gap(c.from, copies[j].from);
      if (to_pitch >= c.bytes && from_pitch >= c.bytes) {
        while (j < copies.size() && copies[j].bytes == c.bytes && gap(copies[j - 1].to, copies[j].to) == to_pitch &&
               gap(copies[j - 1].from, copies[j].from) == from_pitch)
          ++j;
        e.copy_rows(c.to, to_pitch, c.from, from_pitch, c.bytes, static_cast<int64_t>(j - i));
        i = j;
        continue;
      }
    }
    e.copy(c.to, c.from, c.bytes);
    ++i;
  }
}

// Receives parked in stage buffers until their waits, and the stages of both directions; declare
// it before the requests (destroyed after them: a cancelled transfer never outlives its stage).
struct Staged {
  std::vector<Copy> copies;
  std::vector<std::shared_ptr<void>> stages;
  // After every exchange's requests were waited: the staged receives copied to their pieces,
  // complete on return (the transport may read them next).
  template <class T>
  void finish(Engine<T>& e) {
    copy_pieces(e, copies);
    if (!copies.empty()) e.synchronize();
    copies.clear();
    stages.clear();
  }
};

// One batch: per peer ONE send of all its `out` pieces and ONE receive of all its `in` pieces,
// none in a direction without pieces (a ring's other neighbour), because NCCL moves one large
// message at about twice the bandwidth of many small ones (docs/performance-gpu.md). Pieces that
// lie one after another travel as they lie; the others go through one stage per direction:
// packed before the send (synchronized before the transport reads it), or copied out to their
// places by staged.finish after the waits.
template <class T>
void exchange(Communicator& c, Engine<T>& e, const std::vector<PeerPieces>& peers, int tag, const char* what,
              std::vector<RequestPtr>& reqs, Staged& staged) {
  auto total = [](const auto& pieces) {
    int64_t n = 0;
    for (const auto& pc : pieces) n += pc.second;
    return n;
  };
  auto staged_way = [&](const auto& pieces) {  // bytes that are not one run of memory
    for (size_t i = 1; i < pieces.size(); ++i)
      if (static_cast<const char*>(pieces[i - 1].first) + pieces[i - 1].second !=
          static_cast<const char*>(pieces[i].first))
        return total(pieces) > 0;
    return false;
  };
  int64_t out_bytes = 0, in_bytes = 0;  // what goes through the two stages
  std::vector<std::pair<bool, bool>> staged_ways;  // per peer: (out, in) staged
  for (const PeerPieces& pp : peers) {
    staged_ways.emplace_back(staged_way(pp.out), staged_way(pp.in));
    if (staged_ways.back().first) out_bytes += total(pp.out);
    if (staged_ways.back().second) in_bytes += total(pp.in);
  }
  auto stage = [&](int64_t bytes) -> char* {
    if (bytes == 0) return nullptr;
    staged.stages.push_back(e.allocate(bytes));
    return static_cast<char*>(staged.stages.back().get());
  };
  char *out_stage = stage(out_bytes), *in_stage = stage(in_bytes);
  struct Message {
    const void* out;
    void* in;
  };
  std::vector<Message> messages;
  std::vector<Copy> packs;
  for (size_t i = 0; i < peers.size(); ++i) {
    const PeerPieces& pp = peers[i];
    Message m{pp.out.empty() ? nullptr : pp.out.front().first, pp.in.empty() ? nullptr : pp.in.front().first};
    if (staged_ways[i].first) {
      m.out = out_stage;
      for (const auto& [from, n] : pp.out) packs.push_back({out_stage, from, n}), out_stage += n;
    }
    if (staged_ways[i].second) {
      m.in = in_stage;
      for (const auto& [to, n] : pp.in) staged.copies.push_back({to, in_stage, n}), in_stage += n;
    }
    messages.push_back(m);
  }
  copy_pieces(e, packs);
  if (out_bytes > 0) e.synchronize();  // the transport reads the packed stage next
  c.batch([&] {
    for (size_t i = 0; i < peers.size(); ++i) {
      const PeerPieces& pp = peers[i];
      if (!pp.in.empty()) reqs.push_back(c.irecv(messages[i].in, total(pp.in), pp.peer, tag, what));
      if (!pp.out.empty()) reqs.push_back(c.isend(messages[i].out, total(pp.out), pp.peer, tag, what));
    }
  });
}

// Where one (b, h) row block of a collective lies for one member: `from`, n_from rows sent to it,
// and `to`, n_to rows received from it (the own member's: copied from `from` to `to`; a null `to`
// copies nothing).
template <class U>
struct RowPiece {
  const U* from;
  int64_t n_from;
  U* to;
  int64_t n_to;
};

// A collective over the members `ranks` (this rank is ranks[me]) of the B x H row blocks, w
// elements a row: piece_of(k, b, h) (a RowPiece<U>) says where member k's block of (b, h) lies.
// The own blocks are copied; each other member's travel as one message each way (exchange).
// Members are visited from `first` on, in a circle.
template <class U, class T, class PieceOf>
void exchange_rows(Communicator& c, Engine<T>& e, const std::vector<int>& ranks, int me, int first, int64_t B,
                   int64_t H, int64_t w, int tag, const char* what, std::vector<RequestPtr>& reqs, Staged& into,
                   PieceOf piece_of) {
  const int64_t eb = sizeof(U);
  const int n = static_cast<int>(ranks.size());
  std::vector<PeerPieces> peers;
  std::vector<Copy> own;
  for (int i = 0; i < n; ++i) {
    const int k = (first + i) % n;
    PeerPieces pp{ranks[k], {}, {}};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const RowPiece<U> x = piece_of(k, b, h);
        if (k == me) {
          if (x.to && x.n_to > 0) own.push_back({x.to, x.from, x.n_to * w * eb});
          continue;
        }
        pp.out.emplace_back(x.from, x.n_from * w * eb);
        pp.in.emplace_back(x.to, x.n_to * w * eb);
      }
    if (k != me) peers.push_back(std::move(pp));
  }
  copy_pieces(e, own);
  exchange(c, e, peers, tag, what, reqs, into);
}

}  // namespace burstlab::dist
