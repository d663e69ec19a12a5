// distributed/schedule.cpp — spec §7.2 (schedules) and §7.5 (closed forms).
#include "schedule.hpp"

#include <algorithm>
#include <sstream>

#include "burstlab/error.hpp"

namespace burstlab::dist {

std::string to_string(Algo a) { return a == Algo::Ring ? "ring" : "burst"; }
const std::vector<Item>& travelling_items(Algo a, Phase phase) {
  //                                    name   q_side per_row accumulated acc
  static const std::vector<Item> fwd = {{"K", false, false, false, false}, {"V", false, false, false, false}};
  static const std::vector<Item> ring_bwd = {{"K", false, false, false, false}, {"V", false, false, false, false},
                                             {"dK", false, false, true, true}, {"dV", false, false, true, true}};
  static const std::vector<Item> burst_bwd = {{"Q", true, false, false, false},  {"dO", true, false, false, false},
                                              {"D", true, true, false, true},    {"LSE", true, true, false, true},
                                              {"dQ", true, false, true, true}};
  if (phase == Phase::Forward) return fwd;
  if (phase == Phase::Backward) return a == Algo::Ring ? ring_bwd : burst_bwd;
  fail("schedule phase (", to_string(phase), ") must be forward or backward");
}

namespace {
// First b >= 0 with start + b * step >= x.
int64_t first_at_least(int64_t start, int64_t step, int64_t x) {
  return x <= start ? 0 : (x - start + step - 1) / step;
}
int mod(int a, int G) { return ((a % G) + G) % G; }
}  // namespace

int64_t visible_in(const MaskParams& m, const Chunk& q, const Chunk& k) {
  if (q.step == 1 && k.step == 1) return count_visible(m, q.start, q.start + q.n, k.start, k.start + k.n);
  int64_t total = 0;
  for (int64_t a = 0; a < q.n; ++a) {
    const int64_t i = q.global(a);
    if (m.block) {
      for (int64_t b = 0; b < k.n; ++b) total += visible(m, i, k.global(b)) ? 1 : 0;
      continue;
    }
    int64_t lo, hi;
    row_range(m, i, &lo, &hi);
    if (lo >= hi) continue;
    const int64_t b0 = std::min(k.n, first_at_least(k.start, k.step, lo));
    const int64_t b1 = std::min(k.n, first_at_least(k.start, k.step, hi));
    total += b1 - b0;
  }
  return total;
}

void check_ring_partitions(const Problem& p, const Partition& qp, const Partition& kp) {
  if (qp.G != kp.G) fail("q partition G (", qp.G, ") must equal kv partition G (", kp.G, ")");
  if (qp.N != p.N_q) fail("q partition N (", qp.N, ") must equal N_q (", p.N_q, ")");
  if (kp.N != p.N_k) fail("kv partition N (", kp.N, ") must equal N_k (", p.N_k, ")");
}

Schedule empty_schedule(Algo algo, Phase phase, int G) {
  Schedule s;
  s.algo = algo;
  s.phase = phase;
  s.G = G;
  s.steps.assign(G, std::vector<RankStep>(G));
  return s;
}

int64_t item_elems(const Item& it, const Problem& p, const Partition& qp, const Partition& kp, int shard) {
  const int64_t H = it.q_side ? p.H_q : p.H_kv;
  const int64_t n = it.q_side ? qp.local_size(shard) : kp.local_size(shard);
  return p.B * H * n * (it.per_row ? 1 : p.d);
}

void list_blocks(RankStep& st, const MaskParams& m, const Partition& qp, const Partition& kp) {
  for (int qc : qp.rank_chunks[st.q_shard])
    for (int kc : kp.rank_chunks[st.k_shard]) {
      BlockTask b{qc, kc, visible_in(m, qp.chunks[qc], kp.chunks[kc])};
      (b.visible > 0 ? st.blocks : st.skipped).push_back(b);
    }
}

Schedule make_schedule(Algo algo, Phase phase, const Problem& p, const MaskData& mask,
                       const Partition& qp, const Partition& kp) {
  check_ring_partitions(p, qp, kp);
  const auto& items = travelling_items(algo, phase);
  const MaskParams m = mask.params();
  const int G = qp.G;
  const bool q_travels = items[0].q_side;  // burst backward: the queries travel
  auto elems = [&](const Item& it, int shard) { return item_elems(it, p, qp, kp, shard); };
  Schedule s = empty_schedule(algo, phase, G);
  for (int r = 0; r < G; ++r) {
    const int next = mod(r + 1, G), prev = mod(r - 1, G);
    for (int t = 0; t < G; ++t) {
      RankStep& st = s.steps[r][t];
      const int travelling = mod(r - t, G);  // shard held at step t
      st.q_shard = q_travels ? travelling : r;
      st.k_shard = q_travels ? r : travelling;
      list_blocks(st, m, qp, kp);
      if (G == 1) continue;
      for (int i = 0; i < static_cast<int>(items.size()); ++i) {
        const Item& it = items[i];
        const bool last = t == G - 1;
        if (last && !it.accumulated) continue;  // read-only tensors stop after G-1 hops
        Message snd{it.name, i, travelling, next, t * 16 + i, elems(it, travelling), it.accumulated};
        // What r-1 sends at step t: shard (r-1-t), or at the last step its accumulated shard r.
        const int incoming = last ? r : mod(r - t - 1, G);
        Message rcv{it.name, i, incoming, prev, t * 16 + i, elems(it, incoming), it.accumulated};
        st.sends.push_back(snd);
        st.recvs.push_back(rcv);
      }
    }
  }
  if (phase == Phase::Backward) overlap_partial_sums(s);
  return s;
}

void overlap_partial_sums(Schedule& s) {
  const auto& items = travelling_items(s.algo, s.phase);
  const int G = s.G;
  for (auto& steps : s.steps) {
    // Moved messages, collected first so that none moves twice.
    std::vector<std::vector<Message>> sends(G), recvs(G);
    for (int t = 0; t < G; ++t) {
      auto split = [&](std::vector<Message>& ms, std::vector<std::vector<Message>>& moved) {
        std::vector<Message> keep;
        for (Message& m : ms) {
          if (!items[m.item].accumulated || t == G - 1) {
            keep.push_back(std::move(m));
            continue;
          }
          if (!m.after_compute || m.lands > 0)
            fail("overlap_partial_sums: accumulated message ", m.tensor, " at step ", t,
                 " must be an ordinary hop posted after the compute");
          if (t == 0) continue;  // the rank's own contribution stays home
          m.after_compute = false;
          moved[t + 1].push_back(std::move(m));
        }
        ms = std::move(keep);
      };
      split(steps[t].sends, sends);
      split(steps[t].recvs, recvs);
    }
    for (int t = 0; t < G; ++t) {
      for (Message& m : sends[t]) steps[t].sends.push_back(std::move(m));
      for (Message& m : recvs[t]) steps[t].recvs.push_back(std::move(m));
    }
  }
}

Work work(const Schedule& s, int rank) {
  Work w;
  for (const RankStep& st : s.steps.at(rank))
    for (const BlockTask& b : st.blocks) {
      ++w.blocks;
      w.pairs += b.visible;
    }
  return w;
}

int64_t schedule_bytes(const Schedule& s, int rank, bool sent, ElemBytes elem_bytes, int step) {
  const auto& items = travelling_items(s.algo, s.phase);
  int64_t total = 0;
  for (int t = 0; t < s.G; ++t) {
    if (step >= 0 && t != step) continue;
    const RankStep& st = s.steps.at(rank).at(t);
    for (const Message& m : sent ? st.sends : st.recvs) total += m.elems * elem_bytes.of(items[m.item]);
  }
  return total;
}

int64_t closed_form_bytes(Algo algo, Phase phase, const Problem& p, const Partition& qp,
                          const Partition& kp, int r, bool sent, ElemBytes w, int step) {
  const int G = qp.G;
  if (G == 1) return 0;  // nothing moves
  const int64_t B = p.B, Hq = p.H_q, Hkv = p.H_kv, d = p.d, Nq = p.N_q, Nk = p.N_k;
  auto nq = [&](int s) { return qp.local_size(mod(s, G)); };
  auto nk = [&](int s) { return kp.local_size(mod(s, G)); };
  // Read-only tensors: at step t rank r sends shard r - t and receives shard r - t - 1; in total
  // it sends every shard but r + 1 (G - 1 hops) and receives every shard but r.
  // Partial sums (overlap_partial_sums): before the compute of step t >= 2 rank r sends the sum
  // of shard r - t + 1 and receives that of shard r - t; after step G - 1 it sends shard r + 1's
  // and receives its own. In total it sends every shard but r and receives every shard but r - 1.
  const int missing = sent ? r + 1 : r;
  const int missing_sum = missing - 1;
  auto sum_shard = [&](int step_) { return sent ? r - step_ + 1 : r - step_; };
  // Bytes in T (K, V, Q, dO) plus bytes in A (LSE, D, dQ, dK, dV); for t = a these are the
  // single-width forms (7.1)-(7.6).
  const int64_t t = w.t, a = w.a;
  if (phase == Phase::Forward) {
    if (step < 0) return t * 2 * B * Hkv * d * (Nk - nk(missing));                           // (7.1)
    if (step < G - 1) return t * 2 * B * Hkv * d * nk(sent ? r - step : r - step - 1);       // (7.2)
    return 0;
  }
  // Per step: the read-only hop (t < G-1), the partial sum of the previous step (t >= 2) and
  // the hop home (t = G-1).
  auto per_step = [&](auto ro, auto sum) {
    int64_t e = 0;
    if (step < G - 1) e += ro(sent ? r - step : r - step - 1);
    if (step >= 2) e += sum(sum_shard(step));
    if (step == G - 1) e += sum(sent ? r + 1 : r);
    return e;
  };
  if (algo == Algo::Ring) {
    if (step < 0) return 2 * B * Hkv * d * (t * (Nk - nk(missing)) + a * (Nk - nk(missing_sum)));  // (7.3)
    return per_step([&](int s) { return 2 * B * Hkv * d * t * nk(s); },                          // (7.4)
                    [&](int s) { return 2 * B * Hkv * d * a * nk(s); });
  }
  if (step < 0) return B * Hq * ((2 * d * t + 2 * a) * (Nq - nq(missing)) + d * a * (Nq - nq(missing_sum)));  // (7.5)
  return per_step([&](int s) { return B * Hq * (2 * d * t + 2 * a) * nq(s); },                              // (7.6)
                  [&](int s) { return B * Hq * d * a * nq(s); });
}

std::string chunk_name(const Chunk& c) {
  std::ostringstream os;
  if (c.step == 1) {
    os << "[" << c.start << "," << c.start + c.n << ")";
  } else {
    os << "{" << c.start;
    if (c.n > 1) os << "," << c.global(1);
    if (c.n > 2) os << ",..";
    os << "}";
  }
  return os.str();
}

int message_pass(const Message& m, const Item& it) {
  if (m.lands > 0) return 2;
  if (m.after_compute) return 1;
  return it.accumulated ? 3 : 0;
}

std::string trace(const Schedule& s, const Problem& p, const Partition& qp, const Partition& kp,
                  ElemBytes elem_bytes) {
  std::ostringstream os;
  os << to_string(s.algo) << " " << to_string(s.phase) << ": G=" << s.G << ", partition "
     << to_string(qp.kind) << ", N_q=" << p.N_q << ", N_k=" << p.N_k << ", mask "
     << describe(p.mask) << ", ";
  if (elem_bytes.t == elem_bytes.a) os << elem_bytes.t << "-byte elements\n";
  else os << elem_bytes.t << "-byte inputs, " << elem_bytes.a << "-byte statistics and gradients\n";
  const auto& items = travelling_items(s.algo, s.phase);
  os << "  travelling:";
  for (const Item& it : travelling_items(s.algo, s.phase)) os << " " << it.name;
  os << "  (Q rows by q chunk, K rows by kv chunk; pairs = visible (i, j) pairs)\n";
  for (int t = 0; t < s.G; ++t) {
    os << "step " << t << "\n";
    for (int r = 0; r < s.G; ++r) {
      const RankStep& st = s.steps[r][t];
      os << "  rank " << r << ": compute";
      if (st.blocks.empty()) os << " nothing";
      for (const BlockTask& b : st.blocks)
        os << " Q" << chunk_name(qp.chunks[b.q_chunk]) << "xK" << chunk_name(kp.chunks[b.k_chunk])
           << "(" << b.visible << ")";
      if (!st.skipped.empty()) os << "; skip " << st.skipped.size() << " masked";
      // Group messages by (peer, shard, before/after). Pass 0: read-only before the compute;
      // 1: after it; 2: the double ring's prefetched inter-node hop (spec §7.9), in flight until
      // `lands`; 3: the previous step's partial sums, in flight during the compute (§7.3).
      auto list = [&](const std::vector<Message>& ms, bool is_send) {
        for (int pass : {3, 0, 2, 1}) {
          std::string names;
          int64_t bytes = 0;
          int peer = -1, shard = -1, lands = 0;
          for (const Message& m : ms) {
            if (message_pass(m, items[m.item]) != pass) continue;
            names += (names.empty() ? "" : ",") + m.tensor;
            bytes += m.elems * elem_bytes.of(items[m.item]);
            peer = m.peer;
            shard = m.shard;
            lands = m.lands;
          }
          if (names.empty()) continue;
          os << "; " << (pass == 2 ? "inter-node " : "") << (is_send ? (pass == 1 ? "then send " : "send ") : "recv ")
             << (pass == 3 ? "sum " : "") << names << "[shard " << shard << "] " << (is_send ? "-> " : "<- ") << peer << " (" << bytes << " B"
             << (pass == 2 ? ", in flight until step " + std::to_string(lands) : std::string()) << ")";
        }
      };
      list(st.sends, true);
      list(st.recvs, false);
      os << "\n";
    }
  }
  os << "work and bytes per rank:\n";
  for (int r = 0; r < s.G; ++r) {
    const Work w = work(s, r);
    os << "  rank " << r << ": " << w.blocks << " blocks, " << w.pairs << " pairs; sent "
       << schedule_bytes(s, r, true, elem_bytes) << " B (closed form "
       << closed_form_bytes(s.algo, s.phase, p, qp, kp, r, true, elem_bytes) << "), received "
       << schedule_bytes(s, r, false, elem_bytes) << " B (closed form "
       << closed_form_bytes(s.algo, s.phase, p, qp, kp, r, false, elem_bytes) << ")\n";
  }
  return os.str();
}

}  // namespace burstlab::dist
