// distributed/checkpointing.hpp — the cost models of spec §11.5: what a checkpoint placement keeps,
// recomputes and communicates per GPU when a LLaMA-style model trains on a sequence split over G
// GPUs. Two papers' comparisons:
//   BurstEngine §3.2 (Table 2, Figure 7): full checkpointing (each layer's input kept),
//     selective checkpointing++ (plus every attention output A and its LSE) and sequence-level
//     selective checkpointing (plus A, LSE of the later part of each GPU's rows only);
//   DistFlashAttn §3.3, Appendix C: layer-boundary (HF) checkpointing reruns the attention forward
//     and its communication; rematerialization-aware checkpointing does not.
// Nothing runs: bytes and FLOPs are counted from the shapes, the partitions (§7.1) and the masks
// (§3), and communication from the algorithms' closed forms (§7.5-7.12). Time is FLOPs at one rate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "burstlab/problem.hpp"
#include "partition.hpp"

namespace burstlab::dist {

// A LLaMA-style transformer: attention with H_q query heads of head_dim, a gated MLP of
// ffn_matrices (D, F) matrices (3: W1, W3, W2), an LM head of vocab rows.
struct ModelShape {
  std::string name, source;
  int64_t layers = 1, H_q = 1, H_kv = 1, head_dim = 1, D = 1, F = 1, vocab = 0;
  int64_t ffn_matrices = 3;
};
// "7b": 32 layers, 32 heads, D 4096, F 11008, vocab 32000; "14b": 40 layers, 40 heads, D 5120,
// F 13824, vocab 120000 (BurstEngine §4.1 and its config/7b, config/13b; DistFlashAttn's
// LLaMA-7B is the same 7B).
const std::vector<ModelShape>& model_presets();
ModelShape model_preset(const std::string& name);  // throws Error naming "model" and the presets
void validate(const ModelShape& m);

// Forward FLOPs per token of one layer's matrices (eq. 11.12):
// 2 (D (H_q + 2 H_kv) d + H_q d D + ffn_matrices D F); of the LM head: 2 D vocab.
double layer_linear_flops_per_token(const ModelShape& m);
double head_flops_per_token(const ModelShape& m);

enum class Strategy { Full, Selective, Sequence };  // BurstEngine §3.2's three
std::string to_string(Strategy s);                   // "full", "selective++", "sequence"

// One training setting: N tokens over G GPUs laid out by `partition`, the mask of `p` (N_q = N_k
// = N; B, heads and d are taken from the model), elements of elem_bytes (A) and stat_bytes (LSE).
struct CkptSetting {
  ModelShape model;
  int64_t N = 1;
  int G = 1;
  PartitionKind partition = PartitionKind::Striped;  // BurstEngine runs sl_ckpt on the striped layout
  std::string mask = "causal";                       // none | causal
  double keep = 0.5;  // sequence: the fraction of each GPU's rows (its last ones) whose A, LSE are kept
  int64_t elem_bytes = 2, stat_bytes = 4;
};

// Per GPU, on the busiest one (the most attention pairs).
struct CkptCost {
  Strategy strategy = Strategy::Full;
  int rank = 0;                      // the busiest GPU
  int64_t rows = 0;                  // its query rows n
  int64_t kept_rows = 0;             // rows whose A, LSE are kept (n, 0 or the later keep n)
  int64_t input_bytes = 0;           // L n D s: every strategy keeps each layer's input
  int64_t attention_bytes = 0;       // L kept_rows (H_q d s + H_q s_stat): A and LSE kept
  int64_t pairs = 0;                 // visible (i, j) pairs of its rows, one head (eq. 8.1)
  int64_t recomputed_pairs = 0;      // pairs of the rows whose attention forward reruns
  double step_flops = 0;             // eq. (11.13)
  int64_t kept_bytes() const { return input_bytes + attention_bytes; }
};
// Full, Selective, Sequence, in that order (eq. 11.11-11.13).
std::vector<CkptCost> checkpoint_costs(const CkptSetting& s);

// DistFlashAttn (§7.12) per-worker traffic per layer, averaged over the P ranks, in units of
// N H d s (the paper's "Nd": d its hidden width H head_dim), from the closed forms (7.25) with
// elem_bytes for every tensor. Needs P | N for the paper's accounting to be exact.
struct Volume {
  double forward = 0, backward = 0;
};
Volume distflash_volume(int64_t N, int P, int64_t H, int64_t head_dim);
// Megatron-LM's tensor + sequence parallelism per layer (DistFlashAttn Appendix C): 6 all-gathers
// and 4 reduce-scatters of an (N/P, d) shard, each (P - 1)/P N d per worker, and with layer
// checkpointing the forward's 2 + 2 again: (10 or 14) (P - 1) / P, in units of N d.
double megatron_volume(int P, bool checkpointing);

// DistFlashAttn §3.3 / Table 5 as FLOPs (eq. 11.14): per GPU of P, n tokens each, causal, the
// pairs balanced (N (N + 1) / 2P each). HF: the attention forward twice; remat: once.
struct RematCost {
  double step_flops_layer = 0;  // layer-boundary (HF) checkpointing
  double step_flops_remat = 0;  // rematerialization-aware
  double speedup() const { return step_flops_layer / step_flops_remat; }
};
RematCost remat_cost(const ModelShape& m, int64_t n_per_gpu, int P);

}  // namespace burstlab::dist
