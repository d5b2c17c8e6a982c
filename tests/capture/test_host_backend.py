"""The host backend keeps a GPU's ordering rules; these tests check order, never speed."""

import itertools
import threading

import pytest

from pytest_gpuprof.capture.backends.host import HostBackend
from pytest_gpuprof.capture.device import GpuDevice
from pytest_gpuprof.measure.profiler import Profiler
from pytest_gpuprof.measure.workload import GpuWorkload
from pytest_gpuprof.verdict.budget import Budget

MIB = 1 << 20


@pytest.fixture
def backend():
    # the threads this backend starts (the plugin's own backend of this worker may be running:
    # a test marked gpu that this machine skips started it)
    before = set(threading.enumerate())
    b = HostBackend()
    yield b
    b.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("gpuprof-") and t not in before]


def test_stream_wait_orders_work_across_streams(backend):
    copy_stream, compute_stream = backend.stream(), backend.stream()
    backend.source.begin()
    buffer = backend.upload(8 * MIB, stream=copy_stream)
    uploaded = backend.record(copy_stream)
    backend.wait(compute_stream, uploaded)
    backend.compute(1.0, stream=compute_stream)
    backend.synchronize()
    intervals, _ = backend.source.drain()
    (copy,) = [i for i in intervals if i.kind == "memcpy"]
    (kernel,) = [i for i in intervals if i.kind == "kernel"]
    assert kernel.start >= copy.end
    assert copy.bytes == 8 * MIB and not copy.pageable
    assert kernel.stream == compute_stream.index and copy.stream == copy_stream.index
    assert buffer.array[:3].tolist() == [7, 7, 7]  # the data really moved


def test_work_on_one_stream_runs_in_order(backend):
    backend.source.begin()
    for kind in ("fft", "matmul", "fft"):
        backend.compute(0.5, kind=kind)
    backend.upload(MIB)
    backend.synchronize()
    intervals, _ = backend.source.drain()
    assert [i.kind for i in intervals] == ["kernel", "kernel", "kernel", "memcpy"]
    assert all(a.end <= b.start for a, b in itertools.pairwise(intervals))


def test_pageable_upload_blocks_the_host_for_the_copy(backend):
    backend.source.begin()
    backend.upload(4 * MIB, pinned=False)
    intervals, _ = backend.source.drain()  # no synchronize: the copy is already done
    (copy,) = intervals
    assert copy.pageable


def test_pool_reuses_blocks_until_trimmed(backend):
    first = backend.alloc(MIB)
    array = first.array
    assert backend.memory_in_use() == MIB
    del first
    assert backend.memory_in_use() == 0
    again = backend.alloc(MIB)
    assert again.array is array
    del again
    backend.trim()
    assert backend.alloc(MIB).array is not array


def test_errors_on_a_stream_surface_at_synchronize(backend):
    with pytest.raises(ValueError, match="kind must be one of fft, matmul"):
        backend.compute(1, kind="conv")
    backend.default_stream.submit(lambda: 1 / 0)
    with pytest.raises(RuntimeError, match="host device work failed: ZeroDivisionError"):
        backend.synchronize()
    backend.synchronize()  # reported once, then the stream goes on


def test_steps_nest_per_thread_and_close_on_error(backend):
    profiler = Profiler(backend, budget=Budget())
    together = threading.Barrier(3)  # all alive at once, so their thread ids differ

    def worker():
        with profiler.step("outer"), profiler.step("inner"):
            together.wait()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with pytest.raises(KeyError), profiler.step("failing"):
        raise KeyError("x")
    spans = profiler.spans.steps
    assert len({s.thread for s in spans if s.name == "outer"}) == 3
    assert {s.depth for s in spans if s.name == "inner"} == {1}
    assert [s.name for s in spans if s.depth == 0].count("failing") == 1
    with profiler.step("after"):  # the failed step did not leave its depth behind
        pass
    assert spans[-1].depth == 0


def test_partitions_use_every_primitive_and_release_memory(backend):
    profiler = Profiler(backend, budget=Budget(), rounds=2, warmup=1)
    workload = GpuWorkload(profiler, GpuDevice(backend, backend.info()), rounds=2, warmup=1)
    for strategy in ("single-lock", "two-lock"):
        m = workload.partitions(n=4, upload_bytes=2 * MIB, compute_ms=1, strategy=strategy)
        assert m.steps["upload"].count == 4 and m.steps["compute"].count == 4
        assert m.steps["upload"].bytes == 8 * MIB
        assert m.kernels == 4
        assert len(m.rounds["utilization"].samples) == 2
        assert m.reported_utilization is not None
    assert "sync" in profiler.windows[0].metrics.steps and "sync" not in profiler.windows[1].metrics.steps
    workload.close()
    assert backend.memory_in_use() == 0


def test_workload_inside_measure_is_part_of_that_window(backend):
    profiler = Profiler(backend, budget=Budget())
    workload = GpuWorkload(profiler, GpuDevice(backend, backend.info()), rounds=3, warmup=0)

    def body():
        workload.partitions(n=2, upload_bytes=MIB, compute_ms=1)
        workload.compute(ms=1)

    m = profiler.measure(body, rounds=2, warmup=0)
    assert len(profiler.windows) == 1
    assert m.steps["compute"].count == 3 and m.kernels == 3
    workload.close()


