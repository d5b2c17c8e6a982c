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

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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
    found: list[tuple[float, ChangePoint]] = []
    for k in range(MIN_SIDE, len(levels) - MIN_SIDE + 1):
        passed = _shift_at(levels, k)
        if passed is None:
            continue
        shift, point = passed
        if found and found[-1][1].index == k - 1:  # neighbours: keep the larger shift
            if shift > found[-1][0]:
                found[-1] = (shift, point)
            continue
        found.append((shift, point))
    return [point for _, point in found]


def _shift_at(levels: Sequence[float], k: int) -> tuple[float, ChangePoint] | None:
    """The shift at the split before run ``k`` over the widest windows that pass, if any."""
    widths = [
        (b, a) for b in range(MIN_SIDE, min(WINDOW, k) + 1) for a in range(MIN_SIDE, min(WINDOW, len(levels) - k) + 1)
    ]
    for b, a in sorted(widths, key=lambda w: (-(w[0] + w[1]), -w[0])):
        before, after = levels[k - b : k], levels[k : k + a]
        if not (min(after) > max(before) or max(after) < min(before)):
            continue
        low, high = statistics.median(before), statistics.median(after)
        shift = abs(high - low)
        noise = max(_mad(before), _mad(after))
        if shift > NOISE_FACTOR * noise and shift > MIN_SHIFT * abs(low):
            return shift, ChangePoint(k, low, high, (b, a))
    return None


def _mad(values: Sequence[float]) -> float:
    middle = statistics.median(values)
    return statistics.median(abs(v - middle) for v in values)
