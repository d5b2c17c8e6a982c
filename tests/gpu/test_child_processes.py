"""GPU work in the processes a test starts, on a real GPU: a PyTorch script run as a
``subprocess``, a ``spawn`` pool of two workers, a child killed with SIGKILL. Skipped without
PyTorch or without CUPTI (children are traced the way the test itself is)."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = """
import contextlib
import sys
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

profiling = "--profile" in sys.argv  # the reference: torch.profiler's kernel time, untraced
with profile(activities=[ProfilerActivity.CUDA]) if profiling else contextlib.nullcontext() as prof:
    exec(BODY)
if profiling:
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    print(f"PROFILER_MS={sum(e.time_range.elapsed_us() for e in kernels) / 1e3:.3f}")
"""

BODY = """
x = torch.ones(8192, 8192, device="cuda")
y = x @ x  # cuBLAS starts here, its set-up before the kernel: outside the events below
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    y = x @ x
end.record()
torch.cuda.synchronize()
print(f"EVENTS_MS={start.elapsed_time(end):.3f}")
"""


@pytest.fixture
def traced(gpuprof):
    if gpuprof.backend.source.kind.name != "cupti":
        pytest.skip("children are traced with CUPTI, as the test is")
    pytest.importorskip("torch")
    return gpuprof


def test_a_training_script_run_as_a_subprocess_is_measured(traced, tmp_path):
    import os

    from pytest_gpuprof.capture.children import ENV

    script = tmp_path / "train.py"
    script.write_text(f"BODY = {BODY!r}\n{SCRIPT}")
    # the references, untraced (an environment without the plugin's variable): torch.profiler's
    # kernel time inside the script, and the script's wall
    untold = {k: v for k, v in os.environ.items() if k != ENV}
    reference = subprocess.run(
        [sys.executable, str(script), "--profile"], capture_output=True, text=True, check=True, env=untold
    )
    profiler_ms = float(reference.stdout.split("PROFILER_MS=")[1])
    # the quickest of three: a Python process importing PyTorch starts in 2.7-3.3 s (one
    # reference of 3.25 s against a traced 2.79 s failed this test once)
    walls = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, str(script)], capture_output=True, check=True, env=untold)
        walls.append(1e3 * (time.perf_counter() - started))
    untraced_wall_ms = min(walls)
    out: list[str] = []

    def run() -> None:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
        out.append(done.stdout)

    m = traced.measure(run, rounds=1, warmup=0)
    events = float(out[-1].split("EVENTS_MS=")[1])
    own, child = m.processes
    assert own.pid == os.getpid()  # the test's own process first
    print(
        f"\nsubprocess: {m.processes}; events {events:.3f} ms; torch.profiler {profiler_ms:.3f} ms; "
        f"untraced wall {untraced_wall_ms:.1f} ms; window kernel_ms {m.kernel_ms:.3f}, wall {m.wall_ms:.1f} ms, "
        f"utilization {m.utilization:.4f}; notes {m.notes}"
    )
    assert child.command.endswith("train.py") and child.kernel_ms is not None
    # its 20 timed matmuls, the warm-up one like them, and the fill before (tens of microseconds)
    assert child.kernel_ms == pytest.approx(events * 21 / 20, rel=0.02)
    assert child.kernel_ms == pytest.approx(profiler_ms, rel=0.02)
    # the window's kernels are the child's (the test's own process launched none)
    assert m.kernel_ms == pytest.approx(child.kernel_ms, rel=0.01)
    assert m.utilization == pytest.approx(child.kernel_ms / m.wall_ms, rel=0.01)
    # tracing the child costs its start-up (CUPTI loaded, its records written as it exits):
    # 4.4 s untraced against 5.6 s traced in one H200 sitting (docs/performance-log.md)
    assert m.wall_ms < 2 * untraced_wall_ms


def _matmuls(n: int) -> tuple[int, float]:
    """A pool worker's work: one warm-up iteration, then ``n`` timed by its own events."""
    import os

    import torch

    x = torch.ones(4096, 4096, device="cuda")
    x = (x @ x).clamp_(max=1.0)  # cuBLAS starts here
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        x = (x @ x).clamp_(max=1.0)
    end.record()
    torch.cuda.synchronize()
    return os.getpid(), start.elapsed_time(end)


def test_a_spawn_pool_of_two_workers_is_one_window(traced):
    timed: list[tuple[int, float]] = []

    def run() -> None:
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            timed.extend(pool.map(_matmuls, [40, 40]))

    m = traced.measure(run, rounds=1, warmup=0)
    workers = {p.pid: p for p in m.processes[1:] if p.kernel_ms}
    print(f"\nspawn pool: {m.processes}; their events {timed}; window kernel_ms {m.kernel_ms:.3f}")
    assert len(workers) == 2  # both workers' records, written as the pool terminated them
    for pid, events in timed:
        # each worker's 40 timed iterations, the warm-up one like them, and the fill
        assert workers[pid].kernel_ms == pytest.approx(events * 41 / 40, rel=0.02)
    both = [p.kernel_ms for p in workers.values()]
    assert max(both) <= m.kernel_ms <= sum(both) + 1e-6  # their union, the window's


