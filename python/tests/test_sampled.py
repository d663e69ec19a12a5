"""The row-sampled check from Python (spec §9.11): burstlab.check / assert_attention_close with
check_rows=K and burstlab.oracle(check_rows=K), against the full oracle on small problems, on one
rank's shard with its global positions, and at N = 200000 where the full oracle does not fit."""
import numpy as np
import pytest

import burstlab
from band_attention import band_attention
from conftest import require_torch

MASKS = {
    "none": None,
    "causal": burstlab.Mask(causal=True),
    "window": burstlab.Mask(causal=True, window_left=5),
    "document": burstlab.Mask.document([0] * 20 + [1] * 17 + [2] * 11),
}


def problem(rng, B=2, Hq=4, Hkv=2, N=48, d=8):
    q = rng.standard_normal((B, Hq, N, d))
    k = rng.standard_normal((B, Hkv, N, d))
    v = rng.standard_normal((B, Hkv, N, d))
    do = rng.standard_normal((B, Hq, N, d))
    return q, k, v, do


def at_rows(x, rows):
    return x[rows[:, 0], rows[:, 1], rows[:, 2]]


@pytest.mark.parametrize("mask", list(MASKS))
def test_sampled_oracle_equals_full_oracle_on_its_rows(rng, mask):
    q, k, v, do = problem(rng)
    m = MASKS[mask]
    full = burstlab.oracle(q, k, v, mask=m, do=do)
    s = burstlab.oracle(q, k, v, mask=m, do=do, check_rows=24, seed=3, out=full.O, lse=full.LSE)
    assert s.rows.shape == (24, 3) and s.columns.shape == (24, 3)
    # rows.cpp and reference.cpp sum in different orders: equal to fp64 rounding, not bit for bit
    np.testing.assert_allclose(s.O, at_rows(full.O, s.rows), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(s.LSE, at_rows(full.LSE, s.rows), rtol=1e-13, atol=0)
    np.testing.assert_allclose(s.dQ, at_rows(full.dQ, s.rows), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(s.dK, at_rows(full.dK, s.columns), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(s.dV, at_rows(full.dV, s.columns), rtol=1e-11, atol=1e-14)
    assert set(s.bounds) == {"O", "LSE", "dQ", "dK", "dV"}
    assert all(np.all(b > 0) for b in s.bounds.values())


@pytest.mark.parametrize("mask", list(MASKS))
def test_every_row_sampled_gives_the_full_verdict(rng, mask):
    # With K >= every row the sampled check compares every O, LSE, dQ element: the same #wrong
    # as the full check for an fp32 candidate with a few rows perturbed past the bound.
    q, k, v, do = problem(rng)
    m = MASKS[mask]
    full = burstlab.oracle(q, k, v, mask=m, do=do)
    O = full.O.astype(np.float32)
    dq = full.dQ.astype(np.float32)
    O[1, 2, 7, :3] += 1e-2
    dq[0, 3, 40, 5] -= 1e-2
    lse = full.LSE.astype(np.float32)
    lse[1, 0, 30] += 1e-2
    a = burstlab.check(q, k, v, out=O, lse=lse, dq=dq, do=do, mask=m)
    b = burstlab.check(q, k, v, out=O, lse=lse, dq=dq, do=do, mask=m, check_rows=2 * 4 * 48)
    for t in ("O", "LSE", "dQ"):
        assert a[t].checked == b[t].checked
        assert a[t].wrong == b[t].wrong > 0, (t, a[t], b[t])
        assert [x.index for x in a[t].mismatches] == [x.index for x in b[t].mismatches]
    assert not a.passed and not b.passed


def test_exact_and_fp32_candidates_pass(rng):
    q, k, v, do = problem(rng)
    m = MASKS["causal"]
    full = burstlab.oracle(q, k, v, mask=m, do=do)
    r = burstlab.testing.assert_attention_close(q, k, v, out=full.O, lse=full.LSE, dq=full.dQ, dk=full.dK,
                                                dv=full.dV, do=do, mask=m, check_rows=16)
    assert [t.name for t in r.tensors] == ["O", "LSE", "dQ", "dK", "dV"]
    assert r.tensors[0].checked == 16 * 8 and r.tensors[3].checked == 16 * 8
    assert "(sampled, K=16)" in str(r)
    f32 = [x.astype(np.float32) for x in full]
    r = burstlab.check(q, k, v, out=f32[0], lse=f32[1], dq=f32[2], dk=f32[3], dv=f32[4], do=do, mask=m,
                       check_rows=16)
    assert r.passed and r.dtype == "fp32" and r.worst_err_bound > 0


def test_perturbed_row_and_column_are_named(rng):
    q, k, v, do = problem(rng)
    m = MASKS["document"]
    full = burstlab.oracle(q, k, v, mask=m, do=do)
    s = burstlab.oracle(q, k, v, mask=m, do=do, check_rows=12, seed=7, out=full.O, lse=full.LSE)
    b, h, i = (int(x) for x in s.rows[5])
    O = full.O.copy()
    O[b, h, i, 6] += 1e-6
    dk = full.dK.copy()
    bk, hk, j = (int(x) for x in s.columns[4])
    dk[bk, hk, j, 2] *= 1.001
    r = burstlab.check(q, k, v, out=O, lse=full.LSE, dk=dk, dv=full.dV, do=do, mask=m, check_rows=12, seed=7)
    assert not r.passed
    assert [x.index for x in r["O"].mismatches] == [(b, h, i, 6)]
    assert [x.index for x in r["dK"].mismatches] == [(bk, hk, j, 2)]
    assert r["LSE"].passed and r["dV"].passed
    text = str(r)
    assert f"O (b={b}, h={h}, i={i}, k=6)" in text and f"dK (b={bk}, h={hk}, j={j}, k=2)" in text
    with pytest.raises(AssertionError, match=rf"dK \(b={bk}, h={hk}, j={j}, k=2\)"):
        burstlab.testing.assert_attention_close(q, k, v, out=O, lse=full.LSE, dk=dk, do=do, mask=m, check_rows=12,
                                                seed=7)


def test_a_shard_with_its_global_positions(rng):
    # A zigzag shard (rank 1 of 4: chunks 1 and 6 of 8), checked alone: its rows at their
    # global positions; a wrong row is reported at its global coordinate.
    q, k, v, do = problem(rng, B=1, Hq=2, Hkv=1, N=64)
    m = MASKS["causal"]
    full = burstlab.oracle(q, k, v, mask=m, do=do)
    pos = np.r_[8:16, 48:56]
    O, lse, dq = full.O[:, :, pos].copy(), full.LSE[:, :, pos].copy(), full.dQ[:, :, pos]
    r = burstlab.check(q, k, v, out=O, lse=lse, dq=dq, do=do, mask=m, check_rows=2 * 16, q_positions=pos)
    assert r.passed and r["O"].checked == 2 * 16 * 8
    O[0, 1, 11, 3] += 1e-3  # local row 11 = global row 51
    lse[0, 0, 2] = 0.0      # local row 2 = global row 10
    r = burstlab.check(q, k, v, out=O, lse=lse, do=do, mask=m, check_rows=32, q_positions=pos)
    assert [x.index for x in r["O"].mismatches] == [(0, 1, 51, 3)]
    assert [x.index for x in r["LSE"].mismatches] == [(0, 0, 10)]
    # dK, dV of the shard's keys given the gathered forward
    dk, dv = full.dK[:, :, pos].copy(), full.dV[:, :, pos]
    dk[0, 0, 15, 0] += 1e-3  # global key 55
    r = burstlab.check(q, k, v, out=full.O, lse=full.LSE, dk=dk, dv=dv, do=do, mask=m, check_rows=16,
                       k_positions=pos)
    assert [t.name for t in r.tensors] == ["O", "LSE", "dK", "dV"]
    assert [x.index for x in r["dK"].mismatches] == [(0, 0, 55, 0)] and r["dV"].passed


def test_torch_tensors(rng):
    torch = require_torch()
    q, k, v, do = (torch.from_numpy(x) for x in problem(rng))
    full = burstlab.oracle(q, k, v, mask="causal", do=do)
    s = burstlab.oracle(q, k, v, mask="causal", do=do, check_rows=8, out=full.O, lse=full.LSE)
    assert isinstance(s.O, torch.Tensor) and isinstance(s.rows, torch.Tensor) and s.rows.dtype == torch.int64
    pos = torch.arange(16, 32)
    r = burstlab.check(q.float(), k.float(), v.float(), out=full.O[:, :, 16:32].float(),
                       lse=full.LSE[:, :, 16:32].float(), mask="causal", check_rows=8, q_positions=pos)
    assert r.passed and r.dtype == "fp32"


def test_bad_arguments(rng):
    q, k, v, do = problem(rng)
    full = burstlab.oracle(q, k, v, do=do)
    with pytest.raises(ValueError, match=r"check_rows \(0\) must be >= 1"):
        burstlab.check(q, k, v, out=full.O, check_rows=0)
    with pytest.raises(ValueError, match="given the candidate's own O and LSE"):
        burstlab.check(q, k, v, dk=full.dK, do=do, check_rows=4)
    with pytest.raises(burstlab.Error, match=r"q_positions\[1\] \(48\) must lie in \[0, N_q\) = \[0, 48\)"):
        burstlab.check(q, k, v, out=full.O[:, :, :2], check_rows=4, q_positions=[0, 48])
    with pytest.raises(burstlab.Error, match=r"q_positions\[1\] \(0\) repeats"):
        burstlab.check(q, k, v, out=full.O[:, :, :2], check_rows=4, q_positions=[0, 0])
    with pytest.raises(burstlab.Error, match=r"out has logical shape .* len\(q_positions\)"):
        burstlab.check(q, k, v, out=full.O[:, :, :3], check_rows=4, q_positions=[0, 1])
    with pytest.raises(burstlab.Error, match="gathered"):
        burstlab.check(q, k, v, out=full.O[:, :, :2], lse=full.LSE[:, :, :2], dk=full.dK, do=do, check_rows=4,
                       q_positions=[0, 1])
    with pytest.raises(ValueError, match="pass check_rows=K"):
        burstlab.check(q, k, v, out=full.O[:, :, :2], q_positions=[0, 1])
    with pytest.raises(ValueError, match="out and lse are read only by the sampled oracle"):
        burstlab.oracle(q, k, v, out=full.O)


def test_200000_rows_with_16_samples(rng, monkeypatch):
    # The full oracle needs N x N fp64 per thread (320 GB here) and refuses; the sampled check of
    # K = 16 rows and columns runs within 1 GB, with a correct candidate built block by block.
    monkeypatch.setenv("BURSTLAB_MEMORY_AVAILABLE", str(10**9))
    N, d, w = 200000, 8, 32
    q, k, v, do = (rng.standard_normal((1, 1, N, d)) for _ in range(4))
    m = burstlab.Mask(causal=True, window_left=w)
    with pytest.raises(burstlab.NotEnoughMemory, match="not enough memory for the fp64 oracle"):
        burstlab.oracle(q, k, v, mask=m)
    with pytest.raises(MemoryError):
        burstlab.check(q, k, v, out=q, mask=m)
    O, L, dQ, dK, dV = band_attention(q, k, v, do, w)
    r = burstlab.testing.assert_attention_close(q, k, v, out=O, lse=L, dq=dQ, dk=dK, dv=dV, do=do, mask=m,
                                                check_rows=16)
    assert all(t.checked == 16 * d for t in r.tensors if t.name != "LSE") and r["LSE"].checked == 16
    assert r.worst_err_bound < 0.1  # an exact fp64 candidate, summed in another order
    s = burstlab.oracle(q, k, v, mask=m, check_rows=16)
    bad = O.copy()
    b, h, i = (int(x) for x in s.rows[9])
    bad[b, h, i, 4] += 1e-6
    r = burstlab.check(q, k, v, out=bad, lse=L, mask=m, check_rows=16)
    assert [x.index for x in r["O"].mismatches] == [(0, 0, i, 4)]
    # what does not fit even sampled is refused with what fits, as the command line does
    monkeypatch.setenv("BURSTLAB_MEMORY_AVAILABLE", str(10**6))
    with pytest.raises(burstlab.NotEnoughMemory, match=r"row-sampled fp64 oracle.*it fits with N_q and N_k up to"):
        burstlab.check(q, k, v, out=O, lse=L, mask=m, check_rows=16)


def test_candidates_read_in_place_any_strides_and_layout(rng):
    # The sampled check reads the candidate's K rows where they lie: strided, fp32, BSHD.
    q, k, v, do = problem(rng)
    full = burstlab.oracle(q, k, v, mask="causal", do=do)
    strided = np.swapaxes(np.ascontiguousarray(np.swapaxes(full.O, 1, 2)), 1, 2)   # BHSD view of BSHD memory
    rev = np.ascontiguousarray(full.dQ[:, :, ::-1])[:, :, ::-1]                     # negative strides
    r = burstlab.check(q, k, v, out=strided, lse=full.LSE, dq=rev, dk=full.dK, dv=full.dV, do=do, mask="causal",
                       check_rows=32)
    assert r.passed and r.worst_err_bound < 0.1
    t = lambda x: np.swapaxes(x, 1, 2).astype(np.float32)
    bad = t(full.dV).copy()
    s = burstlab.oracle(q, k, v, mask="causal", do=do, check_rows=32, out=full.O, lse=full.LSE)
    b, h, j = (int(x) for x in s.columns[3])
    bad[b, j, h, 1] += 1e-2
    r = burstlab.check(t(q), t(k), t(v), out=t(full.O), lse=full.LSE.astype(np.float32), dv=bad, do=t(do),
                       mask="causal", layout="BSHD", check_rows=32)
    assert r.dtype == "fp32" and r["O"].passed and [x.index for x in r["dV"].mismatches] == [(b, h, j, 1)]


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _assert_same_sampled(s, ref):
    for n in ("rows", "O", "LSE", "dQ", "columns", "dK", "dV"):
        assert _same_bits(getattr(s, n), getattr(ref, n)), n
    assert set(s.bounds) == set(ref.bounds)
    for n in s.bounds:
        assert _same_bits(s.bounds[n], ref.bounds[n]), n


def _assert_same_report(r, ref):
    assert [t.name for t in r.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(r.tensors, ref.tensors):
        assert (a.max_abs, a.max_rel, a.err_bound, a.wrong, a.checked) == \
               (b.max_abs, b.max_rel, b.err_bound, b.wrong, b.checked), a.name
        assert [x.index for x in a.mismatches] == [x.index for x in b.mismatches]


@pytest.mark.parametrize("mask", ["causal", "document"])
def test_bf16_torch_inputs_read_in_place_bit_for_bit(rng, mask):
    # bf16 tensors in non-contiguous memory (a BSHD buffer seen as BHSD, every other feature) are
    # read where they lie, widened element by element: the sampled oracle and the report equal,
    # bit for bit, those of the same values handed over as contiguous fp64 arrays, and match the
    # full oracle on the sampled rows and columns.
    torch = require_torch()
    m = MASKS[mask]
    B, Hq, Hkv, N, d = 2, 4, 2, 48, 8

    def bf16(x, H):  # (B, H, N, d) values in a (B, N, H, 2d) bf16 buffer: strides (N*H*2d, 2d, H*2d, 2)
        buf = torch.zeros((B, N, H, 2 * d), dtype=torch.bfloat16)
        buf[..., ::2] = torch.from_numpy(np.swapaxes(x, 1, 2)).to(torch.bfloat16)
        t = buf[..., ::2].transpose(1, 2)
        assert not t.is_contiguous()
        return t

    q, k, v, do = problem(rng, B, Hq, Hkv, N, d)
    tq, tk, tv, tdo = bf16(q, Hq), bf16(k, Hkv), bf16(v, Hkv), bf16(do, Hq)
    f64 = lambda t: np.ascontiguousarray(t.double().numpy())  # the same values, exactly
    q, k, v, do = f64(tq), f64(tk), f64(tv), f64(tdo)
    full = burstlab.oracle(q, k, v, mask=m, do=do)
    cand = [bf16(full.O, Hq), full.LSE.astype(np.float32), bf16(full.dQ, Hq), bf16(full.dK, Hkv), bf16(full.dV, Hkv)]
    c64 = [f64(cand[0]), cand[1].astype(np.float64), f64(cand[2]), f64(cand[3]), f64(cand[4])]
    s = burstlab.oracle(tq, tk, tv, mask=m, do=tdo, check_rows=24, seed=5, out=cand[0], lse=cand[1], dtype="bf16")
    ref = burstlab.oracle(q, k, v, mask=m, do=do, check_rows=24, seed=5, out=c64[0], lse=c64[1], dtype="bf16")
    _assert_same_sampled(burstlab.Sampled(*[x.numpy() if hasattr(x, "numpy") else x for x in s[:7]],
                                          {n: b.numpy() for n, b in s.bounds.items()}), ref)
    at = lambda x, ix: x[ix[:, 0], ix[:, 1], ix[:, 2]]
    np.testing.assert_allclose(ref.O, at(full.O, ref.rows), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ref.dQ, at(full.dQ, ref.rows), rtol=1e-11, atol=1e-14)
    r = burstlab.check(tq, tk, tv, out=cand[0], lse=cand[1], dq=cand[2], dk=cand[3], dv=cand[4], do=tdo, mask=m,
                       check_rows=24, seed=5)
    r64 = burstlab.check(q, k, v, out=c64[0], lse=c64[1], dq=c64[2], dk=c64[3], dv=c64[4], do=do, mask=m,
                         check_rows=24, seed=5, dtype="bf16")
    assert r.dtype == "bf16" and r.passed, str(r)
    _assert_same_report(r, r64)


def test_fp32_and_fp16_inputs_read_in_place_bit_for_bit(rng):
    # fp32 inputs with negative strides in BSHD memory, an fp16 candidate: equal, bit for bit, to
    # the same values as contiguous fp64 (the values the full path converts them to).
    q, k, v, do = problem(rng)
    m = MASKS["window"]
    rev = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2)[:, ::-1].astype(np.float32))[:, ::-1]  # BSHD
    tq, tk, tv, tdo = rev(q), rev(k), rev(v), rev(do)
    q, k, v, do = (np.ascontiguousarray(np.swapaxes(x, 1, 2), dtype=np.float64) for x in (tq, tk, tv, tdo))
    full = burstlab.oracle(q, k, v, mask=m, do=do)
    h = lambda x: np.swapaxes(x, 1, 2).astype(np.float16)  # BSHD fp16, contiguous
    cand = [h(full.O), full.LSE.astype(np.float32), h(full.dQ), h(full.dK), h(full.dV)]
    c64 = [np.ascontiguousarray(np.swapaxes(x, 1, 2), dtype=np.float64) if x.ndim == 4 else x.astype(np.float64)
           for x in cand]
    s = burstlab.oracle(tq, tk, tv, mask=m, do=tdo, layout="BSHD", check_rows=20, seed=2, out=cand[0], lse=cand[1],
                        dtype="fp16")
    ref = burstlab.oracle(q, k, v, mask=m, do=do, check_rows=20, seed=2, out=c64[0], lse=c64[1], dtype="fp16")
    _assert_same_sampled(s, ref)
    r = burstlab.check(tq, tk, tv, out=cand[0], lse=cand[1], dq=cand[2], dk=cand[3], dv=cand[4], do=tdo, mask=m,
                       layout="BSHD", check_rows=20, seed=2)
    r64 = burstlab.check(q, k, v, out=c64[0], lse=c64[1], dq=c64[2], dk=c64[3], dv=c64[4], do=do, mask=m,
                         check_rows=20, seed=2, dtype="fp16")
    assert r.dtype == "fp16" and r.passed, str(r)
    _assert_same_report(r, r64)


def test_the_estimate_counts_no_copy_of_the_inputs(rng, monkeypatch):
    # The sampled check reads every array in place: 64 MB available suffice for a problem whose
    # inputs alone would take 4 x 134 MB as fp64 copies; 2 MB do not, and the refusal says what fits.
    N, H, d = 65536, 2, 128
    q, k, v, do, out, dq, dk, dv = (rng.standard_normal((1, H, N, d), dtype=np.float32) for _ in range(8))
    lse = rng.standard_normal((1, H, N)).astype(np.float32)
    monkeypatch.setenv("BURSTLAB_MEMORY_AVAILABLE", str(64 * 2**20))
    r = burstlab.check(q, k, v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask="causal", check_rows=4)
    assert [t.checked for t in r.tensors] == [4 * d, 4, 4 * d, 4 * d, 4 * d]
    monkeypatch.setenv("BURSTLAB_MEMORY_AVAILABLE", str(2 * 2**20))
    with pytest.raises(burstlab.NotEnoughMemory, match=r"row-sampled fp64 oracle.*it fits with N_q and N_k up to"):
        burstlab.check(q, k, v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask="causal", check_rows=4)
