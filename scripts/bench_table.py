#!/usr/bin/env python3
"""Combines the benchmark CSV (burstlab-cuda-bench + scripts/bench_sdpa.py) into one table:
per (N, d, causal): our forward / backward TFLOP/s beside SDPA FLASH and CUDNN, the ratios
the goals in docs/performance-gpu.md use, and our forward as a fraction of the bf16 GEMM rate of the same run.
Rows labelled "ours_X" (a variant by name, or a mode, timed in the same run) add columns "fwd X", "bwd X".
Usage: bench_table.py bench.csv [--markdown]"""
import csv
import math
import sys


def main():
    path = sys.argv[1]
    md = "--markdown" in sys.argv
    rows = {}
    gemm = float("nan")
    with open(path) as f:
        for r in csv.reader(f):
            if len(r) < 9:
                continue
            impl, var, pas, N, d, causal, ms, tf, chk = r[:9]
            if impl == "gemm":
                gemm = float(tf)
                continue
            key = (int(N), int(d), int(causal))
            rows.setdefault(key, {})[(impl, pas)] = (float(tf), chk)

    def g(k, impl, pas):
        v = rows[k].get((impl, pas))
        return v[0] if v and v[1] == "ok" else float("nan")

    def f(x, w=7, p=1):
        return f"{x:{w}.{p}f}" if not math.isnan(x) else f"{'-':>{w}}"

    extra = sorted({impl for r in rows.values() for (impl, _) in r if impl.startswith("ours_")})
    ex_hdr = [f"{p} {e[5:]}" for e in extra for p in ("fwd", "bwd")]
    hdr = ["N", "d", "causal", "fwd ours", "FLASH", "CUDNN", "x FLASH", "x CUDNN", "x GEMM",
           "bwd ours", "FLASH", "CUDNN", "x FLASH"] + ex_hdr
    if md:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    else:
        print(f"{'N':>6} {'d':>4} {'causal':>6} | {'fwd ours':>8} {'FLASH':>7} {'CUDNN':>7} {'xFLASH':>7} {'xCUDNN':>7} {'xGEMM':>7}"
              f" | {'bwd ours':>8} {'FLASH':>7} {'CUDNN':>7} {'xFLASH':>7}" + ("".join(f" {h:>7}" for h in ex_hdr)) +
              f"   (TFLOP/s; bf16 GEMM {gemm:.0f})")
    for k in sorted(rows, key=lambda k: (k[1], k[2], k[0])):
        fo, ff, fc = g(k, "ours", "fwd"), g(k, "sdpa_flash", "fwd"), g(k, "sdpa_cudnn", "fwd")
        bo, bf, bcd = g(k, "ours", "bwd"), g(k, "sdpa_flash", "bwd"), g(k, "sdpa_cudnn", "bwd")
        vals = [fo, ff, fc, fo / ff, fo / fc, fo / gemm, bo, bf, bcd, bo / bf]
        for e in extra:
            vals += [g(k, e, "fwd"), g(k, e, "bwd")]
        if md:
            cells = [str(k[0]), str(k[1]), str(k[2])] + [
                f(v, 1, 2 if i in (3, 4, 5, 9) else 1).strip() for i, v in enumerate(vals)]
            print("| " + " | ".join(cells) + " |")
        else:
            print(f"{k[0]:>6} {k[1]:>4} {k[2]:>6} | {f(fo, 8)} {f(ff)} {f(fc)} {f(fo / ff, 7, 2)} {f(fo / fc, 7, 2)} {f(fo / gemm, 7, 2)}"
                  f" | {f(bo, 8)} {f(bf)} {f(bcd)} {f(bo / bf, 7, 2)}" + "".join(f" {f(v)}" for v in vals[10:]))
    if md:
        print(f"\nbf16 GEMM (torch.matmul 8192^3, same run): {gemm:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
