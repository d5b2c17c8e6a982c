"""``gpuprof ab``: the base revision and the current tree measured in turns, on one runner.

A stored baseline is another process, usually on another runner, days ago: its level is
not this one's. An A/B run takes the runner out of the comparison. It checks REF out in a
temporary git worktree and runs the same pytest arguments in the base tree and in the
current one, in pairs (each run a fresh process on the same GPU, each order once in every
two pairs), and compares each test's runs pair by pair: the effect of a metric is the
trimmed mean of the pairs' differences (log ratios for ``%`` thresholds; ``Trimmed``: the
fifth of pairs at each end left out, so that a pair that straddles a runner's change of
speed sways neither end), its interval the trimmed t's, and a regression is an interval
wholly beyond the threshold. What moves both sides of a pair (a slow runner, a warm cache) cancels. A test
whose interval holds its threshold gets more pairs of its own, up to ``--max-pairs``.
Kernel times are compared in cycles where both sides' SM clocks are known.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_gpuprof.analysis.names import readable, short
from pytest_gpuprof.analysis.run_spread import Trimmed
from pytest_gpuprof.baselines.records import BaselineError, clean, load
from pytest_gpuprof.output.files import write_atomic
from pytest_gpuprof.verdict.compare import KERNELS, Threshold, parse_thresholds
from pytest_gpuprof.verdict.decision import AB_CONFIDENCE, MOST, Decision, ab_pairs_needed, fit
from pytest_gpuprof.verdict.samples import samples_of

Side = Literal["base", "current"]
Verdict = Literal["regression", "improvement", "unchanged", "unsure", "clock", "missing"]
# the interval of an effect: 96%, so that each of its ends is a one-sided 98% bound: a
# regression called wrongly 2% of the time at most, at a true change equal to the limit
CONFIDENCE = AB_CONFIDENCE
# with more pairs for the tests still unsure (--max-pairs), those 2% are spent over two
# looks, at --pairs and at --max-pairs (Bonferroni: 1.5% and 0.5%), so that they hold
# whatever the first look found; each look's one-sided level
LOOKS = (0.985, 0.995)
# the power of the smallest detectable change an effect prints, for normal pairs: 95%, so
# that on runners whose pairs are not normal (two speeds, a mode switch inside a pair) a
# fresh run at that change still finds it 90% of the time (benchmarks/ab_sim.py)
PRINTED_POWER = 0.97


# why one pair decides nothing
ONE_PAIR = "one pair has no interval: --pairs 2 or more"


class AbError(BaselineError):
    """A run that could not be made: git, the worktree, a pytest that did not finish."""


# a pair's figures: each metric path a gate reads, as the run's figure (its rounds' median)
Figures = dict[str, float]
# the SM clock a kernel time is read in cycles with
CLOCK = "nvml.sm_clock_mhz"


@dataclass
class Runs:
    """Each test's figures, run by run, on both sides (``figures``: of the ``metrics`` the
    gates read, and no more), and every test's outcome in every run of each side
    (``outcomes`` of the runs' reports: measured or not)."""

    metrics: tuple[str, ...]
    pairs: dict[str, list[tuple[Figures, Figures]]] = field(default_factory=dict)
    outcomes: dict[Side, dict[str, Counter[str]]] = field(default_factory=lambda: {"base": {}, "current": {}})

    def add(self, base: dict[str, Any], current: dict[str, Any]) -> None:
        ours = {t["nodeid"]: t for t in current["tests"] if "crashed" not in t}
        for test in base["tests"]:
            if test["nodeid"] in ours and "crashed" not in test:
                pair = (figures(test, self.metrics), figures(ours[test["nodeid"]], self.metrics))
                self.pairs.setdefault(test["nodeid"], []).append(pair)
        sides: tuple[tuple[Side, dict[str, Any]], ...] = (("base", base), ("current", current))
        for side, report in sides:
            seen = self.outcomes[side]
            words = dict(report.get("outcomes") or {})
            for test in report["tests"]:
                words.setdefault(test["nodeid"], "failed" if "crashed" in test else str(test.get("outcome", "passed")))
            for nodeid, word in words.items():
                seen.setdefault(nodeid, Counter())[word] += 1


def figures(test: dict[str, Any], metrics: Sequence[str]) -> Figures:
    """What a pair's comparison reads of a test's report entry, and no more: each of
    ``metrics`` (``kernels``: each kernel's ``total_ms``) and the SM clock, at its rounds'
    median (the pair's figure). A run of many pairs keeps a few numbers a test a pair, not
    the runs' whole reports (3.1 MB a pair on a 100-test suite, before)."""
    paths = [m for m in metrics if m != KERNELS]
    if KERNELS in metrics:
        totals = (test.get("metrics") or {}).get("kernel_totals")
        # interned: every pair's figures share one string a kernel
        paths += [sys.intern(f"kernels.{name}.total_ms") for name in totals or () if isinstance(name, str)]
    out: Figures = {}
    for path in (*paths, CLOCK):
        if samples := samples_of(test, path):
            out[path] = statistics.median(samples)
    return out


@dataclass(frozen=True, slots=True)
class Effect:
    """One metric of one test over the pairs: the mean difference (current minus base, in
    the threshold's unit: a fraction for ``%``, points for ``pt``, ms for ``ms``), its
    interval, the smallest change the pairs can detect, and the verdict."""

    nodeid: str
    metric: str
    threshold: Threshold
    pairs: int
    effect: float | None
    low: float | None
    high: float | None
    detectable: float | None
    verdict: Verdict
    note: str = ""

    @property
    def label(self) -> str:
        """The metric as a line says it: a kernel by its short readable name."""
        if self.metric.startswith("kernels.") and self.metric.endswith(".total_ms"):
            return f"kernel {short(readable(self.metric[len('kernels.') : -len('.total_ms')]))} ms"
        return self.metric

    def line(self) -> str:
        what = f"{self.nodeid}: {self.label}"
        if self.effect is None:
            return f"{what}: {self.note or 'not measured on both sides'}"
        shown = _shown(self.threshold)
        detect = f"; smallest detectable change {shown(self.detectable, False)}" if self.detectable is not None else ""
        interval = f"[{shown(self.low)} .. {shown(self.high)}]" if self.low is not None else "[one pair: no interval]"
        note = f" ({self.note})" if self.note else ""
        return (
            f"{what}: effect {shown(self.effect)} {interval} over {self.pairs} pairs{detect}; "
            f"limit {self.threshold.text}: {self.verdict}{note}"
        )

    def brief(self) -> str:
        """The effect on one screen's line: ``test: kernel_ms +3.1% [1.2% .. 5.0%] over 5
        pairs, limit kernel_ms:+1%: regression``."""
        shown = _shown(self.threshold)
        interval = f" [{shown(self.low)} .. {shown(self.high)}]" if self.low is not None else ""
        return (
            f"{self.nodeid}: {self.label} {shown(self.effect)}{interval} over {self.pairs} pairs, "
            f"limit {self.threshold.text}: {self.verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "metric": self.metric,
            "threshold": self.threshold.text,
            "pairs": self.pairs,
            "effect": self.effect,
            "low": self.low,
            "high": self.high,
            "detectable": self.detectable,
            "verdict": self.verdict,
            **({"note": self.note} if self.note else {}),
        }


def _shown(t: Threshold) -> Callable[..., str]:
    def shown(v: float | None, signed: bool = True) -> str:
        if v is None:
            return "?"
        sign = "+" if signed else ""
        if t.unit == "%":
            return f"{100 * v:{sign}.2f}%"
        if t.unit == "pt":
            return f"{100 * v:{sign}.2f}pt"
        return f"{v:{sign}.3f} ms"

    return shown


def _kernel_metric(metric: str) -> bool:
    return metric == "kernel_ms" or (metric.startswith("kernels.") and metric.endswith(".total_ms"))


def _difference(t: Threshold, path: str, base: Figures, current: Figures, cycles: bool) -> float | None:
    """One pair's change of ``path``, worse positive, in the threshold's unit; ``cycles``:
    the current side's kernel time at the base side's SM clock."""
    b, c = base.get(path), current.get(path)
    if b is None or c is None:
        return None
    if cycles:
        f_base, f_now = base.get(CLOCK), current.get(CLOCK)
        if not f_base or not f_now:
            return None
        c = c * f_now / f_base
    if t.unit == "%":  # the log ratio: no upward bias under no change, a pair's two sides alike
        return t.direction * math.log(c / b) if b > 0 and c > 0 else None
    return t.direction * (c - b)


def _limit(t: Threshold) -> float:
    """The threshold in a pair difference's unit, worse positive: for ``%`` the log of the
    ratio it allows (``+5%``: log 1.05; ``-5%``: -log 0.95)."""
    if t.unit == "%":
        return math.log1p(t.amount / 100) if t.direction > 0 else -math.log1p(-t.amount / 100)
    return t.amount / 100 if t.unit == "pt" else t.amount


def _as_moved(t: Threshold, oriented: float) -> float:
    """An oriented difference as the metric moved: for ``%`` the relative change."""
    moved = t.direction * oriented
    return math.expm1(moved) if t.unit == "%" else moved


def effect(
    nodeid: str,
    path: str,
    t: Threshold,
    pairs: Sequence[tuple[Figures, Figures]],
    confidence: float = CONFIDENCE,
) -> Effect:
    """The metric's effect over the pairs, and its verdict against ``t``; ``confidence``:
    the one-sided level of this look's interval ends (``LOOKS``)."""
    limit = _limit(t)
    diffs = [d for b, c in pairs if (d := _difference(t, path, b, c, cycles=False)) is not None]
    if not diffs:
        return Effect(nodeid, path, t, 0, None, None, None, None, "missing")
    n = len(diffs)
    if n < 2:  # no interval: nothing can be told from the runs' own spread
        return Effect(nodeid, path, t, n, _as_moved(t, diffs[0]), None, None, None, "unsure", ONE_PAIR)
    robust = Trimmed.of(diffs)
    # a true change this far past the base is caught PRINTED_POWER of the time by pairs as many as
    # these, their spread as random as this one
    detectable = robust.detectable(limit, confidence, PRINTED_POWER)
    low, high = robust.low(confidence), robust.high(confidence)
    verdict: Verdict
    if low > limit:
        verdict = "regression"
    elif high < -limit:
        verdict = "improvement"
    elif high <= limit and low >= -limit:
        verdict = "unchanged"
    else:
        verdict = "unsure"
    note = ""
    if verdict == "unsure":
        need = ab_pairs_needed(robust.se * math.sqrt(n), limit)
        note = f"needs about {need} pairs" if need <= MOST else f"needs more than {MOST} pairs"
    if verdict == "regression" and _kernel_metric(path):
        cycles = [d for b, c in pairs if (d := _difference(t, path, b, c, cycles=True)) is not None]
        if len(cycles) == n:
            if Trimmed.of(cycles).low(confidence) <= limit:
                verdict, note = "clock", "the SM clocks of the pairs explain it: in cycles, within the limit"
            else:
                note = "a regression in cycles too"
    # as the metric moved (worse was down: the ends swap), and the detectable change's size
    ends = sorted((_as_moved(t, low), _as_moved(t, high)))
    shown = abs(_as_moved(t, detectable))
    return Effect(nodeid, path, t, n, _as_moved(t, robust.center), ends[0], ends[1], shown, verdict, note)


def effects(runs: Runs, thresholds: Sequence[Threshold], first: int | None = None) -> list[Effect]:
    """Every test's effect for every threshold (``kernels`` for each kernel of the test).
    ``first``: the pairs of the first of two looks (``LOOKS``): a test with more had its
    second; ``None``: one look."""
    out = []
    for nodeid, pairs in sorted(runs.pairs.items()):
        level = CONFIDENCE if first is None else LOOKS[0] if len(pairs) <= first else LOOKS[1]
        for t in thresholds:
            if t.metric != KERNELS:
                out.append(effect(nodeid, t.metric, t, pairs, level))
                continue
            kernels = {k for b, c in pairs for side in (b, c) for k in side if k.startswith("kernels.")}
            for path in sorted(kernels):
                each = Threshold(path, t.direction, t.amount, t.unit, t.text)
                out.append(effect(nodeid, path, each, pairs, level))
    return out


class Order:
    """Which side starts each pair: balanced, each order once in every two pairs, the two
    shuffled (seeded), so that whatever favours the first (or second) run of a pair falls on
    both sides alike."""

    def __init__(self, seed: int | None) -> None:
        self._random = random.Random(seed)
        self._queued: list[list[Side]] = []

    def next(self) -> list[Side]:
        if not self._queued:
            block: list[list[Side]] = [["base", "current"], ["current", "base"]]
            self._random.shuffle(block)
            self._queued = block
        return self._queued.pop(0)


# --- running the two trees


def _git(args: Sequence[str], cwd: Path) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise AbError(f"git {' '.join(args)}: {e}") from None
    if done.returncode != 0:
        raise AbError(f"git {' '.join(args)}: {clean(done.stderr.strip() or done.stdout.strip())[:300]}")
    return done.stdout.strip()


def repository(cwd: Path) -> Path:
    """The root of the git checkout holding ``cwd``: one line where there is none."""
    try:
        return Path(_git(["rev-parse", "--show-toplevel"], cwd))
    except AbError:
        raise AbError(f"{cwd} is in no git repository: gpuprof ab runs two revisions of one") from None


def revision(ref: str, root: Path) -> str:
    """``ref``'s commit: one line naming it where it is none, and why (a shallow clone)."""
    try:
        return _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], root)
    except AbError:
        shallow = ""
        try:
            if _git(["rev-parse", "--is-shallow-repository"], root) == "true":
                shallow = (
                    "; this clone is shallow: fetch the base first (git fetch --unshallow origin, or "
                    "actions/checkout with fetch-depth: 0)"
                )
        except AbError:
            pass
        raise AbError(f"--base {clean(ref)}: no such revision in {root}{shallow}") from None


