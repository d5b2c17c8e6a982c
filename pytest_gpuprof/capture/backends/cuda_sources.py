"""What the ``cuda`` backend's device did, read one of two ways (each a ``TraceSource``):

- ``CuptiSource``: CUPTI's activity records (``truth = "cupti"``): every kernel, copy and
  memset with its stream, tied to the step that launched it;
- ``EventsSource``: where CUPTI is missing, taken by another profiler or switched off, CUDA
  events recorded at a step's edges (``truth = "events"``) on its ``stream=``, else on the
  stream the calling thread's work goes to: a step's device time is the time between its
  two events, which cannot tell kernels from waits or see work on other non-blocking
  streams. A window whose events saw nothing reports its device figures as not measured.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pytest_gpuprof.analysis import sources as kinds
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval, Span
from pytest_gpuprof.analysis.occupancy import SmLimits
from pytest_gpuprof.capture.trace_source import TraceSource


class CudaDevice(Protocol):
    """What the sources ask of the ``cuda`` backend."""

    def properties(self) -> dict[str, Any]: ...
    def context(self) -> int: ...
    def synchronize(self, stream: Any = None) -> None: ...
    def record(self, stream: Any = None) -> Any: ...
    def current_stream(self) -> Any: ...
    def elapsed_ms(self, start: Any, end: Any) -> float: ...


# a step's token where CUPTI ties launches to steps: its edges are marked
_MARK = object()


class CuptiSource(TraceSource):
    """CUPTI's records of the backend's device (``capture``: a started ``cupti_trace`` capture)."""

    kind = kinds.CUPTI

    def __init__(self, backend: CudaDevice, capture: Any, why: str) -> None:
        self._backend = backend
        self.capture = capture  # ``cupti_trace.CuptiCapture``
        self._status = f"{why}; {capture.nvtx}"
        self._stream_ids: dict[int, int] = {}
        self._sm: SmLimits | None = None

    def status(self) -> str:
        return self._status

    def sm_limits(self) -> SmLimits | None:
        """The device's SMs: CUPTI records each kernel's geometry."""
        if self._sm is None:
            p = self._backend.properties()
            self._sm = SmLimits(
                sms=int(p["multiProcessorCount"]),
                max_threads=int(p.get("maxThreadsPerMultiProcessor", 2048)),
                max_blocks=int(p.get("maxBlocksPerMultiProcessor", 32)),
                registers=int(p.get("regsPerMultiprocessor", 65536)),
                shared=int(p.get("sharedMemPerMultiprocessor", 233472)),
                reserved_shared=int(p.get("reservedSharedMemPerBlock", 1024)),
                warp_size=int(p.get("warpSize", 32)),
            )
        return self._sm

    def open_span(self, span_id: int, stream: Any, *, copy: bool = False) -> Any:
        if self.capture.correlating:  # launches tied to steps by their edges
            self.capture.mark()
            return _MARK
        return None

    def close_span(self, token: Any) -> None:
        if token is _MARK:
            self.capture.mark()

    def stream_id(self, stream: Any) -> int | None:
        ptr = int(stream.ptr)
        cached = self._stream_ids.get(ptr)
        if cached is None:
            cached = self._stream_ids[ptr] = self.capture.stream_id(self._backend.context(), ptr)
        return cached

    def begin(self) -> None:
        self._backend.synchronize()
        self.capture.reset()

    def ranges(self) -> tuple[list[Span], list[Span]]:
        return self.capture.ranges()

    def drain(self) -> tuple[DeviceWork, list[str]]:
        return self.capture.drain()

    def close(self) -> None:
        self.capture.stop()


@dataclass(frozen=True, slots=True)
class _EdgeEvents:
    span_id: int
    stream: Any
    start: Any
    kind: Literal["kernel", "memcpy"]


EVENTS_NOTE = (
    "truth 'events': device time is each step's span between CUDA events on its stream (its stream= "
    "or the current stream); kernels, copies and waits inside a step are not told apart, and work "
    "on other non-blocking streams is not seen"
)


class EventsSource(TraceSource):
    """CUDA events at the steps' edges, timed against an anchor event recorded at ``begin``
    (``why``: why CUPTI is off, for the session's header)."""

    kind = kinds.EVENTS

    def __init__(self, backend: CudaDevice, why: str) -> None:
        self._backend = backend
        self._why = why
        self._lock = threading.Lock()
        self._edges: list[tuple[_EdgeEvents, Any]] = []
        self._anchor: tuple[Any, int] | None = None

    def status(self) -> str:
        return self._why

    def open_span(self, span_id: int, stream: Any, *, copy: bool = False) -> Any:
        if stream is None:
            stream = self._backend.current_stream()
        return _EdgeEvents(span_id, stream, self._backend.record(stream), "memcpy" if copy else "kernel")

    def close_span(self, token: Any) -> None:
        end = self._backend.record(token.stream)
        with self._lock:
            self._edges.append((token, end))

    def begin(self) -> None:
        self._backend.synchronize()
        anchor = self._backend.record()
        anchor.synchronize()
        self._anchor = (anchor, time.perf_counter_ns())
        with self._lock:
            self._edges = []

    def drain(self) -> tuple[DeviceWork, list[str]]:
        if self._anchor is None:
            self.begin()
        assert self._anchor is not None
        anchor, anchor_ns = self._anchor
        with self._lock:
            done = [(t, e) for t, e in self._edges if e.done]
            self._edges = [(t, e) for t, e in self._edges if not e.done]
        elapsed = self._backend.elapsed_ms
        out = [
            DeviceInterval(
                token.kind,
                anchor_ns + int(elapsed(anchor, token.start) * 1e6),
                anchor_ns + int(elapsed(anchor, end) * 1e6),
                0,
                "step events",
                0,
                False,
                token.span_id,
            )
            for token, end in done
        ]
        return DeviceWork.of(out), [EVENTS_NOTE]
