// distributed/schedule.hpp — schedules as data (spec §7.2, §7.5).
// A schedule says, for every rank and every step, which (q-chunk, kv-chunk) blocks the rank
// computes and which messages it sends and receives. It is built before anything runs, so it can
// be printed (a teaching trace), checked (every visible pair computed exactly once, work per
// rank) and its bytes compared with the closed forms of §7.5. The executors (ring.hpp) follow it.
//
// Both algorithms are rings over G steps; at step t rank r works on shard s_t = (r - t) mod G of
// the travelling tensors and sends to r+1, receives from r-1 (indices mod G):
//   forward (ring = burst)  travelling K, V;            home Q, O, LSE   (O, LSE merged, eq. 4.5)
//   ring backward           travelling K, V, dK, dV;    home Q, dO, LSE, D, dQ
//   burst backward (GAO)    travelling Q, dO, D, LSE, dQ; home K, V, dK, dV
// Read-only travelling tensors move G-1 times. Accumulated ones (dK, dV or dQ) also make G-1
// hops, as partial sums (overlap_partial_sums): a rank's own contribution (step 0) stays home;
// shard s's partial starts at rank s+1 and, summed on the way, arrives home after step G-1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/mask.hpp"
#include "burstlab/problem.hpp"
#include "comm.hpp"
#include "partition.hpp"

namespace burstlab::dist {

enum class Algo { Ring, Burst };
std::string to_string(Algo a);

// A travelling tensor of one schedule (§7.2): which side it lives on and its row width.
struct Item {
  const char* name;  // "K", "dQ", ...
  bool q_side;       // rows are queries (B, H_q, n, .) vs keys (B, H_kv, n, .)
  bool per_row;      // one value per row (LSE, D) instead of d
  bool accumulated;  // updated by the compute, so it is sent after computing
  bool acc;          // stored in the accumulation type A (LSE, D, gradients), else in T
};

// Element widths in bytes of a run: t = sizeof(T) (Q, K, V, O, dO), a = sizeof(acc_t<T>) (LSE,
// D, dQ, dK, dV; spec §9.1). Equal for fp32 and fp64; bf16/fp16 move 2-byte inputs and 4-byte
// statistics and gradients.
struct ElemBytes {
  int64_t t = 4, a = 4;
  ElemBytes(int64_t both) : t(both), a(both) {}  // NOLINT: one width for both is the common case
  ElemBytes(int64_t t_, int64_t a_) : t(t_), a(a_) {}
  int64_t of(const Item& it) const { return it.acc ? a : t; }
};
const std::vector<Item>& travelling_items(Algo a, Phase phase);

struct BlockTask {
  int q_chunk = 0, k_chunk = 0;  // chunk ids of the q and the kv partition
  int64_t visible = 0;           // visible (i, j) pairs in the block (exact)
};

struct Message {
  std::string tensor;        // item name
  int item = 0;              // index in travelling_items
  int shard = 0;             // whose rows these are
  int peer = 0;              // destination (send) or source (recv)
  int tag = 0;               // step * 16 + item
  int64_t elems = 0;         // elements (bytes = elems * ElemBytes::of(item))
  // Posted after the step's compute (the last hop of a partial sum, home). A receive carries
  // its send's flag: both sides post a message in corresponding batches, which an in-order
  // transport needs (§7.4). An accumulated item's message posted before the compute of step t
  // carries the partial sum finished at step t - 1 (sender) and is added, after the compute of
  // step t, to the receiver's contribution of step t (overlap_partial_sums).
  bool after_compute = false;
  // 0: an ordinary hop (received for the next step, waited for at the end of this one).
  // > 0: the double ring's prefetched inter-node hop (spec §7.9): posted at the start of a node
  // round, in flight during the whole round, received into the separate inter-node slots and
  // waited for (both sides) only before step `lands`, the step whose compute first reads it.
  int lands = 0;
};

struct RankStep {
  int q_shard = 0, k_shard = 0;     // whose queries / whose keys this step uses
  std::vector<BlockTask> blocks;    // visible blocks, in execution order
  std::vector<BlockTask> skipped;   // blocks the mask hides entirely
  std::vector<Message> sends, recvs;
};

struct Schedule {
  Algo algo = Algo::Ring;
  Phase phase = Phase::Forward;
  int G = 1;
  std::vector<std::vector<RankStep>> steps;  // [rank][step], G steps each
};

// Visible (i, j) pairs between the positions of two chunks; exact for strided chunks too.
int64_t visible_in(const MaskParams& m, const Chunk& q, const Chunk& k);

Schedule make_schedule(Algo algo, Phase phase, const Problem& p, const MaskData& mask,
                       const Partition& qp, const Partition& kp);

// Building blocks of the ring schedules (make_schedule; the double ring, double_ring.hpp).
// Throws Error unless qp, kp have the same G and cover N_q, N_k.
void check_ring_partitions(const Problem& p, const Partition& qp, const Partition& kp);
// G ranks x G steps, no blocks or messages yet.
Schedule empty_schedule(Algo algo, Phase phase, int G);
// Elements of travelling item `it` for `shard`: B H n (d, or 1 per row), H and n of its side.
int64_t item_elems(const Item& it, const Problem& p, const Partition& qp, const Partition& kp, int shard);
// The backward's gradient hops as partial sums (spec §7.3), in place on a schedule whose
// accumulated messages are all posted after the compute of their step (make_schedule's and the
// double ring's layout): step 0's hop is dropped (the rank's own contribution stays home); the
// hop after step t, 1 <= t <= G-2, moves to the batch before the compute of step t + 1 (same
// peers, tag and shard), appended after that batch's messages on both sides so every pair keeps
// one posting order; the hop after step G-1 stays after the compute (it brings the sum home).
void overlap_partial_sums(Schedule& s);
// Every (q-chunk, kv-chunk) pair of st.q_shard x st.k_shard into st.blocks (visible) or
// st.skipped (hidden by the mask), in chunk order.
void list_blocks(RankStep& st, const MaskParams& m, const Partition& qp, const Partition& kp);

// Per-rank work of a schedule: blocks computed and visible pairs in them.
struct Work {
  int64_t blocks = 0, pairs = 0;
};
Work work(const Schedule& s, int rank);

// Bytes rank r moves according to the schedule (step < 0: all steps).
int64_t schedule_bytes(const Schedule& s, int rank, bool sent, ElemBytes elem_bytes, int step = -1);

// The closed forms of spec §7.5 (eq. 7.1-7.6), written from the formulas, not from a schedule.
// step < 0: the phase total.
int64_t closed_form_bytes(Algo algo, Phase phase, const Problem& p, const Partition& qp,
                          const Partition& kp, int rank, bool sent, ElemBytes elem_bytes,
                          int step = -1);

// How a trace groups message m of item it: 0 read-only before the compute, 1 after the compute,
// 2 a prefetched inter-node hop (lands > 0), 3 a partial sum before the compute.
int message_pass(const Message& m, const Item& it);
// A step-by-step teaching trace and the per-rank work totals.
std::string trace(const Schedule& s, const Problem& p, const Partition& qp, const Partition& kp,
                  ElemBytes elem_bytes);
std::string chunk_name(const Chunk& c);  // "[0,16)" or "{1,5,9,..}"

}  // namespace burstlab::dist
