"""The observer's cost: one loop's round timed untraced, under ``torch.profiler``, and
measured by the plugin with each of its sources, every run in a process of its own.

Run on a CUDA machine with PyTorch: ``python benchmarks/observer.py [LOOP ...] [--runs N]
[--modes MODE,...]``. Loops: ``graph`` (a ``torch.compile(mode="reduce-overhead")`` MLP,
30 CUDA-graph replays a round: host-bound), ``cnn`` (a CNN whose next batch is copied
on a side stream), ``launches`` (50,000 one-element ``add_`` launches), ``pytorch`` (the
upload/train loop of ``tests/gpu``) and ``jax`` (12 ``device_put`` of 64 MiB and a jitted
matmul chain; skipped where JAX is missing). Modes: ``untraced``; ``profiler``
(``torch.profiler`` with CUDA activity); ``plugin`` (a child pytest whose test calls
``gpuprof.measure``: the round is a window); ``plugin-no-cupti``; and, to find what
costs, ``plugin-no-sample``, ``plugin-no-nvml``, ``plugin-no-nvtx``,
``plugin-no-threads`` (neither NVML's sampler nor the stack sampler),
``plugin-no-sample-no-nvtx`` (what sampling and NVTX cost together) and
``plugin-sample-2ms``/``-5ms`` (the stack sampler's period set by the child's conftest);
``plugin-timed`` (everything on, but the test times its rounds itself, as ``untraced``
does, without ``measure()``'s windows); ``child`` (the ``untraced`` process started as a
measured test starts its children: its start-up hook records its device work with CUPTI).

Every run warms the loop up (compiling, caching), then times ``ROUNDS[loop]`` rounds; a
round's wall is its host time to the end of its device work (a synchronize). Printed:
one JSON line per run (median wall of its rounds, and the plugin's utilization and kernel
time), then per loop and mode the median over runs against ``untraced``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from child import env, pytest_command  # benchmarks/

LOOPS = {
    "graph": """
import torch

def make_round():
    torch.backends.cuda.matmul.allow_tf32 = False
    layers = [torch.nn.Linear(2048, 2048) for _ in range(4)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())]).cuda().eval()
    x = torch.randn(1024, 2048, device="cuda")
    step = torch.compile(model, mode="reduce-overhead")

    def one_round():
        with torch.no_grad():
            for _ in range(30):
                y = step(x)
        torch.cuda.synchronize()
        return y

    return one_round
""",
    "cnn": """
import torch

def make_round():
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 7, stride=2, padding=3), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(128, 256, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(256, 10),
    ).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    batches = [torch.randn(64, 3, 224, 224).pin_memory() for _ in range(2)]
    side = torch.cuda.Stream()

    def one_round():
        with torch.cuda.stream(side):
            nxt = batches[0].to("cuda", non_blocking=True)
        for i in range(10):
            torch.cuda.current_stream().wait_stream(side)
            x = nxt
            x.record_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                nxt = batches[(i + 1) % 2].to("cuda", non_blocking=True)
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
        torch.cuda.synchronize()

    return one_round
""",
    "launches": """
import torch

def make_round():
    x = torch.zeros(1, device="cuda")

    def one_round():
        for _ in range(50_000):
            x.add_(1)
        torch.cuda.synchronize()

    return one_round
""",
    "pytorch": """
import torch

def make_round():
    host = torch.full((4096, 4096), 0.5).pin_memory()
    weight = torch.randn(4096, 4096, device="cuda", requires_grad=True)

    def one_round():
        for _ in range(6):
            x = host.to("cuda", non_blocking=True)
            (torch.relu(weight @ x) ** 2).mean().backward()
        torch.cuda.synchronize()

    return one_round
""",
    "jax": """
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
import numpy as np

def make_round():
    arrays = [np.full((4096, 4096), float(i), dtype=np.float32) for i in range(12)]
    matmul = jax.jit(lambda x: (x @ x @ x).sum())

    def one_round():
        put = [jax.device_put(a) for a in arrays]
        jax.block_until_ready(sum(matmul(x) for x in put))

    return one_round
""",
}
ROUNDS = {"graph": 20, "cnn": 10, "launches": 3, "pytorch": 10, "jax": 10}
WARMUP = 3
PLUGIN_FLAGS = {
    "plugin": [],
    "plugin-no-cupti": ["--gpu-no-cupti"],
    "plugin-no-sample": ["--gpu-sample=off"],
    "plugin-no-nvml": ["--gpu-no-nvml"],
    "plugin-no-nvtx": ["--gpu-nvtx=off"],
    "plugin-no-threads": ["--gpu-no-nvml", "--gpu-sample=off"],
    "plugin-no-sample-no-nvtx": ["--gpu-sample=off", "--gpu-nvtx=off"],
    "plugin-sample-2ms": [],
    "plugin-sample-5ms": [],
    "plugin-timed": [],
}
# the stack sampler's period, set before the test creates the sampler
PERIODS = {"plugin-sample-2ms": 0.002, "plugin-sample-5ms": 0.005}
MODES = ["untraced", "profiler", *PLUGIN_FLAGS, "child"]

TEST = """
from observed_loop import make_round


def test_round(gpuprof):
    one_round = make_round()
    for _ in range({warmup}):
        one_round()
    gpuprof.measure(one_round, rounds={rounds}, warmup=0)
"""

# the rounds timed by the test itself, the plugin live around it
TIMED_TEST = """
import json
import statistics
import time

