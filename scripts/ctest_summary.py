#!/usr/bin/env python3
"""The tests ctest lists under "The following tests did not run:", counted by reason and label.

    ctest_summary.py DID_NOT_RUN JUNIT_XML BUILD_DIR [FULL_LIST]

DID_NOT_RUN: the lines of ctest's "The following tests did not run:" block (scripts/test cuts
them out of ctest's output), so the counts are ctest's. JUNIT_XML: the same run's --output-junit
file, whose per-test output holds the reason (GoogleTest's GTEST_SKIP message, the last line a
SKIP_RETURN_CODE script printed). BUILD_DIR: where `ctest --show-only=json-v1` finds each test's
labels. FULL_LIST: where every such test is written, one per line (status, labels, name, reason).
Prints at most MAX_GROUPS + 3 lines.
Standard library only.
"""
import collections
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

MAX_GROUPS = 25
LINE = re.compile(r"^\s*(\d+) - (.*) \((Skipped|Disabled|Not Run)\)$")


def did_not_run(list_path):
    """[(name, status)] from the lines of ctest's "did not run" block, in its order."""
    with open(list_path, errors="replace") as f:
        return [(m.group(2), m.group(3)) for m in map(LINE.match, f.read().splitlines()) if m]


def reason_of(status, output):
    """One line: why the test did not run, from its output."""
    lines = [l.strip() for l in (output or "").splitlines()]
    for k, l in enumerate(lines):  # GoogleTest: "file:line: Skipped", then the message
        if re.search(r":\d+: Skipped$", l) or l == "Skipped":
            msg = [m for m in lines[k + 1:] if m and not m.startswith("[  SKIPPED ]")]
            if msg:
                return msg[0]
    for l in reversed(lines):
        if l and not l.startswith("[") and not l.startswith("Running main()"):
            return l
    return "no reason printed" if status != "Disabled" else "DISABLED property"


def main():
    log_path, junit_path, build_dir = sys.argv[1:4]
    full_path = sys.argv[4] if len(sys.argv) > 4 else None
    tests = did_not_run(log_path)
    if not tests:
        return
    outputs = {}
    try:
        for case in ET.parse(junit_path).getroot().iter("testcase"):
            out = case.find("system-out")
            outputs[case.get("name")] = out.text if out is not None else ""
    except (OSError, ET.ParseError) as e:
        print(f"(no per-test output to read the reasons from: {e})")
    labels = {}
    try:
        shown = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"], capture_output=True,
                               text=True, check=True).stdout
        for t in json.loads(shown)["tests"]:
            for p in t.get("properties", []):
                if p["name"] == "LABELS":
                    labels[t["name"]] = ",".join(p["value"])
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError):
        pass

    groups = collections.Counter()
    rows = []
    for name, status in tests:
        why = reason_of(status, outputs.get(name))
        lab = labels.get(name, "-")
        groups[(status.lower(), lab, why)] += 1
        rows.append(f"{status.lower()}\t{lab}\t{name}\t{why}")
    if full_path:
        with open(full_path, "w") as f:
            f.write("status\tlabels\ttest\treason\n" + "\n".join(rows) + "\n")

    print(f"Did not run: {len(tests)} tests, by reason (count, status, labels, reason):")
    ranked = groups.most_common()
    for (status, lab, why), n in ranked[:MAX_GROUPS]:
        print(f"  {n:5d}  {status:<8} {lab:<18} {why}")
    rest = ranked[MAX_GROUPS:]
    if rest:
        print(f"  {sum(n for _, n in rest):5d}  tests under {len(rest)} other reasons")
    if full_path:
        print(f"Every test that did not run, with its reason: {full_path}")


if __name__ == "__main__":
    main()
