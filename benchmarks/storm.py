"""What CUPTI tracing costs a test that launches many kernels: empty-kernel storms.

Run on a CUDA machine: ``python benchmarks/storm.py [MODE ...] [--profile=FILE]`` (CuPy,
cupti-python). Each way of tracing runs in its own process, since CUPTI's buffer
callbacks belong to the process:

- ``off``: no CUPTI;
- ``attached``: CUPTI loaded and initialised (a timestamp read), no record kind enabled:
  what CUPTI costs a launch by being there;
- ``hwtrace``: only asks CUPTI for kernel timestamps from the GPU's hardware event
  system (``cuptiActivityEnableHWTrace``), which would take kernel tracing off the launch
  path, and prints its answer;
- ``objects``: the capture reading cupti-python's record objects (what it did before);
- ``buffers``: the capture taking CUPTI's buffers directly (``RawBuffers``);
- ``buffers+api``: the same with every runtime API record on too;
- ``buffers+calls``: the capture as the plugin runs it: the buffers, plus the API records
  of the runtime and driver calls that issue device work (launches, copies, memsets), by
  which each launch is tied to the step that issued it.

Each launches 1,000 empty kernels to warm up, then 5 bursts of 20,000, timing each burst
(the per-launch figure of a burst is its time / 20,000), then drains: one flush and the
reading of every record, timed together; the per-record figure is that time / records.
Then ``plugin``: a pytest test whose one step launches 100,000 empty kernels, run whole in
a child pytest with and without ``--gpu-no-cupti``, three times in turns; its window's
wall time, the test's (setup, call and teardown, as ``--durations`` gives them) and the
whole run's time are printed. One line per measurement.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child import env, pytest_command  # benchmarks/

ROOT = Path(__file__).resolve().parents[1]
BURSTS, LAUNCHES = 5, 20_000
PLUGIN_RUNS = 3  # with and without CUPTI in turns


def per_launch_us(launch, bursts: int = BURSTS) -> list[float]:
    """The host time a launch of each burst of ``LAUNCHES`` (us)."""
    spent = []
    for _ in range(bursts):
        start = time.perf_counter_ns()
        launch(LAUNCHES)
        spent.append((time.perf_counter_ns() - start) / LAUNCHES / 1000)
    return spent


def hwtrace(cupti) -> None:
    from pytest_gpuprof.capture.cupti_trace import libcupti

    cupti.get_timestamp()  # CUPTI loaded and initialised
    library = libcupti()
    status, text = library.cuptiActivityEnableHWTrace(ctypes.c_uint8(1)), ctypes.c_char_p()
    library.cuptiGetResultString(status, ctypes.byref(text))
    print(f"hwtrace      cuptiActivityEnableHWTrace(1) returned {status} ({(text.value or b'').decode()})")


def started(cupti, mode: str):
    """The capture of ``mode``, started (None where the mode traces nothing)."""
    if mode == "attached":
        cupti.get_timestamp()
    if mode in ("off", "attached"):
        return None
    from pytest_gpuprof.capture.cupti_trace import CuptiCapture, libcupti

    capture = CuptiCapture(
        cupti, library=libcupti if mode.startswith("buffers") else None, correlate=mode == "buffers+calls"
    )
    if mode.endswith("+api"):
        cupti.activity_enable(cupti.ActivityKind.RUNTIME)
    capture.drain()
    return capture


def drained(cupti, capture, mode: str, launch) -> tuple[float, float, int]:
    """One flush and the reading of every record, timed apart: (flush s, read s, records)."""
    start = time.perf_counter_ns()
    cupti.activity_flush_all(1)  # CUPTI hands over what it holds: the callbacks run now
    flush_s = (time.perf_counter_ns() - start) / 1e9
    start = time.perf_counter_ns()
    intervals, notes = capture.drain()  # reading: every record into a DeviceWork row
    read_s = (time.perf_counter_ns() - start) / 1e9
    print(f"  {mode}: reading {capture.reading}; deliveries {capture.deliveries}; notes {notes}")
    if capture._raw is not None:
        read_in_two(cupti, capture, mode, launch)
    return flush_s, read_s, len(intervals)


def read_in_two(cupti, capture, mode: str, launch) -> None:
    """The read split in two: bytes to numpy tables, tables to rows."""
    import numpy as np

    from pytest_gpuprof.capture.cupti_records import records_of, unpack

    launch(LAUNCHES)
    cupti.activity_flush_all(1)
    filled = capture._raw.take()
    start = time.perf_counter_ns()
    tables = [unpack(np.frombuffer(memoryview(m).cast("B"), np.uint8, count=v), capture._layouts) for m, v in filled]
    unpack_ns = time.perf_counter_ns() - start
    start = time.perf_counter_ns()
    for t in tables:
        assert t is not None
        kernels = records_of(t, capture._names, capture._copy_names, capture._pageable)
    records_ns = time.perf_counter_ns() - start
    count = sum(len(t["kernel"]) for t in tables if t is not None)
    print(
        f"  {mode}: {count} kernel records: unpack {unpack_ns / count / 1000:.3f} us/record, "
        f"into rows {records_ns / count / 1000:.3f} us/record ({len(kernels)} in the last buffer)"
    )


def off_and_on(cupti, capture, mode: str, launch) -> None:
    """Tracing (kernels, or kernels and calls) off and on in turns."""
    kinds = [cupti.ActivityKind.CONCURRENT_KERNEL]
    if mode == "buffers+calls":
        kinds += [cupti.ActivityKind.DRIVER]
    off, on = [], []
    for _ in range(5):
        for kind in kinds:
            cupti.activity_disable(kind)
        off += per_launch_us(launch, 1)
        for kind in kinds:
            cupti.activity_enable(kind)
        on += per_launch_us(launch, 1)
        capture.drain()
    print(
        f"  {mode}: {'+'.join(k.name for k in kinds)} records off/on in turns, per launch: "
        f"on {statistics.median(on):.2f} us, off {statistics.median(off):.2f} us: "
        f"{statistics.median(on) - statistics.median(off):+.2f} us",
        flush=True,
    )


def storm(mode: str) -> None:
    import cupy as cp
    from bench import empty_launches  # benchmarks/, this script's folder
    from cupti import cupti

    launch = empty_launches(cp)
    launch(1000)  # compile and load the kernel before any tracing
    if mode == "hwtrace":
        hwtrace(cupti)
        return
    capture = started(cupti, mode)
    launch(1000)
    bursts = per_launch_us(launch)
    flush_s = read_s = 0.0
    records = 0
    if capture is not None:
        flush_s, read_s, records = drained(cupti, capture, mode, launch)
        capture.drain()  # the same bursts again, right after a drain: warm-up or backlog?
        again = per_launch_us(launch)
        capture.drain()
        print(f"  {mode}: the bursts again after a drain (us): {', '.join(f'{b:.2f}' for b in again)}", flush=True)
    if capture is not None and mode in ("buffers", "buffers+calls"):
        off_and_on(cupti, capture, mode, launch)
    median = statistics.median(bursts)
    per_record = f"{read_s * 1e6 / records:.2f} us/record" if records else "-"
    print(
        f"{mode:<12} per launch by burst (us): {', '.join(f'{b:.2f}' for b in bursts)}; median {median:.2f}; "
        f"slowest/median {max(bursts) / median:.2f}; flush {flush_s:.3f} s, read {read_s:.3f} s "
        f"for {records} kernel records ({per_record})",
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


def plugin(profile_to: str | None) -> None:
    """The storm test in a child pytest, with CUPTI and without; with ``profile_to``, the
    CUPTI run once more under cProfile, its statistics written there."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_storm.py").write_text(PLUGIN_TEST)
        for extra in ((), ("--gpu-no-cupti",)) * PLUGIN_RUNS:
            report = Path(tmp, "r.json")
            start = time.perf_counter()
            run = subprocess.run(
                pytest_command(f"--gpu-report={report}", "--durations=0", "--durations-min=0", *extra, tmp),
                check=True,
                capture_output=True,
                text=True,
                env=env(),
            )
            run_s = time.perf_counter() - start
            phases = {p: float(t) for t, p in re.findall(r"^([\d.]+)s (setup|call|teardown) ", run.stdout, re.M)}
            (test,) = json.loads(report.read_text())["tests"]
            m = test["metrics"]
            label = "plugin " + (extra[0] if extra else "(CUPTI)")
            print(
                f"{label:<26} 100,000 launches in one step: window {m['wall_ms']:.0f} ms, "
                f"kernels {m['kernel_ms']:.0f} ms, truth {m['truth']}; the test {sum(phases.values()):.2f} s "
                f"({', '.join(f'{p} {t:.2f}' for p, t in phases.items())}); whole pytest run {run_s:.2f} s",
                flush=True,
            )
            for note in m.get("notes", []):
                print(f"  note: {note}", flush=True)
        if profile_to:
            stats = Path(tmp, "profile.out")
            command = pytest_command(f"--gpu-report={Path(tmp, 'r.json')}", tmp)
            subprocess.run(
                [sys.executable, "-m", "cProfile", "-o", str(stats), *command[1:]],
                check=True,
                capture_output=True,
                env=env(),
            )
            import pstats

            with open(profile_to, "w") as out:
                profile = pstats.Stats(str(stats), stream=out).sort_stats("cumulative")
                profile.print_stats(40)
                profile.print_stats("pytest_gpuprof|cupti", 80)  # the plugin's own share
                profile.print_callers(r"threading.py.*\(wait\)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modes", nargs="*", metavar="MODE", help="default: off buffers buffers+calls plugin")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the plugin mode into FILE")
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # one mode, in its own process
    args = parser.parse_args()
    if args.mode:
        storm(args.mode)
        return
    modes = args.modes or ["off", "buffers", "buffers+calls", "plugin"]
    for mode in modes:
        if mode != "plugin":
            subprocess.run([sys.executable, __file__, "--mode", mode], check=True, cwd=ROOT)
    if "plugin" in modes:
        plugin(args.profile)


if __name__ == "__main__":
    main()
