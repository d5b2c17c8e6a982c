"""Baselines on disk: ``<storage>/<machine-id>/NNNN_NAME.json``, written atomically.

Two processes saving at once each get their own number: a file is written under a
temporary name and then hard-linked to its final name, which fails rather than
overwrites when the name is taken.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.output.files import json_text, written
from pytest_gpuprof.output.report import SCHEMA

_NUMBERED = re.compile(r"^(\d{4})_(.+)\.json$")


class BaselineError(ValueError):
    """A baseline that cannot be used, with the file and the reason."""


def check_name(name: str) -> None:
    """A baseline name: part of a file name, so letters, digits, '.', '_' and '-', 1 to 64
    of them, not ending in '.json' (``--gpu-compare`` reads such a value as a file's path)."""
    if name.endswith(".json"):
        raise BaselineError(
            f"--gpu-save={name!r}: give the baseline a name, not a file name: --gpu-save={name[:-5] or 'main'} "
            f"is stored as NNNN_{name[:-5] or 'main'}.json, and --gpu-compare reads a value ending in .json as a path"
        )
    if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name) or name in (".", "..") or name == "latest":
        raise BaselineError(
            f"--gpu-save={name!r}: a baseline name is 1 to 64 letters, digits, '.', '_' or '-' "
            "(and not 'latest', which --gpu-compare reads as the newest baseline)"
        )


@dataclass(frozen=True, slots=True)
class BaselineStore:
    """The baselines under one folder (``--gpu-storage``): saved, listed, found, read."""

    folder: Path

    def save(self, report: dict[str, Any], name: str) -> Path:
        """``report`` as this machine's next baseline ``NNNN_NAME.json``."""
        check_name(name)
        folder = self.folder / report["machine"]["id"]
        with written(folder, json_text(report)) as tmp:
            for _ in range(1000):
                target = folder / f"{_next_number(folder):04d}_{name}.json"
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    continue  # another process took this number between our look and our link
                return target
        raise BaselineError(f"{folder}: could not find a free baseline number")

    def machines(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir() if p.is_dir()) if self.folder.is_dir() else []

    def machine(self, wanted: str | None) -> str:
        """The machine id whose baselines to read: ``wanted``, or the only one stored."""
        if not self.folder.is_dir():
            raise BaselineError(f"--storage {self.folder}: no such folder (baselines are saved with --gpu-save)")
        machines = self.machines()
        if wanted is not None:
            if wanted not in machines:
                raise BaselineError(
                    f"no baselines of machine {wanted} under {self.folder}; stored: {machines or 'none'}"
                )
            return wanted
        if len(machines) != 1:
            what = f"baselines of {len(machines)} machines ({', '.join(machines)})" if machines else "no baselines"
            raise BaselineError(f"{self.folder} holds {what}: name one with --machine")
        return machines[0]

    def baselines(self, machine_id: str) -> list[Path]:
        """The machine's baselines, oldest first."""
        folder = self.folder / machine_id
        if not folder.is_dir():
            return []
        return sorted((p for p in folder.iterdir() if _NUMBERED.match(p.name)), key=lambda p: p.name)

    def find(self, machine_id: str, wanted: str | None) -> Path:
        """The newest accepted baseline of this machine, the newest one named ``wanted``, or the file ``wanted``."""
        return self.choose(machine_id, wanted)[0]

    def choose(self, machine_id: str, wanted: str | None) -> tuple[Path, str]:
        """``find``'s baseline and why it was chosen, for the compare line. A stored run that
        is not a complete, accepted one (an older version saved runs that ended early or
        measured nothing) is passed over, and the line says so."""
        if wanted and (wanted.endswith(".json") or os.sep in wanted):
            if not Path(wanted).is_file():
                raise BaselineError(f"{wanted}: no such report file")
            return Path(wanted), "the file given"
        candidates = self.baselines(machine_id)
        if wanted:
            candidates = [p for p in candidates if _NUMBERED.match(p.name)[2] == wanted or p.stem == wanted]  # type: ignore[index]
        what = f"named {wanted!r} " if wanted else ""
        if not candidates:
            others = sorted(p.name for p in self.folder.iterdir()) if self.folder.is_dir() else []
            hint = f"; baselines exist for machine ids {', '.join(others)}" if others else ""
            raise BaselineError(f"no baseline {what}for machine {machine_id} under {self.folder}{hint}")
        passed_over: list[str] = []
        for path in reversed(candidates):
            why = not_accepted(load(path))
            if why is None:
                note = f"; passed over {len(passed_over)} newer: {'; '.join(passed_over)}" if passed_over else ""
                return path, f"the newest accepted baseline {what}of machine {machine_id}{note}"
            passed_over.append(f"{path.name} ({why})")
        raise BaselineError(
            f"no accepted baseline {what}for machine {machine_id} under {self.folder}: {'; '.join(passed_over)}"
        )


