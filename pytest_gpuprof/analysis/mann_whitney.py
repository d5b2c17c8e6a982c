"""The one-sided Mann-Whitney U test that decides whether a metric moved over its rounds:
exact (ties included) where it is cheap, the normal approximation beyond."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

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

    2U = 2R_y - m(m+1), R_y the sum of the y's mid-ranks. Counted over tie groups: a
    group of t equal values at doubled mid-rank r gives C(t, j) ways to put j of them on
    the y side, each adding j*r to the doubled rank sum. The counts are floats (C(100, 50)
    is 1e29) and the tail a ratio of them, good to the 15th digit."""
    import numpy as np  # the plugin loads this module; numpy only when rounds are compared

    m = len(y)
    pooled = sorted(float(v) for v in (*x, *y))
    total = len(pooled)
    top = sum(range(2 * (total - m) + 2, 2 * total + 1, 2))  # the largest doubled rank sum of m values
    ways = np.zeros((m + 1, top + 1))
    ways[0, 0] = 1.0
    start = 0
    for _, same in itertools.groupby(pooled):
        t = len(list(same))
        r = 2 * start + t + 1  # the group's doubled mid-rank
        start += t
        before = ways.copy()
        for j in range(1, min(t, m) + 1):
            shift = j * r
            ways[j:, shift:] += math.comb(t, j) * before[: m + 1 - j, : top + 1 - shift]
    rank_sums = ways[m]
    return float(rank_sums[u2 + m * (m + 1) :].sum() / rank_sums.sum())
