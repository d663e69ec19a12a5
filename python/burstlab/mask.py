"""burstlab.Mask: the mask of spec §3 as plain data, with the field names of case.json.

A mask is the conjunction of up to three parts, each optional, as predicates on global positions:

* band (§3.1): ``causal`` and/or a window of ``window_left`` keys left of the diagonal and
  ``window_right`` right of it (-1 = unbounded), bottom-right aligned when N_q != N_k
  (flash-attn >= 2.1);
* document (§3.2): ``q_segment`` (N_q) and ``k_segment`` (N_k) document ids, non-decreasing; the
  band applies inside each document (flash-attn varlen);
* block (§3.3): ``block_mask``, ceil(N_q/block_q) x ceil(N_k/block_k) tiles of 0/1, row-major.

The fields are checked here for names and types and by the C++ contract against the problem
(lengths, block counts) when the mask is used; every error is a ValueError naming the field.
"""
import json

from . import _core

FIELDS = ("causal", "window_left", "window_right", "q_segment", "k_segment", "block_q", "block_k", "block_mask")


def _int(name, x):
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise ValueError(f"mask field '{name}' ({x!r}) must be an integer")
    return int(x.__index__())


def _ints(name, x):
    """A 1-D sequence of integers (list, tuple, NumPy array, PyTorch tensor) as a tuple."""
    if x is None:
        return ()
    if hasattr(x, "detach") and hasattr(x, "tolist"):  # a torch tensor, without importing torch
        x = x.detach().cpu()
        if x.dim() > 2:
            raise ValueError(f"mask field '{name}' has {x.dim()} dimensions; 1 (or 2 for block_mask) expected")
        x = x.reshape(-1).tolist()
    elif hasattr(x, "tolist") and hasattr(x, "ndim"):  # a NumPy array
        if x.ndim > 2 or (x.ndim == 2 and name != "block_mask"):
            raise ValueError(f"mask field '{name}' has shape {tuple(x.shape)}; 1 dimension expected")
        if x.dtype.kind not in "iub":
            raise ValueError(f"mask field '{name}' has dtype {x.dtype}; integers expected")
        x = x.reshape(-1).tolist()
    try:
        items = list(x)
    except TypeError:
        raise ValueError(f"mask field '{name}' ({x!r}) must be a sequence of integers") from None
    out = []
    for k, e in enumerate(items):
        if isinstance(e, (list, tuple)) and name == "block_mask":  # nested rows of a 2-D block mask
            out.extend(_ints(name, e))
            continue
        if not hasattr(e, "__index__"):
            raise ValueError(f"mask field '{name}'[{k}] ({e!r}) must be an integer")
        out.append(int(e.__index__()))
    return tuple(out)


