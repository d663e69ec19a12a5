// distributed/double_ring.cpp — spec §7.9.
#include "double_ring.hpp"

#include "burstlab/error.hpp"

namespace burstlab::dist {

namespace {
int mod(int a, int m) { return ((a % m) + m) % m; }
void check(int G, int K) {
  if (K < 1 || G % K != 0)
    fail("gpus_per_node (", K, ") must be >= 1 and divide the world size G (", G, ") for the double ring");
}
}  // namespace

void check_double_ring(int G, int K) { check(G, K); }

int double_ring_shard(int r, int t, int G, int K) {
  check(G, K);
  const int M = G / K, n = r / K, g = r % K, a = t / K, b = t % K;
  return mod(n - a, M) * K + mod(g - b, K);
}

bool double_ring_inter_hop(int t, int G, int K) {
  check(G, K);
  return G / K > 1 && t % K == K - 1;
}

Schedule make_double_ring_schedule(Algo base, Phase phase, const Problem& p, const MaskData& mask,
                                   const Partition& qp, const Partition& kp, int K, bool prefetch_inter) {
  check_ring_partitions(p, qp, kp);
  const int G = qp.G;
  check(G, K);
  const auto& items = travelling_items(base, phase);
  const MaskParams m = mask.params();
  const bool q_travels = items[0].q_side;
  auto elems = [&](const Item& it, int shard) { return item_elems(it, p, qp, kp, shard); };
  Schedule s = empty_schedule(base, phase, G);
  for (int r = 0; r < G; ++r) {
    const int n = r / K, g = r % K, M = G / K;
    for (int t = 0; t < G; ++t) {
      RankStep& st = s.steps[r][t];
      const int travelling = double_ring_shard(r, t, G, K);
      st.q_shard = q_travels ? travelling : r;
      st.k_shard = q_travels ? r : travelling;
      list_blocks(st, m, qp, kp);
      if (G == 1) continue;
      // After step t: intra hop (n, g) -> (n, g+1), or at the end of a node round the inter
      // hop (n, g) -> (n+1, g+1); receives mirror it.
      const bool round_end = t % K == K - 1;
      const int next = round_end ? mod(n + 1, M) * K + mod(g + 1, K) : n * K + mod(g + 1, K);
      const int prev = round_end ? mod(n - 1, M) * K + mod(g - 1, K) : n * K + mod(g - 1, K);
      const bool last = t == G - 1;
      // Prefetch (read-only tensors, M > 1 and K > 1): no hop at a round end; instead, at a
      // round start (t = aK, a < M-1) the held shard also goes to (n+1, g), landing at step
      // (a+1)K, where (n+1, g) holds ((n-a) mod M) K + g by (7.14). Tags t*16 + 8 + i keep it
      // apart from the intra hop of the same step (at most 5 items).
      const bool pf = prefetch_inter && M > 1 && K > 1;
      const int a = t / K;
      for (int i = 0; i < static_cast<int>(items.size()); ++i) {
        const Item& it = items[i];
        if (last && !it.accumulated) continue;
        if (pf && !it.accumulated) {
          if (t % K == 0 && a < M - 1) {
            const int lands = (a + 1) * K, incoming = double_ring_shard(r, lands, G, K);
            Message snd{it.name, i, travelling, mod(n + 1, M) * K + g, t * 16 + 8 + i, elems(it, travelling), false};
            Message rcv{it.name, i, incoming, mod(n - 1, M) * K + g, t * 16 + 8 + i, elems(it, incoming), false};
            snd.lands = rcv.lands = lands;
            st.sends.push_back(snd);
            st.recvs.push_back(rcv);
          }
          if (round_end) continue;  // the next shard is the prefetched one
        }
        const int incoming = last ? r : double_ring_shard(r, t + 1, G, K);
        st.sends.push_back(Message{it.name, i, travelling, next, t * 16 + i, elems(it, travelling), it.accumulated});
        st.recvs.push_back(Message{it.name, i, incoming, prev, t * 16 + i, elems(it, incoming), it.accumulated});
      }
    }
  }
  if (phase == Phase::Backward) overlap_partial_sums(s);  // the hop after step t crosses the same link
  return s;
}

int64_t double_ring_bytes(Algo base, Phase phase, const Problem& p, const Partition& qp, const Partition& kp, int r,
                          bool sent, ElemBytes w, int K, int link, bool prefetch_inter) {
  const int G = qp.G;
  check(G, K);
  if (G == 1) return 0;
  const int64_t B = p.B, d = p.d;
  // Bytes per row of the shard crossing one hop (spec eq. 7.15): read-only and accumulated
  // (T for K, V, Q, dO; A for D, LSE, dQ, dK, dV).
  const int64_t t_ = w.t, a_ = w.a;
  int64_t ro_q = 0, ro_k = 0, acc_q = 0, acc_k = 0;  // per q row / per kv row
  if (phase == Phase::Forward) ro_k = 2 * B * p.H_kv * d * t_;                                    // K, V
  else if (base == Algo::Ring) { ro_k = 2 * B * p.H_kv * d * t_; acc_k = 2 * B * p.H_kv * d * a_; }  // K, V; dK, dV
  else { ro_q = B * p.H_q * (2 * d * t_ + 2 * a_); acc_q = B * p.H_q * d * a_; }                   // Q, dO, D, LSE; dQ
  const int M = G / K;
  const bool pf = prefetch_inter && M > 1 && K > 1;
  auto ro = [&](int shard) { return ro_q * qp.local_size(shard) + ro_k * kp.local_size(shard); };
  auto acc = [&](int shard) { return acc_q * qp.local_size(shard) + acc_k * kp.local_size(shard); };
  int64_t e = 0;
  for (int t = 0; t < G; ++t) {
    const bool inter = double_ring_inter_hop(t, G, K);
    const bool in_class = link < 0 || inter == (link == 1);
    // Sent: the shard held at step t; received: the one held at step t + 1 (home after G-1).
    const int shard = sent ? double_ring_shard(r, t, G, K) : (t == G - 1 ? r : double_ring_shard(r, t + 1, G, K));
    if (in_class && t > 0) e += acc(shard);  // step 0's contribution stays home (spec §7.3)
    if (t == G - 1) continue;  // read-only tensors make G - 1 hops
    if (!pf) {
      if (in_class) e += ro(shard);
      continue;
    }
    // Prefetch: intra hops after the non-final steps of a round; the inter hop posted at a
    // round start t = aK (a < M-1) carries the shard held at t and delivers the one of (a+1)K.
    const int a = t / K;
    if (t % K != K - 1 && link != 1) e += ro(shard);
    if (t % K == 0 && a < M - 1 && link != 0)
      e += ro(sent ? double_ring_shard(r, t, G, K) : double_ring_shard(r, (a + 1) * K, G, K));
  }
  return e;
}

}  // namespace burstlab::dist
