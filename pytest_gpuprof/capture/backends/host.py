"""The ``host`` backend: the built-in workloads on the CPU, with real asynchrony.

Each stream is a thread that runs its queue in order; kernels are numpy work on that
thread; copies go to one copy-engine thread, as DMA does on a GPU; events are stamped by
the thread that reaches them. On the real clock every interval is the real time the work
took here: it is not a simulation and says nothing about any GPU. On the virtual clock
(``clock.VirtualClock``, for deterministic tests) the same threads run in the same order,
but kernels and copies do no work and take exactly the simulated time asked of them.
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from pytest_gpuprof.analysis import sources as kinds
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval
from pytest_gpuprof.capture.backends.base import HOST, DeviceInfo
from pytest_gpuprof.capture.backends.host_pool import HostBuffer, Pool, filled
from pytest_gpuprof.capture.clock import Clock, RealClock
from pytest_gpuprof.capture.span_stack import current_span_id
from pytest_gpuprof.capture.trace_source import TraceSource

# A pageable copy goes through a bounce buffer in pieces of this size, as the CUDA driver
# stages pageable memory through pinned buffers.
STAGING_BYTES = 8 << 20

# Copy rates of the virtual clock, GB/s (= bytes per ns): a pinned copy at a PCIe Gen4
# x16 link's practical rate, a pageable one at a quarter of it.
VIRTUAL_GBPS = {False: 24.0, True: 6.0}


class HostEvent:
    __slots__ = ("_clock", "_done", "time")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._done = clock.event()
        self.time = 0

    def complete(self) -> None:
        self.time = self._clock.now()
        self._done.set()

    def wait(self) -> None:
        self._done.wait()


class _Worker:
    """A thread that runs callables from its queue in order."""

    def __init__(self, name: str, clock: Clock) -> None:
        self._queue = clock.queue()
        self.error: BaseException | None = None
        # work submitted and not finished (a mutex held for an update, never waited on)
        self._busy = 0
        self._count = threading.Lock()
        self._thread = clock.start_thread(self._run, name)

    @property
    def idle(self) -> bool:
        """Nothing in flight: a synchronize has nothing to wait for (every window starts
        and ends with one, a round trip to this thread each)."""
        return self._busy == 0

    def submit(self, op: Callable[[], None]) -> None:
        with self._count:
            self._busy += 1
        self._queue.put(op)

    def _run(self) -> None:
        while (op := self._queue.get()) is not None:
            try:
                op()
            except BaseException as e:  # surfaced at the next synchronize
                self.error = e
            # Drop the finished work now: it may hold buffers that must return to the pool.
            del op
            with self._count:
                self._busy -= 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class HostStream(_Worker):
    def __init__(self, index: int, clock: Clock) -> None:
        super().__init__(f"gpuprof-host-stream-{index}", clock)
        self.index = index


class HostStamps(TraceSource):
    """The host backend's own source: each interval as the thread that ran it stamped it."""

    kind = kinds.HOST

    def __init__(self, backend: HostBackend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._intervals: list[DeviceInterval] = []

    def _add(self, interval: DeviceInterval) -> None:
        with self._lock:
            self._intervals.append(interval)

    def begin(self) -> None:
        # the stamps are taken from the first begin on: a source registered in this one's
        # place never starts it, and nothing piles up here unread
        self._backend.on_interval = self._add
        with self._lock:
            self._intervals = []

    def drain(self) -> tuple[DeviceWork, list[str]]:
        with self._lock:
            out, self._intervals = self._intervals, []
        return DeviceWork.of(out), []

    def stream_id(self, stream: HostStream) -> int:
        return stream.index  # every interval is tagged with its stream and launching step as submitted


class HostBackend:
    name: Literal["host"] = "host"
    kind = HOST
    source: TraceSource

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else RealClock()
        self.clock.attach()  # the thread that drives the backend
        self._lock = threading.Lock()
        # the record stream: each interval as it ends, to the source that reads it
        self.on_interval: Callable[[DeviceInterval], None] | None = None
        self._streams: list[HostStream] = []
        self._copy_engine = _Worker("gpuprof-host-copy-engine", self.clock)
        self.pool = Pool(premap=not self.clock.virtual)
        self.default_stream = self.stream()
        # its own stamps, unless a registered source reads it (``capture.sources``)
        self.source = HostStamps(self)

    def info(self) -> DeviceInfo:
        pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
        cpu = platform.processor() or platform.machine()
        return DeviceInfo(
            backend="host",
            index=0,
            name=f"host CPU ({cpu}, {os.cpu_count()} cores)",
            memory_bytes=pages * page,
            driver=f"numpy {np.__version__}",
        )

    # streams and events
    def stream(self) -> HostStream:
        with self._lock:
            s = HostStream(len(self._streams), self.clock)
            self._streams.append(s)
        return s

    def close_stream(self, stream: HostStream) -> None:
        self.synchronize(stream)
        stream.close()
        with self._lock:
            if stream in self._streams:
                self._streams.remove(stream)

    def _on(self, stream: HostStream | None) -> HostStream:
        return self.default_stream if stream is None else stream

    def record(self, stream: HostStream | None = None) -> HostEvent:
        event = HostEvent(self.clock)
        self._on(stream).submit(event.complete)
        return event

    def wait(self, stream: HostStream | None, event: HostEvent) -> None:
        self._on(stream).submit(event.wait)

    def synchronize(self, stream: HostStream | None = None) -> None:
        with self._lock:
            targets = [stream] if stream is not None else list(self._streams)
        for event in [self.record(s) for s in targets if not s.idle]:
            event.wait()
        self._raise_errors()

    def _raise_errors(self) -> None:
        for worker in [*self._streams, self._copy_engine]:
            if worker.error is not None:
                error, worker.error = worker.error, None
                raise RuntimeError(f"host device work failed: {error!r}") from error

    # memory
    def alloc(self, nbytes: int) -> HostBuffer:
        return self.pool.alloc(int(nbytes))

    def trim(self) -> None:
        self.pool.trim()

    def memory_info(self) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def memory_in_use(self) -> int:
        return self.pool.in_use

    def upload(
        self, nbytes: int, *, pinned: bool = True, stream: HostStream | None = None, out: HostBuffer | None = None
    ) -> HostBuffer:
        dst = out if out is not None else self.alloc(nbytes)
        # the user's data sits in host memory before an upload (filled here, not in the copy)
        src = None if self.clock.virtual else filled(nbytes)
        tag = current_span_id()
        target = self._on(stream)
        if not pinned:
            # Pageable: the calling thread is blocked for the whole staged copy.
            self.synchronize(target)
            self._copy(dst.array, src, nbytes, target.index, tag, pageable=True)
            return dst

        array = dst.array
        target.submit(
            lambda: self._on_copy_engine(lambda: self._copy(array, src, nbytes, target.index, tag, pageable=False))
        )
        return dst

    def download(self, buffer: HostBuffer, *, stream: HostStream | None = None) -> np.ndarray:
        host = np.zeros(buffer.nbytes, dtype=np.uint8)
        target = self._on(stream)
        tag = current_span_id()
        source = None if self.clock.virtual else buffer.array
        target.submit(
            lambda: self._on_copy_engine(
                lambda: self._copy(host, source, buffer.nbytes, target.index, tag, pageable=False, name="DtoH")
            )
        )
        return host

    def _on_copy_engine(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the copy engine and hold the calling stream until it is done."""
        done = self.clock.event()

        def run() -> None:
            try:
                job()
            finally:
                done.set()

        self._copy_engine.submit(run)
        done.wait()

    def _copy(
        self,
        dst: np.ndarray,
        src: np.ndarray | None,
        nbytes: int,
        stream: int,
        tag: int | None,
        *,
        pageable: bool,
        name: str = "HtoD",
    ) -> None:
        start = self.clock.now()
        if src is None:
            # The virtual clock: the copy takes what the model says and moves no bytes, as
            # its kernels compute nothing. Nothing reads device memory's contents, and a
            # first write faults every page in (about 160 ms for 64 MiB on a 2-core
            # machine). Device memory and downloads read as zeros there.
            self.clock.spend(self.modeled_copy_ns(nbytes, pageable=pageable) or 0)
        elif pageable:
            staging = np.empty(min(STAGING_BYTES, nbytes), dtype=np.uint8)
            for lo in range(0, nbytes, staging.nbytes):
                piece = src[lo : lo + staging.nbytes]
                np.copyto(staging[: piece.nbytes], piece)
                np.copyto(dst[lo : lo + piece.nbytes], staging[: piece.nbytes])
        else:
            np.copyto(dst[:nbytes], src)
        end = self.clock.now()
        self._stamp(DeviceInterval("memcpy", start, end, stream, name, nbytes, pageable, tag))

    def modeled_copy_ns(self, nbytes: int, *, pageable: bool = False) -> int | None:
        """How long a copy takes on the virtual clock (its model), None on the real one."""
        return int(nbytes / VIRTUAL_GBPS[pageable]) if self.clock.virtual else None

    # kernels
    def prepare(self) -> None:
        return None  # host kernels run for the time asked: nothing to size

    def compute(self, ms: float, *, kind: str = "fft", stream: HostStream | None = None) -> None:
        if kind not in KERNELS:
            raise ValueError(f"compute(kind={kind!r}): kind must be one of {', '.join(KERNELS)}")
        target = self._on(stream)
        work = KERNELS[kind]
        tag = current_span_id()
        budget_ns = int(ms * 1_000_000)

        def kernel() -> None:
            start = self.clock.now()
            # Real numpy work, repeated until the requested time has been spent on it.
            self.clock.spend(budget_ns, work)
            end = self.clock.now()
            self._stamp(DeviceInterval("kernel", start, end, target.index, kind, 0, False, tag))

        target.submit(kernel)

    def _stamp(self, interval: DeviceInterval) -> None:
        if (take := self.on_interval) is not None:
            take(interval)

    def close(self) -> None:
        if (source := getattr(self, "source", None)) is not None:
            source.close()
        self.on_interval = None
        for s in list(self._streams):
            s.close()
        self._streams.clear()
        self._copy_engine.close()
        self.pool.trim()
        self.clock.detach()


def _fft_work() -> Any:
    return np.fft.fft(_FFT_INPUT)


def _matmul_work() -> Any:
    return _MATMUL_INPUT @ _MATMUL_INPUT


_FFT_INPUT = np.ones(1 << 14, dtype=np.complex64)
_MATMUL_INPUT = np.ones((128, 128), dtype=np.float32)
KERNELS: dict[str, Callable[[], Any]] = {"fft": _fft_work, "matmul": _matmul_work}
