"""``gpuprof ab`` on a GPU: a 3% slower kernel caught by name with three pairs of runs, and
the same code passing, each run a fresh process on the one GPU (CuPy spin kernels of a
fixed number of cycles: what a kernel change does, whatever the clock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SUITE = '''
import cupy as cp

SPIN = cp.RawKernel(r"""
extern "C" __global__ void {name}(long long cycles) {{
    long long start = clock64();
    while (clock64() - start < cycles) {{}}
}}""", "{name}")
KHZ = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)


def test_spin(gpuprof):
    stream = cp.cuda.Stream(non_blocking=True)

    def body():
        with stream:
            for _ in range(4):
                SPIN((1,), (32,), (cp.int64(int(2.0 * KHZ * {slower})),))
            OTHER((1,), (32,), (cp.int64(int(2.0 * KHZ)),))
        stream.synchronize()

    gpuprof.measure(body, rounds=5, warmup=1)


OTHER = cp.RawKernel(r"""
extern "C" __global__ void steady(long long cycles) {{
    long long start = clock64();
    while (clock64() - start < cycles) {{}}
}}""", "steady")
'''


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    pytest.importorskip("cupy")
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "ab@example.com")
    _git(root, "config", "user.name", "ab")
    (root / "test_spin.py").write_text(SUITE.format(name="spin", slower=1.0))
    (root / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "base")
    return root


def _ab(root: Path, report: Path, plugin_args: list[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest_gpuprof", "ab", "--base", "main", "--pairs", "3", "--seed", "0"]
    command += ["--fail", "kernels:+1%,kernel_ms:+1%", "--report", str(report), "--", "-q", *plugin_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, cwd=root, capture_output=True, text=True, env=env, timeout=500, check=False)


def test_a_three_percent_slower_kernel_is_caught_by_name_with_three_pairs(repo, tmp_path, plugin_args):
    (repo / "test_spin.py").write_text(SUITE.format(name="spin", slower=1.03))
    _git(repo, "checkout", "-qb", "pr")
    _git(repo, "commit", "-qam", "slower")  # the pull request: committed, as ab measures commits
    done = _ab(repo, tmp_path / "ab.json", plugin_args)
    print(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    found = json.loads((tmp_path / "ab.json").read_text())
    regressed = {e["metric"] for e in found["regressions"]}
    assert "kernels.spin.total_ms" in regressed and "kernels.steady.total_ms" not in regressed
    spin = next(e for e in found["effects"] if e["metric"] == "kernels.spin.total_ms")
    assert 0.02 < spin["effect"] < 0.04 and spin["pairs"] == 3


def test_the_same_code_passes(repo, tmp_path, plugin_args):
    done = _ab(repo, tmp_path / "ab.json", plugin_args)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
