// distributed/head_a2a.hpp — the all-to-all between sequence and heads of Ulysses (spec §7.7) and
// of USP's groups (§7.14), by head chunks whose traffic overlaps the compute of the chunk before.
// Internal to the layer: its .cpp files and tests include it.
//
// The gathered layout. A group of u consecutive ranks (Ulysses: the whole world) lays its
// members' rows end to end in the order of their chunks' global start (§7.1), not in member
// order: the contiguous and zigzag partitions then gather into the global order [0, N) itself,
// so a block over the gathered rows runs over contiguous positions (one kernel launch, tile
// skipping on its own mask; an index would make the engine split it into its parts). Each chunk
// of a member's shard is one message per (b, head, peer); chunks adjacent in both the shard and
// the layout (zigzag's rank G-1) are one message. Bytes are those of the member-order layout.
//
// The pipeline. A member's H/u query heads (and H_kv/u kv heads) are cut into c chunks of equal
// size along the kv heads (q head h reads kv head h / (H_q/H_kv), so a chunk of kv heads carries
// its own q heads); with L compute steps per chunk (Ulysses 1, USP the ring across groups' G/u):
//   step 0            all-to-all in of chunk 0 (waited for)
//   step 1 + jL       the outputs of chunk j-1 go back and chunk j+1's inputs come in (posted,
//                     not waited for), while chunk j computes (steps 1 + jL .. (j+1)L)
//   step 1 + cL       the outputs of chunk c-1 go back
// so only chunk 0's inputs and chunk c-1's outputs are exposed. c = 1 is the unchunked schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"
#include "shard_ops.hpp"

namespace burstlab::dist {

// A member's local rows [src, src + n) lie at the gathered rows [dst, dst + n).
struct LayoutRun {
  int64_t src = 0, dst = 0, n = 0;
};

// The gathered layout of the group of ranks first .. first + u - 1 of a partition.
struct HeadLayout {
  int first = 0, u = 1, me = 0;              // world rank of member 0; the calling rank's member index
  std::vector<std::vector<LayoutRun>> runs;  // [member] its runs, in its local order
  std::vector<int64_t> rows;                 // [member] its local rows
  int64_t total = 0;                         // rows of the layout
  std::vector<int64_t> index;                // (total) global position of each gathered row
  bool in_order = false;                     // index is total consecutive positions: pass no index
  Positions positions() const {
    return in_order ? contiguous(index.empty() ? 0 : index[0], total) : Positions{index[0], total, index.data()};
  }
};
// The chunks of ranks first .. first + u - 1 in the order of their first global position.
std::vector<const Chunk*> group_chunks(const Partition& part, int first, int u);
// The layout of rank r's group of u ranks (r's member index is r % u).
HeadLayout head_layout(const Partition& part, int r, int u);

// Head chunks per rank: `requested` (0: kDefaultHeadChunks), at most the kv heads a rank holds
// and a divisor of them (chunks of equal size, so one ring schedule serves every chunk of USP).
constexpr int kDefaultHeadChunks = 2;
int head_chunk_count(int requested, int64_t kv_heads);

// The group's all-to-all of one head chunk, in one batch: every tensor of `moves`, for every peer
// (in member order from the caller's own), (b, head of the chunk), run.
enum class HeadDir { ToHeads, ToSeq };
template <class U>
struct HeadMove {
  U* seq;              // (B, H, n_me, w): the rank's rows of every head
  U* heads;            // (B, hc, total, w): the layout's rows of the chunk's heads of the caller's head block
  int64_t H, w;        // heads of the whole tensor (H_q or H_kv), row width
  int64_t h0, hc;      // the chunk: heads [h0, h0 + hc) of each member's block of H/u heads
  const HeadLayout* L;
  int tag;
  const char* what;
};
template <class U, class T>
void head_move(HeadDir dir, Communicator& c, Engine<T>& e, int64_t B, const HeadMove<U>& m,
               std::vector<RequestPtr>& reqs) {
  const HeadLayout& L = *m.L;
  const int64_t Hu = m.H / L.u, n = L.rows[L.me], w = m.w, eb = sizeof(U);
  const bool in = dir == HeadDir::ToHeads;
  for (int k = 0; k < L.u; ++k) {
    const int s = (L.me + k) % L.u, peer = L.first + s;  // the same order per pair on both sides
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < m.hc; ++h) {
        U* seq = m.seq + at(b, s * Hu + m.h0 + h, 0, m.H, n, w);  // my rows of member s's head
        U* hd = m.heads + at(b, h, 0, m.hc, L.total, w);          // every member's rows of my head
        if (s == L.me) {
          for (const LayoutRun& x : L.runs[s])
            in ? copy(e, hd + x.dst * w, seq + x.src * w, x.n * w) : copy(e, seq + x.src * w, hd + x.dst * w, x.n * w);
          continue;
        }
        // In: s's rows of my heads arrive at s's runs, mine leave for s's heads; back: the mirror.
        for (const LayoutRun& x : L.runs[in ? s : L.me])
          reqs.push_back(in ? c.irecv(hd + x.dst * w, x.n * w * eb, peer, m.tag, m.what)
                            : c.irecv(seq + x.src * w, x.n * w * eb, peer, m.tag, m.what));
        for (const LayoutRun& x : L.runs[in ? L.me : s])
          reqs.push_back(in ? c.isend(seq + x.src * w, x.n * w * eb, peer, m.tag, m.what)
                            : c.isend(hd + x.dst * w, x.n * w * eb, peer, m.tag, m.what));
      }
  }
}

