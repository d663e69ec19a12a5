#!/usr/bin/env python3
"""Check PyTorch's scaled_dot_product_attention (forward + backward) against burstlab's oracle.

    burstlab gen --out cases --quick --oracle --dtype fp32        # the case files (+ expected outputs)
    python3 examples/check_torch_sdpa.py --cases cases --out sdpa-out --burstlab build/tools/burstlab
    python3 examples/check_torch_sdpa.py ... --device cuda       # on a GPU machine

For every case directory it reads case.json and q/k/v/dO.npy, runs SDPA on them (BHSD; BSHD cases
are transposed), backpropagates dO, writes the candidate's O, LSE, dQ, dK, dV (.npy, in the case's
layout and dtype) to OUT/<case>/, and then runs `burstlab check --case CASES --candidate OUT`,
whose exit status this script returns (0 pass, 1 a tensor failed).

What is compared and how (docs/conformance.md):
  * the mask is passed to SDPA as an explicit boolean attn_mask built from case.json with the spec's
    predicate (spec §3, eq. 3.1-3.5): bottom-right aligned band, per-document band, block mask.
    (SDPA's is_causal=True is TOP-LEFT aligned when N_q != N_k, which disagrees with the spec.)
  * GQA/MQA: K and V are expanded with repeat_interleave; autograd sums dK, dV over each group.
  * LSE: SDPA does not return it, so the script computes torch.logsumexp of the masked logits in
    the candidate's accumulation precision (fp32 for fp32/bf16/fp16). --no-lse checks only O and
    the gradients.
  * LSE is written in fp32 for bf16/fp16 candidates (their accumulation precision, as flash-attn
    returns it): the §9 LSE bound (eq. 9.4) has no storage-rounding term.
  * bf16 files are 2-byte voids ('<V2', the ml_dtypes convention): the top half of fp32's bits.
  * rows with no visible key: the spec wants O = 0, LSE = -inf and zero gradients; SDPA may give
    NaN there. The checker reports such rows as mismatches with their coordinates.
--backend numpy runs the same pipeline with a float64 NumPy implementation instead of torch (no
torch needed); it is how burstlab's own tests exercise this script.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np


# ---- .npy with bf16 -----------------------------------------------------------------------------
def load(path):
    a = np.load(path)
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bf16 (ml_dtypes convention)
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32), "bf16"
    return a, {np.float64: "fp64", np.float32: "fp32", np.float16: "fp16"}[a.dtype.type]


def save(path, a, dtype):
    a = np.ascontiguousarray(a)
    if dtype == "bf16":
        f = a.astype(np.float32)
        u = f.view(np.uint32).astype(np.uint64)
        # round to nearest even, as torch does when casting to bfloat16 (inf/nan kept)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        nonfinite = ~np.isfinite(f)
        r[nonfinite] = (u[nonfinite] >> 16).astype(np.uint16) | np.where(np.isnan(f[nonfinite]), 0x40, 0).astype(np.uint16)
        np.save(path, r.view("V2"))
    else:
        np.save(path, a.astype({"fp64": np.float64, "fp32": np.float32, "fp16": np.float16}[dtype]))


# ---- the spec's mask (§3) -------------------------------------------------------------------------
def visible(meta):
    """Boolean (N_q, N_k): eq. (3.1) band, bottom-right aligned; (3.3) per document; (3.5) block."""
    N_q, N_k, m = meta["N_q"], meta["N_k"], meta["mask"]
    left = m["window_left"]
    right = 0 if m["causal"] else m["window_right"]
    if m["causal"] and m["window_right"] >= 0:
        right = min(right, m["window_right"])
    i = np.arange(N_q)[:, None]
    j = np.arange(N_k)[None, :]
    if m["q_segment"]:
        qs, ks = np.array(m["q_segment"]), np.array(m["k_segment"])
        same = qs[:, None] == ks[None, :]
        # document-local indices and lengths
        q0 = np.array([np.searchsorted(qs, s, "left") for s in qs])
        nq = np.array([np.sum(qs == s) for s in qs])
        k0 = np.array([np.searchsorted(ks, s, "left") for s in qs])
        nk = np.array([np.sum(ks == s) for s in qs])
        diag = (np.arange(N_q) - q0 + (nk - nq))[:, None]
        jl = j - k0[:, None]
    else:
        same = np.ones((N_q, N_k), bool)
        diag = i + (N_k - N_q)
        jl = j
    vis = same.copy()
    if left >= 0:
        vis &= jl >= diag - left
    if right >= 0:
        vis &= jl <= diag + right
    if m["block_q"] > 0:
        bq, bk = m["block_q"], m["block_k"]
        nbk = -(-N_k // bk)
        blocks = np.array(m["block_mask"], bool).reshape(-1, nbk)
        vis &= blocks[i // bq, j // bk]
    return vis


def to_bhsd(x, layout):
    return x if layout == "BHSD" else x.transpose(0, 2, 1, 3)


def from_bhsd(x, layout):
    return x if layout == "BHSD" else x.transpose(0, 2, 1, 3)


# ---- candidates -------------------------------------------------------------------------------------
def run_numpy(meta, q, k, v, dO, vis):
    """float64 reference in NumPy (spec eq. 2.1-2.4, 5.1-5.7); q, dO (B,H_q,N_q,d); k, v (B,H_kv,N_k,d)."""
    G = meta["H_q"] // meta["H_kv"]
    K, V = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    S = meta["scale"] * q @ K.transpose(0, 1, 3, 2)
    S = np.where(vis, S, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = np.max(S, axis=-1, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0)
        e = np.exp(S - mx)
        l = e.sum(-1, keepdims=True)
        LSE = (np.log(l) + mx)[..., 0]
        P = np.where(l > 0, e / np.where(l > 0, l, 1), 0)
    O = P @ V
    D = np.sum(dO * O, axis=-1, keepdims=True)
    dP = dO @ V.transpose(0, 1, 3, 2)
    dS = P * (dP - D)
    dQ = meta["scale"] * dS @ K
    dKg = meta["scale"] * dS.transpose(0, 1, 3, 2) @ q
    dVg = P.transpose(0, 1, 3, 2) @ dO
    B, H_kv, N_k, d = k.shape
    dK = dKg.reshape(B, H_kv, G, N_k, d).sum(2)
    dV = dVg.reshape(B, H_kv, G, N_k, d).sum(2)
    return O, LSE, dQ, dK, dV


def run_torch(meta, q, k, v, dO, vis, dtype, device):
    import torch
    import torch.nn.functional as F

    tdt = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    acc = torch.float64 if dtype == "fp64" else torch.float32
    G = meta["H_q"] // meta["H_kv"]
    T = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=tdt)
    tq, tk, tv, tdO = T(q).requires_grad_(), T(k).requires_grad_(), T(v).requires_grad_(), T(dO)
    mask = torch.from_numpy(vis).to(device)
    K, V = tk.repeat_interleave(G, dim=1), tv.repeat_interleave(G, dim=1)
    O = F.scaled_dot_product_attention(tq, K, V, attn_mask=mask, scale=meta["scale"])
    O.backward(tdO)
    with torch.no_grad():  # LSE in the accumulation precision: SDPA does not return it
        S = meta["scale"] * (tq.to(acc) @ K.to(acc).transpose(-1, -2))
        LSE = torch.logsumexp(S.masked_fill(~mask, float("-inf")), dim=-1)
    f = lambda t: t.detach().to(torch.float64).cpu().numpy()
    return f(O), f(LSE), f(tq.grad), f(tk.grad), f(tv.grad)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", required=True, help="suite directory from `burstlab gen --oracle` (or one case)")
    ap.add_argument("--out", required=True, help="where to write the candidate outputs")
    ap.add_argument("--burstlab", default="burstlab", help="path of the burstlab binary")
    ap.add_argument("--backend", default="torch", choices=["torch", "numpy"])
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    ap.add_argument("--no-lse", action="store_true", help="do not write LSE (check O and gradients only)")
    ap.add_argument("--json", action="store_true", help="pass --json to burstlab check")
    a = ap.parse_args()

    device = a.device
    if a.backend == "torch":
        import torch
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        print(f"torch {torch.__version__} on {device}", flush=True)
    single = os.path.exists(os.path.join(a.cases, "case.json"))
    dirs = [a.cases] if single else sorted(
        os.path.join(a.cases, d) for d in os.listdir(a.cases) if os.path.exists(os.path.join(a.cases, d, "case.json")))
    if not dirs:
        sys.exit(f"{a.cases}: no case.json found; run `burstlab gen --out {a.cases} --oracle` first")
    for n, d in enumerate(dirs):
        meta = json.load(open(os.path.join(d, "case.json")))
        L = meta["layout"]
        q, dtype = load(os.path.join(d, "q.npy"))
        k, _ = load(os.path.join(d, "k.npy"))
        v, _ = load(os.path.join(d, "v.npy"))
        dO, _ = load(os.path.join(d, "dO.npy"))
        q, k, v, dO = (to_bhsd(x, L) for x in (q, k, v, dO))
        vis = visible(meta)
        if a.backend == "numpy":
            # float64 math, outputs rounded to the case's dtype like a real candidate's
            out = run_numpy(meta, *(x.astype(np.float64) for x in (q, k, v, dO)), vis)
        else:
            out = run_torch(meta, q, k, v, dO, vis, dtype, device)
        O, LSE, dQ, dK, dV = out
        od = a.out if single else os.path.join(a.out, os.path.basename(d))
        os.makedirs(od, exist_ok=True)
        for name, x in (("O", O), ("dQ", dQ), ("dK", dK), ("dV", dV)):
            save(os.path.join(od, name + ".npy"), from_bhsd(x, L), dtype)
        lse_path = os.path.join(od, "LSE.npy")
        if a.no_lse:
            if os.path.exists(lse_path):
                os.remove(lse_path)
        else:
            # LSE is kept in the accumulation precision (fp32 for bf16/fp16, as flash-attn returns it):
            # the §9 LSE bound (eq. 9.4) has no storage-rounding term.
            save(lse_path, LSE, "fp64" if dtype == "fp64" else "fp32")
        json.dump({"dtype": dtype, "lse_empty": "-inf", "lse_base": "e"}, open(os.path.join(od, "candidate.json"), "w"))
        print(f"[{n + 1}/{len(dirs)}] {meta['name']}", file=sys.stderr, flush=True)
    cmd = [a.burstlab, "check", "--case", a.cases, "--candidate", a.out]
    if a.no_lse:
        cmd += ["--tensors", "O,dQ,dK,dV"]
    if a.json:
        cmd.append("--json")
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
