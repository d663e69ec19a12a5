"""Arrays in, arrays out: how burstlab reads NumPy arrays, PyTorch tensors and DLPack producers.

Every input becomes a NumPy array that shares the caller's memory where it can:
* NumPy arrays as they are (any strides, any layout);
* PyTorch CPU tensors through ``.numpy()`` (the same memory and strides); CUDA tensors are
  copied to the host first, in their own dtype (the oracle runs on the CPU); bfloat16, which
  NumPy cannot hold, as its uint16 bits (the same memory and strides), which the C++ side reads
  as bf16;
* other objects with ``__dlpack__`` through ``numpy.from_dlpack``, and anything else through the
  buffer protocol / array interface (``numpy.asarray``).
The C++ side then reads fp64 arrays in place and converts the rest to fp64 exactly; the sampled
check (check_rows=K) reads every array in place, in its own dtype.
"""
import contextlib
import re
import sys

import numpy as np

from . import _core

DTYPES = ("fp64", "fp32", "bf16", "fp16")
_NP = {np.dtype(np.float64): "fp64", np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16"}
_ALIASES = {"fp64": "fp64", "f64": "fp64", "float64": "fp64", "double": "fp64",
            "fp32": "fp32", "f32": "fp32", "float32": "fp32", "float": "fp32",
            "bf16": "bf16", "bfloat16": "bf16",
            "fp16": "fp16", "f16": "fp16", "float16": "fp16", "half": "fp16"}


def torch_module():
    """PyTorch if the caller has imported it (burstlab never imports it for them)."""
    return sys.modules.get("torch")


def is_torch(x):
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def dtype_name(t, what="dtype"):
    """'fp64' | 'fp32' | 'bf16' | 'fp16' from a string, a NumPy dtype or a torch.dtype."""
    if isinstance(t, str):
        if t.lower() in _ALIASES:
            return _ALIASES[t.lower()]
        raise ValueError(f"{what} ({t!r}) must be one of fp64, fp32, bf16, fp16")
    torch = torch_module()
    if torch is not None and isinstance(t, torch.dtype):
        name = str(t).replace("torch.", "")
    else:
        try:
            name = np.dtype(t).name
        except TypeError:
            raise ValueError(f"{what} ({t!r}) must be one of fp64, fp32, bf16, fp16") from None
    if name in _ALIASES:
        return _ALIASES[name]
    raise ValueError(f"{what} ({t}) must be a floating-point type: fp64, fp32, bf16 or fp16")


def as_array(x, name):
    """(NumPy array sharing memory where possible, its precision 'fp64'|'fp32'|'bf16'|'fp16')."""
    if is_torch(x):
        t = x.detach()
        if t.is_complex() or not t.is_floating_point():
            raise ValueError(f"{name} has dtype {t.dtype}: a floating-point tensor expected")
        tag = dtype_name(t.dtype, name)
        if t.device.type != "cpu":
            t = t.cpu()
        if tag == "bf16":  # the same memory seen as int16, then as NumPy's uint16
            return t.view(torch_module().int16).numpy().view(np.uint16), tag
        return t.numpy(), tag
    if isinstance(x, np.ndarray):
        a = x
    elif hasattr(x, "__dlpack__"):
        a = np.from_dlpack(x)
    else:
        try:
            a = np.asarray(x)
        except Exception as e:  # noqa: BLE001 - anything NumPy cannot read is bad input here
            raise ValueError(f"{name} ({type(x).__name__}) is not an array: {e}") from None
    if a.dtype.name == "bfloat16":  # ml_dtypes: its bits, in place
        return a.view(np.uint16), "bf16"
    if a.dtype not in _NP:
        raise ValueError(f"{name} has dtype {a.dtype}: float64, float32, float16 or bfloat16 expected")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("="))
    return a, _NP[a.dtype]


def layout_name(layout):
    if not isinstance(layout, str) or layout.upper() not in ("BSHD", "BHSD"):
        raise ValueError(f"layout ({layout!r}) must be 'BHSD' (B, H, N, d) or 'BSHD' (B, N, H, d)")
    return layout.upper()


# Errors about the problem's dimensions: the axes may have been read in the wrong layout.
_SHAPE_ERROR = re.compile(r"\b(B|H_q|H_kv|N_q|N_k|d) \(|shape|q_segment|k_segment|block_mask")
_AXES = {"BHSD": "(B, H, N, d)", "BSHD": "(B, N, H, d)"}


@contextlib.contextmanager
def layout_hint(layout):
    """Adds the layout the arrays were read in to a shape error: with the default "BHSD", arrays
    stored (B, N, H, d) are read with H and N swapped, and the message alone would not say so."""
    try:
        yield
    except _core.NotEnoughMemory:
        raise
    except _core.Error as e:
        text = str(e)
        if "layout" in text or not _SHAPE_ERROR.search(text):
            raise
        other = "BSHD" if layout == "BHSD" else "BHSD"
        raise type(e)(f"{text} (arrays read as layout {layout!r}: {_AXES[layout]}; for {_AXES[other]} arrays "
                      f"pass layout={other!r})") from None


def scale_value(scale):
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) and not hasattr(scale, "__float__"):
        raise ValueError(f"scale ({scale!r}) must be a number")
    return float(scale)


def like(template, arrays):
    """Outputs in the caller's kind: torch tensors on the template's device when it is a tensor,
    else the NumPy arrays themselves."""
    if not is_torch(template):
        return arrays
    torch = torch_module()
    return [None if a is None else torch.from_numpy(a).to(template.device) for a in arrays]
