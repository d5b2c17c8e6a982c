"""Who caused what: the step that issued each piece of device work, and the step each
kernel-idle stretch is charged to. Pure functions over plain data.

Device work belongs to the step that issued it (``issuers``), whenever it ran. Idle is
charged device first: to the steps whose copies or memsets occupied the device then
(the kernels were waiting on them), split evenly among them; where the device did
nothing, to the innermost host step active on each thread, split evenly among the
threads that have one; what neither covers is ``unattributed`` (docs/design.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis.device_work import NO_SPAN, DeviceWork
from pytest_gpuprof.analysis.model import DeviceInterval, Span


def issuers(steps: Sequence[Span], device: Sequence[DeviceInterval]) -> list[int | None]:
    """The ``span_id`` of the step that issued each device interval, ``None`` where none did."""
    ids = issuer_ids(steps, DeviceWork.of(device))
    return [None if i == NO_SPAN else i for i in ids.tolist()]


def issuer_ids(steps: Sequence[Span], device: DeviceWork) -> np.ndarray:
    """The ``span_id`` of the step that issued each row, ``NO_SPAN`` where none did.

    A backend's tag first; else the innermost step open on the issuing ``thread`` at the
    host time the work was ``issued``; else, for a copy, the innermost step open on its
    ``stream`` when it started. Steps of one thread nest (they are context managers), so
    the innermost step open at a time is the latest-started one that contains it, or one
    of its ancestors: numpy looks the last start up and climbs to the enclosing step.
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
    ordered = sorted(spans, key=lambda s: (s.start, -s.end, s.depth))
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


def work_by_step(steps: Sequence[Span], device: DeviceWork) -> dict[int, DeviceWork]:
    """The device work of each step that issued some, by ``span_id``."""
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


def attribute_idle(
    steps: Sequence[Span],
    idle: Sequence[iv.Interval] | np.ndarray,
    transfers: Mapping[str, iv.Intervals] | None = None,
) -> tuple[dict[str, float], float]:
    """Charge each idle stretch, device first: to the steps whose ``transfers`` (copies
    and memsets, by step name) occupied the device then, split evenly among them; the
    rest to the innermost host step of each thread active then.

    ``idle`` is sorted and disjoint (a list, or an (n, 2) array). Returns nanoseconds charged per step name and the
    nanoseconds neither covered; the two add up to the total idle length.
    """
    if not transfers:
        return _charge_lanes(steps, idle)
    lanes = [
        Span(name, -1 - lane, s, e)
        for lane, (name, done) in enumerate(sorted(transfers.items()))
        for s, e in iv.union(done)
    ]
    busy = iv.union((s.start, s.end) for s in lanes)
    if not busy:
        return _charge_lanes(steps, idle)
    lo, hi = (int(idle[0][0]), int(idle[-1][1])) if len(idle) else (0, 0)
    by_device, _ = _charge_lanes(lanes, iv.intersect(idle, busy))
    by_host, unattributed = _charge_lanes(steps, iv.intersect(idle, iv.gaps(busy, (lo, hi))))
    for name, ns in by_device.items():
        by_host[name] = by_host.get(name, 0.0) + ns
    return by_host, unattributed


def _charge_lanes(steps: Sequence[Span], idle: Sequence[iv.Interval] | np.ndarray) -> tuple[dict[str, float], float]:
    """Charge each idle stretch to the innermost step of each thread active then, split
    evenly among the threads that have one.

    The active steps change only where a step opens or closes: between two such points,
    the idle time inside is charged at once (a window can hold a hundred thousand idle
    stretches).
    """
    charged: dict[str, float] = defaultdict(float)
    unattributed = 0.0
    if not len(idle):
        return dict(charged), unattributed
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
    for i, a in enumerate(ordered[:-1]):
        for span in closing.get(a, ()):
            active[span.thread].remove(span)
        for span in opening.get(a, ()):
            if span.start >= lo:
                active[span.thread].append(span)
        stretch = before[i + 1] - before[i]
        if stretch <= 0:
            continue
        innermost = [max(lane, key=lambda s: (s.depth, s.start, s.name)) for lane in active.values() if lane]
        if not innermost:
            unattributed += stretch
            continue
        share = stretch / len(innermost)
        for span in innermost:
            charged[span.name] += share
    return dict(charged), unattributed


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
