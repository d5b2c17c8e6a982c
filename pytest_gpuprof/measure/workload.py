"""Built-in prestage/compute workloads, written against the ``Backend`` interface.

The primitives are the steps of a GPU prestage: ``alloc``, ``upload``, ``sync``, ``trim``
and ``compute``, each recorded as a host step of that name. ``partitions`` is the
two-worker pipeline of docs/design.md in its single-lock and two-lock forms.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pytest_gpuprof.analysis.metrics import Metrics
from pytest_gpuprof.capture.backends import Backend
from pytest_gpuprof.capture.clock import Clock, Joinable, Lock
from pytest_gpuprof.capture.device import GpuDevice
from pytest_gpuprof.measure.profiler import Profiler
from pytest_gpuprof.output.text import human_bytes

Strategy = Literal["single-lock", "two-lock"]
STRATEGIES: tuple[Strategy, ...] = ("single-lock", "two-lock")


class GpuOutOfMemory(MemoryError):
    """A workload buffer larger than the free device memory."""


class GpuWorkload:
    def __init__(self, profiler: Profiler, device: GpuDevice, *, rounds: int, warmup: int) -> None:
        self.profiler = profiler
        self.device = device
        self.backend: Backend = profiler.backend
        self.rounds = rounds
        self.warmup = warmup
        self._streams: dict[tuple[int, str], Any] = {}

    @property
    def default_upload_bytes(self) -> int:
        """4 GiB on a GPU (the seed's partition); 64 MiB on the host backend."""
        return self.backend.kind.upload_bytes

    def compute_ms_for(self, upload_bytes: int) -> float:
        """Kernel time that keeps the seed's ratio to the measured pinned upload time."""
        return self.backend.kind.compute_per_upload * upload_bytes / (self.device.h2d_gbps * 1e6)

    # primitives
    def alloc(self, nbytes: int) -> Any:
        nbytes = _byte_count("alloc", nbytes)
        with self.profiler.step("alloc"), self._out_of_memory("alloc", nbytes):
            return self.backend.alloc(nbytes)

    @contextmanager
    def _out_of_memory(self, what: str, nbytes: int) -> Iterator[None]:
        """An allocation that does not fit fails with its size and the free memory,
        after the pool has given back what it cached."""
        try:
            yield
        except MemoryError as e:
            self.backend.trim()
            free, total = self.backend.memory_info()
            raise GpuOutOfMemory(
                f"{what} of {human_bytes(nbytes)} ({nbytes:,} B) does not fit: "
                f"{human_bytes(free)} ({free:,} B) free of {human_bytes(total)} on {self.device.name}"
            ) from e

    def upload(
        self, nbytes: int, pinned: bool = True, non_blocking: bool = False, *, stream: Any = None, out: Any = None
    ) -> Any:
        """Copy to the device and wait for the copy, as ``cudaMemcpy`` does; with
        ``non_blocking``, enqueue it on the stream and return at once, as
        ``cudaMemcpyAsync`` from pinned memory does (later work on the stream runs after
        it). From pageable memory the host waits for the copy either way, as on a GPU."""
        nbytes = _byte_count("upload", nbytes)
        stream = self.backend.default_stream if stream is None else stream
        with (
            self.profiler.step("upload", bytes=nbytes, stream=stream, pageable=not pinned),
            self._out_of_memory("upload", nbytes),
        ):
            buffer = self.backend.upload(nbytes, pinned=pinned, stream=stream, out=out)
            if not non_blocking:
                self.backend.synchronize(stream)
        return buffer

    def sync(self) -> None:
        with self.profiler.step("sync"):
            self.backend.synchronize()

    def trim(self) -> None:
        with self.profiler.step("trim"):
            self.backend.trim()

    def compute(self, ms: float | None = None, kind: str = "fft", *, stream: Any = None) -> None:
        """About ``ms`` of kernels (default: 10 ms), waited for."""
        ms = 10.0 if ms is None else _milliseconds("compute", ms)
        stream = self.backend.default_stream if stream is None else stream
        with self.profiler.step("compute", stream=stream):
            self.backend.compute(ms, kind=kind, stream=stream)
            self.backend.synchronize(stream)

    # the seed pipeline
    def partitions(
        self,
        n: int = 8,
        upload_bytes: int | None = None,
        compute_ms: float | None = None,
        workers: int = 2,
        strategy: Strategy = "single-lock",
        pinned: bool = True,
        *,
        kind: str = "fft",
        rounds: int | None = None,
        warmup: int | None = None,
    ) -> Metrics:
        """``n`` partitions over ``workers`` threads; each partition is a ``region``.

        ``single-lock`` holds one lock over the prestage (alloc, upload, device
        synchronize, pool trim) and the kernels. ``two-lock`` prestages (alloc, upload)
        under a memory lock and computes under a compute lock, the compute stream
        waiting for the upload's event on the device. It neither synchronizes the device
        nor trims the pool between partitions: both wait for the other worker's kernels
        (a pool trim frees with ``cudaFree``, which synchronizes the device); the pool is
        trimmed once, when the test ends. Measured as its own window, ``rounds`` times after
        ``warmup``, unless called inside ``gpuprof.measure``.
        """
        if strategy not in STRATEGIES:
            raise ValueError(f"partitions(strategy={strategy!r}): must be one of {', '.join(STRATEGIES)}")
        if n < 1 or workers < 1:
            raise ValueError(f"partitions(n={n}, workers={workers}): both must be at least 1")
        nbytes = self.default_upload_bytes if upload_bytes is None else _byte_count("partitions", upload_bytes)
        ms = self.compute_ms_for(nbytes) if compute_ms is None else _milliseconds("partitions", compute_ms)
        partition = self._single_lock if strategy == "single-lock" else self._two_lock
        clock = self.backend.clock
        locks = (clock.lock(), clock.lock())

        def run() -> None:
            _run_workers(clock, n, workers, lambda w: partition(w, nbytes, ms, pinned, kind, locks))

        if self.profiler.collector.measuring:
            with self.profiler.collector.window("partitions") as done:
                run()
            return done[0].metrics
        return self.profiler.repeat(
            run,
            rounds=self.profiler.rounds(rounds),
            warmup=self.warmup if warmup is None else warmup,
            label=f"partitions[{strategy}]",
        )

    def _stream(self, worker: int, role: str) -> Any:
        key = (worker, role)
        if key not in self._streams:
            self._streams[key] = self.backend.stream()
        return self._streams[key]

    def _single_lock(
        self, worker: int, nbytes: int, ms: float, pinned: bool, kind: str, locks: tuple[Lock, Lock]
    ) -> None:
        copy_stream, compute_stream = self._stream(worker, "copy"), self._stream(worker, "compute")
        with locks[0], self.profiler.region("partition"):
            buffer = self.alloc(nbytes)
            self.upload(nbytes, pinned, stream=copy_stream, out=buffer)
            self.sync()
            self.trim()
            self.compute(ms, kind, stream=compute_stream)
            del buffer

    def _two_lock(self, worker: int, nbytes: int, ms: float, pinned: bool, kind: str, locks: tuple[Lock, Lock]) -> None:
        memory_lock, compute_lock = locks
        copy_stream, compute_stream = self._stream(worker, "copy"), self._stream(worker, "compute")
        with self.profiler.region("partition"):
            with memory_lock:
                buffer = self.alloc(nbytes)
                self.upload(nbytes, pinned, stream=copy_stream, out=buffer)
                uploaded = self.backend.record(copy_stream)
            with compute_lock:
                self.backend.wait(compute_stream, uploaded)
                self.compute(ms, kind, stream=compute_stream)
            del buffer

    def close(self) -> None:
        """Wait for and release this workload's streams and pooled memory (at the end of each test)."""
        for stream in self._streams.values():
            self.backend.close_stream(stream)
        self._streams.clear()
        self.backend.trim()


def _byte_count(what: str, nbytes: Any) -> int:
    """A workload's byte count: a whole number, at least 1."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise TypeError(f"{what}(nbytes={nbytes!r}): a byte count must be an int, not {type(nbytes).__name__}")
    if nbytes < 1:
        raise ValueError(f"{what}(nbytes={nbytes}): a byte count must be at least 1")
    return int(nbytes)


def _milliseconds(what: str, ms: Any) -> float:
    """A workload's kernel time: a finite number of milliseconds, not negative."""
    if isinstance(ms, bool) or not isinstance(ms, numbers.Real):
        raise TypeError(f"{what}(ms={ms!r}): milliseconds must be a number, not {type(ms).__name__}")
    if not 0 <= float(ms) < math.inf:
        raise ValueError(f"{what}(ms={ms}): milliseconds must be finite and not negative")
    return float(ms)


def _run_workers(clock: Clock, n: int, workers: int, partition: Callable[[int], None]) -> None:
    """Run ``n`` partitions on ``workers`` threads; re-raise the first worker error.

    An interrupt of the calling thread (Ctrl-C) stops the workers after the partition
    each is in, and is raised once they have stopped: no thread outlives the call."""
    next_partition = iter(range(n))
    take = threading.Lock()  # held for a ``next`` only: never across a wait on the clock
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        while not errors:
            with take:
                if next(next_partition, None) is None:
                    return
            try:
                partition(index)
            except BaseException as e:
                errors.append(e)

    if workers == 1:
        worker(0)
    else:
        # Started inside the try: a Ctrl-C between two starts must stop the workers
        # already running too, or one runs every partition left (minutes) on its own.
        threads: list[Joinable] = []
        try:
            for i in range(workers):
                threads.append(clock.start_thread(functools.partial(worker, i), f"gpuprof-worker-{i}"))
            for t in threads:
                t.join()
        except BaseException as e:
            errors.append(e)
            for t in threads:
                t.join()
            raise
    if errors:
        raise errors[0]
