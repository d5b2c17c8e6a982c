"""Paired runs of the base and the head, judged: ``gpuprof ab``'s statistics (the runner,
worktrees and pytest processes, is ``pytest_gpuprof.ab``).

Each test's runs are compared pair by pair: the effect of a metric is the trimmed mean of
the pairs' differences (log ratios for ``%`` thresholds; ``Trimmed``: the fifth of pairs at
each end left out, so that a pair that straddles a runner's change of speed sways neither
end), its interval the trimmed t's, and a regression is an interval wholly beyond the
threshold. What moves both sides of a pair (a slow runner, a warm cache) cancels. A test
whose interval holds its threshold gets more pairs of its own (``in_looks``), its error
spent over the two looks. Kernel times are compared in cycles where both sides' SM clocks
are known.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_gpuprof.analysis.names import readable, short
from pytest_gpuprof.analysis.trimmed import Trimmed
from pytest_gpuprof.verdict.decision import AB_CONFIDENCE, MOST, ab_pairs_needed
from pytest_gpuprof.verdict.explain import Cause, Explanation, explain, pooled
from pytest_gpuprof.verdict.samples import samples_of
from pytest_gpuprof.verdict.thresholds import KERNELS, Threshold, kernel_metric

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.entry import Entry

Side = Literal["base", "current"]
Verdict = Literal["regression", "improvement", "unchanged", "unsure", "clock", "missing"]
# the interval of an effect: 96%, so that each of its ends is a one-sided 98% bound: a
# regression called wrongly 2% of the time at most, at a true change equal to the limit
CONFIDENCE = AB_CONFIDENCE
# with more pairs for the tests still unsure (--max-pairs), those 2% are spent over two
# looks, at --pairs and at --max-pairs (Bonferroni: 1.5% and 0.5%), so that they hold
# whatever the first look found; each look's one-sided level
LOOKS = (0.985, 0.995)
# the power of the smallest detectable change an effect prints, for normal pairs: 95%, so
# that on runners whose pairs are not normal (two speeds, a mode switch inside a pair) a
# fresh run at that change still finds it 90% of the time (benchmarks/ab_sim.py)
PRINTED_POWER = 0.97


# why one pair decides nothing
ONE_PAIR = "one pair has no interval: --pairs 2 or more"


Figures = dict[str, float]
# the SM clock a kernel time is read in cycles with
CLOCK = "nvml.sm_clock_mhz"


@dataclass
class Runs:
    """Each test's figures, run by run, on both sides (``figures``: of the ``metrics`` the
    gates read, and no more), and every test's outcome in every run of each side
    (``outcomes`` of the runs' reports: measured or not)."""

    metrics: tuple[str, ...]
    pairs: dict[str, list[tuple[Figures, Figures]]] = field(default_factory=dict)
    outcomes: dict[Side, dict[str, Counter[str]]] = field(default_factory=lambda: {"base": {}, "current": {}})
    # each pair's explanation of each test's change of wall time: its walls and its largest
    # causes' sizes (a few numbers a test a pair); each cause's evidence, its last pair's
    explained: dict[str, list[tuple[float, float, tuple[tuple[str, float], ...]]]] = field(default_factory=dict)
    evidence: dict[str, dict[str, str]] = field(default_factory=dict)

    def add(self, base: dict[str, Any], current: dict[str, Any]) -> None:
        ours = {t["nodeid"]: t for t in current["tests"] if "crashed" not in t}
        for test in base["tests"]:
            if test["nodeid"] in ours and "crashed" not in test:
                pair = (figures(test, self.metrics), figures(ours[test["nodeid"]], self.metrics))
                self.pairs.setdefault(test["nodeid"], []).append(pair)
                self._explain(test, ours[test["nodeid"]])
        sides: tuple[tuple[Side, dict[str, Any]], ...] = (("base", base), ("current", current))
        for side, report in sides:
            seen = self.outcomes[side]
            words = dict(report.get("outcomes") or {})
            for test in report["tests"]:
                words.setdefault(test["nodeid"], "failed" if "crashed" in test else str(test.get("outcome", "passed")))
            for nodeid, word in words.items():
                seen.setdefault(nodeid, Counter())[word] += 1

    def _explain(self, base: Entry, current: Entry) -> None:
        e = explain(base, current).kept()
        causes = tuple((sys.intern(c.what), c.ms) for c in e.causes)
        self.explained.setdefault(e.nodeid, []).append((e.before_ms, e.after_ms, causes))
        self.evidence.setdefault(e.nodeid, {}).update((c.what, c.evidence) for c in e.causes)

    def why(self, nodeids: Sequence[str]) -> dict[str, Explanation]:
        """Why each test's wall time changed, over its pairs (``explain.pooled``)."""
        out = {}
        for n in dict.fromkeys(nodeids):
            said = self.evidence.get(n, {})
            pairs = [
                Explanation(n, b, a, tuple(Cause(w, ms, said.get(w, "")) for w, ms in causes), 0.0)
                for b, a, causes in self.explained.get(n, ())
            ]
            if pairs:
                out[n] = pooled(n, pairs)
        return out


def figures(test: Entry, metrics: Sequence[str]) -> Figures:
    """What a pair's comparison reads of a test's report entry, and no more: each of
    ``metrics`` (``kernels``: each kernel's ``total_ms``) and the SM clock, at its rounds'
    median (the pair's figure). A run of many pairs keeps a few numbers a test a pair, not
    the runs' whole reports (3.1 MB a pair on a 100-test suite, before)."""
    paths = [m for m in metrics if m != KERNELS]
    if KERNELS in metrics:
        totals = (test.get("metrics") or {}).get("kernel_totals")
        # interned: every pair's figures share one string a kernel
        paths += [sys.intern(f"kernels.{name}.total_ms") for name in totals or () if isinstance(name, str)]
    out: Figures = {}
    for path in (*paths, CLOCK):
        if samples := samples_of(test, path):
            out[path] = statistics.median(samples)
    return out


@dataclass(frozen=True, slots=True)
class Effect:
    """One metric of one test over the pairs: the mean difference (current minus base, in
    the threshold's unit: a fraction for ``%``, points for ``pt``, ms for ``ms``), its
    interval, the smallest change the pairs can detect, and the verdict."""

    nodeid: str
    metric: str
    threshold: Threshold
    pairs: int
    effect: float | None
    low: float | None
    high: float | None
    detectable: float | None
    verdict: Verdict
    note: str = ""

    @property
    def label(self) -> str:
        """The metric as a line says it: a kernel by its short readable name."""
        if self.metric.startswith("kernels.") and self.metric.endswith(".total_ms"):
            return f"kernel {short(readable(self.metric[len('kernels.') : -len('.total_ms')]))} ms"
        return self.metric

    def line(self) -> str:
        what = f"{self.nodeid}: {self.label}"
        if self.effect is None:
            return f"{what}: {self.note or 'not measured on both sides'}"
        shown = shown_in(self.threshold)
        detect = f"; smallest detectable change {shown(self.detectable, False)}" if self.detectable is not None else ""
        interval = f"[{shown(self.low)} .. {shown(self.high)}]" if self.low is not None else "[one pair: no interval]"
        note = f" ({self.note})" if self.note else ""
        return (
            f"{what}: effect {shown(self.effect)} {interval} over {self.pairs} pairs{detect}; "
            f"limit {self.threshold.text}: {self.verdict}{note}"
        )

    def brief(self) -> str:
        """The effect on one screen's line: ``test: kernel_ms +3.1% [1.2% .. 5.0%] over 5
        pairs, limit kernel_ms:+1%: regression``."""
        shown = shown_in(self.threshold)
        interval = f" [{shown(self.low)} .. {shown(self.high)}]" if self.low is not None else ""
        return (
            f"{self.nodeid}: {self.label} {shown(self.effect)}{interval} over {self.pairs} pairs, "
            f"limit {self.threshold.text}: {self.verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "metric": self.metric,
            "threshold": self.threshold.text,
            "pairs": self.pairs,
            "effect": self.effect,
            "low": self.low,
            "high": self.high,
            "detectable": self.detectable,
            "verdict": self.verdict,
            **({"note": self.note} if self.note else {}),
        }


def shown_in(t: Threshold) -> Callable[..., str]:
    def shown(v: float | None, signed: bool = True) -> str:
        if v is None:
            return "?"
        sign = "+" if signed else ""
        if t.unit == "%":
            return f"{100 * v:{sign}.2f}%"
        if t.unit == "pt":
            return f"{100 * v:{sign}.2f}pt"
        return f"{v:{sign}.3f} ms"

    return shown


def _difference(t: Threshold, path: str, base: Figures, current: Figures, cycles: bool) -> float | None:
    """One pair's change of ``path``, worse positive, in the threshold's unit; ``cycles``:
    the current side's kernel time at the base side's SM clock."""
    b, c = base.get(path), current.get(path)
    if b is None or c is None:
        return None
    if cycles:
        f_base, f_now = base.get(CLOCK), current.get(CLOCK)
        if not f_base or not f_now:
            return None
        c = c * f_now / f_base
    if t.unit == "%":  # the log ratio: no upward bias under no change, a pair's two sides alike
        return t.direction * math.log(c / b) if b > 0 and c > 0 else None
    return t.direction * (c - b)


def _limit(t: Threshold) -> float:
    """The threshold in a pair difference's unit, worse positive: for ``%`` the log of the
    ratio it allows (``+5%``: log 1.05; ``-5%``: -log 0.95)."""
    if t.unit == "%":
        return math.log1p(t.amount / 100) if t.direction > 0 else -math.log1p(-t.amount / 100)
    return t.amount / 100 if t.unit == "pt" else t.amount


def _as_moved(t: Threshold, oriented: float) -> float:
    """An oriented difference as the metric moved: for ``%`` the relative change."""
    moved = t.direction * oriented
    return math.expm1(moved) if t.unit == "%" else moved


def effect(
    nodeid: str,
    path: str,
    t: Threshold,
    pairs: Sequence[tuple[Figures, Figures]],
    confidence: float = CONFIDENCE,
) -> Effect:
    """The metric's effect over the pairs, and its verdict against ``t``; ``confidence``:
    the one-sided level of this look's interval ends (``LOOKS``)."""
    limit = _limit(t)
    diffs = [d for b, c in pairs if (d := _difference(t, path, b, c, cycles=False)) is not None]
    if not diffs:
        return Effect(nodeid, path, t, 0, None, None, None, None, "missing")
    n = len(diffs)
    if n < 2:  # no interval: nothing can be told from the runs' own spread
        return Effect(nodeid, path, t, n, _as_moved(t, diffs[0]), None, None, None, "unsure", ONE_PAIR)
    robust = Trimmed.of(diffs)
    # a true change this far past the base is caught PRINTED_POWER of the time by pairs as many as
    # these, their spread as random as this one
    detectable = robust.detectable(limit, confidence, PRINTED_POWER)
    low, high = robust.low(confidence), robust.high(confidence)
    verdict: Verdict
    if low > limit:
        verdict = "regression"
    elif high < -limit:
        verdict = "improvement"
    elif high <= limit and low >= -limit:
        verdict = "unchanged"
    else:
        verdict = "unsure"
    note = ""
    if verdict == "unsure":
        need = ab_pairs_needed(robust.se * math.sqrt(n), limit)
        note = f"needs about {need} pairs" if need <= MOST else f"needs more than {MOST} pairs"
    if verdict == "regression" and kernel_metric(path):
        cycles = [d for b, c in pairs if (d := _difference(t, path, b, c, cycles=True)) is not None]
        if len(cycles) == n:
            if Trimmed.of(cycles).low(confidence) <= limit:
                verdict, note = "clock", "the SM clocks of the pairs explain it: in cycles, within the limit"
            else:
                note = "a regression in cycles too"
    # as the metric moved (worse was down: the ends swap), and the detectable change's size
    ends = sorted((_as_moved(t, low), _as_moved(t, high)))
    shown = abs(_as_moved(t, detectable))
    return Effect(nodeid, path, t, n, _as_moved(t, robust.center), ends[0], ends[1], shown, verdict, note)


def effects(runs: Runs, thresholds: Sequence[Threshold], first: int | None = None) -> list[Effect]:
    """Every test's effect for every threshold (``kernels`` for each kernel of the test).
    ``first``: the pairs of the first of two looks (``LOOKS``): a test with more had its
    second; ``None``: one look."""
    out = []
    for nodeid, pairs in sorted(runs.pairs.items()):
        level = CONFIDENCE if first is None else LOOKS[0] if len(pairs) <= first else LOOKS[1]
        for t in thresholds:
            if t.metric != KERNELS:
                out.append(effect(nodeid, t.metric, t, pairs, level))
                continue
            kernels = {k for b, c in pairs for side in (b, c) for k in side if k.startswith("kernels.")}
            for path in sorted(kernels):
                each = Threshold(path, t.direction, t.amount, t.unit, t.text)
                out.append(effect(nodeid, path, each, pairs, level))
    return out


class Order:
    """Which side starts each pair: balanced, each order once in every two pairs, the two
    shuffled (seeded), so that whatever favours the first (or second) run of a pair falls on
    both sides alike."""

    def __init__(self, seed: int | None) -> None:
        self._random = random.Random(seed)
        self._queued: list[list[Side]] = []

    def next(self) -> list[Side]:
        if not self._queued:
            block: list[list[Side]] = [["base", "current"], ["current", "base"]]
            self._random.shuffle(block)
            self._queued = block
        return self._queued.pop(0)


def in_looks(
    runs: Runs,
    pair: Callable[[str | None], None],
    pairs: int,
    max_pairs: int,
    thresholds: Sequence[Threshold],
    gating: Sequence[Threshold],
) -> list[Effect]:
    """``pairs`` pairs of every test (``pair(None)``), a first look; each test it left
    unsure gets pairs of its own (``pair(nodeid)``) up to ``max_pairs``, with no look
    between, and the second look (``LOOKS``). The effects at the end."""
    for _ in range(pairs):
        pair(None)
    two = max_pairs > pairs
    first = effects(runs, gating or thresholds, pairs if two else None)
    for nodeid in sorted({e.nodeid for e in first if e.verdict == "unsure"}) if two else ():
        while len(runs.pairs[nodeid]) < max_pairs:
            pair(nodeid)
    return effects(runs, thresholds, pairs if two else None)
