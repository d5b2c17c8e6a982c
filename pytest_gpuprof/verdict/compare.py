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

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pytest_gpuprof.analysis.levels import learn
from pytest_gpuprof.analysis.mann_whitney import ALPHA, mann_whitney_greater
from pytest_gpuprof.analysis.names import short_names
from pytest_gpuprof.analysis.run_spread import Spread
from pytest_gpuprof.analysis.throttle import throttle_names
from pytest_gpuprof.verdict.change import Change, Finding
from pytest_gpuprof.verdict.samples import samples_of, value_at
from pytest_gpuprof.verdict.thresholds import KERNELS, Threshold, kernel_metric

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.entry import Entry


def kernel_names(changes: Iterable[Change]) -> dict[str, str]:
    """The short names of the kernels of ``changes``, unique among them."""
    return short_names(c.kernel for c in changes if c.kernel is not None)


def regressions(changes: Sequence[Change], gating: Sequence[Threshold]) -> list[Change]:
    """The changes that fail: clear regressions of a ``gating`` expression (the rest are
    listed only)."""
    gates = {t.text for t in gating}
    return [c for c in changes if c.finding == "regression" and c.threshold.text in gates]


# a kernel under this share of the baseline's kernel time is neither gated nor listed: a
# 5 us fill kernel moves by 7% from process to process (H200, docs/performance-log.md)
KERNEL_FLOOR = 0.01


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


def _shown(value: float | None) -> str:
    return "?" if value is None else f"{value:.6g}"


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def compare_tests(
    thresholds: Sequence[Threshold],
    baseline_test: Entry,
    current_test: Entry,
    history: Sequence[Entry] | None = None,
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


def _in_cycles(
    change: Change, before: list[float], now: list[float], baseline_test: Entry, current_test: Entry
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


def _runner_probes(change: Change, baseline_test: Entry, current_test: Entry) -> Change:
    """A host-bound change with the runner probes of both sides beside it, where both runs
    timed them: what the reader weighs, never what decides. On an H100 host where each process ran
    at one of two speeds the probe followed the runs' host time (r 0.75-0.96), but beside a busy
    process on the same core it read anything from 1x to 7.6x, and dividing it out passed
    slower code (docs/gates.md, "The runner probe")."""
    before, now = _median(samples_of(baseline_test, RUNNER)), _median(samples_of(current_test, RUNNER))
    if change.threshold.metric not in ON_THE_HOST or before is None or now is None:
        return change
    return replace(change, runner=f"runner probe {before:.3f} ms in the baseline, {now:.3f} ms now")


def _bits(test: Entry, path: str) -> int | None:
    value = value_at(test.get("metrics", {}), path)
    return None if value is None else int(value)


def gated_comparisons(gating: Sequence[Threshold], tests: Iterable[Entry]) -> int:
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


def _kernel_paths(*tests: Entry) -> list[str]:
    """Every kernel either report timed, by name (``kernels.NAME.total_ms``)."""
    names = {name for test in tests for name in test.get("metrics", {}).get("kernel_totals", {})}
    return [f"kernels.{name}.total_ms" for name in sorted(names)]


# a baseline whose SM clock differs by more than this ran on a clearly different clock
CLOCK_SHIFT = 0.05


def clock_note(baseline_test: Entry, current_test: Entry) -> str | None:
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
