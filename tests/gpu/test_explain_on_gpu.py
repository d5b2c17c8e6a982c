"""``gpuprof explain`` on a GPU, on PyTorch code as users write it: one change at a time
between two runs of a two-step test (an upload, then compute), and the cause explain puts
first must be that change: a larger matmul (its kernels slower, or others chosen), an
upload from pageable memory instead of pinned, a ``torch.cuda.synchronize()`` added between
small kernels, and TF32 no longer allowed (cuBLAS swaps its kernels). Each run is a fresh pytest
process; the figures are printed (``-s``) for docs/performance.md, by card."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SUITE = """
import torch

SIZE, PINNED, SYNC, TF32 = {size}, {pinned}, {sync}, {tf32}


def test_pipeline(gpuprof):
    torch.backends.cuda.matmul.allow_tf32 = TF32
    host = torch.randn(32 * 2**20 // 4)  # 32 MiB
    host = host.pin_memory() if PINNED else host
    a = torch.randn(SIZE, SIZE, device="cuda")
    small = torch.randn(256, device="cuda")

    def body():
        with gpuprof.step("upload", pageable=not PINNED):
            device = host.to("cuda", non_blocking=True)
        with gpuprof.step("compute"):
            b = a @ a
            for _ in range(40):
                small.mul_(1.0001)
                if SYNC:
                    torch.cuda.synchronize()
        torch.cuda.synchronize()
        return device, b

    gpuprof.measure(body, rounds=7, warmup=2)
"""

BASE = {"size": 2048, "pinned": True, "sync": False, "tf32": False}
# each change (the run before, the run after, each over BASE; each makes the test slower),
# and what the cause explain puts first must say
CASES = {
    "larger matmul": ({}, {"size": 3072}, "kernel "),
    "pageable upload": ({}, {"pinned": False}, "copies in step upload"),
    "added synchronize": ({}, {"sync": True}, "idle in step compute"),
    "tf32 kernels off": ({"tf32": True}, {}, "kernel "),
}


def _report(folder: Path, variant: dict[str, object], plugin_args: list[str], name: str) -> Path:
    (folder / "test_pipeline.py").write_text(SUITE.format(**variant))
    report = folder / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args, f"--gpu-report={report}"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return report


@pytest.mark.parametrize("case", list(CASES))
def test_explain_puts_the_change_made_first(case, tmp_path, plugin_args):
    pytest.importorskip("torch")
    before, after, expected = CASES[case]
    base = _report(tmp_path, {**BASE, **before}, plugin_args, "base")
    head = _report(tmp_path, {**BASE, **after}, plugin_args, "head")
    out = tmp_path / "explain.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_gpuprof", "explain", str(base), str(head), "--json", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    print(f"\n[{case}]\n{done.stdout}")
    assert done.returncode == 0, done.stderr
    (explained,) = json.loads(out.read_text())
    first = explained["causes"][0]
    assert first["what"].startswith(expected), explained["causes"][:3]
    change_ms = explained["after_ms"] - explained["before_ms"]
    assert change_ms > 0, "each change makes the test slower"
    # the causes and what they leave unexplained sum to the change, exactly
    total = sum(c["ms"] for c in explained["causes"]) + explained["unexplained_ms"]
    assert abs(total - change_ms) < 1e-6
    if case == "pageable upload":
        assert "pinned -> " in first["evidence"] and "pageable" in first["evidence"]
    if case == "tf32 kernels off":  # cuBLAS's kernels swapped: matched as one, or each named
        kernels = [c["what"] for c in explained["causes"] if c["what"].startswith("kernel ")]
        swapped = any(" replaced by " in w for w in kernels)
        assert swapped or {"appeared", "vanished"} <= {w.rsplit(" ", 1)[-1] for w in kernels}, kernels
