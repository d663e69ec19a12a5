"""burstlab.check and burstlab.testing.assert_attention_close: exact copies pass, perturbed
candidates fail naming their coordinates, conventions convert as in the CLI, and the verdicts are
`burstlab check`'s, number for number."""
import json
import os

import numpy as np
import pytest
from conftest import SAME_BUILD, agree_json, inputs, masks_37_50, run_cli, to_layout

import burstlab
from burstlab.testing import assert_attention_close


def bf16_save(path, a):
    """bf16 .npy ('<V2'): values already bf16 (exact in fp32), top 16 bits of the fp32 pattern."""
    np.save(path, (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16).view("V2"))


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_exact_copy_passes_and_perturbed_fails_with_coordinates(rng, layout):
    q, k, v, do = inputs((2, 4, 37, 16), (2, 2, 50, 16), rng)
    q, k, v, do = (to_layout(x, layout) for x in (q, k, v, do))
    for mname, mask in masks_37_50().items():
        ref = burstlab.oracle(q, k, v, do=do, mask=mask, layout=layout)
        r = burstlab.check(q, k, v, out=ref.O, lse=ref.LSE, dq=ref.dQ, dk=ref.dK, dv=ref.dV, do=do, mask=mask,
                           layout=layout)
        assert r.passed and bool(r) and [t.name for t in r.tensors] == ["O", "LSE", "dQ", "dK", "dV"], mname
        assert all(t.max_abs == 0 and t.wrong == 0 and t.checked > 0 for t in r.tensors)
        assert r.dtype == "fp64"

    # One element of O at logical (b=1, h=3, i=30, k=5) and of dK at (b=0, h=1, j=44, k=2).
    mask = masks_37_50()["causal"]
    ref = burstlab.oracle(q, k, v, do=do, mask=mask, layout=layout)
    O, dK = ref.O.copy(), ref.dK.copy()
    to_layout(O, layout)[1, 3, 30, 5] += 1e-3
    to_layout(dK, layout)[0, 1, 44, 2] -= 1e-3
    r = burstlab.check(q, k, v, out=O, dk=dK, do=do, mask=mask, layout=layout)
    assert not r.passed and not bool(r)
    assert [t.name for t in r.tensors] == ["O", "dK"]
    assert r["O"].wrong == 1 and r["O"].mismatches[0].index == (1, 3, 30, 5)
    assert r["dK"].wrong == 1 and r["dK"].mismatches[0].index == (0, 1, 44, 2)
    assert abs(r["O"].mismatches[0].got - r["O"].mismatches[0].want - 1e-3) < 1e-12
    text = str(r)
    assert "O (b=1, h=3, i=30, k=5): got" in text and "dK (b=0, h=1, j=44, k=2): got" in text
    assert "FAIL" in text.splitlines()[-1]


def test_lse_mismatch_and_nonfinite_positions(rng):
    q, k, v, _ = inputs((1, 2, 37, 8), (1, 1, 50, 8), rng)
    mask = masks_37_50()["document"]
    ref = burstlab.oracle(q, k, v, mask=mask)
    lse = ref.LSE.copy()
    lse[0, 1, 3] = np.nan
    r = burstlab.check(q, k, v, lse=lse, mask=mask)
    assert r["LSE"].wrong == 1 and r["LSE"].mismatches[0].index == (0, 1, 3)
    # empty rows must be -inf: a finite value there is wrong
    lse = ref.LSE.copy()
    lse[0, 0, 15] = 0.0
    assert burstlab.check(q, k, v, lse=lse, mask=mask)["LSE"].mismatches[0].index == (0, 0, 15)


def test_conventions_are_converted(rng):
    """+inf on empty rows and log2 units (flash-attn / Triton conventions) pass once declared."""
    q, k, v, _ = inputs((1, 2, 37, 8), (1, 1, 50, 8), rng)
    mask = masks_37_50()["document"]
    ref = burstlab.oracle(q, k, v, mask=mask)
    lse2 = np.where(np.isneginf(ref.LSE), np.inf, ref.LSE / np.log(2))
    assert not burstlab.check(q, k, v, lse=lse2, mask=mask).passed
    assert not burstlab.check(q, k, v, lse=lse2, mask=mask, lse_empty="+inf").passed
    r = burstlab.check(q, k, v, lse=lse2, mask=mask, lse_empty="+inf", lse_base="2")
    assert r.passed and r["LSE"].err_bound < 1, str(r)
    with pytest.raises(ValueError, match="lse_base"):
        burstlab.check(q, k, v, lse=lse2, mask=mask, lse_base="10")
    with pytest.raises(ValueError, match="lse_empty"):
        burstlab.check(q, k, v, lse=lse2, mask=mask, lse_empty="nan")


