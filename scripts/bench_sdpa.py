#!/usr/bin/env python3
"""PyTorch SDPA side of the CUDA benchmark (scripts/gpu-check runs it beside burstlab-cuda-bench).

Times torch.nn.functional.scaled_dot_product_attention forced to the FLASH and to the CUDNN
backend on the flash-attention grid (B*N = tokens, H*d = hd, bf16, flash-attention FLOP
convention: forward 4*B*H*pairs*d with pairs = N^2, or N(N+1)/2 causal; backward 2.5x), plus
a bf16 GEMM rate (8192^3 torch.matmul) measured in the same run. Outputs are checked before
timing against SDPA's MATH backend in fp32 on a slice (first batch, first two heads).
Appends CSV lines: impl,variant,pass,N,d,causal,ms,TFLOP/s,check.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    ev[0].record()
    for i in range(reps):
        fn()
        ev[i + 1].record()
    ev[-1].synchronize()
    t = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(reps))
    return t[reps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="1024,2048,4096,8192,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hd", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    print(f"# torch {torch.__version__} cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()} "
          f"device {props.name} ({props.multi_processor_count} SMs)", flush=True)
    out = open(a.csv, "a") if a.csv else None
    ok_all = True

    # bf16 GEMM rate on random data (never zeros), same run.
    g = torch.Generator(device=dev).manual_seed(1)
    A = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=g)
    Bm = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=g)
    ms = median_ms(lambda: torch.matmul(A, Bm), a.warmup, a.reps)
    tf = 2 * 8192 ** 3 / (ms * 1e-3) / 1e12
    print(f"gemm bf16 8192^3: {ms:.3f} ms {tf:.1f} TFLOP/s", flush=True)
    if out:
        out.write(f"gemm,-,gemm,8192,-,-,{ms},{tf},ok\n")
    del A, Bm

    backends = [("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]
    print(f"{'impl':<11} {'pass':<4} {'N':>6} {'d':>4} {'causal':>6} {'ms':>9} {'TFLOP/s':>8} {'max|err|':>10} check", flush=True)
    for d in [int(x) for x in a.d.split(",")]:
        for causal in [int(x) for x in a.causal.split(",")]:
            for N in [int(x) for x in a.n.split(",")]:
                B, H = a.tokens // N, a.hd // d
                if B < 1 or H < 1:
                    continue
                pairs = N * (N + 1) // 2 if causal else N * N
                fl = 4.0 * B * H * pairs * d
                # BSHD storage viewed as (B, H, N, d), as flash-attn callers do.
                q, k, v, do = (torch.randn(B, N, H, d, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2)
                               for _ in range(4))
                # fp32 MATH reference on a slice for the check.
                with sdpa_kernel(SDPBackend.MATH):
                    ref = F.scaled_dot_product_attention(q[:1, :2].float(), k[:1, :2].float(), v[:1, :2].float(),
                                                         is_causal=bool(causal))
                for name, be in backends:
                    qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
                    try:
                        with sdpa_kernel(be):
                            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal))
                            torch.cuda.synchronize()
                            err = (o[:1, :2].float() - ref).abs().max().item()
                            # bf16 P and bf16 output rounding: 2 * 3 u max|V| as in burstlab-cuda-bench.
                            bound = 2 * 3 * 2.0 ** -8 * v[:1, :2].float().abs().max().item()
                            good = bool(torch.isfinite(o).all().item()) and err <= bound
                            ok_all &= good
                            fms = median_ms(lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal)),
                                            a.warmup, a.reps)
                            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal))
                            bms = median_ms(lambda: torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True),
                                            1, max(3, a.reps // 2))
                    except RuntimeError as e:  # backend refused this shape
                        print(f"{name:<11} {N:>6} {d:>4} {causal:>6}  unavailable: {str(e).splitlines()[0][:80]}", flush=True)
                        if out:
                            out.write(f"{name},-,fwd,{N},{d},{causal},nan,nan,unavailable\n")
                        continue
                    chk = "ok" if good else "FAIL"
                    print(f"{name:<11} {'fwd':<4} {N:>6} {d:>4} {causal:>6} {fms:9.3f} {fl / fms / 1e9:8.1f} {err:10.3e} {chk}", flush=True)
                    print(f"{name:<11} {'bwd':<4} {N:>6} {d:>4} {causal:>6} {bms:9.3f} {2.5 * fl / bms / 1e9:8.1f} {'-':>10} {chk}", flush=True)
                    if out:
                        out.write(f"{name},-,fwd,{N},{d},{causal},{fms},{fl / fms / 1e9},{chk}\n")
                        out.write(f"{name},-,bwd,{N},{d},{causal},{bms},{2.5 * fl / bms / 1e9},{chk}\n")
                    del qq, kk, vv, o
                del q, k, v, do
                torch.cuda.empty_cache()
    if out:
        out.close()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
