"""The ``gpuprof`` fixture's object: host steps and regions, windows, metrics, checks.

A window is a ``measure()`` round, a ``partitions()`` call, or, when neither is used, the
test from the start of its first step or region to the end of its last one including the
device work they launched.
"""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pytest_gpuprof import confirm as examples
from pytest_gpuprof.analysis import metrics as metrics_mod
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.metrics import Metrics
from pytest_gpuprof.analysis.model import GIB, Sample, Span
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.analysis.whatif import Prediction
from pytest_gpuprof.capture.backends import Backend
from pytest_gpuprof.capture.span_stack import pop_span, push_span
from pytest_gpuprof.output.text import failure_message
from pytest_gpuprof.verdict.budget import Breach, Budget, breaches_of, parse_budget

if TYPE_CHECKING:
    from pytest_gpuprof.capture.gpm import Gpm

_span_ids = itertools.count(1)


class GpuBudgetExceeded(AssertionError):
    """A window's metrics breached its budget; the message explains where the time went."""

    def __init__(self, message: str, breaches: list[Breach], metrics: Metrics) -> None:
        super().__init__(message)
        self.breaches = breaches
        self.metrics = metrics


class Sampler(Protocol):
    """A source of hardware samples (NVML)."""

    def samples(self, lo: int, hi: int) -> list[Sample]:
        """The samples taken between ``lo`` and ``hi`` (host clock, ns)."""
        ...


@dataclass
class Window:
    """One measured window and the breaches of its test's budget."""

    label: str
    metrics: Metrics
    timeline: Timeline | None = None
    breaches: list[Breach] = field(default_factory=list)
    # judged already, inside its hypothesis example (confirmed or cleared by re-measuring)
    settled: bool = False


