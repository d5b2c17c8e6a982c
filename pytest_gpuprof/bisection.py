"""``gpuprof bisect GOOD BAD``: the first commit between GOOD and BAD where the tests
regressed, by binary search, each step a ``gpuprof ab`` of GOOD against one commit (the
same pairs, trimmed interval, two looks and gates: ``ab.in_pairs``).

Every step compares with GOOD itself, so that small changes between steps never add up
to a regression no commit made. A step reads ``regressed`` (a gated effect wholly past its
limit), ``same`` (every gated effect decided, none regressed) or ``undecided`` (a gated
effect still unsure after ``--max-pairs``): an undecided step ends the search, naming the
commits it could not tell apart. Before the search, BAD against GOOD must regress and
GOOD's tests must pass; either failing is said in one line, with its figures. The
repository is left as it was: each side runs in a temporary worktree (``ab.worktree``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pytest_gpuprof.ab import AbError, Looks, git, in_pairs, outcome_of, repository, revision, worktree
from pytest_gpuprof.verdict.paired import Side
from pytest_gpuprof.verdict.pull_request import Outcome

__all__ = ["Bisection", "Step", "bisect"]

StepVerdict = Literal["regressed", "same", "undecided"]


@dataclass(frozen=True, slots=True)
class Step:
    """One step: the commit compared with GOOD, what it read, and the paired effects."""

    commit: str
    subject: str
    verdict: StepVerdict
    outcome: Outcome

    def line(self) -> str:
        gates = {t.text for t in self.outcome.gating}
        gated = self.outcome.regressions or [e for e in self.outcome.effects if e.threshold.text in gates]
        shown = f" ({gated[0].brief()})" if gated else ""
        return f"{self.commit[:12]} {self.subject[:50]}: {self.verdict}{shown}"


@dataclass(frozen=True, slots=True)
class Bisection:
    """What the search found: the first regressed commit (``None``: none, or undecided),
    its description, the commits it could not tell apart, the steps, and why it stopped."""

    good: str
    bad: str
    culprit: str | None
    described: str
    steps: tuple[Step, ...]
    said: str

    def lines(self) -> list[str]:
        out = [f"gpuprof bisect: {len(self.steps)} steps between {self.good[:12]} and {self.bad[:12]}:"]
        out += [f"  {i + 1}. {s.line()}" for i, s in enumerate(self.steps)]
        out.append(self.said)
        if self.culprit is not None:
            out.append(f"  {self.described}")
            culprit = next(s for s in self.steps if s.commit == self.culprit)
            out += [f"  {e.brief()}" for e in culprit.outcome.regressions]
            out += culprit.outcome.why_lines()
        return out

    def exit_code(self) -> int:
        """1: a regression, its commit named; 0: none between GOOD and BAD; 2: undecided."""
        if self.culprit is not None:
            return 1
        return 0 if self.said.startswith("gpuprof bisect: no regression") else 2


def _verdict(outcome: Outcome) -> StepVerdict:
    decisions = outcome.decisions()
    if outcome.regressions:
        return "regressed"
    if any(d == "undecided" for d in decisions.values()):
        return "undecided"
    return "same"


def _before(first: Step, good: str, bad: str) -> str | None:
    """Why the search cannot start, from BAD against GOOD: GOOD's tests fail, BAD reads the
    same (no regression to find), or BAD is undecided; ``None``: BAD regressed."""
    failing = first.outcome.failed()["base"]
    if failing:
        names = ", ".join(sorted(failing)[:3])
        return f"gpuprof bisect: GOOD {good} does not pass: {names} failed in its runs; nothing searched"
    if first.verdict == "same":
        return f"gpuprof bisect: no regression between {good} and {bad}: {first.line()}"
    if first.verdict == "undecided":
        return f"gpuprof bisect: BAD {bad} against GOOD is undecided: {first.line()}; more --max-pairs"
    return None


def bisect(
    good: str,
    bad: str,
    pytest_args: Sequence[str],
    looks: Looks,
    cwd: Path | None = None,
    say: Callable[[str], None] = print,
) -> Bisection:
    """The search; ``say`` hears each step as it starts and ends."""
    cwd = Path.cwd() if cwd is None else cwd
    root = repository(cwd)
    good_commit, bad_commit = revision(good, root), revision(bad, root)
    between = git(["rev-list", "--reverse", "--ancestry-path", f"{good_commit}..{bad_commit}"], root).split()
    if not between:
        raise AbError(f"{bad} ({bad_commit[:12]}) does not come after {good} ({good_commit[:12]})")
    relative = cwd.resolve().relative_to(root.resolve())
    steps: list[Step] = []

    def step(commit: str, base: Path) -> Step:
        subject = git(["log", "-1", "--format=%s", commit], root).strip()
        say(f"gpuprof bisect: step {len(steps) + 1}: {commit[:12]} {subject[:60]} against {good_commit[:12]}")
        with worktree(commit, cwd, say) as (_, head, _):
            trees: dict[Side, Path] = {"base": base, "current": head}
            final, runs = in_pairs(trees, relative, pytest_args, looks, say, head.parent / "scratch")
        outcome = outcome_of(good, good_commit, final, runs, looks.gating)
        done = Step(commit, subject, _verdict(outcome), outcome)
        steps.append(done)
        say(f"gpuprof bisect: step {len(steps)}: {done.line()}")
        return done

    with worktree(good_commit, cwd, say) as (_, base, _):  # GOOD's tree, checked out once for every step
        culprit, said = _search(lambda commit: step(commit, base), between, good, bad, good_commit)
    described = ""
    if culprit is not None:
        described = git(["log", "-1", "--format=%H %s (%an, %ad)", "--date=iso", culprit], root).strip()
    return Bisection(good_commit, bad_commit, culprit, described, tuple(steps), said)


def _search(
    step: Callable[[str], Step], between: Sequence[str], good: str, bad: str, good_commit: str
) -> tuple[str | None, str]:
    """BAD (the last of ``between``) against GOOD, then the binary search: the first
    regressed commit (``None``: none found) and what the search says."""
    refused = _before(step(between[-1]), good, bad)
    if refused is not None:
        return None, refused
    low, high = -1, len(between) - 1  # between[high] regressed; between[low] (or GOOD) did not
    while high - low > 1:
        middle = (low + high) // 2
        found = step(between[middle])
        if found.verdict == "regressed":
            high = middle
        elif found.verdict == "same":
            low = middle
        else:
            apart = ", ".join(c[:12] for c in between[low + 1 : high + 1])
            return None, f"gpuprof bisect: undecided at {found.commit[:12]}: the first regression is one of {apart}"
    parent = f"its parent {between[high - 1][:12]}" if high > 0 else f"its parent, GOOD {good_commit[:12]}"
    culprit = between[high]
    return culprit, f"gpuprof bisect: the first regressed commit is {culprit[:12]}; {parent} reads the same as GOOD"
