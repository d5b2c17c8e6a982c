"""Regression gates: compare-fail expressions and what one metric's change was.

The run is the unit (``analysis.run_spread``): where the baseline's stored history gives
the spread between runs, a change counts as a regression only when it passes the threshold
**and** the tolerance bound of that spread above the history's level, and the rounds make
it clear too; a change beyond the threshold that the spread explains is ``inconclusive``.
Where the spread is unknown (one baseline run), no change is a regression: it is
``inconclusive``, its test undecided, and the line says why.

Over the rounds a change is clear when it is beyond the threshold and statistically
clear: a one-sided Mann-Whitney U test of the current rounds, moved back
by the threshold, against the baseline rounds rejects "no worse than the threshold" at
p < 0.05 (exact null distribution without ties, normal approximation with them). When
the median moved beyond the threshold but the test does not reject, the finding is
``inconclusive``. It is a rank test: a stray round counts by the pairs it reorders (at
most one per round of the other side), not by its size. With 5 rounds a side the smallest
p is 1/252 and a finding needs 21 of the 25 pairs, so one round beyond every round of the
other side can block it; with 3 rounds the smallest p is 1/20, which never clears 0.05,
so fewer than 4 rounds a side never give a finding.
"""

from __future__ import annotations

import difflib
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.descriptors import is_fraction
from pytest_gpuprof.analysis.levels import learn
from pytest_gpuprof.analysis.mann_whitney import ALPHA, can_fail, mann_whitney_greater
from pytest_gpuprof.analysis.names import readable, short, short_names
from pytest_gpuprof.analysis.run_spread import Spread
from pytest_gpuprof.analysis.throttle import throttle_names
from pytest_gpuprof.verdict.samples import samples_of, value_at

# the metric may hold colons (what_if.overlap:upload.utilization): the last colon before a sign ends it
_EXPR = re.compile(r"^(?P<metric>[A-Za-z_][\w.:\-]*):(?P<sign>[+-])(?P<amount>\d+(?:\.\d+)?)(?P<unit>%|pt|ms)$")


# how a comparison gets enough rounds to fail: only measure() repeats its window
WAY_OUT = (
    "measure in gpuprof.measure() with 4 or more rounds a side (--gpu-rounds raises them); "
    "a test measured whole or by its steps is one round"
)

# what a comparison says of a test its baseline does not hold: nothing gates it
NEW = "new (not in the baseline)"

# what a comparison with a baseline reports when no --gpu-compare-fail is given
DEFAULT_THRESHOLDS = "utilization:-2pt,wall_ms:+10%"


class CompareError(ValueError):
    """A compare-fail expression that cannot be used."""


@dataclass(frozen=True, slots=True)
class Threshold:
    """``metric`` may move at most ``amount`` ``unit`` in the ``direction`` that is worse."""

    metric: str
    direction: Literal[1, -1]
    amount: float
    unit: Literal["%", "pt", "ms"]
    text: str

    def delta(self, baseline: float) -> float:
        """The allowed change in the metric's own units, away from ``baseline``."""
        if self.unit == "%":
            return abs(baseline) * self.amount / 100
        if self.unit == "pt":
            return self.amount / 100
        return self.amount


