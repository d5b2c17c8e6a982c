"""The regression gate: which baseline a run compares with, and each test's ``Comparison``.

One implementation for the pytest gate and for ``gpuprof compare``: both open a ``Gate``
(a store's baseline by name, or a report's file) and ask it for one ``Comparison`` per
test. A change fails its test only when a gating expression names the metric and the
change is both beyond its threshold and clear over the rounds (``verdict.compare.assess``).
No pytest here: a baseline that cannot be used is a ``BaselineError``, which the pytest
layer turns into a usage error and the command into exit 2.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pytest_gpuprof.analysis.run_spread import HISTORY_RUNS
from pytest_gpuprof.baselines import records
from pytest_gpuprof.baselines.records import BaselineError, entry_problem
from pytest_gpuprof.baselines.reference import Reference
from pytest_gpuprof.verdict.change import Change
from pytest_gpuprof.verdict.compare import clock_note, compare_tests, gated_comparisons
from pytest_gpuprof.verdict.comparison import Comparison
from pytest_gpuprof.verdict.explain import explain
from pytest_gpuprof.verdict.thresholds import DEFAULT_THRESHOLDS, Threshold, parse_thresholds, with_listed_kernels

if TYPE_CHECKING:
    from pytest_gpuprof.output.report import Machine
    from pytest_gpuprof.verdict.entry import Entry

# what a comparison with a report's file says: one run holds no spread between runs
FILE_NOTE = (
    "a report's file is one run: the rounds decide alone, with no spread between runs to weigh them "
    "(save runs to a store, or use gpuprof ab)"
)

# the machine fields a line names when two machines differ
_MACHINE_FIELDS = ("gpu", "driver", "pcie", "backend", "clock")


@dataclass(frozen=True, slots=True)
class Wanted:
    """What ``--gpu-compare`` (or ``gpuprof compare``'s BASE) asks for."""

    name: str | None  # a baseline name; None: the newest of any name
    pooled: int  # NAME~K: the K newest accepted runs
    path: str | None  # a report's file or URL instead of a stored name


def wanted(compare: str) -> Wanted:
    """``latest``, ``NAME``, ``NAME~K``, ``latest~K`` or a report's path."""
    if compare.endswith(".json") or os.sep in compare or "://" in compare:
        return Wanted(None, 1, compare)
    if compare == "latest":
        return Wanted(None, 1, None)
    name, tilde, count = compare.rpartition("~")
    if tilde and name:
        if not count.isdigit() or int(count) < 1:
            raise BaselineError(
                f"{compare!r}: NAME~K pools the K newest accepted runs of NAME; K is a whole number of 1 or more "
                f"(for the newest run alone: {name})"
            )
        return Wanted(None if name == "latest" else name, int(count), None)
    return Wanted(compare, 1, None)


def describe_machine(machine: Mapping[str, Any]) -> str:
    shown = ", ".join(f"{k} {records.clean(str(machine[k]))}" for k in _MACHINE_FIELDS if machine.get(k))
    return f"{records.clean(str(machine.get('id')))} ({shown})"


def machine_differences(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """What differs between two machine records, field by field (a missing field reads '?')."""
    return [
        f"{k} {records.clean(str(theirs.get(k, '?')))} -> {records.clean(str(ours.get(k, '?')))}"
        for k in _MACHINE_FIELDS
        if theirs.get(k, "?") != ours.get(k, "?")
    ]


def changed(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two environments (``capture.environment``), a phrase each
    (``torch 2.10.0 -> 2.11.0``); a library loaded on one side only is not a change of it."""
    return [f"{k} {before[k]} -> {now[k]}" for k in sorted(set(before) & set(now)) if before[k] != now[k]]


def _left_out(changes: Sequence[Change], places: Sequence[str]) -> str | None:
    """The saved runs the spread between runs left out because each stood alone, by where
    they are stored: ``spread dominated by run KEY: left out of kernel_ms``."""
    named: dict[str, list[str]] = {}
    for c in changes:
        for run in c.spread.aside if c.spread is not None else ():
            if run.alone and run.at < len(places):
                named.setdefault(places[run.at], []).append(c.label())
    return (
        "; ".join(
            f"spread dominated by run {where}: left out of {', '.join(labels)}" for where, labels in named.items()
        )
        or None
    )


class Gate:
    """The baseline of one run (or one ``gpuprof compare``) and each test's comparison.

    ``gating``: the ``--gpu-compare-fail`` expressions (empty: nothing fails, the default
    thresholds are listed only)."""

    def __init__(self, reference: Reference, gating: Sequence[Threshold], chosen: str, note: str | None = None) -> None:
        self.reference = reference
        self.gating = tuple(gating)
        self.thresholds = with_listed_kernels(self.gating or parse_thresholds(DEFAULT_THRESHOLDS))
        self.chosen = chosen  # why this baseline: the summary's compare line says it
        self.note = note  # what qualifies every comparison (another machine's baseline)
        # both runs on the host backend's virtual clock: a run's figures are its code's alone
        self.exact = False

    @functools.cached_property
    def comparisons(self) -> int:
        """How many gated comparisons the baseline's newest record offers (all its tests, each
        gated metric and kernel): their bounds share the run's error rate (``SUITE_RATE``),
        whichever of them this run selects."""
        tests = self.reference.newest_record.get("tests") if self.reference.store is not None else None
        return gated_comparisons(self.gating, tests if isinstance(tests, list) else ())

    @property
    def where(self) -> str:
        return self.reference.where

    @classmethod
    def open(
        cls,
        compare: str,
        machine: Machine,
        gating: Sequence[Threshold],
        storage: str,
        any_machine: bool = False,
        saving: bool = False,
    ) -> Gate | None:
        """The baseline ``compare`` names for ``machine``; ``None`` only where the store
        holds no baseline at all for this machine and this run saves one (``saving``: the
        first run of ``--gpu-autosave --gpu-compare=latest``)."""
        from pytest_gpuprof.baselines import store as stores

        asked = wanted(compare)
        note = None
        if asked.path is not None:
            path = asked.path
            if "://" not in path and not os.path.isfile(path):
                raise BaselineError(f"{path}: no such report file")
            reference = Reference.of_report(records.load(path), path)
        else:
            store = stores.Store(storage)
            try:
                reference = store.reference(machine["id"], asked.name, asked.pooled)
            except stores.NoBaseline as e:
                if any_machine:
                    reference = store.reference_any_machine(asked.name, asked.pooled)
                elif saving and e.empty:
                    return None
                else:
                    raise
        theirs = reference.newest_record["machine"]
        if theirs.get("id") != machine["id"]:
            if not any_machine:
                raise BaselineError(
                    f"{reference.where} was measured on machine {describe_machine(theirs)}; this is "
                    f"{describe_machine(machine)}. Pass --gpu-compare-any-machine to compare anyway"
                )
            changed = machine_differences(theirs, machine)
            note = f"baseline of another machine ({', '.join(changed) or 'its id differs'})"
        source = ", ".join(
            f"{k} {records.clean(str(reference.newest_record.get(k)))[:n]}"
            for k, n in (("created", 19), ("commit", 12), ("branch", 40))
            if reference.newest_record.get(k)
        )
        chosen = f"{reference.why}{'; ' + source if source else ''}"
        gate = cls(reference, gating, chosen, note)
        gate.exact = theirs.get("clock") == "virtual" and machine.get("clock") == "virtual"
        return gate

    def compare(self, nodeid: str, test: Entry, environment: dict[str, Any] | None = None) -> Comparison:
        """``test`` (its report entry) against its baseline entry; ``environment``: what else
        changes kernels, as it is now (a change of it is named beside the verdict). A
        baseline entry that cannot be compared (a damaged field) leaves the test's outcome
        its own: the comparison says why and gates nothing."""
        try:
            found = self.reference.entry(nodeid)
        except BaselineError as e:  # a record the store could not give
            return Comparison(nodeid, "not compared", gating=self.gating, why_not=f"{e}: comparison not made")
        if found is None:
            return Comparison(nodeid, "new", gating=self.gating)
        base, held = found
        for side, entry in ((held.where, base), ("this run", test)):
            problem = entry_problem(entry)
            if problem is not None:
                why = f"{side}: {problem}: comparison not made"
                return Comparison(nodeid, "not compared", gating=self.gating, baseline=held.record, why_not=why)
        try:
            history = None  # a report's file: one run, the rounds alone (said in the note)
            places: list[str] = []
            if self.reference.store is not None:
                held_runs = [
                    (w, e) for w, e in self.reference.history_of(nodeid, HISTORY_RUNS) if entry_problem(e) is None
                ]
                places, history = [w for w, _ in held_runs], [e for _, e in held_runs]
            changes = compare_tests(self.thresholds, base, test, history, self.exact, self.comparisons)
        except (TypeError, ValueError, OverflowError, KeyError, AttributeError, ZeroDivisionError) as e:
            # fields ``entry_problem`` passed, so the comparison itself failed: an error of the
            # run that names the test and the cause, never a test passed as "not compared"
            why = (
                f"the comparison with {held.where} failed ({type(e).__name__}: {records.clean(str(e))[:200]}); "
                "a field of a shape the gate does not expect, or a bug of pytest-gpuprof"
            )
            return Comparison(nodeid, "not compared", gating=self.gating, baseline=held.record, why_not=why, error=True)
        moved = changed(dict(held.environment), environment or {})
        notes = [n for n in (self.note, clock_note(base, test), _left_out(changes, places)) if n]
        if self.reference.store is None:
            notes.append(FILE_NOTE)
        if moved:
            notes.append(f"the environment changed: {', '.join(moved)}")
        made = Comparison(nodeid, "compared", tuple(changes), self.gating, held.record, "; ".join(notes) or None)
        return replace(made, explained=explain(base, test)) if made.regressed else made
