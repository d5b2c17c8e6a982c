"""The run as the statistical unit of a comparison (docs/gates.md, "The run as the unit").

Every round of one pytest process shares that process's level (its runner, its clocks,
where its buffers landed), so rounds are not independent evidence of a change between
processes. What runs of unchanged code differ by is learnt from a baseline's stored
history: the medians of the last accepted runs of that name on that machine.

Their level is the runs' mean and their spread ``s`` the runs' standard deviation, over
``n`` runs. A new run of unchanged code lies, for ``CONFIDENCE`` of histories, within

    bound = t'(CONFIDENCE; n - 1, z(COVERAGE) * sqrt(n)) / sqrt(n) * s

of the level (above it, or below it) but for ``1 - COVERAGE`` of the time, ``t'`` the
noncentral t quantile: the one-sided tolerance bound. It holds each history's own rate of
false alarms, where a prediction bound holds only their mean over histories (and every run
compared with one history shares its errors). The smallest change found ``POWER`` of the
time is

    detectable = bound + t(POWER, n - 1) * s * sqrt(1 + 1/n).

The history is not split where its level shifted: a runner that moves between two speeds
(as virtual machines do) shifts it as a merge does, and runs of one speed agree too well to
stand for the next run.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# how many of a baseline name's newest accepted runs its between-run spread comes from
HISTORY_RUNS = 10
# a bound holds below all but 1 - COVERAGE of unchanged runs, for CONFIDENCE of histories
COVERAGE = 0.975
CONFIDENCE = 0.9
# the power a stated smallest detectable change is found with
POWER = 0.9
# how often, at most, an unchanged run fails any of its gated comparisons, on average over
# histories: a run of many comparisons holds each to its share (``bound_factor``)
SUITE_RATE = 0.04

_ERFC = np.vectorize(math.erfc, otypes=[float])


@functools.cache
def _legendre() -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [-1, 1], made when a comparison first needs them
    (60 ms: never at start-up)."""
    return np.polynomial.legendre.leggauss(512)


