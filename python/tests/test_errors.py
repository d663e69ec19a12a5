"""Bad input raises ValueError (burstlab.Error for the C++ checks) naming the field and the value."""
import numpy as np
import pytest
from conftest import inputs

import burstlab


@pytest.fixture
def qkv(rng):
    return inputs((1, 4, 20, 8), (1, 2, 30, 8), rng)[:3]  # (B, H, N, d): the default layout


@pytest.mark.parametrize("call,match", [
    (lambda q, k, v: burstlab.oracle(q[0], k, v), r"q has shape \(4, 20, 8\): 4 dimensions \(B, H, N, d\)"),
    (lambda q, k, v: burstlab.oracle(q, k[..., :4], v[..., :4]), r"k's d \(4\) must equal q's d \(8\)"),
    (lambda q, k, v: burstlab.oracle(q, k, v[:, :, :29]), r"v .* must have the shape of k"),
    (lambda q, k, v: burstlab.oracle(q, np.concatenate([k, k]), np.concatenate([v, v])), r"k's B \(2\)"),
    (lambda q, k, v: burstlab.oracle(q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1)),
     r"H_q \(4\) must be a multiple of H_kv \(3\)"),
    (lambda q, k, v: burstlab.oracle(q, k, v, do=q[:, :, :19]), r"do has logical shape"),
    (lambda q, k, v: burstlab.oracle(q, k, v, scale=float("nan")), r"scale \(nan\) must be finite"),
    (lambda q, k, v: burstlab.oracle(q, k, v, scale="x"), r"scale \('x'\) must be a number"),
    (lambda q, k, v: burstlab.oracle(q, k, v, layout="SBHD"), r"layout \('SBHD'\)"),
    (lambda q, k, v: burstlab.oracle(q.astype(np.int64), k, v), r"q has dtype int64"),
    (lambda q, k, v: burstlab.oracle(q.astype(np.complex128), k, v), r"q has dtype complex128"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask={"causal": True, "windw": 3}), r"unknown field 'windw'"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask={"causal": 1}), r"'causal' \(1\) must be True or False"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask="document:3"), r"mask \('document:3'\)"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask=burstlab.Mask.window(-2, 0)), r"window_left"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask=burstlab.Mask.document([0] * 19, [0] * 30)),
     r"q_segment has 19 entries but N_q is 20"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask=burstlab.Mask.document([1, 0] * 10, [0] * 30)),
     r"q_segment"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask=burstlab.Mask(q_segment=[0] * 20)), r"k_segment is empty"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask=burstlab.Mask.block(8, 8, [1, 0, 1])), r"block_mask has 3 entries"),
    (lambda q, k, v: burstlab.oracle(q, k, v, mask=burstlab.Mask.block(8, 8, [2] * 12)), r"block_mask"),
    (lambda q, k, v: burstlab.check(q, k, v), r"nothing to check"),
    (lambda q, k, v: burstlab.check(q, k, v, dq=q), r"do is required"),
    (lambda q, k, v: burstlab.check(q, k, v, out=q[:, :, :2]), r"out has logical shape"),
    (lambda q, k, v: burstlab.check(q, k, v, out=q, lse=q), r"lse has shape .*: 3 dimensions"),
    (lambda q, k, v: burstlab.check(q, k, v, out=q, dtype="fp8"), r"dtype \('fp8'\)"),
    (lambda q, k, v: burstlab.check(q, k.astype(np.float32), v, out=q), r"k has dtype fp32 but q has fp64"),
    (lambda q, k, v: burstlab.check(q, k, v, out=q, max_list=-1), r"max_list \(-1\)"),
])
def test_bad_input_names_the_field(qkv, call, match):
    with pytest.raises(ValueError, match=match):
        call(*qkv)


def test_mask_constructor_errors():
    with pytest.raises(ValueError, match="unknown field 'windw'"):
        burstlab.Mask(windw=3)
    with pytest.raises(ValueError, match="'window_left' \\('a'\\) must be an integer"):
        burstlab.Mask(window_left="a")
    with pytest.raises(ValueError, match="'q_segment'\\[1\\] \\(0.5\\) must be an integer"):
        burstlab.Mask(q_segment=[0, 0.5])
    with pytest.raises(ValueError, match="'k_segment' has dtype float64"):
        burstlab.Mask(k_segment=np.zeros(3))
    with pytest.raises(ValueError, match="both masks have a q part"):
        burstlab.Mask.document([0, 1]) & burstlab.Mask.document([0, 0])
    with pytest.raises(AttributeError):
        burstlab.Mask().causal = True
    assert issubclass(burstlab.Error, ValueError)


def test_case_errors(tmp_path):
    with pytest.raises(ValueError, match="not a case directory"):
        burstlab.Case.load(tmp_path / "nothing")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "case.json").write_text('{"format": "burstlab-case"}')
    with pytest.raises(ValueError, match="missing field 'version'"):
        burstlab.Case.load(tmp_path / "c")
    c = burstlab.suite(dtype="fp32")[0]
    with pytest.raises(ValueError, match=r"out has logical shape"):
        c.check(out=np.zeros((1, 1, 1, 1), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        burstlab.suite(dtype="int8")
