// distributed/comm.cpp — accounting and the generic collectives (spec §7.4).
#include "comm.hpp"

#include <algorithm>
#include <cstring>

#include "burstlab/error.hpp"
#include "burstlab/names.hpp"

namespace burstlab::dist {

std::string to_string(Phase p) {
  static constexpr Named<Phase> names[] = {
      {Phase::Forward, "forward"}, {Phase::Backward, "backward"}, {Phase::Other, "other"}};
  return name_of(p, names);
}
std::string to_string(Link l) { return l == Link::Intra ? "intra" : "inter"; }

ByteTotals totals(const std::vector<Transfer>& log, Phase phase, int step, int link) {
  ByteTotals t;
  for (const Transfer& x : log) {
    if (x.phase != phase) continue;
    if (step >= 0 && x.step != step) continue;
    if (link >= 0 && static_cast<int>(x.link) != link) continue;
    (x.sent ? t.sent : t.recv) += x.bytes;
  }
  return t;
}

void wait_all(std::vector<RequestPtr>& reqs) {
  for (auto& r : reqs) r->wait();
  reqs.clear();
}

std::string Communicator::context() const {
  return to_string(phase_) + " step " + std::to_string(step_);
}

void Communicator::record(int src, int dst, int tag, int64_t bytes, bool sent, const char* what) {
  Transfer t;
  t.phase = phase_;
  t.step = step_;
  t.src = src;
  t.dst = dst;
  t.tag = tag;
  t.bytes = bytes;
  t.link = link_to(sent ? dst : src);
  t.sent = sent;
  t.what = what;
  t.batch = batch_open_ ? batch_seq_ : -1;
  log_.push_back(std::move(t));
}

// Collective tags live above 2^24; point-to-point users keep below.
int Communicator::next_collective_tag() { return (1 << 24) + (collective_seq_++ % (1 << 20)); }

void Communicator::begin_batch() {
  if (batch_open_) fail("rank ", rank(), ": a batch begun in ", context(), " inside another (batches do not nest)");
  batch_open_ = true;
  ++batch_seq_;
}

void Communicator::end_batch() {
  if (!batch_open_) fail("rank ", rank(), ": end_batch in ", context(), " without begin_batch");
  batch_open_ = false;
}

void Communicator::cancel_batch(const char* why) noexcept {
  (void)why;
  batch_open_ = false;
}

void Communicator::barrier() {
  // Zero-byte messages to and from every peer: returns once every rank has entered.
  const int G = size(), r = rank(), tag = next_collective_tag();
  std::vector<RequestPtr> reqs;
  char dummy_in[1], dummy_out[1] = {0};
  batch([&] {
    for (int k = 1; k < G; ++k) {
      reqs.push_back(irecv(dummy_in, 0, (r - k + G) % G, tag, "barrier"));
      reqs.push_back(isend(dummy_out, 0, (r + k) % G, tag, "barrier"));
    }
  });
  wait_all(reqs);
}

namespace {
std::string describe(const Transfer& t) {
  return t.what + " (tag " + std::to_string(t.tag) + ", " + std::to_string(t.bytes) + " bytes, " + to_string(t.phase) +
         " step " + std::to_string(t.step) + ")";
}
}  // namespace

std::string in_order_problem(const std::vector<std::vector<Transfer>>& logs) {
  const int G = static_cast<int>(logs.size());
  // Each rank's groups: consecutive entries of one batch; an entry outside any batch is its own.
  std::vector<std::vector<int>> group(G);  // [rank][entry] -> group index
  std::vector<int> n_groups(G, 0);
  for (int r = 0; r < G; ++r) {
    int g = -1, last_batch = -2;
    for (const Transfer& t : logs[r]) {
      if (t.batch < 0 || t.batch != last_batch) ++g;
      last_batch = t.batch;
      group[r].push_back(g);
    }
    n_groups[r] = g + 1;
  }
  // Pair the k-th send of (s, d) with the k-th receive: (rank, entry) of each side.
  struct Op {
    int rank, entry;
  };
  std::vector<std::vector<std::vector<Op>>> sends(G, std::vector<std::vector<Op>>(G)), recvs = sends;
  for (int r = 0; r < G; ++r)
    for (int i = 0; i < static_cast<int>(logs[r].size()); ++i) {
      const Transfer& t = logs[r][i];
      if (t.src < 0 || t.src >= G || t.dst < 0 || t.dst >= G) return "rank " + std::to_string(r) + " logs " + describe(t) + " with a peer outside the world";
      (t.sent ? sends[t.src][t.dst] : recvs[t.src][t.dst]).push_back({r, i});
    }
  // partner group of every entry
  std::vector<std::vector<std::pair<int, int>>> partner(G);  // [rank][entry] -> (rank, group)
  for (int r = 0; r < G; ++r) partner[r].assign(logs[r].size(), {-1, -1});
  for (int s = 0; s < G; ++s)
    for (int d = 0; d < G; ++d) {
      const auto& S = sends[s][d];
      const auto& R = recvs[s][d];
      const size_t n = std::min(S.size(), R.size());
      for (size_t k = 0; k < n; ++k) {
        const Transfer& a = logs[S[k].rank][S[k].entry];
        const Transfer& b = logs[R[k].rank][R[k].entry];
        if (a.tag != b.tag || a.bytes != b.bytes)
          return "message " + std::to_string(k) + " from rank " + std::to_string(s) + " to rank " + std::to_string(d) +
                 " is sent as " + describe(a) + " but received as " + describe(b) +
                 ": a transport that matches in posting order (NCCL) would pair them";
        partner[S[k].rank][S[k].entry] = {R[k].rank, group[R[k].rank][R[k].entry]};
        partner[R[k].rank][R[k].entry] = {S[k].rank, group[S[k].rank][S[k].entry]};
      }
      if (S.size() != R.size())
        return "rank " + std::to_string(s) + " sends " + std::to_string(S.size()) + " messages to rank " + std::to_string(d) +
               ", which receives " + std::to_string(R.size());
    }
  // Replay: a rank's current group completes once every partner's group is running (current) or
  // done; groups of one rank run in order.
  std::vector<int> cur(G, 0);
  std::vector<std::vector<int>> first_entry(G);
  for (int r = 0; r < G; ++r) {
    first_entry[r].assign(n_groups[r] + 1, static_cast<int>(logs[r].size()));
    for (int i = static_cast<int>(logs[r].size()) - 1; i >= 0; --i) first_entry[r][group[r][i]] = i;
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < G; ++r) {
      if (cur[r] >= n_groups[r]) continue;
      bool ready = true;
      for (int i = first_entry[r][cur[r]]; i < static_cast<int>(logs[r].size()) && group[r][i] == cur[r]; ++i) {
        const auto [pr, pg] = partner[r][i];
        if (pg > cur[pr]) ready = false;
      }
      if (ready) {
        ++cur[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < G; ++r) {
    if (cur[r] >= n_groups[r]) continue;
    for (int i = first_entry[r][cur[r]]; i < static_cast<int>(logs[r].size()) && group[r][i] == cur[r]; ++i) {
      const auto [pr, pg] = partner[r][i];
      if (pg <= cur[pr]) continue;
      const Transfer& t = logs[r][i];
      const Transfer& w = logs[pr][first_entry[pr][cur[pr]]];
      return "deadlock under in-order groups: rank " + std::to_string(r) + "'s group with " + describe(t) +
             (t.sent ? " to" : " from") + " rank " + std::to_string(pr) + " waits for a later group of rank " +
             std::to_string(pr) + ", whose group with " + describe(w) +
             " runs first and cannot complete; post both sides of a message in corresponding batches";
    }
  }
  return "";
}

}  // namespace burstlab::dist