def not_accepted(report: dict[str, Any]) -> str | None:
    """Why a stored report is no baseline a comparison may pick (docs/design.md, "The
    baseline rule"), or ``None``."""
    if report.get("partial"):
        return f"the run {report['partial']}"
    if not report.get("tests"):
        return "it holds no test"
    return None


def _next_number(folder: Path) -> int:
    numbers = [int(m[1]) for p in folder.iterdir() if (m := _NUMBERED.match(p.name))]
    return max(numbers, default=0) + 1


def load(path: Path, strict: bool = False) -> dict[str, Any]:
    """A report from disk, checked enough that comparing it cannot crash; ``strict``: every
    test's figures checked too (``entry_problem``), for a reader that shows them all (a
    comparison instead leaves an unusable test out, naming it)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise BaselineError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BaselineError(f"{path}: corrupt or truncated JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise BaselineError(f"{path}: not a gpuprof report (top level is {type(data).__name__})")
    schema = data.get("schema")
    if not isinstance(schema, int):
        raise BaselineError(f"{path}: not a gpuprof report (no schema number)")
    if schema > SCHEMA:
        raise BaselineError(f"{path}: schema {schema} is newer than this pytest-gpuprof reads ({SCHEMA}); upgrade it")
    machine, tests = data.get("machine"), data.get("tests")
    if not isinstance(machine, dict) or not isinstance(machine.get("id"), str):
        raise BaselineError(f"{path}: no machine id")
    if not isinstance(tests, list) or not all(isinstance(t, dict) and isinstance(t.get("nodeid"), str) for t in tests):
        raise BaselineError(f"{path}: 'tests' must be a list of tests with a nodeid")
    seen: set[str] = set()
    for test in tests:
        if test["nodeid"] in seen:
            raise BaselineError(f"{path}: test {test['nodeid']} is in it twice: which one is the baseline is unknown")
        seen.add(test["nodeid"])
        # a test whose xdist worker died has no figures: its entry says so (``crashed``)
        problem = entry_problem(test) if strict and "crashed" not in test else None
        if problem is not None:
            raise BaselineError(f"{path}: test {test['nodeid']}: {problem}")
    return data


def entry_problem(test: dict[str, Any]) -> str | None:
    """What makes a report's test entry unusable for a comparison: the field and why; or
    ``None``. The figures a comparison reads are numbers (or null where not measured):
    the window's and each step's metrics, and every round's samples."""
    metrics = test.get("metrics")
    problem = _figures_problem(metrics, "metrics", descriptors.names("window"))
    if problem is not None or not isinstance(metrics, dict):
        return problem
    steps = metrics.get("steps", {})
    if not isinstance(steps, dict):
        return f"metrics.steps: a table is expected, not {_kind(steps)}"
    for step, figures in steps.items():
        problem = _figures_problem(figures, f"metrics.steps.{step}", descriptors.names("step"))
        if problem is not None:
            return problem
    rounds = test.get("rounds", {})
    if not isinstance(rounds, dict):
        return f"rounds: a table is expected, not {_kind(rounds)}"
    for path, summary in rounds.items():
        samples = summary.get("samples") if isinstance(summary, dict) else None
        if not isinstance(samples, list) or not all(_figure(v) and v is not None for v in samples):
            return f"rounds.{path}.samples: a list of finite numbers is expected"
        metric = descriptors.lookup(path)
        # no time, size, count or fraction of the wall time is negative; a discrepancy may be
        signed = metric is not None and metric.name == "discrepancy"
        if not signed and any(v < 0 for v in samples):
            return f"rounds.{path}.samples: {min(samples)} is impossible: a measured {path} is never negative"
    return None


def _figures_problem(table: object, where: str, names: tuple[str, ...]) -> str | None:
    """What is wrong with a table of figures (``where`` names it), or ``None``."""
    if not isinstance(table, dict):
        return f"{where}: a table is expected, not {_kind(table)}"
    for name in names:
        if not _figure(table.get(name)):
            return f"{where}.{name}: a number is expected, not {_kind(table.get(name))}"
    return None


def _figure(value: object) -> bool:
    """A measured number (finite, not a bool) or null."""
    if value is None:
        return True
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _kind(value: object) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else type(value).__name__
