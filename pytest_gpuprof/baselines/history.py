"""``gpuprof history``: each test's metrics across the stored baselines of one machine, in
order, with the change points found in them (``analysis.changepoints``): a table in the
terminal, or a self-contained HTML page of trend charts.
"""

from __future__ import annotations

import fnmatch
import functools
import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_gpuprof.analysis.changepoints import ChangePoint, change_points
from pytest_gpuprof.analysis.descriptors import is_fraction
from pytest_gpuprof.analysis.run_spread import HISTORY_RUNS, Spread
from pytest_gpuprof.baselines import store as storage_store
from pytest_gpuprof.baselines.reference import test_of
from pytest_gpuprof.baselines.summary import SUMMARY_METRICS, Summary
from pytest_gpuprof.verdict.samples import samples_of

DEFAULT_METRICS = ("wall_ms", "kernel_ms", "utilization")


@dataclass(frozen=True, slots=True)
class Run:
    """One stored baseline's figures of one test and metric."""

    name: str  # the baseline's name (main, nightly ...)
    created: str
    commit: str
    samples: tuple[float, ...]
    # of the samples, taken once in one sort: a fleet's history holds thousands of runs
    low: float = field(init=False)
    median: float = field(init=False)
    high: float = field(init=False)

    @property
    def label(self) -> str:
        """The run as a line names it: its name and when it was made, to the minute."""
        return f"{self.name} {self.created[:16].replace('T', ' ')}".strip()

    def __post_init__(self) -> None:
        ordered = sorted(self.samples)
        middle = len(ordered) // 2
        median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        object.__setattr__(self, "low", ordered[0])
        object.__setattr__(self, "median", median)
        object.__setattr__(self, "high", ordered[-1])


@dataclass(frozen=True, slots=True)
class Series:
    test: str
    metric: str
    runs: tuple[Run, ...]
    changes: tuple[ChangePoint, ...]
    # the runs a gate would have stopped: beyond the tolerance bound of the runs before
    # them (``analysis.run_spread``, the rule of every comparison), by index
    outside: tuple[int, ...] = ()


def outside_the_spread(medians: Sequence[float]) -> tuple[int, ...]:
    """The runs whose median lies beyond the tolerance bound of the (up to
    ``HISTORY_RUNS``) runs before them, either way from their level: what a comparison
    with those runs would have said, a change it could tell from the spread between runs."""
    out = []
    for i in range(2, len(medians)):
        before = Spread.of(list(reversed(medians[max(0, i - HISTORY_RUNS) : i])))  # newest first
        if before.beyond(medians[i], 1) or before.beyond(medians[i], -1):
            out.append(i)
    return tuple(out)


def history(
    store: storage_store.Store,
    machine: str,
    pattern: str = "*",
    metrics: Sequence[str] = DEFAULT_METRICS,
    summaries: Sequence[Summary] | None = None,
) -> list[Series]:
    """Every test matching ``pattern``, each metric, over the machine's baselines in order
    (their ``created``). The default metrics come from the store's summaries; any other
    metric reads the records."""
    if summaries is None:
        summaries = store.summaries(machine)
    summaries = [s for s in summaries if not s.damaged]  # ``skipped`` names them
    full = not set(metrics) <= set(SUMMARY_METRICS)
    records = store.read_many([s.key for s in summaries]) if full else {}
    drawn = {n for s in summaries for n in s.drawn}  # ``skipped`` names them
    tests = sorted({n for s in summaries for n in s.tests if fnmatch.fnmatchcase(n, pattern)} - drawn)
    out = []
    for nodeid in tests:
        runs: dict[str, list[Run]] = {metric: [] for metric in metrics}
        for s in summaries:  # one pass a test, every metric at once
            figures = s.tests.get(nodeid)
            if figures is None or nodeid in s.problems:  # an unusable entry: ``skipped`` names it
                continue
            test = test_of(records[s.key], nodeid) if full else None
            name, commit = s.name, s.commit[:10]
            for metric in metrics:
                samples = samples_of(test, metric) if test is not None else figures.get(metric, [])
                if samples:
                    runs[metric].append(Run(name, s.created, commit, tuple(samples)))
        for metric in metrics:
            if runs[metric]:
                medians = [r.median for r in runs[metric]]
                points = same_commit_kept_whole(change_points(medians), runs[metric])
                out.append(Series(nodeid, metric, tuple(runs[metric]), tuple(points), outside_the_spread(medians)))
    return out


def axis_labels(runs: Sequence[Run]) -> list[str]:
    """What the x axis says of each run: its day where every run has a day of its own, its
    time where all share one day, both where some share one (``12-07 14:05``); its place
    where a run says no date."""
    days = [r.created[5:10] for r in runs]
    if len(set(days)) == len(days):
        shown = days
    elif len(set(days)) == 1:
        shown = [r.created[11:16] for r in runs]
    else:
        shown = [r.created[5:16].replace("T", " ") for r in runs]
    return [label or str(i + 1) for i, label in enumerate(shown)]


def same_commit_kept_whole(points: Sequence[ChangePoint], runs: Sequence[Run]) -> list[ChangePoint]:
    """The change points that fall between runs of different commits: code that did not
    change cannot have shifted a level (runs of one commit, saved one after another, differ
    by their runner alone)."""
    return [p for p in points if not (runs[p.index - 1].commit and runs[p.index - 1].commit == runs[p.index].commit)]


@functools.cache
def _fraction(metric: str) -> bool:
    return is_fraction(metric)


def _shown(metric: str, value: float) -> str:
    return f"{100 * value:.2f}%" if _fraction(metric) else f"{value:.3f}"


