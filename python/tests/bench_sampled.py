#!/usr/bin/env python3
"""Time and peak extra host memory of the row-sampled check (burstlab.check(check_rows=K)) on a
large problem held as bf16 (or fp16/fp32) torch tensors, as a context-parallel test holds its
gathered outputs. The inputs and the candidate (out, lse, dq, dk, dv) are random: the check's work
does not depend on the values, so the verdict is FAIL and only the cost is measured.

Peak extra memory = the process's peak resident set during the call minus its resident set
before it (Linux: /proc/self/clear_refs resets the peak, VmHWM reads it), so the caller's own
tensors are not counted.

    PYTHONPATH=build/default/python python3 python/tests/bench_sampled.py --seq 131072 --heads 32 -d 128 --check-rows 16
"""
import argparse
import json
import sys
import time


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=131072, help="N_q = N_k (default 131072)")
    ap.add_argument("--heads", type=int, default=32, help="H_q = H_kv (default 32)")
    ap.add_argument("-d", "--head-dim", type=int, default=128, help="d (default 128)")
    ap.add_argument("--check-rows", type=int, default=16, help="K sampled rows and columns (default 16)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="storage dtype (default bf16)")
    ap.add_argument("--mask", default="causal", choices=["causal", "none"], help="default causal")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of text")
    a = ap.parse_args()
    for n in ("seq", "heads", "head_dim", "check_rows"):
        if getattr(a, n) < 1:
            print(f"bench_sampled: --{n.replace('_', '-')} ({getattr(a, n)}) must be >= 1", file=sys.stderr)
            return 2
    import torch

    import burstlab

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    shape = (1, a.heads, a.seq, a.head_dim)
    g = torch.Generator().manual_seed(0)

    def rand():
        t = torch.empty(shape, dtype=dt)
        for h in range(a.heads):  # one head at a time: no fp32 temporary of the whole tensor
            t[0, h] = torch.randn(shape[2:], generator=g).to(dt)
        return t

    q, k, v, do, out, dq, dk, dv = (rand() for _ in range(8))
    lse = torch.randn(shape[:3], generator=g) + torch.log1p(torch.arange(a.seq, dtype=torch.float32))
    mask = None if a.mask == "none" else "causal"
    rss0 = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    t0 = time.perf_counter()
    r = burstlab.check(q, k, v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask=mask, check_rows=a.check_rows)
    secs = time.perf_counter() - t0
    hwm = status_kib("VmHWM")
    extra = (hwm - rss0) * 1024
    res = {"N": a.seq, "H": a.heads, "d": a.head_dim, "dtype": a.dtype, "mask": a.mask, "check_rows": a.check_rows,
           "inputs_bytes": 8 * q.numel() * q.element_size(), "seconds": round(secs, 3),
           "peak_extra_bytes": extra, "checked": {t.name: t.checked for t in r.tensors}}
    if a.json:
        print(json.dumps(res))
    else:
        print(r)
        print(f"sampled check of N={a.seq} H={a.heads} d={a.head_dim} {a.dtype} {a.mask}, K={a.check_rows}: "
              f"{secs:.2f} s, peak extra host memory {extra / 2**20:.1f} MiB "
              f"(the caller's 8 tensors: {res['inputs_bytes'] / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