class Profiler:
    def __init__(
        self,
        backend: Backend,
        *,
        budget: Budget | None = None,
        rounds: int = 5,
        warmup: int = 1,
        sampler: Sampler | None = None,
        enforce: bool = False,
        pinned_gbps: Callable[[], float] | None = None,
        gpm: Gpm | None = None,
    ) -> None:
        self.backend = backend
        self.budget = budget or Budget()
        self.default_rounds = rounds
        self.default_warmup = warmup
        self.sampler = sampler
        self.windows: list[Window] = []
        self.enforce = enforce
        # the device's calibrated pinned copy rate, for what-if predictions of pageable steps
        self.pinned_gbps = pinned_gbps
        self.gpm = gpm  # NVML GPM, sampled at each window's edges
        # device memory held when the test started: what it must give back by its end
        self.memory_before = backend.memory_in_use()
        self.leaks: list[str] = []
        self._examples = examples.Examples(backend, self.leaks)
        self._lock = threading.Lock()
        self._steps: list[Span] = []
        self._regions: list[Span] = []
        self._device: list[DeviceWork] = []  # drained, not yet joined
        self._notes: list[str] = []
        self._measuring = 0
        backend.begin()

    # host spans
    def step(self, name: str, bytes: int | None = None, stream: Any = None, *, pageable: bool = False) -> _SpanScope:
        """A host step: nestable, thread-safe; closed and recorded even when its body raises.

        With ``stream``, a copy that starts on that stream while the step is open is the
        step's (its bytes, bandwidth and pageable flag), and where CUPTI is not available,
        events recorded on that stream at both edges are how the step's device time is seen.
        """
        return _SpanScope(self, name, self._steps, bytes, pageable, stream)

    def region(self, name: str = "partition") -> _SpanScope:
        """A bracket, as GPU_START..GPU_END instrumentation would put around a partition."""
        return _SpanScope(self, name, self._regions, None, False, None)

    # windows
    @contextmanager
    def window(self, label: str) -> Iterator[list[Window]]:
        """Measure the body as one window; the yielded list holds it once the body ends.

        Python's cyclic garbage collector is paused inside the window, as ``timeit`` does:
        a collection stops every thread for as long as it walks all live objects (among
        them the timelines already measured), and the device then idles for a reason
        that is neither the workload's nor repeatable.
        """
        out: list[Window] = []
        self._collect()
        self._measuring += 1
        collecting = gc.isenabled()
        gc.disable()
        edge = self.gpm.edge() if self.gpm is not None else None
        start = self.backend.clock.now()
        try:
            yield out
            self.backend.synchronize()
        finally:
            self._measuring -= 1
            end = self.backend.clock.now()
            if collecting:
                gc.enable()
            gpm = self.gpm.since(edge) if self.gpm is not None else None
        timeline = self._timeline(start, end, gpm)
        out.append(Window(label, metrics_mod.compute(timeline, self.pinned_gbps), timeline))
        if not self.measuring:
            self._reset()

    def measure(self, fn: Callable[[], Any], rounds: int | None = None, warmup: int | None = None) -> Metrics:
        """Run ``fn`` ``warmup`` times unmeasured, then ``rounds`` times, each its own window.

        Each window runs from just before the call to the end of the device work it
        launched (a device synchronize is inside the window). Returns per-metric medians
        with each metric's spread in ``Metrics.rounds``.
        """
        rounds = self.default_rounds if rounds is None else rounds
        warmup = self.default_warmup if warmup is None else warmup
        if rounds < 1 or warmup < 0:
            raise ValueError(f"measure(rounds={rounds}, warmup={warmup}): rounds must be >= 1, warmup >= 0")
        example = examples.running()
        if example:
            self._examples.watch_memory()
        metrics = self.repeat(fn, rounds=rounds, warmup=warmup, label="measure")
        if example:
            self._examples.remember(lambda: self.repeat(fn, rounds=rounds, warmup=0, label="measure"))
            if self.enforce:
                window = self.windows[-1]
                breaches, judged = self._examples.judgement(self.budget, window.breaches, window.metrics)
                window.settled = True
                if breaches:
                    self._raise_confirmed(breaches, judged)
        return metrics

    def _raise_confirmed(self, breaches: list[Breach], metrics: Metrics) -> None:
        message = failure_message(breaches, metrics)
        moved = [(name, s.bytes) for name, s in metrics.steps.items() if s.bytes]
        if moved:
            message += "\n  buffers: " + ", ".join(f"{name} {n:,} B ({n / GIB:.4g} GiB)" for name, n in moved)
        message += f"\n  (confirmed by {examples.CONFIRMATIONS} more measurements)"
        raise GpuBudgetExceeded(message, breaches, metrics)

    def repeat(self, body: Callable[[], Any], *, rounds: int, warmup: int, label: str) -> Metrics:
        for _ in range(warmup):
            with self._unmeasured():
                body()
                self.backend.synchronize()
        results = []
        for _ in range(rounds):
            with self.window(label) as done:
                body()
            results.append(done[0])
        merged = metrics_mod.aggregate([w.metrics for w in results]) if rounds > 1 else results[0].metrics
        return self.record(Window(label, merged, results[-1].timeline))

    @contextmanager
    def _unmeasured(self) -> Iterator[None]:
        self._measuring += 1
        try:
            yield
        finally:
            self._measuring -= 1
            if not self.measuring:
                self._reset()

    def _reset(self) -> None:
        """Forget spans, device work and notes already accounted for in a window."""
        self._collect()
        with self._lock:
            self._steps.clear()
            self._regions.clear()
            self._device.clear()
            self._notes.clear()

    @property
    def measuring(self) -> bool:
        return self._measuring > 0

    def record(self, window: Window) -> Metrics:
        """Judge ``window`` on this test's budget and keep it."""
        window.breaches = breaches_of(self.budget, window.metrics)
        self.windows.append(window)
        return window.metrics

    def _collect(self) -> None:
        device, notes = self.backend.drain()
        with self._lock:
            if len(device):
                self._device.append(device)
            self._notes.extend(n for n in notes if n not in self._notes)

    def _joined(self) -> DeviceWork:
        """Every drain's rows as one ``DeviceWork`` (kept joined; the lock is held)."""
        joined = DeviceWork.join(self._device)
        self._device[:] = [joined] if len(joined) else []
        return joined

    def _timeline(self, start: int, end: int, gpm: dict[str, float] | None = None) -> Timeline:
        self._collect()
        with self._lock:
            steps = tuple(s for s in self._steps if s.end >= start and s.start <= end)
            regions = tuple(r for r in self._regions if r.end >= start and r.start <= end)
            every = self._joined()
            rows = every.rows
            device = every.where((rows["end"] > start) & (rows["start"] < end))
            notes = tuple(self._notes)
        return Timeline(
            start,
            end,
            self.backend.truth,
            steps,
            regions,
            device,
            tuple(self.sampler.samples(start, end)) if self.sampler is not None else (),
            notes,
            self.backend.sm_limits(),
            gpm,
        )

    def whole_test(self) -> Window | None:
        """The test as one window, from its first step or region to its last and its device work."""
        self.backend.synchronize()
        self._collect()
        with self._lock:
            spans = [*self._steps, *self._regions]
            if not spans:
                return None
            start = min(s.start for s in spans)
            end = max(s.end for s in spans)
            rows = self._joined().rows
            launched = np.isin(rows["span_id"], [s.span_id for s in spans])
            tail = rows["end"][launched | ((rows["start"] >= start) & (rows["start"] < end))]
        timeline = self._timeline(start, max(end, int(tail.max(initial=end))))
        return Window("test", metrics_mod.compute(timeline, self.pinned_gbps), timeline)

    @property
    def metrics(self) -> Metrics | None:
        """The latest window's metrics, or the whole test so far when nothing was measured."""
        if self.windows:
            return self.windows[-1].metrics
        window = self.whole_test()
        return window.metrics if window else None

    def what_if(self, scenario: str) -> Prediction | None:
        """The predicted wall time and utilization of the latest window (or of the test so
        far) under ``scenario``: ``overlap:STEP``, ``pinned:STEP`` or ``faster:STEP:F``;
        ``None`` where it does not apply. The window's own ``Metrics.what_if`` holds the
        default scenarios already."""
        window = self.windows[-1] if self.windows else self.whole_test()
        if window is None or window.timeline is None:
            raise ValueError(f"gpuprof.what_if({scenario!r}): nothing measured yet")
        return metrics_mod.what_if(window.timeline, scenario, self.pinned_gbps)

    def check(self, **limits: Any) -> Metrics:
        """Assert a budget now on the latest ``measure()`` result, or on the test so far.

        Keyword arguments follow ``[tool.gpuprof.budget]``; none given means this test's
        configured budget.
        """
        budget = parse_budget(limits, "gpuprof.check()").merged_over(self.budget) if limits else self.budget
        current = self.metrics
        if current is None:
            raise ValueError("gpuprof.check(): nothing measured yet: no step, region or measure() in this test")
        breaches = breaches_of(budget, current)
        if self._examples.measured_this_one():
            # after this example's measure(): judged as measure() judges its own budget
            breaches, judged = self._examples.judgement(budget, breaches, current)
            if breaches:
                self._raise_confirmed(breaches, judged)
            return current
        if breaches:
            raise GpuBudgetExceeded(failure_message(breaches, current), breaches, current)
        return current

    def final_windows(self) -> list[Window]:
        """The windows this test's budget is checked on: every measured one, else the test."""
        if self.windows:
            return self.windows
        whole = self.whole_test()
        if whole is None:
            return []
        self.record(whole)
        return self.windows


