"""What a backend's capture source said since the collector's last reset: the device work
drained from it, its notes and NVTX ranges; and what the window adds from outside the
process (its child processes' records, NVML's other processes)."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import KINDS, Sample, Span
from pytest_gpuprof.analysis.processes import ProcessFigures
from pytest_gpuprof.analysis.processes import figures as process_figures
from pytest_gpuprof.output.text import human_bytes

if TYPE_CHECKING:
    from pytest_gpuprof.capture.children import ChildRecord, ChildWatch
    from pytest_gpuprof.capture.trace_source import TraceSource


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


class Drained:
    """The source's records since ``since``. ``lock`` guards them: ``collect`` may run on
    another thread than the window's cut, which holds it while it reads."""

    def __init__(self, source: TraceSource, since: int) -> None:
        self.source = source
        self.lock = threading.Lock()
        self.since = since
        self._device: list[DeviceWork] = []  # drained, not yet joined
        self._notes: list[str] = []
        # NVTX ranges: those that ended, and those open at the last drain; of both, only the
        # part since ``since`` is this collector's (``ranges_at``)
        self._ranges: list[Span] = []
        self._open_ranges: list[Span] = []

    def collect(self) -> None:
        device, notes = self.source.drain()
        finished, still_open = self.source.ranges()
        with self.lock:
            self._ranges.extend(finished)
            self._open_ranges = still_open
            if len(device):
                self._device.append(device)
            self._notes.extend(n for n in notes if n not in self._notes)

    def clear(self, since: int) -> None:
        """Forget everything collected (the lock is held)."""
        self._device.clear()
        self._notes.clear()
        self._ranges.clear()
        self.since = since

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self._notes)

    def joined(self) -> DeviceWork:
        """Every drain's rows as one ``DeviceWork`` (kept joined; the lock is held)."""
        joined = DeviceWork.join(self._device)
        self._device[:] = [joined] if len(joined) else []
        return joined

    def ranges_at(self, end: int) -> list[Span]:
        """The NVTX ranges since ``since``, those still open as if they ended at ``end``; a
        range opened before counts from it (a range a session-scoped fixture opened does not
        stretch a test's window back into the tests before)."""
        since = self.since
        ranges = [*self._ranges, *(replace(r, end=max(end, r.start)) for r in self._open_ranges)]
        return [replace(r, start=max(r.start, since)) if r.start < since else r for r in ranges if r.end >= since]

    def outside(self, label: str, *, after: bool) -> str | None:
        """The line that says what device work ran since ``since`` and outside every window
        (before a ``label`` window, or ``after`` the last one); None where none ran."""
        with self.lock:
            rows = self.joined().rows
            rows = rows[rows["start"] >= self.since]
        if not len(rows):
            return None
        parts = []
        for index, kind in enumerate(KINDS):
            mine = rows[rows["kind"] == index]
            if len(mine):
                size = f"{human_bytes(int(mine['bytes'].sum()))}, " if kind != "kernel" else ""
                device_ms = float((mine["end"] - mine["start"]).sum()) / 1e6
                parts.append(f"{len(mine)} {kind}{'s' if len(mine) > 1 else ''} ({size}{device_ms:.1f} ms)")
        where = f"after the last {label} window" if after else f"before a {label} window"
        return (
            f"device work {where}: {', '.join(parts)}; it is in no window and no budget judged it "
            "(put it inside gpuprof.measure() or a step of a measured window to judge it)"
        )


def shared_since(sampler: Sampler | None, started_s: float) -> list[str]:
    """A note where another process used the device since ``started_s`` (wall time)."""
    if sampler is None:
        return []
    busy = {pid: sm for pid, sm in sampler.others(started_s).items() if sm >= OTHER_PROCESS_SM}
    if not busy:
        return []
    who = ", ".join(f"pid {pid} SM up to {sm}%" for pid, sm in sorted(busy.items()))
    return [
        f"another process used this device during the window ({who}): CUPTI records this process's work "
        "only, so its figures miss that load while NVML's include it"
    ]


def with_children(
    children: ChildWatch | None, device: DeviceWork, start: int, end: int
) -> tuple[DeviceWork, tuple[ProcessFigures, ...]]:
    """The window's device work with its children's, and each process's figures (none where
    the test started no child)."""
    kept: list[ChildRecord] = []
    parts: list[DeviceWork] = []
    for r in children.collect() if children is not None else []:
        inside = r.work.where((r.work.rows["end"] > start) & (r.work.rows["start"] < end)) if r.work else None
        if inside is not None and len(inside):
            parts.append(inside)
            kept.append(r)
        elif r.started is not None and start <= r.started <= end:  # started in the window, no work seen in it
            kept.append(r)
    if not kept:
        return device, ()
    window = (start, end)
    own = process_figures(os.getpid(), "this test's process", None, device, window)
    theirs = [process_figures(r.pid, r.command, r.rank, r.work, window, r.why) for r in kept]
    return DeviceWork.join([device, *parts]), (own, *theirs)
