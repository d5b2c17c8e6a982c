"""Change points in a metric's history: where its level shifted between stored runs.

The method, a windowed separation test: a split before run ``k`` is a change point when,
for some window of ``MIN_SIDE`` to ``WINDOW`` runs on each side of it (the widest that
passes is reported),

1. the two sides are separated: every run on one side is above every run on the other,
   so one stray run (an outlier) can never make a change point (a window holding it holds
   a run of the usual level too, and its spread then swallows the shift), and
2. the shift of the side means is beyond the noise: more than ``Z`` standard errors, the
   runs' noise read from the whole history (the median distance between neighbouring
   runs, which a change of level moves by one pair only), and more than ``MIN_SHIFT`` of
   the level before it;

and of neighbouring splits that pass, only the one with the largest shift is kept. The
windows narrow on either side, so a level that held for as few as ``MIN_SIDE`` runs
(a regression, then its fix) gives two change points, one each way. ``Z`` is set so that
histories of 20 independent runs at 1% noise show one about once in 25, while a 5% shift
held for three runs is found at its first run 4 times in 5 (``tests/analysis/
test_changepoints.py``, seeded: 16 and 332 of 400); windows of two runs a side showed one
in nearly every such history. Pure functions over run medians."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW = 5
MIN_SIDE = 3
Z = 4.2  # standard errors of the shift of the side means
MIN_SHIFT = 0.005  # of the level before: half a percent
# the median of |a - b| for two independent normal runs, in their sd: sqrt(2) x 0.6745
_NEIGHBOURS = 0.9539


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
    """Each split that passes, over the widest windows that pass there, with its shift."""
    x = np.asarray(levels, dtype=float)
    n = len(x)
    noise = float(np.median(np.abs(np.diff(x)))) / _NEIGHBOURS if n > 1 else 0.0
    out: dict[int, tuple[float, ChangePoint]] = {}
    for k in range(MIN_SIDE, n - MIN_SIDE + 1):
        for b, a in _widths(min(WINDOW, k), min(WINDOW, n - k)):
            before, after = x[k - b : k], x[k : a + k]
            if not (after.min() > before.max() or after.max() < before.min()):
                continue
            gap = abs(float(after.mean() - before.mean()))
            median_b, median_a = float(np.median(before)), float(np.median(after))
            shift = abs(median_a - median_b)
            if shift <= MIN_SHIFT * abs(median_b) or gap <= Z * noise * math.sqrt(1 / a + 1 / b):
                continue
            out[k] = (shift, ChangePoint(k, median_b, median_a, (b, a)))
            break  # the widest pair that passes is the one reported
    return out


@functools.cache
def _widths(most_before: int, most_after: int) -> tuple[tuple[int, int], ...]:
    """The pairs of window widths a split tries, widest first (more runs before first)."""
    widths = [(b, a) for b in range(MIN_SIDE, most_before + 1) for a in range(MIN_SIDE, most_after + 1)]
    return tuple(sorted(widths, key=lambda w: (-(w[0] + w[1]), -w[0])))
