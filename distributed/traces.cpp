// distributed/traces.cpp — the teaching traces of the algorithm table (spec §7): what each rank
// holds, computes and sends, step by step or collective by collective, and its bytes next to the
// closed forms. Sizes are derived from the data movement (rows x row width) or the schedule,
// independently of the closed-form formulas, so a mismatch shows ("NO") and `ok` is false.
#include "traces.hpp"

#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "baselines.hpp"
#include "double_ring.hpp"

namespace burstlab::dist {

namespace {

void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  if (n > 0) {
    std::vector<char> buf(static_cast<size_t>(n) + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    out.append(buf.data(), static_cast<size_t>(n));
  }
  va_end(ap2);
}

std::string rows_of(const Partition& part, int r) {
  std::string s;
  for (int c : part.rank_chunks[r]) s += (s.empty() ? "" : " ") + chunk_name(part.chunks[c]);
  return s + " (" + std::to_string(part.local_size(r)) + " rows)";
}
std::string heads(int64_t lo, int64_t n) { return "[" + std::to_string(lo) + "," + std::to_string(lo + n) + ")"; }
std::string no_note(int) { return std::string(); }

// Visible pairs of rank q_rank's queries against the keys of shard k_shard (one (b, h)).
int64_t block_pairs(const Plan& pl, int q_rank, int k_shard) {
  const MaskParams m = pl.mask.params();
  const Partition &qp = pl.qp, &kp = pl.kp;
  int64_t n = 0;
  for (int qc : qp.rank_chunks[q_rank])
    for (int kc : kp.rank_chunks[k_shard]) n += visible_in(m, qp.chunks[qc], kp.chunks[kc]);
  return n;
}

// The lines of one exchange inside groups of u ranks (u = G: one group): per rank r, what it
// sends each other member s = (r / u) u + j, elems(r, s) elements of `scale` bytes, note(j)
// after the size; adds the elements to sent[r] and recv[s].
template <class Elems, class Note>
void exchange_lines(std::string& out, int u, int64_t scale, std::vector<int64_t>& sent, std::vector<int64_t>& recv,
                    Elems elems, Note note) {
  const int G = static_cast<int>(sent.size());
  for (int r = 0; r < G; ++r) {
    appendf(out, "  rank %d:", r);
    for (int j = 0; j < u; ++j) {
      const int s = r / u * u + j;
      if (s == r) continue;
      const int64_t e = elems(r, s);
      sent[r] += e;
      recv[s] += e;
      appendf(out, " -> %d %lld B%s;", s, static_cast<long long>(e * scale), note(j).c_str());
    }
    appendf(out, "\n");
  }
}


}  // namespace

// spec §7.2, §7.5: the ring executor's schedule, step by step (schedule.hpp's trace).
Trace ring_trace(const Plan& pl, ElemBytes w, bool fwd, bool bwd) {
  std::string out;
  bool ok = true;
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    if ((ph == Phase::Forward && !fwd) || (ph == Phase::Backward && !bwd)) continue;
    const Schedule& s = ph == Phase::Forward ? pl.fwd : pl.bwd;
    out += "\n" + trace(s, pl.p, pl.qp, pl.kp, w);
    for (int r = 0; r < s.G; ++r)
      for (bool sent : {true, false})
        ok = ok && schedule_bytes(s, r, sent, w) == closed_form_bytes(s.algo, ph, pl.p, pl.qp, pl.kp, r, sent, w);
  }
  return {out, ok};
}

