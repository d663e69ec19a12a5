#!/usr/bin/env python3
"""Judge PyTorch's context parallelism with burstlab's row-sampled fp64 oracle.

    torchrun --standalone --nproc-per-node 2 examples/check_torch_cp.py --seq 131072 --causal
    torchrun --standalone --nproc-per-node 2 examples/check_torch_cp.py --seq 131072 --no-causal
    torchrun --standalone --nproc-per-node 2 examples/check_torch_cp.py --seq 32768 --mask document --docs 8
    torchrun --standalone --nproc-per-node 2 examples/check_torch_cp.py --seq 32768 --mask window --window 4096

On G GPUs (one process each, torchrun), B = 1, H heads of d, bf16, the same seeded q, k, v, dO on
every rank:
  * causal / none: F.scaled_dot_product_attention under torch's context_parallel
    (torch.distributed.tensor.experimental: a ring over SDPA, the flash kernel, torch's head-tail
    load balancing for causal), forward and backward;
  * document (packed varlen, causal inside each document) / window (causal, the last --window + 1
    keys): FlexAttention with a context-parallel block mask (_ContextParallel FLEX plan,
    _context_parallel_shard), where the installed torch has it; otherwise one "not expressible"
    line and exit 0.
Each rank's shards of O, LSE, dQ, dK, dV are gathered to rank 0 with the global position of
every row (a position buffer sharded by the same call as q, k, v), put back in sequence order,
copied to the host in bf16 (LSE fp32) and judged there by burstlab.check(check_rows=K): K query
rows' O, LSE, dQ exactly in fp64 from the inputs, K key columns' dK, dV given torch's own O and
LSE (spec §9.11). It prints burstlab's table, then one verdict line with the worst err/bound;
exit 0 PASS, 1 FAIL (a finding: the table names the coordinates), 2 bad input or no GPUs.

LSE: F.scaled_dot_product_attention does not return it. Under context_parallel the script calls
the op that F.scaled_dot_product_attention dispatches to (aten._scaled_dot_product_flash_attention)
on the same sequence-sharded DTensors, and uses its LSE when its O equals the F.sdpa O bit for bit
(the same forward). If that fails on the installed torch, LSE comes from the flash kernel on one
GPU over the whole problem instead: O and dQ are judged on the rows as before, dK and dV on the
columns given torch CP's O and that LSE, and the LSE row then judges that kernel, not torch CP
(the line "LSE: ..." above the table says which happened).
"""
import argparse
import json
import os
import random
import sys
import time

MASKS = ("causal", "none", "document", "window")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=32768, help="N_q = N_k (default 32768; 32K-128K intended)")
    ap.add_argument("--heads", type=int, default=32, help="H = H_q = H_kv (default 32)")
    ap.add_argument("--head-dim", "-d", type=int, default=128, help="d (default 128)")
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                    help="--causal / --no-causal: the SDPA modes (default --causal); with --mask document, "
                         "causal inside each document or not")
    ap.add_argument("--mask", choices=MASKS, default=None,
                    help="causal | none (SDPA under context_parallel) | document | window (FlexAttention)")
    ap.add_argument("--docs", type=int, default=8, help="document mask: documents (seeded random lengths, default 8)")
    ap.add_argument("--window", type=int, default=4096, help="window mask: keys left of the diagonal (default 4096)")
    ap.add_argument("--load-balance", action=argparse.BooleanOptionalAction, default=True,
                    help="torch's head-tail load balancing (causal SDPA and the Flex masks; default on)")
    ap.add_argument("--check-rows", type=int, default=64, help="K sampled rows and columns (default 64)")
    ap.add_argument("--seed", type=int, default=0, help="inputs and sample seed (default 0)")
    ap.add_argument("--json", action="store_true", help="rank 0 prints one JSON object instead of the table")
    ap.add_argument("--out-dir", help="rank 0 also writes report.txt and report.json there")
    a = ap.parse_args(argv)
    if a.mask is None:
        a.mask = "causal" if a.causal in (None, True) else "none"
    elif a.mask in ("causal", "none") and a.causal is not None and a.causal != (a.mask == "causal"):
        ap.error(f"--mask {a.mask} contradicts --{'no-' if not a.causal else ''}causal")
    if a.causal is None:
        a.causal = a.mask != "none"
    for name in ("seq", "heads", "head_dim", "docs", "check_rows"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} ({getattr(a, name)}) must be >= 1")
    if a.window < 0:
        ap.error(f"--window ({a.window}) must be >= 0")
    if a.mask == "document" and a.docs > a.seq:
        ap.error(f"--docs ({a.docs}) must be <= --seq ({a.seq})")
    return a


