// distributed/comm.cpp — accounting and the generic collectives (spec §7.4).
#include "comm.hpp"

#include <cstring>

#include "burstlab/error.hpp"

namespace burstlab::dist {

std::string to_string(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Other: return "other";
  }
  return "?";
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
  if (batch_open_) fail("rank ", rank(), ": begin_batch in ", context(), " while a batch is open (batches do not nest)");
  batch_open_ = true;
  ++batch_seq_;
}

void Communicator::end_batch() {
  if (!batch_open_) fail("rank ", rank(), ": end_batch in ", context(), " without begin_batch");
  batch_open_ = false;
}

void Communicator::barrier() {
  // Zero-byte messages to and from every peer: returns once every rank has entered.
  const int G = size(), r = rank(), tag = next_collective_tag();
  std::vector<RequestPtr> reqs;
  char dummy_in[1], dummy_out[1] = {0};
  {
    Batch batch(*this);
    for (int k = 1; k < G; ++k) {
      reqs.push_back(irecv(dummy_in, 0, (r - k + G) % G, tag, "barrier"));
      reqs.push_back(isend(dummy_out, 0, (r + k) % G, tag, "barrier"));
    }
  }
  wait_all(reqs);
}

}  // namespace burstlab::dist