// spec §7.9: the two-level ring, its bytes per link class next to (7.14)-(7.15).
Trace double_ring_trace(const Plan& pl, ElemBytes w, bool fwd, bool bwd) {
  const Problem& p = pl.p;
  const Partition &qp = pl.qp, &kp = pl.kp;
  const Algo base = pl.o.base;
  const int64_t eb = w.t;
  const int G = qp.G, K = pl.o.gpus_per_node > 0 ? pl.o.gpus_per_node : G;
  std::string out;
  bool ok = true;
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    if ((ph == Phase::Forward && !fwd) || (ph == Phase::Backward && !bwd)) continue;
    const Schedule& s = ph == Phase::Forward ? pl.fwd : pl.bwd;
    appendf(out, "\ndouble ring (%d nodes x %d GPUs per node), %s traffic; the (closed form) columns "
                "below are the flat ring's §7.5, see the per-link lines after\n%s",
                G / K, K, base == Algo::Burst ? "BurstAttention" : "RingAttention", trace(s, p, qp, kp, eb).c_str());
    appendf(out, "bytes per link class (spec §7.9):\n");
    for (int r = 0; r < G; ++r) {
      int64_t si[2] = {0, 0};  // the schedule's sends by link class (intra, inter)
      for (const RankStep& st : s.steps[r])
        for (const Message& m : st.sends) si[m.peer / K != r / K] += m.elems * eb;
      const int64_t ci = double_ring_bytes(base, ph, p, qp, kp, r, true, eb, K, 0, pl.o.prefetch_inter);
      const int64_t ce = double_ring_bytes(base, ph, p, qp, kp, r, true, eb, K, 1, pl.o.prefetch_inter);
      ok = ok && si[0] == ci && si[1] == ce;
      appendf(out, "  rank %d: sent %lld B = intra %lld + inter %lld (closed form %lld + %lld)%s\n", r,
                  static_cast<long long>(schedule_bytes(s, r, true, eb)), static_cast<long long>(si[0]),
                  static_cast<long long>(si[1]), static_cast<long long>(ci), static_cast<long long>(ce),
                  si[0] == ci && si[1] == ce ? "" : "  NO");
    }
  }
  return {out, ok};
}


