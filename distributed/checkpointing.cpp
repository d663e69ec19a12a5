// distributed/checkpointing.cpp — spec §11.5, eq. (11.11)-(11.14).
#include "checkpointing.hpp"

#include <cmath>

#include "algorithm.hpp"
#include "burstlab/error.hpp"
#include "burstlab/names.hpp"

namespace burstlab::dist {

const std::vector<ModelShape>& model_presets() {
  static const std::vector<ModelShape> m = {
      {"7b", "BurstEngine §4.1 (config/7b); DistFlashAttn's LLaMA-7B", 32, 32, 32, 128, 4096, 11008, 32000, 3},
      {"14b", "BurstEngine §4.1 (config/13b: F 13824)", 40, 40, 40, 128, 5120, 13824, 120000, 3},
  };
  return m;
}

ModelShape model_preset(const std::string& name) { return find_named(model_presets(), name, "model"); }

void validate(const ModelShape& m) {
  if (m.layers < 1) fail("layers (", m.layers, ") must be >= 1");
  if (m.H_q < 1) fail("H_q (", m.H_q, ") must be >= 1");
  if (m.H_kv < 1 || m.H_q % m.H_kv != 0) fail("H_kv (", m.H_kv, ") must be >= 1 and divide H_q (", m.H_q, ")");
  if (m.head_dim < 1) fail("head_dim (", m.head_dim, ") must be >= 1");
  if (m.D < 1) fail("D (", m.D, ") must be >= 1");
  if (m.F < 0) fail("F (", m.F, ") must be >= 0");
  if (m.vocab < 0) fail("vocab (", m.vocab, ") must be >= 0");
  if (m.ffn_matrices < 0) fail("ffn_matrices (", m.ffn_matrices, ") must be >= 0");
}

double layer_linear_flops_per_token(const ModelShape& m) {  // eq. (11.12)
  const double D = double(m.D), d = double(m.head_dim);
  return 2.0 * (D * double(m.H_q + 2 * m.H_kv) * d + double(m.H_q) * d * D + double(m.ffn_matrices) * D * double(m.F));
}
double head_flops_per_token(const ModelShape& m) { return 2.0 * double(m.D) * double(m.vocab); }

std::string to_string(Strategy s) {
  static constexpr Named<Strategy> names[] = {
      {Strategy::Full, "full"}, {Strategy::Selective, "selective++"}, {Strategy::Sequence, "sequence"}};
  return name_of(s, names);
}

namespace {
MaskSpec mask_of(const std::string& name) {
  MaskSpec m;
  if (name == "causal") m.causal = true;
  else if (name != "none") fail("mask (", name, ") must be none or causal");
  return m;
}
}  // namespace

std::vector<CkptCost> checkpoint_costs(const CkptSetting& s) {
  validate(s.model);
  if (s.G < 1) fail("G (", s.G, ") must be >= 1");
  if (!(s.keep >= 0 && s.keep <= 1)) fail("keep (", s.keep, ") must lie in [0, 1]");
  if (s.elem_bytes < 1) fail("elem_bytes (", s.elem_bytes, ") must be >= 1");
  if (s.stat_bytes < 1) fail("stat_bytes (", s.stat_bytes, ") must be >= 1");
  Problem p;
  p.N_q = p.N_k = s.N;
  p.mask = mask_of(s.mask);
  const MaskData md = compile_mask(p);  // validates N
  const MaskParams mp = md.params();
  const Partition part = make_partition(s.partition, s.N, s.G, "N");
  // The busiest GPU: the most visible pairs (the first one on ties).
  int busiest = 0;
  std::vector<int64_t> pairs(s.G, 0);
  for (int r = 0; r < s.G; ++r) {
    for (const int64_t i : part.positions[r]) pairs[r] += count_visible(mp, i, i + 1, 0, s.N);
    if (pairs[r] > pairs[busiest]) busiest = r;
  }
  const ModelShape& m = s.model;
  const int64_t n = part.local_size(busiest), L = m.layers;
  const int64_t n_keep = std::llround(s.keep * double(n));
  int64_t rec_seq = 0;  // the first n - n_keep local rows rerun their attention forward
  for (int64_t l = 0; l < n - n_keep; ++l) {
    const int64_t i = part.positions[busiest][l];
    rec_seq += count_visible(mp, i, i + 1, 0, s.N);
  }
  const double attn_per_pair = 4.0 * double(m.head_dim) * double(m.H_q);  // eq. (8.1)
  const double lin = double(n) * layer_linear_flops_per_token(m), head = double(n) * head_flops_per_token(m);
  std::vector<CkptCost> out;
  for (const Strategy st : {Strategy::Full, Strategy::Selective, Strategy::Sequence}) {
    CkptCost c;
    c.strategy = st;
    c.rank = busiest;
    c.rows = n;
    c.pairs = pairs[busiest];
    c.kept_rows = st == Strategy::Full ? 0 : st == Strategy::Selective ? n : n_keep;
    c.recomputed_pairs = st == Strategy::Full ? c.pairs : st == Strategy::Selective ? 0 : rec_seq;
    c.input_bytes = L * n * m.D * s.elem_bytes;                                                     // (11.11)
    c.attention_bytes = L * c.kept_rows * (m.H_q * m.head_dim * s.elem_bytes + m.H_q * s.stat_bytes);
    // (11.13): forward, recompute and backward (2x) of the matrices; forward, backward (2.5x,
    // eq. 8.2) and the recomputed pairs of the attention; forward and backward of the LM head.
    c.step_flops = double(L) * (4.0 * lin + attn_per_pair * (3.5 * double(c.pairs) + double(c.recomputed_pairs))) +
                   3.0 * head;
    out.push_back(c);
  }
  return out;
}

Volume distflash_volume(int64_t N, int P, int64_t H, int64_t head_dim) {
  Problem p;
  p.H_q = p.H_kv = H;
  p.N_q = p.N_k = N;
  p.d = head_dim;
  p.mask.causal = true;
  AlgoOptions o;
  o.algo = "distflash";
  o.world = P;
  o.partition = PartitionKind::Contiguous;
  const Plan plan = make_plan(p, o);
  Volume v;
  const double unit = double(P) * double(N) * double(H) * double(head_dim);  // P workers x N d
  for (int r = 0; r < P; ++r) {
    v.forward += double(plan_bytes(plan, Phase::Forward, r, true, ElemBytes(1))) / unit;
    v.backward += double(plan_bytes(plan, Phase::Backward, r, true, ElemBytes(1))) / unit;
  }
  return v;
}

double megatron_volume(int P, bool checkpointing) {
  if (P < 1) fail("P (", P, ") must be >= 1");
  return (checkpointing ? 14.0 : 10.0) * double(P - 1) / double(P);
}

RematCost remat_cost(const ModelShape& m, int64_t n_per_gpu, int P) {
  validate(m);
  if (n_per_gpu < 1) fail("n_per_gpu (", n_per_gpu, ") must be >= 1");
  if (P < 1) fail("P (", P, ") must be >= 1");
  const double n = double(n_per_gpu), N = n * double(P);
  const double attn = 4.0 * double(m.head_dim) * double(m.H_q) * N * (N + 1) / (2.0 * double(P));  // one forward
  const double rest = double(m.layers) * 4.0 * n * layer_linear_flops_per_token(m) + 3.0 * n * head_flops_per_token(m);
  RematCost c;  // eq. (11.14)
  c.step_flops_layer = rest + double(m.layers) * (1.0 + 1.0 + 2.5) * attn;
  c.step_flops_remat = rest + double(m.layers) * (1.0 + 2.5) * attn;
  return c;
}

}  // namespace burstlab::dist