def test_low_precision_candidate_uses_its_own_bound(rng):
    """An fp32 candidate rounded from the oracle passes under the fp32 bound and fails the fp64 one."""
    q, k, v, do = (x.astype(np.float32) for x in inputs((1, 4, 37, 16), (1, 2, 50, 16), rng))
    ref = burstlab.oracle(q, k, v, do=do, mask="causal")
    out = ref.O.astype(np.float32)
    r = burstlab.check(q, k, v, out=out, mask="causal")
    assert r.passed and r.dtype == "fp32" and 0 < r["O"].err_bound < 1
    assert not burstlab.check(q, k, v, out=out, mask="causal", dtype="fp64").passed


def test_assert_attention_close(rng):
    q, k, v, do = inputs((1, 2, 37, 8), (1, 2, 50, 8), rng)
    ref = burstlab.oracle(q, k, v, do=do, mask="causal")
    r = assert_attention_close(q, k, v, out=ref.O, lse=ref.LSE, mask="causal")
    assert r.passed
    O = ref.O.copy()
    O[0, 1, 7, 2] = np.nan
    with pytest.raises(AssertionError) as e:
        assert_attention_close(q, k, v, out=O, mask="causal", msg="my kernel")
    text = str(e.value)
    assert text.startswith("my kernel\ncase ") and "O (b=0, h=1, i=7, k=2): got nan" in text
    assert "err/bound" in text and "#wrong" in text


def test_check_equals_the_command_line(cli, cli_suite, tmp_path, rng):
    """For a case of each dtype: a perturbed candidate written as files and judged by
    `burstlab check --json` gets the same numbers from Case.check and from burstlab.check on the
    case's arrays; the table is the CLI's table."""
    for name in ("02_causal_gqa_nq_lt_nk_fp32", "07_causal_doc_block_bf16", "03_causal_nq_gt_nk_empty_rows_fp16"):
        d = os.path.join(cli_suite, name)
        case = burstlab.Case.load(d)
        exp = case.expected
        np_t = {"fp32": np.float32, "fp16": np.float16, "bf16": np.float32}[case.dtype]
        cand = {t: np.array(getattr(exp, t)).astype(np_t) for t in ("O", "dQ", "dK", "dV")}
        if case.dtype == "bf16":  # round to nearest even bf16 (values exact in fp32 afterwards)
            for t in cand:
                u = cand[t].view(np.uint32).astype(np.uint64)
                cand[t] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
        lse = np.array(exp.LSE).astype(np.float32)
        flat = cand["O"].reshape(-1)
        flat[rng.integers(flat.size)] += 0.5
        cdir = tmp_path / name
        cdir.mkdir()
        for t, a in cand.items():
            (bf16_save if case.dtype == "bf16" else np.save)(str(cdir / f"{t}.npy"), a)
        np.save(str(cdir / "LSE.npy"), lse)
        p = run_cli(cli, "check", "--case", d, "--candidate", str(cdir), "--json", ok=(1,))
        want = json.loads(p.stdout)
        got = case.check(out=cand["O"], lse=lse, dq=cand["dQ"], dk=cand["dK"], dv=cand["dV"])
        assert agree_json(json.loads(got.json()), want)
        assert not got.passed and got["O"].wrong >= 1
        text = run_cli(cli, "check", "--case", d, "--candidate", str(cdir), ok=(1,)).stdout
        if SAME_BUILD:
            assert str(got) == text
        else:  # the bounds' last bits may differ: the table's layout and verdicts still agree
            assert [line.split()[0] for line in str(got).splitlines()] == [line.split()[0] for line in text.splitlines()]
        # from the arrays alone (the oracle recomputed): the same verdicts
        r = burstlab.check(case.q, case.k, case.v, do=case.do, out=cand["O"], lse=lse, dq=cand["dQ"], dk=cand["dK"],
                           dv=cand["dV"], mask=case.mask, scale=case.scale, layout=case.layout,
                           dtype=case.dtype, name=case.name)
        assert agree_json(json.loads(r.json()), want), (SAME_BUILD, r.json(), want)
