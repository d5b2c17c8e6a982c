"""On a real GPU: the plugin's truth against independent references. Skipped without one."""

import gc
import itertools
import json
import time

import pytest

pytestmark = pytest.mark.gpu

GIB = 1 << 30
MIB = 1 << 20


def test_backend_is_cuda_with_cupti_and_nvml(gpuprof, gpu_device):
    assert gpuprof.backend.name == "cuda"
    assert gpuprof.backend.source.kind.name == "cupti", gpuprof.backend.source.status()
    assert gpu_device.memory_bytes > 0 and gpu_device.name
    print(f"\n{gpu_device!r}: h2d {gpu_device.h2d_gbps:.1f} GB/s, d2h {gpu_device.d2h_gbps:.1f} GB/s")
    assert gpu_device.h2d_gbps > 1 and gpu_device.d2h_gbps > 1


@pytest.mark.parametrize(("on_ms", "off_ms"), [(60, 40), (80, 20), (20, 80)])
def test_known_duty_cycle_against_the_event_pair(gpuprof, gpu_workload, on_ms, off_ms):
    """The kernel time of each round against an event pair that brackets the same kernels.

    An event recorded on an idle stream completes at once, and the first kernel reaches
    the device only after the host has launched it (0.6-0.8 ms here): a pair around the
    whole launch counts that wait as busy. So the pair starts after the first kernel, whose
    own time is its calibration, and ends with the last: the reference is
    ``(elapsed(first, after) + first kernel) / wall``, measured by CUDA events, not CUPTI.
    """
    # matmul: one cuBLAS kernel a launch, so the stream has no gaps inside the "on" part
    import cupy

    stream = gpuprof.backend.stream()
    first, _ = gpuprof.backend.kernel_sizes("matmul")
    references, lags = [], []

    def duty_cycle():
        start = time.perf_counter_ns()
        before, launched, after = cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.Event()
        with gpuprof.step("compute"):
            before.record(stream)
            with stream:
                first.launch()
            launched.record(stream)
            gpuprof.backend.compute(on_ms - first.ms, kind="matmul", stream=stream)
            after.record(stream)
            stream.synchronize()
        time.sleep(off_ms / 1000)
        wall = time.perf_counter_ns() - start
        busy_ms = cupy.cuda.get_elapsed_time(launched, after) + first.ms
        references.append(busy_ms * 1e6 / wall)
        lags.append(cupy.cuda.get_elapsed_time(before, launched) - first.ms)

    m = gpuprof.measure(duty_cycle, rounds=5, warmup=1)
    # the same five rounds as the measurement: the warm-up call's pair is not one of them
    pairs = list(zip(m.rounds["utilization"].samples, references[1:], strict=True))
    timeline = gpuprof.windows[-1].timeline
    kernels = sorted((d for d in timeline.device if d.kind == "kernel"), key=lambda d: d.start)
    gaps = [(b.start - a.end) / 1e3 for a, b in itertools.pairwise(kernels)]
    print(
        f"\nduty {on_ms}/{off_ms}: utilization by round {', '.join(f'{u:.4f}' for u, _ in pairs)}; "
        f"event pair {', '.join(f'{r:.4f}' for _, r in pairs)}; wait for the first kernel "
        f"{', '.join(f'{lag:.2f}' for lag in lags[1:])} ms; wall {m.wall_ms:.2f} ms, kernels {m.kernel_ms:.2f} ms "
        f"in {len(kernels)}, largest gap between kernels {max(gaps, default=0):.1f} us"
    )
    for measured, reference in pairs:  # the measurement, round by round, within a point
        assert measured == pytest.approx(reference, abs=0.01)
    # The nominal fraction ignores the host loop's own cost (launch, sleep overshoot),
    # which is real kernel-idle time: see docs/performance-log.md.
    assert m.utilization == pytest.approx(on_ms / (on_ms + off_ms), abs=0.03)


def largest_gaps_between_steps(timeline, count=4):
    """Where no step runs in a window: the stretches behind 'unattributed'."""
    from pytest_gpuprof.analysis import intervals as iv

    steps = iv.union((s.start, s.end) for s in timeline.steps)
    gaps = iv.gaps(steps, (timeline.start, timeline.end))
    return sorted(((e - s) / 1e6, (s - timeline.start) / 1e6) for s, e in gaps)[-count:]


