"""burstlab.oracle from NumPy: the C++ oracle's own numbers (round trip with `burstlab oracle`),
every layout, dtype and stride pattern, GQA/MQA, every mask kind, empty rows."""
import os

import numpy as np
import pytest
from conftest import agree, case_meta, inputs, load_npy, masks_37_50, to_layout

import burstlab


def same(a, b):
    """Bitwise equal values, infinities in the same places."""
    return a.shape == b.shape and np.array_equal(a, b)


def close(a, b, tol=1e-12):
    """Equal up to the rounding of a different summation order (strided GEMMs): |a - b| <= tol * (1 + |b|),
    infinities in the same places."""
    assert a.shape == b.shape
    inf = ~np.isfinite(b)
    assert np.array_equal(a[inf], b[inf])
    return np.all(np.abs(a[~inf] - b[~inf]) <= tol * (1 + np.abs(b[~inf])))


def test_matches_the_command_line_oracle(cli_suite):
    """Every case of the quick suite (fp32, bf16, fp16 inputs): burstlab.oracle on the case's
    arrays gives the expected/ files `burstlab gen --oracle` wrote (bit for bit in one build)."""
    dirs = sorted(d for d in os.listdir(cli_suite))
    assert len(dirs) == 33
    for name in dirs:
        d = os.path.join(cli_suite, name)
        meta = case_meta(d)
        q, k, v, do = (load_npy(os.path.join(d, f))[0] for f in ("q.npy", "k.npy", "v.npy", "dO.npy"))
        r = burstlab.oracle(q, k, v, do=do, mask=meta["mask"], scale=meta["scale"], layout=meta["layout"])
        for t in ("O", "LSE", "dQ", "dK", "dV"):
            want = np.load(os.path.join(d, "expected", f"{t}.npy"))
            assert agree(getattr(r, t), want), f"{name} {t}"


def np_attention(q, k, v, visible, scale):
    """Independent fp64 attention, BHSD, with GQA by repetition: (O, LSE)."""
    G = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = np.where(visible, scale * q @ k.transpose(0, 1, 3, 2), -np.inf)
    m = s.max(-1, keepdims=True)
    empty = ~np.isfinite(m)
    m = np.where(empty, 0, m)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    o = np.where(empty, 0, (p @ v) / np.where(empty, 1, l))
    return o, np.where(empty[..., 0], -np.inf, (m + np.log(np.where(empty, 1, l)))[..., 0])


