"""Who caused what: the step that issued each piece of device work, and the step each
kernel-idle stretch is charged to. Pure functions over plain data.

Device work belongs to the step that issued it (``issuers``), whenever it ran. Idle is
charged device first: to the steps whose copies or memsets occupied the device then
(the kernels were waiting on them), split evenly among them; where the device did
nothing, to the innermost host step active on each thread, split evenly among the
threads that have one; what neither covers is ``unattributed`` (docs/design.md).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis.device_work import NO_SPAN, DeviceWork
from pytest_gpuprof.analysis.model import KINDS, UNATTRIBUTED, DeviceInterval, Span


def issuers(steps: Sequence[Span], device: Sequence[DeviceInterval]) -> list[int | None]:
    """The ``span_id`` of the step that issued each device interval, ``None`` where none did."""
    ids = issuer_ids(steps, DeviceWork.of(device))
    return [None if i == NO_SPAN else i for i in ids.tolist()]


def issuer_ids(steps: Sequence[Span], device: DeviceWork) -> np.ndarray:
    """The ``span_id`` of the step that issued each row, ``NO_SPAN`` where none did.

    A backend's tag first; else the innermost step open on the issuing ``thread`` at the
    host time the work was ``issued``; else, for a copy, the innermost step open on its
    ``stream`` when it started. Work that a thread with no step issued (a framework's
    runtime thread) is nobody's, and ``stepless_note`` counts it: such a thread issues
    the work when it gets to it, not when the step asked for it (on an H200, JAX's
    ``device_put`` copies were issued while the next step was open as often as not), so
    the step open at that instant is not the cause. Steps of one thread nest (they are
    context managers), so the step open at a time is the latest-started one that contains
    it, or one of its ancestors: numpy looks the last start up and climbs to the
    enclosing step.
    """
    rows = device.rows
    out = rows["span_id"].copy()
    by_thread: dict[int, list[Span]] = defaultdict(list)
    by_stream: dict[int, list[Span]] = defaultdict(list)
    for span in steps:
        by_thread[span.thread].append(span)
        if span.stream is not None:
            by_stream[span.stream].append(span)
    untagged = out == NO_SPAN
    by_call = untagged & (rows["issued"] != 0) & np.isin(rows["thread"], list(by_thread))
    by_copy = untagged & ~by_call & device.of_kind("memcpy") & np.isin(rows["stream"], list(by_stream))
    for lanes, asked, lane_of, time_of in (
        (by_thread, by_call, "thread", "issued"),
        (by_stream, by_copy, "stream", "start"),
    ):
        rows_asked = np.flatnonzero(asked)
        lane_ids = rows[lane_of][rows_asked]
        for lane in np.unique(lane_ids).tolist():
            at = rows_asked[lane_ids == lane]
            out[at] = _innermost(lanes[lane], rows[time_of][at])
    return out


def _innermost(spans: Sequence[Span], times: np.ndarray) -> np.ndarray:
    """For each time, the ``span_id`` of the innermost of the nested ``spans`` open then
    (``start <= time <= end``), or ``NO_SPAN``."""
    ordered = sorted(spans, key=_opening_order)
    starts = np.array([s.start for s in ordered], dtype=np.int64)
    ends = np.array([s.end for s in ordered], dtype=np.int64)
    parent = np.full(len(ordered), -1, dtype=np.int64)
    stack: list[int] = []
    for i, span in enumerate(ordered):
        while stack and ends[stack[-1]] < span.start:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    at = np.asarray(times, dtype=np.int64)
    index = np.searchsorted(starts, at, side="right") - 1
    while True:
        climb = np.flatnonzero(index >= 0)
        climb = climb[ends[index[climb]] < at[climb]]
        if not len(climb):
            break
        index[climb] = parent[index[climb]]
    ids = np.array([NO_SPAN, *(s.span_id for s in ordered)], dtype=np.int64)
    return ids[index + 1]


def work_by_step(steps: Sequence[Span], device: DeviceWork, ids: np.ndarray | None = None) -> dict[int, DeviceWork]:
    """The device work of each step that issued some, by ``span_id`` (``ids``: each row's
    issuer, where the caller has them already)."""
    if ids is None:
        ids = issuer_ids(steps, device)
    issued = np.flatnonzero(ids != NO_SPAN)
    if not len(issued):
        return {}
    order = issued[np.argsort(ids[issued], kind="stable")]  # each step's rows in their order
    found, first = np.unique(ids[order], return_index=True)
    if len(found) == 1 and len(order) == len(device):  # one step issued it all
        return {int(found[0]): device}
    groups = np.split(order, first[1:])
    return {span_id: device.where(rows) for span_id, rows in zip(found.tolist(), groups, strict=True)}


def interleaved_note(steps: Sequence[Span]) -> str | None:
    """What the window must say when steps of one thread overlap without nesting (asyncio
    tasks, or callbacks, interleaved on it): a thread's steps are charged as a stack, so
    the kernel-idle while several were open goes to the one opened last."""
    by_thread: dict[int, list[Span]] = defaultdict(list)
    for span in steps:
        by_thread[span.thread].append(span)
    for spans in by_thread.values():
        open_: list[Span] = []
        for span in sorted(spans, key=lambda s: (s.start, s.depth, -s.end)):
            while open_ and open_[-1].end <= span.start:
                open_.pop()
            if open_ and span.end > open_[-1].end:
                outer = open_[-1]
                return (
                    f"steps {outer.name!r} and {span.name!r} of one thread overlap without nesting (asyncio tasks "
                    "or callbacks interleaved on it): the kernel-idle while both were open is charged to the one "
                    "opened last, as if nested"
                )
            open_.append(span)
    return None


def stepless_note(steps: Sequence[Span], device: DeviceWork, ids: np.ndarray, window: iv.Interval) -> str | None:
    """What came from threads that opened no step while the test's own threads did (a
    framework's runtime threads: JAX issues its copies from them, PyTorch its backward
    kernels): counted in the window's figures and in no step's, and said so, never a
    silent 0 on the step that caused it. ``ids``: each row's issuer (``issuer_ids``)."""
    threads = {s.thread for s in steps}
    if not threads or not len(device):
        return None
    rows = device.rows
    inside = (rows["end"] > window[0]) & (rows["start"] < window[1])
    apart = inside & (ids == NO_SPAN) & (rows["thread"] != 0) & ~np.isin(rows["thread"], list(threads))
    if not apart.any():
        return None
    kinds = rows["kind"][apart]
    copies = kinds == KINDS.index("memcpy")
    nbytes = int(rows["bytes"][apart][copies].sum())
    kernels = int(np.count_nonzero(kinds == KINDS.index("kernel")))
    others = len(set(rows["thread"][apart].tolist()))
    return (
        f"{int(np.count_nonzero(copies)):,} copies ({nbytes:,} bytes) and {kernels:,} kernels came from "
        f"{others} thread(s) that opened no step (a framework's runtime threads): they count in the window "
        "and in no step"
    )