def parse_thresholds(text: str) -> list[Threshold]:
    """``utilization:-2pt,wall_ms:+10%,steps.upload.host_ms:+15%`` into thresholds."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = _EXPR.match(part)
        if match is None:
            raise CompareError(
                f"compare-fail expression {part!r}: expected METRIC:+N% | METRIC:-N% | METRIC:+Npt | "
                "METRIC:-Npt | METRIC:+Nms | METRIC:-Nms, e.g. utilization:-2pt or wall_ms:+10%"
            )
        metric, unit = match["metric"], match["unit"]
        if metric == KERNELS:
            if unit == "pt" or match["sign"] != "+":
                raise CompareError(
                    f"compare-fail expression {part!r}: {KERNELS} gates each kernel's time: kernels:+N% or kernels:+Nms"
                )
        elif not descriptors.comparable(metric):
            known = [*descriptors.names("window"), *(f"nvml.{k}" for k in descriptors.names("nvml"))]
            close = difflib.get_close_matches(metric, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CompareError(
                f"compare-fail expression {part!r}: no metric {metric!r}{hint}; metrics are {descriptors.grammar()}"
            )
        worse = "+" if metric == KERNELS or descriptors.lookup(metric).worse == "up" else "-"  # type: ignore[union-attr]
        if match["sign"] != worse:
            way = "down" if worse == "-" else "up"
            raise CompareError(
                f"compare-fail expression {part!r}: the sign says which way is worse, and {metric} gets worse "
                f"going {way}: write {metric}:{worse}{match['amount']}{unit}"
            )
        if unit == "pt" and not is_fraction(metric):
            raise CompareError(
                f"compare-fail expression {part!r}: 'pt' (percentage points) applies to fractions only: "
                f"{', '.join(descriptors.fractions())}"
            )
        direction: Literal[1, -1] = 1 if match["sign"] == "+" else -1
        out.append(Threshold(metric, direction, float(match["amount"]), unit, part))  # type: ignore[arg-type]
    if not out:
        raise CompareError("compare-fail: no expression given")
    return out


def with_listed_kernels(thresholds: Sequence[Threshold]) -> list[Threshold]:
    """``thresholds`` and, unless one of them gates kernels already, ``LISTED_KERNELS``: a
    comparison lists the kernels that changed, whatever gates."""
    if any(t.metric == KERNELS for t in thresholds):
        return list(thresholds)
    return [*thresholds, *parse_thresholds(LISTED_KERNELS)]


def kernel_names(changes: Iterable[Change]) -> dict[str, str]:
    """The short names of the kernels of ``changes``, unique among them."""
    return short_names(c.kernel for c in changes if c.kernel is not None)


def regressions(changes: Sequence[Change], gating: Sequence[Threshold]) -> list[Change]:
    """The changes that fail: clear regressions of a ``gating`` expression (the rest are
    listed only)."""
    gates = {t.text for t in gating}
    return [c for c in changes if c.finding == "regression" and c.threshold.text in gates]


# ``kernels:+N%``: every kernel's own time, by name, gated alone
KERNELS = "kernels"
# beside what gates, a comparison lists each kernel that changed by more than this
LISTED_KERNELS = "kernels:+5%"
# a kernel under this share of the baseline's kernel time is neither gated nor listed: a
# 5 us fill kernel moves by 7% from process to process (H200, docs/performance.md)
KERNEL_FLOOR = 0.01

Finding = Literal[
    "regression", "inconclusive", "improvement", "unchanged", "missing", "absent", "appeared", "vanished", "clock"
]


@dataclass(frozen=True, slots=True)
class Change:
    threshold: Threshold
    finding: Finding
    baseline: float | None
    current: float | None
    p_value: float | None = None
    samples: tuple[int, int] = (0, 0)
    spread: Spread | None = None  # between runs, from the baseline's history; None: not asked
    clock: str | None = None  # the SM clocks of both sides, where the change is theirs
    runner: str | None = None  # the runner probes of both sides, beside a host-bound change
    # a regression that fresh runs of the test did not repeat (``confirmed``): what they read
    unconfirmed: str | None = None

    @property
    def inert(self) -> bool:
        """Whether this comparison could never have found a regression: too few rounds on
        a side for any p-value below ``ALPHA``, or the metric measured on neither side. A
        metric on one side only (missing, a kernel that appeared or vanished) is a finding
        of its own, not a test of rounds."""
        if self.finding == "absent":
            return True
        return self.finding not in ("missing", "appeared", "vanished") and not can_fail(*self.samples)

    @property
    def detectable(self) -> float | None:
        """The smallest true change from the baseline's figure, the threshold included, that
        this comparison catches ``POWER`` of the time (``Spread.detectable_from``), as a
        change in the metric's units toward worse; ``None`` where the spread is unknown."""
        spread = self.spread
        if spread is None or self.baseline is None:
            return None
        t = self.threshold
        found = spread.detectable_from(self.baseline, t.delta(self.baseline), t.direction)
        noise = spread.noise
        if found is None or noise is None or t.direction < 0 or is_fraction(t.metric) or self.baseline <= noise:
            return found
        # a time's spread grows with it: a run of the slower code moves by as much more
        return found / (1 - noise / self.baseline)

    @property
    def blind(self) -> bool:
        """Whether the spread between runs hides a change of the threshold's size: a change
        of the threshold alone lies within what unchanged runs do (``Spread.detectable``
        beyond the threshold), so that passing says little."""
        spread = self.spread
        if spread is None or spread.detectable is None or self.baseline is None:
            return False
        return spread.detectable > self.threshold.delta(self.baseline)

    def to_dict(self) -> dict[str, Any]:
        """The record a test's verdict was built from: metric, before, after, threshold,
        rounds a side, p, finding, and ``inert``."""
        return {
            "metric": self.threshold.metric,
            "threshold": self.threshold.text,
            "finding": self.finding,
            "before": self.baseline,
            "after": self.current,
            "rounds": list(self.samples),
            "p": self.p_value,
            "inert": self.inert,
            **({"detectable": self.detectable} if self.detectable is not None else {}),
            **({"between_runs": self.spread.to_dict()} if self.spread is not None else {}),
            **({"clock": self.clock} if self.clock else {}),
            **({"runner": self.runner} if self.runner else {}),
            **({"unconfirmed": self.unconfirmed} if self.unconfirmed else {}),
        }

    @property
    def kernel(self) -> str | None:
        """The kernel's mangled name, for a change of one kernel's time."""
        parts = descriptors.split_path(self.threshold.metric)
        return parts[1] if parts is not None and parts[0] == "kernel" else None

    def label(self, names: Mapping[str, str] | None = None) -> str:
        """What a line calls the changed figure: the metric, or ``kernel NAME ms`` with the
        kernel's short name (``names``: ``kernel_names`` of the lines shown together)."""
        kernel = self.kernel
        if kernel is None:
            return self.threshold.metric
        return f"kernel {(names or {}).get(kernel) or short(readable(kernel))} ms"

    def describe(self, names: Mapping[str, str] | None = None, gating: bool = True) -> str:
        """The change as a line; ``gating``: whether a ``--gpu-compare-fail`` expression
        set its threshold (else a finding beyond it reads ``changed``, the default named)."""
        t = self.threshold
        what = self.label(names)
        if self.finding in ("appeared", "vanished"):
            ms = self.current if self.finding == "appeared" else self.baseline
            return f"{what}: {self.finding} ({ms:.3f} ms {'now' if self.finding == 'appeared' else 'in the baseline'})"
        if self.finding == "absent":
            return f"{what}: not measured in the baseline nor in this run: this gate cannot act ({t.text})"
        if self.baseline is None or self.current is None:
            side = "baseline" if self.baseline is None else "this run"
            return f"{what}: not in {side}"
        fmt = formatter(t.metric)
        change = self.current - self.baseline
        relative = f", {100 * change / self.baseline:+.1f}%" if self.baseline else ""
        test = f"; one-sided Mann-Whitney p={self.p_value:.3g}" if self.p_value is not None else ""
        inert = ""
        if self.inert:
            inert = f" (inert: {self.samples[0]} vs {self.samples[1]} rounds can never reach p < {ALPHA}; {self.inert_cause()})"
        unconfirmed = f"not confirmed: {self.unconfirmed}" if self.unconfirmed else None
        beside = "".join(f" ({why})" for why in (self.clock, self.runner, unconfirmed) if why)
        return (
            f"{what}: baseline {fmt(self.baseline)} -> {fmt(self.current)} "
            f"({fmt(change, True)}{relative}; limit {t.text}; {self.samples[0]} vs {self.samples[1]} rounds{test}"
            f"{self._between_runs(fmt)}): {self.named(gating)}{beside}{inert}"
        )

    def _between_runs(self, fmt: Callable[..., str]) -> str:
        """The spread between runs and the smallest change it lets a comparison see."""
        spread = self.spread
        if spread is None:
            return ""
        if spread.sd is None:
            runs = f"{spread.runs} baseline run" if spread.runs == 1 else f"{spread.runs} baseline runs"
            return f"; between-run spread unknown ({runs}): no regression can be told from one process's rounds"
        if spread.runs == 1:  # ``Spread.of(exact=True)``: the virtual clock
            return "; between runs none (the virtual clock: one code, one figure)"
        detectable = self.detectable or 0.0
        relative = (
            f" ({100 * detectable / abs(self.baseline):.1f}%)"
            if self.baseline and not is_fraction(self.threshold.metric)
            else ""
        )
        return (
            f"; between runs sd {fmt(spread.sd, False)} over {spread.runs} runs "
            f"(level {fmt(spread.center, False)} ± {fmt(spread.bound or 0.0, True).lstrip('+')}), "
            f"smallest detectable change {fmt(detectable, True).lstrip('+')}{relative}"
        )

    def inert_cause(self) -> str:
        """Why this comparison could never fail, naming the side that is short of rounds and
        how many it would need against the other."""
        before, now = self.samples
        metric = self.threshold.metric
        if self.finding == "absent":
            return f"{metric} was measured in neither the baseline nor this run"
        if before < now:
            need = rounds_needed(now)
            return (
                f"the baseline holds {_rounds(before)} of {metric} against this run's {now}: "
                f"save a baseline from a run of {need} or more rounds (gpuprof.measure(), --gpu-rounds)"
            )
        if now < before:
            need = rounds_needed(before)
            return (
                f"this run has {_rounds(now)} of {metric} against the baseline's {before}: it needs {need} or more "
                "(gpuprof.measure() repeats its window, --gpu-rounds raises them; a test measured whole "
                "or by its steps is one round)"
            )
        return WAY_OUT

    def named(self, gating: bool) -> str:
        """The finding as a line says it: ``regression`` only where a gate the user set
        judged it; beyond a default threshold it is ``changed``."""
        if self.finding == "regression" and not gating:
            return f"changed (beyond the default {self.threshold.text}, not a gate)"
        return self.finding


