"""burstlab.cuda: burstlab's attention as a PyTorch operator, to swap into a model and compare.

    o = burstlab.cuda.attention(q, k, v, mask=burstlab.Mask(causal=True))          # (B, H, N, d), as SDPA
    o, lse = burstlab.cuda.attention(q, k, v, layout="BSHD", return_lse=True)      # (B, N, H, d), as flash-attn

Two operators registered with torch.library (torch >= 2.4): ``burstlab::attention`` (forward:
O, LSE) and ``burstlab::attention_backward`` (dQ, dK, dV), with fake (meta) kernels for
torch.compile and the autograd formula of spec §5 connecting them. On CUDA tensors they run the
cuda layer (cuda/cuda.hpp: bf16, fp16, fp32, fp64; the fastest variant for the call, v1 for fp64)
on the caller's current stream; on CPU tensors the cpu layer (fp32, fp64). LSE is fp32 (fp64 for
fp64 inputs), natural log, -inf on empty rows, and is not differentiable (the backward of spec §5
has no LSE term). GQA/MQA: k and v may have fewer heads than q.

Without PyTorch this module still imports: available() is False, why_unavailable() says so, and
attention() raises RuntimeError with that reason.
"""
import math
from typing import Optional, Tuple

from . import _core
from .mask import _NAMED, Mask

__all__ = ["attention", "available", "why_unavailable"]

try:
    import torch
    _torch_error = None
except ImportError as e:
    torch = None
    _torch_error = str(e)

try:
    from . import _cuda
    _cuda_error = None
except ImportError as e:  # built without CUDA, or the CUDA runtime library is not found
    _cuda = None
    _cuda_error = str(e)

_DTYPE = {} if torch is None else {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16",
                                   torch.float16: "fp16"}
_HAVE_CUSTOM_OP = torch is not None and hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")


def why_unavailable():
    """'' when burstlab.cuda.attention can run on CUDA tensors here, else the reason."""
    if torch is None:
        return f"PyTorch is not importable ({_torch_error}): burstlab.cuda.attention is a PyTorch operator"
    if not _HAVE_CUSTOM_OP:
        return f"torch {torch.__version__} has no torch.library.custom_op (torch >= 2.4 needed)"
    if _cuda is None:
        return f"burstlab was built without its CUDA module (_cuda: {_cuda_error})"
    ok, why = _cuda.gpu_available()
    return "" if ok else f"no usable CUDA device: {why}"


def available():
    return why_unavailable() == ""


def _dims(t, layout):
    """Logical (B, H, N, d) dims and element strides of a tensor stored in layout."""
    s, st = t.shape, t.stride()
    if layout == "BSHD":
        return (s[0], s[2], s[1], s[3]), (st[0], st[2], st[1], st[3])
    return tuple(s), tuple(st)


def _dev4(t, layout):
    dims, strides = _dims(t, layout)
    return (t.data_ptr(), dims, strides)


def _dev3(t):
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()))


def _lse_shape(q, layout):
    (B, H, N, _), _ = _dims(q, layout)
    return (B, H, N)


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _np(t):
    return t.detach().numpy()