// One rank's pass of the chunked pipeline (the header's comment). Inputs in (forward Q, K, V;
// backward Q, dO, LSE, D computed at home (5.1), K, V), outputs back (forward O, LSE; backward
// dQ, dK, dV). compute(j, h, hq, hkv, step) computes chunk j on h, its Shard of hq q heads and hkv
// kv heads over the layouts' rows (inputs filled; it fills O, LSE or dQ, dK, dV, allocating
// them), its first step being `step`; it may call comm.set_context for its later steps.
template <class T, class Compute>
void head_chunked_pass(Phase phase, Communicator& comm, Engine<T>& e, const Problem& p, int u, int chunks,
                       int steps_per_chunk, const HeadLayout& lq, const HeadLayout& lk, Shard<T>& x,
                       Compute&& compute) {
  using A = acc_t<T>;
  const bool bw = phase == Phase::Backward;
  const Buffer<A> D = bw ? home_D(e, p, x) : Buffer<A>{};  // D travels instead of O
  const int64_t B = p.B, d = p.d, Hu = p.H_q / u, Hkvu = p.H_kv / u;
  const int c = chunks, L = steps_per_chunk;
  const int64_t hk = Hkvu / c, hq = Hu / c, Nq = lq.total, Nk = lk.total;  // heads per chunk
  std::vector<Shard<T>> h(c);  // chunk j: (B, hq, Nq, d), (B, hkv, Nk, d) and row statistics
  for (Shard<T>& s : h) {
    s.Q = alloc<T>(e, B * hq * Nq * d);
    s.K = alloc<T>(e, B * hk * Nk * d);
    s.V = alloc<T>(e, B * hk * Nk * d);
    if (bw) {
      s.dO = alloc<T>(e, B * hq * Nq * d);
      s.LSE = alloc<A>(e, B * hq * Nq);
      s.D = alloc<A>(e, B * hq * Nq);
    }
  }
  std::vector<RequestPtr> ins, outs;  // after the buffers: destroyed (cancelled) first
  const auto move_in = [&](int j) {
    Shard<T>& s = h[j];
    const int64_t q0 = j * hq, k0 = j * hk;
    comm.batch([&] {
      head_move<T>(HeadDir::ToHeads, comm, e, B, {x.Q.data, s.Q.data, p.H_q, d, q0, hq, &lq, 1, "Q"}, ins);
      if (bw) {
        head_move<T>(HeadDir::ToHeads, comm, e, B, {x.dO.data, s.dO.data, p.H_q, d, q0, hq, &lq, 2, "dO"}, ins);
        head_move<A>(HeadDir::ToHeads, comm, e, B, {x.LSE.data, s.LSE.data, p.H_q, 1, q0, hq, &lq, 3, "LSE"}, ins);
        head_move<A>(HeadDir::ToHeads, comm, e, B, {D.data, s.D.data, p.H_q, 1, q0, hq, &lq, 4, "D"}, ins);
      }
      const int kt = bw ? 5 : 2;
      head_move<T>(HeadDir::ToHeads, comm, e, B, {x.K.data, s.K.data, p.H_kv, d, k0, hk, &lk, kt, "K"}, ins);
      head_move<T>(HeadDir::ToHeads, comm, e, B, {x.V.data, s.V.data, p.H_kv, d, k0, hk, &lk, kt + 1, "V"}, ins);
    });
  };
  const auto move_out = [&](int j) {
    Shard<T>& s = h[j];
    const int64_t q0 = j * hq, k0 = j * hk;
    e.synchronize();  // the chunk's outputs are complete before the transport reads them
    comm.batch([&] {
      if (bw) {
        head_move<A>(HeadDir::ToSeq, comm, e, B, {x.dQ.data, s.dQ.data, p.H_q, d, q0, hq, &lq, 7, "dQ"}, outs);
        head_move<A>(HeadDir::ToSeq, comm, e, B, {x.dK.data, s.dK.data, p.H_kv, d, k0, hk, &lk, 8, "dK"}, outs);
        head_move<A>(HeadDir::ToSeq, comm, e, B, {x.dV.data, s.dV.data, p.H_kv, d, k0, hk, &lk, 9, "dV"}, outs);
      } else {
        head_move<T>(HeadDir::ToSeq, comm, e, B, {x.O.data, s.O.data, p.H_q, d, q0, hq, &lq, 4, "O"}, outs);
        head_move<A>(HeadDir::ToSeq, comm, e, B, {x.LSE.data, s.LSE.data, p.H_q, 1, q0, hq, &lq, 5, "LSE"}, outs);
      }
    });
  };
  comm.set_context(phase, 0);
  move_in(0);
  wait_all(ins);
  for (int j = 0; j < c; ++j) {
    comm.set_context(phase, 1 + j * L);
    if (j > 0) move_out(j - 1);
    if (j + 1 < c) move_in(j + 1);  // in flight while chunk j computes
    compute(j, h[j], hq, hk, 1 + j * L);
    wait_all(ins);
  }
  comm.set_context(phase, 1 + c * L);
  move_out(c - 1);
  wait_all(outs);
}

}  // namespace burstlab::dist
