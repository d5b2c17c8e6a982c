"""A window's device memory from its marks (``capture.memory``): the peak of what its code
held, the step open at the peak, each step's peak, what the window allocated and never
freed. Pure code.

The marks cut the window into stretches at its edges and its steps' edges (ordered by a
count, not by time: host stamps can tie), so the steps open over a stretch are the same
all through it, and each stretch's peak is the source's own: ``peak_bytes`` is the highest stretch peak over what was held when the window began,
a step's ``memory_peak_bytes`` the highest over the stretches it was open for,
``peak_step`` the innermost step open over the stretch of the peak.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from pytest_gpuprof.analysis.model import Allocation, MemoryLog, MemoryMark, Span

# the paths of the peaks (``MemoryMetrics.bounds``' keys): the window's, and a step's
PEAK = "memory.peak_bytes"


def step_peak(name: str) -> str:
    return f"steps.{name}.memory_peak_bytes"


LARGEST = 3  # the allocations a breach's message names
SITES = 20  # the places of the allocations live at the peak that a window keeps (``--gpu-memory-top``)


@dataclass(frozen=True, slots=True)
class Held:
    """An allocation named in a message: its size, where the user's code made it, and the
    innermost step open then."""

    nbytes: int
    where: str
    step: str | None
    count: int = 1  # the allocations it stands for (a site's, in ``sites``)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes": self.nbytes, "where": self.where, "step": self.step}
        if self.count != 1:
            out["count"] = self.count
        return out


@dataclass(frozen=True, slots=True)
class Kept:
    """An allocation a window made and had not freed by its end: its count (the tracker's
    ``seq``), as a message names it, and every step open when it was made (the outer ones
    too: a step's leak counts what the steps nested in it kept)."""

    seq: int
    held: Held
    steps: frozenset[str]


class Live(NamedTuple):
    """What a test's allocators hold as its call ends: the counts of the allocations still
    live (``None``: some source does not see them one by one) and the bytes held."""

    seqs: frozenset[int] | None
    held: int


@dataclass(frozen=True, slots=True)
class MemoryMetrics:
    peak_bytes: int | None  # ``None``: known as a range only (``bounds``)
    reserved_peak_bytes: int | None
    peak_step: str | None
    source: str
    # the steps around ``peak_step`` at the peak, outermost first (for the message)
    peak_within: tuple[str, ...] = ()
    # allocated in the window and not freed by the test's call's end (``None``: not seen);
    # by the window's end until the call ends (``at_call_end``)
    leaked_bytes: int | None = None
    largest: tuple[Held, ...] = ()  # live at the peak, largest first (sources that see each one)
    leaks: tuple[Held, ...] = ()  # per step: what it allocated and the test's call never freed
    # the places of what was live at the peak, each with its bytes summed, largest first
    sites: tuple[Held, ...] = ()
    # what the frameworks' pools kept at the window's end without the code holding it
    # (PyTorch's reserved over its allocated, CuPy's pool over its used): a cache, not a leak
    cached_bytes: int | None = None
    note: str | None = None
    # per step: what it and the steps nested in it allocated and the test's call never freed
    # (``None``: the source does not see allocations one by one)
    step_leaks: Mapping[str, int] | None = None
    # the figures known as a range only, by path (``memory.peak_bytes``, ``steps.NAME.memory_peak_bytes``):
    # their least and most, where the source tells the process's peak only (JAX's statistics)
    bounds: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # what the window kept, one by one (``None``: a source reads its counters only), and what
    # the counters held at its start: its leak is judged again as the test's call ends
    kept: tuple[Kept, ...] | None = None
    start_held: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "peak_bytes": self.peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "peak_step": self.peak_step,
            "source": self.source,
            "leaked_bytes": self.leaked_bytes,
            "cached_bytes": self.cached_bytes,
        }
        if self.sites:
            out["sites"] = [h.to_dict() for h in self.sites]
        if self.largest:
            out["largest"] = [h.to_dict() for h in self.largest]
        if self.leaks:
            out["leaks"] = [h.to_dict() for h in self.leaks]
        if self.note:
            out["note"] = self.note
        if self.bounds:
            out["bounds"] = {path: list(lo_hi) for path, lo_hi in self.bounds.items()}
        return out


def _innermost(open_: Sequence[int], spans: Mapping[int, Span]) -> Span | None:
    """The innermost of the steps open (span ids): the deepest, the latest begun."""
    steps = [spans[i] for i in open_ if i in spans]
    return max(steps, key=lambda s: (s.depth, s.start, s.span_id), default=None)


