"""Which stored records a run compares with (``choose``) and which ``gpuprof prune`` removes
(``to_prune``): pure functions over the store's summaries, in the store's write order,
testable without a filesystem."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_gpuprof.baselines.records import BaselineError
from pytest_gpuprof.baselines.summary import Summary

__all__ = ["Choice", "NoBaseline", "choose", "to_prune"]


class NoBaseline(BaselineError):
    """No baseline to compare with; ``empty``: the store holds nothing at all of this machine."""

    def __init__(self, message: str, empty: bool = False) -> None:
        super().__init__(message)
        self.empty = empty


@dataclass(frozen=True, slots=True)
class Choice:
    """The records a comparison reads, newest first, the newest of them, and why they."""

    accepted: tuple[Summary, ...]
    newest: Summary
    why: str


def _names(summaries: list[Summary]) -> str:
    """The baseline names among ``summaries``, newest first, each with its newest run's date."""
    newest: dict[str, str] = {}
    for s in reversed(summaries):  # newest first
        if not s.damaged:
            newest.setdefault(s.name, s.created[:16].replace("T", " "))
    return ", ".join(f"{name} (newest {when})" if when else name for name, when in newest.items())


def choose(
    everything: Sequence[Summary],
    wanted: str | None,
    pooled: int,
    *,
    machine: str,
    url: str,
    others: Callable[[], list[str]],
    doubtful: Mapping[str, str],
) -> Choice:
    """The records of ``everything`` (one machine's summaries, oldest first) a comparison
    reads: the accepted ones of ``wanted``'s name (any, where ``None``), newest first; why,
    with every newer record passed over named (refused, or damaged). ``NoBaseline`` where
    none may be read, with what the machine has instead, or the machines (``others``) that
    have baselines."""
    what = f"named {wanted!r} " if wanted else ""
    candidates = [s for s in everything if (wanted is None or s.name == wanted) and not s.damaged]
    if not candidates:
        hint = ""
        names = _names(list(everything))
        if names:  # the names this machine has: the one meant is likely among them
            hint = f"; this machine has {names}"
        elif other := others():
            hint = (
                f"; baselines exist for machine ids {', '.join(other)} (--gpu-compare-any-machine compares "
                "with the newest of them)"
            )
        raise NoBaseline(f"no baseline {what}for machine {machine} under {url}{hint}", empty=not everything)
    passed_over: list[str] = []
    accepted: list[Summary] = []
    for s in reversed(candidates):
        if s.refused is None:
            accepted.append(s)
        elif not accepted:
            passed_over.append(f"{s.key.rsplit('/', 1)[-1]} ({s.refused})")
    if not accepted:
        raise NoBaseline(f"no accepted baseline {what}for machine {machine} under {url}: {'; '.join(passed_over)}")
    newest = accepted[0]
    parts = [s for s in accepted if newest.run_id and s.run_id == newest.run_id]
    why = f"the newest accepted baseline {what}of machine {machine}"
    if len(parts) > 1:
        why += f" (run {newest.run_id}, {len(parts)} parts)"
    if pooled > 1:
        why += f", each test pooled over its {pooled} newest accepted baselines"
    if passed_over:
        why += f"; passed over {len(passed_over)} newer: {'; '.join(passed_over)}"
    # a newer record of the name that cannot be read: the run meant to be the baseline,
    # maybe; named, never passed over in silence
    damaged = [
        f"{s.key.rsplit('/', 1)[-1]} is damaged ({s.damaged}), gpuprof prune removes it"
        for s in everything
        if s.damaged and (wanted is None or s.name == wanted) and s.order() > newest.order()
    ]
    if damaged:
        why += f"; warning: passed over {len(damaged)} newer record(s) that cannot be read: {'; '.join(damaged)}"
    named = [f"{key.rsplit('/', 1)[-1]} {text}" for key, text in doubtful.items()]
    if named:
        why += f"; warning: {'; '.join(named)}"
    return Choice(tuple(accepted), newest, why)


def to_prune(summaries: Sequence[Summary], keep: int, name: str | None = None) -> list[str]:
    """The keys ``gpuprof prune --keep`` removes: each name's records beyond its ``keep``
    newest runs (a run's shards are one run; the store's order), and every damaged record
    (of ``name`` only, where given)."""
    removed = [s.key for s in summaries if s.damaged and (name is None or s.name == name)]
    for each in sorted({s.name for s in summaries if name is None or s.name == name}):
        runs: dict[str, list[Summary]] = {}
        for s in reversed([s for s in summaries if s.name == each and not s.damaged]):  # newest first
            runs.setdefault(s.run_id or s.key, []).append(s)
        removed += [s.key for old in list(runs.values())[keep:] for s in old]
    return removed
