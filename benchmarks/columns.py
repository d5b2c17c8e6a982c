"""What a window of 100,000 kernels costs after it ends: reading CUPTI's records into
``DeviceWork`` rows, and computing the window's metrics from the rows.

``python benchmarks/columns.py [read] [compute] [--kernels N]``, best of 5 each (N:
100,000 unless given):

- ``read`` (needs cupti-python, no GPU): 100,000 launches as CUPTI lays them out in a
  buffer, each a driver API record followed by its kernel record (cupti-python's record
  dtypes), through ``unpack``, then ``calls_of`` and ``records_of``; per kernel record
  with its call record.
- ``compute`` (CPU only): ``metrics.compute`` of a window of 100,000 one-block kernels,
  2 us long every 6 us, issued by one step, on an H200's 132 SMs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval, Span
from pytest_gpuprof.analysis.occupancy import SmLimits
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.capture.cupti_records import calls_of, records_of, unpack

N = 100_000
EVERY_NS = 6_000


def best(fn: Callable[[], object], times: int = 5) -> float:
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - start)
    return min(spent)


def read(n: int) -> None:
    from cupti import cupti

    api, kernel = cupti.activity_api_dtype, cupti.activity_kernel10_dtype
    launches = np.zeros(n, dtype=[("api", api), ("kernel", kernel)])
    starts = np.arange(n, dtype=np.uint64) * EVERY_NS
    launches["api"]["kind"] = int(cupti.ActivityKind.DRIVER)
    launches["api"]["correlation_id"] = np.arange(n)
    launches["api"]["thread_id"] = 7
    launches["api"]["start"], launches["api"]["end"] = starts, starts + 3_000
    launches["kernel"]["kind"] = int(cupti.ActivityKind.CONCURRENT_KERNEL)
    launches["kernel"]["correlation_id"] = np.arange(n)
    launches["kernel"]["name"] = 0x1000
    launches["kernel"]["start"], launches["kernel"]["end"] = starts + 4_000, starts + 6_000
    raw = launches.view(np.uint8).reshape(-1)
    layouts = {
        int(cupti.ActivityKind.DRIVER): ("api", api),
        int(cupti.ActivityKind.CONCURRENT_KERNEL): ("kernel", kernel),
    }
    tables = unpack(raw, layouts)
    assert tables is not None and len(tables["kernel"]) == n
    unpack_s = best(lambda: unpack(raw, layouts))
    rows_s = best(lambda: records_of(tables, {0x1000: "empty"}, {}, 0, 0, calls_of(tables["api"])))
    print(
        f"read {n:,} kernel records with their call records: unpack {unpack_s / n * 1e6:.3f} us, "
        f"rows {rows_s / n * 1e6:.3f} us, together {(unpack_s + rows_s) / n * 1e6:.3f} us a kernel record",
        flush=True,
    )


def compute(n: int) -> None:
    start = 1_000_000
    steps = (Span("launch", 7, start, start + n * EVERY_NS, 0, 1),)
    kernels = [
        DeviceInterval("kernel", t + 100, t + 2_100, 7, "empty", thread=7, issued=t, blocks=1, threads=1, registers=16)
        for t in range(start, start + n * EVERY_NS, EVERY_NS)
    ]
    timeline = Timeline(
        start - 10, start + n * EVERY_NS + 5_000, "cupti", steps, (), DeviceWork.of(kernels), sm=SmLimits(132)
    )
    first = best(lambda: metrics.compute(timeline), times=1)
    print(
        f"metrics.compute of {n:,} kernels: best of 5 {best(lambda: metrics.compute(timeline)):.3f} s "
        f"(the first call {first:.3f} s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", help="read, compute: both unless named")
    parser.add_argument("--kernels", type=int, default=N)
    args = parser.parse_args()
    if unknown := set(args.parts) - {"read", "compute"}:
        parser.error(f"no part {', '.join(sorted(unknown))}: read or compute")
    if not args.parts or "read" in args.parts:
        read(args.kernels)
    if not args.parts or "compute" in args.parts:
        compute(args.kernels)


if __name__ == "__main__":
    main()
