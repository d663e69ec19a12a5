"""scripts/bench-cp's parsing and table on CPU: the JSON it reads is produced here by the command line
itself (`burstlab run --impl cpu --algo ring,burst --single --world 2 --json`), and the torch CSV by
the field names scripts/bench_cp_torch.py prints, so neither format can drift from the script."""
import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, load_script, run_cli

SCRIPT = os.path.join(ROOT, "scripts", "bench-cp")


def bench_cp():
    return load_script(SCRIPT, "bench_cp")


def torch_csv_fields():
    # The tuple bench_cp_torch.py prints as its header, read from its source (importing it needs torch).
    tree = ast.parse(open(os.path.join(ROOT, "scripts", "bench_cp_torch.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CSV_FIELDS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("scripts/bench_cp_torch.py defines no CSV_FIELDS")


def ours_json(cli, *extra):
    p = run_cli(cli, "run", "--impl", "cpu", "--algo", "ring,burst", "--single", "--world", "2", "--partition",
                "zigzag", "--mask", "causal", "--hq", "2", "--hkv", "2", "--nq", "64", "--nk", "64", "-d", "16",
                "--pass", "both", "--check-rows", "8", "--json", *extra)
    return p.stdout


def test_parses_the_command_lines_json(cli):
    m = bench_cp()
    text = ours_json(cli)
    r = m.parse_burstlab_json(text)
    assert set(r["ms"]) == {"ring", "burst", "1 GPU"} and all(v > 0 for v in r["ms"].values())
    assert r["verdict"] == {"1 GPU": "PASS", "ring": "PASS", "burst": "PASS"} and r["world"] == 2
    doc = json.loads(text)
    want = {row["impl"].split("/")[0]: row["dist_ms"] for row in doc["distributed"]["scaling"]
            if row["pass"] == "fwd+bwd"}
    assert {a: r["ms"][a] for a in want} == want
    # fwd+bwd is the sum of the two passes' best times the rows report
    ring = sum(row["time_ms"] for row in doc["rows"] if row["impl"] == "ring/cpu")
    assert r["ms"]["ring"] == pytest.approx(ring, rel=1e-9)
    # a failed row makes its algorithm's verdict FAIL; text before the object (mpirun) is skipped
    for row in doc["rows"]:
        if row["impl"] == "burst/cpu" and row["pass"] == "bwd":
            row["result"] = "FAIL"
    r = m.parse_burstlab_json("rank 1: started\n" + json.dumps(doc))
    assert r["verdict"]["burst"] == "FAIL" and r["verdict"]["ring"] == "PASS"
    with pytest.raises(ValueError, match="--single"):
        m.parse_burstlab_json(run_cli(cli, "run", "--impl", "cpu", "--nq", "8", "--nk", "8", "--json").stdout)


def test_parses_the_torch_csv_and_prints_the_table(cli):
    m = bench_cp()
    fields = torch_csv_fields()
    row = lambda **kv: ",".join(str(kv.get(f, "0")) for f in fields)
    text = "\n".join(["[rank0] warnings first", ",".join(fields),
                      row(impl="sdpa-1gpu", world=1, **{"pass": "fwd"}, best_ms=10.0, max_diff=0),
                      row(impl="torch-cp", world=2, **{"pass": "fwd"}, best_ms=6.0, max_diff=0.01),
                      row(impl="sdpa-1gpu", world=1, **{"pass": "fwd+bwd"}, best_ms=40.0, max_diff=0),
                      row(impl="torch-cp", world=2, **{"pass": "fwd+bwd"}, best_ms=24.0, max_diff=0.0078)])
    t = m.parse_torch_csv(text)
    assert t == {"torch CP": 24.0, "SDPA 1 GPU": 40.0, "max_diff": 0.0078}
    ours = m.parse_burstlab_json(ours_json(cli))
    table = m.format_table([{"shape": "64 causal", "torch": t, "ours": ours},
                            {"shape": "128 none", "error": "ours failed (exit 2: no JSON object)"}], ["ring", "burst"])
    lines = table.splitlines()
    assert lines[0].startswith("| shape | torch CP fwd+bwd ms | SDPA 1 GPU ms | ours ring ms | ours burst ms")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "64 causal" and cells[1] == "24.0" and cells[2] == "40.0"
    assert cells[6] == f"{24.0 / ours['ms']['ring']:.2f}" and cells[7] == f"{24.0 / ours['ms']['burst']:.2f}"
    assert cells[-1] == "ring PASS, burst PASS"
    assert lines[3].split("|")[-2].strip().startswith("ours failed")
    with pytest.raises(ValueError, match="no CSV header"):
        m.parse_torch_csv("Traceback (most recent call last):\n  RuntimeError: NCCL error")


def test_help_dry_run_and_bad_flags():
    run = lambda *a: subprocess.run([sys.executable, SCRIPT, *a], capture_output=True, text=True)
    p = run("--help")
    assert p.returncode == 0 and "torch CP / ours" in p.stdout and "--quick" in p.stdout and "BURSTLAB" in p.stdout
    p = run("--dry-run", "--quick", "--burstlab", "/opt/burstlab")
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    assert len(lines) == 4 and "bench_cp_torch.py --seq 4096 --heads 8 -d 128 --reps 1 --causal" in lines[0]
    assert lines[1].startswith("/opt/burstlab run --impl cuda --transport nccl --algo ring,burst --single")
    assert "--mask causal --partition zigzag" in lines[1] and "--mask none --partition contiguous" in lines[3]
    p = run("--seq", "1000", "--world", "3")
    assert p.returncode == 2 and "--seq 1000 must be a multiple of 2 x --world (6)" in p.stderr
    p = run("--mask", "window")
    assert p.returncode == 2 and "masks are causal and/or none" in p.stderr
    p = run("--burstlab", "/nonexistent/burstlab", "--skip-torch")
    assert p.returncode == 2 and "not an executable file" in p.stderr