# ---- the mask, as burstlab and as FlexAttention see it (CPU-testable) -----------------------------
def doc_lengths(N, n_docs, seed):
    """n_docs document lengths >= 1 summing to N, seeded (the same on every rank)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, N), n_docs - 1)) if n_docs > 1 else []
    edges = [0] + cuts + [N]
    return [edges[i + 1] - edges[i] for i in range(n_docs)]


def doc_ids(lengths):
    return [d for d, n in enumerate(lengths) for _ in range(n)]


def burstlab_mask(a, lengths=None):
    """The spec §3 mask of the mode: causal, none, document (+ causal inside), window (causal,
    window_left = --window)."""
    import burstlab

    if a.mask == "causal":
        return burstlab.Mask(causal=True)
    if a.mask == "none":
        return burstlab.Mask()
    if a.mask == "window":
        return burstlab.Mask(causal=True, window_left=a.window)
    ids = doc_ids(lengths)
    return burstlab.Mask(causal=a.causal, q_segment=ids, k_segment=ids)


def mask_mod_of(a, doc=None):
    """FlexAttention's mask_mod(b, h, q_idx, kv_idx) of the mode, on global positions; doc: the
    document id of every position (a tensor on the device)."""
    if a.mask == "window":
        W = a.window
        return lambda b, h, q, kv: (q >= kv) & (q - kv <= W)
    if a.mask == "document":
        if a.causal:
            return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)
        return lambda b, h, q, kv: doc[q] == doc[kv]
    raise ValueError(f"mask {a.mask} runs through SDPA, not FlexAttention")


# ---- gather and judge (CPU-testable) ---------------------------------------------------------------
def assemble(shards, positions, dim=2):
    """The global tensor from rank-ordered shards and the global position of each shard's rows
    along `dim` (torch tensors; positions int64, one per row). Every position must appear once."""
    import torch

    N = sum(int(p.numel()) for p in positions)
    seen = torch.cat([p.reshape(-1).to(torch.int64).cpu() for p in positions])
    if seen.numel() != N or not torch.equal(torch.sort(seen).values, torch.arange(N)):
        raise ValueError(f"shard positions must cover 0..{N - 1} once each")
    shape = list(shards[0].shape)
    shape[dim] = N
    out = shards[0].new_empty(shape)
    for s, p in zip(shards, positions):
        out.index_copy_(dim, p.reshape(-1).to(device=s.device, dtype=torch.int64), s)
    return out


def judge(q, k, v, do, got, mask, check_rows, seed):
    """burstlab's sampled check of got = dict(out, lse, dq, dk, dv) (host tensors, global, in
    sequence order); returns (CheckResult, worst tensor name, worst err/bound)."""
    import burstlab

    r = burstlab.check(q, k, v, out=got["out"], lse=got["lse"], dq=got["dq"], dk=got["dk"], dv=got["dv"], do=do,
                       mask=mask, check_rows=check_rows, seed=seed, name=got.get("name"))
    worst = max(r.tensors, key=lambda t: t.err_bound if t.err_bound == t.err_bound else float("inf"))
    return r, worst.name, worst.err_bound


def verdict_line(r, worst_name, worst, desc):
    return (f"check_torch_cp: {'PASS' if r.passed else 'FAIL'}: {desc}: worst err/bound {worst:.3g} ({worst_name})"
            + ("" if r.passed else "; #wrong " + ", ".join(f"{t.name} {t.wrong}" for t in r.tensors if t.wrong)))


# ---- torch on the GPUs ------------------------------------------------------------------------------
def fail(msg, code=2):
    print(f"check_torch_cp: {msg}", file=sys.stderr)
    sys.exit(code)


def flex_support():
    """(None, parts) when the installed torch runs FlexAttention under context parallelism, else
    (reason, None)."""
    try:
        from torch.distributed.tensor.experimental import _attention as cp
        from torch.nn.attention import flex_attention as fa
    except ImportError as e:
        return f"torch has no FlexAttention or no context-parallel module ({e})", None
    missing = [n for n in ("_ContextParallel", "_context_parallel_shard", "context_parallel_unshard")
               if not hasattr(cp, n)]
    if missing or not hasattr(getattr(cp, "_ContextParallel", None), "AttentionType") or \
            not hasattr(cp._ContextParallel.AttentionType, "FLEX"):
        return ("torch.distributed.tensor.experimental._attention has no FlexAttention plan "
                f"({', '.join(missing) or '_ContextParallel.AttentionType.FLEX'} missing)"), None
    return None, (cp, fa)


def gather_to_rank0(tensors, pos, dim=2):
    """all_gather every rank's shards and positions; rank 0 assembles them in sequence order."""
    import torch
    import torch.distributed as dist

    G, rank = dist.get_world_size(), dist.get_rank()
    pos_all = [torch.empty_like(pos) for _ in range(G)]
    dist.all_gather(pos_all, pos.contiguous())
    out = []
    for t in tensors:
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(G)]
        dist.all_gather(parts, t)
        out.append(assemble(parts, pos_all, dim) if rank == 0 else None)
        del parts
    return out


