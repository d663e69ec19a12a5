"""On a GPU machine: burstlab's operator (the cuda layer) and PyTorch's SDPA, forward and backward,
checked against the fp64 oracle with burstlab.testing.assert_attention_close; the operator's
gradcheck in fp64 (cuda v1), opcheck, torch.compile, and the caller's stream. Every check prints
its table (run pytest with -s to see them). Skips without a GPU (fails under BURSTLAB_REQUIRE_GPU=1).
"""
import pytest
from conftest import gradcheck_problem, masks_37_50, require_gpu

import burstlab
from burstlab.testing import assert_attention_close

B, H_q, H_kv, N_q, N_k, d = 2, 4, 2, 37, 50, 64


def randn(torch, shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def shapes(layout):
    if layout == "BSHD":
        return (B, N_q, H_q, d), (B, N_k, H_kv, d)
    return (B, H_q, N_q, d), (B, H_kv, N_k, d)


def report(title, r):
    print(f"\n== {title}\n{r}", end="")
    return r


def run_operator(torch, q, k, v, do, **kw):
    import burstlab.cuda as bc

    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    o, lse = bc.attention(q, k, v, return_lse=True, **kw)
    o.backward(do)
    return o, lse, q.grad, k.grad, v.grad


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_operator_against_the_oracle(layout, dtype):
    """Every mask kind (empty rows included), GQA, both layouts: forward and backward of
    burstlab.cuda.attention within the spec §9 bound of the candidate's dtype."""
    torch = require_gpu()
    t = getattr(torch, dtype)
    sq, sk = shapes(layout)
    q, k, v, do = randn(torch, sq, t, 1), randn(torch, sk, t, 2), randn(torch, sk, t, 3), randn(torch, sq, t, 4)
    for name, mask in masks_37_50().items():
        o, lse, dq, dk, dv = run_operator(torch, q, k, v, do, mask=mask, layout=layout)
        assert lse.dtype == torch.float32 and o.dtype == t and dq.dtype == t
        report(f"burstlab.cuda.attention {dtype} {layout} mask={name}",
               assert_attention_close(q, k, v, out=o, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask=mask, layout=layout,
                                      msg=f"burstlab.cuda.attention {dtype} {layout} mask={name}"))


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_operator_variants(variant):
    """The variants named explicitly (auto picks v4/v3 on Hopper): the same check in bf16."""
    torch = require_gpu()
    sq, sk = shapes("BHSD")  # the default layout
    q, k, v, do = (randn(torch, s, torch.bfloat16, i) for i, s in enumerate((sq, sk, sk, sq)))
    for name in ("causal", "document", "window"):
        mask = masks_37_50()[name]
        o, lse, dq, dk, dv = run_operator(torch, q, k, v, do, mask=mask, variant=variant)
        report(f"burstlab.cuda.attention bf16 {variant} mask={name}",
               assert_attention_close(q, k, v, out=o, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask=mask))


def test_operator_on_the_callers_stream():
    """On a side stream the operator gives the default stream's forward, bit for bit, and a
    backward within the bound (mask arrays uploaded per call included); deterministic=True
    repeats the backward bit for bit."""
    torch = require_gpu()
    sq, sk = shapes("BHSD")
    q, k, v, do = (randn(torch, s, torch.bfloat16, i) for i, s in enumerate((sq, sk, sk, sq)))
    mask = masks_37_50()["causal+document+block"]
    want = run_operator(torch, q, k, v, do, mask=mask)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = run_operator(torch, q, k, v, do, mask=mask)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_attention_close(q, k, v, out=got[0], lse=got[1], dq=got[2], dk=got[3], dv=got[4], do=do, mask=mask)
    # deterministic=True: the backward repeats bit for bit
    a = run_operator(torch, q, k, v, do, mask=mask, deterministic=True)
    b = run_operator(torch, q, k, v, do, mask=mask, deterministic=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_gradcheck_fp64():
    """torch.autograd.gradcheck in fp64 (the cuda layer's v1 path) on small shapes, GQA, a mask with
    every part and empty rows."""
    torch = require_gpu()
    import burstlab.cuda as bc

    mask, q, k, v = gradcheck_problem(torch, randn)
    assert torch.autograd.gradcheck(lambda q, k, v: bc.attention(q, k, v, mask=mask), (q, k, v))
    do = randn(torch, (1, 2, 37, 4), torch.float64, 4)
    o, lse, dq, dk, dv = run_operator(torch, q, k, v, do, mask=mask)
    report("burstlab.cuda.attention fp64 (v1)",
           assert_attention_close(q, k, v, out=o, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask=mask))


def test_opcheck_and_compile():
    """torch.library.opcheck (schema, fake kernels, autograd registration, AOT dispatch) on CUDA,
    and torch.compile(fullgraph=True) with aot_eager (bitwise) and inductor (within the bound)."""
    torch = require_gpu()
    import burstlab.cuda as bc

    mask = masks_37_50()["causal+document+block"]
    sq, sk = shapes("BHSD")
    q, k, v, do = (randn(torch, s, torch.bfloat16, i) for i, s in enumerate((sq, sk, sk, sq)))
    torch.library.opcheck(torch.ops.burstlab.attention.default,
                          (q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True), mask.json, None,
                           "BHSD", "auto", True))
    o, lse = bc.attention(q.detach(), k.detach(), v.detach(), mask=mask, return_lse=True)
    torch.library.opcheck(torch.ops.burstlab.attention_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o, lse, mask.json, None, "BHSD", "auto", True))

    def step(q, k, v):
        return bc.attention(q, k, v, mask=mask)

    want = run_operator(torch, q, k, v, do, mask=mask)
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        f = torch.compile(step, backend=backend, fullgraph=True)
        qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
        o = f(qq, kk, vv)
        o.backward(do)
        if backend == "aot_eager":
            assert torch.equal(o, want[0])
        report(f"torch.compile({backend}) of burstlab.cuda.attention bf16",
               assert_attention_close(q, k, v, out=o, dq=qq.grad, dk=kk.grad, dv=vv.grad, do=do, mask=mask))


