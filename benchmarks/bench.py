"""pytest-gpuprof against the tools a GPU engineer would otherwise use, side by side.

Run on a CUDA machine: ``python benchmarks/bench.py [ROW ...]`` (CuPy, cupti-python,
triton for the do_bench row; ROW: cupti, plugin, step, accuracy, repeatability, gate).
``python benchmarks/bench.py --host [plugin] [gate]`` runs the rows that mean something
without a GPU: the plugin's cost and the gate rows on the host backend. ``--runs N`` and
``--tests N``: the plugin row's pairs of runs (15) and trivial tests (1,000). Prints one
table; each row is measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from child import env, plugin_args, pytest_command  # noqa: E402  (benchmarks/)
from gate_rows import gate_reliability, gate_reliability_kernels  # noqa: E402
from table import per_call_us, row  # noqa: E402


def step_cost(cp, backend, profiler) -> float:
    stream = backend.stream()
    e1, e2 = cp.cuda.Event(), cp.cuda.Event()

    def raw(n: int) -> None:
        for _ in range(n):
            e1.record(stream)
            e2.record(stream)

    def step(n: int) -> None:
        for _ in range(n):
            with profiler.step("s"):
                pass

    raw_us = per_call_us(raw, 5000)
    row(
        "host cost of gpuprof.step (CUPTI truth)",
        f"{per_call_us(step, 5000):.2f} us/step",
        f"raw event pair {raw_us:.2f} us",
    )
    profiler.collector.reset()
    return raw_us


def empty_launches(cp):
    """``launch(n)``: n launches of an empty one-thread kernel on a stream of its own, waited for."""
    empty = cp.RawKernel(r'extern "C" __global__ void empty() {}', "empty")
    stream = cp.cuda.Stream(non_blocking=True)

    def launch(n: int) -> None:
        with stream:
            for _ in range(n):
                empty((1,), (1,), ())
        stream.synchronize()

    return launch


def cupti_cost(cp) -> None:
    storm = empty_launches(cp)
    storm(1000)
    from pytest_gpuprof.capture import cupti_trace as cupti_capture

    capture, status = cupti_capture.start()
    if capture is None:
        row("CUPTI tracing cost per kernel launch", status, "")
        return
    # Alternate kernel tracing off and on, so that drift in the machine hits both alike.
    from cupti import cupti

    kind = cupti.ActivityKind.CONCURRENT_KERNEL
    off, on = [], []
    for _ in range(5):
        cupti.activity_disable(kind)
        off.append(per_call_us(storm, 20000))
        cupti.activity_enable(kind)
        on.append(per_call_us(storm, 20000))
        capture.drain()
    capture.stop()
    on_us, off_us = statistics.median(on), statistics.median(off)
    row(
        "CUPTI tracing cost per kernel launch (empty kernel storm)",
        f"{on_us - off_us:+.2f} us ({on_us:.2f} on vs {off_us:.2f} off)",
        "medians of 5 alternations, 20,000 launches each",
    )


def unused_plugin_cost(runs: int = 15, tests: int = 1000) -> None:
    """``tests`` trivial tests with and without the plugin, ``runs`` pairs run alternately.

    Whole-process times vary by several percent from run to run, more than the plugin's
    share: the row gives the median of the paired differences, in wall and in CPU time
    (user + system of the child), with the interquartile range of the differences.
    """
    import resource

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_trivial.py").write_text(
            f"import pytest\n\n@pytest.mark.parametrize('i', range({tests}))\ndef test_trivial(i):\n    assert i >= 0\n"
        )

        def run(*extra: str) -> tuple[float, float]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(
                pytest_command(*extra, tmp, plugin=False),
                check=True,
                capture_output=True,
                env=env(),
            )
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

        # Loaded as an installed plugin is in a suite that does not use it: no option. Where
        # the package is installed its entry point loads it (and -p would load it twice).
        plugin = plugin_args()
        run(*plugin)  # compile once
        pairs = [(run("-p", "no:gpuprof"), run(*plugin)) for _ in range(runs)]
        for index, label in ((0, "wall"), (1, "CPU")):
            without = statistics.median(p[0][index] for p in pairs)
            diffs = sorted(100 * (p[1][index] - p[0][index]) / without for p in pairs)
            q = statistics.quantiles(diffs, n=4)
            row(
                f"{tests:,} trivial tests, plugin loaded vs not: {label} ({runs} pairs)",
                f"{statistics.median(diffs):+.1f}% (IQR of pairs {q[0]:+.1f}..{q[2]:+.1f}%)",
                f"{without:.2f} s without",
            )


def accuracy(cp, profiler, workload) -> None:
    stream = workload.backend.stream()
    for on_ms, off_ms in ((40, 10), (25, 25), (10, 40), (2, 8)):
        refs: list[float] = []

        def cycle(on_ms: float = on_ms, off_ms: float = off_ms, refs: list[float] = refs) -> None:
            start = time.perf_counter_ns()
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            with profiler.step("compute"):
                workload.backend.compute(on_ms, kind="matmul", stream=stream)
                stream.synchronize()
            b.record(stream)
            time.sleep(off_ms / 1000)
            refs.append(cp.cuda.get_elapsed_time(a, b) * 1e6 / (time.perf_counter_ns() - start))

        m = profiler.measure(cycle, rounds=7, warmup=1)
        ref = statistics.median(refs)
        row(
            f"duty cycle {on_ms} ms on / {off_ms} ms off: utilization",
            f"{100 * m.utilization:.2f}% (spread {100 * m.rounds['utilization'].iqr:.2f} pt IQR)",
            f"events {100 * ref:.2f}%, nominal {100 * on_ms / (on_ms + off_ms):.1f}%: diff {100 * (m.utilization - ref):+.2f} pt",
        )


def anchors(cp, profiler) -> None:
    from cupyx.profiler import benchmark

    a = cp.ones((4096, 4096), dtype=cp.float32)

    def kernel() -> None:
        cp.matmul(a, a)

    m = profiler.measure(kernel, rounds=50, warmup=5)
    cupyx_ms = statistics.median(benchmark(kernel, n_repeat=50, n_warmup=5).gpu_times[0]) * 1000
    try:
        import torch
        import triton.testing

        ta = torch.ones((4096, 4096), device="cuda")
        triton_ms = triton.testing.do_bench(lambda: ta @ ta, return_mode="median")
        triton = f"triton.do_bench (torch) {triton_ms:.3f} ms"
    except Exception as e:
        triton = f"triton unavailable: {e}"
    row(
        "4096x4096 fp32 matmul: kernel_ms (median of 50)",
        f"{m.kernel_ms:.3f} ms (IQR {m.rounds['kernel_ms'].iqr:.3f})",
        f"cupyx.benchmark {cupyx_ms:.3f} ms ({100 * (m.kernel_ms / cupyx_ms - 1):+.2f}%); {triton}",
    )
    spread = benchmark(kernel, n_repeat=50, n_warmup=5).gpu_times[0] * 1000
    q = statistics.quantiles(spread, n=4)
    row(
        "  spread of the same kernel (IQR)",
        f"gpuprof {m.rounds['kernel_ms'].iqr:.4f} ms",
        f"cupyx {q[2] - q[0]:.4f} ms",
    )


def first_kernel_latency(cp, backend, profiler) -> None:
    """How long after its step starts a kernel starts, right after other work or after idling."""
    stream = backend.stream()
    a = cp.ones((4096, 4096), dtype=cp.float32)
    out = cp.empty_like(a)
    results = {}
    for label, before in (
        ("right after the last", lambda: None),
        ("idle 20 ms, host sleeping", lambda: time.sleep(0.02)),
        ("idle 20 ms, host spinning", lambda: _spin(0.02)),
    ):
        delays = []
        for _ in range(7):
            before()
            with profiler.window("latency") as done:
                with profiler.step("launch"):
                    with stream:
                        cp.matmul(a, a, out=out)
                    stream.synchronize()
            timeline = done[0].timeline
            (step,) = timeline.steps
            first = min(d.start for d in timeline.device if d.kind == "kernel")
            delays.append((first - step.start) / 1000)
        results[label] = statistics.median(delays)
    row(
        "step start to first kernel start (one 4096^2 matmul)",
        ", ".join(f"{k}: {v:.0f} us" for k, v in results.items()),
        "median of 7",
    )


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def repeatability(workload) -> None:
    """The seed pipeline 10 times: one round each, then as the plugin reports it (medians of 5)."""
    steps = ("alloc", "upload", "sync", "trim", "compute")
    for strategy in ("single-lock", "two-lock"):
        for rounds in (1, 5):
            runs = [
                workload.partitions(n=8, strategy=strategy, rounds=rounds, warmup=1 if i == 0 else 0) for i in range(10)
            ]
            utils = [100 * r.utilization for r in runs]
            walls = [r.wall_ms for r in runs]
            row(
                f"seed pipeline {strategy}, 10 runs of {rounds} round(s): utilization",
                f"median {statistics.median(utils):.1f}%, range {max(utils) - min(utils):.2f} pt",
                f"wall median {statistics.median(walls):.0f} ms, range {max(walls) - min(walls):.0f} ms "
                f"({100 * (max(walls) - min(walls)) / statistics.median(walls):.1f}%)",
            )
            if rounds > 1:
                continue
            # where the spread is: each run's wall, kernel time and each step's host and idle time
            for r in runs:
                parts = " ".join(
                    f"{name} {r.steps[name].host_ms:.0f}/{r.steps[name].idle_ms:.0f}"
                    for name in steps
                    if name in r.steps
                )
                print(
                    f"    util {100 * r.utilization:5.1f}% wall {r.wall_ms:7.1f} kernel {r.kernel_ms:6.1f} "
                    f"copy {r.copy_ms:6.1f} unattributed {r.unattributed_ms:5.1f}  host/idle ms: {parts}",
                    flush=True,
                )


def host_main(only: set[str], runs: int, tests: int) -> None:
    """The rows that mean something without a GPU: the plugin's cost, the gate on the host backend."""
    from pytest_gpuprof.capture.backends.host import HostBackend
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.workload import GpuWorkload

    print(f"{'row (CPU machine, host backend)':<58} {'pytest-gpuprof':<34} reference", flush=True)
    if not only or "plugin" in only:
        unused_plugin_cost(runs, tests)
    if only and "gate" not in only:
        return
    backend = HostBackend()
    profiler = Profiler(backend)
    workload = GpuWorkload(profiler, GpuDevice(backend, backend.info()), rounds=1, warmup=0)
    gate_reliability_kernels(profiler, workload)
    gate_reliability(workload)
    workload.close()
    backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="run just those rows (all unless named)")
    parser.add_argument("--host", action="store_true", help="the rows that mean something without a GPU")
    parser.add_argument("--runs", type=int, default=15, help="the plugin row's pairs of runs")
    parser.add_argument("--tests", type=int, default=1000, help="the plugin row's trivial tests")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error(f"--runs={args.runs}: at least 2 (the row gives the spread of the pairs)")
    only = set(args.rows)  # e.g. "gate plugin"
    if args.host:
        host_main(only, args.runs, args.tests)
        return
    import cupy as cp

    from pytest_gpuprof.capture.backends.cuda import CudaBackend
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.workload import GpuWorkload

    def wanted(name: str) -> bool:
        return not only or name in only

    print(f"{'row':<58} {'pytest-gpuprof':<34} reference", flush=True)
    if wanted("cupti"):
        cupti_cost(cp)  # before any capture is registered in this process
    if wanted("plugin"):
        unused_plugin_cost(args.runs, args.tests)
    backend = CudaBackend(0, cupti=True)
    backend.source.begin()
    profiler = Profiler(backend)
    device = GpuDevice(backend, backend.info())
    workload = GpuWorkload(profiler, device, rounds=1, warmup=0)
    backend.prepare()
    if wanted("step"):
        step_cost(cp, backend, profiler)
        first_kernel_latency(cp, backend, profiler)
    if wanted("accuracy"):
        accuracy(cp, profiler, workload)
        anchors(cp, profiler)
    if wanted("repeatability"):
        repeatability(workload)
    if wanted("gate"):
        gate_reliability_kernels(profiler, workload)
        gate_reliability(workload)
    capture = getattr(backend.source, "capture", None)
    if capture is not None:
        print(f"CUPTI buffers read: {capture.deliveries}", flush=True)
    workload.close()
    backend.close()


if __name__ == "__main__":
    main()
