"""Change points in a metric's history: where its level shifted between stored runs.

The method, a windowed separation test: a split before run ``k`` is a change point when,
for some window of ``MIN_SIDE`` to ``WINDOW`` runs on each side of it (the widest that
passes is reported),

1. the two sides are separated: every run on one side is above every run on the other,
   so one stray run (an outlier) can never make a change point (a window holding it holds
   a run of the usual level too, and its spread then swallows the shift), and
2. the shift of the side medians is beyond the noise: more than ``NOISE_FACTOR`` times
   the runs' spread around their side's median (the larger side's median absolute
   deviation), and more than ``MIN_SHIFT`` of the level before it;

and of neighbouring splits that pass, only the one with the largest shift is kept. The
windows narrow on either side, so a level that held for as few as ``MIN_SIDE`` runs
(a regression, then its fix) gives two change points, one each way. Pure functions over
run medians.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW = 5
MIN_SIDE = 2
NOISE_FACTOR = 3.0
MIN_SHIFT = 0.005  # of the level before: half a percent


@dataclass(frozen=True, slots=True)
class ChangePoint:
    index: int  # the first run of the new level
    before: float  # the median of the runs before it (its window)
    after: float
    sides: tuple[int, int] = (WINDOW, WINDOW)  # how many runs each side's window held

    @property
    def relative(self) -> float:
        return (self.after - self.before) / self.before if self.before else float("inf")


def change_points(levels: Sequence[float]) -> list[ChangePoint]:
    """The level shifts of a series of run medians, in order."""
    passing = _passing(levels)
    found: list[tuple[float, ChangePoint]] = []
    for k in sorted(passing):
        shift, point = passing[k]
        if found and found[-1][1].index == k - 1:  # neighbours: keep the larger shift
            if shift > found[-1][0]:
                found[-1] = (shift, point)
            continue
        found.append((shift, point))
    return [point for _, point in found]


def _passing(levels: Sequence[float]) -> dict[int, tuple[float, ChangePoint]]:
    """Each split that passes, over the widest windows that pass there, with its shift.

    Every split reads the same windows, so each window's lowest, highest, median and median
    absolute deviation is worked out once, for every start at once (numpy); then each pair
    of widths, widest first, decides the splits no wider pair decided."""
    x = np.asarray(levels, dtype=float)
    n = len(x)
    stats: dict[int, tuple[np.ndarray, ...]] = {}
    for width in range(MIN_SIDE, min(WINDOW, n) + 1):
        runs = np.sort(np.lib.stride_tricks.sliding_window_view(x, width), axis=1)
        median = np.median(runs, axis=1)
        stats[width] = (runs[:, 0], runs[:, -1], median, np.median(np.abs(runs - median[:, None]), axis=1))
    decided = np.zeros(n + 1, dtype=bool)
    out: dict[int, tuple[float, ChangePoint]] = {}
    for b, a in _widths(WINDOW, WINDOW):
        if b + a > n:
            continue
        k = np.arange(b, n - a + 1)  # the splits with b runs before and a after
        low_b, high_b, median_b, mad_b = (v[k - b] for v in stats[b])
        low_a, high_a, median_a, mad_a = (v[k] for v in stats[a])
        shift = np.abs(median_a - median_b)
        passes = (low_a > high_b) | (high_a < low_b)
        passes &= (shift > NOISE_FACTOR * np.maximum(mad_b, mad_a)) & (shift > MIN_SHIFT * np.abs(median_b))
        passes &= ~decided[k]
        for i in np.flatnonzero(passes):
            out[int(k[i])] = (float(shift[i]), ChangePoint(int(k[i]), float(median_b[i]), float(median_a[i]), (b, a)))
        decided[k[passes]] = True  # a wider pair that fails leaves the split to the narrower ones
    return out


@functools.cache
def _widths(most_before: int, most_after: int) -> tuple[tuple[int, int], ...]:
    """The pairs of window widths a split tries, widest first (more runs before first)."""
    widths = [(b, a) for b in range(MIN_SIDE, most_before + 1) for a in range(MIN_SIDE, most_after + 1)]
    return tuple(sorted(widths, key=lambda w: (-(w[0] + w[1]), -w[0])))