# ---- PyTorch SDPA through the same checker -----------------------------------------------------
def sdpa(torch, q, k, v, do, mask, backend=None):
    """SDPA forward and backward on BHSD tensors with the spec's mask as an explicit boolean
    attn_mask (Mask.dense; SDPA's is_causal is top-left aligned), GQA by repeat_interleave."""
    import torch.nn.functional as F

    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    attn_mask = torch.from_numpy(mask.dense(q.shape[2], k.shape[2])).to(q.device)
    ctx = torch.nn.attention.sdpa_kernel([backend]) if backend is not None else torch.enable_grad()
    with ctx:
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1),
                                           attn_mask=attn_mask)
        o.backward(do)
    return o, q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_sdpa_against_the_oracle(dtype):
    """torch SDPA (default backend choice) on masks where every row sees a key: O, dQ, dK, dV within
    the spec §9 bound, SDPA's (B, H, N, d) tensors passed without layout= (the default). (SDPA
    returns no LSE.)"""
    torch = require_gpu()
    t = getattr(torch, dtype)
    sq, sk = shapes("BHSD")
    q, k, v, do = (randn(torch, s, t, 10 + i) for i, s in enumerate((sq, sk, sk, sq)))
    docs = burstlab.Mask.document([0] * 10 + [1] * 12 + [2] * 15, [0] * 15 + [1] * 15 + [2] * 20)
    for name, mask in (("none", burstlab.Mask()), ("causal", burstlab.Mask(causal=True)),
                       ("window(6,3)", burstlab.Mask.window(6, 3)), ("causal+document", docs & "causal")):
        assert mask.dense(N_q, N_k).any(axis=1).all()  # no empty row
        o, dq, dk, dv = sdpa(torch, q, k, v, do, mask)
        report(f"torch SDPA {dtype} mask={name}",
               assert_attention_close(q, k, v, out=o, dq=dq, dk=dk, dv=dv, do=do, mask=mask,
                                      msg=f"torch SDPA {dtype} mask={name}"))


def test_sdpa_empty_rows_efficient_backend():
    """Rows with no visible key (spec §2.3: O = 0, zero gradients): SDPA's memory-efficient backend in
    bf16, which docs/conformance.md measured returning zeros there."""
    torch = require_gpu()
    from torch.nn.attention import SDPBackend

    sq, sk = shapes("BHSD")
    q, k, v, do = (randn(torch, s, torch.bfloat16, 20 + i) for i, s in enumerate((sq, sk, sk, sq)))
    mask = masks_37_50()["document"]
    assert not mask.dense(N_q, N_k).any(axis=1).all()
    o, dq, dk, dv = sdpa(torch, q, k, v, do, mask, SDPBackend.EFFICIENT_ATTENTION)
    report("torch SDPA bf16 EFFICIENT_ATTENTION mask=document (12 empty rows)",
           assert_attention_close(q, k, v, out=o, dq=dq, dk=dk, dv=dv, do=do, mask=mask, layout="BHSD"))


def test_sdpa_sampled_check_on_cuda_tensors():
    """The row-sampled check (check_rows=K) on CUDA tensors: SDPA at N = 8192, bf16, causal, O and
    dQ on 64 sampled rows (SDPA returns no LSE, which the dK, dV columns would need), and a
    perturbed row of O named at its coordinate."""
    torch = require_gpu()
    F = torch.nn.functional
    N, d = 8192, 64
    q, k, v, do = (randn(torch, (1, 4, N, d), torch.bfloat16, 30 + i) for i in range(4))
    q.requires_grad_(True)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # top-left = bottom-right when N_q = N_k
    o.backward(do)
    r = assert_attention_close(q.detach(), k, v, out=o.detach(), dq=q.grad, do=do, mask="causal", check_rows=64)
    report("torch SDPA bf16 causal N=8192, sampled K=64", r)
    s = burstlab.oracle(q.detach(), k, v, mask="causal", check_rows=64)
    b, h, i = (int(x) for x in s.rows[10].cpu())
    bad = o.detach().clone()
    bad[b, h, i, 7] += 1.0
    r = burstlab.check(q.detach(), k, v, out=bad, mask="causal", check_rows=64)
    assert [m.index for m in r["O"].mismatches] == [(b, h, i, 7)]