def enclosing(steps: Sequence[Span]) -> dict[int, frozenset[str]]:
    """For each step (by ``span_id``), the names of the steps it is nested in on its thread."""
    out: dict[int, frozenset[str]] = {}
    by_thread: dict[int, list[Span]] = defaultdict(list)
    for span in steps:
        by_thread[span.thread].append(span)
    for spans in by_thread.values():
        stack: list[Span] = []
        for span in sorted(spans, key=lambda s: (s.start, -s.end, s.depth)):
            while stack and not (
                stack[-1].depth < span.depth and stack[-1].start <= span.start and span.end <= stack[-1].end
            ):
                stack.pop()
            out[span.span_id] = frozenset(s.name for s in stack)
            stack.append(span)
    return out


def inclusive_idle(
    steps: Sequence[Span],
    idle: Sequence[iv.Interval] | np.ndarray,
    work: Mapping[int, iv.Intervals],
    charged: Mapping[str, float],
) -> dict[str, float]:
    """The idle charged to each step name or to the steps nested inside it (``work``: each
    step's copies and memsets, by ``span_id``). A step with nothing nested keeps its own
    charge (``charged``); an outer one is charged again with its inner steps as part of it."""
    outer = enclosing(steps)
    out = dict(charged)
    for name in sorted({n for names in outer.values() for n in names}):
        as_one = [replace(s, name=name) if name in outer.get(s.span_id, ()) else s for s in steps]
        names = {s.span_id: s.name for s in as_one}
        transfers: dict[str, list[iv.Interval]] = defaultdict(list)
        for span_id, spans in work.items():
            if span_id in names:
                transfers[names[span_id]].extend(map(tuple, np.asarray(spans).reshape(-1, 2).tolist()))
        out[name] = attribute_idle(as_one, idle, transfers)[0].get(name, 0.0)
    return out


