"""A test's record, built once at the end of its call from what its profiler gathered: its
windows judged on its budget, every ``check()`` and whether the test caught its raise (the
window rule: docs/design.md), the window it is reported by, the device work no window held,
and its comparison with the baseline. The verdict and every output read this record; the
test's tear-down adds its end (``Ending``) with ``dataclasses.replace``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_gpuprof.verdict.outcome import Check, Judged, window_rule
from pytest_gpuprof.verdict.record import GpuRecord, WindowBreach

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.analysis.timeline import Timeline
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.windows import Window
    from pytest_gpuprof.verdict.budget import Breach, Budget
    from pytest_gpuprof.verdict.comparison import Comparison
    from pytest_gpuprof.verdict.record import Compared

__all__ = ["Built", "build"]


@dataclass(frozen=True, slots=True)
class Built:
    """A test's record, with what its outputs need beside it: the timeline of the window it
    is reported by (``primary``), its comparison with the baseline (None: none made), and
    the windows whose traces show it (the reported one first, then every other one whose
    breach counts)."""

    record: GpuRecord
    timeline: Timeline | None
    comparison: Comparison | None
    primary: int
    shown: tuple[tuple[int, Window], ...]


def build(
    nodeid: str,
    profiler: Profiler,
    raised: BaseException | None,
    *,
    enforced: bool,
    device: int,
    compare: Callable[[GpuRecord], tuple[Comparison, Compared]] | None = None,
) -> Built | None:
    """The test's record (``Built``); ``None`` where it measured nothing.
    ``raised``: what the call raised, if anything; ``compare``: the test against the
    baseline, from its figures (the record leaves here with its comparison)."""
    whole = not profiler.windows  # the test so far becomes its one window
    windows = profiler.final_windows()
    if not windows:
        return None
    budget, checks, failing, failing_metrics = _checks(profiler, windows, raised, whole)
    judged_windows = [Judged(w.verdict.breaches, w.example) for w in windows]
    counted, expected = window_rule(judged_windows, checks, failing, failed=raised is not None)
    worst = counted[0].window if counted else None
    primary = worst if worst is not None else _primary(windows)
    metrics = windows[primary].metrics
    if failing is not None and failing_metrics is not None and worst == failing.window:
        metrics = failing_metrics  # what the failing check judged
    problems = profiler.problems()
    if problems:
        metrics = replace(metrics, notes=(*metrics.notes, *problems))
    window = windows[primary]
    record = GpuRecord(
        nodeid=nodeid,
        metrics=metrics,
        budget=budget,
        breaches=tuple(counted),
        enforced=enforced,
        windows=len(windows),
        examples=sum(w.example for w in windows),
        device=device,
        checks=tuple(checks),
        expected=tuple(expected),
        failed_check=failing is not None,
        unjudged=tuple(window.verdict.unjudged),
        breached_windows=tuple(_breached_windows(windows, counted, primary, metrics)),
        outside=tuple(profiler.collector.outside),
        all_windows=tuple((w.label, w.metrics) for w in windows),
    )
    comparison = None
    if compare is not None:  # from the figures above: the record is made with it
        comparison, compared = compare(record)
        record = replace(record, compared=compared)
    shown = [primary, *sorted({b.window for b in counted if b.window not in (None, primary)})]
    return Built(record, window.timeline, comparison, primary, tuple((i, windows[i]) for i in shown))


def _checks(
    profiler: Profiler, windows: list[Window], raised: BaseException | None, whole: bool
) -> tuple[Budget, list[Check], Check | None, Metrics | None]:
    """Every ``check()`` of the test, and whether the test caught its raise; the budget
    they all add up to; the check whose raise failed the test, with the figures it judged."""
    from pytest_gpuprof.measure.errors import GpuBudgetExceeded

    budget = profiler.budget
    raised_errors: list[BaseException] = [c.error for c in profiler.verdicts if c.error is not None]
    raised_errors += [w.error for w in windows if w.error is not None]
    uncaught = None
    if raised is not None and any(raised is e for e in raised_errors):
        uncaught = raised
    elif isinstance(raised, GpuBudgetExceeded) and raised_errors:
        uncaught = raised_errors[-1]  # re-raised by a wrapper (hypothesis replays the example)
    checks: list[Check] = []
    failing, failing_metrics = None, None
    for checked in profiler.verdicts:
        budget = checked.verdict.budget.merged_over(budget)
        # a raise hypothesis caught while it searched is not one the test caught
        caught = checked.error is not None and checked.error is not uncaught
        caught = caught and not (checked.example and raised is not None)
        judged = 0 if whole and checked.window is None else checked.window
        checks.append(Check(checked.verdict.breaches, expected=caught, asked=checked.asked, window=judged))
        if checked.error is not None and checked.error is uncaught:
            failing, failing_metrics = checks[-1], checked.metrics
    return budget, checks, failing, failing_metrics


def _breached_windows(
    windows: list[Window], counted: list[Breach], primary: int, metrics: Metrics
) -> list[WindowBreach]:
    """Every window whose breaches count against the test, worst first, with its figures
    (the reported window's as the record holds them)."""
    order = list(dict.fromkeys(b.window for b in counted))
    return [
        WindowBreach(
            index if index is not None else primary,
            windows[index if index is not None else primary].label,
            len(windows),
            tuple(b for b in counted if b.window == index),
            metrics if index in (None, primary) else windows[index].metrics,
        )
        for index in order
    ]


def _primary(windows: list[Window]) -> int:
    """The window a test is reported by: the first whose breach counts (not settled inside
    its hypothesis example), else the first with a breach, else the last."""
    breaching = [i for i, w in enumerate(windows) if w.verdict.breached]
    counting = [i for i in breaching if not windows[i].settled]
    return (counting or breaching or [len(windows) - 1])[0]
