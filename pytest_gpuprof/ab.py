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

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpuprof.baselines.records import clean, load
from pytest_gpuprof.output import git as output_git
from pytest_gpuprof.output.files import write_atomic
from pytest_gpuprof.verdict.paired import ONE_PAIR, Effect, Order, Runs, Side, in_looks
from pytest_gpuprof.verdict.pull_request import SIDES, Outcome, listed
from pytest_gpuprof.verdict.thresholds import Threshold, parse_thresholds


class AbError(Exception):
    """A run that could not be made: git, the worktree, a pytest that did not finish."""


# a pair's figures: each metric path a gate reads, as the run's figure (its rounds' median)
# --- running the two trees


def git(args: Sequence[str], cwd: Path) -> str:
    """``output.git.git``, its failure an ``AbError``."""
    try:
        return output_git.git(args, cwd)
    except output_git.GitError as e:
        raise AbError(str(e)) from None


def repository(cwd: Path) -> Path:
    """The root of the git checkout holding ``cwd``: one line where there is none."""
    try:
        return Path(git(["rev-parse", "--show-toplevel"], cwd))
    except AbError:
        raise AbError(f"{cwd} is in no git repository: gpuprof ab runs two revisions of one") from None


def revision(ref: str, root: Path) -> str:
    """``ref``'s commit: one line naming it where it is none, and why (a shallow clone)."""
    try:
        return git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], root)
    except AbError:
        shallow = ""
        try:
            if git(["rev-parse", "--is-shallow-repository"], root) == "true":
                shallow = (
                    "; this clone is shallow: fetch the base first (git fetch --unshallow origin, or "
                    "actions/checkout with fetch-depth: 0)"
                )
        except AbError:
            pass
        raise AbError(f"--base {clean(ref)}: no such revision in {root}{shallow}") from None


def changed_files(root: Path) -> list[str]:
    """The files the working tree changed, staged or left untracked (ignored ones aside)."""
    changed = git(["diff", "--name-only", "HEAD"], root).splitlines()
    changed += git(["ls-files", "--others", "--exclude-standard"], root).splitlines()
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
        output_git.tried(["worktree", "remove", "--force", str(folder / "base")], root)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    if removed:
        output_git.tried(["worktree", "prune"], root)
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
        git(["worktree", "add", "--detach", str(base), commit], root)
        _submodules(base, ref)
        yield root, base, commit
    finally:
        output_git.tried(["worktree", "remove", "--force", str(base)], root)
        output_git.tried(["worktree", "prune"], root)
        shutil.rmtree(folder, ignore_errors=True)


def _submodules(base: Path, ref: str) -> None:
    """The base revision's submodules, checked out in its worktree as ``git clone
    --recurse-submodules`` would (a worktree starts without them); one line where they
    cannot be, never a base that runs without its code."""
    if not (base / ".gitmodules").is_file():
        return
    try:
        git(["submodule", "update", "--init", "--recursive"], base)
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
    looks = Looks.of(pairs, max_pairs, fail, seed, run_timeout)
    cwd = Path.cwd() if cwd is None else cwd
    dirty = changed_files(repository(cwd))
    if dirty and not allow_dirty:
        raise AbError(
            f"uncommitted changes ({listed(dirty)}): commit them, or pass --allow-dirty to measure the working tree"
        )
    if dirty:
        say(f"gpuprof ab: --allow-dirty: head is the working tree, with uncommitted changes: {listed(dirty)}")
    if looks.max_pairs < 2:
        say(f"gpuprof ab: {ONE_PAIR}: this run can find no regression, every gated test ends undecided")
    with worktree(ref, cwd, say) as (root, base, commit):
        relative = cwd.resolve().relative_to(root.resolve())
        final, runs = in_pairs(
            {"base": base, "current": root}, relative, pytest_args, looks, say, base.parent / "scratch"
        )
    return outcome_of(ref, commit, final, runs, looks.gating, dirty)


def outcome_of(
    ref: str,
    commit: str,
    final: list[Effect],
    runs: Runs,
    gating: tuple[Threshold, ...],
    dirty: list[str] | None = None,
) -> Outcome:
    """What a run of pairs found, with why each regressed test's wall time changed."""
    total = max((len(p) for p in runs.pairs.values()), default=0)
    outcome = Outcome(ref, commit, total, final, gating, runs.outcomes, dirty or [])
    return dataclasses.replace(outcome, explained=runs.why([e.nodeid for e in outcome.regressions]))


@dataclass(frozen=True, slots=True)
class Looks:
    """How a run of pairs looks at its effects: the pairs, the most for an unsure test, the
    gates (``thresholds``: those listed, ``gating``: those that fail), which side starts
    each pair, and a pytest run's time limit."""

    pairs: int
    max_pairs: int
    thresholds: tuple[Threshold, ...]
    gating: tuple[Threshold, ...]
    seed: int | None = None
    run_timeout: float = RUN_TIMEOUT_S

    @classmethod
    def of(cls, pairs: int, max_pairs: int | None, fail: str | None, seed: int | None, run_timeout: float) -> Looks:
        from pytest_gpuprof.verdict.thresholds import DEFAULT_THRESHOLDS, with_listed_kernels

        gating = tuple(parse_thresholds(fail)) if fail else ()
        thresholds = tuple(with_listed_kernels(gating or parse_thresholds(DEFAULT_THRESHOLDS)))
        return cls(pairs, max(max_pairs or 2 * pairs, pairs), thresholds, gating, seed, run_timeout)


def in_pairs(
    trees: dict[Side, Path],
    relative: Path,
    pytest_args: Sequence[str],
    looks: Looks,
    say: Callable[[str], None],
    scratch: Path,
) -> tuple[list[Effect], Runs]:
    """``pytest_args`` run in pairs of the two ``trees`` (``relative``: the folder inside
    each to run in), each order once in every two pairs, then looked at (``in_looks``);
    each run's report in ``scratch``, a folder of a worktree's (``worktree``), removed."""
    order = Order(looks.seed)
    runs = Runs(tuple(t.metric for t in looks.thresholds))
    scratch.mkdir()
    try:
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
                        trees[side], relative, args, Path(scratch, f"{made}-{side}.json"), timeout=looks.run_timeout
                    )
                except AbError as e:
                    raise AbError(f"pair {made}, {SIDES[side]}: {e}") from None
            runs.add(reports["base"], reports["current"])

        final = in_looks(runs, pair, looks.pairs, looks.max_pairs, looks.thresholds, looks.gating)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final, runs


def report(outcome: Outcome, path: Path | None) -> None:
    """``--report FILE`` and ``$GITHUB_STEP_SUMMARY`` (appended, as every step's is)."""
    if path is not None:
        write_atomic(path, json.dumps(outcome.to_dict(), indent=2) + "\n")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(outcome.markdown())
