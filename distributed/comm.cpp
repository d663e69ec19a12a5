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
  log_.push_back(std::move(t));
}

// Collective tags live above 2^24; point-to-point users keep below.
int Communicator::next_collective_tag() { return (1 << 24) + (collective_seq_++ % (1 << 20)); }

void Communicator::all_gather(const void* send, int64_t bytes, void* recv) {
  const int G = size(), r = rank(), tag = next_collective_tag();
  auto* out = static_cast<unsigned char*>(recv);
  std::vector<RequestPtr> reqs;
  for (int k = 1; k < G; ++k) {
    const int src = (r - k + G) % G, dst = (r + k) % G;
    reqs.push_back(irecv(out + src * bytes, bytes, src, tag, "all_gather"));
    reqs.push_back(isend(send, bytes, dst, tag, "all_gather"));
  }
  std::memcpy(out + r * bytes, send, static_cast<size_t>(bytes));
  wait_all(reqs);
}

void Communicator::all_to_all(const void* send, int64_t bytes_per_rank, void* recv) {
  const int G = size(), r = rank(), tag = next_collective_tag();
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  std::vector<RequestPtr> reqs;
  for (int k = 1; k < G; ++k) {
    const int src = (r - k + G) % G, dst = (r + k) % G;
    reqs.push_back(irecv(out + src * bytes_per_rank, bytes_per_rank, src, tag, "all_to_all"));
    reqs.push_back(isend(in + dst * bytes_per_rank, bytes_per_rank, dst, tag, "all_to_all"));
  }
  std::memcpy(out + r * bytes_per_rank, in + r * bytes_per_rank, static_cast<size_t>(bytes_per_rank));
  wait_all(reqs);
}

void Communicator::reduce_scatter(const void* send, int64_t bytes_per_rank, void* recv,
                                  const Reduce& op) {
  const int G = size(), r = rank(), tag = next_collective_tag();
  const auto* in = static_cast<const unsigned char*>(send);
  std::vector<unsigned char> segs(static_cast<size_t>(G * bytes_per_rank));  // [src] segment r
  std::vector<RequestPtr> reqs;
  for (int k = 1; k < G; ++k) {
    const int src = (r - k + G) % G, dst = (r + k) % G;
    reqs.push_back(irecv(segs.data() + src * bytes_per_rank, bytes_per_rank, src, tag, "reduce_scatter"));
    reqs.push_back(isend(in + dst * bytes_per_rank, bytes_per_rank, dst, tag, "reduce_scatter"));
  }
  std::memcpy(segs.data() + r * bytes_per_rank, in + r * bytes_per_rank, static_cast<size_t>(bytes_per_rank));
  wait_all(reqs);
  std::memcpy(recv, segs.data(), static_cast<size_t>(bytes_per_rank));  // rank order 0, 1, ...
  for (int s = 1; s < G; ++s) op(recv, segs.data() + s * bytes_per_rank, bytes_per_rank);
}

void Communicator::barrier() {
  // Zero-byte messages to and from every peer: returns once every rank has entered.
  const int G = size(), r = rank(), tag = next_collective_tag();
  std::vector<RequestPtr> reqs;
  char dummy_in[1], dummy_out[1] = {0};
  for (int k = 1; k < G; ++k) {
    reqs.push_back(irecv(dummy_in, 0, (r - k + G) % G, tag, "barrier"));
    reqs.push_back(isend(dummy_out, 0, (r + k) % G, tag, "barrier"));
  }
  wait_all(reqs);
}

}  // namespace burstlab::dist
