// distributed/sim_run.hpp — one algorithm of the table (algorithm.hpp) end to end (spec §7):
// partition the global inputs, run the forward (and backward) pass of every rank, and return
// every rank's local outputs plus the schedules and transfer logs. The tests, the seam bench and
// `burstlab run --algo ...` share it. Plus host helpers to slice global tensors by a partition
// (for the oracle's slice of each rank) and to gather local results back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "burstlab/engine.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"
#include "schedule.hpp"
#include "sim_comm.hpp"
#include "algorithm.hpp"

namespace burstlab::dist {

template <class T>
struct DistResult {
  using A = acc_t<T>;
  Partition qp, kp;
  Schedule fwd, bwd;  // bwd empty (G = 0 steps) when !backward
  // [rank] local outputs, BHSD over the rank's local length (partition order); O in the storage
  // type, LSE and the gradients in the accumulation type (spec §9.1).
  std::vector<Tensor4<T>> O;
  std::vector<Tensor4<A>> dQ, dK, dV;
  std::vector<Tensor3<A>> LSE;
  std::vector<std::vector<Transfer>> logs;  // [rank]
};

// One algorithm of the table (algorithm.hpp) on one problem, one pass at a time, keeping each
// rank's shard in engine memory between passes (so a backward uses the forward's own O and LSE,
// spec §9). forward() and backward() run every rank on a fresh SimWorld (threads; a barrier ends
// each pass); rank_pass() is one rank's pass on any world, for transports that run a rank per
// process or per GPU. `local` names the ranks whose shards this session holds (empty: every
// rank, as SimComm runs them all in one process); such a transport builds one session per rank
// with local = {rank}, on that rank's engine. The logs keep the latest run of each phase.
template <class T>
class Session {
 public:
  Session(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
          View4<const double> dO, const AlgoOptions& o, Engine<T>& engine, std::vector<int> local = {});
  void forward();   // throws Error when a rank failed; see errors()
  void backward();  // after forward() or load_forward(); needs dO and o.backward
  // In place of forward(): the forward's outputs computed earlier, GLOBAL O (B, H_q, N_q, d) and
  // LSE (B, H_q, N_q) in double, any layout, rounded to T and A (exact when they came from this
  // T). A checkpointed layer keeps O and LSE and hands them back here, so the backward that follows
  // never reruns the forward (spec §11.4).
  void load_forward(View4<const double> O, View3<const double> LSE);
  void rank_pass(Phase phase, Communicator& comm);  // this rank's shard, on comm's world
  // Downloads the outputs of the ranks held here (and the logs so far); other ranks' tensors stay
  // empty.
  DistResult<T> result() const;
  const std::vector<std::string>& errors() const { return errors_; }
  const Plan& plan() const { return plan_; }
  const Partition& qp() const { return plan_.qp; }
  const Partition& kp() const { return plan_.kp; }

 private:
  void run(Phase phase);
  Plan plan_;
  Engine<T>& e_;
  PreparedMask prepared_;  // plan_.mask in engine memory, once per session
  std::vector<std::vector<Transfer>> logs_;
  std::vector<Shard<T>> shards_;
  std::vector<std::string> errors_;
  bool have_forward_ = false;
};

// A Session's forward, then its backward when o.backward: every rank's outputs. Q (B, H_q, N_q,
// d), K, V (B, H_kv, N_k, d), dO (B, H_q, N_q, d; may be null-data when !o.backward), any
// layout, in double: each rank receives its slice rounded to T. The engine is shared by the rank
// threads, so it must be thread-safe (the CPU and CUDA engines are). Throws Error when any rank
// failed; each rank's error ("" = ok) goes to *rank_errors when given, also when it throws.
template <class T>
DistResult<T> run_session(const Problem& p, View4<const double> Q, View4<const double> K, View4<const double> V,
                          View4<const double> dO, const AlgoOptions& o, Engine<T>& engine,
                          std::vector<std::string>* rank_errors = nullptr);

// Every rank's outputs downloaded from engine memory into `res` (which holds the partitions):
// O, LSE, and dQ, dK, dV when `backward`. A shard that holds no inputs (a rank of another
// process) gives empty tensors.
template <class T>
void download_outputs(Engine<T>& e, const Problem& p, const std::vector<Shard<T>>& shards, bool backward,
                      DistResult<T>& res);

// Each rank's slices of Q, K, V (and dO when `backward`),
// rounded to T, in engine memory: Q, dO (B, H_q, n_q, d), K, V (B, H_kv, n_k, d) per rank; only
// the ranks in `local` (empty: all) get theirs, the others' shards stay empty.
template <class T>
std::vector<Shard<T>> upload_shards(Engine<T>& e, View4<const double> Q, View4<const double> K,
                                    View4<const double> V, View4<const double> dO, const Partition& qp,
                                    const Partition& kp, bool backward, const std::vector<int>& local = {});
// One pass on a fresh SimWorld(world, sim): body(comm) on every rank, then a barrier (every rank
// observes a failure of any other rank). `logs` keep only the latest run of each phase; `errors`
// gets every rank's outcome, also when a rank failed and this throws Error.
void run_pass(int world, const SimOptions& sim, Phase phase, std::vector<std::vector<Transfer>>& logs,
              std::vector<std::string>& errors, const std::function<void(Communicator&)>& body);

// Host helpers. slice: the rows of `global` a rank holds, in local order, as BHSD (any T -> U).
template <class U, class T>
Tensor4<U> slice(View4<const T> global, const Partition& part, int rank);
template <class U, class T>
Tensor3<U> slice(View3<const T> global, const Partition& part, int rank);
// gather: the inverse; locals[r] are BHSD over rank r's local length. Result BHSD (B, H, N, d).
template <class T>
Tensor4<T> gather(const std::vector<Tensor4<T>>& locals, const Partition& part);
template <class T>
Tensor3<T> gather(const std::vector<Tensor3<T>>& locals, const Partition& part);

}  // namespace burstlab::dist
