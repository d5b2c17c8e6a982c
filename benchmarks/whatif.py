"""What the what-if scenarios cost: a 1,000-window run with and without them.

Run on a CUDA machine (or ``--host``): ``python benchmarks/whatif.py [--windows N]``. One
process measures 1,000 (N) one-round windows of a 16 MiB asynchronous upload and 1 ms of kernels
(each window holds an ``overlap:upload`` prediction), twice with the scenarios and twice
without (``whatif.defaults`` returning none), in turns; prints the run times and the
difference. Then the time of one ``metrics.compute`` of a seed-pipeline window, with and
without the scenarios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_gpuprof.analysis import metrics, whatif
from pytest_gpuprof.capture import backends
from pytest_gpuprof.capture.device import GpuDevice
from pytest_gpuprof.measure.profiler import Profiler
from pytest_gpuprof.measure.workload import GpuWorkload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", action="store_true", help="on the host backend")
    parser.add_argument("--windows", type=int, default=1000)
    args = parser.parse_args()
    host, windows = args.host, args.windows
    backend = backends.create("host" if host else "cuda", 0, cupti=True)
    real_defaults = whatif.defaults
    try:
        profiler = Profiler(backend, rounds=1, warmup=0)
        workload = GpuWorkload(profiler, GpuDevice(backend, backend.info()), rounds=1, warmup=0)
        backend.prepare()

        def window() -> None:
            workload.upload(16 << 20, non_blocking=True)
            workload.compute(ms=1.0, kind="matmul")

        profiler.measure(window, rounds=20, warmup=5)
        runs: dict[bool, list[float]] = {True: [], False: []}
        for scenarios in (True, False, True, False):
            whatif.defaults = real_defaults if scenarios else (lambda window, charged: [])
            start = time.perf_counter()
            m = profiler.measure(window, rounds=windows, warmup=0)
            runs[scenarios].append(time.perf_counter() - start)
            print(
                f"{windows} windows, scenarios {'on ' if scenarios else 'off'}: {runs[scenarios][-1]:.3f} s; "
                f"what_if {dict(m.what_if)}",
                flush=True,
            )
        on, off = statistics.median(runs[True]), statistics.median(runs[False])
        print(f"median on {on:.3f} s, off {off:.3f} s: {100 * (on / off - 1):+.2f}%", flush=True)
        whatif.defaults = real_defaults
        seed = workload.partitions(n=8, strategy="single-lock", rounds=1, warmup=1)
        timeline = profiler.windows[-1].timeline
        assert timeline is not None
        for scenarios in (True, False):
            whatif.defaults = real_defaults if scenarios else (lambda window, charged: [])
            best = min(_timed(lambda: metrics.compute(timeline)) for _ in range(20))
            print(
                f"metrics.compute of a seed window ({len(timeline.device)} device intervals), scenarios "
                f"{'on ' if scenarios else 'off'}: {best * 1e3:.3f} ms",
                flush=True,
            )
        print(f"seed single lock {seed.utilization:.3f}, predicted {seed.what_if}")
        workload.close()
    finally:
        whatif.defaults = real_defaults
        backend.close()


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
