"""What CUPTI tracing costs a test that launches many kernels: empty-kernel storms.

Run on a CUDA machine: ``python benchmarks/storm.py`` (CuPy, cupti-python). Each way of
tracing runs in its own process, since CUPTI's buffer callbacks belong to the process:

- ``off``: no CUPTI;
- ``objects``: the capture reading cupti-python's record objects (what it did before);
- ``buffers``: the capture taking CUPTI's buffers directly (``RawBuffers``);
- ``buffers+api``: the same with runtime API records on too (what tying launches to the
  steps that issued them needs).

Each launches 1,000 empty kernels to warm up, then 5 bursts of 20,000, timing each burst
(the per-launch figure of a burst is its time / 20,000), then drains: one flush and the
reading of every record, timed together; the per-record figure is that time / records.
Then ``plugin``: a pytest test whose one step launches 100,000 empty kernels, run whole in
a child pytest with and without ``--gpu-no-cupti``; its window's wall time and the whole
run's time are printed. One line per measurement.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BURSTS, LAUNCHES = 5, 20_000


def storm(mode: str) -> None:
    import cupy as cp

    empty = cp.RawKernel(r'extern "C" __global__ void empty() {}', "empty")
    stream = cp.cuda.Stream(non_blocking=True)

    def launch(n: int) -> None:
        with stream:
            for _ in range(n):
                empty((1,), (1,), ())
        stream.synchronize()

    launch(1000)  # compile and load the kernel before any tracing
    capture = None
    if mode != "off":
        from cupti import cupti

        from pytest_gpuprof.cupti_capture import CuptiCapture, libcupti

        capture = CuptiCapture(cupti, library=libcupti if mode.startswith("buffers") else None)
        if mode.endswith("+api"):
            cupti.activity_enable(cupti.ActivityKind.RUNTIME)
        capture.drain()
    launch(1000)
    bursts = []
    for _ in range(BURSTS):
        start = time.perf_counter_ns()
        launch(LAUNCHES)
        bursts.append((time.perf_counter_ns() - start) / LAUNCHES / 1000)
    drain_s, records = 0.0, 0
    if capture is not None:
        start = time.perf_counter_ns()
        intervals, notes = capture.drain()
        drain_s = (time.perf_counter_ns() - start) / 1e9
        records = len(intervals)
        print(f"  {mode}: reading {capture.reading}; deliveries {capture.deliveries}; notes {notes}")
    median = statistics.median(bursts)
    per_record = f"{drain_s * 1e6 / records:.2f} us/record" if records else "-"
    print(
        f"{mode:<12} per launch by burst (us): {', '.join(f'{b:.2f}' for b in bursts)}; median {median:.2f}; "
        f"slowest/median {max(bursts) / median:.2f}; drain {drain_s:.3f} s for {records} kernel records ({per_record})",
        flush=True,
    )


PLUGIN_TEST = """
import cupy as cp

def test_storm(gpuprof):
    empty = cp.RawKernel(r'extern "C" __global__ void empty() {}', "empty")
    empty((1,), (1,), ())
    cp.cuda.Device().synchronize()
    with gpuprof.step("launch"):
        for _ in range(100_000):
            empty((1,), (1,), ())
        cp.cuda.Device().synchronize()
"""


def plugin() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_storm.py").write_text(PLUGIN_TEST)
        for extra in ((), ("--gpu-no-cupti",)):
            report = Path(tmp, "r.json")
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--gpu-report={report}", *extra, tmp],
                check=True,
                capture_output=True,
            )
            run_s = time.perf_counter() - start
            (test,) = json.loads(report.read_text())["tests"]
            m = test["metrics"]
            label = "plugin " + (extra[0] if extra else "(CUPTI)")
            print(
                f"{label:<26} 100,000 launches in one step: window {m['wall_ms']:.0f} ms, "
                f"kernels {m['kernel_ms']:.0f} ms, truth {m['truth']}; whole pytest run {run_s:.2f} s",
                flush=True,
            )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--mode":
        storm(sys.argv[2])
        return
    for mode in ("off", "objects", "buffers", "buffers+api"):
        subprocess.run([sys.executable, __file__, "--mode", mode], check=True, cwd=ROOT)
    plugin()


if __name__ == "__main__":
    main()
