"""The regression gate: the baseline a run compares with, and each test's changes.

A change fails its test only when ``--gpu-compare-fail`` names the metric and the
change is both beyond its threshold and clear over the rounds (``verdict.compare.assess``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.config import Settings
from pytest_gpuprof.verdict.compare import DEFAULT_THRESHOLDS, NEW

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.compare import Change, Threshold


class Gate:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.baseline: dict[str, Any] | None = None
        self.path: Path | None = None
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
        """Find and read the baseline; a usage error where it cannot be used."""
        if self.settings.compare is None:
            return
        from pytest_gpuprof.output import storage

        wanted = None if self.settings.compare == "latest" else self.settings.compare
        try:
            path, chosen = storage.BaselineStore(self.settings.storage).choose(machine["id"], wanted)
            baseline = storage.load(path)
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
                f"pytest-gpuprof: --gpu-compare: {path} was measured on machine {theirs['id']} "
                f"({theirs.get('gpu')}, driver {theirs.get('driver')}, PCIe {theirs.get('pcie')}, "
                f"{theirs.get('backend')}); this is {machine['id']} ({machine['gpu']}, driver {machine['driver']}, "
                f"PCIe {machine['pcie']}, {machine['backend']}). Pass --gpu-compare-any-machine to compare anyway"
            )
        self.baseline, self.path = baseline, path
        widths = {"created": 19, "commit": 12, "branch": 40}  # to the second; a short commit
        source = ", ".join(f"{k} {str(baseline[k])[:n]}" for k, n in widths.items() if baseline.get(k))
        self.chosen = f"{chosen}{'; ' + source if source else ''}"

    def _base(self, nodeid: str) -> dict[str, Any] | None:
        if self.baseline is None:
            return None
        return next((t for t in self.baseline["tests"] if t.get("nodeid") == nodeid), None)

    def compare(self, nodeid: str, test: dict[str, Any]) -> tuple[list[Change], str | None]:
        """This test's changes against its baseline entry, and the failure message when it
        clearly regressed and ``--gpu-compare-fail`` was given."""
        base = self._base(nodeid)
        if base is None:
            return [], None  # no baseline, or a new test: nothing to compare with
        from pytest_gpuprof.output.storage import entry_problem
        from pytest_gpuprof.verdict.compare import clock_note, compare_tests

        problem = entry_problem(base)
        if problem is not None:
            self._unusable[nodeid] = f"{self.path}: {nodeid}: {problem}: comparison not made"
            return [], None

        changes = compare_tests(self._thresholds, base, test)
        self._notes[nodeid] = clock_note(base, test)
        regressed = self.regressed(changes)
        if not regressed or not self.settings.compare_fail:
            return changes, None
        note = self._notes[nodeid]
        lines = [f"GPU regression against baseline {self.path}:", *([f"  note: {note}"] if note else [])]
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
        if self.baseline is None:
            return []
        if self._base(nodeid) is None:
            return [f"{nodeid}: {NEW}"]
        if nodeid in self._unusable:
            return [f"{nodeid}: not compared: {self._unusable[nodeid]}"]
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
