"""Measured windows: a stretch of host time, the device work inside it, its timeline and
its metrics (docs/design.md, "The window").

A window is a ``measure()`` round, a ``partitions()`` call, or, when neither is used,
the test from the start of its first step or region to the end of its last one,
including the device work they launched.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from pytest_gpuprof.analysis import metrics as metrics_mod
from pytest_gpuprof.analysis.metrics import Metrics
from pytest_gpuprof.analysis.model import Span
from pytest_gpuprof.analysis.nvtx import as_steps
from pytest_gpuprof.analysis.processes import note as process_note
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.capture.backends import Backend
from pytest_gpuprof.capture.probe import runner_probe_ms
from pytest_gpuprof.measure.drained import Drained, Sampler, shared_since, with_children
from pytest_gpuprof.measure.spans import SpanRecorder
from pytest_gpuprof.verdict.budget import Budget, Verdict, judge

if TYPE_CHECKING:
    from pytest_gpuprof.capture.children import ChildWatch
    from pytest_gpuprof.capture.gpm import Gpm
    from pytest_gpuprof.capture.stacks import StackSampler

__all__ = ["Channels", "Sampler", "Window", "WindowCollector"]


@dataclass
class Window:
    """One measured window and its test budget's verdict on it."""

    label: str
    metrics: Metrics
    timeline: Timeline | None = None
    verdict: Verdict = field(default_factory=Verdict)
    # judged already, inside its hypothesis example (confirmed or cleared by re-measuring)
    settled: bool = False
    # measured inside a hypothesis example; the breach its measure() raised there, if any
    example: bool = False
    error: BaseException | None = None
    # a measure()'s rounds, each one's own figures (``metrics`` aggregates them)
    rounds: tuple[Metrics, ...] = ()


class _Cut(NamedTuple):
    """A window that ended, to be cut out of what was drained (at once, or after its batch):
    the list to fill, its label and edges, GPM's figures and NVML's notes over it, its
    memory marks, and the runner probe timed before it."""

    out: list[Window]
    label: str
    start: int
    end: int
    gpm: dict[str, float] | None
    notes: list[str]
    marks: tuple[int, int] | None
    probe: float | None


@dataclass
class Channels:
    """What reads the device and the host beside the backend's own source, started by the
    session and read by each window: NVML's samples and other processes, the calibrated
    pinned copy rate (for what-if predictions of pageable steps), NVML GPM at each window's
    edges, the host's Python stacks, and the processes the test starts."""

    sampler: Sampler | None = None
    pinned_gbps: Callable[[], float] | None = None
    gpm: Gpm | None = None
    stacks: StackSampler | None = None
    children: ChildWatch | None = None