// Step-by-step trace of the two collective baselines (spec §7.7 Ulysses, §7.8 all-gather CP):
// what each rank holds before and after each collective, what it sends to each peer, and its
// bytes per phase next to the closed forms (7.10)-(7.13). The per-message sizes below are
// derived from the data movement (rows x row width), independently of the closed-form formulas,
// so a mismatch prints "NO" and the command fails (exit 1).
Trace collective_trace(const Plan& pl, ElemBytes w, bool fwd, bool bwd, bool uly) {
  const Problem& p = pl.p;
  const MaskData& md = pl.mask;
  const Partition &qp = pl.qp, &kp = pl.kp;
  const int64_t eb = w.t;  // one width: the sizes below count elements of either kind alike
  const std::string algo = uly ? "ulysses" : "allgather";
  std::string out;
  const int G = qp.G;
  const MaskParams m = md.params();
  const int64_t B = p.B, d = p.d, Hg = p.H_q / G, Hkvg = p.H_kv / G;
  bool ok = true;
  // Rank r's visible pairs of its queries against all keys (one (b, h)).
  auto pairs_of = [&](int r) {
    int64_t n = 0;
    for (int qc : qp.rank_chunks[r])
      for (const Chunk& kc : kp.chunks) n += visible_in(m, qp.chunks[qc], kc);
    return n;
  };
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    if ((ph == Phase::Forward && !fwd) || (ph == Phase::Backward && !bwd)) continue;
    const bool bw = ph == Phase::Backward;
    std::vector<int64_t> sent(G, 0), recv(G, 0);  // elements per rank
    auto to_peers = [&](auto elems, auto note) { exchange_lines(out, G, eb, sent, recv, elems, note); };
    appendf(out, "\n%s %s: G=%d, N_q=%lld, N_k=%lld, %lld-byte elements (collectives: every rank, every peer, at once)\n",
                algo.c_str(), to_string(ph).c_str(), G, static_cast<long long>(p.N_q),
                static_cast<long long>(p.N_k), static_cast<long long>(eb));
    if (uly) {
      // Row widths: Q, dO (d) + LSE, D (1) in the backward; K, V (2d per kv head).
      const int64_t wq = bw ? 2 * d + 2 : d, wkv = 2 * d;
      const char* qname = bw ? "Q,dO,LSE,D" : "Q";
      appendf(out, "before: rank r holds its sequence rows of every head (H_q=%lld, H_kv=%lld)%s\n",
                  static_cast<long long>(p.H_q), static_cast<long long>(p.H_kv),
                  bw ? "; D = rowsum(dO o O) computed at home (5.1)" : "");
      for (int r = 0; r < G; ++r)
        appendf(out, "  rank %d: q rows %s, kv rows %s\n", r, rows_of(qp, r).c_str(), rows_of(kp, r).c_str());
      appendf(out, "collective 1: all-to-all sequence -> heads of %s,K,V (rank r sends peer s its rows of head group s)\n",
                  qname);
      to_peers([&](int r, int) { return B * (Hg * qp.local_size(r) * wq + Hkvg * kp.local_size(r) * wkv); },
               [&](int s) { return " (q heads " + heads(s * Hg, Hg) + ", kv heads " + heads(s * Hkvg, Hkvg) + ")"; });
      appendf(out, "after: rank r holds all N_q=%lld q rows of q heads [r Hg, (r+1) Hg) and all N_k=%lld kv rows of kv "
                  "heads [r Hkvg, (r+1) Hkvg) (Hg=%lld, Hkvg=%lld), shards end to end in rank order\n",
                  static_cast<long long>(p.N_q), static_cast<long long>(p.N_k), static_cast<long long>(Hg),
                  static_cast<long long>(Hkvg));
      for (int r = 0; r < G; ++r)
        appendf(out, "  rank %d: q heads %s, kv heads %s; compute one %s over %lld visible pairs per head\n", r,
                    heads(r * Hg, Hg).c_str(), heads(r * Hkvg, Hkvg).c_str(),
                    bw ? "backward_block (6.2) into dQ, dK, dV of its heads" : "forward_block (6.1)",
                    static_cast<long long>(visible_pairs(p)));
      const char* back = bw ? "dQ,dK,dV" : "O,LSE";
      appendf(out, "collective 2: all-to-all heads -> sequence of %s (rank r sends peer s the rows of shard s of head "
                  "group r)\n",
                  back);
      to_peers(
          [&](int, int s) {
            return bw ? B * (Hg * qp.local_size(s) * d + Hkvg * kp.local_size(s) * 2 * d)
                      : B * Hg * qp.local_size(s) * (d + 1);
          },
          no_note);
      appendf(out, "after: rank r holds %s of its own sequence rows of every head (no reduction: one producer per "
                  "row)\n",
                  back);
    } else {
      const int64_t wkv = 2 * p.H_kv * d;  // K, V of every kv head, per row
      appendf(out, "before: rank r holds its q rows and kv rows of every head\n");
      for (int r = 0; r < G; ++r)
        appendf(out, "  rank %d: q rows %s, kv rows %s\n", r, rows_of(qp, r).c_str(), rows_of(kp, r).c_str());
      appendf(out, "collective 1: all-gather K,V%s (rank r sends its kv rows to every peer)\n",
                  bw ? " (again: nothing is kept between passes)" : "");
      to_peers([&](int r, int) { return B * kp.local_size(r) * wkv; }, no_note);
      appendf(out, "after: every rank holds all N_k=%lld kv rows (shards end to end in rank order)\n",
                  static_cast<long long>(p.N_k));
      for (int r = 0; r < G; ++r)
        appendf(out, "  rank %d: compute one %s of its q rows against all keys: %lld visible pairs per head\n", r,
                    bw ? "backward_block (6.2): dQ at home, partial dK, dV of all N_k rows" : "forward_block (6.1)",
                    static_cast<long long>(pairs_of(r)));
      if (bw) {
        appendf(out, "collective 2: reduce-scatter dK,dV (rank r sends peer s its partial of s's kv rows; s sums "
                    "them in rank order 0..G-1)\n");
        to_peers([&](int, int s) { return B * kp.local_size(s) * wkv; }, no_note);
        appendf(out, "after: rank r holds dQ of its q rows and the summed dK, dV of its kv rows\n");
      }
    }
    appendf(out, "bytes per rank (spec %s):\n", uly ? (bw ? "7.11" : "7.10") : (bw ? "7.13" : "7.12"));
    for (int r = 0; r < G; ++r) {
      const int64_t cs = uly ? ulysses_bytes(ph, p, qp, kp, r, true, eb) : allgather_bytes(ph, p, qp, kp, r, true, eb);
      const int64_t cr = uly ? ulysses_bytes(ph, p, qp, kp, r, false, eb) : allgather_bytes(ph, p, qp, kp, r, false, eb);
      const bool match = sent[r] * eb == cs && recv[r] * eb == cr;
      ok = ok && match;
      appendf(out, "  rank %d: sent %lld B (closed form %lld), received %lld B (closed form %lld)%s\n", r,
                  static_cast<long long>(sent[r] * eb), static_cast<long long>(cs),
                  static_cast<long long>(recv[r] * eb), static_cast<long long>(cr), match ? "" : "  NO");
    }
  }
  if (!ok) appendf(out, "FAIL: traced bytes differ from the closed forms of spec §7.7-7.8\n");
  return {out, ok};
}