def test_seed_pipeline_reproduces_the_table(gpu_workload):
    single = gpu_workload.partitions(n=8, strategy="single-lock", rounds=3, warmup=1)
    print(
        "\nsingle-lock gaps between steps (ms, at ms):",
        largest_gaps_between_steps(gpu_workload.profiler.windows[-1].timeline),
    )
    two = gpu_workload.partitions(n=8, strategy="two-lock", rounds=3, warmup=1)
    for name, m in (("single-lock", single), ("two-lock", two)):
        nvml = m.nvml.util_mean if m.nvml else None
        print(
            f"\n{name}: wall {m.wall_ms:.1f} ms, utilization {m.utilization:.3f}, reported {m.reported_utilization:.3f}, "
            f"nvml {nvml}, idle {m.idle_by_step()}"
        )
    assert 0.40 <= single.utilization <= 0.56
    assert single.reported_utilization >= 0.95
    assert single.nvml is not None and single.nvml.util_mean >= single.utilization + 0.25
    assert two.utilization >= 0.80
    assert single.steps["upload"].idle_ms > 0.5 * single.overhead_ms
    assert two.wall_ms < 0.75 * single.wall_ms
    assert not single.steps["upload"].pageable
    assert single.steps["upload"].gbps > 30


def test_pageable_upload_breaches_a_forbid_budget(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.upload(GIB, pinned=False), rounds=2, warmup=1)
    with pytest.raises(AssertionError, match=r"upload used pageable host memory \(pageable = \"forbid\"\)"):
        gpuprof.check(steps={"upload": {"pageable": "forbid"}})


def test_pinned_and_pageable_bandwidths(gpuprof, gpu_workload):
    pinned = gpuprof.measure(lambda: gpu_workload.upload(GIB, pinned=True), rounds=3, warmup=1)
    pageable = gpuprof.measure(lambda: gpu_workload.upload(GIB, pinned=False), rounds=3, warmup=1)
    print(f"\npinned {pinned.steps['upload'].gbps:.1f} GB/s, pageable {pageable.steps['upload'].gbps:.1f} GB/s")
    assert not pinned.steps["upload"].pageable and pageable.steps["upload"].pageable
    assert pinned.steps["upload"].gbps > 2 * pageable.steps["upload"].gbps


def test_library_kernels_are_seen_and_charged_to_their_step(gpuprof, gpu_workload):
    with gpuprof.step("work"):
        gpu_workload.compute(ms=5, kind="matmul")
        gpu_workload.compute(ms=5, kind="fft")
    m = gpuprof.metrics
    assert m.kernels >= 2
    assert m.kernel_ms == pytest.approx(10, rel=0.3)
    window = gpuprof.whole_test()
    names = {d.name for d in window.timeline.device if d.kind == "kernel"} if window.timeline else set()
    assert any("gemm" in n.lower() for n in names), names
    assert any("fft" in n.lower() or "regular" in n.lower() for n in names), names
    computes = [s for s in window.timeline.steps if s.name == "compute"]
    for d in window.timeline.device:
        assert any(s.start <= d.start and d.end <= s.end for s in computes), d


def test_activity_buffers_are_read_from_their_bytes(gpuprof, gpu_workload):
    import cupy as cp

    capture = gpuprof.backend.source.capture
    before = dict(capture.deliveries)
    with gpuprof.step("work"):
        gpu_workload.upload(64 * MIB, pinned=True)
        gpu_workload.upload(64 * MIB, pinned=False)
        with gpu_workload.backend.default_stream:
            zeros = cp.zeros(16 * MIB, dtype=cp.uint8)  # a memset
        gpu_workload.compute(ms=2, kind="matmul")
    window = gpuprof.whole_test()
    assert window.timeline is not None
    device = window.timeline.device
    copies = [d for d in device if d.kind == "memcpy"]
    assert {d.name for d in copies} == {"HTOD"}
    assert sum(d.bytes for d in copies if d.pageable) == sum(d.bytes for d in copies if not d.pageable) == 64 * MIB
    assert 16 * MIB in [d.bytes for d in device if d.kind == "memset"]
    assert any("gemm" in d.name.lower() for d in device if d.kind == "kernel")
    assert all(d.start < d.end for d in device)
    assert capture.reading.startswith("records read from CUPTI's buffers; launches tied to the steps")
    assert capture.deliveries["buffers"] > before["buffers"]
    assert capture.deliveries["objects"] == before["objects"] and capture.deliveries["unreadable"] == 0
    del zeros