class Mask:
    """The mask of spec §3. ``Mask()`` sees every key; ``Mask(causal=True)``;
    ``Mask(window_left=128, window_right=0)``; ``Mask(q_segment=qs, k_segment=ks)``;
    ``Mask(block_q=64, block_k=64, block_mask=bits)``; parts combine with ``&``."""

    __slots__ = FIELDS + ("json",)

    def __init__(self, causal=False, window_left=-1, window_right=-1, q_segment=(), k_segment=(), block_q=0,
                 block_k=0, block_mask=(), **unknown):
        if unknown:
            name = sorted(unknown)[0]
            raise ValueError(f"mask: unknown field '{name}'; fields: {', '.join(FIELDS)}")
        if not isinstance(causal, bool) and type(causal).__name__ != "bool_":
            raise ValueError(f"mask field 'causal' ({causal!r}) must be True or False")
        set_ = object.__setattr__
        set_(self, "causal", bool(causal))
        set_(self, "window_left", _int("window_left", window_left))
        set_(self, "window_right", _int("window_right", window_right))
        set_(self, "q_segment", _ints("q_segment", q_segment))
        set_(self, "k_segment", _ints("k_segment", k_segment))
        set_(self, "block_q", _int("block_q", block_q))
        set_(self, "block_k", _int("block_k", block_k))
        set_(self, "block_mask", _ints("block_mask", block_mask))
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        _core.parse_mask(text)  # ranges and types, strictly (burstlab.Error names the field)
        set_(self, "json", text)  # what the C++ layers read; a str, so torch.compile sees a constant

    def __setattr__(self, name, value):
        raise AttributeError("burstlab.Mask is immutable; build a new one")

    # ---- constructors ------------------------------------------------------------------------
    @classmethod
    def window(cls, left, right):
        """Band of spec eq. 3.1: keys j with diag - left <= j <= diag + right (-1 = unbounded)."""
        return cls(window_left=left, window_right=right)

    @classmethod
    def document(cls, q_segment, k_segment=None):
        """Documents of spec §3.2 (k_segment defaults to q_segment: self-attention)."""
        return cls(q_segment=q_segment, k_segment=q_segment if k_segment is None else k_segment)

    @classmethod
    def block(cls, block_q, block_k, block_mask):
        """Block-sparse mask of spec §3.3 over (block_q x block_k) tiles; block_mask 2-D or flat."""
        return cls(block_q=block_q, block_k=block_k, block_mask=block_mask)

    @classmethod
    def from_dict(cls, d):
        """The "mask" object of case.json (missing fields take their defaults; unknown ones fail)."""
        if isinstance(d, Mask):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"mask ({d!r}) must be a burstlab.Mask, a dict of its fields, 'causal', 'none' or None")
        return cls(**d)

    @classmethod
    def from_spec(cls, spec, N_q, N_k, seed=1):
        """A mask generated as `burstlab run --mask SPEC` does (random parts seeded): 'causal',
        'window:L,R', 'document:4', 'block:16x32@0.5', joined with '+'."""
        return cls.from_dict(json.loads(_core.make_mask(spec, N_q, N_k, seed)))

    @staticmethod
    def of(mask):
        """None, a Mask, a dict of fields, or the strings 'none' / 'causal'."""
        if mask is None:
            return _NONE
        if isinstance(mask, Mask):
            return mask
        if isinstance(mask, str):
            if mask in _NAMED:
                return _NAMED[mask]
            raise ValueError(f"mask ({mask!r}) must be 'none', 'causal', a dict or a burstlab.Mask; "
                             "for the command line's grammar use burstlab.Mask.from_spec(spec, N_q, N_k, seed)")
        return Mask.from_dict(mask)

    # ---- data --------------------------------------------------------------------------------
    def dense(self, N_q, N_k):
        """(N_q, N_k) NumPy bool array, True where query i sees key j (spec eq. 3.5), e.g. an
        explicit attn_mask for torch's scaled_dot_product_attention (whose is_causal is top-left
        aligned when N_q != N_k, unlike spec §3.1)."""
        return _core.mask_dense(self.json, int(N_q), int(N_k))

    def to_dict(self):
        return {f: (list(getattr(self, f)) if isinstance(getattr(self, f), tuple) else getattr(self, f))
                for f in FIELDS}

    def __and__(self, other):
        """Conjunction: a key is visible when both masks let it through (one document part and one
        block part at most)."""
        other = Mask.of(other)
        d = self.to_dict()
        for f in ("window_left", "window_right"):
            a, b = d[f], getattr(other, f)
            d[f] = b if a < 0 else a if b < 0 else min(a, b)
        d["causal"] = self.causal or other.causal
        for part in (("q_segment", "k_segment"), ("block_q", "block_k", "block_mask")):
            if any(getattr(other, f) for f in part):
                if any(d[f] for f in part):
                    raise ValueError(f"mask: both masks have a {part[0].split('_')[0]} part; combine them by hand")
                for f in part:
                    d[f] = getattr(other, f)
        return Mask(**d)

    def __eq__(self, other):
        return isinstance(other, Mask) and self.json == other.json

    def __hash__(self):
        return hash(self.json)

    def __repr__(self):
        return f"Mask({_core.describe_mask(self.json)})"


_NONE = Mask()
_NAMED = {"none": _NONE, "causal": Mask(causal=True)}
