"""A test against its baseline (``Comparison``): every change, the gating ones that
regressed, which baseline record, and what a line, a failure and the JSON say of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pytest_gpuprof.verdict.change import Change
from pytest_gpuprof.verdict.compare import change_lines, inert_causes, inert_gates, kernel_names, regressions
from pytest_gpuprof.verdict.explain import WHY_SHOWN, Explanation
from pytest_gpuprof.verdict.thresholds import Threshold


def _runs(n: int) -> str:
    return f"{n} fresh run" if n == 1 else f"{n} fresh runs"


# what a comparison says of a test its baseline does not hold: nothing gates it
NEW = "new (not in the baseline)"


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
    # why its wall time changed against the baseline's entry (``verdict.explain``)
    explained: Explanation | None = None

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
        return [*change_lines(self.nodeid, self.changes, self.note, self.gating, decided), *self.why_lines()]

    def why_lines(self, top: int = WHY_SHOWN) -> list[str]:
        """Where it regressed: why its wall time changed, its largest causes first."""
        if self.explained is None or not self.regressed:
            return []
        causes = self.explained.lines(top)[1:]
        return [f"  why: {self.explained.wall()}", *(f"  {line}" for line in causes)]

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
                *self.why_lines(),
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
        read = ", ".join(f"{_value(f.current)} ({f.finding})" if f is not None else "not measured" for f in theirs)
        changes.append(
            replace(c, finding="inconclusive", unconfirmed=f"{repeated} of {len(fresh)} fresh runs repeated it: {read}")
        )
    return replace(comparison, changes=tuple(changes), confirmed=len(fresh))


def _value(value: float | None) -> str:
    return "?" if value is None else f"{value:.6g}"
