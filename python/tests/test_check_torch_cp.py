"""examples/check_torch_cp.py on CPU: what does not need GPUs. Its flags; its masks, as burstlab
and as the FlexAttention mask_mod see them (the same matrix); and its gather-and-judge path on
fake shards of a head-tail (load-balanced) split: put back in sequence order they pass, and a wrong
merge (two ranks' shards swapped) fails at the rows it moved."""
import os
import subprocess
import sys

import numpy as np
import pytest

import burstlab
from conftest import ROOT, load_script, require_torch

SCRIPT = os.path.join(ROOT, "examples", "check_torch_cp.py")


def example():
    return load_script(SCRIPT, "check_torch_cp")


def test_flags():
    m = example()
    a = m.parse_args([])
    assert (a.mask, a.causal, a.seq, a.heads, a.head_dim, a.check_rows) == ("causal", True, 32768, 32, 128, 64)
    assert m.parse_args(["--no-causal"]).mask == "none"
    a = m.parse_args(["--mask", "document", "--no-causal", "--docs", "3"])
    assert (a.mask, a.causal, a.docs) == ("document", False, 3)
    for bad, msg in ((["--mask", "none", "--causal"], "contradicts --causal"), (["--seq", "0"], "--seq (0) must be >= 1"),
                     (["--window", "-1"], "--window (-1) must be >= 0"),
                     (["--mask", "document", "--seq", "4", "--docs", "5"], "--docs (5) must be <= --seq (4)")):
        p = subprocess.run([sys.executable, SCRIPT, *bad], capture_output=True, text=True)
        assert p.returncode == 2 and msg in p.stderr, (bad, p.stderr)


