"""What a session reports of its records (``verdict.record``): the terminal table, the
JSON report, the machine record, the step summary."""

from __future__ import annotations

import datetime as dt
import hashlib
import platform
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_gpuprof.analysis.metrics import Metrics
from pytest_gpuprof.output import columns
from pytest_gpuprof.output.schema import SCHEMA
from pytest_gpuprof.output.text import describe_breach, explain, memory_top, ms, pct
from pytest_gpuprof.verdict.entry import Entry
from pytest_gpuprof.verdict.record import GpuRecord, WindowBreach

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.run_gate import RunGate


class Machine(TypedDict, total=False):
    """The machine record of a report (``machine_record``): what a baseline is matched by
    (``id``), what the header and the outputs name, the processes' loaded libraries
    (``environment``) and the devices the tests ran on. A project's
    ``pytest_gpuprof_machine_info`` hook may add its own keys."""

    id: str
    gpu: str
    driver: str
    pcie: str
    backend: str
    truth: str
    host: str
    clock: str
    environment: dict[str, str]
    devices: list[int]


def machine_id(machine: Mapping[str, object]) -> str:
    """A stable id for the measuring setup: GPU model, driver, PCIe link and backend, and
    the host backend's virtual clock (whose figures no real-time run shares)."""
    key = "|".join(str(machine.get(k, "")) for k in ("gpu", "driver", "pcie", "backend"))
    if machine.get("clock") == "virtual":
        key += "|virtual"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{machine.get('backend', 'host')}-{digest}"


def machine_record(device: dict[str, Any], truth: str, clock: str = "real") -> Machine:
    machine: Machine = {
        "gpu": device.get("name", ""),
        "driver": device.get("driver", ""),
        "pcie": device.get("pcie", "none"),
        "backend": device.get("backend", "host"),
        "truth": truth,
        "host": platform.node(),
        "clock": clock,
    }
    return {"id": machine_id(machine), **machine}


def build_report(tests: list[Entry], machine: Machine, source: dict[str, str] | None = None) -> dict[str, Any]:
    """A report: when, on what, from which commit and branch (``source``), and the tests."""
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
        **(source or {}),
        "machine": machine,
        "tests": tests,
    }


def rows(record: GpuRecord) -> list[list[str]]:
    """A test's lines of the terminal table: its reported window's, then each other window
    whose breaches count against it (worst first), each naming its window."""
    if record.windows <= 1 or not record.breached_windows:
        return [row(record, record.metrics)]
    return [
        row(record, w.metrics, f"{record.nodeid} [{w.label} {w.index + 1}/{w.count}]") for w in record.breached_windows
    ]


def row_figures(record: GpuRecord) -> list[dict[str, float]]:
    """The figures of each of ``rows``' lines, by metric path (``output.columns``)."""
    if record.windows <= 1 or not record.breached_windows:
        return [record.metrics.flat()]
    return [w.metrics.flat() for w in record.breached_windows]


def window_rows(record: GpuRecord) -> list[dict[str, Any]]:
    """One CSV row per window of the test: which, its outcome and verdict, its figures."""
    windows = record.all_windows or [("test", record.metrics)]
    head = {"test": record.nodeid, "outcome": record.ending.outcome, "verdict": record.status}
    return [{**head, "window": i, "label": label, **m.flat()} for i, (label, m) in enumerate(windows)]


def row(record: GpuRecord, m: Metrics, name: str | None = None) -> list[str]:
    """A line of the terminal table: the table's own columns (``columns.OWN``)."""
    return columns.cells(record, m, name)


