#!/usr/bin/env python3
"""The fused LM head + cross-entropy on one GPU (spec §10): ours against PyTorch and the public
fused kernels, forward + backward, bf16.

  unfused   torch: logits = F.linear(H, W); F.cross_entropy(logits, y); autograd for dH, dW
  liger     liger_kernel's LigerFusedLinearCrossEntropyLoss (skipped when not importable)
  cce       cut_cross_entropy's linear_cross_entropy (skipped when not importable)
  ours      `burstlab bench --op lmhead-ce --impl cuda-v1,cuda-v2,cuda-v3 --dtype bf16 --json` (one run per
            --chunks value, 0 = each variant's default), which checks every variant against the fp64
            oracle first (on N reduced to 256 rows at this size)

Time: forward + backward of one loss, CUDA events, best and median of --reps after --warmup
(ours: best of --reps, host clock around a synchronizing call). Peak extra memory: the peak
allocated by the call minus what was allocated before it, minus the returned dH and dW (every
method must produce those): torch.cuda.max_memory_allocated for the torch-based methods; for ours
the high-water mark of the stream-ordered pool every workspace of the call comes from (measured,
cuBLAS's workspace included; bench's "device peak" column). The torch-based methods'
losses are compared with the unfused one (|dL| and max |d dH|, |d dW| relative to their max).
Appends CSV lines to --csv: method,N,V,d,best_ms,median_ms,peak_extra_MiB,vs_unfused_time,vs_unfused_mem,note
"""
import argparse
import json
import subprocess
import sys

import torch
import torch.nn.functional as F
from cuda_events import event_times


def timed(fn, warmup, reps):
    ts = sorted(event_times(fn, warmup, reps))
    return ts[0], ts[len(ts) // 2]


def peak_extra(fn, out_bytes):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    res = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - out_bytes
    del res
    return extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--v", type=int, default=131072)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--ignore-fraction", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--burstlab", default="build/gpu/tools/burstlab")
    ap.add_argument("--csv", default="")
    ap.add_argument("--impls", default="cuda-v1,cuda-v2,cuda-v3", help="ours: burstlab's --impl list")
    ap.add_argument("--chunks", default="0", help="ours: comma list of rows per chunk (--br); 0 = default")
    a = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    print(f"# torch {torch.__version__} cuda {torch.version.cuda} device {props.name} "
          f"({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)", flush=True)
    N, V, d = a.n, a.v, a.d
    g = torch.Generator(device=dev).manual_seed(1)
    H = torch.randn(N, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    W = (torch.randn(V, d, device=dev, dtype=torch.bfloat16, generator=g) / d ** 0.5).requires_grad_()
    y = torch.randint(0, V, (N,), device=dev, generator=g)
    y[torch.rand(N, device=dev, generator=g) < a.ignore_fraction] = -100
    out_bytes = (N + V) * d * 2  # dH, dW in bf16

    methods = {}

    def unfused():
        loss = F.cross_entropy(F.linear(H, W), y, ignore_index=-100)
        return (loss,) + torch.autograd.grad(loss, [H, W])
    methods["unfused"] = unfused

    try:
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except ImportError:
            from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
        liger_loss = LigerFusedLinearCrossEntropyLoss(ignore_index=-100)

        def liger():
            loss = liger_loss(W, H, y)
            return (loss,) + torch.autograd.grad(loss, [H, W])
        methods["liger"] = liger
    except Exception as e:  # not installed on this machine
        print(f"# liger-kernel skipped: {type(e).__name__}: {e}")
    try:
        from cut_cross_entropy import linear_cross_entropy

        def cce():
            loss = linear_cross_entropy(H, W, y, ignore_index=-100)
            return (loss,) + torch.autograd.grad(loss, [H, W])
        methods["cce"] = cce
    except Exception as e:
        print(f"# cut-cross-entropy skipped: {type(e).__name__}: {e}")

    rows = []
    ref = None
    for name, fn in methods.items():
        res = fn()
        note = ""
        if ref is None:
            ref = [t.detach().float() for t in res]
        else:
            got = [t.detach().float() for t in res]
            dl = abs(got[0].item() - ref[0].item())
            dh = ((got[1] - ref[1]).abs().max() / ref[1].abs().max()).item()
            dw = ((got[2] - ref[2]).abs().max() / ref[2].abs().max()).item()
            note = f"|dL|={dl:.2e} max|ddH|/max|dH|={dh:.2e} max|ddW|/max|dW|={dw:.2e}"
        del res
        best, med = timed(fn, a.warmup, a.reps)
        extra = peak_extra(fn, out_bytes)
        rows.append([name, best, med, extra / 2**20, note])
        print(f"{name:8s} best {best:9.2f} ms  median {med:9.2f} ms  peak extra {extra / 2**20:9.1f} MiB  {note}",
              flush=True)

    ok = True
    for chunk in a.chunks.split(","):
        cmd = [a.burstlab, "bench", "--op", "lmhead-ce", "--impl", a.impls, "--dtype", "bf16", "--vocab", str(V),
               "--nq", str(N), "-d", str(d), "--reps", str(a.reps), "--ignore-fraction", str(a.ignore_fraction),
               "--br", chunk, "--json"]
        print("# " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            ok = False
            print(f"ours FAILED (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}", flush=True)
            continue
        j = json.loads(p.stdout)
        for impl in a.impls.split(","):
            fused = [r for r in j["rows"] if r["impl"] == impl and r["pass"] == "fused"][0]
            worst = max(v["all"]["err_bound"] for v in j["verify"]
                        if v["impl"] == impl and isinstance(v["all"]["err_bound"], (int, float)))
            name = impl.replace("cuda-", "ours-") + ("" if chunk == "0" else f"/br{chunk}")
            rows.append([name, fused["time_ms"], float("nan"), fused["device_extra_mib"],
                         f"verified ({j['verify_shape'][0]}), worst err/bound {worst:.2e}"])
            print(f"{name:12s} best {fused['time_ms']:9.2f} ms  device peak {fused['device_extra_mib']:9.1f} MiB  "
                  f"{rows[-1][4]}", flush=True)

    base = rows[0]
    print(f"\n{'method':12s} {'best ms':>9s} {'x unfused':>9s} {'extra MiB':>10s} {'x unfused':>9s}  goal (ours): "
          f"time <= 1.1x, extra <= 0.1x")
    out = open(a.csv, "a") if a.csv else None
    for r in rows:
        tx, mx = r[1] / base[1], r[3] / base[3] if base[3] > 0 else float("nan")
        print(f"{r[0]:12s} {r[1]:9.2f} {tx:9.3f} {r[3]:10.1f} {mx:9.3f}  {r[4]}")
        if out:
            out.write(f"{r[0]},{N},{V},{d},{r[1]:.3f},{r[2]:.3f},{r[3]:.1f},{tx:.3f},{mx:.4f},{r[4]}\n")
    if out:
        out.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
