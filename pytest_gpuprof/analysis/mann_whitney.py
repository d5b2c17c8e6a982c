"""The one-sided Mann-Whitney U test that decides whether a metric moved over its rounds:
exact (ties included) where it is cheap, the normal approximation beyond."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

ALPHA = 0.05
# the exact permutation distribution while min(n, m) * (n + m) stays within this: up to
# 100 x 100 rounds, or 1 against 10,000; milliseconds each
EXACT_WORK = 10_000


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value of the Mann-Whitney U test that ``y`` tends to exceed ``x``.

    Exact where it is cheap (``EXACT_WORK``): the share of the C(n+m, n) ways to split
    the pooled values into the two sides, ties included, whose U is at least the
    observed one (the permutation distribution). Beyond that, the normal approximation
    with tie and continuity corrections, by then over many rounds on both sides."""
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return 1.0
    u2 = sum(2 if b > a else 1 if b == a else 0 for a in x for b in y)  # 2U: a tie counts a half
    if min(n, m) * (n + m) <= EXACT_WORK:
        return _exact_tail(x, y, u2)
    tie_sizes = Counter(float(v) for v in (*x, *y)).values()
    total = n + m
    variance = n * m / 12 * ((total + 1) - sum(t**3 - t for t in tie_sizes) / (total * (total - 1)))
    if variance <= 0:
        return 1.0
    z = (u2 / 2 - n * m / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def min_p_value(n: int, m: int) -> float:
    """The smallest one-sided p-value ``n`` against ``m`` rounds can give: every round of
    one side beyond every round of the other, one split in C(n+m, n)."""
    return 1.0 / math.comb(n + m, n) if n and m else 1.0


def can_fail(n: int, m: int) -> bool:
    """Whether a comparison of ``n`` against ``m`` rounds can ever reach ``ALPHA``."""
    return min_p_value(n, m) < ALPHA


def _exact_tail(x: Sequence[float], y: Sequence[float], u2: int) -> float:
    """P(2U >= ``u2``) over every split of the pooled values into n x's and m y's.

    Counted over the smaller side's rank sums (``_rank_sums``), so that a pooled baseline
    of hundreds of rounds against a run's nine costs a table of nine rows: where the x's
    are fewer, 2U_y = 2nm - 2U_x turns the upper tail of y's into the lower tail of x's."""
    n, m = len(x), len(y)
    pooled = sorted(float(v) for v in (*x, *y))
    if m <= n:
        counts = _rank_sums(pooled, m)
        return float(counts[u2 + m * (m + 1) :].sum() / counts.sum())
    counts = _rank_sums(pooled, n)
    return float(counts[: 2 * n * m - u2 + n * (n + 1) + 1].sum() / counts.sum())


def _rank_sums(pooled: list[float], k: int) -> np.ndarray:
    """How many ways ``k`` of the sorted ``pooled`` values give each doubled rank sum.

    2U = 2R - k(k+1), R the sum of the k values' mid-ranks. Counted over tie groups: a
    group of t equal values at doubled mid-rank r gives C(t, j) ways to take j of them,
    each adding j*r to the doubled rank sum. The counts are floats (C(100, 50) is 1e29) and
    a tail a ratio of them, good to the 15th digit."""
    import numpy as np  # the plugin loads this module; numpy only when rounds are compared

    total = len(pooled)
    top = sum(range(2 * (total - k) + 2, 2 * total + 1, 2))  # the largest doubled rank sum of k values
    ways = np.zeros((k + 1, top + 1))
    ways[0, 0] = 1.0
    start = 0
    for _, same in itertools.groupby(pooled):
        t = len(list(same))
        r = 2 * start + t + 1  # the group's doubled mid-rank
        start += t
        reach = min(top, k * (2 * start)) + 1  # no doubled rank sum of the values so far is larger
        if t == 1:  # numpy reads an overlapping operand as it was before the update
            ways[1:, r:reach] += ways[:k, : reach - r]
            continue
        added = np.zeros((k, reach))
        for j in range(1, min(t, k) + 1):
            shift = j * r
            if shift < reach:
                added[j - 1 :, shift:] += math.comb(t, j) * ways[: k + 1 - j, : reach - shift]
        ways[1:, :reach] += added
    return ways[k]
