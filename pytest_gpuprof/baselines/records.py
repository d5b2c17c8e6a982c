"""What makes a report usable as a baseline: its name, its checks when read, whether it
was an accepted run. Where baselines are kept is ``baselines.store``."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.names import clean
from pytest_gpuprof.output.files import read_regular
from pytest_gpuprof.output.schema import SCHEMA

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.entry import Entry


class BaselineError(ValueError):
    """A baseline that cannot be used, with the file and the reason."""


class NewerSchema(BaselineError):
    """A report of a newer pytest-gpuprof: not damaged, only not readable by this one."""


def check_name(name: str) -> None:
    """A baseline name: part of a file name, so letters, digits, '.', '_' and '-', 1 to 64
    of them, not ending in '.json' (``--gpu-compare`` reads such a value as a file's path)."""
    if name.endswith(".json"):
        raise BaselineError(
            f"--gpu-save={name!r}: give the baseline a name, not a file name: --gpu-save={name[:-5] or 'main'} "
            f"is stored as {name[:-5] or 'main'}@TIME@RUN@ID.json, and --gpu-compare reads a value ending in .json as a path"
        )
    if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name) or name in (".", "..") or name == "latest":
        raise BaselineError(
            f"--gpu-save={name!r}: a baseline name is 1 to 64 letters, digits, '.', '_' or '-' "
            "(and not 'latest', which --gpu-compare reads as the newest baseline)"
        )


def shown(url: str) -> str:
    """``url`` without the credentials a user may have put in it; a folder as the reader finds
    it: from the current folder where it lies under it, else whole (the project's store, seen
    from a subfolder, is named where it is)."""
    parts = urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    if "://" not in url and os.path.isabs(url):
        try:
            relative = os.path.relpath(url)
        except ValueError:  # another drive (Windows)
            return url
        return url if relative.startswith("..") else relative
    return url


def not_accepted(report: dict[str, Any]) -> str | None:
    """Why a stored report is no baseline a comparison may pick (docs/design.md, "The
    baseline rule"), or ``None``."""
    if report.get("partial"):
        return f"the run {report['partial']}"
    if not report.get("tests"):
        return "it holds no test"
    return None


def load(path: Path | str, strict: bool = False) -> dict[str, Any]:
    """A report from disk or a store's URL, checked enough that comparing it cannot crash;
    ``strict``: every test's figures checked too (``entry_problem``), for a reader that
    shows them all (a comparison instead leaves an unusable test out, naming it)."""
    if "://" in str(path):
        try:
            import fsspec

            with fsspec.open(str(path), "rb") as f:
                data = f.read()
        except Exception as e:  # the storage library's own errors
            raise BaselineError(f"{shown(str(path))}: cannot read: {type(e).__name__}: {clean(str(e))}") from None
        return parse(decoded(data, shown(str(path))), shown(str(path)), strict)
    try:
        data = read_regular(path)
    except OSError as e:
        raise BaselineError(f"{path}: cannot read: {e.strerror}") from None
    return parse(decoded(data, str(path)), str(path), strict)


def decoded(data: bytes, path: str) -> str:
    """A report's bytes as text: JSON is UTF-8, and anything else is named, not guessed."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BaselineError(f"{path}: not UTF-8 text (byte {e.start}): not a gpuprof report") from None


def parse(text: str, path: str, strict: bool = False) -> dict[str, Any]:
    """A report's text (``path`` names it in the errors), checked as ``load`` says."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BaselineError(f"{path}: corrupt or truncated JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise BaselineError(f"{path}: JSON nested too deep to be a gpuprof report") from None
    except ValueError as e:  # an integer past Python's limit on the digits it converts
        raise BaselineError(f"{path}: not a gpuprof report ({clean(str(e))[:120]})") from None
    if not isinstance(data, dict):
        raise BaselineError(f"{path}: not a gpuprof report (top level is {type(data).__name__})")
    schema = data.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int):
        raise BaselineError(f"{path}: not a gpuprof report (no schema number)")
    if schema < 1:
        raise BaselineError(f"{path}: schema {schema} is no schema pytest-gpuprof ever wrote (they count from 1)")
    if schema > SCHEMA:
        raise NewerSchema(f"{path}: schema {schema} is newer than this pytest-gpuprof reads ({SCHEMA}); upgrade it")
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


