// distributed/shard_ops.hpp — engine-side helpers the collective schedules share (baselines,
// attention2d, distflash, usp): BHSD views and row offsets, a rank's output allocation, D at home
// (5.1), sums of pieces in a fixed order (bitwise reproducible), and the exchange of many row
// pieces with a peer as one message each way.
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

// Receives parked in stage buffers until their waits, and the stages of both directions; declare
// it before the requests (destroyed after them: a cancelled transfer never outlives its stage).
struct Staged {
  struct Copy {
    void* to;
    const void* from;
    int64_t bytes;
  };
  std::vector<Copy> copies;
  std::vector<std::shared_ptr<void>> stages;
  // After every exchange's requests were waited: the staged receives copied to their pieces,
  // complete on return (the transport may read them next).
  template <class T>
  void finish(Engine<T>& e) {
    for (const Copy& c : copies) e.copy(c.to, c.from, c.bytes);
    if (!copies.empty()) e.synchronize();
    copies.clear();
    stages.clear();
  }
};

// One batch: per peer ONE send of all its `out` pieces and ONE receive of all its `in` pieces
// (none where it has no pieces that way)
// (a message per (b, h) piece costs bandwidth: on 2x H200 over NVLink, NCCL moved 16 messages of
// 4 MiB at 87 GB/s and one of 64 MiB at 218). Pieces that lie one after another travel as they
// lie; others are packed into a stage first (synchronized before the transport reads it), and
// received ones are copied out of theirs by staged.finish after the waits.
template <class T>
void exchange(Communicator& c, Engine<T>& e, const std::vector<PeerPieces>& peers, int tag, const char* what,
              std::vector<RequestPtr>& reqs, Staged& staged) {
  struct Message {
    int peer;
    const void* out;
    int64_t out_bytes;
    void* in;
    int64_t in_bytes;
  };
  auto total = [](const auto& pieces) {
    int64_t n = 0;
    for (const auto& pc : pieces) n += pc.second;
    return n;
  };
  auto consecutive = [](const auto& pieces) {
    for (size_t i = 1; i < pieces.size(); ++i)
      if (static_cast<const char*>(pieces[i - 1].first) + pieces[i - 1].second !=
          static_cast<const char*>(pieces[i].first))
        return false;
    return true;
  };
  auto stage = [&](int64_t bytes) {
    staged.stages.push_back(e.allocate(bytes > 0 ? bytes : 1));
    return static_cast<char*>(staged.stages.back().get());
  };
  std::vector<Message> messages;
  bool packed = false;
  for (const PeerPieces& pp : peers) {
    Message m{pp.peer, nullptr, total(pp.out), nullptr, total(pp.in)};
    if (consecutive(pp.out) && !pp.out.empty()) {
      m.out = pp.out.front().first;
    } else {
      char* s = stage(m.out_bytes);
      m.out = s;
      for (const auto& [from, n] : pp.out) e.copy(s, from, n), s += n;
      packed = packed || !pp.out.empty();
    }
    if (consecutive(pp.in) && !pp.in.empty()) {
      m.in = pp.in.front().first;
    } else {
      char* s = stage(m.in_bytes);
      m.in = s;
      for (const auto& [to, n] : pp.in) staged.copies.push_back({to, s, n}), s += n;
    }
    messages.push_back(m);
  }
  if (packed) e.synchronize();  // the transport reads the packed stages next
  c.batch([&] {  // a direction without pieces (a ring's other neighbour) posts nothing
    for (size_t i = 0; i < messages.size(); ++i) {
      const Message& m = messages[i];
      if (!peers[i].in.empty()) reqs.push_back(c.irecv(m.in, m.in_bytes, m.peer, tag, what));
      if (!peers[i].out.empty()) reqs.push_back(c.isend(m.out, m.out_bytes, m.peer, tag, what));
    }
  });
}

}  // namespace burstlab::dist