from observed_loop import make_round


def test_round(gpuprof):
    one_round = make_round()
    for _ in range({warmup}):
        one_round()
    walls = []
    for _ in range({rounds}):
        start = time.perf_counter_ns()
        one_round()
        walls.append((time.perf_counter_ns() - start) / 1e6)
    with open("walls.json", "w") as out:
        json.dump(statistics.median(walls), out)
"""


def timed(loop: str, profiled: bool) -> dict[str, float]:
    """Run in this process: the median wall of the rounds, untraced or under torch.profiler."""
    import contextlib
    import time

    namespace: dict = {}
    exec(LOOPS[loop], namespace)
    one_round = namespace["make_round"]()
    for _ in range(WARMUP):
        one_round()
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if profiled:
        from torch.profiler import ProfilerActivity, profile

        context = profile(activities=[ProfilerActivity.CUDA])
    walls = []
    with context:
        for _ in range(ROUNDS[loop]):
            start = time.perf_counter_ns()
            one_round()
            walls.append((time.perf_counter_ns() - start) / 1e6)
    return {"wall_ms": statistics.median(walls)}


def plugin(loop: str, flags: list[str], period_s: float | None = None, timed: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "observed_loop.py").write_text(LOOPS[loop])
        Path(tmp, "test_observed.py").write_text(
            (TIMED_TEST if timed else TEST).format(warmup=WARMUP, rounds=ROUNDS[loop])
        )
        if period_s is not None:
            Path(tmp, "conftest.py").write_text(f"import pytest_gpuprof.capture.stacks as s\ns.PERIOD_S = {period_s}\n")
        report = Path(tmp, "r.json")
        done = subprocess.run(
            pytest_command(f"--gpu-report={report}", *flags, tmp), capture_output=True, text=True, cwd=tmp, env=env()
        )
        if done.returncode != 0:
            raise RuntimeError(f"plugin run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
        if timed:
            return {"wall_ms": json.loads(Path(tmp, "walls.json").read_text())}
        (test,) = json.loads(report.read_text())["tests"]
        m = test["metrics"]
        return {
            "wall_ms": m["wall_ms"],  # the median over the rounds
            "utilization": m.get("utilization"),
            "kernel_ms": m.get("kernel_ms"),
        }


def child(loop: str, mode: str) -> dict[str, float]:
    if mode in ("untraced", "profiler"):
        return timed(loop, mode == "profiler")
    return plugin(loop, PLUGIN_FLAGS[mode], PERIODS.get(mode), timed=mode == "plugin-timed")


def child_kernel_ms(watch: Any) -> float | None:
    """The kernel time the traced child left its watch (the union of its kernels); None if
    it left none."""
    from pytest_gpuprof.analysis.processes import figures

    work = next((r.work for r in watch.collect() if r.work is not None), None)
    return figures(None, "", None, work, (0, 2**62)).kernel_ms


def run_child(loop: str, mode: str) -> dict[str, Any] | None:
    """One run of ``loop`` in a process of its own, in ``mode``; ``child``: started as a
    measured test starts its children (``ChildWatch``), which then reads what it left."""
    watch = None
    told: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if mode == "child":
        from pytest_gpuprof.capture.children import ChildWatch

        watch = ChildWatch()
        told = watch.told()
    try:
        with told:
            out = subprocess.run(
                [sys.executable, __file__, "--child", loop, "untraced" if mode == "child" else mode],
                capture_output=True,
                text=True,
                check=False,
            )
        if out.returncode != 0:
            print(json.dumps({"loop": loop, "mode": mode, "error": out.stderr[-1500:]}), flush=True)
            return None
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        if watch is not None:
            figures["kernel_ms"] = child_kernel_ms(watch)
        return figures
    finally:
        if watch is not None:
            watch.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loops", nargs="*", default=list(LOOPS))
    parser.add_argument("--runs", type=int, default=2, help="processes per loop and mode")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    modes = args.modes.split(",")
    for loop in args.loops:
        if loop == "jax" and importlib.util.find_spec("jax") is None:
            print(json.dumps({"loop": loop, "skipped": "JAX is not installed"}), flush=True)
            continue
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for run in range(args.runs):
            for mode in modes:  # modes in turn, so that drift spreads over all of them
                figures = run_child(loop, mode)
                if figures is None:
                    continue
                results[mode].append(figures)
                print(json.dumps({"loop": loop, "mode": mode, "run": run, **figures}), flush=True)
        base = [r["wall_ms"] for r in results.get("untraced", [])]
        untraced = statistics.median(base) if base else None
        for mode, runs in results.items():
            if not runs:
                continue
            wall = statistics.median(r["wall_ms"] for r in runs)
            against = f"{100 * (wall / untraced - 1):+.1f}%" if untraced else "-"
            util = [r["utilization"] for r in runs if r.get("utilization") is not None]
            kernel = [r["kernel_ms"] for r in runs if r.get("kernel_ms") is not None]
            extra = ""
            if util:
                extra = f", utilization {100 * statistics.median(util):.1f}%"
                if kernel and untraced:
                    extra += f" (kernels {statistics.median(kernel):.2f} ms / untraced wall: "
                    extra += f"{100 * statistics.median(kernel) / untraced:.1f}%)"
            print(f"{loop:9s} {mode:17s} wall {wall:9.2f} ms {against:>7s}{extra}", flush=True)


if __name__ == "__main__":
    main()
