"""A test's one verdict, built once from every source and read by every output.

The sources: the budget's judgement of each window, each ``gpuprof.check()`` (and
whether the test expected its breach), each comparison with the baseline, hypothesis
confirmations (already inside the window judgements), leaks, and the test's outcome.
The rule, in order (docs/design.md, "A test's verdict"):

1. a skipped test's verdict is ``skipped``, whatever it measured before the skip;
2. what counts against the test: unexpected breaches, clear regressions of a gating
   expression, leaks, and gated figures the comparison could not decide (``undecided``:
   ``FAIL`` under ``--gpu-compare-undecided=fail``, else ``warn``). Each part reads ``FAIL`` where it failed the test (``--gpu-budget``,
   a ``check()`` the test did not catch, ``--gpu-compare-fail``, a leak), ``warn`` where
   it was only reported, ``xfail`` for a test that xfailed; failures first;
3. with nothing against it: ``expected: breach ...`` where the test caught its own
   ``check()``'s breach (``pytest.raises``), else ``ok``, ``not measured`` (a limit that
   could not be judged) or ``-`` (no budget and no gate);
4. then what qualifies it: ``gate inert: ...`` (a gating expression that these rounds can
   never fail) and ``records lost``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_gpuprof.verdict.budget import Breach


@dataclass(frozen=True, slots=True)
class Check:
    """One ``gpuprof.check()``: what it breached, and whether the test caught the raise."""

    breaches: tuple[Breach, ...]
    expected: bool = False  # it raised and the test went on (pytest.raises around it)
    asked: frozenset[str] | None = None  # the keys it was given; None: the test's whole budget
    window: int | None = None  # the window it judged; None: the test so far, no window of its own

    @property
    def expects(self) -> list[Breach]:
        """The breaches the test asserted by catching this check: of the keys it asked about."""
        if not self.expected:
            return []
        return [b for b in self.breaches if self.asked is None or b.key in self.asked]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"breaches": [b.to_dict() for b in self.breaches], "expected": self.expected}
        if self.window is not None:
            out["window"] = self.window
        return {**out, "asked": sorted(self.asked)} if self.asked is not None else out


@dataclass(frozen=True, slots=True)
class TestVerdict:
    __test__ = False  # not a pytest test class

    outcome: str = "passed"  # pytest's: passed, failed, skipped
    xfail: bool = False
    budget_set: bool = False  # a budget applied to the test
    gated: bool = False  # a gating expression applied to the test (a baseline entry and --gpu-compare-fail)
    breaches: tuple[Breach, ...] = ()  # that count against the test
    breaches_failed: bool = False  # they failed it (enforced, or a check() it did not catch)
    expected: tuple[Breach, ...] = ()  # that a check() the test caught had raised
    regressions: tuple[str, ...] = ()  # gating metrics that clearly regressed (they fail the test)
    undecided: tuple[str, ...] = ()  # gating figures the comparison could not decide
    undecided_failed: bool = False  # --gpu-compare-undecided=fail: they fail the test
    inert: tuple[str, ...] = ()  # gating expressions too few rounds can never fail
    leaks: tuple[str, ...] = ()
    unjudged: tuple[str, ...] = ()
    records_lost: bool = False

    @property
    def status(self) -> str:
        """The verdict as one line: the rule of this module's docstring."""
        if self.outcome == "skipped" and not self.xfail:
            return "skipped"
        failing: list[str] = []
        warning: list[str] = []
        if self.breaches:
            (failing if self.breaches_failed else warning).append(f"breach {_keys(self.breaches)}")
        if self.regressions:
            failing.append(f"regression {','.join(self.regressions)}")
        if self.undecided:
            (failing if self.undecided_failed else warning).append(f"undecided {','.join(self.undecided)}")
        if self.leaks:
            failing.append("leak")
        parts = []
        if self.xfail and (failing or warning):
            parts.append(f"xfail: {'; '.join([*failing, *warning])}")
        else:
            parts += [f"FAIL: {p}" for p in failing] + [f"warn: {p}" for p in warning]
        if not parts:
            if self.expected:
                parts.append(f"expected: breach {_keys(self.expected)}")
            elif not self.budget_set and not self.gated:
                parts.append("-")
            else:
                parts.append("not measured" if self.unjudged else "ok")
        if self.inert:
            parts.append(f"gate inert: {','.join(self.inert)}")
        if self.records_lost:
            parts = ["records lost"] if parts == ["-"] else [*parts, "records lost"]
        return "; ".join(parts)

    @property
    def failed(self) -> bool:
        """Whether the plugin failed the test (not whether it only warned)."""
        if self.outcome == "skipped":
            return False
        undecided = bool(self.undecided) and self.undecided_failed
        return (bool(self.breaches) and self.breaches_failed) or bool(self.regressions) or bool(self.leaks) or undecided

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        for key in ("breaches", "expected"):
            value: Sequence[Breach] = getattr(self, key)
            if value:
                out[key] = [b.to_dict() for b in value]
        for key in ("regressions", "undecided", "inert", "leaks", "unjudged"):
            if getattr(self, key):
                out[key] = list(getattr(self, key))
        return out


def _keys(breaches: Sequence[Breach]) -> str:
    return ",".join(sorted({b.key for b in breaches}))


@dataclass(frozen=True, slots=True)
class Judged:
    """One of a test's windows as the verdict reads it: its budget's breaches, and whether
    it was measured inside a hypothesis example."""

    breaches: tuple[Breach, ...]
    example: bool = False


def window_rule(
    windows: Sequence[Judged], checks: Sequence[Check], failing: Check | None = None, *, failed: bool = False
) -> tuple[list[Breach], list[Breach]]:
    """The breaches that count against a test, worst window first, and those it expected
    (docs/design.md, "The window rule").

    A breach belongs to its window: a ``check()`` the test caught excuses the keys it was
    asked about in the one window it judged, and every other window is judged on its own.
    ``failing``: the check whose raise failed the test; its breaches count, in its window.
    ``failed``: the test failed. Then hypothesis searched and failed it: of the windows
    measured inside examples only the last one counts (the example hypothesis ran last,
    to show the failure); the others were its search, and excuse or count nothing.
    """
    excused = {(c.window, b.key) for c in checks for b in c.expects}
    expected = {b.key: b for c in checks for b in c.expects}
    last_example = max((i for i, w in enumerate(windows) if w.example), default=None) if failed else None
    counted = [replace(b, window=failing.window) for b in failing.breaches] if failing is not None else []
    seen = {(b.window, b.key) for b in counted}
    for index, window in enumerate(windows):
        if window.example and failed and index != last_example:
            continue
        counted += [
            replace(b, window=index)
            for b in window.breaches
            if (index, b.key) not in excused and (index, b.key) not in seen
        ]
    by_window: dict[int | None, list[Breach]] = {}
    for b in counted:
        by_window.setdefault(b.window, []).append(b)
    worst_first = sorted(by_window.values(), key=lambda group: -max(b.severity for b in group))
    return [b for group in worst_first for b in group], list(expected.values())