// spec §7.12: DistFlashAttn's balanced causal schedule as data: per step, who owns or helps
// which block, what travels, and the bytes next to the closed forms (7.24)-(7.25).
Trace distflash_trace(const Plan& pl, ElemBytes w, bool fwd, bool bwd) {
  const Problem& p = pl.p;
  const Partition &qp = pl.qp, &kp = pl.kp;
  const int64_t eb = w.t;
  std::string out;
  const int P = qp.G;
  const FlashSchedule& fs = pl.flash;
  auto pairs = [&](int a, int b) { return block_pairs(pl, a, b); };  // rank a's queries x rank b's keys
  appendf(out, "\ndistflash: P=%d, contiguous, %zu steps; idle fraction (eq. 7.24, over P^2 worker-steps) = %.4f\n", P,
              fs.steps.empty() ? size_t(0) : fs.steps[0].size(), distflash_idle_fraction(fs));
  const size_t T = fs.steps.empty() ? 0 : fs.steps[0].size();
  for (size_t t = 0; t < T; ++t) {
    appendf(out, "step %zu\n", t);
    for (int r = 0; r < P; ++r) {
      const FlashStep& st = fs.steps[r][t];
      appendf(out, "  rank %d: ", r);
      if (st.role == FlashRole::Idle) {
        appendf(out, "idle");
      } else {
        appendf(out, "%s block Q[rank %d] x K[rank %d] (%lld pairs)", st.role == FlashRole::Owner ? "owner " : "helper",
                    st.q, st.k, static_cast<long long>(pairs(st.q, st.k)));
        if (st.role == FlashRole::Helper)
          appendf(out, " with its own K,V and Q fetched from rank %d; partial %s back to rank %d", st.q,
                      bwd && !fwd ? "dQ" : "(O, LSE) [fwd] / dQ [bwd]", st.q);
        if (st.role == FlashRole::Owner && st.k != r) appendf(out, " with K,V fetched from rank %d", st.k);
      }
      if (st.kv_dst >= 0) appendf(out, "; sends K,V -> %d", st.kv_dst);
      if (st.q_dst >= 0) appendf(out, "; sends Q -> %d", st.q_dst);
      appendf(out, "\n");
    }
  }
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    if ((ph == Phase::Forward && !fwd) || (ph == Phase::Backward && !bwd)) continue;
    appendf(out, "%s bytes per rank (closed form 7.25):", to_string(ph).c_str());
    for (int r = 0; r < P; ++r)
      appendf(out, " r%d sent %lld recv %lld;", r, static_cast<long long>(distflash_bytes(ph, p, qp, kp, r, true, eb)),
                  static_cast<long long>(distflash_bytes(ph, p, qp, kp, r, false, eb)));
    appendf(out, "\n");
  }
  return {out, true};
}

