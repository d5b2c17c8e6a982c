"""``--gpu-html=PATH``: one self-contained HTML report (inline script and SVG, no fetches).

A summary table of every test (sortable, failures first) and, per test, its timeline lanes
with zoom, its metrics, its budget and each breach. Lanes are aggregated to at most
``MAX_ITEMS`` drawn items, so tens of thousands of kernels stay light. Every name from a
test (ids, steps, kernels) reaches the page as JSON data and is set as text, never markup.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis.lanes import bucket, build
from pytest_gpuprof.analysis.memory import step_peak
from pytest_gpuprof.analysis.metrics import Metrics, overlap_schedule
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.output.page import PAGE
from pytest_gpuprof.output.text import describe_breach, explain, explain_memory
from pytest_gpuprof.verdict.decision import why_of
from pytest_gpuprof.verdict.entry import Entry
from pytest_gpuprof.verdict.record import GpuRecord

if TYPE_CHECKING:
    from pytest_gpuprof.output.report import Machine

MAX_ITEMS = 1500


def comparison_lines(record: GpuRecord) -> list[str]:
    """The test's comparison as the page shows it: which baseline record, then each change
    that is not ``unchanged``, its line as the terminal gives it (a record from before
    records held their line: built from its figures)."""
    b = record.compared.baseline
    if b is None:
        return []
    commit = f", commit {b['commit'][:12]}" if b.get("commit") else ""
    lines = [f"compared with {b['key']} ({b['name']}, {str(b['created'])[:19]}{commit}): {b['status']}"]
    if b.get("why_not"):
        lines.append(str(b["why_not"]))

    def shown(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    for c in record.compared.changes:
        if c["finding"] in ("unchanged", "absent"):
            continue
        if isinstance(c.get("line"), str):  # as the terminal says it: spread, clocks, probes
            lines.append(c["line"])
            continue
        p = f"; p={c['p']:.3g}" if isinstance(c.get("p"), float) else ""
        finding = c["finding"]
        if finding == "regression" and not c.get("gates", True):  # as the terminal says it
            finding = f"changed (beyond the default {c['threshold']}, not a gate)"
        lines.append(
            f"{c['metric']}: {shown(c['before'])} -> {shown(c['after'])} (limit {c['threshold']}{p}): {finding}"
        )
    return lines + why_of(record.compared.gate)


def page_data(record: GpuRecord, timeline: Timeline | None) -> dict[str, Any]:
    m = record.metrics
    bounds: Mapping[str, tuple[int, int]] = m.memory.bounds if m.memory is not None else {}
    data: dict[str, Any] = {
        "id": record.nodeid,
        "outcome": record.ending.outcome,
        "reruns": record.ending.reruns,
        "xfail": record.ending.xfail,
        "verdict": record.status,
        # each breach with the text the message gives it (its metric's own unit)
        "breaches": [{**b.to_dict(), "text": describe_breach(b)} for b in record.breaches],
        "limits": record.budget.limits(),
        "explain": [*explain(m), *explain_memory(m, record.breaches, always=True)],
        "compare": comparison_lines(record),
        "metrics": {
            "wall_ms": m.wall_ms,
            "kernel_ms": m.kernel_ms,
            "utilization": m.utilization,
            "reported_utilization": m.reported_utilization,
            "overhead_ms": m.overhead_ms,
            "truth": m.truth,
        },
        # a step's memory peak known as a range only (JAX's statistics): its least and most
        "steps": {
            name: {**s.to_dict(), "memory_peak_range": bounds.get(step_peak(name))} for name, s in m.steps.items()
        },
        "lanes": [],
        "counters": [],
        "span_us": 0,
    }
    if timeline is not None:
        span = timeline.end - timeline.start
        lanes, counters = build(timeline)
        data["span_us"] = span / 1000
        data["lanes"] = [
            {
                "name": lane.name,
                "kind": lane.kind,
                "items": [
                    [i.start / 1000, i.end / 1000, i.label, i.count, i.args]
                    for i in bucket(
                        lane.items, span, MAX_ITEMS, f"{lane.kind}s", by_label=lane.kind in ("idle", "host")
                    )
                ],
            }
            for lane in lanes
        ]
        data["lanes"] += _predicted_lanes(m, timeline)
        data["counters"] = [
            {
                "name": c.name,
                "unit": c.unit,
                "points": [[t / 1000, v] for t, v in c.points[:: max(1, len(c.points) // MAX_ITEMS)]],
            }
            for c in counters
        ]
    return data


def _predicted_lanes(m: Metrics, timeline: Timeline) -> list[dict[str, Any]]:
    """Each ``overlap:STEP`` prediction as two lanes under the measured ones: the step's
    work one unit after another on its own engine, and the rest of each unit."""
    lanes = []
    for scenario in m.what_if:
        kind, _, step = scenario.partition(":")
        schedule = overlap_schedule(timeline, step) if kind == "overlap" else None
        if schedule is None:
            continue
        t0 = timeline.start
        for name, spans in ((step, schedule[0]), ("the rest of each unit", schedule[1])):
            lanes.append(
                {
                    "name": f"what if {scenario}: {name}",
                    "kind": "predicted",
                    "items": [[(s - t0) / 1000, (e - t0) / 1000, f"{name} (predicted)", 1, {}] for s, e in spans],
                }
            )
    return lanes


def embedded(data: Any) -> str:
    """``data`` as JSON that may stand inside the page's ``<script>``: no raw <, > or &,
    so that nothing in it can close the script or open a comment."""
    text = json.dumps(data, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_chunks(tests: Iterable[str], machine: Machine) -> Iterator[str]:
    """The page in pieces, from each test's ``embedded(page_data(...))``: a run of many
    tests is written as it is read, never held whole."""
    head, tail = PAGE.split("__DATA__")
    yield head + '{"machine": ' + embedded(machine) + ', "tests": ['
    for i, test in enumerate(tests):
        yield ("," if i else "") + test
    yield "]}" + tail


def render(tests: Iterable[Entry], machine: Machine) -> str:
    """The page, from each test's ``page_data``."""
    return "".join(render_chunks(map(embedded, tests), machine))
