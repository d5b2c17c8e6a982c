"""What ``gpuprof ab`` found of a whole pull request: each test's decision from its paired
effects, the tests that failed, appeared, vanished or were skipped on one side, the lines
a terminal shows, the JSON and the step summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpuprof.verdict.decision import Decision, fit
from pytest_gpuprof.verdict.explain import WHY_SHOWN, Explanation
from pytest_gpuprof.verdict.paired import Effect, Side, shown_in
from pytest_gpuprof.verdict.thresholds import Threshold

SIDES: dict[Side, str] = {"base": "base", "current": "head"}


@dataclass
class Outcome:
    """What ``ab`` found: every effect, the pairs run, the base commit, each test's outcome
    in the runs of each side; ``dirty``: the head was the working tree's uncommitted state."""

    base: str
    commit: str
    pairs: int
    effects: list[Effect]
    gating: tuple[Threshold, ...]
    outcomes: dict[Side, dict[str, Counter[str]]] = field(default_factory=lambda: {"base": {}, "current": {}})
    dirty: list[str] = field(default_factory=list)
    # why each regressed test's wall time changed, over its pairs (``explain.pooled``)
    explained: dict[str, Explanation] = field(default_factory=dict)

    @property
    def regressions(self) -> list[Effect]:
        gates = {t.text for t in self.gating}
        return [e for e in self.effects if e.verdict == "regression" and e.threshold.text in gates]

    def decisions(self) -> dict[str, Decision]:
        """Each test measured on both sides, by what its gated effects decided: a clear
        regression; an effect unsure, or not measured on both sides (undecided); else an
        improvement, or unchanged (a change the SM clocks explain is unchanged)."""
        gates = {t.text for t in self.gating}
        out: dict[str, Decision] = {}
        for e in self.effects:
            gated = e.threshold.text in gates
            word: Decision = "unchanged"
            if gated and e.verdict == "regression":
                word = "regression"
            elif gated and e.verdict in ("unsure", "missing"):
                word = "undecided"
            elif gated and e.verdict == "improvement":
                word = "improvement"
            rank = ("unchanged", "improvement", "undecided", "regression")
            if rank.index(word) >= rank.index(out.get(e.nodeid, "unchanged")):
                out[e.nodeid] = word
        return out

    def undecided(self) -> list[Effect]:
        gates = {t.text for t in self.gating}
        return [e for e in self.effects if e.threshold.text in gates and e.verdict in ("unsure", "missing")]

    def failed(self) -> dict[Side, dict[str, Counter[str]]]:
        """The tests that failed in a run of either side, with their outcomes there."""
        return {side: {n: c for n, c in tests.items() if c["failed"]} for side, tests in self.outcomes.items()}

    def one_side(self) -> tuple[list[str], list[str]]:
        """The tests run in head only (new) and in base only (removed)."""
        base, head = set(self.outcomes["base"]), set(self.outcomes["current"])
        return sorted(head - base), sorted(base - head)

    def skipped_in_head(self) -> list[str]:
        """Tests that ran in base and were skipped in every run of head: their gate judged
        nothing (a pull request that skips its slow test passed without a word)."""
        base, head = self.outcomes["base"], self.outcomes["current"]
        return sorted(
            n
            for n, c in head.items()
            if set(c) <= {"skipped", "xfailed"} and n in base and set(base[n]) - {"skipped", "xfailed"}
        )

    def lines(self, every: bool = False) -> list[str]:
        """What the command prints: one screen (each regression and improvement on one
        short line, the unchanged effects counted, then what failed, appeared or was
        undecided), or ``every`` effect's full line."""
        head = f"gpuprof ab: {self.pairs} pairs of runs, base {self.base} ({self.commit[:12]}) against the current tree"
        if self.dirty:
            head += f" (the working tree, with uncommitted changes: {listed(self.dirty)})"
        if every:
            lines = [head, *(f"  {e.line()}" for e in self.effects)]
        else:
            moved = [e for e in self.effects if e.verdict in ("regression", "improvement")]
            quiet = sum(e.verdict == "unchanged" for e in self.effects)
            lines = [head, *(fit(f"  {e.brief()}") for e in moved)]
            if quiet:
                lines.append(f"  {quiet} effect(s) unchanged (-v shows every line)")
        return [*lines, *self.why_lines(), *self.notes(), self.verdict_line()]

    def notes(self) -> list[str]:
        """What failed, appeared, disappeared, was skipped or stayed undecided."""
        lines = []
        for side, tests in self.failed().items():
            for nodeid, seen in sorted(tests.items()):
                lines.append(f"  {nodeid}: failed in {SIDES[side]} ({_runs(seen)})")
        new, removed = self.one_side()
        lines += [f"  {n}: new (in head only)" for n in new]
        lines += [f"  {n}: removed (in base only)" for n in removed]
        lines += [f"  {n}: skipped in head, run in base: nothing of it was compared" for n in self.skipped_in_head()]
        for e in self.undecided():
            lines.append(f"  {e.nodeid}: undecided: {e.label}: {self._why(e)}")
        return lines

    def why_lines(self, top: int = WHY_SHOWN) -> list[str]:
        """Each regressed test's largest causes of its change of wall time, over its pairs."""
        out = []
        for nodeid, e in sorted(self.explained.items()):
            out += [f"  why {nodeid}: {e.wall()} (median of pairs)"]
            out += [fit(f"    {line.strip()}") for line in e.lines(top)[1:]]
        return out

    @staticmethod
    def _why(e: Effect) -> str:
        if e.effect is None:
            return e.note or "not measured on both sides"
        if e.pairs < 2:
            return e.note
        shown = shown_in(e.threshold)
        return f"the interval [{shown(e.low)} .. {shown(e.high)}] holds the limit {e.threshold.text}; {e.note}"

    def verdict_line(self) -> str:
        """The run's one closing line, counting tests."""
        decided = self.decisions()
        tests = len(set(self.outcomes["base"]) | set(self.outcomes["current"]) | set(decided))
        counts = []
        regressed = self.regressions
        if regressed:
            first = regressed[0]
            shown = shown_in(first.threshold)
            name = first.nodeid.rsplit("::", 1)[-1]
            more = f" and {len(regressed) - 1} more" if len(regressed) > 1 else ""
            what = f"{name} {first.label} {shown(first.effect)} [{shown(first.low)} .. {shown(first.high)}]{more}"
            n = sum(1 for d in decided.values() if d == "regression")
            counts.append(f"{n} regression{'s' if n != 1 else ''} ({what})")
        for word in ("undecided", "improvement", "unchanged"):
            n = sum(1 for d in decided.values() if d == word)
            if n:
                counts.append(f"{n} {word}{'s' if word == 'improvement' and n != 1 else ''}")
        line = f"gpuprof ab: {tests} tests in {self.pairs} pairs: {', '.join(counts) or 'nothing compared'}"
        failed = self.failed()
        notes = [
            f"{len(failed[side])} test{'s' if len(failed[side]) != 1 else ''} failed in {SIDES[side]}"
            for side in ("current", "base")
            if failed[side]
        ]
        if self.dirty:
            notes.append("head was the working tree")
        return line + (f"; {'; '.join(notes)}" if notes else "")

    def exit_code(self, undecided: str = "warn") -> int:
        """1 for a clear regression, a test failed on either side, or (``undecided=fail``) an
        undecided test; else 0."""
        failed = self.failed()
        if self.regressions or failed["base"] or failed["current"]:
            return 1
        return 1 if undecided == "fail" and self.undecided() else 0

    def to_dict(self) -> dict[str, Any]:
        decided = self.decisions()
        new, removed = self.one_side()
        return {
            "base": self.base,
            "commit": self.commit,
            "pairs": self.pairs,
            "fail": [t.text for t in self.gating],
            "regressions": [e.to_dict() for e in self.regressions],
            "effects": [e.to_dict() for e in self.effects],
            "tests": {n: decided[n] for n in sorted(decided)},
            "failed": {SIDES[side]: sorted(tests) for side, tests in self.failed().items()},
            "new": new,
            "removed": removed,
            "skipped_in_head": self.skipped_in_head(),
            "dirty": self.dirty,
            "explain": {n: e.to_dict() for n, e in sorted(self.explained.items())},
            "verdict": self.verdict_line(),
        }

    def markdown(self) -> str:
        rows = [
            f"| `{e.nodeid}` | {e.label} | {shown_in(e.threshold)(e.effect)} | "
            f"{shown_in(e.threshold)(e.low)} .. {shown_in(e.threshold)(e.high)} | {e.pairs} | {e.verdict} |"
            for e in self.effects
        ]
        return "\n".join(
            [
                f"**{self.verdict_line()}**",
                "",
                f"### gpuprof ab: base `{self.base}` ({self.commit[:12]}) against this tree, {self.pairs} pairs",
                "",
                *(f"- {line.strip()}" for line in self.notes()),
                *(
                    f"- {line.strip()}" if line.startswith("  why") else f"  - {line.strip()}"
                    for line in self.why_lines()
                ),
                "",
                "| test | metric | effect | 96% interval | pairs | verdict |",
                "|---|---|---|---|---|---|",
                *rows,
                "",
            ]
        )


def listed(files: Sequence[str], shown: int = 5) -> str:
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return ", ".join(files[:shown]) + more


def _runs(seen: Counter[str]) -> str:
    total = sum(seen.values())
    return f"{seen['failed']} of {total} runs" if total > 1 else "its run"