namespace {

// spec §7.13: Attention2D-O step by step, as attention2d_o_forward / _backward post it. The step
// numbers are the transport's: 0 the transpose, 1 .. p_r the column ring (phase A), p_r + 1 the
// own query block out, p_r + 1 + v the row ring (phase B); backward p_r + p_c + 1 the column
// reduce-scatter of dK, dV (phase C) and p_r + p_c + 2 their transpose back. A step's transfers
// are posted before its compute, which they overlap. Bytes are rows x row width of each message,
// compared with (7.26); the pairs of all steps with Attention2D-NO's one block.
Trace attention2d_o_steps(const Plan& pl, ElemBytes w, bool fwd, bool bwd) {
  const Problem& p = pl.p;
  const Partition &qp = pl.qp, &kp = pl.kp;
  const Grid& g = pl.grid;
  const int P = qp.G, pr = g.p_r, pc = g.p_c;
  const int64_t B = p.B, d = p.d, Hq = p.H_q, Hkv = p.H_kv, t = w.t, a = w.a;
  auto md = [](int x, int n) { return ((x % n) + n) % n; };
  auto nq = [&](int rank) { return qp.local_size(rank); };   // striped: rank x holds query shard x
  auto nk = [&](int shard) { return kp.local_size(shard); };
  auto pairs = [&](int q_rank, int k_shard) { return block_pairs(pl, q_rank, k_shard); };
  auto col_pairs = [&](int q_rank, int j) {  // against the K, V gathered in column j
    int64_t n = 0;
    for (int ii = 0; ii < pr; ++ii) n += pairs(q_rank, g.row_major(g.rank(ii, j)));
    return n;
  };
  auto holder = [&](int shard) {  // the rank whose row-major index is `shard`
    for (int x = 0; x < P; ++x)
      if (g.row_major(x) == shard) return x;
    return -1;
  };
  auto list = [](const std::vector<std::string>& parts) {
    std::string s;
    for (const std::string& x : parts) s += (s.empty() ? "" : "; ") + x;
    return s;
  };
  std::string out;
  bool ok = true;
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    if ((ph == Phase::Forward && !fwd) || (ph == Phase::Backward && !bwd)) continue;
    const bool bw = ph == Phase::Backward;
    // Bytes per row of what travels.
    const int64_t kv_row = 2 * Hkv * d * t;                               // K, V
    const int64_t q_row = bw ? Hq * (2 * d * t + 2 * a) : Hq * d * t;     // Q (backward: Q, dO, LSE, D)
    const int64_t part_row = bw ? Hq * d * a : Hq * (d * t + a);          // the chain: dQ, or (O, LSE)
    const int64_t dkv_row = 2 * Hkv * d * a;                              // dK, dV
    const char* q_side = bw ? "Q,dO,LSE,D" : "Q";
    const char* part = bw ? "dQ" : "(O,LSE)";
    const bool own_last = !bw && pr == 1 && pc > 1;  // attention2d_o_forward's own block after the row ring
    std::vector<int64_t> sent(P, 0), recv(P, 0), computed(P, 0), blocks(P, 0);
    std::vector<std::vector<std::string>> step_lines;  // [step][rank]
    auto step = [&](const std::string& title) {
      appendf(out, "step %zu: %s\n", step_lines.size(), title.c_str());
      step_lines.emplace_back(P);
    };
    auto send = [&](std::vector<std::string>& l, int r, const std::string& what, int to, int64_t bytes) {
      l.push_back("send " + what + " -> " + std::to_string(to) + " (" + std::to_string(bytes) + " B)");
      sent[r] += bytes;
    };
    auto receive = [&](std::vector<std::string>& l, int r, const std::string& what, int from, int64_t bytes) {
      l.push_back("recv " + what + " <- " + std::to_string(from) + " (" + std::to_string(bytes) + " B)");
      recv[r] += bytes;
    };
    auto flush = [&] {
      for (int r = 0; r < P; ++r)
        if (!step_lines.back()[r].empty())
          appendf(out, "  rank %d (row %d, col %d): %s\n", r, g.row(r), g.col(r), step_lines.back()[r].c_str());
    };
    appendf(out, "\nattention2d-o %s (Attention2D-O, §7.13): grid %d x %d (rank p = i + j p_r is row i, column j), "
                "striped inputs, %lld-byte elements (statistics and gradients %lld); each step's transfers are posted "
                "before its compute and overlap it\n",
            to_string(ph).c_str(), pr, pc, static_cast<long long>(t), static_cast<long long>(a));
    auto transpose = [&](bool back) {
      step(back ? "dK,dV transposed back to their owners" : "K,V transposed to the row-major cyclic distribution");
      for (int r = 0; r < P; ++r) {
        std::vector<std::string> l;
        const int rt = g.row_major(r);
        if (rt == r) {
          l.push_back(std::string("keeps ") + (back ? "dK,dV" : "K,V") + "[shard " + std::to_string(r) + "]");
        } else if (!back) {
          send(l, r, "K,V[shard " + std::to_string(r) + "]", holder(r), B * nk(r) * kv_row);
          receive(l, r, "K,V[shard " + std::to_string(rt) + "]", rt, B * nk(rt) * kv_row);
        } else {
          send(l, r, "dK,dV[shard " + std::to_string(rt) + "]", rt, B * nk(rt) * dkv_row);
          receive(l, r, "dK,dV[shard " + std::to_string(r) + "]", holder(r), B * nk(r) * dkv_row);
        }
        step_lines.back()[r] = list(l);
      }
      flush();
    };
    transpose(false);
    // Phase A: at step u rank (i, j) holds the K, V block of column member i - u.
    for (int u = 0; u < pr; ++u) {
      step("column ring " + std::to_string(u + 1) + " of " + std::to_string(pr) + " (phase A)");
      for (int r = 0; r < P; ++r) {
        const int i = g.row(r), j = g.col(r);
        const int cur = g.row_major(g.rank(md(i - u, pr), j)), nxt = g.row_major(g.rank(md(i - u - 1, pr), j));
        std::vector<std::string> l;
        const int64_t n = pairs(r, cur);
        computed[r] += n;
        ++blocks[r];
        if (own_last)
          l.push_back("holds K,V[shard " + std::to_string(cur) + "]: its own block runs after the row ring");
        else
          l.push_back("compute " + std::string(q_side) + "[rank " + std::to_string(r) + "] x K,V[shard " +
                      std::to_string(cur) + "] (" + std::to_string(n) + " pairs)" +
                      (bw ? ": dQ at home, dK,dV of the block" : ", merged into (O, LSE)"));
        if (u < pr - 1) {
          send(l, r, "K,V[shard " + std::to_string(cur) + "]", g.rank(md(i + 1, pr), j), B * nk(cur) * kv_row);
          receive(l, r, "K,V[shard " + std::to_string(nxt) + "]", g.rank(md(i - 1, pr), j), B * nk(nxt) * kv_row);
        }
        step_lines.back()[r] = list(l);
      }
      flush();
    }
    // Phase B: the row ring; at step v rank (i, j) holds the query side of row member j + v.
    if (pc > 1) {
      step("row ring: own query block out (phase B)");
      for (int r = 0; r < P; ++r) {
        const int i = g.row(r), j = g.col(r);
        const int left = g.rank(i, md(j - 1, pc)), right = g.rank(i, md(j + 1, pc));
        std::vector<std::string> l;
        send(l, r, std::string(q_side) + "[rank " + std::to_string(r) + "]", left, B * nq(r) * q_row);
        receive(l, r, std::string(q_side) + "[rank " + std::to_string(right) + "]", right, B * nq(right) * q_row);
        step_lines.back()[r] = list(l);
      }
      flush();
    }
    for (int v = 1; v < pc; ++v) {
      step("row ring " + std::to_string(v) + " of " + std::to_string(pc - 1) + " (phase B)");
      for (int r = 0; r < P; ++r) {
        const int i = g.row(r), j = g.col(r);
        const int left = g.rank(i, md(j - 1, pc)), right = g.rank(i, md(j + 1, pc));
        const int mv = g.rank(i, md(j + v, pc)), mn = g.rank(i, md(j + v + 1, pc));
        const std::string qm = std::string(q_side) + "[rank " + std::to_string(mv) + "]";
        std::vector<std::string> l;
        if (v + 1 < pc) {
          send(l, r, qm, left, B * nq(mv) * q_row);
          receive(l, r, std::string(q_side) + "[rank " + std::to_string(mn) + "]", right, B * nq(mn) * q_row);
        }
        const int64_t n = col_pairs(mv, j);
        computed[r] += n;
        ++blocks[r];
        l.push_back("compute " + qm + " x K,V of column " + std::to_string(j) + " (" + std::to_string(n) + " pairs)" +
                    (bw ? ", dK,dV of the column" : ""));
        if (v >= 2) l.push_back(std::string(bw ? "add" : "merge") + " the " + part + " chain of rank " +
                                std::to_string(mv) + " from the right");
        send(l, r, std::string(part) + "[rank " + std::to_string(mv) + "]", left, B * nq(mv) * part_row);
        receive(l, r, std::string(part) + "[rank " + std::to_string(mn) + "]", right, B * nq(mn) * part_row);
        if (v == pc - 1 && own_last)
          l.push_back("compute " + std::string(q_side) + "[rank " + std::to_string(r) + "] x K,V[shard " +
                      std::to_string(g.row_major(r)) + "] (" + std::to_string(pairs(r, g.row_major(r))) +
                      " pairs), merged into the chain of its own block, received into (O, LSE)");
        else if (v == pc - 1)
          l.push_back(std::string(bw ? "add" : "merge") + " the chain of its own block into " + (bw ? "dQ" : "(O, LSE)"));
        step_lines.back()[r] = list(l);
      }
      flush();
    }
    if (bw) {  // phase C, at the transport's step p_r + p_c + 1
      while (static_cast<int>(step_lines.size()) < pr + pc + 1) step_lines.emplace_back(P);
      step("dK,dV reduce-scattered in the column, summed in member order (phase C)");
      for (int r = 0; r < P; ++r) {
        const int i = g.row(r), j = g.col(r), rt = g.row_major(r);
        std::vector<std::string> l;
        for (int ii = 0; ii < pr; ++ii) {
          if (ii == i) continue;
          const int x = g.rank(ii, j), sx = g.row_major(x);
          send(l, r, "dK,dV[shard " + std::to_string(sx) + "]", x, B * nk(sx) * dkv_row);
          receive(l, r, "dK,dV[shard " + std::to_string(rt) + "]", x, B * nk(rt) * dkv_row);
        }
        step_lines.back()[r] = l.empty() ? "nothing (a column of one)" : list(l);
      }
      flush();
      transpose(true);
    }
    appendf(out, "work and bytes per rank (closed form 7.26):\n");
    for (int r = 0; r < P; ++r) {
      const int64_t cs = attention2d_bytes(ph, p, g, qp, kp, r, true, w, true);
      const int64_t cr = attention2d_bytes(ph, p, g, qp, kp, r, false, w, true);
      int64_t no_pairs = 0;  // the row's queries x the column's keys
      for (int jj = 0; jj < pc; ++jj) no_pairs += col_pairs(g.rank(g.row(r), jj), g.col(r));
      const bool match = sent[r] == cs && recv[r] == cr && computed[r] == no_pairs;
      ok = ok && match;
      appendf(out, "  rank %d: %lld blocks, %lld pairs (Attention2D-NO: 1 block, %lld pairs); sent %lld B (closed form "
                  "%lld), received %lld B (closed form %lld)%s\n",
              r, static_cast<long long>(blocks[r]), static_cast<long long>(computed[r]),
              static_cast<long long>(no_pairs), static_cast<long long>(sent[r]), static_cast<long long>(cs),
              static_cast<long long>(recv[r]), static_cast<long long>(cr), match ? "" : "  NO");
    }
  }
  return {out, ok};
}

}  // namespace