def test_help_without_torch_and_refusals_without_gpus():
    # --help imports nothing heavy; without torch, or outside torchrun, or without a GPU: exit 2, a reason
    no_torch = "import sys; sys.modules['torch'] = None; sys.argv = ['check_torch_cp.py'] + sys.argv[1:]; " \
               f"exec(compile(open({SCRIPT!r}).read(), {SCRIPT!r}, 'exec'))"
    p = subprocess.run([sys.executable, "-c", no_torch, "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "torchrun --standalone --nproc-per-node 2" in p.stdout and "--check-rows" in p.stdout
    p = subprocess.run([sys.executable, "-c", no_torch], capture_output=True, text=True)
    assert p.returncode == 2 and "PyTorch is not installed" in p.stderr
    torch = require_torch()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    p = subprocess.run([sys.executable, SCRIPT, "--seq", "4096"], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "run me under torchrun" in p.stderr
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True,
                           env=dict(env, RANK="0", WORLD_SIZE="1", CUDA_VISIBLE_DEVICES=""))
        assert p.returncode == 2 and "sees no CUDA device" in p.stderr


def test_documents():
    m = example()
    L = m.doc_lengths(1000, 7, seed=3)
    assert len(L) == 7 and sum(L) == 1000 and min(L) >= 1 and L == m.doc_lengths(1000, 7, seed=3)
    assert m.doc_lengths(10, 1, 0) == [10]
    ids = m.doc_ids([2, 3])
    assert ids == [0, 0, 1, 1, 1]


@pytest.mark.parametrize("args", [["--mask", "document", "--docs", "5"], ["--mask", "document", "--docs", "4", "--no-causal"],
                                  ["--mask", "window", "--window", "7"], ["--mask", "window", "--window", "0"]])
def test_flex_mask_mod_is_the_burstlab_mask(args):
    torch = require_torch()
    m = example()
    N = 96
    a = m.parse_args(args + ["--seq", str(N)])
    lengths = m.doc_lengths(N, a.docs, a.seed)
    doc = torch.tensor(m.doc_ids(lengths))
    qi, kj = torch.arange(N)[:, None], torch.arange(N)[None, :]
    flex = m.mask_mod_of(a, doc)(0, 0, qi, kj).numpy()
    dense = m.burstlab_mask(a, lengths).dense(N, N)
    assert flex.shape == dense.shape and np.array_equal(flex, dense)
    with pytest.raises(ValueError, match="runs through SDPA"):
        m.mask_mod_of(m.parse_args(["--no-causal"]))


def head_tail(N, G):
    """Rank r's global positions under torch's head-tail split: chunks r and 2G-1-r of 2G."""
    c = N // (2 * G)
    return [np.r_[r * c:(r + 1) * c, (2 * G - 1 - r) * c:(2 * G - r) * c] for r in range(G)]


def test_gather_and_judge_fake_shards():
    torch = require_torch()
    m = example()
    N, G, H, d = 64, 2, 2, 8
    a = m.parse_args(["--seq", str(N), "--heads", str(H), "-d", str(d), "--check-rows", str(2 * H * N)])
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn((1, H, N, d), generator=g).to(torch.bfloat16) for _ in range(4))
    mask = m.burstlab_mask(a)
    full = burstlab.oracle(q, k, v, mask=mask, do=do)
    cand = {"out": full.O.to(torch.bfloat16), "lse": full.LSE.float(), "dq": full.dQ.to(torch.bfloat16),
            "dk": full.dK.to(torch.bfloat16), "dv": full.dV.to(torch.bfloat16)}
    pos = [torch.from_numpy(p) for p in head_tail(N, G)]

    def shards_of(x, positions):  # what each rank holds: its rows, in its local order
        return [x.index_select(2, p) for p in positions]

    got = {n: m.assemble(shards_of(x, pos), pos) for n, x in cand.items()}
    for n in cand:
        assert torch.equal(got[n], cand[n]), n
    r, wname, worst = m.judge(q, k, v, do, got, mask, a.check_rows, a.seed)
    assert r.passed and r.dtype == "bf16" and 0 < worst <= 1 and wname in {t.name for t in r.tensors}
    assert [t.name for t in r.tensors] == ["O", "LSE", "dQ", "dK", "dV"]
    assert m.verdict_line(r, wname, worst, "fake").startswith("check_torch_cp: PASS: fake: worst err/bound")
    # A wrong merge: the ranks' shards put back at each other's positions.
    bad = {n: m.assemble(shards_of(x, pos), pos[::-1]) for n, x in cand.items()}
    r, wname, worst = m.judge(q, k, v, do, bad, mask, a.check_rows, a.seed)
    assert not r.passed and worst > 1
    assert r["O"].wrong > 0 and r["dQ"].wrong > 0 and r["LSE"].wrong > 0
    line = m.verdict_line(r, wname, worst, "fake")
    assert line.startswith("check_torch_cp: FAIL: fake") and "#wrong" in line
    with pytest.raises(ValueError, match="cover 0..63 once"):
        m.assemble(shards_of(cand["out"], pos), [pos[0], pos[0]])


def _gather_worker(rank, G, port, N, result):
    import torch
    import torch.distributed as dist

    m = example()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=G)
    g = torch.Generator().manual_seed(5)
    x = torch.randn((1, 3, N, 4), generator=g)  # the same global tensor on every rank
    lse = torch.randn((1, 3, N), generator=g)
    pos = torch.from_numpy(head_tail(N, G)[rank])
    out = m.gather_to_rank0([x.index_select(2, pos), lse.index_select(2, pos)], pos)
    if rank == 0:
        result.put(bool(torch.equal(out[0], x) and torch.equal(out[1], lse)))
    else:
        result.put(out == [None, None])
    dist.destroy_process_group()


def test_gather_to_rank0_over_a_real_process_group():
    # The gather the script runs after torch's context_parallel, on 2 CPU processes (gloo): shards
    # of a head-tail split come back to rank 0 in sequence order; the other rank keeps nothing.
    torch = require_torch()
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_gather_worker, args=(r, 2, port, 32, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert [q.get(timeout=5), q.get(timeout=5)] == [True, True]
