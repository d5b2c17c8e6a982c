"""The run's gate (``RunGate``): from its tests' report entries, which baseline, the tests by
decision, and the share of false alarms its gated comparisons carry. Built the same way in
one process and in an xdist controller."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Decision = Literal["regression", "undecided", "improvement", "unchanged", "new", "ungated"]
# ``gpuprof ab``'s interval of one look: 96%, each end a one-sided 98% bound, so that no
# change is called a regression 2% of the time at most (``verdict.paired``)
AB_CONFIDENCE = 0.98
# the most pairs or saved runs a line suggests: past it, "more than" that
MOST = 200


@dataclass(frozen=True, slots=True)
class RunGate:
    """The run's gate, from its tests' report entries (``gate_entry``): which baseline, and
    the tests by decision. Built the same way in one process and in an xdist controller."""

    baseline: dict[str, Any] | None
    regressions: tuple[str, ...] = ()
    undecided: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = ()
    improvements: tuple[str, ...] = ()
    unchanged: int = 0
    new: tuple[str, ...] = ()
    # each gated comparison's false-alarm rate, where the spread between runs is known
    rates: tuple[float, ...] = ()

    @classmethod
    def of(cls, tests: Iterable[Mapping[str, Any]]) -> RunGate | None:
        """``None`` where no test was gated."""
        tests = list(tests)
        by: dict[str, list[Mapping[str, Any]]] = {}
        baseline = None
        for t in tests:
            entry = t.get("gate")
            if not isinstance(entry, Mapping):
                continue
            by.setdefault(str(entry.get("decision")), []).append(t)
            if baseline is None and isinstance(t.get("baseline"), Mapping):
                baseline = _baseline(t["baseline"], t)
        if not by:
            return None

        def ids(decided: str) -> tuple[str, ...]:
            return tuple(str(t["nodeid"]) for t in by.get(decided, ()))

        undecided = sorted(
            ((str(t["nodeid"]), tuple(t["gate"].get("undecided") or ())) for t in by.get("undecided", ())),
            key=lambda u: -max((w.get("moved") or 0.0 for w in u[1]), default=0.0),
        )
        return cls(
            baseline,
            ids("regression"),
            tuple(undecided),
            ids("improvement"),
            len(by.get("unchanged", ())),
            ids("new"),
            tuple(rate for t in tests if isinstance(t.get("gate"), Mapping) for rate in _rates(t)),
        )

    def suite_line(self) -> str | None:
        """What the run's gated comparisons add up to: how often an unchanged run fails one
        of them, each at its spread's false-alarm rate, taken as independent (``None`` for
        fewer than two)."""
        if len(self.rates) < 2:
            return None
        unchanged = math.prod(1 - r for r in self.rates)
        mean = sum(self.rates) / len(self.rates)
        return (
            f"gpuprof: {len(self.rates)} gated comparisons: an unchanged run fails one of them about "
            f"{100 * (1 - unchanged):.0f}% of the time (about {100 * mean:.1f}% each, by their spread's bound, "
            "taken as independent); confirm a regression with gpuprof ab"
        )

    def counts(self) -> str:
        """``1 regression, 2 undecided, 10 unchanged``: every decision the run has."""
        parts = [
            (len(self.regressions), "regression", "regressions"),
            (len(self.undecided), "undecided", "undecided"),
            (len(self.improvements), "improvement", "improvements"),
            (self.unchanged, "unchanged", "unchanged"),
            (len(self.new), "new (not in the baseline)", "new (not in the baseline)"),
        ]
        return ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in parts if n)

    def names_baseline(self) -> str:
        """The baseline as a headline names it: name, commit, branch, created, runs."""
        b = self.baseline
        if b is None:
            return "a baseline that could not be read"
        parts = [f"commit {str(b['commit'])[:12]}" if b.get("commit") else None]
        parts += [f"branch {b['branch']}" if b.get("branch") else None]
        parts += [f"created {str(b['created'])[:19]}" if b.get("created") else None]
        runs = int(b.get("runs") or 1)
        parts += [f"spread from {runs} saved runs" if runs > 1 else "1 saved run: spread between runs unknown"]
        shown = "; ".join(p for p in parts if p)
        return f"'{b.get('name') or b.get('key')}'" + (f" ({shown})" if shown else "")

    def headline(self) -> str:
        return f"gpuprof gate against {self.names_baseline()}: {self.counts()}"

    def undecided_reasons(self) -> list[tuple[str, str]]:
        """Each undecided test, the largest move against its threshold first, with its first
        reason and what would decide it."""
        out = []
        for nodeid, why in self.undecided:
            first = why[0] if why else {"metric": "?", "why": "?", "decide": "?"}
            more = f" (and {len(why) - 1} more)" if len(why) > 1 else ""
            out.append((nodeid, f"{first['metric']}: {first['why']}; {first['decide']}{more}"))
        return out

    def undecided_lines(self) -> list[str]:
        return [f"{nodeid}: undecided: {reason}" for nodeid, reason in self.undecided_reasons()]

    def to_dict(self) -> dict[str, Any]:
        """The JSON report's top-level ``gate``."""
        return {
            "baseline": self.baseline,
            "regressions": list(self.regressions),
            "undecided": [nodeid for nodeid, _ in self.undecided],
            "improvements": list(self.improvements),
            "unchanged": self.unchanged,
            "new": list(self.new),
        }


def _rates(test: Mapping[str, Any]) -> list[float]:
    """The false-alarm rate of each of the test's gated comparisons whose spread between
    runs is known and not nil (``run_spread.false_alarm_rate``; runs that never differ, as
    on a virtual clock, raise none)."""
    from pytest_gpuprof.analysis.run_spread import false_alarm_rate

    out = []
    for c in test.get("comparisons") or ():
        spread = c.get("between_runs")
        if c.get("gates") and not c.get("inert") and isinstance(spread, Mapping) and (spread.get("sd") or 0) > 0:
            rate = spread.get("false_alarm")
            out.append(float(rate) if isinstance(rate, float) else false_alarm_rate(int(spread["runs"])))
    return out


def _baseline(record: Mapping[str, Any], test: Mapping[str, Any]) -> dict[str, Any]:
    """The baseline record as the run's ``gate`` names it; ``runs``: the runs its spread
    between runs was learnt from (the most any comparison of the test pooled)."""
    runs = [
        int(c["between_runs"]["runs"])
        for c in test.get("comparisons") or ()
        if isinstance(c.get("between_runs"), Mapping) and c["between_runs"].get("runs") is not None
    ]
    keys = ("key", "name", "commit", "branch", "created")
    return {**{k: record.get(k) for k in keys}, "runs": max(runs) if runs else int(record.get("pooled") or 1)}
