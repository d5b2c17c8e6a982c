"""Measured windows: a stretch of host time, the device work inside it, its timeline and
its metrics (docs/design.md, "The window").

A window is a ``measure()`` round, a ``partitions()`` call, or, when neither is used,
the test from the start of its first step or region to the end of its last one,
including the device work they launched.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pytest_gpuprof.analysis import metrics as metrics_mod
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.metrics import Metrics
from pytest_gpuprof.analysis.model import KINDS, Sample, Span
from pytest_gpuprof.analysis.nvtx import as_steps
from pytest_gpuprof.analysis.processes import ProcessFigures
from pytest_gpuprof.analysis.processes import figures as process_figures
from pytest_gpuprof.analysis.processes import note as process_note
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.capture.backends import Backend
from pytest_gpuprof.harness.spans import SpanRecorder
from pytest_gpuprof.output.text import human_bytes
from pytest_gpuprof.verdict.budget import Budget, Verdict, judge

if TYPE_CHECKING:
    from pytest_gpuprof.capture.children import ChildWatch
    from pytest_gpuprof.capture.gpm import Gpm
    from pytest_gpuprof.capture.stacks import StackSampler


class Sampler(Protocol):
    """A source of hardware samples (NVML)."""

    def samples(self, lo: int, hi: int) -> list[Sample]:
        """The samples taken between ``lo`` and ``hi`` (host clock, ns)."""
        ...

    def others(self, since_s: float) -> dict[int, int]:
        """Other processes' highest SM utilization on the device since ``since_s``, by pid."""
        ...


# another process's SM utilization (percent) from which a window says it shared the device
OTHER_PROCESS_SM = 5


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