def test_a_child_killed_mid_window_is_said_to_be_lost(traced, tmp_path):
    script = tmp_path / "hang.py"
    hang = BODY.replace('print(f"EVENTS_MS', 'print("READY", flush=True)\nimport time; time.sleep(60)\nprint(f"')
    script.write_text(f"BODY = {hang!r}\n{SCRIPT}")

    def run() -> None:
        child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "READY"
        child.send_signal(signal.SIGKILL)
        child.wait()

    started = time.perf_counter()
    m = traced.measure(run, rounds=1, warmup=0)
    (child,) = m.processes[1:]
    print(f"\nkilled: {child}; notes {m.notes}; {time.perf_counter() - started:.1f} s")
    assert child.kernel_ms is None and "lost" in (child.why or "")
    assert any("of 2 processes traced" in n and f"pid {child.pid}" in n for n in m.notes)


def test_a_native_cuda_program_is_traced_by_the_injection_library(gpuprof, tmp_path):
    """A C program on the driver API (a PTX kernel spinning 5 ms on the GPU's timer, 1 + 20
    launches), built here, traced through ``CUDA_INJECTION64_PATH``."""
    import shutil

    from pytest_gpuprof.capture import injection

    if gpuprof.backend.source.kind.name != "cupti":
        pytest.skip("children are traced with CUPTI, as the test is")
    library, how = injection.library()
    found = injection.cuda_dirs()
    compiler = shutil.which("cc") or shutil.which("gcc")
    if library is None or found is None or compiler is None:
        pytest.skip(f"no injection library here: {how}")
    includes, lib = found
    program = tmp_path / "native-spin"
    stubs = [f"-L{d}" for d in (lib / "stubs", lib.parent / "lib64" / "stubs") if d.is_dir()]
    source = str(Path(__file__).with_name("native_spin.c"))
    subprocess.run(
        [compiler, "-O2", *(f"-I{d}" for d in includes), source, "-o", str(program), *stubs, "-lcuda"], check=True
    )
    out: list[str] = []

    def run() -> None:
        done = subprocess.run([str(program), "20", "5000000"], capture_output=True, text=True, check=True)
        out.append(done.stdout)

    m = gpuprof.measure(run, rounds=1, warmup=0)
    events = float(out[-1].split("EVENTS_MS=")[1])
    _, child = m.processes
    print(f"\nnative: {m.processes}; events {events:.3f} ms; window kernel_ms {m.kernel_ms:.3f}; notes {m.notes}")
    assert child.command.startswith(str(program)) and child.why is None and child.kernel_ms is not None
    assert child.kernel_ms == pytest.approx(events * 21 / 20, rel=0.02)  # the warm-up kernel as well
    assert child.kernel_ms == pytest.approx(21 * 5.0, rel=0.02)  # each spins 5 ms
    assert child.copy_ms is not None and child.copy_ms > 0  # its 64 MiB upload
    assert m.kernel_ms >= child.kernel_ms


RANKS = """
import os
import sys
import torch
import time
rank = int(os.environ["RANK"])
n = 10 * (rank + 1)  # rank 1 times twice rank 0's matmuls
# one rank after the other: two contexts on one GPU take turns, and a rank's events would
# count the other's turns as its own time (its kernels' records do not)
while rank and not os.path.exists(os.path.join(sys.argv[1], "rank0")):
    time.sleep(0.01)
x = torch.ones(4096, 4096, device="cuda")
y = x @ x  # cuBLAS starts here, outside the events below
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(n):
    y = x @ x
end.record()
torch.cuda.synchronize()
with open(os.path.join(sys.argv[1], f"rank{rank}"), "w") as out:
    out.write(f"{n} {start.elapsed_time(end)}")
"""


def test_torchrun_ranks_are_processes_with_their_ranks(traced, tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
        str(tmp_path),
    ]

    def run() -> None:
        subprocess.run(command, check=True, capture_output=True, timeout=240)

    m = traced.measure(run, rounds=1, warmup=0)
    print(f"\ntorchrun: {m.processes}; window kernel_ms {m.kernel_ms:.3f}; notes {m.notes}")
    ranks = {p.rank: p for p in m.processes if p.rank is not None}
    assert sorted(ranks) == [0, 1]
    one_matmul = []  # what one matmul took by each rank's kernel records: least, most
    for rank, figures in ranks.items():
        n, events = (tmp_path / f"rank{rank}").read_text().split()
        # its n timed matmuls and the warm-up one (the fill: microseconds). The warm-up runs
        # on a device just woken, up to twice one timed matmul. The events bound it from
        # above only: they also count the turns of the other rank's context (still ending,
        # 71 ms by events for 55.6 ms of kernels once, H100)
        assert 0 < figures.kernel_ms <= 1.02 * float(events) / int(n) * (int(n) + 2), (rank, n, events, figures)
        one_matmul.append((figures.kernel_ms / (int(n) + 2), figures.kernel_ms / (int(n) + 1)))
    # rank 1 ran twice rank 0's matmuls: its records say the same time for one
    assert max(low for low, _ in one_matmul) <= 1.02 * min(high for _, high in one_matmul), one_matmul
    agent = [p for p in m.processes[1:] if p.rank is None]
    assert [p.kernel_ms for p in agent] == [0.0]  # torchrun's own process: traced, no kernels
    assert m.kernel_ms >= max(p.kernel_ms or 0.0 for p in ranks.values())