def changed_files(root: Path) -> list[str]:
    """The files the working tree changed, staged or left untracked (ignored ones aside)."""
    changed = _git(["diff", "--name-only", "HEAD"], root).splitlines()
    changed += _git(["ls-files", "--others", "--exclude-standard"], root).splitlines()
    return list(dict.fromkeys(f for f in changed if f))


# a run's folder: its worktree (``base``), its scratch and ``OWNER`` (the pid of its ab)
PREFIX, OWNER = "gpuprof-ab-", "owner"


def _alive(pid_text: str) -> bool:
    try:
        os.kill(int(pid_text), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def clear_leftovers(root: Path) -> list[str]:
    """What a killed ``ab`` (SIGKILL: no clean-up ran) left: its worktree, registered in
    ``root``, and its folder under the temporary directory, each recognised by its name and
    an owner that is no longer running; another ab that still runs is left alone. The
    folders removed."""
    temp = Path(tempfile.gettempdir())
    removed = []
    for folder in temp.glob(f"{PREFIX}*"):
        try:
            owner = (folder / OWNER).read_text().strip()
            if not folder.is_dir() or folder.is_symlink() or folder.stat().st_uid != os.geteuid() or _alive(owner):
                continue
        except OSError:  # no owner written: not ours to judge
            continue
        subprocess.run(["git", "worktree", "remove", "--force", str(folder / "base")], cwd=root, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    if removed:
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True, check=False)
    return removed


@contextmanager
def worktree(ref: str, cwd: Path, say: Callable[[str], None] = lambda line: None) -> Iterator[tuple[Path, Path, str]]:
    """The current tree's root, a temporary worktree of ``ref`` and ``ref``'s commit;
    the worktree removed at the end, whatever happened, and what a killed run left before
    it removed first (``clear_leftovers``)."""
    root = repository(cwd)
    commit = revision(ref, root)
    for left in clear_leftovers(root):
        say(f"gpuprof ab: removed {left}, left by a run of gpuprof ab that was killed")
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    (folder / OWNER).write_text(str(os.getpid()))
    base = folder / "base"
    try:
        _git(["worktree", "add", "--detach", str(base), commit], root)
        _submodules(base, ref)
        yield root, base, commit
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=root, capture_output=True, check=False)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _submodules(base: Path, ref: str) -> None:
    """The base revision's submodules, checked out in its worktree as ``git clone
    --recurse-submodules`` would (a worktree starts without them); one line where they
    cannot be, never a base that runs without its code."""
    if not (base / ".gitmodules").is_file():
        return
    try:
        _git(["submodule", "update", "--init", "--recursive"], base)
    except AbError as e:
        raise AbError(
            f"--base {clean(ref)}: its submodules could not be checked out in its worktree ({e}); "
            "gpuprof ab measures a tree whole or not at all"
        ) from None


