"""Host spans as the test code opens them: steps (``gpuprof.step``) and regions
(``gpuprof.region``), each kind kept apart.

A step is pushed on its thread's span stack, so that the backend ties the device work it
issues to it; a region is a bracket only (what GPU_START..GPU_END would claim) and owns
no device work, so a region inside a step never takes the step's work away. A step that
was made and never entered (``gpuprof.step("x")`` without ``with``) or entered and never
left is reported, never dropped (``SpanRecorder.problems``).
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any, Literal

from pytest_gpuprof.analysis.model import Span
from pytest_gpuprof.capture.backends import Backend
from pytest_gpuprof.capture.span_stack import pop_span, push_span

if TYPE_CHECKING:
    from pytest_gpuprof.capture.memory import MemoryTracker

SpanKind = Literal["step", "region"]
_span_ids = itertools.count(1)
_made = itertools.count(1)  # one per scope made: how a scope never entered is found


class SpanRecorder:
    """The steps and regions of one test, closed ones as ``Span``s, open ones until they close."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.steps: list[Span] = []
        self.regions: list[Span] = []
        # made and not yet entered, and entered and not yet left: by id, with their name
        self.unentered: dict[int, str] = {}
        self.entered: dict[int, SpanScope] = {}
        # device memory, marked at each step's edges (``capture.memory``)
        self.memory: MemoryTracker | None = None

    def scope(
        self,
        kind: SpanKind,
        name: str,
        nbytes: int | None = None,
        pageable: bool = False,
        stream: Any = None,
    ) -> SpanScope:
        if not isinstance(name, str) or not name:
            raise TypeError(f"gpuprof.{kind}(name): the name must be a non-empty string, not {name!r}")
        scope = SpanScope(self, kind, name, nbytes, pageable, stream)
        self.unentered[scope.serial] = name
        return scope

    def open_steps(self) -> tuple[int, ...]:
        """The span ids of the steps open now, on every thread."""
        return tuple(i for i, s in list(self.entered.items()) if s.kind == "step")

    def open_at(self, end: int) -> list[Span]:
        """The steps still open, as if they closed at ``end`` (a window's edge)."""
        return [s.span_at(end) for s in list(self.entered.values()) if s.kind == "step"]

    def clear(self) -> None:
        self.steps.clear()
        self.regions.clear()

    def problems(self) -> list[str]:
        """Steps and regions the test made and never entered, or entered and never left."""
        out = [
            f"gpuprof.step({name!r}) was made but never entered: write `with gpuprof.step({name!r}):`"
            for name in sorted(set(self.unentered.values()))
        ]
        out += [
            f"gpuprof.{s.kind}({s.name!r}) was entered and never left (its __exit__ never ran): "
            "it counts as open until the end of each window"
            for s in self.entered.values()
        ]
        return out


class SpanScope:
    """The context manager behind ``step`` and ``region``: a class, not a generator,
    because it sits on the measuring path (a few microseconds per step)."""

    __slots__ = (
        "_bytes",
        "_depth",
        "_now",
        "_pageable",
        "_recorder",
        "_span_id",
        "_stack",
        "_start",
        "_stream",
        "_stream_id",
        "_thread",
        "_token",
        "kind",
        "name",
        "serial",
    )

    def __init__(
        self, recorder: SpanRecorder, kind: SpanKind, name: str, nbytes: int | None, pageable: bool, stream: Any
    ) -> None:
        self._recorder = recorder
        self.kind = kind
        self.name = name
        self._bytes = nbytes
        self._pageable = pageable
        self._stream = stream
        self._now = recorder.backend.clock.now
        self.serial = next(_made)

    def __enter__(self) -> None:
        recorder = self._recorder
        recorder.unentered.pop(self.serial, None)
        self._span_id = span_id = next(_span_ids)
        self._thread = threading.get_native_id()
        backend = recorder.backend
        self._token = None
        self._stream_id = None
        if self.kind == "step":
            self._stack = push_span(span_id)
            self._depth = len(self._stack) - 1
        else:
            self._depth = 0
        # The backend's edge work (CUPTI's marks, CUDA events) lies inside the span: the
        # work the step issues is then between its marks, however long they take.
        self._start = self._now()
        if self.kind == "step":
            self._token = backend.source.open_span(span_id, self._stream, copy=self._bytes is not None)
            self._stream_id = backend.source.stream_id(self._stream) if self._stream is not None else None
        recorder.entered[span_id] = self
        if self.kind == "step" and recorder.memory is not None:
            recorder.memory.mark(self._start, step=True)

    def __exit__(self, *exc: object) -> None:
        recorder = self._recorder
        if self._token is not None:
            recorder.backend.source.close_span(self._token)
        end = self._now()
        if self.kind == "step":
            pop_span(self._stack, self._span_id)
        recorder.entered.pop(self._span_id, None)
        if self.kind == "step" and recorder.memory is not None:
            recorder.memory.mark(end, step=True)
        if threading.get_native_id() != self._thread:
            raise RuntimeError(
                f"gpuprof {self.kind} {self.name!r} was opened on thread {self._thread} and closed on thread "
                f"{threading.get_native_id()}: a {self.kind} opens and closes on one thread (it is not recorded)"
            )
        # list.append is atomic: no lock needed on this path
        (recorder.steps if self.kind == "step" else recorder.regions).append(self.span_at(end))

    def span_at(self, end: int) -> Span:
        return Span(
            self.name,
            self._thread,
            self._start,
            end,
            self._depth,
            self._span_id,
            self._bytes,
            self._pageable,
            self._stream_id,
        )