def _chi_grid(df: int, thin: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``u`` of sqrt(V / df), V chi-squared with ``df``, and their weights (summing to
    1): Gauss-Legendre over log u where its density lies (``thin``: every thin-th node)."""
    # u = exp(w), integrated over w: its density lies near 1 for many degrees of freedom
    # and reaches down to 0 for few, where the far quantiles live
    width = 12 / math.sqrt(2 * df)
    low = 1 - width if 1 - width > 0.1 else 10 ** (-20 / df)
    high = 1 + width + (6 if df < 4 else 0)
    nodes, node_weights = (a[::thin] for a in _legendre())
    w = math.log(low) + (math.log(high) - math.log(low)) * (nodes + 1) / 2
    u = np.exp(w)
    log_density = math.log(2) + (df / 2) * math.log(df / 2) - math.lgamma(df / 2) + df * w - df * u * u / 2
    weights = node_weights * np.exp(log_density)
    return u, weights / weights.sum()


@functools.lru_cache(maxsize=256)
def paired_detectable_factor(n: int, confidence: float, power: float) -> float:
    """``k`` such that a true mean change of ``limit + k s / sqrt(n)``, ``s`` the sd of the
    ``n`` pairs that printed it, is found ``power`` of the time by ``n`` fresh pairs whose
    interval's low end (``t(confidence, n - 1)`` of their own sd) must pass ``limit``.
    Both sds are random: the power is the mean of Phi(k u1 - t u2) over two independent
    chi variates, solved for ``k`` by bisection. Normal pair differences assumed."""
    u, weights = _chi_grid(n - 1, thin=4)
    t = t_quantile(confidence, n - 1)
    outer = np.outer(weights, weights)

    def found(k: float) -> float:
        return float((outer * _ERFC(-(k * u[:, None] - t * u[None, :]) / math.sqrt(2))).sum() / 2)

    return solve(found, power, 0.0, 1.0)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: int, shift: float = 0.0) -> float:
    """Student's t quantile ``p`` at ``df`` degrees of freedom, noncentral by ``shift``:
    the ``x`` at which P((Z + shift) / sqrt(V / df) <= x) = p, V chi-squared with ``df``.
    The probability is the mean of Phi(x u - shift) over u = sqrt(V / df), integrated by
    Gauss-Legendre over log u where u's density lies; ``x`` is found by bisection."""
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom")
    if not 0 < p < 1:
        raise ValueError(f"t quantile: probability {p}")
    u, weights = _chi_grid(df)

    def cdf(x: float) -> float:
        return float((weights * _ERFC(-(x * u - shift) / math.sqrt(2))).sum() / 2)

    return solve(cdf, p, -1.0, 1.0)


def solve(rising: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """The ``x`` at which the increasing ``rising`` reaches ``target``: the bracket
    [``lo``, ``hi``] widened by doubling until it holds it, then 60 bisections."""
    while lo < 0 and rising(lo) > target:
        lo *= 2
    while rising(hi) < target:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rising(mid) < target else (lo, mid)
    return (lo + hi) / 2


def t_tail(x: float, df: int) -> float:
    """P(T > ``x``) for Student's t at ``df`` degrees of freedom (the same integral as
    ``t_quantile``)."""
    u, weights = _chi_grid(df)
    return float((weights * _ERFC(x * u / math.sqrt(2))).sum() / 2)


@functools.lru_cache(maxsize=256)
def false_alarm_rate(runs: int, factor: float | None = None, df: int | None = None) -> float:
    """How often, on average over histories of ``runs`` normal runs, a new run of unchanged
    code lies past a bound ``factor`` sds above their level (the tolerance factor where not
    given): P(t(df) > factor / sqrt(1 + 1/runs)), ``df`` the sd's degrees of freedom
    (``runs - 1`` where not given; the bound alone: a threshold past it makes it rarer)."""
    df = runs - 1 if df is None else df
    factor = tolerance_factor(runs, df) if factor is None else factor
    return t_tail(factor / math.sqrt(1 + 1 / runs), df)


def tolerance_factor(runs: int, df: int | None = None) -> float:
    """How many ``s`` above the mean of ``runs`` runs (``s`` with ``df`` degrees of freedom,
    ``runs - 1`` where not given) a new run lies at most, but for ``1 - COVERAGE`` of the
    time, for ``CONFIDENCE`` of histories."""
    z = statistics.NormalDist().inv_cdf(COVERAGE)
    return t_quantile(CONFIDENCE, runs - 1 if df is None else df, z * math.sqrt(runs)) / math.sqrt(runs)


@functools.lru_cache(maxsize=1024)
def bound_factor(runs: int, df: int, comparisons: int = 1) -> float:
    """The factor of a bound: the tolerance factor (each history's own rate), or, where
    one run makes ``comparisons`` gated comparisons, the prediction factor that holds the
    chance that an unchanged run fails any of them to ``SUITE_RATE`` on average over
    histories, if it is the larger: t(1 - q, df) * sqrt(1 + 1/runs), with
    q = 1 - (1 - SUITE_RATE)^(1/comparisons) (independent comparisons)."""
    factor = tolerance_factor(runs, df)
    if comparisons <= 1:
        return factor
    each = 1 - (1 - SUITE_RATE) ** (1 / comparisons)
    return max(factor, t_quantile(1 - each, df) * math.sqrt(1 + 1 / runs))


@dataclass(frozen=True, slots=True)
class Aside:
    """A saved run the level was not learnt from: ``value``, ``at`` runs before the newest
    (0: the newest), left out because it stood ``alone`` far from every other run, or
    because it came before the level changed."""

    value: float
    at: int
    alone: bool


@dataclass(frozen=True, slots=True)
class Spread:
    """How far apart runs of unchanged code lie, for one metric of one test: ``sd`` of
    ``runs`` runs' medians around their mean ``center`` (``None`` with fewer than two:
    unknown). ``analysis.levels.learn`` fills the rest from an ordered history: ``df``,
    the sd's degrees of freedom (``runs - 1`` where ``None``); ``comparisons``, how many
    gated comparisons the run's bound shares ``SUITE_RATE`` with; ``aside``, the runs left
    out of the level; ``drift``, the level's move a run where the history drifts (toward
    newer runs); ``changed``, how many runs ago the level changed where too few runs hold
    the new one (the history straddles it); ``reach``, the lowest and the highest of the
    runs not left out."""

    runs: int
    sd: float | None
    center: float | None = None
    df: int | None = None
    comparisons: int = 1
    aside: tuple[Aside, ...] = ()
    drift: float | None = None
    changed: int | None = None
    reach: tuple[float, float] | None = None  # the lowest and highest run the level kept

    @classmethod
    def of(cls, medians: Sequence[float], exact: bool = False) -> Spread:
        """The plain spread of ``medians``: their mean and sd. ``exact``: runs of unchanged
        code give the same figures by construction (the host backend's virtual clock), so
        one run knows the spread: none."""
        if exact and len(medians) == 1:
            return cls(1, 0.0, medians[0])
        if len(medians) < 2:
            return cls(len(medians), None)
        return cls(len(medians), statistics.stdev(medians), statistics.fmean(medians))

    @property
    def freedom(self) -> int:
        return self.runs - 1 if self.df is None else self.df

    @property
    def factor(self) -> float | None:
        """How many sds past ``center`` the bound lies (``bound_factor``)."""
        if self.sd is None or self.freedom < 1:
            return None
        return bound_factor(self.runs, self.freedom, self.comparisons)

    @property
    def bound(self) -> float | None:
        """How far above (or below) ``center`` a new run of unchanged code lies at most."""
        if self.sd is None:
            return None
        if self.sd == 0 or self.factor is None:
            return 0.0
        return self.factor * self.sd

    @property
    def false_alarm(self) -> float | None:
        """How often an unchanged run lies past the bound, on average over histories
        (``false_alarm_rate``); ``None`` where the spread is unknown or nil."""
        if not self.sd or self.factor is None:
            return None
        return false_alarm_rate(self.runs, self.factor, self.freedom)

    @property
    def noise(self) -> float | None:
        """How far past its level a new run of this spread lies at most, ``POWER`` of the
        time (the predictive quantile: the level itself is estimated from ``runs`` runs)."""
        if self.sd is None:
            return None
        if self.sd == 0 or self.freedom < 1:
            return 0.0
        return t_quantile(POWER, self.freedom) * self.sd * math.sqrt(1 + 1 / self.runs)

    @property
    def detectable(self) -> float | None:
        """The smallest change from ``center`` that passes the bound ``POWER`` of the time at
        this spread, whatever the threshold: what the spread alone lets a comparison see."""
        if self.bound is None or self.noise is None:
            return None
        return self.bound + self.noise

    def detectable_from(self, baseline: float, allowed: float, sign: int) -> float | None:
        """The smallest true change from the ``baseline``'s figure, in the worse direction
        ``sign``, that a comparison catches ``POWER`` of the time: it must pass both the
        threshold (``allowed`` past ``baseline``) and the bound (past ``center``), and a new
        run lies ``noise`` short of its level at worst, ``POWER`` of the time. It rests on
        normally distributed run levels and holds on average over histories."""
        if self.center is None or self.bound is None or self.noise is None:
            return None
        past_bound = self.bound + sign * (self.center - baseline)
        return max(allowed, past_bound) + self.noise

    def beyond(self, value: float, sign: int) -> bool:
        """Whether ``value`` lies past the bound in the direction ``sign`` (``True`` where
        the spread is unknown: nothing to explain a change by)."""
        if self.center is None or self.bound is None:
            return True
        return sign * (value - self.center) > self.bound

    def explains(self, value: float, sign: int) -> str | None:
        """Why ``value``, past the bound toward ``sign``, is still no regression the history
        can tell, or ``None``: the history changed level too few runs ago to know the new
        one; a run it left out lay where this one does; one of its runs lay as far (a level
        it has held: a runner of two speeds, main before a change, a heavy tail); or it
        drifts toward ``sign`` and the level it has reached by now explains ``value``."""
        bound = self.bound or 0.0
        if self.changed is not None:
            edge = self.reach[1 if sign > 0 else 0] if self.reach is not None else self.center or 0.0
            if sign * (value - edge) <= bound:  # past every level it held, a change is clear
                return f"the history changed level {self.changed} saves ago: too few runs at the new level to judge"
            return None
        for run in self.aside:
            # a run's spread grows with its figure (a time twice as long moves twice as far)
            near = bound * max(1.0, abs(run.value / self.center)) if self.center else bound
            if abs(value - run.value) > near:
                continue
            if run.alone:
                return f"a run {run.at} saves before the newest lay here ({run.value:.6g}) and nowhere near the others"
            return f"the history held this figure before its level changed ({run.value:.6g}, {run.at} saves before the newest)"
        if self.reach is not None and sign * (value - self.reach[1 if sign > 0 else 0]) <= 0:
            return f"a saved run lay as far ({self.reach[1 if sign > 0 else 0]:.6g}): a figure its runner has reached"
        if self.drift is not None and self.center is not None and sign * self.drift > 0:
            reached = self.center + self.drift * (self.runs + 1) / 2
            if sign * (value - reached) <= bound:
                return f"the history drifts {self.drift:+.4g} a run: the level it has reached by now explains it"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "sd": self.sd,
            "center": self.center,
            "bound": self.bound,
            "detectable": self.detectable,
            "false_alarm": self.false_alarm,
            **({"df": self.df} if self.df is not None else {}),
            **({"aside": [{"value": a.value, "at": a.at, "alone": a.alone} for a in self.aside]} if self.aside else {}),
            **({"drift": self.drift} if self.drift is not None else {}),
            **({"changed": self.changed} if self.changed is not None else {}),
            **({"reach": list(self.reach)} if self.reach is not None else {}),
        }
