"""Interval arithmetic on half-open ``[start, end)`` nanosecond intervals.

Pure functions on plain tuples; everything the metrics need and nothing more. A window
can hold a hundred thousand kernels, so union and clip work on numpy arrays inside, and
on plain Python for the few intervals of a step or a copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

Interval = tuple[int, int]
# below this many intervals, plain Python is faster than numpy's per-call cost
SMALL = 64


def _array(intervals: Iterable[Interval]) -> np.ndarray:
    """(n, 2) int64 starts and ends."""
    return np.array(intervals if isinstance(intervals, list) else list(intervals), dtype=np.int64).reshape(-1, 2)


def _pairs(starts: np.ndarray, ends: np.ndarray) -> list[Interval]:
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-touching intervals covering exactly the input's points."""
    listed = intervals if isinstance(intervals, list) else list(intervals)
    if len(listed) < SMALL:
        out: list[Interval] = []
        for s, e in sorted(i for i in listed if i[1] > i[0]):
            if out and s <= out[-1][1]:
                if e > out[-1][1]:
                    out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out
    spans = _array(listed)
    spans = spans[spans[:, 1] > spans[:, 0]]
    if not len(spans):
        return []
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    starts, reach = spans[:, 0], np.maximum.accumulate(spans[:, 1])
    # an interval opens a new piece where it starts after everything before it ended
    first = np.flatnonzero(np.r_[True, starts[1:] > reach[:-1]])
    last = np.r_[first[1:] - 1, len(starts) - 1]
    return _pairs(starts[first], reach[last])


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """The parts of ``intervals`` inside ``window``; empty parts dropped."""
    listed = intervals if isinstance(intervals, list) else list(intervals)
    lo, hi = window
    if len(listed) < SMALL:
        return [(max(s, lo), min(e, hi)) for s, e in listed if min(e, hi) > max(s, lo)]
    spans = _array(listed)
    starts, ends = np.maximum(spans[:, 0], lo), np.minimum(spans[:, 1], hi)
    inside = ends > starts
    return _pairs(starts[inside], ends[inside])


def length(intervals: Iterable[Interval]) -> int:
    """Total length of the union of ``intervals``."""
    return sum(e - s for s, e in union(intervals))


def covered_length(intervals: Iterable[Interval], window: Interval) -> int:
    """Length of the union of ``intervals`` inside ``window``."""
    return length(clip(intervals, window))


def gaps(disjoint: Sequence[Interval], window: Interval) -> list[Interval]:
    """The parts of ``window`` that the sorted disjoint intervals leave uncovered."""
    lo, hi = window
    out: list[Interval] = []
    cursor = lo
    for s, e in disjoint:
        if e <= lo or s >= hi:
            continue
        if s > cursor:
            out.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < hi:
        out.append((cursor, hi))
    return out


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The points in both ``a`` and ``b``, each sorted and disjoint."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out