def test_garbage_collector_is_paused_inside_windows_only(backend):
    import gc

    profiler = Profiler(backend, budget=Budget())
    seen = []
    assert gc.isenabled()
    with profiler.window("outer"):
        seen.append(gc.isenabled())
        profiler.measure(lambda: seen.append(gc.isenabled()), rounds=2, warmup=0)
        seen.append(gc.isenabled())  # a nested window does not switch it back on
    assert seen == [False, False, False, False] and gc.isenabled()
    with pytest.raises(RuntimeError), profiler.window("failing"):
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()  # a test that switched it off itself keeps it off
    try:
        with profiler.window("w"):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_step_nested_in_itself_counts_once(backend):
    profiler = Profiler(backend)
    with profiler.step("prepare"):
        with profiler.step("prepare"):
            backend.compute(1.0)
            backend.synchronize()
    with profiler.step("prepare"):
        pass
    step = profiler.metrics.steps["prepare"]
    assert step.count == 2
    assert step.host_ms <= profiler.metrics.wall_ms


def test_a_step_closed_on_another_thread_is_an_error_naming_it(backend):
    profiler = Profiler(backend)
    scope = profiler.step("upload")
    scope.__enter__()
    errors = []

    def close_elsewhere():
        try:
            scope.__exit__(None, None, None)
        except RuntimeError as e:
            errors.append(str(e))

    thread = threading.Thread(target=close_elsewhere)
    thread.start()
    thread.join()
    (message,) = errors
    assert message.startswith("gpuprof step 'upload' was opened on thread")
    assert "a step opens and closes on one thread" in message
    with profiler.step("next"):  # this thread's stack is clean again
        pass
    assert set(profiler.metrics.steps) == {"next"}


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda w: w.upload("10"), TypeError, "upload(nbytes='10'): a byte count must be an int, not str"),
        (lambda w: w.alloc(0), ValueError, "alloc(nbytes=0): a byte count must be at least 1"),
        (lambda w: w.compute(ms=-5), ValueError, "compute(ms=-5): milliseconds must be finite and not negative"),
        (lambda w: w.compute(ms=float("nan")), ValueError, "compute(ms=nan): milliseconds must be finite"),
        (lambda w: w.partitions(upload_bytes=1.5), TypeError, "partitions(nbytes=1.5): a byte count must be an int"),
    ],
)
def test_workload_arguments_are_checked(backend, call, error, message):
    workload = GpuWorkload(Profiler(backend), GpuDevice(backend, backend.info()), rounds=1, warmup=0)
    with pytest.raises(error) as info:
        call(workload)
    assert str(info.value).startswith(message)


def test_an_asynchronous_upload_returns_at_once_and_its_idle_is_charged_to_it():
    from pytest_gpuprof.capture.clock import VirtualClock

    backend = HostBackend(VirtualClock())
    try:
        profiler = Profiler(backend, budget=Budget())
        workload = GpuWorkload(profiler, GpuDevice(backend, backend.info()), rounds=1, warmup=0)
        figures = {}
        for non_blocking in (False, True):

            def loop(non_blocking=non_blocking):
                for _ in range(4):
                    start = backend.clock.now()
                    batch = workload.upload(24 * MIB, non_blocking=non_blocking)
                    enqueued = backend.clock.now() - start
                    with profiler.step("train"):  # kernels after the copy, on the same stream
                        backend.compute(1.0)
                        backend.synchronize(backend.default_stream)
                    del batch
                    figures.setdefault(non_blocking, []).append(enqueued)

            m = profiler.measure(loop, rounds=1, warmup=0)
            upload = m.steps["upload"]
            assert upload.bytes == 4 * 24 * MIB
            # the copies' own time, at the virtual clock's pinned 24 GB/s
            assert upload.gbps == pytest.approx(24.0, rel=0.01)
            # the kernels waited on the copies: that idle is upload's, not unattributed
            assert upload.idle_ms == pytest.approx(m.overhead_ms, rel=0.01)
            assert m.unattributed_ms == pytest.approx(0, abs=0.01)
        assert max(figures[True]) == 0  # enqueued: the host did not wait for the copy
        assert min(figures[False]) == pytest.approx(24 * MIB / 24.0, rel=0.01)  # waited for it
        workload.close()
    finally:
        backend.close()


def test_the_single_locks_overlap_prediction_meets_the_two_lock_run():
    from pytest_gpuprof.capture.clock import VirtualClock

    backend = HostBackend(VirtualClock())
    try:
        profiler = Profiler(backend, budget=Budget())
        workload = GpuWorkload(profiler, GpuDevice(backend, backend.info()), rounds=1, warmup=0)
        single = workload.partitions(n=8, upload_bytes=16 * MIB, strategy="single-lock")
        two = workload.partitions(n=8, upload_bytes=16 * MIB, strategy="two-lock")
        predicted = single.what_if["overlap:upload"]
        assert single.utilization < 0.7 < two.utilization
        assert predicted.utilization == pytest.approx(two.utilization, abs=0.10)
        assert predicted.wall_ms == pytest.approx(two.wall_ms, rel=0.10)
        workload.close()
    finally:
        backend.close()


