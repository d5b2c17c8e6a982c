"""The regression gate: the baseline a run compares with, and each test's changes.

A change fails its test only when ``--gpu-compare-fail`` names the metric and the
change is both beyond its threshold and clear over the rounds (``verdict.compare.assess``).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.harness.config import Settings
from pytest_gpuprof.verdict.compare import DEFAULT_THRESHOLDS, NEW

if TYPE_CHECKING:
    from pytest_gpuprof.output.store import Reference
    from pytest_gpuprof.verdict.compare import Change, Threshold


class Gate:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.reference: Reference | None = None
        self.path: str | None = None  # the newest baseline record read
        self._entries: dict[str, tuple[dict[str, Any], str, int] | None] = {}
        self.chosen = ""  # why this baseline: the compare line says it
        self._notes: dict[str, str | None] = {}  # by test: what qualifies its comparison
        self._unusable: dict[str, str] = {}  # by test: why its baseline entry could not be compared

    @functools.cached_property
    def _thresholds(self) -> list[Threshold]:
        """What a comparison lists: the gating expressions (else the default ones) and the
        kernels that changed."""
        from pytest_gpuprof.verdict.compare import parse_thresholds, with_listed_kernels

        return with_listed_kernels(self.settings.compare_fail or parse_thresholds(DEFAULT_THRESHOLDS))

    def load(self, machine: dict[str, Any]) -> None:
        """Find the baseline; a usage error where it cannot be used."""
        if self.settings.compare is None:
            return
        from pytest_gpuprof.output import storage, store

        name, pooled = wanted(self.settings.compare)
        try:
            if name and (name.endswith(".json") or os.sep in name):
                if "://" not in name and not os.path.isfile(name):
                    raise storage.BaselineError(f"{name}: no such report file")
                reference = store.Reference.of_report(storage.load(name), name)
            else:
                reference = store.Store(self.settings.storage).reference(machine["id"], name, pooled)
            baseline = reference.first
        except storage.BaselineError as e:
            flag = (
                "--gpu-compare"
                if self.settings.compare_given
                else "--gpu-compare-fail (compared with the latest baseline)"
            )
            raise pytest.UsageError(f"pytest-gpuprof: {flag}: {e}") from None
        theirs = baseline["machine"]
        if theirs["id"] != machine["id"] and not self.settings.compare_any_machine:
            raise pytest.UsageError(
                f"pytest-gpuprof: --gpu-compare: {reference.where} was measured on machine {theirs['id']} "
                f"({theirs.get('gpu')}, driver {theirs.get('driver')}, PCIe {theirs.get('pcie')}, "
                f"{theirs.get('backend')}); this is {machine['id']} ({machine['gpu']}, driver {machine['driver']}, "
                f"PCIe {machine['pcie']}, {machine['backend']}). Pass --gpu-compare-any-machine to compare anyway"
            )
        self.reference, self.path = reference, reference.where
        widths = {"created": 19, "commit": 12, "branch": 40}  # to the second; a short commit
        source = ", ".join(f"{k} {str(baseline[k])[:n]}" for k, n in widths.items() if baseline.get(k))
        self.chosen = f"{reference.why}{'; ' + source if source else ''}"

    def _base(self, nodeid: str) -> dict[str, Any] | None:
        found = self._entry(nodeid)
        return None if found is None else found[0]

    def _entry(self, nodeid: str) -> tuple[dict[str, Any], str, int] | None:
        """The test's baseline entry, where it came from and how many runs it pools."""
        if self.reference is None:
            return None
        if nodeid not in self._entries:
            from pytest_gpuprof.output.storage import BaselineError

            try:
                self._entries[nodeid] = self.reference.entry(nodeid)
            except BaselineError as e:  # a record the store could not give
                self._unusable[nodeid] = f"{e}: comparison not made"
                self._entries[nodeid] = None
        return self._entries[nodeid]

    def compare(self, nodeid: str, test: dict[str, Any]) -> tuple[list[Change], str | None]:
        """This test's changes against its baseline entry, and the failure message when it
        clearly regressed and ``--gpu-compare-fail`` was given."""
        found = self._entry(nodeid)
        if found is None or nodeid in self._unusable:
            return [], None  # no baseline, or a new test: nothing to compare with
        base, source, pooled = found
        from pytest_gpuprof.output.storage import entry_problem
        from pytest_gpuprof.verdict.compare import clock_note, compare_tests

        problem = entry_problem(base)
        if problem is not None:
            self._unusable[nodeid] = f"{source}: {nodeid}: {problem}: comparison not made"
            return [], None

        changes = compare_tests(self._thresholds, base, test)
        self._notes[nodeid] = clock_note(base, test)
        regressed = self.regressed(changes)
        if not regressed or not self.settings.compare_fail:
            return changes, None
        note = self._notes[nodeid]
        against = f"{source} (pooled over {pooled} runs)" if pooled > 1 else source
        lines = [f"GPU regression against baseline {against}:", *([f"  note: {note}"] if note else [])]
        from pytest_gpuprof.verdict.compare import kernel_names

        names = kernel_names(regressed)
        lines += [f"  {c.describe(names)}" for c in regressed]
        return changes, "\n".join(lines)

    def regression_labels(self, changes: list[Change]) -> list[str]:
        """What the verdict calls each change that fails its test (a kernel by its short name)."""
        from pytest_gpuprof.verdict.compare import kernel_names

        regressed = self.regressed(changes)
        names = kernel_names(regressed)
        return [c.label(names) for c in regressed]

    def regressed(self, changes: list[Change]) -> list[Change]:
        """The changes that fail their test: clear regressions of a ``--gpu-compare-fail``
        expression (the rest are listed only)."""
        from pytest_gpuprof.verdict.compare import regressions

        return regressions(changes, self.settings.compare_fail)

    def lines(self, nodeid: str, changes: list[Change]) -> list[str]:
        """The test's lines of the comparison in the summary."""
        if self.reference is None:
            return []
        if nodeid in self._unusable:
            return [f"{nodeid}: not compared: {self._unusable[nodeid]}"]
        if self._base(nodeid) is None:
            return [f"{nodeid}: {NEW}"]
        from pytest_gpuprof.verdict.compare import change_lines

        return change_lines(nodeid, changes, self._notes.get(nodeid), self.settings.compare_fail or ())

    def inert(self, changes: list[Change]) -> list[str]:
        """The gating expressions that these changes could never have failed."""
        from pytest_gpuprof.verdict.compare import inert_gates

        return inert_gates(changes, self.settings.compare_fail or ())

    def inert_causes(self, changes: list[Change]) -> dict[str, str]:
        """Each gating expression these changes could never have failed, and why."""
        from pytest_gpuprof.verdict.compare import inert_causes

        return inert_causes(changes, self.settings.compare_fail or ())

    def gates(self, nodeid: str) -> bool:
        """Whether a gating expression applies to this test (a baseline entry to compare)."""
        return bool(self.settings.compare_fail) and self._base(nodeid) is not None and nodeid not in self._unusable

    def unusable(self, nodeid: str) -> str | None:
        """Why this test's baseline entry could not be compared, naming the file and field."""
        return self._unusable.get(nodeid)


def wanted(compare: str) -> tuple[str | None, int]:
    """``--gpu-compare``'s baseline name (``None``: the latest) and how many runs to pool
    (``NAME~K``)."""
    if compare == "latest":
        return None, 1
    name, tilde, count = compare.rpartition("~")
    if tilde and count.isdigit() and name and not compare.endswith(".json"):
        return (None if name == "latest" else name), int(count)
    return compare, 1
