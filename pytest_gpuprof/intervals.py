"""Interval arithmetic on half-open ``[start, end)`` nanosecond intervals.

Pure functions on plain tuples; everything the metrics need and nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Interval = tuple[int, int]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-touching intervals covering exactly the input's points."""
    merged: list[Interval] = []
    for start, end in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """The parts of ``intervals`` inside ``window``; empty parts dropped."""
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


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