class _SpanScope:
    """The context manager behind ``step`` and ``region``: a class, not a generator,
    because it sits on the measuring path (a few microseconds per step)."""

    __slots__ = (
        "_bytes",
        "_depth",
        "_into",
        "_name",
        "_now",
        "_pageable",
        "_profiler",
        "_span_id",
        "_stack",
        "_start",
        "_stream",
        "_stream_id",
        "_thread",
        "_token",
    )

    def __init__(
        self, profiler: Profiler, name: str, into: list[Span], nbytes: int | None, pageable: bool, stream: Any
    ) -> None:
        self._profiler = profiler
        self._name = name
        self._into = into
        self._bytes = nbytes
        self._pageable = pageable
        self._stream = stream
        self._now = profiler.backend.clock.now

    def __enter__(self) -> None:
        self._span_id = span_id = next(_span_ids)
        self._stack = push_span(span_id)
        self._depth = len(self._stack) - 1
        self._thread = threading.get_native_id()
        profiler = self._profiler
        is_step = self._into is profiler._steps
        backend = profiler.backend
        # The backend's edge work (CUPTI's marks, CUDA events) lies inside the span: the
        # work the step issues is then between its marks, however long they take.
        self._start = self._now()
        self._token = backend.open_span(span_id, self._stream, copy=self._bytes is not None) if is_step else None
        self._stream_id = backend.stream_id(self._stream) if self._stream is not None else None

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            self._profiler.backend.close_span(self._token)
        end = self._now()
        pop_span(self._stack, self._span_id)
        if threading.get_native_id() != self._thread:
            raise RuntimeError(
                f"gpuprof step {self._name!r} was opened on thread {self._thread} and closed on thread "
                f"{threading.get_native_id()}: a step opens and closes on one thread (it is not recorded)"
            )
        # list.append is atomic: no lock needed on this path
        self._into.append(
            Span(
                self._name,
                self._thread,
                self._start,
                end,
                self._depth,
                self._span_id,
                self._bytes,
                self._pageable,
                self._stream_id,
            )
        )
