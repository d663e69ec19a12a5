"""burstlab from Python: the fp64 attention oracle and the spec §9 checker (docs/conformance.md).

    import burstlab
    ref = burstlab.oracle(q, k, v, mask=burstlab.Mask(causal=True), do=do)   # fp64 O, LSE, dQ, dK, dV
    print(burstlab.check(q, k, v, out=o, lse=lse, mask="causal"))           # the `burstlab check` table

Inputs are NumPy arrays or PyTorch tensors (CPU or CUDA, fp64/fp32/bf16/fp16, any strides) in
layout "BHSD" (B, H, N, d), as SDPA and the case files (the default everywhere, as on the command
line), or "BSHD" (B, N, H, d), as flash-attn (pass layout="BSHD"); K and V may have fewer heads
than Q (GQA/MQA). Bad input raises ValueError (burstlab.Error) naming the field; a problem that
does not fit in memory raises burstlab.NotEnoughMemory (a ValueError and a MemoryError) with what
fits, before anything big is allocated; check_rows=K (check, oracle, assert_attention_close) uses
the row-sampled oracle of spec §9.11 instead, O(K N d), also on one rank's shard with its global
positions (q_positions, k_positions). burstlab.testing.assert_attention_close raises
AssertionError with the table; burstlab.cuda.attention is the cuda layer as a PyTorch operator
(burstlab.cuda.why_unavailable() says why it cannot run here, also without PyTorch).
"""
import importlib as _importlib
import json as _json
import os as _os
from typing import NamedTuple as _NamedTuple

import numpy as _np

from . import _core
from ._core import CheckResult, Error, Mismatch, NotEnoughMemory, TensorCheck
from ._tensors import as_array as _as_array
from ._tensors import dtype_name as _dtype_name
from ._tensors import layout_hint as _layout_hint
from ._tensors import layout_name as _layout_name
from ._tensors import like as _like
from ._tensors import scale_value as _scale_value
from .mask import Mask

__version__ = "0.1.0"
__all__ = ["oracle", "check", "Mask", "Case", "suite", "CheckResult", "TensorCheck", "Mismatch", "Error",
           "NotEnoughMemory", "Forward", "ForwardBackward", "Sampled", "testing", "cuda"]


def __dir__():
    # The public names only (tab completion, dir()): not the modules imported to implement them.
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__") and n.endswith("__")})


class Forward(_NamedTuple):
    """The oracle's forward: O in the inputs' layout, LSE (B, H_q, N_q), natural log, -inf on
    empty rows (spec §2.3); fp64."""
    O: object
    LSE: object


class ForwardBackward(_NamedTuple):
    """Forward plus the gradients for dO (spec §5): dQ like Q, dK and dV like K; fp64."""
    O: object
    LSE: object
    dQ: object
    dK: object
    dV: object


class Sampled(_NamedTuple):
    """The row-sampled oracle (spec §9.11): `rows` (n, 3) int64 = (b, h, i) with O (n, d), LSE (n)
    and, with do, dQ (n, d), exactly in fp64 from the inputs; with out and lse (the candidate's own
    forward) also `columns` (n, 3) = (b, h_kv, j) with dK, dV (n, d) given that forward. `bounds`:
    the spec §9 bound of each value for a candidate of `dtype` (dict "O", "LSE", "dQ", "dK", "dV")."""
    rows: object
    O: object
    LSE: object
    dQ: object
    columns: object
    dK: object
    dV: object
    bounds: dict


def _positions(x, name):
    if x is None:
        return None
    if hasattr(x, "detach"):  # torch: host copy of the (small) index vector
        x = x.detach().cpu().numpy()
    a = _np.asarray(x)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} has dtype {a.dtype}: integer global positions expected")
    return a.astype(_np.int64)


def _check_rows_value(check_rows):
    if isinstance(check_rows, bool) or not isinstance(check_rows, (int, _np.integer)):
        raise ValueError(f"check_rows ({check_rows!r}) must be an integer >= 1")
    if check_rows < 1:
        raise ValueError(f"check_rows ({check_rows}) must be >= 1")
    return int(check_rows)


