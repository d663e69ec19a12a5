"""The package's surface: one layout default (BHSD, SDPA's and the command line's), burstlab.cuda
without PyTorch, the memory refusal before allocating, and a namespace without internal imports."""
import inspect
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import inputs

import burstlab
import burstlab.testing


def sdpa_numpy_backward(q, k, v, do, scale):
    """O, LSE, dQ, dK, dV of causal attention (bottom-right aligned, spec eq. 3.1) of (B, H, N, d)
    arrays in float64, independent of burstlab: the SDPA math with GQA by repetition (spec eq.
    2.1-2.4, 5.1-5.7)."""
    G = q.shape[1] // k.shape[1]
    K, V = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    N_q, N_k = q.shape[2], k.shape[2]
    S = np.where(np.arange(N_k)[None, :] <= np.arange(N_q)[:, None] + (N_k - N_q), scale * q @ K.transpose(0, 1, 3, 2),
                 -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    l = P.sum(-1, keepdims=True)
    P /= l
    LSE = (np.log(l) + S.max(-1, keepdims=True))[..., 0]
    O = P @ V
    dS = P * (do @ V.transpose(0, 1, 3, 2) - np.sum(do * O, -1, keepdims=True))
    dQ = scale * dS @ K
    B, H_kv, _, d = k.shape
    dK = (scale * dS.transpose(0, 1, 3, 2) @ q).reshape(B, H_kv, G, N_k, d).sum(2)
    dV = (P.transpose(0, 1, 3, 2) @ do).reshape(B, H_kv, G, N_k, d).sum(2)
    return O, LSE, dQ, dK, dV


# ---- one layout default -----------------------------------------------------------------------
def test_sdpa_shaped_arrays_pass_without_layout(rng):
    """(B, H, N, d) arrays, as SDPA takes them, with no layout=: the correct output passes, the
    README's snippet as written."""
    q, k, v, do = inputs((2, 4, 37, 16), (2, 2, 50, 16), rng)
    want = sdpa_numpy_backward(q, k, v, do, 16 ** -0.5)
    ref = burstlab.oracle(q, k, v, mask=burstlab.Mask(causal=True), do=do)
    for name, got, w in zip(ref._fields, ref, want):
        assert got.shape == w.shape and np.abs(got - w).max() < 1e-12, name
    o, lse, dq, dk, dv = want
    r = burstlab.testing.assert_attention_close(q, k, v, out=o, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask="causal")
    assert r.passed and [t.name for t in r.tensors] == ["O", "LSE", "dQ", "dK", "dV"]
    assert burstlab.check(q, k, v, out=o.astype(np.float32), mask="causal").passed


@pytest.mark.parametrize("readme", ["README.md", "python/README.md"])
def test_readme_snippet_runs_as_written(rng, readme):
    """The first ```python block of README.md (under "From Python") and of python/README.md, run as
    written on SDPA-shaped float32 arrays with a candidate computed in NumPy."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", readme)
    with open(path) as f:
        text = f.read()
    if readme == "README.md":
        text = text[text.index("## From Python"):]
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    q, k, v, do = (x.astype(np.float32) for x in inputs((2, 4, 37, 16), (2, 2, 50, 16), rng))
    want = sdpa_numpy_backward(*(x.astype(np.float64) for x in (q, k, v, do)), 16 ** -0.5)
    o, lse, dq, dk, dv = (x.astype(np.float32) for x in want)
    scope = {"q": q, "k": k, "v": v, "do": do, "o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    exec(compile(snippet, readme, "exec"), scope)
    assert scope["ref"].O.shape == q.shape and scope["ref"].dK.shape == k.shape
    o[0, 1, 2, 3] += 0.1  # and a wrong output fails it
    with pytest.raises(AssertionError, match=r"O \(b=0, h=1, i=2, k=3\)"):
        exec(compile(snippet, readme, "exec"), scope)


def test_one_layout_default_everywhere(cli):
    """burstlab.oracle, check, testing.assert_attention_close and cuda.attention default to the
    command line's layout."""
    import burstlab.cuda

    p = subprocess.run([cli, "run", "--help"], capture_output=True, text=True)
    m = re.search(r"--layout \w+[=\[ ]+(B\w+)", p.stdout)  # CLI11: "--layout TEXT=BHSD"
    assert m, p.stdout
    cli_default = m.group(1)
    assert cli_default == "BHSD"
    for f in (burstlab.oracle, burstlab.check, burstlab.testing.assert_attention_close, burstlab.cuda.attention):
        assert inspect.signature(f).parameters["layout"].default == cli_default, f.__qualname__


def test_flash_attn_shaped_arrays_say_which_layout_was_read(rng):
    """(B, N, H, d) arrays without layout= are read as (B, H, N, d): a shape error says so and
    names layout='BSHD'; with it they are read right."""
    q, k, v, _ = inputs((1, 20, 4, 8), (1, 30, 2, 8), rng)
    with pytest.raises(burstlab.Error, match=r"H_q \(20\) must be a multiple of H_kv \(30\) \(arrays read as "
                                             r"layout 'BHSD': \(B, H, N, d\); for \(B, N, H, d\) arrays pass "
                                             r"layout='BSHD'\)"):
        burstlab.oracle(q, k, v)
    r = burstlab.oracle(q, k, v, layout="BSHD")
    assert r.O.shape == q.shape and r.LSE.shape == (1, 4, 20)


# ---- burstlab.cuda without PyTorch ----------------------------------------------------------------
def test_cuda_without_torch_says_why():
    """With torch not importable: `import burstlab` and hasattr(burstlab, "cuda") work,
    burstlab.cuda.available() is False, why_unavailable() names PyTorch, attention() raises it."""
    code = "\n".join([
        "import sys",
        "sys.modules['torch'] = None  # import torch now raises ImportError",
        "import burstlab",
        "assert hasattr(burstlab, 'cuda')",
        "assert burstlab.cuda.available() is False",
        "why = burstlab.cuda.why_unavailable()",
        "assert why.startswith('PyTorch is not importable'), why",
        "try:",
        "    burstlab.cuda.attention(None, None, None)",
        "except RuntimeError as e:",
        "    assert str(e) == why, e",
        "else:",
        "    raise SystemExit('attention ran without torch')",
        "print(why)",
    ])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PyTorch is not importable" in p.stdout


# ---- memory: refused before allocating ---------------------------------------------------------------
AVAILABLE = 200_000_000  # bytes, through BURSTLAB_MEMORY_AVAILABLE: the same verdict on every machine


def refusal(call):
    with pytest.raises(burstlab.NotEnoughMemory) as e:
        call()
    text = str(e.value)
    m = re.search(r"^not enough memory for (.+?): ([\d.]+ [kMGTPE]B) needed, 200\.0 MB available "
                  r"\(BURSTLAB_MEMORY_AVAILABLE\); the largest part: .+; it fits with N_q and N_k up to (\d+)", text)
    assert m, text
    return text, int(m.group(3))


def test_oracle_too_big_is_refused_with_what_fits(monkeypatch):
    """200000 rows: the oracle's N_q x N_k would need hundreds of GB. NotEnoughMemory (a ValueError
    and a MemoryError) names the need, what is available and the length that fits, which then runs."""
    monkeypatch.setenv("BURSTLAB_MEMORY_AVAILABLE", str(AVAILABLE))
    q = np.zeros((1, 1, 200_000, 8))
    text, n = refusal(lambda: burstlab.oracle(q, q, q))
    assert text.startswith("not enough memory for the fp64 oracle (reference<fp64>)")
    assert issubclass(burstlab.NotEnoughMemory, MemoryError) and issubclass(burstlab.NotEnoughMemory, ValueError)
    assert 1000 < n < 200_000
    small = np.zeros((1, 1, n, 8))
    assert burstlab.oracle(small, small, small, mask="causal").O.shape == small.shape
    # with do: the gradients' buffers too; the forward alone is offered when it fits
    r = np.random.default_rng(1).standard_normal((1, 1, n, 8))
    text, n_bwd = refusal(lambda: burstlab.oracle(r, r, r, do=r))
    assert n_bwd < n and "or without do (the forward alone: " in text
    assert burstlab.oracle(r[:, :, :n_bwd], r[:, :, :n_bwd], r[:, :, :n_bwd], do=r[:, :, :n_bwd]).dQ.shape[2] == n_bwd


def test_check_too_big_is_refused_with_what_fits(monkeypatch):
    monkeypatch.setenv("BURSTLAB_MEMORY_AVAILABLE", str(AVAILABLE))
    q = np.zeros((1, 1, 200_000, 8), np.float32)
    text, n = refusal(lambda: burstlab.check(q, q, q, out=q))
    assert text.startswith("not enough memory for the fp64 oracle's")
    small = q[:, :, :n]
    assert burstlab.check(small, small, small, out=small).passed


# ---- the namespace -----------------------------------------------------------------------------------
def test_namespace_has_no_internal_imports():
    names = set(dir(burstlab))
    assert not names & {"np", "os", "json", "importlib", "NamedTuple", "Optional", "as_array", "like",
                         "dtype_name", "layout_name", "scale_value", "is_torch"}
    assert set(burstlab.__all__) <= names and "__version__" in names
    assert not [n for n in names if not n.startswith("__") and n not in burstlab.__all__]
    for n in burstlab.__all__:
        assert getattr(burstlab, n) is not None
