"""The baseline rule (docs/design.md, "The baseline rule"): whether a run may become a
baseline, from the run's facts alone. A baseline is a complete, accepted run: every
collected test run, every one passed, the run not cut short, something measured. Under a
run id (``--gpu-run-id`` or the CI's) a run of some of the tests is a shard of one: a part,
whose tests a comparison takes from it and the rest from the records that hold them.

The pytest hook gathers the facts (``plugin``); nothing here reads pytest.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunFacts", "Verdict", "judge"]


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What a run was, as far as its becoming a baseline goes."""

    # why the run ended early, if it did (interrupted, an exit code, collection errors, -x)
    cut_short: str | None = None
    collect_only: bool = False
    # tests pytest deselected (-k, -m, --deselect, --lf, a plugin), and the options that
    # narrowed the run to some of its tests (file arguments, --lf that left some out)
    deselected: int = 0
    narrowed: tuple[str, ...] = ()
    failed: bool = False  # a test failed: its own budget, its gate or its code
    run_id: str | None = None
    measured: int = 1  # tests that measured something


@dataclass(frozen=True, slots=True)
class Verdict:
    """``refused``: why the run may not become a baseline (``None``: it may); ``part``: why
    it is a part of a run (``None``: the whole of one)."""

    refused: str | None = None
    part: str | None = None


def judge(run: RunFacts) -> Verdict:
    """The rule, first reason first."""
    if run.cut_short is not None:
        return Verdict(f"the run {run.cut_short}")
    if run.collect_only:
        return Verdict("was --collect-only: no test ran")
    if run.failed:
        return Verdict("had failed tests (its own budget, gate or code): a baseline is a run whose every test passed")
    narrowed = None
    if run.deselected:
        narrowed = f"deselected {run.deselected} test(s) (-k, -m, --deselect, --lf or a plugin)"
    elif run.narrowed:
        narrowed = f"ran with {', '.join(run.narrowed)}"
    if narrowed and run.run_id is None:
        hint = "; a shard of a sharded suite saves its part under a run id: --gpu-run-id"
        return Verdict(f"{narrowed}: not every collected test ran{hint}")
    if not run.measured:
        return Verdict("no test measured anything: a baseline holds at least one measured test")
    return Verdict(None, f"{narrowed}: a part of run {run.run_id}" if narrowed else None)