// spec §7.11: Attention2D's grid: where each rank sits, what it gathers in its row and column,
// the one block it computes, and the bytes of (7.22)-(7.23); overlapped (§7.13): step by step.
Trace attention2d_trace(const Plan& pl, ElemBytes w, bool fwd, bool bwd, bool overlap) {
  if (overlap) return attention2d_o_steps(pl, w, fwd, bwd);
  const Problem& p = pl.p;
  const Partition &qp = pl.qp, &kp = pl.kp;
  const int64_t eb = w.t;
  std::string out;
  const Grid& g = pl.grid;
  const int P = g.size();  // the world, checked by the plan (check_attention2d)
  appendf(out, "\nattention2d: grid %d x %d (rank p = i + j p_r is row i, column j), striped inputs\n", g.p_r, g.p_c);
  for (int r = 0; r < P; ++r) {
    const int i = g.row(r), j = g.col(r);
    int64_t pairs = 0;
    std::string qfrom, kvfrom;
    for (int jj = 0; jj < g.p_c; ++jj) qfrom += (qfrom.empty() ? "" : ",") + std::to_string(g.rank(i, jj));
    for (int ii = 0; ii < g.p_r; ++ii) kvfrom += (kvfrom.empty() ? "" : ",") + std::to_string(g.rank(ii, j));
    for (int jj = 0; jj < g.p_c; ++jj)
      for (int ii = 0; ii < g.p_r; ++ii) pairs += block_pairs(pl, g.rank(i, jj), g.row_major(g.rank(ii, j)));
    appendf(out, "  rank %d (row %d, col %d): K,V transposed to shard %d; gathers Q of row {%s} (tokens = %d mod %d), "
                "K,V of column {%s} (tokens = %d mod %d); computes 1 block (%lld pairs); reduce-scatters (O, LSE) "
                "in its row with the merge (4.5)\n",
                r, i, j, g.row_major(r), qfrom.c_str(), i, g.p_r, kvfrom.c_str(), j, g.p_c,
                static_cast<long long>(pairs));
  }
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    if ((ph == Phase::Forward && !fwd) || (ph == Phase::Backward && !bwd)) continue;
    appendf(out, "%s bytes per rank (closed form 7.22-7.23):", to_string(ph).c_str());
    for (int r = 0; r < P; ++r)
      appendf(out, " r%d sent %lld recv %lld;", r,
                  static_cast<long long>(attention2d_bytes(ph, p, g, qp, kp, r, true, eb)),
                  static_cast<long long>(attention2d_bytes(ph, p, g, qp, kp, r, false, eb)));
    appendf(out, "\n");
  }
  return {out, true};
}

