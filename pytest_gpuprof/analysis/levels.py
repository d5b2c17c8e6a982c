"""The level a history of saved runs holds now, read so that no run or runner fools it.

A history is the medians of a test's newest saved runs, newest first. Its plain mean and sd
(``Spread.of``) rest on normally distributed, steady run levels; the runners teams have
break that three ways (docs/gates.md, "On the runners teams have"):

- **one run far from all the others** (a hiccup, a bad commit reverted): it would rule the
  mean and the sd for as long as it is in the history. A run that alone lies further from
  the others' mean than unchanged runs ever do (``ALONE``) counts as if it lay at that
  edge (its influence bounded: it still widens the spread, as a heavy tail should), and a
  new run where it lay is no regression the history can tell;
- **a change of level** (a merge that moved main, a runner that switched speed): the newest
  runs after the largest clear shift (``SHIFT``) are the level,
  their spread pooled with that of the runs before; with fewer than ``LEVEL_RUNS`` of them
  the history straddles the change and decides nothing past the bound. A new run at a
  figure the runs before the change held is no regression either: a runner of two speeds
  goes back and forth between them;
- **a drift**: where the runs' levels climb (a slope clear at ``DRIFT`` one-sided), a run
  past the bound that the level reached by now explains is no regression.

What is left out is kept (``Spread.aside``) and said. Each table below is the 99.9th
percentile of its statistic over 200,000 histories of steady normal runs (``python
benchmarks/level_tables.py``): such a history is read as one level 998 times in 1,000, as
the bound's rate assumes (at the 99th percentile, the runs left out made unchanged runs
fail 60% more often than stated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pytest_gpuprof.analysis.run_spread import Aside, Spread, t_quantile

# fewer runs than this: the plain mean and sd
FEWEST = 5
# runs after a change that make a level of their own
LEVEL_RUNS = 3
# a run's distance from the others' mean, in their sd, past which it stands alone, by runs
ALONE = {5: 26.06, 6: 15.15, 7: 11.41, 8: 9.34, 9: 8.21, 10: 7.47}
# the largest two-sample t over the history's splits past which its level changed, by runs
SHIFT = {6: 11.47, 7: 9.33, 8: 8.07, 9: 7.22, 10: 6.77}
# a drift is a least-squares slope clear at this one-sided level
DRIFT = 0.05


def learn(medians: Sequence[float], exact: bool = False, comparisons: int = 1) -> Spread:
    """The spread and level of a history (``medians``, newest first) as the gate reads it;
    ``comparisons``: how many gated comparisons the run makes (``Spread.comparisons``)."""
    n = len(medians)
    if n < FEWEST:
        plain = Spread.of(medians, exact)
        return Spread(plain.runs, plain.sd, plain.center, comparisons=comparisons)
    runs = np.asarray(medians, dtype=float)
    at = np.arange(n)
    aside: list[Aside] = []
    alone = _alone(runs)
    kept = runs.copy()
    if alone is not None:
        aside.append(Aside(float(runs[alone]), alone, True))
        kept[alone] = _bounded(runs, alone)
    split = _shift(kept)
    reach = (float(kept.min()), float(kept.max()))
    if split is not None and split < LEVEL_RUNS:
        sd, center = float(np.std(kept, ddof=1)), float(np.mean(kept))
        return Spread(len(kept), sd, center, comparisons=comparisons, aside=tuple(aside), changed=split, reach=reach)
    drift = _drift(kept, at.astype(float))
    if split is not None:
        new, old = kept[:split], kept[split:]
        aside += [Aside(float(v), int(i), False) for v, i in zip(old, at[split:], strict=True)]
        reach = (float(new.min()), float(new.max()))
        pooled = ((new - new.mean()) ** 2).sum() + ((old - old.mean()) ** 2).sum()
        df = len(kept) - 2
        sd = math.sqrt(pooled / df)
        return Spread(split, sd, float(new.mean()), df, comparisons, tuple(aside), drift, reach=reach)
    df = len(kept) - 1
    return Spread(
        len(kept), float(np.std(kept, ddof=1)), float(kept.mean()), df, comparisons, tuple(aside), drift, reach=reach
    )


def _bounded(runs: np.ndarray, alone: int) -> float:
    """The run ``alone`` brought back to the edge of what a run beside the others can be
    (``ALONE`` of their sd from their mean): it still widens the spread, as a heavy tail
    should, but by a bounded amount, however far it lay."""
    others = np.delete(runs, alone)
    limit = ALONE.get(len(runs), ALONE[max(ALONE)]) * float(np.std(others, ddof=1))
    center = float(others.mean())
    return float(np.clip(runs[alone], center - limit, center + limit))


def _alone(runs: np.ndarray) -> int | None:
    """The one run that lies further than ``ALONE`` of the others' sd from their mean, if
    exactly one does."""
    n = len(runs)
    limit = ALONE.get(n, ALONE[max(ALONE)])
    centered = runs - runs.mean()  # the others' sums, each run left out in turn, without a loop
    others = -centered / (n - 1)
    squares = float((centered**2).sum()) - centered**2 - (n - 1) * others**2
    sd = np.sqrt(np.maximum(squares, 0.0) / (n - 2))
    distance = np.abs(centered - others)
    far = np.where(sd > 0, distance > limit * sd, distance > 1e-12 * np.abs(runs).max())
    found = np.flatnonzero(far)
    return int(found[0]) if len(found) == 1 else None


def _shift(runs: np.ndarray) -> int | None:
    """How many of the newest runs lie after the clearest change of level, where one is
    clear (its two-sample t past ``SHIFT``), each side holding two runs or more."""
    n = len(runs)
    if n < min(SHIFT):
        return None
    k = np.arange(2, n - 1)
    x = runs - runs.mean()
    head, head_squares = np.cumsum(x)[k - 1], np.cumsum(x**2)[k - 1]
    tail, tail_squares = x.sum() - head, (x**2).sum() - head_squares
    pooled = head_squares - head**2 / k + tail_squares - tail**2 / (n - k)
    gap = np.abs(head / k - tail / (n - k))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = gap / (np.sqrt(np.maximum(pooled, 0.0) / (n - 2)) * np.sqrt(1 / k + 1 / (n - k)))
    t = np.where(pooled > 1e-24 * max(float((x**2).sum()), 1e-300), t, np.where(gap > 0, np.inf, 0.0))
    best = int(np.argmax(t))
    return int(k[best]) if t[best] > SHIFT.get(n, SHIFT[max(SHIFT)]) else None


def _drift(runs: np.ndarray, at: np.ndarray) -> float | None:
    """The level's move a run toward newer runs, where the least-squares slope is clear
    (one-sided ``DRIFT``, either way); ``at``: each run's place, 0 the newest."""
    n = len(runs)
    if n < FEWEST:
        return None
    x = -at  # newer runs to the right
    sxx = float(((x - x.mean()) ** 2).sum())
    slope = float(((x - x.mean()) * (runs - runs.mean())).sum()) / sxx
    residual = runs - runs.mean() - slope * (x - x.mean())
    sd = math.sqrt(float((residual**2).sum()) / (n - 2))
    if sd == 0:
        return slope or None
    t = slope / (sd / math.sqrt(sxx))
    return slope if abs(t) > t_quantile(1 - DRIFT, n - 2) else None