def test_events_fallback_reports_events_truth(gpu_device):
    from pytest_gpuprof.capture.backends.cuda import CudaBackend
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.workload import GpuWorkload

    backend = CudaBackend(gpu_device.info.index, cupti=False)
    try:
        profiler = Profiler(backend, rounds=3, warmup=1)
        workload = GpuWorkload(profiler, gpu_device, rounds=3, warmup=1)
        m = workload.partitions(n=8, strategy="single-lock")
        workload.close()
    finally:
        backend.close()
    print(f"\nevents truth: utilization {m.utilization:.3f}, notes {m.notes}")
    assert m.truth == "events"
    assert backend.source.status() == "off (--gpu-no-cupti)"
    assert 0.35 <= m.utilization <= 0.60
    assert any("events" in note for note in m.notes)


def test_memory_is_released_after_an_error_in_a_step(gpuprof, gpu_workload):
    backend = gpuprof.backend
    gc.collect()  # what earlier tests left to the collector is not this test's
    before = backend.memory_in_use()

    def failing():
        with gpuprof.step("prepare"):
            buffer = gpu_workload.alloc(GIB)
            assert buffer.nbytes == GIB
            raise RuntimeError("bad partition")

    with pytest.raises(RuntimeError, match="bad partition"):
        failing()
    gc.collect()
    assert backend.memory_in_use() == before


def test_session_header_and_no_cupti_option(pytester, plugin_args):
    pytester.makepyfile(
        """
        def test_pipeline(gpu_workload):
            gpu_workload.partitions(n=4, upload_bytes=1 << 28, rounds=1, warmup=1)
        """
    )
    result = pytester.runpytest_subprocess(*plugin_args, "--gpu-no-cupti", "--gpu-report=r.json")
    result.stdout.fnmatch_lines(
        [
            "gpuprof: backend cuda (CUDA device 0 is visible)",
            "gpuprof: device 0 *, * GiB, driver *, PCIe *",
            "gpuprof: truth events; CUPTI off (--gpu-no-cupti); NVML live; GPM live (windows of 100 ms or more*",
        ]
    )
    result.assert_outcomes(passed=1)
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert test["metrics"]["truth"] == "events"
    # nothing configured: the test starts the backend, and the summary names it
    result = pytester.runpytest_subprocess(*plugin_args)
    result.stdout.fnmatch_lines(
        [
            "gpuprof: not started *",
            "*gpuprof: true GPU utilization*",
            "gpuprof: truth cupti; CUPTI live (records read from CUPTI*s buffers; launches tied to the steps that issued "
            "them (driver calls recorded: launches, copies, memsets, kernel names; * others off)); NVTX ranges as steps "
            "(*); NVML live; GPM live (windows of 100 ms or more*",
        ]
    )
    result.assert_outcomes(passed=1)


BUSY = """
import time
import cupy as cp
a = cp.random.rand(4096, 4096, dtype=cp.float32)
cp.cuda.Device().synchronize()
print("busy", flush=True)
end = time.time() + 8
while time.time() < end:
    a @ a
    cp.cuda.Device().synchronize()
"""


def test_another_process_on_the_device_is_said_and_none_is_not(gpuprof):
    import subprocess
    import sys

    def idle():
        with gpuprof.step("wait"):
            time.sleep(0.5)

    busy = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "busy"
        time.sleep(1.0)
        shared = gpuprof.measure(idle, rounds=1, warmup=0)
    finally:
        busy.kill()
        busy.wait()
    time.sleep(1.0)
    alone = gpuprof.measure(idle, rounds=1, warmup=0)
    noted = [n for n in shared.notes if n.startswith("another process used this device")]
    print(f"\nshared: {noted}; NVML {shared.nvml.util_mean if shared.nvml else None}")
    assert noted and f"pid {busy.pid} " in noted[0]
    assert not any(n.startswith("another process") for n in alone.notes), alone.notes