@dataclass(frozen=True, slots=True)
class Stretch:
    """A piece of kernel-idle time and whom it is charged to: nanoseconds per step name
    (``UNATTRIBUTED`` for what no step covers), adding up to its length."""

    start: int
    end: int
    shares: dict[str, float]

    @property
    def cause(self) -> str:
        return max(self.shares, key=lambda name: self.shares[name])


def attribute_idle(
    steps: Sequence[Span],
    idle: Sequence[iv.Interval] | np.ndarray,
    transfers: Mapping[str, iv.Intervals] | None = None,
) -> tuple[dict[str, float], float]:
    """Charge each idle stretch, device first: to the steps whose ``transfers`` (copies
    and memsets, by step name) occupied the device then, split evenly among them; the
    rest to the innermost host step of each thread active then.

    ``idle`` is sorted and disjoint (a list, or an (n, 2) array). Returns nanoseconds
    charged per step name and the nanoseconds neither covered; the two add up to the
    total idle length. ``stretches`` cuts the same charges into pieces to draw.
    """
    charged: dict[str, float] = defaultdict(float)
    unattributed = 0.0
    for lanes, part in _passes(steps, idle, transfers):
        segments = _segments(lanes, part)
        if segments is None:
            continue
        _, names, idle_in = segments
        for who, ns in zip(names, idle_in, strict=True):
            if ns <= 0:
                continue
            if not who:
                unattributed += ns
            for name in who:
                charged[name] += ns / len(who)
    return dict(charged), unattributed


def stretches(
    steps: Sequence[Span],
    idle: Sequence[iv.Interval] | np.ndarray,
    transfers: Mapping[str, iv.Intervals] | None = None,
) -> list[Stretch]:
    """The charges of ``attribute_idle`` as pieces of the idle time, in time order: each
    idle stretch cut where the steps charged for it change."""
    out: list[Stretch] = []
    for lanes, part in _passes(steps, idle, transfers):
        segments = _segments(lanes, part)
        if segments is None:
            continue
        points, names, _ = segments
        spans = np.asarray(part, dtype=np.int64).reshape(-1, 2)
        # the cut points are distinct and sorted: a stretch holds those from ``lo`` to
        # ``hi`` (bisected for all stretches at once, where a mask over every cut for each
        # stretch made a window of 50,000 kernels quadratic), and its piece from cut j on
        # is charged to the steps between cut j and the next
        los = np.searchsorted(points, spans[:, 0], side="right").tolist()
        his = np.searchsorted(points, spans[:, 1], side="left").tolist()
        for (start, end), lo, hi in zip(spans.tolist(), los, his, strict=True):
            edges = [start, *points[lo:hi], end]
            for at, (a, b) in enumerate(itertools.pairwise(edges), lo - 1):
                who = names[at]
                shares: dict[str, float] = defaultdict(float)
                for name in who or (UNATTRIBUTED,):
                    shares[name] += (b - a) / max(len(who), 1)
                out.append(Stretch(a, b, dict(shares)))
    out.sort(key=lambda s: s.start)
    merged: list[Stretch] = []
    for s in out:  # neighbours charged to the same steps are one stretch
        last = merged[-1] if merged else None
        if last is not None and last.end == s.start and last.shares.keys() == s.shares.keys():
            merged[-1] = Stretch(last.start, s.end, {n: last.shares[n] + s.shares[n] for n in last.shares})
        else:
            merged.append(s)
    return merged


def unattributed(
    steps: Sequence[Span],
    idle: Sequence[iv.Interval] | np.ndarray,
    transfers: Mapping[str, iv.Intervals] | None = None,
) -> list[iv.Interval]:
    """The idle no step explains, as sorted disjoint stretches: neither under a step's
    copies or memsets nor while a host step was active (what ``attribute_idle`` counts as
    unattributed)."""
    lanes, part = _passes(steps, idle, transfers)[-1]  # the host pass
    if not len(part):
        return []
    window = (int(part[0][0]), int(part[-1][1]))
    active = iv.union((s.start, s.end) for s in lanes if s.end > s.start)
    return iv.intersect(part, iv.gaps(active, window))