def oracle(q, k, v, *, mask=None, scale=None, layout="BHSD", do=None, check_rows=None, seed=0, out=None, lse=None,
           dtype="fp64", lse_empty="-inf", lse_base="e"):
    """The fp64 oracle (reference<double>, spec §2 and §5) on the caller's inputs.

    q (B, H_q, N_q, d) and k, v (B, H_kv, N_k, d) for layout "BHSD" (the default: SDPA's and the
    case files'); (B, N, H, d) for "BSHD" (flash-attn's).
    mask: None (every key), "causal", a burstlab.Mask or a dict of its fields. scale: default
    1/sqrt(d). With do (shaped like q) the gradients are returned too. Returns Forward(O, LSE) or
    ForwardBackward(O, LSE, dQ, dK, dV) in fp64: NumPy arrays, or torch tensors on q's device
    when q is a torch tensor. fp64 NumPy / CPU-tensor inputs are read in place, whatever their
    strides; other dtypes are converted to fp64 exactly. A problem whose oracle does not fit in
    this machine's memory raises NotEnoughMemory (needed, available, and what fits) up front.

    check_rows=K: the row-sampled oracle instead (spec §9.11, `burstlab run --check-rows K`),
    O(K N d) work and no N x N buffer; returns Sampled: K query rows (b, h, i) chosen from `seed`
    as the command line chooses them, their O, LSE (and dQ with do) exactly; with out and lse (the
    candidate's global O and LSE) also K key columns' dK, dV given that forward; the bounds for a
    candidate of `dtype`. A problem that does not fit even so raises NotEnoughMemory with what fits.
    """
    layout = _layout_name(layout)
    m = Mask.of(mask)
    if check_rows is None:
        if out is not None or lse is not None:
            raise ValueError("out and lse are read only by the sampled oracle (check_rows=K)")
    else:
        K = _check_rows_value(check_rows)
        qa, _ = _as_array(q, "q")
        ka, _ = _as_array(k, "k")
        va, _ = _as_array(v, "v")
        da = None if do is None else _as_array(do, "do")[0]
        oa = None if out is None else _as_array(out, "out")[0]
        la = None if lse is None else _as_array(lse, "lse")[0]
        with _layout_hint(layout):
            r = _core.sampled_oracle(qa, ka, va, da, m.json, _scale_value(scale), layout, K, int(seed), oa, la,
                                     _dtype_name(dtype), str(lse_empty), str(lse_base))
        vals = _like(q, [r.get(n) for n in ("rows", "O", "LSE", "dQ", "columns", "dK", "dV")])
        bounds = dict(zip(("O", "LSE", "dQ", "dK", "dV"),
                          _like(q, [r.get("bound_" + n) for n in ("O", "LSE", "dQ", "dK", "dV")])))
        return Sampled(*vals, {n: b for n, b in bounds.items() if b is not None})
    qa, _ = _as_array(q, "q")
    ka, _ = _as_array(k, "k")
    va, _ = _as_array(v, "v")
    da = None if do is None else _as_array(do, "do")[0]
    with _layout_hint(layout):
        res = _core.oracle(qa, ka, va, da, m.json, _scale_value(scale), layout)
    res = _like(q, list(res))
    return Forward(*res) if do is None else ForwardBackward(*res)