# how long one pytest run of a pair may take before it is ended (--run-timeout)
RUN_TIMEOUT_S = 1800.0


def run_pytest(
    tree: Path, relative: Path, args: Sequence[str], report: Path, timeout: float = RUN_TIMEOUT_S
) -> dict[str, Any]:
    """One fresh pytest process in ``tree`` (at the caller's folder within it), its code
    first on the path; its report. Failed tests are figures too; a run that ended without
    a report (a usage error, a crash) or ran past ``timeout`` seconds (ended then) is an
    error naming the tree."""
    if not (tree / relative).is_dir():
        raise AbError(f"{relative} is not in {tree}: run gpuprof ab from a folder both revisions have")
    env = dict(os.environ)
    paths = [str(tree), *([str(tree / "src")] if (tree / "src").is_dir() else [])]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "pytest", *args, f"--gpu-report={report}"]
    try:
        done = subprocess.run(
            command, cwd=tree / relative, env=env, capture_output=True, text=True, check=False, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise AbError(f"pytest in {tree} ran past --run-timeout {timeout:g} s and was ended") from None
    if done.returncode not in (0, 1, 5) or not report.is_file():  # 5: nothing collected on that side
        tail = clean("\n".join((done.stdout + done.stderr).strip().splitlines()[-5:]))
        raise AbError(f"pytest in {tree} exited {done.returncode} without a report: {tail}")
    return load(report)


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
            head += f" (the working tree, with uncommitted changes: {_listed(self.dirty)})"
        if every:
            lines = [head, *(f"  {e.line()}" for e in self.effects)]
        else:
            moved = [e for e in self.effects if e.verdict in ("regression", "improvement")]
            quiet = sum(e.verdict == "unchanged" for e in self.effects)
            lines = [head, *(fit(f"  {e.brief()}") for e in moved)]
            if quiet:
                lines.append(f"  {quiet} effect(s) unchanged (-v shows every line)")
        for side, tests in self.failed().items():
            for nodeid, seen in sorted(tests.items()):
                lines.append(f"  {nodeid}: failed in {SIDES[side]} ({_runs(seen)})")
        new, removed = self.one_side()
        lines += [f"  {n}: new (in head only)" for n in new]
        lines += [f"  {n}: removed (in base only)" for n in removed]
        lines += [f"  {n}: skipped in head, run in base: nothing of it was compared" for n in self.skipped_in_head()]
        for e in self.undecided():
            lines.append(f"  {e.nodeid}: undecided: {e.label}: {self._why(e)}")
        return [*lines, self.verdict_line()]

    @staticmethod
    def _why(e: Effect) -> str:
        if e.effect is None:
            return e.note or "not measured on both sides"
        if e.pairs < 2:
            return e.note
        shown = _shown(e.threshold)
        return f"the interval [{shown(e.low)} .. {shown(e.high)}] holds the limit {e.threshold.text}; {e.note}"

    def verdict_line(self) -> str:
        """The run's one closing line, counting tests."""
        decided = self.decisions()
        tests = len(set(self.outcomes["base"]) | set(self.outcomes["current"]) | set(decided))
        counts = []
        regressed = self.regressions
        if regressed:
            first = regressed[0]
            shown = _shown(first.threshold)
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
            "verdict": self.verdict_line(),
        }

    def markdown(self) -> str:
        rows = [
            f"| `{e.nodeid}` | {e.label} | {_shown(e.threshold)(e.effect)} | "
            f"{_shown(e.threshold)(e.low)} .. {_shown(e.threshold)(e.high)} | {e.pairs} | {e.verdict} |"
            for e in self.effects
        ]
        return "\n".join(
            [
                f"**{self.verdict_line()}**",
                "",
                f"### gpuprof ab: base `{self.base}` ({self.commit[:12]}) against this tree, {self.pairs} pairs",
                "",
                *(f"- {line.strip()}" for line in self.lines()[1 + len(self.effects) : -1]),
                "",
                "| test | metric | effect | 96% interval | pairs | verdict |",
                "|---|---|---|---|---|---|",
                *rows,
                "",
            ]
        )