# --- a pool's workers, ended the ways pools end them (each worker takes one task: a barrier)

_BARRIER = None


def _hold(barrier) -> None:
    global _BARRIER
    _BARRIER = barrier


def _cupy_matmuls(n: int) -> tuple[int, float]:
    """50 CuPy matmuls in a pool worker (as the issue's test ran them), timed by its own events."""
    import os

    import cupy as cp

    assert _BARRIER is not None
    _BARRIER.wait()  # both workers hold a task: neither runs both
    x = cp.ones((4096, 4096), dtype=cp.float32)
    y = x @ x  # cuBLAS starts here
    cp.cuda.Device().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(n):
        y = x @ x
    end.record()
    end.synchronize()
    del y
    return os.getpid(), cp.cuda.get_elapsed_time(start, end)


def _pool_run(how: str, timed: list[tuple[int, float]]) -> None:
    import concurrent.futures

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    if how == "with Pool()":
        with ctx.Pool(2, initializer=_hold, initargs=(barrier,)) as pool:
            timed.extend(pool.map(_cupy_matmuls, [50, 50], chunksize=1))
    elif how == "close(); join()":
        pool = ctx.Pool(2, initializer=_hold, initargs=(barrier,))
        timed.extend(pool.map(_cupy_matmuls, [50, 50], chunksize=1))
        pool.close()
        pool.join()
    else:
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx, initializer=_hold, initargs=(barrier,)) as ex:
            timed.extend(ex.map(_cupy_matmuls, [50, 50]))


@pytest.mark.parametrize("how", ["with Pool()", "close(); join()", "ProcessPoolExecutor"])
def test_every_pool_worker_is_read_however_the_pool_ends(gpuprof, how):
    if gpuprof.backend.source.kind.name != "cupti":
        pytest.skip("children are traced with CUPTI, as the test is")
    pytest.importorskip("cupy")
    timed: list[tuple[int, float]] = []
    m = gpuprof.measure(lambda: _pool_run(how, timed), rounds=1, warmup=0)
    print(f"\n{how}: {m.processes}; their events {timed}; window kernel_ms {m.kernel_ms:.3f}; notes {m.notes}")
    workers = {p.pid: p for p in m.processes[1:]}
    assert len(workers) == 2, m.processes  # the two workers, not multiprocessing's resource tracker
    for pid, events in timed:
        # each worker's 50 timed matmuls and the warm-up one like them. The two share the GPU
        # by time slices, which its events count and its kernels partly do not: within 5%
        # (2% failed 2 runs in 9 on an H200, 2.1% off each time); a worker missed or read in
        # part is tens of percent off
        assert workers[pid].kernel_ms == pytest.approx(events * 51 / 50, rel=0.05)
    # both read whole: their sum is their events' (the two may differ by a few percent from
    # each other, sharing one GPU: 131.6 and 137.3 ms once, on an H200)
    total = sum(events for _, events in timed) * 51 / 50
    assert sum(p.kernel_ms for p in workers.values()) == pytest.approx(total, rel=0.05)
    assert not any("processes traced" in n for n in m.notes)


def _killed_after_work(barrier) -> None:
    import os

    _hold(barrier)
    _cupy_matmuls(20)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_sigkilled_worker_is_lost_and_the_figure_a_lower_bound(gpuprof):
    if gpuprof.backend.source.kind.name != "cupti":
        pytest.skip("children are traced with CUPTI, as the test is")
    pytest.importorskip("cupy")
    ctx = multiprocessing.get_context("spawn")

    def run() -> None:
        barrier = ctx.Barrier(1)
        worker = ctx.Process(target=_killed_after_work, args=(barrier,))
        worker.start()
        worker.join()
        assert worker.exitcode == -signal.SIGKILL

    m = gpuprof.measure(run, rounds=1, warmup=0)
    print(f"\nSIGKILL: {m.processes}; notes {m.notes}")
    (worker,) = m.processes[1:]
    assert worker.kernel_ms is None and "lost" in (worker.why or "")
    assert any("lower bounds" in n and f"pid {worker.pid}" in n for n in m.notes)
