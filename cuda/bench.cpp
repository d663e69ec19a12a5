// burstlab-cuda-bench — times the CUDA layer on the flash-attention grid (B*N tokens fixed,
// H*d fixed), bf16, BSHD, flash-attention FLOP convention (spec §8, eq. 8.1-8.2). Outputs are
// checked before timing: every output element finite, and the tensor-core variants against the
// table's fallback v1 (CUDA cores, itself checked against the fp64 oracle by tests/cuda) within a
// bound derived from bf16 rounding; a failed check makes the exit status 1. One CSV line per
// (pass, N, d, causal). --list-variants prints the variant table for scripts (gpu-check).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda.hpp"

namespace {

using namespace burstlab;
namespace bc = burstlab::cuda;

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) {
    if (x.empty()) continue;
    char* end = nullptr;
    const long long n = std::strtoll(x.c_str(), &end, 10);
    if (*end) fail("list element (", x, ") must be an integer");
    v.push_back(n);
  }
  return v;
}

// Median of `reps` timed runs of fn after `warmup` untimed ones (CUDA events; milliseconds).
template <class F>
double time_ms(F fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(reps + 1);
  for (auto& e : ev) BURSTLAB_CUDA_CHECK(cudaEventCreate(&e));
  BURSTLAB_CUDA_CHECK(cudaEventRecord(ev[0]));
  for (int i = 0; i < reps; ++i) {
    fn();
    BURSTLAB_CUDA_CHECK(cudaEventRecord(ev[i + 1]));
  }
  BURSTLAB_CUDA_CHECK(cudaEventSynchronize(ev[reps]));
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    BURSTLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
    t[i] = ms;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"burstlab-cuda-bench: CUDA LAO kernels on the flash-attention grid (bf16, BSHD)"};
  std::string ns = "1024,2048,4096,8192,16384", ds = "64,128", causals = "0,1", csv, variant = "auto",
              bwd_variant = "auto", label = "ours";
  int64_t tokens = 16384, hd = 2048, v1_max_n = 16384, bwd_max_n = 16384, bwd_check_max_n = 2048;
  int warmup = 3, reps = 10, bwd_reps = 5;
  bool deterministic = false, list_variants = false;
  app.add_option("--n", ns, "sequence lengths N (comma list)");
  app.add_option("--d", ds, "head dims (comma list)");
  app.add_option("--causal", causals, "0 = no mask, 1 = causal (comma list)");
  app.add_option("--tokens", tokens, "B*N (fixed over the grid)");
  app.add_option("--hd", hd, "H*d (fixed over the grid)");
  app.add_option("--variant", variant, "forward variant to time: one of " + bc::variant_names() +
                                          " (auto: the first in preference order that runs)");
  app.add_option("--bwd-variant", bwd_variant, "backward variant to time: one of " + bc::variant_names());
  app.add_flag("--list-variants", list_variants,
               "print the variant table, one line per variant: name, its --variant and --bwd-variant "
               "(auto for a pass it lacks), dtypes, whether its forward runs block-sparse masks, "
               "fallback or -; then exit");
  app.add_flag("--deterministic", deterministic,
               "time the backward's deterministic mode (bitwise repeatable; v4: two passes instead of one)");
  app.add_option("--v1-max-n", v1_max_n, "largest N at which the forward is checked against v1");
  app.add_option("--bwd-max-n", bwd_max_n, "largest N at which the backward is timed");
  app.add_option("--bwd-check-max-n", bwd_check_max_n, "largest N at which the backward is checked against v1");
  app.add_option("--warmup", warmup, "untimed runs");
  app.add_option("--reps", reps, "timed runs (median reported)");
  app.add_option("--bwd-reps", bwd_reps, "timed backward runs");
  app.add_option("--csv", csv, "append CSV lines here");
  app.add_option("--label", label, "first CSV field of our lines (scripts/bench_table.py columns)");
  CLI11_PARSE(app, argc, argv);

  if (list_variants) {
    std::printf("# name forward backward dtypes block-sparse-forward d role\n");
    for (const bc::VariantInfo* v : bc::variants_by_number()) {
      const auto has = [v](bc::Pass p) { return std::find(v->passes.begin(), v->passes.end(), p) != v->passes.end(); };
      std::string dts, dvs;
      for (Dtype t : v->dtypes) dts += (dts.empty() ? "" : ",") + to_string(t);
      for (int64_t x : v->d_values) dvs += (dvs.empty() ? "" : ",") + std::to_string(x);
      std::printf("%s %s %s %s %s %s %s\n", v->name, has(bc::Pass::Forward) ? v->name : "auto",
                  has(bc::Pass::Backward) ? v->name : "auto", dts.c_str(), v->block_sparse_forward ? "yes" : "no",
                  dvs.empty() ? "any" : dvs.c_str(), v == &bc::variants().back() ? "fallback" : "-");
    }
    return 0;
  }
  const bc::Variant ref = bc::variants().back().id;  // the fallback (v1): every call, oracle-checked
  try {
    std::string why;
    if (!bc::gpu_available(&why)) {
      std::fprintf(stderr, "burstlab-cuda-bench: no GPU: %s\n", why.c_str());
      return 2;
    }
    const bc::Variant var_req = bc::parse_variant(variant), bvar_req = bc::parse_variant(bwd_variant);
    std::printf("# device: %s\n", bc::device_description().c_str());
    std::ofstream out;
    if (!csv.empty()) out.open(csv, std::ios::app);
    const size_t elems = size_t(tokens) * size_t(hd);
    // Random inputs once (N(0,1), never zeros), reused by every shape (B*N*H*d is constant).
    std::vector<bf16_t> host(elems);
    std::mt19937_64 rng(12345);
    std::normal_distribution<float> nd(0.f, 1.f);
    bc::DeviceBuffer<bf16_t> Qb(elems), Kb(elems), Vb(elems), dOb(elems), Ob(elems), Rb(elems);
    bc::DeviceBuffer<bf16_t> dQb(elems), dKb(elems), dVb(elems);
    for (auto* buf : {&Qb, &Kb, &Vb, &dOb}) {
      for (auto& x : host) x = bf16_t(nd(rng));
      buf->upload(host.data(), elems);
    }
    const float max_v = static_cast<float>(bc::max_abs(Vb.data(), elems));
    bool all_ok = true;
    std::printf("%-4s %-3s %6s %4s %6s %3s %4s %10s %9s %12s %10s %s\n", "pass", "var", "N", "d",
                "causal", "B", "H", "ms", "TFLOP/s", "max|x-v1|", "bound", "check");
    for (int64_t d : parse_list(ds))
      for (int64_t causal : parse_list(causals))
        for (int64_t N : parse_list(ns)) {
          Problem p;
          p.B = tokens / N; p.H_q = p.H_kv = hd / d; p.N_q = p.N_k = N; p.d = d;
          p.mask.causal = causal != 0;
          if (p.B < 1 || p.H_q < 1) continue;
          const auto V4 = [&](bf16_t* x) { return view4<bf16_t>(x, Layout::BSHD, p.B, p.H_q, N, d); };
          const auto C4 = [&](bf16_t* x) { return as_const(V4(x)); };
          bc::DeviceBuffer<float> L(size_t(p.B * p.H_q * N)), L1(size_t(p.B * p.H_q * N));
          const auto L3 = [&](float* x) { return view3<float>(x, p.B, p.H_q, N); };
          // The variant that runs (auto resolved over the table, as forward_variant documents).
          const bc::Variant var = bc::forward_variant<bf16_t>(p, C4(Qb.data()), C4(Kb.data()), C4(Vb.data()), V4(Ob.data()), var_req);
          bc::Options opt;
          opt.variant = var;
          // One forward of variant v into outputs poisoned first, finished on return.
          const auto run_into = [&](auto& O, auto& LSE, bc::Variant v) {
            bc::Options o = opt;
            o.variant = v;
            O.poison();
            LSE.poison();
            bc::forward<bf16_t>(p, C4(Qb.data()), C4(Kb.data()), C4(Vb.data()), V4(O.data()), L3(LSE.data()), o);
            BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
          };
          // ---- check: outputs poisoned, finite after; the others against the fallback
          run_into(Ob, L, var);
          const size_t n_o = size_t(p.B * p.H_q * N * d);
          int64_t bad = bc::count_nonfinite(Ob.data(), n_o) + bc::count_nonfinite(L.data(), size_t(p.B * p.H_q * N));
          double diff = -1, bound = 0, ldiff = -1;
          if (var != ref && N <= v1_max_n) {
            run_into(Rb, L1, ref);
            diff = bc::max_abs_diff(Ob.data(), Rb.data(), n_o);
            ldiff = bc::max_abs_diff(L.data(), L1.data(), size_t(p.B * p.H_q * N));
            // Both sides are O = sum_j P_ij V_j with |O| <= (P|V|) <= max|V|. v2/v3 round P to bf16
            // (relative u each, so <= u max|V|) and both round O to bf16 (u max|V| each); fp32
            // accumulation differences are far below. Safety factor 2 as in spec §9.4:
            bound = 2.0 * 3.0 * std::ldexp(1.0, -8) * max_v;
            // LSE is fp32 on both sides; logits |S| <~ 10 here, so order-of-summation effects are
            // ~1e-5; 1e-3 absolute still catches any off-by-one-key or mask error (>> 1e-3).
            if (diff > bound || ldiff > 1e-3) bad += 1;
          }
          const bool ok = bad == 0;
          all_ok = all_ok && ok;
          const double ms = time_ms([&] {
            bc::forward<bf16_t>(p, C4(Qb.data()), C4(Kb.data()), C4(Vb.data()), V4(Ob.data()), L3(L.data()), opt);
          }, warmup, reps);
          const double tf = forward_flops(p) / (ms * 1e-3) / 1e12;
          std::printf("%-4s %-3s %6lld %4lld %6lld %3lld %4lld %10.3f %9.1f %12.3e %10.3e %s\n", "fwd",
                      bc::to_string(var).c_str(), (long long)N, (long long)d, (long long)causal,
                      (long long)p.B, (long long)p.H_q, ms, tf, diff, bound, ok ? "ok" : "FAIL");
          std::fflush(stdout);
          if (out) out << label << "," << bc::to_string(var) << ",fwd," << N << "," << d << "," << causal << ","
                       << ms << "," << tf << "," << (ok ? "ok" : "FAIL") << "\n";
          // ---- backward at N <= bwd_max_n (--bwd-variant; auto: the table's choice)
          if (N <= bwd_max_n) {
            bc::DeviceBuffer<float> Lb(size_t(p.B * p.H_q * N));
            bc::forward<bf16_t>(p, C4(Qb.data()), C4(Kb.data()), C4(Vb.data()), V4(Ob.data()), L3(Lb.data()), opt);
            bc::DeviceBuffer<bf16_t>* grads[3] = {&dQb, &dKb, &dVb};
            const auto run_bwd = [&](const bc::Options& o, bc::DeviceBuffer<bf16_t>* const* gr) {
              bc::backward<bf16_t>(p, C4(Qb.data()), C4(Kb.data()), C4(Vb.data()), C4(Ob.data()),
                                     C4(dOb.data()), as_const(L3(Lb.data())), V4(gr[0]->data()),
                                     V4(gr[1]->data()), V4(gr[2]->data()), o);
            };
            for (auto* g : grads) g->poison();
            bc::Options bopt;
            bopt.variant = bvar_req;
            bopt.deterministic = deterministic;
            // The backward that runs (auto resolved over the table, as backward_variant documents).
            const bc::Variant bv = bc::backward_variant<bf16_t>(
                p, C4(Qb.data()), C4(Kb.data()), C4(Vb.data()), C4(Ob.data()), C4(dOb.data()),
                V4(dQb.data()), V4(dKb.data()), V4(dVb.data()), bvar_req, deterministic);
            const bool bv2 = bv != ref;
            const std::string bvar = bc::to_string(bv);
            run_bwd(bopt, grads);
            BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
            int64_t bbad = 0;
            for (auto* g : grads) bbad += bc::count_nonfinite(g->data(), n_o);
            double worst = -1;  // max over dQ, dK, dV of max|v2 - v1| / max|v1|
            if (bv2 && N <= bwd_check_max_n) {
              bc::DeviceBuffer<bf16_t> r0(n_o), r1(n_o), r2(n_o);
              bc::DeviceBuffer<bf16_t>* refs[3] = {&r0, &r1, &r2};
              bc::Options o1;
              o1.variant = ref;
              run_bwd(o1, refs);
              BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
              for (int k = 0; k < 3; ++k)
                worst = std::max(worst, bc::max_abs_diff(grads[k]->data(), refs[k]->data(), n_o) /
                                            bc::max_abs(refs[k]->data(), n_o));
              // Relative to the largest gradient element: v2 rounds P and dS to bf16 (u = 2^-8
              // each) and both round outputs to bf16; sums of N terms of mixed sign keep the error
              // at a few u of the largest element. 8 u (3%) is loose for that and still far
              // below what a wrong tile, mask or index gives (O(1)).
              if (!(worst <= 8 * std::ldexp(1.0, -8))) bbad += 1;
            }
            all_ok = all_ok && bbad == 0;
            const double bms = time_ms([&] { run_bwd(bopt, grads); }, 1, bwd_reps);
            const double btf = backward_flops(p) / (bms * 1e-3) / 1e12;
            std::printf("%-4s %-3s %6lld %4lld %6lld %3lld %4lld %10.3f %9.1f %12.3e %10s %s\n", "bwd", bvar.c_str(),
                        (long long)N, (long long)d, (long long)causal, (long long)p.B, (long long)p.H_q,
                        bms, btf, worst, "rel", bbad == 0 ? "ok" : "FAIL");
            std::fflush(stdout);
            if (out) out << label << "," << bvar << ",bwd," << N << "," << d << "," << causal << "," << bms << "," << btf
                         << "," << (bbad == 0 ? "ok" : "FAIL") << "\n";
          }
        }
    return all_ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "burstlab-cuda-bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "burstlab-cuda-bench: %s\n", e.what());
    return 1;
  }
}