class WindowCollector:
    """Drains the backend, cuts windows out of what the test recorded, and keeps them."""

    def __init__(
        self,
        backend: Backend,
        spans: SpanRecorder,
        *,
        sampler: Sampler | None = None,
        pinned_gbps: Callable[[], float] | None = None,
        gpm: Gpm | None = None,
        stacks: StackSampler | None = None,
    ) -> None:
        self.backend = backend
        self.spans = spans
        self.sampler = sampler
        # the device's calibrated pinned copy rate, for what-if predictions of pageable steps
        self.pinned_gbps = pinned_gbps
        self.gpm = gpm  # NVML GPM, sampled at each window's edges
        self.stacks = stacks  # the host's Python stacks, sampled while the test runs
        self.children: ChildWatch | None = None  # the processes the test starts (``capture.children``)
        # the thread that measures: it issues device work even where it opened no step
        self.thread = threading.get_native_id()
        self.windows: list[Window] = []
        self._lock = threading.Lock()
        self._device: list[DeviceWork] = []  # drained, not yet joined
        self._notes: list[str] = []
        # NVTX ranges (CUPTI): those that ended, and those open at the last drain; of both,
        # only the part since the last reset is this collector's (``_ranges_at``)
        self._ranges: list[Span] = []
        self._open_ranges: list[Span] = []
        self._since = backend.clock.now()
        self._measuring = 0
        # windows of a batch, cut once its last one ended: (list to fill, label, edges, gpm, notes)
        self._batching = 0
        self._warming = 0  # inside ``unmeasured`` (a measure()'s warm-up)
        self._open = 0  # windows open now: one inside another is cut at once
        self._pending: list[
            tuple[list[Window], str, int, int, dict[str, float] | None, list[str], tuple[int, int] | None]
        ] = []
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
        edge = self.gpm.edge() if self.gpm is not None else None
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
                gpm = self.gpm.since(edge) if self.gpm is not None else None
            if measured:  # not on Ctrl-C: the interrupted test is not measured
                shared = self._shared_since(started_s)
                marks = (first, last) if first is not None and last is not None else None
                if deferred:
                    self._pending.append((out, label, start, end, gpm, shared, marks))
                else:
                    self._cut(out, label, start, end, gpm, shared, marks)
                    if not self.measuring:
                        self.reset()

    def _cut(
        self,
        out: list[Window],
        label: str,
        start: int,
        end: int,
        gpm: dict[str, float] | None,
        notes: list[str],
        marks: tuple[int, int] | None,
    ) -> None:
        timeline = self.timeline(start, end, gpm, notes, marks)
        out.append(Window(label, metrics_mod.compute(timeline, self.pinned_gbps), timeline))

    @contextmanager
    def batch(self, label: str = "measure") -> Iterator[None]:
        """The windows made inside (a ``measure()``'s rounds) are cut after the last one:
        CUPTI is flushed once for all of them, not between them. A forced flush slows the
        launches that follow it (on an H200, a CUDA-graph loop by 6%, docs/performance.md),
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
                for out, label, start, end, gpm, notes, marks in pending:
                    self._cut(out, label, start, end, gpm, notes, marks)
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
        with self._lock:
            rows = self._joined().rows
            rows = rows[rows["start"] >= self._since]
        if not len(rows):
            return
        parts = []
        for index, kind in enumerate(KINDS):
            mine = rows[rows["kind"] == index]
            if len(mine):
                size = f"{human_bytes(int(mine['bytes'].sum()))}, " if kind != "kernel" else ""
                device_ms = float((mine["end"] - mine["start"]).sum()) / 1e6
                parts.append(f"{len(mine)} {kind}{'s' if len(mine) > 1 else ''} ({size}{device_ms:.1f} ms)")
        where = f"after the last {label} window" if after else f"before a {label} window"
        self.outside.append(
            f"device work {where}: {', '.join(parts)}; it is in no window and no budget judged it "
            "(put it inside gpuprof.measure() or a step of a measured window to judge it)"
        )

    def reset(self, *, drain: bool = True) -> None:
        """Forget spans, device work and notes already accounted for in a window (or, at
        the start of a test's call, its set-up's). ``drain=False`` reads no records now:
        a forced CUPTI flush slows the launches after it, and what set-up left in the
        buffers is older than ``_since``, which every window and note reads from."""
        if drain:
            self.collect()
        with self._lock:
            self.spans.clear()
            self._device.clear()
            self._notes.clear()
            self._ranges.clear()
            self._since = self.backend.clock.now()
        if self.stacks is not None:
            self.stacks.forget(self._since)
        if self.spans.memory is not None:
            self.spans.memory.forget()

    def keep(self, window: Window, budget: Budget) -> Metrics:
        """Judge ``window`` on the test's budget and keep it."""
        window.verdict = judge(budget, window.metrics)
        self.windows.append(window)
        return window.metrics

    def collect(self) -> None:
        device, notes = self.backend.source.drain()
        finished, still_open = self.backend.source.ranges()
        with self._lock:
            self._ranges.extend(finished)
            self._open_ranges = still_open
            if len(device):
                self._device.append(device)
            self._notes.extend(n for n in notes if n not in self._notes)

    def _joined(self) -> DeviceWork:
        """Every drain's rows as one ``DeviceWork`` (kept joined; the lock is held)."""
        joined = DeviceWork.join(self._device)
        self._device[:] = [joined] if len(joined) else []
        return joined

    def _shared_since(self, started_s: float) -> list[str]:
        """A note where another process used the device during the window."""
        if self.sampler is None:
            return []
        busy = {pid: sm for pid, sm in self.sampler.others(started_s).items() if sm >= OTHER_PROCESS_SM}
        if not busy:
            return []
        who = ", ".join(f"pid {pid} SM up to {sm}%" for pid, sm in sorted(busy.items()))
        return [
            f"another process used this device during the window ({who}): CUPTI records this process's work "
            "only, so its figures miss that load while NVML's include it"
        ]

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
        with self._lock:
            steps = tuple(
                s for s in as_steps(self._steps_at(end), self._ranges_at(end)) if s.end >= start and s.start <= end
            )
            regions = tuple(r for r in self.spans.regions if r.end >= start and r.start <= end)
            every = self._joined()
            rows = every.rows
            device = every.where((rows["end"] > start) & (rows["start"] < end))
            notes = (*self._notes, *(extra or ()))
        device, processes = self._with_children(device, start, end)
        said = process_note(processes)
        tracker = self.spans.memory
        memory = tracker.log(*(marks or ())) if tracker is not None else None
        memory_unseen = tracker.why if tracker is not None else None
        notes = (*notes, *([said] if said else []))
        return Timeline(
            start,
            end,
            self.backend.source.kind.name,
            steps,
            regions,
            device,
            tuple(self.sampler.samples(start, end)) if self.sampler is not None else (),
            notes,
            self.backend.source.sm_limits(),
            gpm,
            None if self.stacks is None else tuple(self.stacks.samples(start, end)),
            self.thread,
            memory,
            memory_unseen,
            processes=processes,
        )

    def _with_children(self, device: DeviceWork, start: int, end: int) -> tuple[DeviceWork, tuple[ProcessFigures, ...]]:
        """The window's device work with its children's, and each process's figures (none
        where the test started no child)."""
        records = self.children.collect() if self.children is not None else []
        kept = []
        for r in records:
            rows = r.work.rows if r.work is not None else None
            inside = rows is not None and bool(((rows["end"] > start) & (rows["start"] < end)).any())
            if inside or (r.started is not None and start <= r.started <= end):
                kept.append(r)
        if not kept:
            return device, ()
        window = (start, end)
        own = process_figures(os.getpid(), "this test's process", None, device, window)
        theirs = [process_figures(r.pid, r.command, r.rank, r.work, window, r.why) for r in kept]
        parts = [r.work.where((r.work.rows["end"] > start) & (r.work.rows["start"] < end)) for r in kept if r.work]
        return DeviceWork.join([device, *parts]), (own, *theirs)

    def _steps_at(self, end: int) -> list[Span]:
        return [*self.spans.steps, *self.spans.open_at(end)]

    def _ranges_at(self, end: int) -> list[Span]:
        """The NVTX ranges since the last reset, those still open as if they ended at
        ``end``; a range opened before the reset counts from it (a range a session-scoped
        fixture opened does not stretch a test's window back into the tests before)."""
        since = self._since
        ranges = [*self._ranges, *(replace(r, end=max(end, r.start)) for r in self._open_ranges)]
        return [replace(r, start=max(r.start, since)) if r.start < since else r for r in ranges if r.end >= since]

    def whole_test(self) -> Window | None:
        """The test as one window, from its first step or region to its last and its device work."""
        self.backend.synchronize()
        self.collect()
        now = self.backend.clock.now()
        with self._lock:
            spans = [*self._steps_at(now), *self.spans.regions, *self._ranges_at(now)]
            if not spans:
                return None
            start = min(s.start for s in spans)
            end = max(s.end for s in spans)
            rows = self._joined().rows
            launched = np.isin(rows["span_id"], [s.span_id for s in spans])
            tail = rows["end"][launched | ((rows["start"] >= start) & (rows["start"] < end))]
        timeline = self.timeline(start, max(end, int(tail.max(initial=end))))
        return Window("test", metrics_mod.compute(timeline, self.pinned_gbps), timeline)
