"""--gpu-exclusive on one GPU: the examples under ``-n 2`` give the serial verdicts and
figures, and each test's wait is reported, outside its windows."""

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("xdist")
pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(pytester, plugin_args, name, *extra):
    result = pytester.runpytest_subprocess(*plugin_args, "--gpu-budget", f"--gpu-report={name}", *extra)
    tests = {t["nodeid"]: t for t in json.loads((pytester.path / name).read_text())["tests"]}
    return result, tests


def test_the_examples_under_xdist_read_as_serial(pytester, plugin_args):
    for path in EXAMPLES.iterdir():
        if path.suffix in (".py", ".toml"):
            shutil.copy(path, pytester.path / path.name)
    serial, alone = run(pytester, plugin_args, "serial.json")
    serial.assert_outcomes(passed=6, xfailed=1)
    parallel, shared = run(pytester, plugin_args, "parallel.json", "-n", "2")
    parallel.assert_outcomes(passed=6, xfailed=1)
    assert set(shared) == set(alone)
    for nodeid in ("test_seed_pipeline.py::test_single_lock_pipeline", "test_seed_pipeline.py::test_two_lock_pipeline"):
        before, now = alone[nodeid]["metrics"]["utilization"], shared[nodeid]["metrics"]["utilization"]
        assert now == pytest.approx(before, abs=0.02), nodeid  # the pipelines held the GPU alone
    assert all("waited_ms" in t for t in shared.values())
    parallel.stdout.fnmatch_lines(["*2 xdist workers shared 1 device(s) [[]0]; each test that used one held it alone*"])