@pytest.mark.parametrize("warmup", [0, 2])
def test_measure_reads_the_device_records_once_after_its_last_round(backend, monkeypatch, warmup):
    """A forced CUPTI flush slows the launches after it: none between two rounds, nor
    between the warm-up and the first round."""
    profiler = Profiler(backend, budget=Budget())
    drained = []
    drain = backend.source.drain
    monkeypatch.setattr(backend.source, "drain", lambda: drained.append(backend.clock.now()) or drain())
    edges = []

    def body():
        edges.append(backend.clock.now())
        with profiler.step("compute"):
            backend.compute(1.0)

    m = profiler.measure(body, rounds=4, warmup=warmup)
    assert len(edges) == warmup + 4 and len(m.rounds["wall_ms"].samples) == 4
    assert m.steps["compute"].count == 1 and m.kernel_ms > 0
    between = [t for t in drained if edges[0] < t < edges[-1]]
    assert between == []
    # each round is its own window, with its own step
    assert [len(w.timeline.steps) for w in profiler.windows[-1:]] == [1]


def test_the_virtual_clocks_calibration_is_what_six_copies_would_measure():
    from pytest_gpuprof.capture.clock import VirtualClock

    backend = HostBackend(VirtualClock())
    try:
        device = GpuDevice(backend, backend.info())
        modeled = (device.h2d_gbps, device.d2h_gbps)

        class Measured:  # the same backend, without the model's shortcut: six timed copies
            def __getattr__(self, name):
                if name == "modeled_copy_ns":
                    raise AttributeError(name)
                return getattr(backend, name)

        measuring = GpuDevice(Measured(), backend.info())
        assert modeled == (measuring.h2d_gbps, measuring.d2h_gbps)
        assert modeled[0] == 64 * (1 << 20) / int(64 * (1 << 20) / 24.0)
    finally:
        backend.close()


def test_a_virtual_copy_takes_the_models_time_and_maps_no_page():
    """A copy on the virtual clock moves no bytes: 256 MiB uploaded fault no page in
    (writing them faults 65,536 pages of 4 KiB), and device memory reads as zeros."""
    import resource

    from pytest_gpuprof.capture.clock import VirtualClock

    backend = HostBackend(VirtualClock())
    try:
        backend.source.begin()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        buffer = backend.upload(256 * MIB)
        backend.synchronize()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        (copy,) = backend.source.drain()[0]
        assert faults < 5_000, faults
        assert copy.end - copy.start == backend.modeled_copy_ns(256 * MIB) and copy.bytes == 256 * MIB
        assert not buffer.array[:4096].any()
    finally:
        backend.close()


def test_a_synchronize_waits_for_work_in_flight_and_skips_an_idle_stream(backend, monkeypatch):
    release, synchronized = threading.Event(), threading.Event()
    backend.default_stream.submit(release.wait)
    try:
        assert not backend.default_stream.idle
        waiter = threading.Thread(target=lambda: (backend.synchronize(), synchronized.set()), daemon=True)
        waiter.start()
        assert not synchronized.wait(0.05)  # held by the work in flight (a skip would be done at once)
    finally:
        release.set()  # the stream's thread must end for the backend to close
    waiter.join(10)
    assert synchronized.is_set() and backend.default_stream.idle
    recorded = []
    monkeypatch.setattr(backend, "record", lambda stream=None: recorded.append(stream))
    backend.synchronize()
    assert recorded == []  # nothing in flight: no round trip to the stream's thread


def test_the_workers_of_one_run_calibrate_the_device_once(tmp_path):
    from pytest_gpuprof.capture.clock import VirtualClock

    backend = HostBackend(VirtualClock())
    copies = []

    class Counted:  # six timed copies each way, counted
        def __getattr__(self, name):
            if name == "modeled_copy_ns":
                raise AttributeError(name)
            if name in ("upload", "download"):
                copies.append(name)
            return getattr(backend, name)

    rates = tmp_path / "GPU-x.rates.json"
    try:
        first = GpuDevice(Counted(), backend.info(), (rates, "run-1"))
        measured = (first.h2d_gbps, first.d2h_gbps)
        assert len(copies) == 12
        # a second worker of the run reads the rates; one of another run measures again
        second = GpuDevice(Counted(), backend.info(), (rates, "run-1"))
        assert (second.h2d_gbps, second.d2h_gbps) == measured and len(copies) == 12
        other = GpuDevice(Counted(), backend.info(), (rates, "run-2"))
        assert (other.h2d_gbps, other.d2h_gbps) == measured and len(copies) == 24
        rates.write_text("{not json")  # a torn or foreign file is measured over, never believed
        assert GpuDevice(Counted(), backend.info(), (rates, "run-2")).h2d_gbps == measured[0]
        assert len(copies) == 30
    finally:
        backend.close()
