"""PyTorch CPU tensors: oracle and check in every layout and dtype (bf16 included), strided
tensors, results as tensors; the operator (burstlab.cuda.attention) on the CPU kernel: forward and
backward against the oracle, gradcheck in fp64, opcheck, torch.compile (torch >= 2.4)."""
import numpy as np
import pytest
from conftest import gradcheck_problem, masks_37_50, require_custom_op, require_torch

import burstlab
from burstlab.testing import assert_attention_close


def randn(torch, shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_oracle_and_check_from_tensors(layout, dtype):
    torch = require_torch()
    t = getattr(torch, dtype)
    shape_q = (2, 37, 4, 16) if layout == "BSHD" else (2, 4, 37, 16)
    shape_k = (2, 50, 2, 16) if layout == "BSHD" else (2, 2, 50, 16)
    q, do = randn(torch, shape_q, t, 1), randn(torch, shape_q, t, 2)
    k, v = randn(torch, shape_k, t, 3), randn(torch, shape_k, t, 4)
    q.requires_grad_(True)  # read through .detach(): no autograd involvement
    for mask in masks_37_50().values():
        r = burstlab.oracle(q, k, v, do=do, mask=mask, layout=layout)
        assert isinstance(r.O, torch.Tensor) and r.O.dtype == torch.float64 and r.LSE.shape == (2, 4, 37)
        # the same values as NumPy fp64 arrays give
        w = burstlab.oracle(*(x.detach().double().numpy() for x in (q, k, v)), do=do.double().numpy(), mask=mask,
                            layout=layout)
        for name in ("O", "LSE", "dQ", "dK", "dV"):
            assert np.array_equal(getattr(r, name).numpy(), getattr(w, name)), name
        # the oracle rounded to the candidate's dtype passes its check; the bound is the dtype's
        lse = r.LSE.float() if t != torch.float64 else r.LSE
        res = assert_attention_close(q, k, v, out=r.O.to(t), lse=lse, dq=r.dQ.to(t), dk=r.dK.to(t), dv=r.dV.to(t),
                                     do=do, mask=mask, layout=layout)
        assert res.dtype == {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]


def test_strided_tensors_and_shared_memory():
    torch = require_torch()
    from burstlab._tensors import as_array

    base = randn(torch, (2, 4, 37, 16), torch.float64, 5)
    q = base.transpose(1, 2)  # BSHD view of BHSD memory: not contiguous
    a, tag = as_array(q, "q")
    assert tag == "fp64" and a.__array_interface__["data"][0] == q.data_ptr() and not q.is_contiguous()
    k = randn(torch, (2, 2, 50, 16), torch.float64, 6).transpose(1, 2)
    v = randn(torch, (2, 2, 100, 16), torch.float64, 7)[:, :, ::2].transpose(1, 2)
    r = burstlab.oracle(q, k, v, mask="causal", layout="BSHD")
    w = burstlab.oracle(q.contiguous(), k.contiguous(), v.contiguous(), mask="causal", layout="BSHD")
    assert torch.allclose(r.O, w.O, rtol=1e-12, atol=1e-12) and torch.equal(r.LSE.isinf(), w.LSE.isinf())
    # a perturbed strided candidate is named at its logical coordinates
    o = w.O.clone().transpose(1, 2).contiguous().transpose(1, 2)  # BSHD logical, BHSD memory
    o[1, 20, 3, 4] += 1e-3
    res = burstlab.check(q, k, v, out=o, mask="causal", layout="BSHD")
    assert res["O"].mismatches[0].index == (1, 3, 20, 4) and res["O"].wrong == 1


def test_case_tensors_and_check():
    """A bf16 case as torch.bfloat16 tensors, and Case.check of a bf16 candidate tensor."""
    torch = require_torch()
    c = burstlab.suite(quick=True, dtype="bf16")[1]
    q, k, v, do = c.tensors()
    assert q.dtype == torch.bfloat16 and torch.equal(q.float(), torch.from_numpy(c.q))
    e = c.expected
    out = torch.from_numpy(np.array(e.O)).to(torch.bfloat16)
    r = c.check(out=out, lse=torch.from_numpy(np.array(e.LSE)).float())
    assert r.passed and r.dtype == "bf16" and 0 < r["O"].err_bound < 1, str(r)
    out[0, 5, 1, 7] += 1.0  # BSHD case: logical (b=0, h=1, i=5, k=7)
    assert c.check(out=out)["O"].mismatches[0].index == (0, 1, 5, 7)


# ---- the operator on CPU tensors (the cpu layer) ---------------------------------------------
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_operator_against_the_oracle(layout, dtype):
    torch = require_custom_op()
    import burstlab.cuda as bc

    t = getattr(torch, dtype)
    sq, sk = ((2, 37, 4, 16), (2, 50, 2, 16)) if layout == "BSHD" else ((2, 4, 37, 16), (2, 2, 50, 16))
    for mname, mask in masks_37_50().items():
        q, k, v = (randn(torch, s, t, i).requires_grad_(True) for i, s in enumerate((sq, sk, sk)))
        do = randn(torch, sq, t, 9)
        o, lse = bc.attention(q, k, v, mask=mask, layout=layout, return_lse=True)
        o.backward(do)
        assert_attention_close(q, k, v, out=o, lse=lse, dq=q.grad, dk=k.grad, dv=v.grad, do=do, mask=mask,
                               layout=layout, msg=f"operator (cpu layer), mask {mname}")


def test_operator_gradcheck_opcheck_and_compile():
    torch = require_custom_op()
    import burstlab.cuda as bc

    mask, q, k, v = gradcheck_problem(torch, randn)
    assert torch.autograd.gradcheck(lambda q, k, v: bc.attention(q, k, v, mask=mask), (q, k, v))
    torch.library.opcheck(torch.ops.burstlab.attention.default, (q, k, v, mask.json, None, "BHSD", "auto", True))
    o, lse = bc.attention(q, k, v, mask=mask, return_lse=True)
    torch.library.opcheck(torch.ops.burstlab.attention_backward.default,
                          (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse, mask.json, None,
                           "BHSD", "auto", True))

    def loss(q, k, v):
        return (bc.attention(q, k, v, mask=mask) ** 2).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = compiled(q, k, v)
    got.backward()
    g = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want = loss(q, k, v)
    want.backward()
    assert torch.equal(got, want) and all(torch.equal(a, x.grad) for a, x in zip(g, (q, k, v)))


def test_operator_bad_input():
    torch = require_custom_op()
    import burstlab.cuda as bc

    q = torch.randn(1, 4, 8, 8)
    k = torch.randn(1, 3, 8, 8)
    with pytest.raises(ValueError, match=r"H_q \(4\) must be a multiple of H_kv \(3\)"):
        bc.attention(q, k, k)
    with pytest.raises(ValueError, match="v .* must have q's dtype"):
        bc.attention(q, q, q.double())
    with pytest.raises(ValueError, match="unknown field 'windw'"):
        bc.attention(q, q, q, mask={"windw": 1})
    with pytest.raises(ValueError, match=r"scale \(nan\) must be finite"):
        bc.attention(q, q, q, scale=float("nan"))
    with pytest.raises(ValueError, match="cpu layer runs fp32 and fp64"):
        bc.attention(q.half(), q.half(), q.half())
