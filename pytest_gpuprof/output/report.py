"""What a session reports: per-test records, the terminal table, the JSON report."""

from __future__ import annotations

import datetime as dt
import hashlib
import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis.metrics import UNATTRIBUTED, Metrics
from pytest_gpuprof.analysis.model import RECORDS_LOST
from pytest_gpuprof.analysis.names import fit
from pytest_gpuprof.output.schema import SCHEMA
from pytest_gpuprof.output.text import describe_breach, explain, ms, pct
from pytest_gpuprof.verdict.budget import Breach, Budget, not_measured
from pytest_gpuprof.verdict.outcome import Check, TestVerdict

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.decision import RunGate


@dataclass(frozen=True, slots=True)
class WindowBreach:
    """One window whose breaches count against its test: which, its breaches, its figures."""

    index: int
    label: str
    count: int  # the test's windows
    breaches: tuple[Breach, ...]
    metrics: Metrics

    @property
    def where(self) -> tuple[str, int, int] | None:
        """Which window, for a message: ``None`` for a test of one window."""
        return (self.label, self.index, self.count) if self.count > 1 else None

    def to_dict(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "window": self.index,
            "label": self.label,
            "breaches": [b.key for b in self.breaches],
            "wall_ms": m.wall_ms,
            "utilization": m.utilization,
        }


@dataclass
class GpuRecord:
    """A measured test: its reported window's figures, and every record its verdict is
    built from (``verdict``)."""

    nodeid: str
    metrics: Metrics
    budget: Budget
    breaches: list[Breach]  # that count against the test: the reported window's, or an uncaught check()'s
    enforced: bool
    windows: int = 1
    examples: int = 0  # of the windows, those measured inside hypothesis examples
    outcome: str = "passed"  # the final run's, where a rerun plugin repeated the test
    xfail: bool = False
    reruns: int = 0  # how many times a rerun plugin repeated it before that outcome
    device: int = 0
    checks: list[Check] = field(default_factory=list)
    expected: list[Breach] = field(default_factory=list)  # breaches a check() the test caught had raised
    failed_check: bool = False  # a check() raised and the test did not catch it
    warned_as_error: bool = False  # a breach's warning failed the test (-W error)
    # the limits that could not be judged, with the reason; device work in no window
    unjudged: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    # every window whose breaches count, worst first (the reported one, ``metrics``, first)
    breached_windows: list[WindowBreach] = field(default_factory=list)
    # the comparison with the baseline: each change's record, the gating metrics that
    # regressed, the gating expressions that could not fail; whether a gate applied
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] | None = None  # which baseline record: name, created, commit, key, pooled
    regressions: list[str] = field(default_factory=list)
    inert: list[str] = field(default_factory=list)
    gated: bool = False
    # what the gate decided (``verdict.decision.gate_entry``); the figures it left undecided,
    # and whether that failed the test (--gpu-compare-undecided=fail)
    gate: dict[str, Any] | None = None
    undecided: list[str] = field(default_factory=list)
    undecided_failed: bool = False
    leaks: list[str] = field(default_factory=list)
    # --gpu-exclusive: how long the test waited for its device, before any window, and whom for
    waited_ms: float = 0.0
    waited_for: str = ""
    # every window of the test, by label, for the CSV file (``window_rows``)
    all_windows: list[tuple[str, Metrics]] = field(default_factory=list)

    @property
    def verdict(self) -> TestVerdict:
        """The test's one verdict, from every record above (``verdict.outcome``)."""
        return TestVerdict(
            outcome=self.outcome,
            xfail=self.xfail,
            budget_set=not self.budget.empty,
            gated=self.gated,
            breaches=tuple(self.breaches),
            breaches_failed=self.enforced or self.failed_check or self.warned_as_error,
            expected=tuple(self.expected),
            regressions=tuple(self.regressions),
            undecided=tuple(self.undecided),
            undecided_failed=self.undecided_failed,
            inert=tuple(self.inert),
            leaks=tuple(self.leaks),
            unjudged=tuple(self.unjudged) or tuple(not_measured(self.budget, self.metrics)),
            records_lost=any(note.startswith(RECORDS_LOST) for note in self.metrics.notes),
        )

    @property
    def status(self) -> str:
        return self.verdict.status

    def properties(self) -> list[tuple[str, object]]:
        """The headline figures as JUnit XML properties (``record_property``)."""
        m = self.metrics
        figures: list[tuple[str, object]] = [
            ("gpuprof.truth", m.truth),
            ("gpuprof.wall_ms", round(m.wall_ms, 3)),
        ]
        for name, digits in (("kernel_ms", 3), ("utilization", 4), ("overhead_ms", 3), ("reported_utilization", 4)):
            value = getattr(m, name)
            if value is not None:
                figures.append((f"gpuprof.{name}", round(value, digits)))
        figures.append(("gpuprof.verdict", self.status))
        if self.baseline is not None:
            figures.append(("gpuprof.baseline", self.baseline["key"]))
        if self.gate is not None:
            figures.append(("gpuprof.gate", self.gate["decision"]))
            figures += [("gpuprof.undecided", f"{u['metric']}: {u['why']}") for u in self.gate["undecided"]]
        if self.reruns:
            figures.append(("gpuprof.reruns", self.reruns))
        return figures

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "nodeid": self.nodeid,
            "outcome": self.outcome,
            "reruns": self.reruns,
            "metrics": self.metrics.to_dict(),
            "rounds": {path: s.to_dict() for path, s in self.metrics.rounds.items()},
            "budget": {"limits": self.budget.limits(), "breaches": [b.to_dict() for b in self.breaches]},
            "windows": self.windows,
            "verdict": self.status,
            "judgement": self.verdict.to_dict(),
            "device": self.device,
            "waited_ms": round(self.waited_ms, 3),
        }
        if self.breached_windows and self.windows > 1:
            out["breached_windows"] = [w.to_dict() for w in self.breached_windows]
        if self.waited_for:
            out["waited_for"] = self.waited_for
        if self.checks:
            out["checks"] = [c.to_dict() for c in self.checks]
        if self.baseline is not None:
            out["baseline"] = self.baseline
        if self.comparisons:
            out["comparisons"] = self.comparisons
        if self.gate is not None:
            out["gate"] = self.gate
        if self.outside:
            out["outside_windows"] = self.outside
        if self.xfail:
            out["xfail"] = True
        if self.examples:
            out["examples"] = self.examples
        return out


