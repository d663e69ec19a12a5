"""`burstlab schedule --svg FILE` writes well-formed XML: one <g class="phase"> per drawn phase,
in it one <g class="rank"> per rank, each with one <rect class="cell"> per step (0..T-1), and the
cells' pairs agree with `schedule --json` of the same flags. Also: --svg of an algorithm that is
not drawn exits 2 naming it, and an SVG that cannot be written exits 2.

Usage: python3 check_svg.py BURSTLAB_EXE WORK_DIR   (tests/tools/CMakeLists.txt: tools.schedule_svg)
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

exe, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
NS = "{http://www.w3.org/2000/svg}"


def run(args, expect=0):
    r = subprocess.run([exe, "schedule", *args], capture_output=True, text=True)
    assert r.returncode == expect, f"{args}: exit {r.returncode}, want {expect}\n{r.stdout}\n{r.stderr}"
    return r


def check(name, args, G, T, phases):
    path = os.path.join(work, name + ".svg")
    if os.path.exists(path):
        os.remove(path)
    run([*args, "--svg", path])
    root = ET.parse(path).getroot()  # raises on malformed XML
    assert root.tag == NS + "svg", root.tag
    groups = [g for g in root.iter(NS + "g") if g.get("class") == "phase"]
    assert [g.get("data-phase") for g in groups] == phases, [g.get("data-phase") for g in groups]
    data = json.loads(run([*args, "--json"]).stdout)
    for k, g in enumerate(groups):
        assert int(g.get("data-ranks")) == G and int(g.get("data-steps")) == T
        ranks = [x for x in g if x.tag == NS + "g" and x.get("class") == "rank"]
        assert [int(x.get("data-rank")) for x in ranks] == list(range(G)), "one row per rank, in order"
        for r, row in enumerate(ranks):
            cells = [c for c in row if c.tag == NS + "rect" and c.get("class") == "cell"]
            assert [int(c.get("data-step")) for c in cells] == list(range(T)), f"rank {r}: one column per step"
            assert all(int(c.get("data-rank")) == r for c in cells)
            steps = data["distflash"]["steps"][r] if "distflash" in data else data["phases"][k]["steps"][r]
            assert [int(c.get("data-pairs")) for c in cells] == [s["pairs"] for s in steps], f"rank {r}: pairs"
    print(f"{name}: OK ({len(groups)} phase(s), {G} ranks x {T} steps)")


check("ring_zigzag_both", ["--algo", "ring", "--world", "4", "--partition", "zigzag", "--nq", "16", "--nk", "16"],
      4, 4, ["forward", "backward"])
check("burst_striped_bwd", ["--algo", "burst", "--world", "3", "--partition", "striped", "--pass", "bwd",
                            "--hq", "4", "--hkv", "1", "--nq", "13", "--nk", "11"], 3, 3, ["backward"])
check("double_ring", ["--algo", "double-ring", "--world", "4", "--gpus-per-node", "2", "--pass", "fwd"],
      4, 4, ["forward"])
check("distflash_even", ["--algo", "distflash", "--world", "4"], 4, 3, ["forward"])
check("distflash_odd", ["--algo", "distflash", "--world", "5", "--nq", "20", "--nk", "20"], 5, 3, ["forward"])

r = run(["--algo", "ulysses", "--world", "2", "--svg", os.path.join(work, "no.svg")], expect=2)
assert "ulysses" in r.stdout + r.stderr, r.stdout + r.stderr
r = run(["--algo", "ring", "--svg", os.path.join(work, "missing-dir", "x.svg")], expect=2)
assert "svg" in r.stdout + r.stderr, r.stdout + r.stderr
print("errors: OK")