def highest(peaks: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """The highest of some peaks, each known as its least and most (a figure: both equal),
    over what the window began with (never below it): the highest least and the highest
    most. A peak known as a range only reaches at most the process's peak then, so the
    highest is exact wherever an exact peak reaches every range's top."""
    lows, highs = zip(*peaks, strict=True)
    return max(*lows, 0), max(*highs, 0)


class _Seen(NamedTuple):
    """What the allocations seen one by one tell of a window: the largest held at its peak,
    what it kept by step, the places that held the most, and, where every allocation is
    seen, what it kept (``leaked``: their bytes; ``None``: the counters' difference)."""

    largest: tuple[Held, ...] = ()
    leaks: tuple[Held, ...] = ()
    sites: tuple[Held, ...] = ()
    step_leaks: dict[str, int] | None = None
    kept: tuple[Kept, ...] | None = None
    leaked: int | None = None


def _one_by_one(log: MemoryLog, marks: list[MemoryMark], spans: dict[int, Span], peak_seq: int | None) -> _Seen:
    if log.allocations is None:
        return _Seen()
    first, last = marks[0].seq, marks[-1].seq
    mine = [a for a in log.allocations if first <= a.seq <= last]
    edges = [m.seq for m in marks]
    kept = [
        Kept(a.seq, _held(a, spans), _open_at(a.seq, edges, marks, spans))
        for a in mine
        if a.end_seq is None or a.end_seq > last
    ]
    largest: tuple[Held, ...] = ()
    sites: tuple[Held, ...] = ()
    if peak_seq is not None:
        live = [a for a in mine if a.seq <= peak_seq and (a.end_seq is None or a.end_seq > peak_seq)]
        largest = tuple(_held(a, spans) for a in sorted(live, key=lambda a: (-a.nbytes, a.seq))[:LARGEST])
        sites = _by_place(live, spans)[:SITES]
    if not log.every:  # what the window kept: the counters' difference
        return _Seen(largest, _by_step(kept), sites)
    leaked = sum(k.held.nbytes for k in kept)
    return _Seen(largest, _by_step(kept), sites, _inclusive(kept, spans), tuple(kept), leaked)


def compute(log: MemoryLog, steps: Sequence[Span]) -> tuple[MemoryMetrics | None, dict[str, int | None]]:
    """The window's memory figures and each step's peak (bytes over the window's start;
    ``None`` where it is known as a range only: ``MemoryMetrics.bounds``)."""
    marks = sorted(log.marks, key=lambda m: m.seq)
    if len(marks) < 2:
        return None, {}
    spans = {s.span_id: s for s in steps}
    base = marks[0].held
    stretches = list(itertools.pairwise(marks))  # the steps open over each: those after its first edge
    rises = [after.peak - base for _, after in stretches]
    lows = [(after.peak if after.peak_low is None else after.peak_low) - base for _, after in stretches]
    bounds: dict[str, tuple[int, int]] = {}
    window = highest(zip(lows, rises, strict=True))
    if window[0] < window[1]:
        bounds[PEAK] = window
    top = max(range(len(rises)), key=lambda i: rises[i])
    # a window that never held more than it began with has no peak, so no step reached it;
    # nor is the step at the peak known where the peak is a range
    open_at_peak = stretches[top][0].open if rises[top] > 0 and PEAK not in bounds else ()
    at_peak = _innermost(open_at_peak, spans)
    within = sorted((spans[i] for i in open_at_peak if i in spans), key=lambda s: (s.depth, s.start))
    step_peaks = _step_peaks([before for before, _ in stretches], spans, lows, rises, bounds)
    reserved = [a.reserved_peak for _, a in stretches if a.reserved_peak is not None]
    seen = _one_by_one(log, marks, spans, stretches[top][1].peak_seq)
    end = marks[-1]
    metrics = MemoryMetrics(
        peak_bytes=None if PEAK in bounds else window[1],
        reserved_peak_bytes=max(reserved) if reserved else None,
        peak_step=at_peak.name if at_peak is not None else None,
        source=log.source,
        peak_within=tuple(s.name for s in within if s is not at_peak),
        leaked_bytes=max(end.held - base, 0) if seen.leaked is None else seen.leaked,
        largest=seen.largest,
        leaks=seen.leaks,
        step_leaks=seen.step_leaks,
        sites=seen.sites,
        cached_bytes=None if end.reserved is None else max(end.reserved - end.held, 0),
        note=log.note,
        bounds=bounds,
        kept=seen.kept,
        start_held=base,
    )
    return metrics, step_peaks


def at_call_end(m: MemoryMetrics, live: Live) -> MemoryMetrics:
    """The window's leak as its test's call ends: what it kept and the test still holds
    then; a buffer freed after the window, before the call ended, is no leak. Exact where
    every source sees each allocation; from the counters otherwise: at most what the window
    kept, and at most what is held now over what the window began with (a test that freed
    everything it kept reads 0; one that kept part reads the window's own figure where the
    counters cannot tell which part)."""
    if not m.leaked_bytes:
        return m
    if m.kept is not None and live.seqs is not None:
        still = tuple(k for k in m.kept if k.seq in live.seqs)
        if len(still) == len(m.kept):
            return m
        return replace(
            m,
            leaked_bytes=sum(k.held.nbytes for k in still),
            leaks=_by_step(still),
            step_leaks=None if m.step_leaks is None else {name: 0 for name in m.step_leaks} | _inclusive(still, {}),
            kept=still,
        )
    if m.start_held is None:
        return m
    leaked = min(m.leaked_bytes, max(live.held - m.start_held, 0))
    return m if leaked == m.leaked_bytes else replace(m, leaked_bytes=leaked, leaks=m.leaks if leaked else ())


def _step_peaks(
    starts: Sequence[MemoryMark],
    spans: Mapping[int, Span],
    lows: Sequence[int],
    rises: Sequence[int],
    bounds: dict[str, tuple[int, int]],
) -> dict[str, int | None]:
    """Each step's peak: the highest of the stretches it was open over (open at the
    stretch's first edge, ``starts``); ``None``, with its range put in ``bounds``, where
    that is known as a range only."""
    by_step: dict[str, list[int]] = defaultdict(list)
    for i, start in enumerate(starts):
        for name in {spans[j].name for j in start.open if j in spans}:
            by_step[name].append(i)
    peaks: dict[str, int | None] = {}
    for name, at in by_step.items():
        step = highest((lows[i], rises[i]) for i in at)
        if step[0] < step[1]:
            bounds[step_peak(name)] = step
        peaks[name] = step[1] if step[0] == step[1] else None
    return peaks


def _held(a: Allocation, spans: Mapping[int, Span]) -> Held:
    step = spans.get(a.span_id) if a.span_id is not None else None
    return Held(a.nbytes, a.where, step.name if step is not None else None)


def _by_place(live: Sequence[Allocation], spans: Mapping[int, Span]) -> tuple[Held, ...]:
    """The places of ``live``: each one's bytes and count, at the step of its largest."""
    total: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    largest: dict[str, Allocation] = {}
    for a in live:
        total[a.where] += a.nbytes
        count[a.where] += 1
        if a.where not in largest or a.nbytes > largest[a.where].nbytes:
            largest[a.where] = a
    order = sorted(total, key=lambda where: (-total[where], where))
    return tuple(Held(total[w], w, _held(largest[w], spans).step, count[w]) for w in order)


def _open_at(seq: int, edges: Sequence[int], marks: Sequence[MemoryMark], spans: Mapping[int, Span]) -> frozenset[str]:
    """The steps open at the count ``seq``: those of the mark before it (``edges``: the
    marks' counts; the marks say which steps were open over each stretch)."""
    at = bisect.bisect_left(edges, seq) - 1
    return frozenset() if at < 0 else frozenset(spans[i].name for i in marks[at].open if i in spans)


def _inclusive(kept: Iterable[Kept], spans: Mapping[int, Span]) -> dict[str, int]:
    """Each step's bytes of ``kept``: the allocations made while it was open, in it or in a
    step nested in it, so that a budget on an outer step sees inside it (every step of
    ``spans`` listed, 0 where it kept nothing)."""
    out: dict[str, int] = {s.name: 0 for s in spans.values()}
    for k in kept:
        for name in k.steps:
            out[name] = out.get(name, 0) + k.held.nbytes
    return out


def _by_step(kept: Iterable[Kept]) -> tuple[Held, ...]:
    """What each step allocated and never freed: its bytes, at the place of its largest."""
    total: dict[str | None, int] = defaultdict(int)
    largest: dict[str | None, Held] = {}
    for k in kept:
        step = k.held.step
        total[step] += k.held.nbytes
        if step not in largest or k.held.nbytes > largest[step].nbytes:
            largest[step] = k.held
    return tuple(
        Held(nbytes, largest[step].where, step) for step, nbytes in sorted(total.items(), key=lambda kv: -kv[1])
    )