def entry_problem(test: Entry) -> str | None:
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
    totals = metrics.get("kernel_totals", {})
    if not isinstance(totals, dict):
        return f"metrics.kernel_totals: a table of each kernel's milliseconds is expected, not {_kind(totals)}"
    for kernel, ms in totals.items():
        if not _figure(ms):
            return f"metrics.kernel_totals.{clean(kernel)[:80]}: a number is expected, not {_kind(ms)}"
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
        timed = path.endswith("_ms") or (metric is not None and metric.unit == "ms")
        implausible = next((v for v in samples if timed and not _plausible_ms(v, path)), None)
        if implausible is not None:
            return f"rounds.{path}.samples: {implausible!r} ms is impossible: {_why_not_ms(implausible, path)}"
    wall = metrics.get("wall_ms")
    if isinstance(wall, int | float) and not isinstance(wall, bool) and wall < 0:
        return f"metrics.wall_ms: {wall!r} ms is impossible: a window's wall time is never negative"
    if isinstance(wall, int | float) and not isinstance(wall, bool) and not _plausible_ms(wall, "wall_ms"):
        return f"metrics.wall_ms: {wall!r} ms is impossible: {_why_not_ms(wall, 'wall_ms')}"
    return None


# a window longer than a day is no measurement this plugin took; a time under a
# femtosecond that is not zero is a number, not a duration (zero is a figure)
MOST_MS = 86_400_000.0
LEAST_MS = 1e-12


def _plausible_ms(value: float, path: str) -> bool:
    # zero is a figure: no kernel at all, or host code on the virtual clock, takes none
    return value == 0 or LEAST_MS <= abs(value) <= MOST_MS


def _why_not_ms(value: float, path: str) -> str:
    if abs(value) > MOST_MS:
        return "longer than a day"
    return "shorter than a femtosecond"


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
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer no float can hold: 400 digits of it
        return False


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return clean(repr(value[:80]))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**300:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return type(value).__name__


def merge(reports: Sequence[dict[str, Any]], names: Sequence[str] = ()) -> dict[str, Any]:
    """One report of several, each test from the one report that holds it: a test in two
    reports is refused (which of two measurements is the test's is not merge's to choose)."""
    ids = {r["machine"].get("id") for r in reports}
    if len(ids) > 1:
        raise BaselineError(f"cannot merge reports of different machines: {', '.join(sorted(map(str, ids)))}")
    names = list(names) or [f"report {i + 1}" for i in range(len(reports))]
    tests: dict[str, dict[str, Any]] = {}
    source: dict[str, str] = {}
    for name, r in zip(names, reports):
        for t in r["tests"]:
            if t["nodeid"] in tests:
                raise BaselineError(
                    f"{t['nodeid']} is in {source[t['nodeid']]} and in {name}: merge takes each test from one "
                    "report; remove it from one of them"
                )
            tests[t["nodeid"]], source[t["nodeid"]] = t, name
    merged = {k: v for k, v in reports[-1].items() if k not in ("partial", "note")}
    partial = [f"{r['partial']} ({i + 1} of {len(reports)})" for i, r in enumerate(reports) if r.get("partial")]
    if partial:  # any input's run that did not finish makes the merge partial
        merged["partial"] = "; ".join(partial)
    return {**merged, "tests": list(tests.values())}


def run_id_from_environment(env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The CI's id of this workflow run, shared by its shards (matrix jobs); ``None`` outside CI."""
    if env.get("GITHUB_RUN_ID"):
        return f"gh{env['GITHUB_RUN_ID']}-{env.get('GITHUB_RUN_ATTEMPT', '1')}"
    for var, prefix in (
        ("CI_PIPELINE_ID", "gl"),
        ("BUILDKITE_BUILD_ID", "bk"),
        ("CIRCLE_WORKFLOW_ID", "cc"),
        ("BUILD_BUILDID", "az"),
    ):
        if env.get(var):
            return f"{prefix}{env[var]}"
    return None


def check_run_id(run_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,80}", run_id):
        raise BaselineError(f"--gpu-run-id={run_id!r}: a run id is 1 to 80 letters, digits, '.', '_' or '-'")
    return run_id