def _rounds(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"


def rounds_needed(other: int) -> int:
    """The fewest rounds on one side that can reach ``ALPHA`` against ``other`` rounds on
    the other (0 if none can)."""
    return next((k for k in range(1, 200) if can_fail(k, other)), 0)


def formatter(metric: str) -> Callable[..., str]:
    if is_fraction(metric):
        return lambda v, signed=False: f"{100 * v:+.2f}pt" if signed else f"{100 * v:.2f}%"
    described = descriptors.lookup(metric)
    if described is not None and described.unit == "bytes":  # whole bytes, with thousands apart
        return lambda v, signed=False: f"{v:+,.0f} B" if signed else f"{v:,.0f} B"
    return lambda v, signed=False: f"{v:+.3f}" if signed else f"{v:.3f}"


def assess(
    threshold: Threshold, baseline: Sequence[float], current: Sequence[float], spread: Spread | None = None
) -> Change:
    """What one metric did: regression, inconclusive, improvement or unchanged. ``spread``:
    how far runs of the baseline lie apart (the run as the unit); a regression must pass
    its tolerance bound as well as the threshold."""
    if not baseline and not current:
        return Change(threshold, "absent", None, None, spread=spread)
    if not baseline or not current:
        return Change(threshold, "missing", _median(baseline), _median(current), spread=spread)
    base_median, cur_median = float(statistics.median(baseline)), float(statistics.median(current))
    delta = threshold.delta(base_median)
    sign = threshold.direction
    # "worse" is up for wall_ms:+10% and down for utilization:-2pt: test in that orientation
    base = [sign * v for v in baseline]
    cur = [sign * v for v in current]
    worse_p = mann_whitney_greater(base, [c - delta for c in cur])
    better_p = mann_whitney_greater([c + delta for c in cur], base)
    moved = sign * (cur_median - base_median)

    # beyond what the spread between runs explains: past the bound above (below) the level
    # of the baseline's history. Asked of a history of one run, the spread is unknown and
    # nothing is beyond it: one process's rounds are no evidence of a change between
    # processes (a gate that let them decide failed 61% of histories twice in 20 unchanged
    # runs, benchmarks/gate_sim.py); a comparison with no history asked (a report's file)
    # has the rounds alone
    def beyond_runs(way: int) -> bool:
        if spread is None:
            return True
        return spread.sd is not None and spread.beyond(cur_median, way * sign)

    # past the bound, a figure the history itself explains (a level it held, a change too
    # recent, a drift: ``analysis.levels``) is no regression it can tell
    explained = spread is not None and spread.explains(cur_median, sign) is not None

    finding: Finding
    if worse_p < ALPHA and moved > delta and beyond_runs(1) and not explained:
        finding, p = "regression", worse_p
    elif better_p < ALPHA and -moved > delta and beyond_runs(-1):
        finding, p = "improvement", better_p
    else:
        finding, p = ("inconclusive" if abs(moved) > delta else "unchanged"), min(worse_p, better_p)
    return Change(threshold, finding, base_median, cur_median, p, (len(baseline), len(current)), spread)


def confirmed(comparison: Comparison, fresh: Sequence[Comparison]) -> Comparison:
    """``comparison`` once ``fresh`` comparisons of the same test (each a fresh run against
    the same baseline) were asked to repeat its regressions: a regression that any of them
    did not repeat reads ``inconclusive``, saying what they read (its test is undecided);
    the others stand, confirmed by as many runs (``Comparison.confirmed``)."""
    regressed = comparison.regressed
    if not regressed or not fresh:
        return comparison
    changes = []
    for c in comparison.changes:
        if c not in regressed:
            changes.append(c)
            continue
        theirs = [next((f for f in other.changes if f.threshold == c.threshold), None) for other in fresh]
        repeated = sum(f is not None and f.finding == "regression" for f in theirs)
        if repeated == len(fresh):
            changes.append(c)
            continue
        read = ", ".join(f"{_shown(f.current)} ({f.finding})" if f is not None else "not measured" for f in theirs)
        changes.append(
            replace(c, finding="inconclusive", unconfirmed=f"{repeated} of {len(fresh)} fresh runs repeated it: {read}")
        )
    return replace(comparison, changes=tuple(changes), confirmed=len(fresh))


def _runs(n: int) -> str:
    return f"{n} fresh run" if n == 1 else f"{n} fresh runs"


def _shown(value: float | None) -> str:
    return "?" if value is None else f"{value:.6g}"


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def compare_tests(
    thresholds: Sequence[Threshold],
    baseline_test: dict[str, Any],
    current_test: dict[str, Any],
    history: Sequence[dict[str, Any]] | None = None,
    exact: bool = False,
    comparisons: int = 1,
) -> list[Change]:
    """Each threshold's change from ``baseline_test`` to ``current_test``. ``history``: the
    test's entries in the baseline's newest accepted runs (the spread between runs comes
    from their medians; ``None``: not asked); ``exact``: both sides ran on the host
    backend's virtual clock, whose runs of one code give one figure (``Spread.of``);
    ``comparisons``: how many gated comparisons the run makes, whose bounds share
    ``SUITE_RATE`` (``analysis.levels.learn``)."""

    def spread(path: str) -> Spread | None:
        if history is None:
            return None
        return learn([m for e in history if (m := _median(samples_of(e, path))) is not None], exact, comparisons)

    def judged(t: Threshold, before: list[float], now: list[float]) -> Change:
        change = assess(t, before, now, spread(t.metric))
        if change.finding == "regression":
            change = _in_cycles(change, before, now, baseline_test, current_test)
        return _runner_probes(change, baseline_test, current_test)

    out = []
    for t in thresholds:
        if t.metric != KERNELS:
            out.append(judged(t, samples_of(baseline_test, t.metric), samples_of(current_test, t.metric)))
            continue
        floor = KERNEL_FLOOR * max(value_at(baseline_test.get("metrics", {}), "kernel_ms") or 0.0, 0.0)
        for path in _kernel_paths(baseline_test, current_test):
            before, now = samples_of(baseline_test, path), samples_of(current_test, path)
            if max(_median(before) or 0.0, _median(now) or 0.0) < floor:
                continue  # a kernel too small to gate: its noise is most of its time
            each = Threshold(path, t.direction, t.amount, t.unit, t.text)
            if before and now:
                out.append(judged(each, before, now))
            else:
                found: Finding = "appeared" if now else "vanished"
                out.append(Change(each, found, _median(before), _median(now)))
    return out


def kernel_metric(metric: str) -> bool:
    """A kernel time (``kernel_ms``, one kernel's ``total_ms``): one a change of SM clock
    moves, compared in cycles where both clocks are known (here, and ``verdict.paired``)."""
    return metric == "kernel_ms" or (metric.startswith("kernels.") and metric.endswith(".total_ms"))


def _in_cycles(
    change: Change, before: list[float], now: list[float], baseline_test: dict[str, Any], current_test: dict[str, Any]
) -> Change:
    """A kernel time's regression confirmed in cycles where both SM clocks are known: the
    current times at the baseline's clock (time x clock / baseline clock). A change the
    clock explains reads ``clock``, naming both, never ``regression``."""
    if not kernel_metric(change.threshold.metric):
        return change
    f_before = value_at(baseline_test.get("metrics", {}), "nvml.sm_clock_mhz")
    f_now = value_at(current_test.get("metrics", {}), "nvml.sm_clock_mhz")
    if not f_before or not f_now or f_before == f_now:
        return change
    cycles = assess(change.threshold, before, [v * f_now / f_before for v in now], change.spread)
    clocks = f"SM clock {f_before:.0f} MHz in the baseline, {f_now:.0f} MHz now"
    held = throttle_names(_bits(current_test, "nvml.throttle_reasons"))
    if held:
        clocks += f" (held down now by: {', '.join(held)})"
    if cycles.finding == "regression":
        return replace(change, clock=f"{clocks}; a regression in cycles too")
    return replace(change, finding="clock", clock=f"{clocks}: in cycles, {cycles.finding}")


# the runner's speed, timed before each window (``capture.probe``)
RUNNER = "runner_probe_ms"
# what the host's speed moves: the window's time outside its kernels, and what it sets
ON_THE_HOST = ("wall_ms", "utilization", "overhead_ms")


def _runner_probes(change: Change, baseline_test: dict[str, Any], current_test: dict[str, Any]) -> Change:
    """A host-bound change with the runner probes of both sides beside it, where both runs
    timed them: what the reader weighs, never what decides. On an H100 host where each process ran
    at one of two speeds the probe followed the runs' host time (r 0.75-0.96), but beside a busy
    process on the same core it read anything from 1x to 7.6x, and dividing it out passed
    slower code (docs/gates.md, "The runner probe")."""
    before, now = _median(samples_of(baseline_test, RUNNER)), _median(samples_of(current_test, RUNNER))
    if change.threshold.metric not in ON_THE_HOST or before is None or now is None:
        return change
    return replace(change, runner=f"runner probe {before:.3f} ms in the baseline, {now:.3f} ms now")


def _bits(test: dict[str, Any], path: str) -> int | None:
    value = value_at(test.get("metrics", {}), path)
    return None if value is None else int(value)


def gated_comparisons(gating: Sequence[Threshold], tests: Iterable[dict[str, Any]]) -> int:
    """How many comparisons ``gating`` makes over a baseline's ``tests``: one a metric, one
    a kernel over ``KERNEL_FLOOR`` under ``kernels:+N%``; the number whose bounds share
    ``SUITE_RATE`` (at least 1)."""
    count = 0
    for test in tests:
        if not isinstance(test, dict) or not isinstance(test.get("metrics"), dict):
            continue
        floor = KERNEL_FLOOR * max(value_at(test["metrics"], "kernel_ms") or 0.0, 0.0)
        for t in gating:
            if t.metric != KERNELS:
                count += samples_of(test, t.metric) != []
                continue
            count += sum(
                (_median(samples_of(test, path)) or 0.0) >= floor and bool(samples_of(test, path))
                for path in _kernel_paths(test)
            )
    return max(count, 1)


def _kernel_paths(*tests: dict[str, Any]) -> list[str]:
    """Every kernel either report timed, by name (``kernels.NAME.total_ms``)."""
    names = {name for test in tests for name in test.get("metrics", {}).get("kernel_totals", {})}
    return [f"kernels.{name}.total_ms" for name in sorted(names)]


# a baseline whose SM clock differs by more than this ran on a clearly different clock
CLOCK_SHIFT = 0.05


def clock_note(baseline_test: dict[str, Any], current_test: dict[str, Any]) -> str | None:
    """What a comparison must say when the GPU ran at another SM clock in the baseline:
    device times scale with it (``nvml.sm_clock_mhz``)."""
    before = value_at(baseline_test.get("metrics", {}), "nvml.sm_clock_mhz")
    now = value_at(current_test.get("metrics", {}), "nvml.sm_clock_mhz")
    if not before or not now or abs(now - before) / before <= CLOCK_SHIFT:
        return None
    return f"SM clock {before:.0f} MHz in the baseline, {now:.0f} MHz now: device times scale with it"


def change_lines(
    nodeid: str,
    changes: Sequence[Change],
    note: str | None = None,
    gating: Sequence[Threshold] = (),
    decided: str | None = None,
) -> list[str]:
    """A test's lines of a comparison: what changed (``decided``: what the gate decided of
    the test, where one judged it), then each notable change (and the ``note`` that
    qualifies them all). A ``gating`` expression that cannot fail here is always listed, as
    an inert gate: a gate silently off is worse than none."""
    gates = {t.text for t in gating}
    inert = [c for c in changes if c.inert and c.threshold.text in gates]

    def notable_change(c: Change) -> bool:
        if c.threshold.text in gates:
            return c.kernel is None or c.finding != "unchanged" or c.inert  # a gated metric's line: always shown
        return c.finding not in ("unchanged", "absent")

    notable = [c for c in changes if notable_change(c) and c.kernel is None]
    # the kernels that changed, the largest change first: the lines a pull request reads
    kernels = [c for c in changes if notable_change(c) and c.kernel is not None]
    notable += sorted(kernels, key=lambda c: -abs((c.current or 0.0) - (c.baseline or 0.0)))
    names = kernel_names(notable)
    found = ", ".join(sorted({c.named(c.threshold.text in gates).split(" ")[0] for c in notable} - {"absent"}))
    found = decided or found or "unchanged"
    if inert:
        found += f"; gate inert: {', '.join(sorted({c.threshold.text for c in inert}))}"
    return [
        f"{nodeid}: {found}",
        *([f"    note: {note}"] if note else []),
        *(f"    {c.describe(names, c.threshold.text in gates)}" for c in notable),
    ]


def inert_causes(changes: Sequence[Change], gating: Sequence[Threshold]) -> dict[str, str]:
    """Each inert gating expression and why it cannot fail (the first cause of its lines)."""
    gates = {t.text for t in gating}
    out: dict[str, str] = {}
    for c in changes:
        if c.inert and c.threshold.text in gates:
            out.setdefault(c.threshold.text, c.inert_cause())
    return out


def inert_gates(changes: Sequence[Change], gating: Sequence[Threshold]) -> list[str]:
    """The gating expressions that could not fail this test, each once."""
    gates = {t.text for t in gating}
    return sorted({c.threshold.text for c in changes if c.inert and c.threshold.text in gates})


Status = Literal["compared", "new", "not compared"]


@dataclass(frozen=True, slots=True)
class Comparison:
    """One test against its baseline, made once (``baselines.gate``) and read by every
    output: the terminal, the JSON (``baseline``, ``comparisons``), JUnit, the step summary
    and the HTML page.

    ``baseline`` names the record the test was compared with (``name``, ``created``,
    ``commit``, ``branch``, ``key``, ``pooled``); ``why_not`` says why a test with a
    baseline entry was not compared (a damaged field, named)."""

    nodeid: str
    status: Status
    changes: tuple[Change, ...] = ()
    gating: tuple[Threshold, ...] = ()
    baseline: Mapping[str, Any] | None = None
    note: str | None = None
    why_not: str | None = None
    error: bool = False  # the comparison itself failed (``why_not`` says how): an error of the run
    confirmed: int = 0  # the fresh runs of the test its regressions were put to (``confirmed``)

    @property
    def regressed(self) -> list[Change]:
        """The changes that fail the test: clear regressions of a gating expression."""
        return regressions(self.changes, self.gating)

    @property
    def labels(self) -> list[str]:
        """What the verdict calls each change that fails the test (a kernel by its short name)."""
        names = kernel_names(self.regressed)
        return [c.label(names) for c in self.regressed]

    @property
    def gates(self) -> bool:
        """Whether a gating expression judged this test."""
        return bool(self.gating) and self.status == "compared"

    @property
    def inert(self) -> list[str]:
        return inert_gates(self.changes, self.gating)

    @property
    def inert_causes(self) -> dict[str, str]:
        return inert_causes(self.changes, self.gating)

    @property
    def source(self) -> str:
        """Where the baseline entry came from, as a line names it."""
        if self.baseline is None:
            return ""
        pooled = int(self.baseline.get("pooled") or 1)
        key = str(self.baseline.get("key", ""))
        return f"{key} (pooled over {pooled} runs)" if pooled > 1 else key

    def lines(self, decided: str | None = None) -> list[str]:
        """The test's lines in the summary's comparison block; ``decided``: the gate's
        decision of the test (``verdict.decision``), its first line's word."""
        if self.status == "new":
            return [f"{self.nodeid}: {NEW}"]
        if self.status == "not compared":
            return [f"{self.nodeid}: not compared: {self.why_not}"]
        return change_lines(self.nodeid, self.changes, self.note, self.gating, decided)

    def failure(self) -> str | None:
        """The test's failure message, where it clearly regressed under a gating expression."""
        regressed = self.regressed
        if not regressed:
            return None
        names = kernel_names(regressed)
        return "\n".join(
            [
                f"GPU regression against baseline {self.source}:",
                *([f"  note: {self.note}"] if self.note else []),
                *([f"  confirmed by {_runs(self.confirmed)} of the test"] if self.confirmed else []),
                *(f"  {c.describe(names)}" for c in regressed),
            ]
        )

    def change_records(self) -> list[dict[str, Any]]:
        """Each change's record for the JSON report, with whether a gating expression judged
        it (``gates``): a finding past a default threshold is listed, never a regression;
        ``line``: the change as the terminal says it, for every other output to show."""
        gates = {t.text for t in self.gating}
        names = kernel_names(self.changes)
        return [
            {**c.to_dict(), "gates": c.threshold.text in gates, "line": c.describe(names, c.threshold.text in gates)}
            for c in self.changes
        ]

    def record(self) -> dict[str, Any] | None:
        """Which baseline record the test was compared with, for the JSON report."""
        if self.baseline is None:
            return None
        return {**self.baseline, "status": self.status, **({"why_not": self.why_not} if self.why_not else {})}
