"""How sharp a pull-request gate can be: device time against wall time, process to process.

``python3 benchmarks/gates.py run --processes 20 --out gates.json`` (on a CUDA machine):
each of 20 separate pytest processes measures three workloads (a CuPy kernel loop, the
PyTorch loop of ``tests/gpu``, the seed pipeline), each with one spin kernel of its own,
unchanged and with that kernel made 1%, 2% and 5% slower (more clock64 cycles), 5 rounds
each after a warm-up. The figures of every round (``wall_ms``, ``kernel_ms``,
``busy_ms``, each kernel's time, the SM clock) go to one JSON file.

``python3 benchmarks/gates.py judge gates.json [--history DIR]`` (anywhere): the spread
of each figure from process to process, then each gate's verdicts (``compare.assess``, as
``--gpu-compare-fail`` judges): the first process is the baseline, the other unchanged
processes count false alarms and the slowed ones catches. ``--history DIR`` also stores
the unchanged runs followed by the 5%-slower ones as baselines, for ``gpuprof history``,
and counts the change points the unchanged runs alone give.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from child import env, pytest_command  # noqa: E402  (benchmarks/)

SLOWER = (1.0, 1.01, 1.02, 1.05)
GATES = (
    "kernels:+0.5%",
    "kernels:+1%",
    "kernel_ms:+0.5%",
    "kernel_ms:+1%",
    "busy_ms:+1%",
    "wall_ms:+1%",
    "wall_ms:+2%",
    "wall_ms:+5%",
)

WORKLOADS = r'''
import cupy as cp
import pytest

SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}""", "spin")
KHZ = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)
SLOWER = [1.0, 1.01, 1.02, 1.05]


def spin(ms, slower, stream):
    with stream:
        SPIN((1,), (32,), (cp.int64(int(ms * KHZ * slower)),))


@pytest.mark.parametrize("slower", SLOWER)
def test_cupy_loop(gpuprof, slower):
    a = cp.random.rand(4096, 4096, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)

    def body():
        with gpuprof.step("compute"):
            with stream:
                for _ in range(6):
                    a @ a
            spin(4.0, slower, stream)
        stream.synchronize()

    gpuprof.measure(body, rounds=5, warmup=1)


@pytest.mark.parametrize("slower", SLOWER)
def test_torch_loop(gpuprof, slower):
    torch = pytest.importorskip("torch")
    host = [torch.full((4096, 4096), 0.5).pin_memory() for _ in range(2)]
    weight = torch.randn(4096, 4096, device="cuda", requires_grad=True)
    ptr = torch.cuda.current_stream().cuda_stream  # the spin kernel on PyTorch's own stream
    stream = cp.cuda.ExternalStream(ptr) if ptr else cp.cuda.Stream.null

    def body():
        for i in range(6):
            with gpuprof.step("upload"):
                x = host[i % 2].to("cuda", non_blocking=True)
            with gpuprof.step("train"):
                (torch.relu(weight @ x) ** 2).mean().backward()
        with gpuprof.step("spin"):
            spin(4.0, slower, stream)
        torch.cuda.synchronize()

    gpuprof.measure(body, rounds=5, warmup=1)


@pytest.mark.parametrize("slower", SLOWER)
def test_seed_pipeline(gpuprof, gpu_workload, slower):
    stream = cp.cuda.Stream(non_blocking=True)

    def body():
        gpu_workload.partitions(n=4, upload_bytes=1 << 30, strategy="two-lock")
        with gpuprof.step("spin"):
            spin(4.0, slower, stream)
        stream.synchronize()

    gpuprof.measure(body, rounds=5, warmup=1)