def machine_id(machine: dict[str, Any]) -> str:
    """A stable id for the measuring setup: GPU model, driver, PCIe link and backend, and
    the host backend's virtual clock (whose figures no real-time run shares)."""
    key = "|".join(str(machine.get(k, "")) for k in ("gpu", "driver", "pcie", "backend"))
    if machine.get("clock") == "virtual":
        key += "|virtual"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{machine.get('backend', 'host')}-{digest}"


def machine_record(device: dict[str, Any], truth: str, clock: str = "real") -> dict[str, Any]:
    machine = {
        "gpu": device.get("name", ""),
        "driver": device.get("driver", ""),
        "pcie": device.get("pcie", "none"),
        "backend": device.get("backend", "host"),
        "truth": truth,
        "host": platform.node(),
        "clock": clock,
    }
    return {"id": machine_id(machine), **machine}


def build_report(
    tests: list[dict[str, Any]], machine: dict[str, Any], source: dict[str, str] | None = None
) -> dict[str, Any]:
    """A report: when, on what, from which commit and branch (``source``), and the tests."""
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
        **(source or {}),
        "machine": machine,
        "tests": tests,
    }


def revision(folder: Path) -> dict[str, str]:
    """The commit and branch of the git checkout holding ``folder``; none outside one."""
    out: dict[str, str] = {}
    for key, args in (("commit", ["rev-parse", "HEAD"]), ("branch", ["rev-parse", "--abbrev-ref", "HEAD"])):
        try:
            done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return {}
        if done.returncode != 0 or not done.stdout.strip():
            return {}
        out[key] = done.stdout.strip()
    return out


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
    head = {"test": record.nodeid, "outcome": record.outcome, "verdict": record.status}
    return [{**head, "window": i, "label": label, **m.flat()} for i, (label, m) in enumerate(windows)]


def row(record: GpuRecord, m: Metrics, name: str | None = None) -> list[str]:
    """A line of the terminal table: wall, true and reported utilization, overhead, the
    largest idle cause, the verdict."""
    causes = [c for c in m.idle_by_step() if c[1] > 0]
    top = max(causes, key=lambda c: c[1], default=(UNATTRIBUTED, 0.0))
    return [
        name or record.nodeid,
        f"{m.wall_ms:.1f}",
        pct(m.utilization),
        pct(m.reported_utilization),
        ms(m.overhead_ms),
        _cause(top, m),
        record.status,
    ]


def _cause(top: tuple[str, float], m: Metrics) -> str:
    """The largest idle cause; for unattributed idle, the host code that most explains it."""
    if top[1] <= 0:
        return "-"
    cause = f"{top[0]} {top[1]:.1f} ms"
    if top[0] == UNATTRIBUTED and m.idle_by_code and m.unattributed_ms:
        where, spent = m.idle_by_code[0]
        cause += f", {spent / m.unattributed_ms:.0%} in {where}"
    return fit(cause)  # a column, not a paragraph: the JSON and the message keep it whole


def first_rows(
    tests: list[dict[str, Any]], limit: int | None, order: list[int] | None = None
) -> tuple[list[int], str | None]:
    """Which tests the terminal table shows (indices, in that order) and the line that
    counts the rest: in ``order`` (``--gpu-sort``), else breaches and failed tests first,
    then the largest kernel-idle, as pytest shows its failures first and counts the rest."""

    def failing(t: dict[str, Any]) -> bool:
        return t.get("outcome") == "failed" or str(t.get("verdict", "")).startswith(("FAIL", "warn"))

    def idle(t: dict[str, Any]) -> float:
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
    tests: list[dict[str, Any]],
    machine: dict[str, Any],
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