// spec §7.14: the all-to-all inside each group of u ranks, the ring across the G/u groups (on H/u
// heads and the group shards; ring rank g is group g, run by its members i = 0..u-1 at once), the
// all-to-all back; bytes per rank next to (7.27).
Trace usp_trace(const Plan& pl, ElemBytes w, bool fwd, bool bwd) {
  const Problem& p = pl.p;
  const Partition &qp = pl.qp, &kp = pl.kp;
  const int G = qp.G, u = pl.o.ulysses_degree, Gg = G / u;
  const int64_t B = p.B, d = p.d, Hu = p.H_q / u, Hkvu = p.H_kv / u, t = w.t, a = w.a;
  const Problem hp = usp_head_problem(p, u);
  const Partition gq = usp_group_partition(qp, u), gk = usp_group_partition(kp, u);
  std::string out;
  bool ok = true;
  for (Phase ph : {Phase::Forward, Phase::Backward}) {
    if ((ph == Phase::Forward && !fwd) || (ph == Phase::Backward && !bwd)) continue;
    const bool bw = ph == Phase::Backward;
    const Schedule& ring = bw ? pl.bwd : pl.fwd;
    // Bytes per row and head: in Q (, dO, LSE, D) and K, V; back (O, LSE) or dQ, and dK, dV.
    const int64_t in_q = bw ? 2 * d * t + 2 * a : d * t, in_kv = 2 * d * t;
    const int64_t out_q = bw ? d * a : d * t + a, out_kv = bw ? 2 * d * a : 0;
    std::vector<int64_t> sent(G, 0), recv(G, 0);
    appendf(out, "\nusp %s: G=%d = %d groups x u=%d (rank r = g u + i: member i of group g), N_q=%lld, N_k=%lld, "
            "%lld-byte elements (%lld-byte accumulators)\n",
            to_string(ph).c_str(), G, Gg, u, static_cast<long long>(p.N_q), static_cast<long long>(p.N_k),
            static_cast<long long>(t), static_cast<long long>(a));
    appendf(out, "before: rank r holds its sequence rows of every head (H_q=%lld, H_kv=%lld)%s\n",
            static_cast<long long>(p.H_q), static_cast<long long>(p.H_kv),
            bw ? "; D = rowsum(dO o O) computed at home (5.1)" : "");
    for (int r = 0; r < G; ++r)
      appendf(out, "  rank %d (group %d, member %d): q rows %s, kv rows %s\n", r, r / u, r % u, rows_of(qp, r).c_str(),
              rows_of(kp, r).c_str());
    appendf(out, "all-to-all 1, inside each group: sequence -> heads of %s,K,V (rank r sends member j its rows of "
            "head block j)\n", bw ? "Q,dO,LSE,D" : "Q");
    exchange_lines(
        out, u, 1, sent, recv,
        [&](int r, int) { return B * (Hu * qp.local_size(r) * in_q + Hkvu * kp.local_size(r) * in_kv); },
        [&](int j) { return " (q heads " + heads(j * Hu, Hu) + ", kv heads " + heads(j * Hkvu, Hkvu) + ")"; });
    appendf(out, "after: member i of group g holds the group's rows (its members' shards end to end) of q heads "
            "[i Hu, (i+1) Hu) and kv heads [i Hkvu, (i+1) Hkvu) (Hu=%lld, Hkvu=%lld)\n",
            static_cast<long long>(Hu), static_cast<long long>(Hkvu));
    for (int g = 0; g < Gg; ++g)
      appendf(out, "  group %d (ranks %d..%d): q rows %s, kv rows %s\n", g, g * u, g * u + u - 1, rows_of(gq, g).c_str(),
              rows_of(gk, g).c_str());
    appendf(out, "ring across the %d groups: ranks with the same member index i run it on their head block; ring rank "
            "g = group g, its peers g +- 1 are world ranks (g +- 1) u + i\n", Gg);
    out += trace(ring, hp, gq, gk, w);
    for (int r = 0; r < G; ++r) {
      sent[r] += schedule_bytes(ring, r / u, true, w);
      recv[r] += schedule_bytes(ring, r / u, false, w);
    }
    appendf(out, "all-to-all 2, inside each group: heads -> sequence of %s (rank r sends member j the rows of j's "
            "shard of head block i)\n", bw ? "dQ,dK,dV" : "O,LSE");
    exchange_lines(
        out, u, 1, sent, recv,
        [&](int, int s) { return B * (Hu * qp.local_size(s) * out_q + Hkvu * kp.local_size(s) * out_kv); }, no_note);
    appendf(out, "after: rank r holds %s of its own sequence rows of every head\n", bw ? "dQ, dK, dV" : "O, LSE");
    appendf(out, "bytes per rank (spec 7.27):\n");
    for (int r = 0; r < G; ++r) {
      const int64_t cs = usp_bytes(pl.o.base, ph, p, qp, kp, u, r, true, w);
      const int64_t cr = usp_bytes(pl.o.base, ph, p, qp, kp, u, r, false, w);
      const bool match = sent[r] == cs && recv[r] == cr;
      ok = ok && match;
      appendf(out, "  rank %d: sent %lld B (closed form %lld), received %lld B (closed form %lld)%s\n", r,
              static_cast<long long>(sent[r]), static_cast<long long>(cs), static_cast<long long>(recv[r]),
              static_cast<long long>(cr), match ? "" : "  NO");
    }
  }
  if (!ok) appendf(out, "FAIL: traced bytes differ from the closed forms of spec §7.14\n");
  return {out, ok};
}

}  // namespace burstlab::dist
