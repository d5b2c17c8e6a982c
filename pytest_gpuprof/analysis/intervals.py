"""Interval arithmetic on half-open ``[start, end)`` nanosecond intervals.

Pure functions on plain tuples, or an (n, 2) array of starts and ends; everything the
metrics need and nothing more. A window can hold a hundred thousand kernels, so union and
clip work on numpy arrays inside, and on plain Python for the few intervals of a step or
a copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

Interval = tuple[int, int]
# below this many intervals, plain Python is faster than numpy's per-call cost
SMALL = 64


Intervals = Iterable[Interval] | np.ndarray


def _listed(intervals: Intervals) -> list[Interval] | np.ndarray:
    """A list, or an (n, 2) array; a short array as a list (plain Python is faster there)."""
    if isinstance(intervals, np.ndarray):
        return intervals if len(intervals) >= SMALL else [(s, e) for s, e in intervals.tolist()]
    return intervals if isinstance(intervals, list) else list(intervals)


def _array(intervals: Sequence[Interval] | np.ndarray) -> np.ndarray:
    """(n, 2) int64 starts and ends."""
    return np.asarray(intervals, dtype=np.int64).reshape(-1, 2)


def _pairs(starts: np.ndarray, ends: np.ndarray) -> list[Interval]:
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def union(intervals: Intervals) -> list[Interval]:
    """Sorted, disjoint, non-touching intervals covering exactly the input's points."""
    listed = _listed(intervals)
    if isinstance(listed, list) and len(listed) < SMALL:
        out: list[Interval] = []
        for s, e in sorted(i for i in listed if i[1] > i[0]):
            if out and s <= out[-1][1]:
                if e > out[-1][1]:
                    out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out
    merged = _union_array(_array(listed))
    return _pairs(merged[:, 0], merged[:, 1])


def _union_array(spans: np.ndarray) -> np.ndarray:
    spans = spans[spans[:, 1] > spans[:, 0]]
    if not len(spans):
        return spans
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    starts, reach = spans[:, 0], np.maximum.accumulate(spans[:, 1])
    # an interval opens a new piece where it starts after everything before it ended
    first = np.flatnonzero(np.r_[True, starts[1:] > reach[:-1]])
    last = np.r_[first[1:] - 1, len(starts) - 1]
    return np.stack([starts[first], reach[last]], axis=1)


def clip(intervals: Intervals, window: Interval) -> list[Interval]:
    """The parts of ``intervals`` inside ``window``; empty parts dropped."""
    listed = _listed(intervals)
    lo, hi = window
    if isinstance(listed, list) and len(listed) < SMALL:
        return [(max(s, lo), min(e, hi)) for s, e in listed if min(e, hi) > max(s, lo)]
    inside = _clip_array(_array(listed), window)
    return _pairs(inside[:, 0], inside[:, 1])


def _clip_array(spans: np.ndarray, window: Interval) -> np.ndarray:
    lo, hi = window
    clipped = np.stack([np.maximum(spans[:, 0], lo), np.minimum(spans[:, 1], hi)], axis=1)
    return clipped[clipped[:, 1] > clipped[:, 0]]


def length(intervals: Intervals) -> int:
    """Total length of the union of ``intervals``."""
    listed = _listed(intervals)
    if isinstance(listed, list) and len(listed) < SMALL:
        return sum(e - s for s, e in union(listed))
    merged = _union_array(_array(listed))
    return int((merged[:, 1] - merged[:, 0]).sum())


def merged(intervals: np.ndarray, window: Interval) -> np.ndarray:
    """``union(clip(intervals, window))`` of an (n, 2) array, as an array."""
    return _union_array(_clip_array(_array(intervals), window))


def covered_length(intervals: Intervals, window: Interval) -> int:
    """Length of the union of ``intervals`` inside ``window``."""
    listed = _listed(intervals)
    if isinstance(listed, list) and len(listed) < SMALL:
        return length(clip(listed, window))
    return length(_clip_array(_array(listed), window))


def gaps(disjoint: Sequence[Interval] | np.ndarray, window: Interval) -> list[Interval]:
    """The parts of ``window`` that the sorted disjoint intervals leave uncovered."""
    listed = _listed(disjoint)
    if isinstance(listed, np.ndarray):
        uncovered = holes(listed, window)
        return _pairs(uncovered[:, 0], uncovered[:, 1])
    lo, hi = window
    out: list[Interval] = []
    cursor = lo
    for s, e in listed:
        if e <= lo or s >= hi:
            continue
        if s > cursor:
            out.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < hi:
        out.append((cursor, hi))
    return out


def holes(disjoint: np.ndarray, window: Interval) -> np.ndarray:
    """``gaps`` of an (n, 2) array of sorted disjoint intervals, as an array."""
    lo, hi = window
    inside = _clip_array(_array(disjoint), window)
    starts, ends = np.r_[lo, inside[:, 1]], np.r_[inside[:, 0], hi]
    kept = ends > starts
    return np.stack([starts[kept], ends[kept]], axis=1)


def intersect(a: Sequence[Interval] | np.ndarray, b: Sequence[Interval] | np.ndarray) -> list[Interval]:
    """The points in both ``a`` and ``b``, each sorted and disjoint."""
    listed_a, listed_b = _listed(a), _listed(b)
    if isinstance(listed_a, np.ndarray) or isinstance(listed_b, np.ndarray):
        if not len(listed_a) or not len(listed_b):
            return []
        # what neither misses: outside the gaps of either
        span = (min(listed_a[0][0], listed_b[0][0]), max(listed_a[-1][1], listed_b[-1][1]))
        missed = np.concatenate([holes(_array(listed_a), span), holes(_array(listed_b), span)])
        both = holes(_union_array(missed), span)
        return _pairs(both[:, 0], both[:, 1])
    out: list[Interval] = []
    i = j = 0
    while i < len(listed_a) and j < len(listed_b):
        lo, hi = max(listed_a[i][0], listed_b[j][0]), min(listed_a[i][1], listed_b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if listed_a[i][1] < listed_b[j][1]:
            i += 1
        else:
            j += 1
    return out
