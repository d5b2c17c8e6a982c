"""Code nobody annotated for the plugin, on a real GPU: NVTX ranges are its steps, and the
sampled host stacks name the code behind the idle that no step explains. Each case runs
in a child pytest: NVTX reads its injection at a process's first NVTX call."""

import importlib.util
import json
from pathlib import Path

import pytest

# torch is imported by the child pytests only: a pytester test drops the modules it
# imported, and torch cannot be imported twice in one process
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch"),
]

# the loop of benchmarks/torch_loop.py, beside the child's tests
TORCH_LOOP = (Path(__file__).resolve().parents[2] / "benchmarks" / "torch_loop.py").read_text()

LOOP = """
import pytest
import torch

from torch_loop import make_loop, tensors as held


@pytest.fixture(scope="module")
def tensors():
    # one pinned block and one weight for both loops: their copies run at one rate
    return held()


def test_ranges(gpuprof, tensors):
    gpuprof.measure(make_loop(torch.cuda.nvtx.range, tensors), rounds=5, warmup=1)


def test_steps(gpuprof, tensors):
    gpuprof.measure(make_loop(gpuprof.step, tensors), rounds=5, warmup=1)
"""

EPOCH = """
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        image = rng.standard_normal((3, 256, 256), dtype=np.float32)
        for _ in range(10):  # decoding and augmenting: host work a real loader does
            image = np.tanh(image) * 1.01
        return torch.from_numpy(image), i % 10


def epoch(model, loader):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()


@pytest.fixture
def model():
    # the model, built and run once before the test (the first optimizer, cuDNN set-up)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).cuda()
    epoch(net, [(torch.zeros(8, 3, 256, 256), torch.zeros(8, dtype=torch.long))])
    return net


@pytest.mark.gpu_budget(min_utilization=0.99)
def test_epoch(model):
    loader = DataLoader(Images(), batch_size=8, num_workers=2, pin_memory=True)
    epoch(model, loader)
"""


def report(pytester, plugin_args, *extra):
    result = pytester.runpytest_subprocess(*plugin_args, "--gpu-report=r.json", *extra)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    return result, tests


def loops(pytester, plugin_args):
    """The loop with NVTX ranges and with gpuprof.steps, in one process from one pinned
    block (two processes' pinned copies ran at 53 and 55 GB/s): their steps' figures."""
    pytester.makepyfile(test_loop=LOOP, torch_loop=TORCH_LOOP)
    result, tests = report(pytester, plugin_args)
    assert "NVTX ranges as steps" in result.stdout.str()
    steps, ranges = tests["test_steps"]["metrics"]["steps"], tests["test_ranges"]["metrics"]["steps"]
    for name in ("upload", "train"):
        print(f"\n{name}: step {steps[name]}\n{name}: range {ranges[name]}")
    return steps, ranges


def test_nvtx_ranges_are_steps_that_own_their_copies_kernels_and_idle(pytester, plugin_args):
    steps, ranges = loops(pytester, plugin_args)
    assert ranges["upload"]["bytes"] == steps["upload"]["bytes"] == 6 * 64 * (1 << 20)
    assert ranges["upload"]["count"] == steps["upload"]["count"] == 6
    assert ranges["upload"]["gbps"] == pytest.approx(steps["upload"]["gbps"], rel=0.1)
    assert ranges["train"]["sm_utilization"] == pytest.approx(steps["train"]["sm_utilization"], rel=0.01)
    assert ranges["upload"]["idle_ms"] == pytest.approx(steps["upload"]["idle_ms"], rel=0.05)


def test_nvtx_off_makes_no_steps_of_ranges(pytester, plugin_args):
    pytester.makepyfile(test_loop=LOOP, torch_loop=TORCH_LOOP)
    result, tests = report(pytester, plugin_args, "--gpu-nvtx=off", "-k", "ranges")
    assert "NVTX off" in result.stdout.str()
    assert "upload" not in tests["test_ranges"]["metrics"]["steps"]


def test_a_dataloader_epoch_adopted_with_a_marker_names_the_loader(pytester, plugin_args):
    pytester.makepyfile(test_train=EPOCH)
    result, tests = report(pytester, plugin_args, "--gpu-budget")
    m = tests["test_epoch"]["metrics"]
    print("\n" + "\n".join(line for line in result.stdout.lines if "host in" in line or "kernel-idle" in line))
    print(
        f"unattributed {m['unattributed_ms']:.1f} ms of {m['overhead_ms']:.1f} ms; idle_by_code {m['idle_by_code'][:4]}"
    )
    named = sum(c["ms"] for c in m["idle_by_code"])
    assert named >= 0.8 * m["unattributed_ms"]
    assert "torch/utils/data/dataloader.py" in m["idle_by_code"][0]["where"]
    assert m["idle_by_code"][0]["where"].startswith("test_train.py:")
    result.stdout.fnmatch_lines(["*unattributed, host in: test_train.py:* epoch > torch/utils/data/dataloader.py:*"])