def first_rows(tests: list[Entry], limit: int | None, order: list[int] | None = None) -> tuple[list[int], str | None]:
    """Which tests the terminal table shows (indices, in that order) and the line that
    counts the rest: in ``order`` (``--gpu-sort``), else breaches and failed tests first,
    then the largest kernel-idle, as pytest shows its failures first and counts the rest."""

    def failing(t: Entry) -> bool:
        return t.get("outcome") == "failed" or str(t.get("verdict", "")).startswith(("FAIL", "warn"))

    def idle(t: Entry) -> float:
        return float(t.get("metrics", {}).get("overhead_ms") or 0.0)

    if order is None:
        order = sorted(range(len(tests)), key=lambda i: (not failing(tests[i]), -idle(tests[i])))
    if limit is None or len(order) <= limit:
        return order, None
    rest = order[limit:]
    bad = sum(failing(tests[i]) for i in rest)
    judged = sum(str(tests[i].get("verdict", "-")) not in ("-", "skipped") for i in rest)
    state = f"{bad:,} of them failed or breached" if bad else "none failed or breached"
    if not bad and judged < len(rest):
        state += f" ({len(rest) - judged:,} with no budget or gate)"
    return order[:limit], f"and {len(rest):,} more measured, {state}; --gpu-summary=all lists them"


def breach_details(record: GpuRecord) -> list[str]:
    """The budget message of a breaching test, for the session summary."""
    if not record.breaches:
        return []
    windows = record.breached_windows or [WindowBreach(0, "", 1, tuple(record.breaches), record.metrics)]
    lines = []
    for w in windows:
        head = "; ".join(describe_breach(b) for b in w.breaches)
        where = f" (window '{w.label}', {w.index + 1} of {w.count})" if w.where else ""
        lines += [
            f"{record.nodeid}{where}: {head}  [truth: {w.metrics.truth}]",
            *(f"  {line}" for line in explain(w.metrics)),
        ]
    return lines


def _code_span(text: str) -> str:
    """``text`` as a Markdown code span inside a table cell: fenced by one more backtick
    than its longest run of them (CommonMark), its pipes escaped."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def markdown_summary(
    tests: list[Entry],
    machine: Machine,
    compare: list[str],
    waited: str | None = None,
    gate: RunGate | None = None,
) -> str:
    """The run as a Markdown table, for ``$GITHUB_STEP_SUMMARY``: the gate's headline first
    (the baseline, and the tests by decision), each undecided test, then the table."""
    lines = []
    if gate is not None:
        lines += [f"**{gate.headline()}**", ""]
        lines += [f"- {_code_span(nodeid)}: undecided: {reason}" for nodeid, reason in gate.undecided_reasons()]
        lines += [""] if gate.undecided else []
    lines += [
        f"### GPU utilization ({machine.get('gpu')}, backend {machine.get('backend')}, truth {machine.get('truth')})",
        "",
        "| test | wall ms | utilization | reported | overhead ms | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for t in tests:
        m = t["metrics"]
        lines.append(
            f"| {_code_span(t['nodeid'])} | {m['wall_ms']:.1f} | {pct(m['utilization'])} | {pct(m['reported_utilization'])} "
            f"| {ms(m.get('overhead_ms'))} | {t.get('verdict', '-')} |"
        )
    if waited:
        lines += ["", waited.removeprefix("gpuprof: ")]
    if compare:
        lines += ["", "```", *compare, "```"]
    return "\n".join(lines) + "\n\n"


def section(record: GpuRecord, compare: list[str], memory_places: int) -> str:
    """The ``gpuprof`` report section of a test the plugin failed: the figures of the
    windows that failed it, its changes against the baseline, the places that held the most
    device memory at its peak (``--gpu-memory-top``)."""
    shown = ("test", "wall_ms", "kernel_ms", "copy_ms", "utilization", "reported_utilization", "cause")
    figures = zip(rows(record), row_figures(record), strict=True)
    lines = columns.table([(record.nodeid, r, f) for r, f in figures], shown)
    if compare:
        lines += ["", "against the baseline:", *compare]
    top = memory_top(record.nodeid, record.metrics.to_dict(), memory_places)
    if top:
        lines += ["", *top]
    return "\n".join(lines)
