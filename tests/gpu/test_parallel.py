"""--gpu-exclusive on one GPU: the examples under ``-n 2`` give the serial verdicts and
figures, and each test's wait is reported, outside its windows."""

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("xdist")
pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(pytester, plugin_args, name, *extra):
    result = pytester.runpytest_subprocess(*plugin_args, "--gpu-budget", f"--gpu-report={name}", *extra)
    tests = {t["nodeid"]: t for t in json.loads((pytester.path / name).read_text())["tests"]}
    return result, tests


def test_the_examples_under_xdist_read_as_serial(pytester, plugin_args):
    for path in EXAMPLES.iterdir():
        if path.suffix in (".py", ".toml"):
            shutil.copy(path, pytester.path / path.name)
    serial, alone = run(pytester, plugin_args, "serial.json")
    serial.assert_outcomes(passed=6, xfailed=1)
    parallel, shared = run(pytester, plugin_args, "parallel.json", "-n", "2")
    parallel.assert_outcomes(passed=6, xfailed=1)
    assert set(shared) == set(alone)
    for nodeid in ("test_seed_pipeline.py::test_single_lock_pipeline", "test_seed_pipeline.py::test_two_lock_pipeline"):
        before, now = alone[nodeid]["metrics"]["utilization"], shared[nodeid]["metrics"]["utilization"]
        assert now == pytest.approx(before, abs=0.02), nodeid  # the pipelines held the GPU alone
    assert all("waited_ms" in t for t in shared.values())
    parallel.stdout.fnmatch_lines(["*2 xdist workers shared 1 device(s) [[]0]; each test that used one held it alone*"])


HOLDER = """
import sys, time
import cupy
from pytest_gpuprof.capture import nvml
from pytest_gpuprof.capture.exclusive import DeviceLock

lock = DeviceLock(nvml.uuid(0), __import__("pathlib").Path(sys.argv[1]))
x = cupy.ones((4096, 4096), dtype=cupy.float32)
(x @ x).sum().item()  # the context up, cuBLAS loaded: before the lock, as the plugin starts
if sys.argv[2] == "hold":
    lock.acquire("doomed: kernels in flight")
    print("held", flush=True)
    while True:  # a window's kernels, queued ahead, when the kill comes
        for _ in range(50):
            x = x @ x
        time.sleep(0.001)
else:
    print("waiting", flush=True)
    lock.acquire("survivor")
    got = time.time()
    (x @ x).sum().item()  # and the device works for it
    print(f"acquired {got:.6f}", flush=True)
"""


def test_a_worker_killed_inside_its_window_frees_the_gpu_within_a_second(tmp_path):
    """A process holding the GPU with kernels in flight, killed with SIGKILL: the process
    waiting for the GPU goes on within a second (the kernel drops the flock with its holder;
    the driver tears the dead context down)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("cupy")
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("PYTEST_GPUPROF_HELD", None)  # play two workers of a run, not children of this test
    holder = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), "hold"], stdout=subprocess.PIPE, text=True, env=env
    )
    waiter = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        waiter = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), "wait"], stdout=subprocess.PIPE, text=True, env=env
        )
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "waiting"
        time.sleep(1.0)
        assert waiter.poll() is None  # blocked behind the holder
        killed = time.time()
        os.kill(holder.pid, signal.SIGKILL)
        out, _ = waiter.communicate(timeout=60)
        acquired = float(out.split("acquired ")[1])
        print(f"\nkilled holder: the waiter went on {1e3 * (acquired - killed):.1f} ms after the kill")
        assert waiter.returncode == 0 and acquired - killed < 1.0
    finally:
        holder.kill()
        holder.wait()
        if waiter is not None:
            waiter.kill()
            waiter.wait()
        for p in (holder, waiter):
            if p is not None and p.stdout is not None:
                p.stdout.close()