def _passes(
    steps: Sequence[Span], idle: Sequence[iv.Interval] | np.ndarray, transfers: Mapping[str, iv.Intervals] | None
) -> list[tuple[Sequence[Span], Sequence[iv.Interval] | np.ndarray]]:
    """Device first: the idle time under copies and memsets, charged to their steps (each
    step a lane of its own), then the rest, charged to the host steps."""
    lanes = [
        Span(name, -1 - lane, s, e)
        for lane, (name, done) in enumerate(sorted((transfers or {}).items()))
        for s, e in iv.union(done)
    ]
    busy = iv.union((s.start, s.end) for s in lanes)
    if not busy:
        return [(steps, idle)]
    lo, hi = (int(idle[0][0]), int(idle[-1][1])) if len(idle) else (0, 0)
    return [(lanes, iv.intersect(idle, busy)), (steps, iv.intersect(idle, iv.gaps(busy, (lo, hi))))]


def _segments(
    steps: Sequence[Span], idle: Sequence[iv.Interval] | np.ndarray
) -> tuple[list[int], list[tuple[str, ...]], list[int]] | None:
    """The window cut where a step opens or closes: the cut points, the innermost step
    of each thread that has one between each point and the next (none: unattributed),
    and the idle time there. ``None`` where there is no idle.

    The active steps change only at those points, so the idle between two of them is
    charged at once (a window can hold a hundred thousand idle stretches).
    """
    if not len(idle):
        return None
    lo, hi = int(idle[0][0]), int(idle[-1][1])
    relevant = [s for s in steps if s.end > lo and s.start < hi and s.end > s.start]
    opening: dict[int, list[Span]] = defaultdict(list)
    closing: dict[int, list[Span]] = defaultdict(list)
    points = {lo, hi}
    for span in relevant:
        opening[span.start].append(span)
        closing[span.end].append(span)
        points.update(p for p in (span.start, span.end) if lo < p < hi)
    ordered = sorted(points)
    before = _idle_before(idle, ordered)

    active: dict[int, list[Span]] = defaultdict(list)
    for span in relevant:
        if span.start < lo:
            active[span.thread].append(span)
    names: list[tuple[str, ...]] = []
    for a in ordered[:-1]:
        for span in closing.get(a, ()):
            active[span.thread].remove(span)
        for span in opening.get(a, ()):
            if span.start >= lo:
                active[span.thread].append(span)
        names.append(tuple(max(lane, key=_depth_first).name for lane in active.values() if lane))
    return ordered, names, [b - a for a, b in itertools.pairwise(before)]


def _depth_first(span: Span) -> tuple[int, int, int]:
    """The innermost of a thread's active steps: the deepest, then the latest opened (at
    one instant, the one opened last: span ids grow as steps open)."""
    return (span.depth, span.start, span.span_id)


def _opening_order(span: Span) -> tuple[int, int, int]:
    """A thread's steps in the order they opened: an enclosing step before those inside
    it, and of two siblings opened at one instant, the one opened first (the lower span
    id). So the last step opened by a time is the innermost open then, or inside it."""
    return (span.start, span.depth, span.span_id)


def _idle_before(idle: Sequence[iv.Interval] | np.ndarray, points: Sequence[int]) -> list[int]:
    """For each point, the idle time before it (``idle`` sorted and disjoint; ``points``
    sorted)."""
    if len(idle) < iv.SMALL:  # a walk beats numpy's per-call cost
        if isinstance(idle, np.ndarray):
            idle = [(s, e) for s, e in idle.tolist()]
        out, done, k = [], 0, 0
        for at in points:
            while k < len(idle) and idle[k][1] <= at:
                done += idle[k][1] - idle[k][0]
                k += 1
            out.append(done + (max(0, at - idle[k][0]) if k < len(idle) else 0))
        return out
    spans = np.asarray(idle, dtype=np.int64)
    starts, ends = spans[:, 0], spans[:, 1]
    done_by = np.r_[0, np.cumsum(ends - starts)]  # idle in the first k stretches
    at_all = np.asarray(points, dtype=np.int64)
    ks = np.searchsorted(ends, at_all, side="right")  # stretches over by then
    partial = np.where(ks < len(starts), np.clip(at_all - starts[np.minimum(ks, len(starts) - 1)], 0, None), 0)
    return (done_by[ks] + partial).tolist()
