"""Shared fixtures of the Python tests (python/tests, run by ctest as python.pytest).

BURSTLAB_BIN names the `burstlab` command line (ctest sets it) for the round trips; without it the
round-trip tests skip with a message. BURSTLAB_SAME_BUILD=1 (ctest sets it) says the module and the
command line come from one build, so their fp64 results must agree bit for bit; otherwise (e.g. a
pip-installed module, compiled without -march=native, against a native CLI) to 1e-12 relative. PyTorch tests skip when torch is not importable, and the
operator's tests when torch has no torch.library.custom_op (< 2.4, e.g. Debian 12's 1.13); GPU
tests skip without a CUDA device, unless BURSTLAB_REQUIRE_GPU=1, which makes them fail instead.
"""
import json
import os
import subprocess

import numpy as np
import pytest

import burstlab

try:
    import torch
except ImportError:  # the PyTorch tests skip
    torch = None


# The repository's root, and a script of it (no .py suffix needed) loaded as a module.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(path, name):
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def require_torch():
    if torch is None:
        pytest.skip("PyTorch is not installed for this interpreter (Debian: python3-torch)")
    return torch


def require_custom_op():
    require_torch()
    if not hasattr(torch.library, "custom_op"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.custom_op: the operator needs torch >= 2.4")
    return torch


def require_gpu():
    """A CUDA device, torch with CUDA and burstlab's _cuda module, or a skip (a failure under
    BURSTLAB_REQUIRE_GPU=1) saying which is missing."""
    why = ""
    if torch is None:
        why = "PyTorch is not installed"
    elif not torch.cuda.is_available():
        why = f"torch {torch.__version__} sees no CUDA device"
    else:
        import burstlab.cuda

        why = burstlab.cuda.why_unavailable()
    if why:
        if os.environ.get("BURSTLAB_REQUIRE_GPU") == "1":
            pytest.fail(f"BURSTLAB_REQUIRE_GPU=1 but {why}")
        pytest.skip(why)
    return torch


SAME_BUILD = os.environ.get("BURSTLAB_SAME_BUILD") == "1"


def agree(a, b, tol=1e-12):
    """Bitwise equal in one build; else equal up to the rounding of other instructions (FMA or not):
    |a - b| <= tol (1 + max |b|) (cancelling sums, as with wide V, lose digits relative to the
    element, not to the tensor), non-finite values in the same places."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if SAME_BUILD:
        return np.array_equal(a, b)
    fin = np.isfinite(b)
    scale = 1 + (np.abs(b[fin]).max() if fin.any() else 0)
    return np.array_equal(a[~fin], b[~fin]) and bool(np.all(np.abs(a[fin] - b[fin]) <= tol * scale))


def agree_json(a, b, tol=1e-9):
    """Two check --json objects: equal in one build; else every number within tol relative (bounds and
    errors are computed from the oracle's last bits)."""
    if SAME_BUILD:
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(agree_json(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(agree_json(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return abs(a - b) <= tol * (1 + abs(b))
    if isinstance(a, str) and isinstance(b, str) and a.startswith("(b=") and b.startswith("(b="):
        return a.split(":")[0] == b.split(":")[0]  # mismatch lines: the coordinates; values print 10 digits
    return a == b


@pytest.fixture
def rng():
    return np.random.default_rng(20)


@pytest.fixture(scope="session")
def cli():
    exe = os.environ.get("BURSTLAB_BIN")
    if not exe or not os.path.exists(exe):
        pytest.skip("BURSTLAB_BIN does not name the burstlab command line (ctest sets it)")
    return exe


def run_cli(exe, *args, ok=(0,)):
    p = subprocess.run([exe, *args], capture_output=True, text=True)
    assert p.returncode in ok, f"burstlab {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="session")
def cli_suite(cli, tmp_path_factory):
    """The quick suite written by `burstlab gen --oracle` in fp32, bf16 and fp16."""
    d = tmp_path_factory.mktemp("cli-suite")
    run_cli(cli, "gen", "--out", str(d), "--quick", "--oracle", "--dtype", "fp32,bf16,fp16")
    return d


def load_npy(path):
    """A case file's array as (NumPy array of values, dtype name); bf16 ('<V2') widened to fp32."""
    a = np.load(path)
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32), "bf16"
    return a, {np.float64: "fp64", np.float32: "fp32", np.float16: "fp16"}[a.dtype.type]


def case_meta(case_dir):
    with open(os.path.join(case_dir, "case.json")) as f:
        return json.load(f)


def inputs(shape_q, shape_kv, rng, dtype=np.float64):
    """Random q, k, v, do (never zeros) in the given shapes."""
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_kv).astype(dtype)
    v = rng.standard_normal(shape_kv).astype(dtype)
    do = rng.standard_normal(shape_q).astype(dtype)
    return q, k, v, do


# Masks of every kind for N_q = 37, N_k = 50 (spec §3): documents with an empty key side (fully
# masked rows), a block mask with an all-zero block row, and their conjunction with causal.
def masks_37_50():
    qs = [0] * 10 + [1] * 12 + [2] * 15
    ks = [0] * 20 + [2] * 30  # document 1 has no keys: its 12 rows are empty
    nbq, nbk = (37 + 7) // 8, (50 + 15) // 16
    bits = np.random.default_rng(5).integers(0, 2, size=(nbq, nbk))
    bits[1, :] = 0
    return {
        "none": burstlab.Mask(),
        "causal": burstlab.Mask(causal=True),
        "window": burstlab.Mask.window(6, 3),
        "document": burstlab.Mask.document(qs, ks),
        "block": burstlab.Mask.block(8, 16, bits),
        "causal+document+block": burstlab.Mask(causal=True) & burstlab.Mask.document(qs, ks)
        & burstlab.Mask.block(8, 16, bits),
    }


def gradcheck_problem(torch, randn):
    """The gradchecks' small fp64 problem: GQA on masks_37_50's mask with every part (empty rows
    included); q, k, v from randn(torch, shape, dtype, seed), requiring grad."""
    mask = masks_37_50()["causal+document+block"]
    q, k, v = (randn(torch, shape, torch.float64, seed).requires_grad_(True)
               for shape, seed in (((1, 2, 37, 4), 1), ((1, 1, 50, 4), 2), ((1, 1, 50, 4), 3)))
    return mask, q, k, v


def to_layout(x, layout):
    """A (B, H, N, d) array in layout (a view: BSHD is a transposed view of BHSD data)."""
    return x if layout == "BHSD" else x.transpose(0, 2, 1, 3)