class WindowCollector:
    """Drains the backend, cuts windows out of what the test recorded, and keeps them."""

    def __init__(self, backend: Backend, spans: SpanRecorder, channels: Channels | None = None) -> None:
        self.backend = backend
        self.spans = spans
        self.channels = channels or Channels()
        # the thread that measures: it issues device work even where it opened no step
        self.thread = threading.get_native_id()
        self.windows: list[Window] = []
        # what the source said since the last reset
        self.drained = Drained(backend.source, backend.clock.now())
        self._measuring = 0
        self._batching = 0  # inside ``batch`` (a measure()'s rounds)
        self._warming = 0  # inside ``unmeasured`` (a measure()'s warm-up)
        self._open = 0  # windows open now: one inside another is cut at once
        self._pending: list[_Cut] = []  # the windows of a batch, cut once its last one ended
        # device work that ran outside every window once windows were cut: said, not judged
        self.outside: list[str] = []

    @property
    def measuring(self) -> bool:
        return self._measuring > 0

    @contextmanager
    def window(self, label: str) -> Iterator[list[Window]]:
        """Measure the body as one window; the yielded list holds it once the body ends.

        Python's cyclic garbage collector is paused inside the window, as ``timeit`` does:
        a collection stops every thread for as long as it walks all live objects (among
        them the timelines already measured), and the device then idles for a reason
        that is neither the workload's nor repeatable.
        """
        out: list[Window] = []
        # a window in a warm-up round (``partitions`` inside ``measure``) is cut at once: the
        # batch's cut keeps the measured rounds' windows only
        deferred = self._batching > 0 and self._open == 0 and not self._warming
        if not self._batching and not self._open:
            self.note_outside(label)
        self._open += 1
        self._measuring += 1
        collecting = gc.isenabled()
        gc.disable()
        # the runner's speed, outside the window (the virtual clock gives host code no time)
        probe = None if self.backend.clock.virtual else runner_probe_ms()
        edge = self.channels.gpm.edge() if self.channels.gpm is not None else None
        started_s = time.time()  # NVML's per-process samples are stamped in wall time
        # the memory marks stand just outside the window's edges: reading an allocator's
        # counters is not the window's work
        first = self.spans.memory.mark(self.backend.clock.now()) if self.spans.memory is not None else None
        start = self.backend.clock.now()
        measured = False  # the body ended, or raised an error: the window is kept either way
        try:
            try:
                yield out
            except Exception:
                measured = True
                raise
            measured = True
        finally:
            try:
                if measured:
                    self.backend.synchronize()
            finally:
                self._measuring -= 1
                self._open -= 1
                end = self.backend.clock.now()
                last = self.spans.memory.mark(end) if self.spans.memory is not None else None
                if collecting:
                    gc.enable()
                gpm = self.channels.gpm.since(edge) if self.channels.gpm is not None else None
            if measured:  # not on Ctrl-C: the interrupted test is not measured
                shared = shared_since(self.channels.sampler, started_s)
                marks = (first, last) if first is not None and last is not None else None
                cut = _Cut(out, label, start, end, gpm, shared, marks, probe)
                if deferred:
                    self._pending.append(cut)
                else:
                    self._cut(cut)
                    if not self.measuring:
                        self.reset()

    def _cut(self, cut: _Cut) -> None:
        timeline = self.timeline(cut.start, cut.end, cut.gpm, cut.notes, cut.marks)
        metrics = replace(metrics_mod.compute(timeline, self.channels.pinned_gbps), runner_probe_ms=cut.probe)
        cut.out.append(Window(cut.label, metrics, timeline))

    @contextmanager
    def batch(self, label: str = "measure") -> Iterator[None]:
        """The windows made inside (a ``measure()``'s rounds) are cut after the last one:
        CUPTI is flushed once for all of them, not between them. A forced flush slows the
        launches that follow it (on an H200, a CUDA-graph loop by 6%, docs/performance-log.md),
        which would put that cost in the next round."""
        if not self._batching and not self._open:
            self.note_outside(label)
        else:
            self.collect()
        self._batching += 1
        self._measuring += 1
        try:
            yield
        finally:
            self._batching -= 1
            self._measuring -= 1
            pending, self._pending = self._pending, []
            try:
                for cut in pending:
                    self._cut(cut)
            finally:
                if not self.measuring:
                    self.reset()

    @contextmanager
    def unmeasured(self) -> Iterator[None]:
        self._measuring += 1
        self._warming += 1
        try:
            yield
        finally:
            self._measuring -= 1
            self._warming -= 1
            if not self.measuring:
                self.reset()

    def note_outside(self, label: str, *, after: bool = False) -> None:
        """Say what device work ran since the last window (or the test's start) and before
        this ``label`` window, or, ``after``, after the last one: it is in no window, so no
        budget judges it (docs/design.md, "The window")."""
        self.collect()
        line = self.drained.outside(label, after=after)
        if line is not None:
            self.outside.append(line)

    def reset(self, *, drain: bool = True) -> None:
        """Forget spans, device work and notes already accounted for in a window (or, at
        the start of a test's call, its set-up's). ``drain=False`` reads no records now:
        a forced CUPTI flush slows the launches after it, and what set-up left in the
        buffers is older than ``_since``, which every window and note reads from."""
        if drain:
            self.collect()
        with self.drained.lock:
            self.spans.clear()
            self.drained.clear(self.backend.clock.now())
        if self.channels.stacks is not None:
            self.channels.stacks.forget(self.drained.since)
        if self.spans.memory is not None:
            self.spans.memory.forget()

    def keep(self, window: Window, budget: Budget) -> Metrics:
        """Judge ``window`` on the test's budget and keep it."""
        window.verdict = judge(budget, window.metrics)
        self.windows.append(window)
        return window.metrics

    def collect(self) -> None:
        self.drained.collect()

    def timeline(
        self,
        start: int,
        end: int,
        gpm: dict[str, float] | None = None,
        extra: list[str] | None = None,
        marks: tuple[int, int] | None = None,
    ) -> Timeline:
        """The window ``[start, end]``; ``marks``: its edges' memory marks (none: every mark
        since the last reset, as for the whole test)."""
        self.collect()
        drained = self.drained
        with drained.lock:
            steps = tuple(
                s for s in as_steps(self._steps_at(end), drained.ranges_at(end)) if s.end >= start and s.start <= end
            )
            regions = tuple(r for r in self.spans.regions if r.end >= start and r.start <= end)
            every = drained.joined()
            rows = every.rows
            device = every.where((rows["end"] > start) & (rows["start"] < end))
            notes = (*drained.notes, *(extra or ()))
        device, processes = with_children(self.channels.children, device, start, end)
        said = process_note(processes)
        tracker, sampler, stacks = self.spans.memory, self.channels.sampler, self.channels.stacks
        return Timeline(
            start=start,
            end=end,
            truth=self.backend.source.kind.name,
            steps=steps,
            regions=regions,
            device=device,
            samples=tuple(sampler.samples(start, end)) if sampler is not None else (),
            notes=(*notes, *([said] if said else [])),
            sm=self.backend.source.sm_limits(),
            gpm=gpm,
            stacks=None if stacks is None else tuple(stacks.samples(start, end)),
            thread=self.thread,
            memory=tracker.log(*(marks or ())) if tracker is not None else None,
            memory_unseen=tracker.why if tracker is not None else None,
            processes=processes,
        )

    def _steps_at(self, end: int) -> list[Span]:
        return [*self.spans.steps, *self.spans.open_at(end)]

    def whole_test(self) -> Window | None:
        """The test as one window, from its first step or region to its last and its device work."""
        self.backend.synchronize()
        self.collect()
        now = self.backend.clock.now()
        with self.drained.lock:
            spans = [*self._steps_at(now), *self.spans.regions, *self.drained.ranges_at(now)]
            if not spans:
                return None
            start = min(s.start for s in spans)
            end = max(s.end for s in spans)
            rows = self.drained.joined().rows
            launched = np.isin(rows["span_id"], [s.span_id for s in spans])
            tail = rows["end"][launched | ((rows["start"] >= start) & (rows["start"] < end))]
        timeline = self.timeline(start, max(end, int(tail.max(initial=end))))
        return Window("test", metrics_mod.compute(timeline, self.channels.pinned_gbps), timeline)
