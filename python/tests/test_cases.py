"""Case files from Python: burstlab.suite, Case.save and Case.load agree with `burstlab gen` and
`burstlab oracle` byte for byte."""
import filecmp
import os

import numpy as np
from conftest import SAME_BUILD, agree, load_npy, run_cli

import burstlab


def files_of(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def test_suite_saves_the_bytes_the_cli_writes(cli, cli_suite, tmp_path):
    cases = burstlab.suite(quick=True, dtype="bf16") + burstlab.suite(quick=True, dtype="fp32")
    assert len(cases) == 22 and len({c.name for c in cases}) == 22
    for c in cases:
        c.save(tmp_path / c.name)  # with expected/ (the oracle), as gen --oracle
        want = os.path.join(cli_suite, c.name)
        assert files_of(tmp_path / c.name) == files_of(want)
        for f in files_of(want):
            if SAME_BUILD or not f.startswith("expected"):
                assert filecmp.cmp(tmp_path / c.name / f, os.path.join(want, f), shallow=False), f"{c.name}/{f}"
            else:  # the oracle's last bits depend on the build's instructions
                assert agree(np.load(tmp_path / c.name / f), np.load(os.path.join(want, f))), f"{c.name}/{f}"
    # the full suite's names match `burstlab gen --list`
    listed = [line.split()[0] for line in run_cli(cli, "gen", "--list", "--dtype", "fp16").stdout.splitlines()]
    assert [c.name for c in burstlab.suite(quick=False, dtype="fp16")] == listed and len(listed) == 19


def test_load_reads_what_the_cli_wrote(cli_suite):
    d = os.path.join(cli_suite, "07_causal_doc_block_bf16")
    c = burstlab.Case.load(d)
    assert (c.name, c.dtype, c.layout, c.B, c.H_q, c.H_kv, c.N_q, c.N_k, c.d) == (
        "07_causal_doc_block_bf16", "bf16", "BSHD", 1, 4, 2, 120, 160, 128)
    assert c.mask.causal and len(c.mask.q_segment) == 120 and c.mask.block_q == 32 and c.backward
    q, _ = load_npy(os.path.join(d, "q.npy"))
    assert c.q.dtype == np.float32 and np.array_equal(c.q, q)
    for t in ("O", "LSE", "dQ", "dK", "dV"):
        want = np.load(os.path.join(d, "expected", f"{t}.npy"))
        assert np.array_equal(getattr(c.expected, t), want)
    # the oracle on the loaded arrays gives the expected files again
    r = burstlab.oracle(c.q, c.k, c.v, do=c.do, mask=c.mask, scale=c.scale, layout=c.layout)
    assert all(agree(getattr(r, t), getattr(c.expected, t)) for t in ("O", "LSE", "dQ", "dK", "dV"))


def test_save_then_load_round_trip(tmp_path):
    c = burstlab.suite(quick=True, dtype="fp16")[4]
    c.save(tmp_path / "a", expected=False)
    assert not os.path.exists(tmp_path / "a" / "expected")
    b = burstlab.Case.load(tmp_path / "a")
    assert b.meta == c.meta and b.mask == c.mask
    assert b.q.dtype == np.float16 and np.array_equal(b.q, c.q) and np.array_equal(b.do, c.do)
    # expected outputs computed on demand equal the ones saved later
    b.save(tmp_path / "b")
    e = burstlab.Case.load(tmp_path / "b").expected
    assert np.array_equal(e.dK, b.expected.dK)


def test_case_check_of_its_own_expected_passes():
    for c in burstlab.suite(quick=True, dtype="fp64"):
        e = c.expected
        r = c.check(out=e.O, lse=e.LSE, dq=e.dQ, dk=e.dK, dv=e.dV)
        assert r.passed and r.worst_err_bound == 0, str(r)