def _listed(files: Sequence[str], shown: int = 5) -> str:
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return ", ".join(files[:shown]) + more


def _runs(seen: Counter[str]) -> str:
    total = sum(seen.values())
    return f"{seen['failed']} of {total} runs" if total > 1 else "its run"


def ab(
    ref: str,
    pytest_args: Sequence[str],
    pairs: int = 5,
    max_pairs: int | None = None,
    fail: str | None = None,
    seed: int | None = None,
    cwd: Path | None = None,
    say: Callable[[str], None] = print,
    allow_dirty: bool = False,
    run_timeout: float = RUN_TIMEOUT_S,
) -> Outcome:
    """Run ``pytest_args`` in ``pairs`` pairs of base and current runs; add pairs of each
    unsure test alone up to ``max_pairs``. Uncommitted changes are refused unless
    ``allow_dirty``: the head would be a tree no commit names."""
    from pytest_gpuprof.verdict.compare import DEFAULT_THRESHOLDS, with_listed_kernels

    gating = tuple(parse_thresholds(fail)) if fail else ()
    thresholds = with_listed_kernels(gating or parse_thresholds(DEFAULT_THRESHOLDS))
    cwd = Path.cwd() if cwd is None else cwd
    max_pairs = max(max_pairs or 2 * pairs, pairs)
    dirty = changed_files(repository(cwd))
    if dirty and not allow_dirty:
        raise AbError(
            f"uncommitted changes ({_listed(dirty)}): commit them, or pass --allow-dirty to measure the working tree"
        )
    if dirty:
        say(f"gpuprof ab: --allow-dirty: head is the working tree, with uncommitted changes: {_listed(dirty)}")
    if max_pairs < 2:
        say(f"gpuprof ab: {ONE_PAIR}: this run can find no regression, every gated test ends undecided")
    order = Order(seed)
    runs = Runs(tuple(t.metric for t in thresholds))
    with worktree(ref, cwd, say) as (root, base, commit):
        scratch = str(base.parent / "scratch")
        os.mkdir(scratch)
        relative = cwd.resolve().relative_to(root.resolve())
        trees: dict[Side, Path] = {"base": base, "current": root}
        made = 0

        def pair(alone: str | None) -> None:
            nonlocal made
            made += 1
            args = list(pytest_args)
            if alone is not None:  # that test alone: every other one deselected
                every = {*runs.pairs, *runs.outcomes["base"], *runs.outcomes["current"]}
                args += [f"--deselect={n}" for n in sorted(every) if n != alone]
            reports = {}
            for side in order.next():
                say(f"gpuprof ab: pair {made}, {side} ({trees[side]})")
                try:
                    reports[side] = run_pytest(
                        trees[side], relative, args, Path(scratch, f"{made}-{side}.json"), timeout=run_timeout
                    )
                except AbError as e:
                    raise AbError(f"pair {made}, {SIDES[side]}: {e}") from None
            runs.add(reports["base"], reports["current"])

        final = in_looks(runs, pair, pairs, max_pairs, thresholds, gating)
    total = max((len(p) for p in runs.pairs.values()), default=0)
    return Outcome(ref, commit, total, final, gating, runs.outcomes, dirty)


def in_looks(
    runs: Runs,
    pair: Callable[[str | None], None],
    pairs: int,
    max_pairs: int,
    thresholds: Sequence[Threshold],
    gating: Sequence[Threshold],
) -> list[Effect]:
    """``pairs`` pairs of every test (``pair(None)``), a first look; each test it left
    unsure gets pairs of its own (``pair(nodeid)``) up to ``max_pairs``, with no look
    between, and the second look (``LOOKS``). The effects at the end."""
    for _ in range(pairs):
        pair(None)
    two = max_pairs > pairs
    first = effects(runs, gating or thresholds, pairs if two else None)
    for nodeid in sorted({e.nodeid for e in first if e.verdict == "unsure"}) if two else ():
        while len(runs.pairs[nodeid]) < max_pairs:
            pair(nodeid)
    return effects(runs, thresholds, pairs if two else None)


def report(outcome: Outcome, path: Path | None) -> None:
    """``--report FILE`` and ``$GITHUB_STEP_SUMMARY`` (appended, as every step's is)."""
    if path is not None:
        write_atomic(path, json.dumps(outcome.to_dict(), indent=2) + "\n")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(outcome.markdown())
