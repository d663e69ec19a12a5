#!/usr/bin/env python3
"""PyTorch's context parallelism (torch.distributed.tensor.experimental.context_parallel: a ring
over SDPA, load-balanced for causal masks) on G GPUs, timed next to SDPA on the whole problem on
one GPU in the same run: the peer of `burstlab run --transport nccl --algo ring,burst --single`.

    torchrun --nproc-per-node G scripts/bench_cp_torch.py --seq 32768 --heads 32 -d 128 --causal

B = 1, bf16, BHSD; causal runs use torch's load-balanced split, non-causal the plain one. Before timing, the context-parallel output and gradients are gathered back
(context_parallel_unshard) and compared with the one-GPU SDPA (max |diff|, printed; a difference
above --tol fails the run). Times: CUDA events, best of --reps after --warmup, fwd and fwd+bwd,
each rank's, the slowest rank reported. Rank 0 prints one CSV line per measurement:
impl,world,pass,N,H,d,causal,best_ms,median_ms,max_diff
Keep NCCL_NVLS_ENABLE=0 on shared hosts.
"""
import argparse
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from cuda_events import event_times

# The CSV rank 0 prints (scripts/bench-cp reads it by these names).
CSV_FIELDS = ("impl", "world", "pass", "N", "H", "d", "causal", "best_ms", "median_ms", "max_diff")


def sdpa(q, k, v, do, backward, causal):
    """SDPA on q, k, v: (o,), or with backward (o, dq, dk, dv) for the output gradient do."""
    qq, kk, vv = (x.detach().requires_grad_(backward) for x in (q, k, v))
    o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
    if backward:
        o.backward(do)
        return o, qq.grad, kk.grad, vv.grad
    return (o,)


def timed(fn, warmup, reps):
    ms = event_times(fn, warmup, reps)
    return min(ms), statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768, help="N_q = N_k")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("-d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tol", type=float, default=0.05, help="max |diff| allowed against one-GPU SDPA (bf16)")
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental import _attention as cp_attention
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    # The load-balanced split is for causal masks only (torch refuses it otherwise).
    cp_attention._cp_options.enable_load_balance = a.causal

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    G, rank = dist.get_world_size(), dist.get_rank()
    if a.seq % (2 * G):
        raise SystemExit(f"--seq ({a.seq}) must be a multiple of 2 x world ({2 * G}) for the load-balanced split")
    mesh = init_device_mesh("cuda", (G,))
    g = torch.Generator(device="cuda").manual_seed(7)  # the same inputs on every rank
    shape = (1, a.heads, a.seq, a.d)
    q, k, v, do = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))

    # The whole problem on this rank's GPU: the reference output and the one-GPU time.
    def whole(backward):
        return sdpa(q, k, v, do, backward, a.causal)

    want = [x.detach() for x in whole(True)]
    t1 = {p: timed(lambda: whole(p == "fwd+bwd"), a.warmup, a.reps) for p in ("fwd", "fwd+bwd")}

    # Context parallel: q, k, v, do sharded along the sequence in place inside the context.
    cq, ck, cv, cdo = (x.clone() for x in (q, k, v, do))
    with context_parallel(mesh, buffers=[cq, ck, cv, cdo], buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers={cq, ck, cv, cdo}):
        def sharded(backward):
            return sdpa(cq, ck, cv, cdo, backward, a.causal)

        got = sharded(True)
        tg = {p: timed(lambda: sharded(p == "fwd+bwd"), a.warmup, a.reps) for p in ("fwd", "fwd+bwd")}
    full = context_parallel_unshard(mesh, [x.detach() for x in got], [2] * len(got))
    diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(full, want))
    # The slowest rank's times.
    t = torch.tensor([tg[p][i] for p in ("fwd", "fwd+bwd") for i in (0, 1)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(",".join(CSV_FIELDS))
        for i, p in enumerate(("fwd", "fwd+bwd")):
            print(f"sdpa-1gpu,1,{p},{a.seq},{a.heads},{a.d},{int(a.causal)},{t1[p][0]:.3f},{t1[p][1]:.3f},0")
            print(f"torch-cp,{G},{p},{a.seq},{a.heads},{a.d},{int(a.causal)},{t[2 * i]:.3f},{t[2 * i + 1]:.3f},{diff:.3g}")
    dist.destroy_process_group()
    if diff > a.tol:
        raise SystemExit(f"context-parallel outputs differ from one-GPU SDPA by {diff:.3g} > --tol {a.tol}")


if __name__ == "__main__":
    main()