def run_sdpa(a, mesh, q, k, v, do, pos):
    """F.scaled_dot_product_attention under context_parallel, forward + backward; returns the
    local O, LSE, dQ, dK, dV, the local positions and how LSE was obtained."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import _attention as cp
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cp._cp_options.enable_load_balance = a.causal and a.load_balance  # torch refuses it without causal
    cq, ck, cv, cdo, cpos = (x.clone() for x in (q, k, v, do, pos))
    lse, how = None, ""
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), \
            context_parallel(mesh, buffers=[cq, ck, cv, cdo, cpos], buffer_seq_dims=[2] * 5,
                             no_restore_buffers={cq, ck, cv, cdo, cpos}):
        qq, kk, vv = (x.detach().requires_grad_(True) for x in (cq, ck, cv))
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=a.causal)
        o.backward(cdo)
        try:  # the op F.sdpa dispatched to, on the same sharded DTensors: its LSE
            from torch.distributed.tensor import DTensor, Shard

            dts = [DTensor.from_local(x, mesh, [Shard(2)], run_check=False) for x in (cq, ck, cv)]
            with torch.no_grad():
                res = torch.ops.aten._scaled_dot_product_flash_attention.default(*dts, 0.0, a.causal, False)
            o2, l2 = (x.to_local() if isinstance(x, DTensor) else x for x in res[:2])
            if torch.equal(o2, o.detach()):
                lse, how = l2, "torch CP's own (aten._scaled_dot_product_flash_attention under context_parallel; its O equals F.sdpa's bit for bit)"
            else:
                how = "not obtainable: the flash op's O under context_parallel differs from F.sdpa's"
        except Exception as e:  # noqa: BLE001 - any failure here only means: no CP LSE
            how = f"not obtainable under context_parallel ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
    return [o.detach(), lse, qq.grad, kk.grad, vv.grad], cpos, how


def run_flex(a, mesh, q, k, v, do, pos, parts):
    import torch
    from torch.distributed.tensor.parallel import parallelize_module

    cp, fa = parts
    N = a.seq
    doc = None
    if a.mask == "document":
        doc = torch.tensor(doc_ids(doc_lengths(N, a.docs, a.seed)), device=q.device, dtype=torch.int32)
    mask_mod = mask_mod_of(a, doc)
    # compiled: the eager create_block_mask evaluates mask_mod on all N x N positions at once
    create = torch.compile(fa.create_block_mask, dynamic=False, fullgraph=True)
    block_mask = create(mask_mod, B=None, H=None, Q_LEN=N, KV_LEN=N, device=q.device.type)
    flex = torch.compile(fa.flex_attention, dynamic=False)

    class Flex(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return flex(*args, **kwargs)

    module = parallelize_module(Flex(), mesh, cp._ContextParallel(seq_dim=2, attention_type=cp._ContextParallel.AttentionType.FLEX))
    lb = cp._HeadTailLoadBalancer(N, mesh.size(), q.device) if a.load_balance and hasattr(cp, "_HeadTailLoadBalancer") else None
    # clones: with a load balancer the buffers are reordered in place, and q, k, v, do stay the
    # global inputs the check reads
    cq, ck, cv, cdo, cpos, cbm = cp._context_parallel_shard(
        mesh, [x.clone() for x in (q, k, v, do, pos)] + [block_mask], [2] * 6, load_balancer=lb)
    for t in (cq, ck, cv):
        t.requires_grad_(True)
    if hasattr(fa, "AuxRequest"):
        o, aux = module(cq, ck, cv, block_mask=cbm, return_aux=fa.AuxRequest(lse=True))
        lse = aux.lse
    else:
        o, lse = module(cq, ck, cv, block_mask=cbm, return_lse=True)
    o.backward(cdo)
    how = "torch CP's own (FlexAttention's LSE, natural log)"
    return [o.detach(), lse.detach(), cq.grad, ck.grad, cv.grad], cpos, how


def main(argv=None):
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        fail("PyTorch is not installed for this interpreter: install torch with CUDA on the GPU machine")
    try:
        import burstlab  # noqa: F401 - before any GPU work: the judge runs at the end
    except ImportError as e:
        fail(f"burstlab is not importable ({e}): PYTHONPATH=build/gpu/python (the build's package)")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        fail("run me under torchrun, one process per GPU: torchrun --standalone --nproc-per-node 2 "
             f"{' '.join([sys.argv[0]] + sys.argv[1:])}")
    if not torch.cuda.is_available():
        fail(f"torch {torch.__version__} sees no CUDA device: context_parallel runs on GPUs (NCCL)")
    import torch.distributed as dist

    parts = None
    if a.mask in ("document", "window"):
        why, parts = flex_support()
        if why:
            if int(os.environ["RANK"]) == 0:
                print(f"check_torch_cp: not expressible: {a.mask} mask under context_parallel on torch "
                      f"{torch.__version__}: {why}")
            return 0
    G = int(os.environ["WORLD_SIZE"])
    if a.seq % (2 * G) or (parts and a.seq % (G * 128)):
        fail(f"--seq ({a.seq}) must be a multiple of {2 * G if not parts else G * 128} for {G} ranks "
             f"({'head-tail split' if not parts else 'FlexAttention CP blocks of 128'})")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    from torch.distributed.device_mesh import init_device_mesh

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    mesh = init_device_mesh("cuda", (G,))
    g = torch.Generator(device="cuda").manual_seed(a.seed)
    shape = (1, a.heads, a.seq, a.head_dim)
    q, k, v, do = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    pos = torch.arange(a.seq, device="cuda", dtype=torch.int64).view(1, 1, a.seq)
    t0 = time.time()
    if parts:
        local_out, cpos, how = run_flex(a, mesh, q, k, v, do, pos, parts)
    else:
        local_out, cpos, how = run_sdpa(a, mesh, q, k, v, do, pos)
    torch.cuda.synchronize()
    t_run = time.time() - t0
    o_l, lse_l, dq_l, dk_l, dv_l = local_out
    has_lse = torch.tensor([1 if lse_l is not None else 0], device="cuda")
    dist.all_reduce(has_lse, op=dist.ReduceOp.MIN)
    lse_judged = bool(has_lse.item())
    names = ["out", "dq", "dk", "dv"] + (["lse"] if lse_judged else [])
    tensors = [o_l, dq_l, dk_l, dv_l] + ([lse_l.float()] if lse_judged else [])
    gathered = gather_to_rank0(tensors, cpos.reshape(-1))
    code = torch.zeros(1, device="cuda", dtype=torch.int32)
    if rank == 0:
        got = dict(zip(names, gathered))
        if not lse_judged:  # the flash kernel on one GPU over the whole problem: LSE for the columns
            with torch.no_grad():
                got["lse"] = torch.ops.aten._scaled_dot_product_flash_attention.default(
                    q, k, v, 0.0, a.causal, False)[1].float()
            how = (f"{how}; LSE from the flash kernel on one GPU over the whole problem: the LSE row judges "
                   "that kernel, not torch CP; dK and dV are judged on the columns given torch CP's O and that LSE")
        host = {n: t.cpu() for n, t in got.items()}
        hq, hk, hv, hdo = (x.cpu() for x in (q, k, v, do))
        kind = f"{a.mask}" + (f" ({a.docs} documents{', causal' if a.causal else ''})" if a.mask == "document" else "") + \
               (f" (window {a.window})" if a.mask == "window" else "")
        peer = "FlexAttention" if parts else "SDPA (flash)"
        desc = (f"torch {torch.__version__} context_parallel, {peer}, {kind}, N={a.seq}, H={a.heads}, d={a.head_dim}, "
                f"bf16, G={G}, K={a.check_rows}")
        host["name"] = f"torch CP {kind} N={a.seq}"
        mask = burstlab_mask(a, doc_lengths(a.seq, a.docs, a.seed) if a.mask == "document" else None)
        t1 = time.time()
        r, wname, worst = judge(hq, hk, hv, hdo, host, mask, a.check_rows, a.seed)
        t_check = time.time() - t1
        line = verdict_line(r, wname, worst, desc)
        report = {"verdict": "PASS" if r.passed else "FAIL", "worst_err_bound": worst, "worst_tensor": wname,
                  "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
                  "world": G, "mask": a.mask, "N": a.seq, "H": a.heads, "d": a.head_dim, "check_rows": a.check_rows,
                  "seed": a.seed, "lse": how, "run_s": round(t_run, 3), "check_s": round(t_check, 3),
                  "check": json.loads(r.json())}
        if a.json:
            print(json.dumps(report))
        else:
            print(f"LSE: {how}")
            print(r)
            print(line)
        if a.out_dir:
            os.makedirs(a.out_dir, exist_ok=True)
            with open(os.path.join(a.out_dir, "report.txt"), "w") as f:
                f.write(f"LSE: {how}\n{r}\n{line}\n")
            with open(os.path.join(a.out_dir, "report.json"), "w") as f:
                json.dump(report, f, indent=1)
        code[0] = 0 if r.passed else 1
    dist.broadcast(code, src=0)
    dist.destroy_process_group()
    return int(code.item())


if __name__ == "__main__":
    sys.exit(main())