def table(series: Sequence[Series]) -> list[str]:
    """The history in the terminal: per test and metric, one line a run, change points marked."""
    lines = []
    for s in series:
        lines.append(f"{s.test}  {s.metric}  ({len(s.runs)} runs, {len(s.changes)} change point(s))")
        marks = {c.index: c for c in s.changes}
        shown = functools.partial(_shown, s.metric)
        for i, run in enumerate(s.runs):
            mark = marks.get(i)
            shift = f"  <- change {100 * mark.relative:+.1f}%" if mark is not None else ""
            if i in s.outside:
                shift += "  ! beyond the spread of the runs before it"
            lines.append(
                f"  {run.label:<30} {run.commit:<10} {shown(run.median):>12}"
                f"  ({shown(run.low)} .. {shown(run.high)}){shift}"
            )
    return lines


def page(series: Sequence[Series], machine: str) -> str:
    """One self-contained page: a trend chart per test and metric, its rounds as a band
    (lowest to highest), the medians as a line, each change point marked with its commit."""
    charts = "\n".join(_chart(s, i) for i, s in enumerate(series))
    data = json.dumps([{"test": s.test, "metric": s.metric, "changes": [c.index for c in s.changes]} for s in series])
    safe = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return _PAGE.format(machine=html.escape(machine), charts=charts, data=safe)


def _chart(s: Series, number: int) -> str:
    width, height, left, top, bottom = 900, 220, 70, 16, 40
    lows = [r.low for r in s.runs]
    highs = [r.high for r in s.runs]
    lo, hi = min(lows), max(highs)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    n = len(s.runs)

    def x(i: int) -> float:
        return left + (width - left - 20) * (i / (n - 1) if n > 1 else 0.5)

    def y(v: float) -> float:
        return top + (height - top - bottom) * (1 - (v - lo) / (hi - lo))

    band = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(highs))
    band += " " + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in reversed(list(enumerate(lows))))
    line = " ".join(f"{x(i):.1f},{y(r.median):.1f}" for i, r in enumerate(s.runs))
    parts = [
        f'<polygon class="band" points="{band}" fill="#9cc3ea" fill-opacity="0.45"/>',
        f'<polyline class="median" points="{line}" fill="none" stroke="#1f5fa8" stroke-width="1.5"/>',
        f'<text x="4" y="{y(hi - pad) + 4:.1f}" font-size="10">{html.escape(_shown(s.metric, hi - pad))}</text>',
        f'<text x="4" y="{y(lo + pad) + 4:.1f}" font-size="10">{html.escape(_shown(s.metric, lo + pad))}</text>',
    ]
    labels = axis_labels(s.runs)
    every = max(1, math.ceil(n * 5.5 * max(map(len, labels), default=1) / (width - left - 20)))
    for i, run in enumerate(s.runs):
        tip = html.escape(f"{run.label} {run.commit}: {_shown(s.metric, run.median)}")
        parts.append(
            f'<circle cx="{x(i):.1f}" cy="{y(run.median):.1f}" r="3" fill="#1f5fa8"><title>{tip}</title></circle>'
        )
        if i % every == 0:  # as many labels as fit side by side
            label = html.escape(labels[i])
            parts.append(f'<text x="{x(i) - 10:.1f}" y="{height - bottom + 14}" font-size="9">{label}</text>')
    for c in s.changes:
        run = s.runs[c.index]
        cx = (x(c.index - 1) + x(c.index)) / 2
        text = html.escape(f"change {100 * c.relative:+.1f}% at {run.commit or run.label}")
        parts.append(
            f'<line class="change" x1="{cx:.1f}" x2="{cx:.1f}" y1="{top}" y2="{height - bottom}" stroke="#c0392b" stroke-dasharray="4 3"/>'
        )
        parts.append(f'<text x="{cx + 4:.1f}" y="{top + 10}" font-size="10" fill="#c0392b">{text}</text>')
    title = html.escape(f"{s.test}: {s.metric}")
    return (
        f'<section data-index="{number}"><h2>{title}</h2>'
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">{"".join(parts)}</svg></section>'
    )


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>pytest-gpuprof history</title>
<style>body{{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}}h1{{font-size:18px}}
h2{{font-size:14px;margin:14px 0 4px;overflow-wrap:anywhere}}svg{{border:1px solid #ddd;background:#fff}}</style>
</head><body><h1>pytest-gpuprof: history of machine {machine}</h1>
<p>Each chart: the rounds of every stored run as a band (lowest to highest), the medians as a line, and the change
points (a level shift beyond the noise of the runs around it) as dashed lines with their commit.</p>
{charts}
<script type="application/json" id="data">{data}</script>
</body></html>
"""


def skipped(store: storage_store.Store, summaries: Sequence[Summary], pattern: str = "*") -> list[str]:
    """What a history left out, a line each: the damaged records (``prune`` removes them)
    and the test entries with a field a figure cannot be read from; the tests measured
    inside hypothesis examples, whose figures depend on the sizes drawn: not a trend."""
    lines = [f"skipped {store.where(key)}: {why} (gpuprof prune removes it)" for key, why in store.damaged.items()]
    lines += [f"warning: {store.where(key)} {why}" for key, why in store.doubtful.items()]
    for s in summaries:
        lines += [
            f"skipped {store.where(s.key)}: test {nodeid}: {problem}"
            for nodeid, problem in s.problems.items()
            if fnmatch.fnmatchcase(nodeid, pattern)
        ]
    drawn = sorted({n for s in summaries for n in s.drawn if fnmatch.fnmatchcase(n, pattern)})
    lines += [
        f"not charted: {nodeid}: measured inside hypothesis examples, its figures are the last example's, "
        "whose sizes were drawn (they change with the draw, not the code)"
        for nodeid in drawn
    ]
    return lines