'''


def run(processes: int, out: Path) -> None:
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_gates.py").write_text(WORKLOADS)
        for i in range(processes):
            report = Path(folder, f"r{i}.json")
            args = pytest_command("--gpu-report", str(report), "test_gates.py")
            done = subprocess.run(args, cwd=folder, capture_output=True, text=True, env=env(*sys.path))
            if not report.is_file():
                print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"process {i} wrote no report")
            data = json.loads(report.read_text())
            runs.append({"machine": data["machine"], "tests": [_keep(t) for t in data["tests"]]})
            print(f"process {i + 1}/{processes}: {done.stdout.strip().splitlines()[-1]}", flush=True)
    out.write_text(json.dumps({"slower": SLOWER, "runs": runs}))


def _keep(test: dict) -> dict:
    """What judging needs of a report entry: its figures and their rounds."""
    metrics = test["metrics"]
    return {
        "nodeid": test["nodeid"],
        "outcome": test["outcome"],
        "metrics": {
            k: metrics.get(k) for k in ("wall_ms", "kernel_ms", "busy_ms", "utilization", "kernel_totals", "nvml")
        },
        "rounds": {
            k: v
            for k, v in test["rounds"].items()
            if k in ("wall_ms", "kernel_ms", "busy_ms") or k.startswith("kernels.")
        },
    }


def judge(path: Path, history: Path | None) -> None:
    from pytest_gpuprof.analysis.changepoints import change_points
    from pytest_gpuprof.verdict.compare import compare_tests
    from pytest_gpuprof.verdict.entry import Entry
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    data = json.loads(path.read_text())
    runs = data["runs"]
    by_test: dict[str, list[Entry]] = {}
    for run_ in runs:
        for t in run_["tests"]:
            by_test.setdefault(t["nodeid"], []).append(t)
    workloads = sorted({nodeid.split("[")[0] for nodeid in by_test})
    clocks = [
        t["metrics"]["nvml"]["sm_clock_mhz"] for tests in by_test.values() for t in tests if t["metrics"].get("nvml")
    ]
    print(f"{len(runs)} processes; SM clock over the windows {min(clocks):.0f}-{max(clocks):.0f} MHz" if clocks else "")
    for workload in workloads:
        unchanged = by_test[f"{workload}[1.0]"]
        print(f"\n{workload.split('::')[-1]}: spread from process to process, (max - min) / median of the run medians")
        spin = _spin_path(unchanged[0])
        for metric in ("wall_ms", "kernel_ms", "busy_ms", spin):
            medians = [statistics.median(t["rounds"][metric]["samples"]) for t in unchanged]
            spread = (max(medians) - min(medians)) / statistics.median(medians)
            within = statistics.median(
                (max(t["rounds"][metric]["samples"]) - min(t["rounds"][metric]["samples"]))
                / statistics.median(t["rounds"][metric]["samples"])
                for t in unchanged
            )
            name = "the spin kernel's total" if metric == spin else metric
            print(
                f"  {name:<24} {100 * spread:6.2f}% ({min(medians):.3f}-{max(medians):.3f}); within a process {100 * within:.2f}%"
            )
        base = unchanged[0]
        for expression in GATES:
            thresholds = parse_thresholds(expression)
            cells = []
            for slower in data["slower"]:
                current = by_test[f"{workload}[{slower}]"][1:] if slower == 1.0 else by_test[f"{workload}[{slower}]"]
                flagged = sum(
                    any(c.finding == "regression" for c in compare_tests(thresholds, base, t)) for t in current
                )
                label = "false alarms" if slower == 1.0 else f"{100 * (slower - 1):.0f}% slower caught"
                cells.append(f"{label} {flagged}/{len(current)}")
            print(f"  {expression:<16} " + "; ".join(cells))
        levels = [statistics.median(t["rounds"][spin]["samples"]) for t in unchanged]
        print(
            f"  change points in the {len(levels)} unchanged runs (the spin kernel, kernel_ms, wall_ms): "
            f"{len(change_points(levels))}, "
            f"{len(change_points([statistics.median(t['rounds']['kernel_ms']['samples']) for t in unchanged]))}, "
            f"{len(change_points([statistics.median(t['rounds']['wall_ms']['samples']) for t in unchanged]))}"
        )
    if history is not None:
        _store_history(runs, by_test, workloads, history, data["slower"][-1])


def _spin_path(test: Mapping[str, Any]) -> str:
    return next(k for k in test["rounds"] if k.startswith("kernels.") and "spin" in k)


def _store_history(runs: list[dict], by_test: dict, workloads: list[str], folder: Path, slower: float) -> None:
    """The unchanged runs, then the slowed ones, as numbered baselines of one machine."""
    from pytest_gpuprof.baselines.store import Store

    half = len(runs) // 2
    for i in range(len(runs)):
        variant = "1.0" if i < half else str(slower)
        tests = [{**by_test[f"{w}[{variant}]"][i], "nodeid": w} for w in workloads]
        report = {
            "schema": 1,
            "created": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00",  # one a second, in order
            "commit": f"run{i + 1:02d}",
            "machine": runs[0]["machine"],
            "tests": tests,
        }
        Store(folder).save(report, "main")
    print(
        f"\n{len(runs)} runs stored under {folder}: the first {half} unchanged, then the spin kernel {100 * (slower - 1):.0f}% slower"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p_run = commands.add_parser("run")
    p_run.add_argument("--processes", type=int, default=20)
    p_run.add_argument("--out", type=Path, default=Path("gates.json"))
    p_judge = commands.add_parser("judge")
    p_judge.add_argument("data", type=Path)
    p_judge.add_argument("--history", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "run":
        run(args.processes, args.out)
    else:
        judge(args.data, args.history)


if __name__ == "__main__":
    main()
