// distributed/session.hpp — one algorithm of the table (algorithm.hpp) end to end on a World
// (world.hpp; spec §7): partition the global inputs, build each rank's engine and upload its shard,
// run the forward (and backward) pass of every rank, and return every rank's local outputs plus
// the schedules and transfer logs. `burstlab run --algo ...` (every transport), the seam bench,
// the layer and the tests share it. Plus host helpers to slice global tensors by a partition (for
// the oracle's slice of each rank) and to gather local results back.
#pragma once

#include <cstdint>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include "burstlab/any_tensor.hpp"
#include "burstlab/engine.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "comm.hpp"
#include "partition.hpp"
#include "ring.hpp"
#include "schedule.hpp"
#include "sim_comm.hpp"
#include "algorithm.hpp"
#include "world.hpp"

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

// One of a rank's outputs (DistResult's members).
enum class Output { O, LSE, dQ, dK, dV };

// Makes one rank's engine; called on that rank's thread with its device current.
template <class T>
using EngineMaker = std::function<std::unique_ptr<Engine<T>>()>;

// One algorithm of the table on one problem, one pass at a time, keeping each rank's shard in
// engine memory between passes (so a backward uses the forward's own O and LSE, spec §9). One
// plan; one engine per device (a World whose ranks share one device shares one engine, which
// must then be thread-safe: the CPU and CUDA engines are). Every pass runs every held rank
// through world.run and ends with a barrier; the logs keep the latest pass of each phase.
template <class T>
class Session {
 public:
  // Q (B, H_q, N_q, d), K, V (B, H_kv, N_k, d), dO (B, H_q, N_q, d; may be null-data when
  // !o.backward), any layout, any storage type: each held rank receives its slice rounded to T
  // (from_double<T> of each element's fp64 value).
  // `world` must outlive the session and have o.world ranks.
  Session(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
          const AnyView4& dO, const AlgoOptions& o, World& world, EngineMaker<T> make_engine);
  // Every rank on a SimWorld(o.world, o.sim) of the session's own, all on `engine`.
  Session(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
          const AnyView4& dO, const AlgoOptions& o, Engine<T>& engine);
  ~Session();  // frees each rank's shard and engine on its own thread
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void forward();   // throws Error when a rank failed; see errors()
  void backward();  // after forward() or load_forward(); needs dO and o.backward
  // In place of forward(): the forward's outputs computed earlier, GLOBAL O (B, H_q, N_q, d) and
  // LSE (B, H_q, N_q) in double, any layout, rounded to T and A (exact when they came from this
  // T). A checkpointed layer keeps O and LSE and hands them back here, so the backward that follows
  // never reruns the forward (spec §11.4).
  void load_forward(View4<const double> O, View3<const double> LSE);
  // One rank's pass of `phase` on `comm` (what forward() and backward() run on every rank).
  void rank_pass(Phase phase, Communicator& comm);
  // Every rank's outputs and logs so far, on every process (a World of several processes
  // gathers them: a collective). outputs = false: the logs alone (O, LSE, dQ, dK, dV empty), for
  // a caller that reads what it needs of the held ranks' outputs with read_output.
  DistResult<T> result(bool outputs = true) const;
  // Elements [at, at + n) of held rank r's output `which` where it lies in engine memory, BHSD
  // over the rank's local length (O in T, the others in acc_t<T>), into host (n of that type):
  // a reader of a few rows never downloads a whole shard.
  void read_output(int r, Output which, int64_t at, int64_t n, void* host) const;
  const std::vector<std::string>& errors() const { return errors_; }
  const Plan& plan() const { return plan_; }
  const Partition& qp() const { return plan_.qp; }
  const Partition& kp() const { return plan_.kp; }
  World& world() const { return *w_; }

 private:
  // Validates the inputs, makes the plan, sizes the per-rank members.
  void start(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
             const AnyView4& dO, const AlgoOptions& o);
  // Every held rank on engine e: the mask prepared once, each shard uploaded.
  void place_all(Engine<T>& e, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                 const AnyView4& dO);
  // The checks of a rank's pass: the communicator's size, and rank comm.rank() held here.
  Engine<T>& held(const Communicator& comm) const;
  // rank_pass's body: held, the algorithm's pass, the engine drained.
  void pass_on(Phase phase, Communicator& comm);
  void run(Phase phase);  // forward() and backward(): every held rank's pass
  Plan plan_;
  PassFn<T> pass_ = nullptr;  // plan_'s algorithm's pass
  std::unique_ptr<World> own_world_;  // the second constructor's
  World* w_ = nullptr;
  std::vector<std::unique_ptr<Engine<T>>> own_engines_;  // [rank], or one shared
  std::vector<Engine<T>*> e_;                            // [rank]; null: another process's
  std::vector<PreparedMask> prepared_;                   // plan_.mask in each rank's engine memory
  std::vector<std::vector<Transfer>> logs_;
  std::vector<Shard<T>> shards_;
  std::vector<std::string> errors_;
  bool have_forward_ = false;
};

// A Session's forward, then its backward when o.backward, on a SimWorld: every rank's outputs.
// Throws Error when any rank failed; each rank's error ("" = ok) goes to *rank_errors when
// given, also when it throws.
template <class T>
DistResult<T> run_session(const Problem& p, const AnyView4& Q, const AnyView4& K, const AnyView4& V,
                          const AnyView4& dO, const AlgoOptions& o, Engine<T>& engine,
                          std::vector<std::string>* rank_errors = nullptr);

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
