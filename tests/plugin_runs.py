"""What many plugin tests share: the upload test, a run's JSON report and one of its tests,
the data an HTML page carries."""

import json
import re

# For a pytest whose tests use no hypothesis, run in processes of its own (xdist workers,
# a subprocess): hypothesis's pytest plugin imports hypothesis as each session ends, about
# 75 ms a process; an in-process run finds it imported already.
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")

# two measured tests; GPUPROF_SLOW makes the second's kernels 40% slower
TWO_MEASURED = """
import os

def run(gpuprof, gpu_workload, ms):
    return gpuprof.measure(lambda: gpu_workload.compute(ms=ms), rounds=5, warmup=1)

def test_alpha(gpuprof, gpu_workload):
    run(gpuprof, gpu_workload, 5)

def test_omega(gpuprof, gpu_workload):
    run(gpuprof, gpu_workload, 7 if os.environ.get("GPUPROF_SLOW") else 5)
"""


UPLOAD_TEST = """
import pytest

{marker}
def test_upload(gpu_workload):
    gpu_workload.upload(1 << 20)
    gpu_workload.compute(ms=2)
"""


def report_of(pytester, *args, name="r.json"):
    result = pytester.runpytest("--gpu-budget", f"--gpu-report={name}", *args)
    return result, json.loads(pytester.path.joinpath(name).read_text())


def entry(report, name):
    (test,) = [t for t in report["tests"] if t["nodeid"].endswith(name)]
    return test


DATA_BLOCK = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)


def page_data_of(page):
    """The data an HTML report carries (its ``data`` block), from the page's text."""
    return json.loads(DATA_BLOCK.search(page)[1])


# a suite for gpuprof ab and bisect on the host backend's virtual clock: each run's level moves
# by up to GPUPROF_NOISE (1%; seeded from a counter the runs share) and the job's by
# GPUPROF_OFFSET, as a slow runner would; SLOWER is the commit's own change
AB_SUITE = """
import os, random
from pathlib import Path

SLOWER = {slower}

def _level():
    counter = Path(os.environ["GPUPROF_COUNTER"])
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    noise = float(os.environ.get("GPUPROF_NOISE", "0.01"))
    return float(os.environ.get("GPUPROF_OFFSET", "1")) * (1 + random.Random(n).uniform(-noise, noise))

def test_kernels(gpuprof, gpu_workload):
    level = _level()
    gpuprof.measure(lambda: gpu_workload.compute(ms=4 * level * SLOWER), rounds=5, warmup=0)

def test_steady(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds=5, warmup=0)
"""


def git(path, *args):
    """``git ARGS`` in ``path``, its output."""
    import subprocess

    return subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True).stdout


def new_repository(root, test_perf):
    """A git repository at ``root`` (made) whose first commit holds ``test_perf.py``."""
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "ab@example.com")
    git(root, "config", "user.name", "ab")
    (root / "test_perf.py").write_text(test_perf)
    (root / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "base")
    return root
