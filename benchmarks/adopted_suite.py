"""An existing GPU suite adopted as it is: every test given a ``gpu_budget`` marker and
nothing else, run without and with the plugin; outcomes compared test by test, and the
wall of each run.

Run on a CUDA machine: ``python benchmarks/adopted_suite.py SUITE [PYTEST ARGS ...]``,
for example CuPy's own tests at its release tag (``git clone -b v14.2.0
https://github.com/cupy/cupy`` and ``SUITE=cupy/tests``, which holds its conftest).
The plain run goes first, so that a kernel cache the suite fills is warm for both when
run twice (``--runs``). Printed: one JSON line per run, then the outcomes that differ,
the measured tests and how much of their unattributed idle ``idle_by_code`` names.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from child import env, plugin_args, pytest_command  # benchmarks/

ADOPT = '''"""A gpu_budget marker on every test, nothing else changed."""
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.gpu_budget())
'''


def outcomes(junit: Path) -> dict[str, str]:
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed")
        found[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return found


def run(suite: Path, extra: list[str], tmp: Path, adopted: bool, index: int) -> tuple[dict[str, str], dict]:
    junit = tmp / f"{'adopted' if adopted else 'plain'}{index}.xml"
    command = pytest_command(f"--junitxml={junit}", *extra, plugin=False)
    environment = None
    if adopted:
        report = tmp / f"report{index}.json"
        command += [*plugin_args(), "-p", "gpuprof_adopt", f"--gpu-report={report}"]
        environment = env(tmp)
    start = time.perf_counter()
    done = subprocess.run([*command, str(suite)], capture_output=True, text=True, env=environment, check=False)
    wall = time.perf_counter() - start
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    if not junit.exists():
        raise RuntimeError(
            f"pytest wrote no results ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        )
    figures = {"adopted": adopted, "run": index, "wall_s": round(wall, 2), "rc": done.returncode, "summary": summary}
    if adopted:
        tests = [t for t in json.loads(report.read_text())["tests"] if t.get("metrics")]
        unattributed = sum(t["metrics"].get("unattributed_ms", 0.0) for t in tests)
        named = sum(c["ms"] for t in tests for c in t["metrics"].get("idle_by_code") or [])
        figures |= {"measured": len(tests), "unattributed_ms": round(unattributed, 1), "named_ms": round(named, 1)}
    return outcomes(junit), figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", type=Path)
    parser.add_argument("--runs", type=int, default=1)
    args, extra = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "gpuprof_adopt.py").write_text(ADOPT)
        for index in range(args.runs):
            plain, plain_figures = run(args.suite, extra, tmp, False, index)
            adopted, adopted_figures = run(args.suite, extra, tmp, True, index)
            print(json.dumps(plain_figures), json.dumps(adopted_figures), sep="\n", flush=True)
            differ = sorted(k for k in plain.keys() | adopted.keys() if plain.get(k) != adopted.get(k))
            print(f"{len(plain)} tests; outcomes that differ: {differ or 'none'}", flush=True)


if __name__ == "__main__":
    main()