if _HAVE_CUSTOM_OP:

    @torch.library.custom_op("burstlab::attention", mutates_args=())
    def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str, scale: Optional[float],
                   layout: str, variant: str, deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(_lse_shape(q, layout), dtype=_lse_dtype(q.dtype), device=q.device)
        if q.device.type == "cuda":
            if _cuda is None:
                raise RuntimeError(why_unavailable())
            with torch.cuda.device(q.device):
                stream = torch.cuda.current_stream(q.device).cuda_stream
                _cuda.forward(_DTYPE[q.dtype], _dev4(q, layout), _dev4(k, layout), _dev4(v, layout), _dev4(o, layout),
                              _dev3(lse), mask, scale, stream, variant)
        else:
            _core.cpu_forward(_np(q), _np(k), _np(v), _np(o), _np(lse), mask, scale, layout)
        return o, lse

    @_attention.register_fake
    def _attention_fake(q, k, v, mask, scale, layout, variant, deterministic):
        return q.new_empty(q.shape), q.new_empty(_lse_shape(q, layout), dtype=_lse_dtype(q.dtype))

    @torch.library.custom_op("burstlab::attention_backward", mutates_args=())
    def _attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                            lse: torch.Tensor, mask: str, scale: Optional[float], layout: str, variant: str,
                            deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        if q.device.type == "cuda":
            if _cuda is None:
                raise RuntimeError(why_unavailable())
            with torch.cuda.device(q.device):
                stream = torch.cuda.current_stream(q.device).cuda_stream
                _cuda.backward(_DTYPE[q.dtype], _dev4(q, layout), _dev4(k, layout), _dev4(v, layout),
                               _dev4(o, layout), _dev4(do, layout), _dev3(lse), _dev4(dq, layout), _dev4(dk, layout),
                               _dev4(dv, layout), mask, scale, stream, variant, deterministic)
        else:
            _core.cpu_backward(_np(q), _np(k), _np(v), _np(o), _np(do), _np(lse), _np(dq), _np(dk), _np(dv), mask,
                               scale, layout)
        return dq, dk, dv

    @_attention_backward.register_fake
    def _attention_backward_fake(do, q, k, v, o, lse, mask, scale, layout, variant, deterministic):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def _setup_context(ctx, inputs, output):
        q, k, v, mask, scale, layout, variant, deterministic = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (mask, scale, layout, variant, deterministic)
        ctx.mark_non_differentiable(lse)

    def _backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        # dO arrives in whatever strides autograd produced (zero strides after a sum): contiguous.
        dq, dk, dv = torch.ops.burstlab.attention_backward(do.contiguous(), q, k, v, o, lse, *ctx.args)
        return dq, dk, dv, None, None, None, None, None

    _attention.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, mask=None, *, scale=None, layout="BHSD", return_lse=False, variant="auto",
              deterministic=False):
    """Attention (spec §2) by burstlab's cuda layer on CUDA tensors (cpu layer on CPU tensors),
    differentiable in q, k, v.

    q (B, H_q, N_q, d), k and v (B, H_kv, N_k, d) for layout "BHSD" (the default: SDPA's, as
    burstlab.oracle and the command line); (B, N, H, d) for "BSHD" (flash-attn's); one dtype and
    device for all three. mask: None, "causal", a burstlab.Mask or a dict of its fields (spec §3:
    bottom-right aligned band, documents, block mask).
    scale: default 1/sqrt(d). variant: "auto" or "v1".."v6", "v14" (cuda/README.md; a pass the variant
    lacks runs auto: v5, v6 and v14 are backward only; auto's backward is v14 at d = 64, v4 at
    d = 128). deterministic: a bitwise repeatable backward (the one-pass backwards of v4-v6 and
    v14 add atomically; v5, v6 and v14 have no deterministic mode). Returns O in q's layout, or
    (O, LSE (B, H_q, N_q)) with return_lse=True.
    """
    if not _HAVE_CUSTOM_OP:
        raise RuntimeError(why_unavailable())
    if layout not in ("BSHD", "BHSD"):
        raise ValueError(f"layout ({layout!r}) must be 'BHSD' (B, H, N, d) or 'BSHD' (B, N, H, d)")
    if isinstance(mask, Mask):
        mask_json = mask.json
    elif mask is None:
        mask_json = _NAMED["none"].json
    elif isinstance(mask, str) and mask in _NAMED:
        mask_json = _NAMED[mask].json
    else:
        mask_json = Mask.of(mask).json
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: 4 dimensions expected ({layout})")
        if t.dtype not in _DTYPE:
            raise ValueError(f"{name} has dtype {t.dtype}: bf16, fp16, fp32 or fp64 expected")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} ({t.dtype}, {t.device}) must have q's dtype and device ({q.dtype}, {q.device})")
    if scale is not None:
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale ({scale}) must be finite")
    o, lse = torch.ops.burstlab.attention(q, k, v, mask_json, scale, layout, str(variant), bool(deterministic))
    return (o, lse) if return_lse else o
