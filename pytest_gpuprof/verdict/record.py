"""A test's record: everything its verdict and every output read, frozen.

It is made twice at most: ``measure.record.build`` at the end of the test's call (its
windows judged, its comparison with the baseline, ``Compared``), and once more at its
tear-down, adding what only the end knows (``Ending``: the outcome, reruns, the wait for the
device, leaks) with ``dataclasses.replace``. Nothing else writes a field of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis.metrics import Metrics
from pytest_gpuprof.analysis.model import RECORDS_LOST
from pytest_gpuprof.verdict.budget import Breach, Budget, not_measured
from pytest_gpuprof.verdict.entry import Entry
from pytest_gpuprof.verdict.outcome import Check, TestVerdict

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.comparison import Comparison

__all__ = ["Compared", "Ending", "GpuRecord", "WindowBreach"]


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


@dataclass(frozen=True, slots=True)
class Compared:
    """The test against its baseline, as its record keeps it: each change's record, which
    baseline record, the gating metrics that regressed, the gating expressions that could
    not fail, whether a gate applied, what the gate decided (``decision.gate_entry``), the
    figures it left undecided and whether that fails the test."""

    changes: tuple[dict[str, Any], ...] = ()
    baseline: dict[str, Any] | None = None  # name, created, commit, key, pooled
    regressions: tuple[str, ...] = ()
    inert: tuple[str, ...] = ()
    gated: bool = False
    gate: dict[str, Any] | None = None
    undecided: tuple[str, ...] = ()
    undecided_failed: bool = False

    @classmethod
    def of(cls, comparison: Comparison, undecided_fails: bool) -> Compared:
        from pytest_gpuprof.verdict.decision import decision, gate_entry

        undecided = decision(comparison)[1]
        return cls(
            changes=tuple(comparison.change_records()),
            baseline=comparison.record(),
            regressions=tuple(comparison.labels),
            inert=tuple(comparison.inert),
            gated=comparison.gates,
            gate=gate_entry(comparison),
            undecided=tuple(u.what for u in undecided),
            undecided_failed=bool(undecided) and undecided_fails,
        )


@dataclass(frozen=True, slots=True)
class Ending:
    """What the test's end adds: the final run's outcome (where a rerun plugin repeated the
    test, and how many times before), whether it was an expected failure, the wait for its
    device (``--gpu-exclusive``: how long, whom for), the device memory it kept, and whether
    a breach's warning failed it (``-W error``)."""

    outcome: str = "passed"
    xfail: bool = False
    reruns: int = 0
    waited_ms: float = 0.0
    waited_for: str = ""
    leaks: tuple[str, ...] = ()
    warned_as_error: bool = False


@dataclass(frozen=True)
class GpuRecord:
    """A measured test: its reported window's figures, every record its verdict is built
    from (``verdict``), its comparison (``compared``) and its end (``ending``)."""

    nodeid: str
    metrics: Metrics
    budget: Budget
    breaches: tuple[Breach, ...]  # that count against the test: the reported window's, or an uncaught check()'s
    enforced: bool
    windows: int = 1
    examples: int = 0  # of the windows, those measured inside hypothesis examples
    device: int = 0
    checks: tuple[Check, ...] = ()
    expected: tuple[Breach, ...] = ()  # breaches a check() the test caught had raised
    failed_check: bool = False  # a check() raised and the test did not catch it
    # the limits that could not be judged, with the reason; device work in no window
    unjudged: tuple[str, ...] = ()
    outside: tuple[str, ...] = ()
    # every window whose breaches count, worst first (the reported one, ``metrics``, first)
    breached_windows: tuple[WindowBreach, ...] = ()
    # every window of the test, by label, for the CSV file (``window_rows``)
    all_windows: tuple[tuple[str, Metrics], ...] = ()
    compared: Compared = field(default_factory=Compared)
    ending: Ending = field(default_factory=Ending)

    @property
    def verdict(self) -> TestVerdict:
        """The test's one verdict, from every record above (``verdict.outcome``)."""
        c, e = self.compared, self.ending
        return TestVerdict(
            outcome=e.outcome,
            xfail=e.xfail,
            budget_set=not self.budget.empty,
            gated=c.gated,
            breaches=self.breaches,
            breaches_failed=self.enforced or self.failed_check or e.warned_as_error,
            expected=self.expected,
            regressions=c.regressions,
            undecided=c.undecided,
            undecided_failed=c.undecided_failed,
            inert=c.inert,
            leaks=e.leaks,
            unjudged=self.unjudged or tuple(not_measured(self.budget, self.metrics)),
            records_lost=any(note.startswith(RECORDS_LOST) for note in self.metrics.notes),
        )

    @property
    def status(self) -> str:
        return self.verdict.status

    def properties(self) -> list[tuple[str, object]]:
        """The headline figures as JUnit XML properties (``record_property``)."""
        m, c = self.metrics, self.compared
        figures: list[tuple[str, object]] = [
            ("gpuprof.truth", m.truth),
            ("gpuprof.wall_ms", round(m.wall_ms, 3)),
        ]
        for name, digits in (("kernel_ms", 3), ("utilization", 4), ("overhead_ms", 3), ("reported_utilization", 4)):
            value = getattr(m, name)
            if value is not None:
                figures.append((f"gpuprof.{name}", round(value, digits)))
        figures.append(("gpuprof.verdict", self.status))
        if c.baseline is not None:
            figures.append(("gpuprof.baseline", c.baseline["key"]))
        if c.gate is not None:
            figures.append(("gpuprof.gate", c.gate["decision"]))
            figures += [("gpuprof.undecided", f"{u['metric']}: {u['why']}") for u in c.gate["undecided"]]
        if self.ending.reruns:
            figures.append(("gpuprof.reruns", self.ending.reruns))
        return figures

    def to_dict(self) -> Entry:
        c, e = self.compared, self.ending
        out: Entry = {
            "nodeid": self.nodeid,
            "outcome": e.outcome,
            "reruns": e.reruns,
            "metrics": self.metrics.to_dict(),
            "rounds": {path: s.to_dict() for path, s in self.metrics.rounds.items()},
            "budget": {"limits": self.budget.limits(), "breaches": [b.to_dict() for b in self.breaches]},
            "windows": self.windows,
            "verdict": self.status,
            "judgement": self.verdict.to_dict(),
            "device": self.device,
            "waited_ms": round(e.waited_ms, 3),
        }
        if self.breached_windows and self.windows > 1:
            out["breached_windows"] = [w.to_dict() for w in self.breached_windows]
        if e.waited_for:
            out["waited_for"] = e.waited_for
        if self.checks:
            out["checks"] = [check.to_dict() for check in self.checks]
        if c.baseline is not None:
            out["baseline"] = c.baseline
        if c.changes:
            out["comparisons"] = list(c.changes)
        if c.gate is not None:
            out["gate"] = c.gate
        if self.outside:
            out["outside_windows"] = list(self.outside)
        if e.xfail:
            out["xfail"] = True
        if self.examples:
            out["examples"] = self.examples
        return out