@pytest.mark.parametrize("H_q,H_kv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("N_q,N_k", [(37, 50), (50, 37)])
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_against_independent_numpy(rng, H_q, H_kv, N_q, N_k, layout):
    """MHA, GQA and MQA, N_q < N_k and N_q > N_k (empty rows under causal): the oracle agrees with a
    plain NumPy attention with the spec's bottom-right aligned causal band (eq. 3.1)."""
    q, k, v, _ = inputs((2, H_q, N_q, 16), (2, H_kv, N_k, 16), rng)
    i, j = np.arange(N_q)[:, None], np.arange(N_k)[None, :]
    for mask, vis in ((None, np.ones((N_q, N_k), bool)), ("causal", j <= i + (N_k - N_q))):
        want_o, want_l = np_attention(q, k, v, vis, 0.25)
        r = burstlab.oracle(to_layout(q, layout), to_layout(k, layout), to_layout(v, layout), mask=mask,
                            layout=layout)
        assert close(to_layout(r.O, layout), want_o, 1e-13)
        assert close(r.LSE, want_l, 1e-13)
        if mask == "causal" and N_q > N_k:
            assert np.isneginf(r.LSE[:, :, : N_q - N_k]).all() and not to_layout(r.O, layout)[:, :, : N_q - N_k].any()


@pytest.mark.parametrize("H_kv", [1, 2])
def test_every_mask_kind_against_independent_numpy(rng, H_kv):
    """Mask.dense (the C++ predicate) as a boolean mask in the NumPy attention: the oracle agrees,
    for every mask kind, empty rows included; causal's dense form is the bottom-right triangle."""
    q, k, v, _ = inputs((2, 4, 37, 8), (2, H_kv, 50, 8), rng)
    for name, mask in masks_37_50().items():
        vis = mask.dense(37, 50)
        assert vis.shape == (37, 50) and vis.dtype == bool
        want_o, want_l = np_attention(q, k, v, vis, 8 ** -0.5)
        r = burstlab.oracle(q, k, v, mask=mask, layout="BHSD")
        assert close(r.O, want_o, 1e-13) and close(r.LSE, want_l, 1e-13), name
    i, j = np.arange(37)[:, None], np.arange(50)[None, :]
    assert np.array_equal(burstlab.Mask(causal=True).dense(37, 50), j <= i + 13)
    assert np.array_equal(burstlab.Mask.window(6, 3).dense(37, 50), (j >= i + 13 - 6) & (j <= i + 13 + 3))


def strided_variants(x, rng):
    """The same logical values of a (B, H, N, d) array in other memory: Fortran order, a stepped
    slice of a larger array, negative strides."""
    big = np.empty((x.shape[0], x.shape[1], 2 * x.shape[2], x.shape[3] + 3))
    big[:, :, ::2, 1:-2] = x
    rev = np.ascontiguousarray(x[:, :, ::-1, ::-1])
    return {
        "fortran": np.asfortranarray(x),
        "stepped": big[:, :, ::2, 1:-2],
        "negative": rev[:, :, ::-1, ::-1],
    }


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_strided_inputs(rng, layout):
    """Non-contiguous inputs (transposed, stepped, Fortran-order, negative and zero strides) give the
    contiguous result, for every mask kind, forward and backward."""
    q, k, v, do = inputs((2, 4, 37, 8), (2, 2, 50, 8), rng)
    for mname, mask in masks_37_50().items():
        base = burstlab.oracle(*(np.ascontiguousarray(to_layout(x, layout)) for x in (q, k, v)),
                               do=np.ascontiguousarray(to_layout(do, layout)), mask=mask, layout=layout)
        variants = [strided_variants(x, rng) for x in (q, k, v, do)]
        for kind in variants[0]:
            args = [to_layout(vs[kind], layout) for vs in variants]
            assert not args[0].flags.c_contiguous
            r = burstlab.oracle(args[0], args[1], args[2], do=args[3], mask=mask, layout=layout)
            for t in ("O", "LSE", "dQ", "dK", "dV"):
                assert close(getattr(r, t), getattr(base, t)), f"{mname} {kind} {t}"
    # A zero stride: one head broadcast to all heads of K and V equals the copied heads.
    k1 = np.broadcast_to(k[:, :1], k.shape)
    r = burstlab.oracle(to_layout(q, layout), to_layout(k1, layout), to_layout(k1, layout), layout=layout)
    want = burstlab.oracle(to_layout(q, layout), to_layout(k1.copy(), layout), to_layout(k1.copy(), layout),
                           layout=layout)
    assert close(r.O, want.O) and close(r.LSE, want.LSE)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_inputs_are_read_exactly(rng, dtype, layout):
    """fp32 and fp16 inputs are converted to fp64 exactly: the same result, bit for bit, as the
    fp64 arrays holding the same values."""
    q, k, v, do = (np.ascontiguousarray(to_layout(x.astype(dtype), layout))
                   for x in inputs((1, 4, 37, 16), (1, 2, 50, 16), rng))
    for mask in masks_37_50().values():
        r = burstlab.oracle(q, k, v, do=do, mask=mask, layout=layout)
        w = burstlab.oracle(*(x.astype(np.float64) for x in (q, k, v)), do=do.astype(np.float64), mask=mask,
                            layout=layout)
        for t in ("O", "LSE", "dQ", "dK", "dV"):
            assert same(getattr(r, t), getattr(w, t)), t
        assert r.O.dtype == np.float64


def test_empty_rows_and_mask_kinds(rng):
    """Rows with no visible key (document without keys, all-zero block rows): O = 0, LSE = -inf,
    dQ = 0 there (spec §2.3); every other row finite."""
    q, k, v, do = inputs((1, 2, 37, 8), (1, 1, 50, 8), rng)
    m = masks_37_50()["document"]
    r = burstlab.oracle(q, k, v, do=do, mask=m)
    empty = np.arange(37)[(np.arange(37) >= 10) & (np.arange(37) < 22)]
    assert np.isneginf(r.LSE[:, :, empty]).all() and np.isfinite(np.delete(r.LSE, empty, axis=2)).all()
    assert not r.O[:, :, empty].any() and not r.dQ[:, :, empty].any()
    # the keys of document 0 and 2 receive gradients; nothing is NaN
    assert np.isfinite(r.dK).all() and np.abs(r.dK).max() > 0


def test_scale_default_and_explicit(rng):
    q, k, v, _ = inputs((1, 2, 20, 16), (1, 2, 30, 16), rng)
    assert same(burstlab.oracle(q, k, v).O, burstlab.oracle(q, k, v, scale=0.25).O)
    assert not same(burstlab.oracle(q, k, v).O, burstlab.oracle(q, k, v, scale=0.5).O)


def test_dlpack_and_buffer_protocol(rng):
    """Objects that are not NumPy arrays: a DLPack producer and a buffer-protocol object (memoryview)."""
    q, k, v, _ = inputs((1, 2, 20, 4), (1, 2, 30, 4), rng)
    want = burstlab.oracle(q, k, v)

    class DL:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    r = burstlab.oracle(DL(q), DL(k), DL(v))
    assert same(r.O, want.O)
    r = burstlab.oracle(memoryview(q), memoryview(k), memoryview(v))
    assert same(r.O, want.O)