def check(q, k, v, *, out=None, lse=None, dq=None, dk=None, dv=None, do=None, mask=None, scale=None,
          layout="BHSD", dtype=None, lse_empty="-inf", lse_base="e", max_list=5, name=None, check_rows=None, seed=0,
          q_positions=None, k_positions=None):
    """Checks a candidate's outputs against the fp64 oracle under the spec §9 rule, as
    `burstlab check` does, and returns the CheckResult (``str()`` is the same table).

    q, k, v (and do, needed for dq, dk, dv) are the inputs the candidate read, in its precision,
    in layout "BHSD" (B, H, N, d) (the default) or "BSHD" (B, N, H, d), as the candidate's tensors;
    out, lse, dq, dk, dv are what it returned (only the tensors given are checked). dtype: the
    candidate's precision for the bound (default: out's dtype, else the gradients', else q's).
    lse_empty="+inf" and lse_base="2" convert other LSE conventions first (spec §2.3).
    The result: .passed (also its truth value), .tensors (max_abs, max_rel, err_bound, wrong,
    checked, mismatches with their (b, h, i, k) coordinates), .json().

    check_rows=K: the row-sampled check (spec §9.11, `burstlab run --check-rows K`) for problems
    the full oracle cannot hold: O, LSE, dQ on K query rows exactly; dK, dV on K key columns given
    the candidate's own out and lse (which must then be given, over all N_q rows); O(K N d) work.
    q, k, v, do stay global; a candidate tensor may be one rank's shard: q_positions (out, lse, dq)
    or k_positions (dk, dv) give the global position of each of its rows (the same for every
    (b, h)), the rows sampled are the shard's and the report names global coordinates.
    """
    layout = _layout_name(layout)
    m = Mask.of(mask)
    qa, qt = _as_array(q, "q")
    ka, kt = _as_array(k, "k")
    va, vt = _as_array(v, "v")
    for n, t in (("k", kt), ("v", vt)):
        if t != qt:
            raise ValueError(f"{n} has dtype {t} but q has {qt}: the inputs share one precision")
    da = None if do is None else _as_array(do, "do")[0]
    cand = {}
    for n, x in (("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv)):
        cand[n] = None if x is None else _as_array(x, n)
    if dtype is None:
        first = next((cand[n] for n in ("out", "dq", "dk", "dv") if cand[n] is not None), None)
        dtype = qt if first is None else first[1]
    dtype = _dtype_name(dtype)
    if not isinstance(max_list, int) or isinstance(max_list, bool):
        raise ValueError(f"max_list ({max_list!r}) must be an integer")
    arr = {n: (None if c is None else c[0]) for n, c in cand.items()}
    if check_rows is not None:
        K = _check_rows_value(check_rows)
        with _layout_hint(layout):
            return _core.check_sampled(qa, ka, va, da, m.json, _scale_value(scale), layout, arr["out"], arr["lse"],
                                       arr["dq"], arr["dk"], arr["dv"], dtype, str(lse_empty), str(lse_base), max_list,
                                       name or "", K, int(seed), _positions(q_positions, "q_positions"),
                                       _positions(k_positions, "k_positions"))
    if q_positions is not None or k_positions is not None:
        raise ValueError("q_positions and k_positions name a shard's rows for the sampled check: pass check_rows=K")
    with _layout_hint(layout):
        return _core.check(qa, ka, va, da, m.json, _scale_value(scale), layout, qt, arr["out"], arr["lse"],
                           arr["dq"], arr["dk"], arr["dv"], dtype, str(lse_empty), str(lse_base), max_list, name or "")


# ---- case files --------------------------------------------------------------------------------
_NP_OF = {"fp64": _np.float64, "fp32": _np.float32, "bf16": _np.float32, "fp16": _np.float16}


class Case:
    """A case of the conformance suite (check/case.hpp, docs/conformance.md): case.json + q k v dO
    .npy, and the oracle's expected outputs.

    Metadata: name, B, H_q, H_kv, N_q, N_k, d, scale, layout, dtype, values, seed, backward, mask
    (a burstlab.Mask). Inputs q, k, v, do: NumPy arrays in the case's layout and dtype (bf16
    cases as float32 arrays holding bf16 values; ``tensors()`` gives torch.bfloat16).
    """

    def __init__(self, handle):
        self._h = handle
        meta = _json.loads(handle.json)
        self.meta = meta
        for key in ("name", "B", "H_q", "H_kv", "N_q", "N_k", "d", "scale", "layout", "dtype", "values", "seed",
                    "backward", "mask_spec"):
            setattr(self, key, meta[key])
        self.mask = Mask.from_dict(meta["mask"])

    @classmethod
    def load(cls, dir):
        """Reads a case directory (`burstlab gen`), with expected/ when present (`burstlab oracle`)."""
        return cls(_core.read_case(_os.fspath(dir)))

    def save(self, dir, expected=True):
        """Writes case.json and q k v dO .npy into dir (created) and, with expected=True, the
        oracle's expected/ outputs: the same bytes as `burstlab gen --oracle`."""
        _core.write_case(self._h, _os.fspath(dir), bool(expected))

    def _input(self, a):
        if a is None:
            return None
        out = a.astype(_NP_OF[self.dtype]) if self.dtype != "fp64" else a.copy()
        return out

    @property
    def q(self):
        return self._input(self._h.q)

    @property
    def k(self):
        return self._input(self._h.k)

    @property
    def v(self):
        return self._input(self._h.v)

    @property
    def do(self):
        return self._input(self._h.do)

    def tensors(self, device=None):
        """(q, k, v, do) as torch tensors in the case's dtype (torch.bfloat16 for bf16) on device."""
        import torch

        t = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]
        conv = [None if a is None else torch.from_numpy(_np.array(a)).to(device=device, dtype=t)
                for a in (self._h.q, self._h.k, self._h.v, self._h.do)]
        return tuple(conv)

    @property
    def expected(self):
        """The fp64 oracle's outputs (read from expected/ or computed once, NotEnoughMemory when that
        does not fit), read-only arrays."""
        res = list(self._h.expected())
        for a in res:
            a.flags.writeable = False
        return Forward(*res) if len(res) == 2 else ForwardBackward(*res)

    def check(self, *, out=None, lse=None, dq=None, dk=None, dv=None, dtype=None, lse_empty="-inf",
              lse_base="e", layout=None, max_list=5):
        """`burstlab check` against this case's expected outputs: the candidate's tensors (NumPy or
        torch) in the case's layout (or `layout`); dtype defaults to the case's."""
        arr = {}
        for n, x in (("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv)):
            arr[n] = None if x is None else _as_array(x, n)[0]
        if dtype is None:
            dtype = ""
        else:
            dtype = _dtype_name(dtype)
        layout = self.layout if layout is None else _layout_name(layout)
        with _layout_hint(layout):
            return self._h.check(arr["out"], arr["lse"], arr["dq"], arr["dk"], arr["dv"], dtype, str(lse_empty),
                                 str(lse_base), layout, max_list)

    def __repr__(self):
        return (f"<burstlab.Case {self.name}: B={self.B} Hq={self.H_q} Hkv={self.H_kv} Nq={self.N_q} Nk={self.N_k} "
                f"d={self.d} {self.layout} {self.dtype} mask={self.mask_spec}>")


def suite(quick=True, dtype="fp32"):
    """The curated conformance suite (`burstlab gen`): every mask kind, GQA/MQA, ragged lengths,
    fully masked rows, large logits, ties, d in {1, 3, ..., 128} (256 in the full set). Seeds are
    fixed: the same cases, byte for byte, as the command line writes."""
    return [Case(h) for h in _core.suite(bool(quick), _dtype_name(dtype))]


def __getattr__(name):
    # burstlab.cuda imports torch and burstlab.testing is small: both load on first use.
    if name in ("cuda", "testing"):
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'burstlab' has no attribute '{name}'")
