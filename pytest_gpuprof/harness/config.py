"""Settings: the command line, ``[tool.gpuprof]`` and the budget file, validated once
(``Settings.from_pytest_config``); a test's budget markers over them (``marker_budget``).

Everything here is read at start-up; an error is a ``ConfigError`` naming the key and
where it came from, which the plugin turns into a pytest usage error (exit code 4).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_gpuprof.harness.touch import find_pyproject
from pytest_gpuprof.settings.checks import (
    ConfigError,
    FileKeys,
    check_number,
    check_output,
    load_toml,
    read_budget_file,
    read_pyproject,
)
from pytest_gpuprof.settings.convert import Given
from pytest_gpuprof.settings.options import BUDGET_FLAGS, CONFIRMING, DEFAULT, TABLE, Option
from pytest_gpuprof.verdict.budget import Budget, BudgetError, parse_budget

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.thresholds import Threshold

BackendChoice = Literal["auto", "cuda", "host"]
HostClock = Literal["real", "virtual"]
# which tests run: every one, none that uses the plugin (--gpu-skip), only those (--gpu-only)
Selection = Literal["all", "skip", "only"]
__all__ = [
    "ConfigError",
    "Settings",
    "check_number",
    "check_output",
    "load_toml",
    "marker_budget",
    "read_budget_file",
    "read_pyproject",
]


@dataclass(frozen=True, slots=True)
class Settings:
    backend: BackendChoice = DEFAULT["--gpu-backend"]
    # the host backend's time: real, or virtual for tests that must not depend on load
    host_clock: HostClock = DEFAULT["--gpu-host-clock"]
    device: int = DEFAULT["--gpu-device"]
    rounds: int = DEFAULT["--gpu-rounds"]
    warmup: int = DEFAULT["--gpu-warmup"]
    # --gpu-rounds given on the command line: the least rounds of every measure(), whatever
    # it asks for (docs/design.md, "Rounds")
    rounds_floor: int | None = None
    enforce: bool = False
    budget: Budget = field(default_factory=Budget)
    report: Path | None = None
    cupti: bool = True
    nvml: bool = True
    nvml_interval_ms: float = DEFAULT["--gpu-nvml-interval"]
    pyproject: Path | None = None
    devices: tuple[int, ...] | str | None = None
    trace: Path | None = None
    html: Path | None = None
    save: str | None = None
    # "latest", a baseline name or a report's path
    compare: str | None = None
    compare_fail: tuple[Threshold, ...] = ()
    compare_given: bool = False  # --gpu-compare itself, not implied by --gpu-compare-fail
    compare_any_machine: bool = False
    # an undecided gated test: warned and counted, or failed (GPU UNDECIDED)
    compare_undecided: str = DEFAULT["--gpu-compare-undecided"]
    # fresh runs that must repeat a regression before it fails its test (harness.reruns)
    compare_confirm: int = int(DEFAULT["--gpu-compare-confirm"])
    storage: str = DEFAULT["--gpu-storage"]  # a folder or a URL (baselines.store)
    run_id: str | None = None  # the run a save belongs to (its shards share it)
    # a --gpu-* option or a [tool.gpuprof] table: start the backend with the session
    configured: bool = False
    # rows of the terminal table (None: all)
    summary_rows: int | None = int(DEFAULT["--gpu-summary"])
    # NVTX ranges as steps (CUPTI); sampled host stacks for idle_by_code
    nvtx: bool = True
    sample: bool = True
    # a test that uses the device holds it alone among this plugin's processes
    exclusive: bool = True
    lock_timeout_s: float = float(DEFAULT["--gpu-lock-timeout"])  # a wait for the device ends then, naming the holder
    children: bool = True
    # --gpu-disable: the code runs, nothing is measured or judged
    disabled: bool = False
    selection: Selection = "all"
    # the terminal table's shape (None: as the summary orders it); --gpu-csv
    columns: tuple[str, ...] | None = None
    sort: str | None = None
    group_by: str | None = None
    csv: Path | None = None
    # --gpu-memory-top: the places that held the most device memory at each test's peak (0: none)
    memory_top: int = 0

    @classmethod
    def from_pytest_config(cls, config: pytest.Config) -> Settings:
        """Every setting, validated before any test runs, each row of ``options.TABLE`` its
        field: a mistake is a usage error naming the option or key, the value and what would
        be valid."""
        opt = config.getoption
        pyproject = find_pyproject(config)
        file_settings, file_budget = read_pyproject(pyproject, FILE_KEYS)
        budget = _run_budget(opt, file_budget)
        _check_numbers(opt)
        _refuse_conflicts(opt)
        _check_outputs(opt)
        given = Given(opt, file_settings, config.rootpath, pyproject)
        fields = {o.field: _value(o, given) for o in TABLE if o.field is not None}
        # the host clock alone starts nothing: it says how to run once something starts
        flagged = any(opt(o.flag) not in (None, False) for o in TABLE if o.flag != "--gpu-host-clock")
        configured = flagged or bool(set(file_settings) - {"host_clock"}) or not file_budget.empty
        settings = cls(
            **fields,
            budget=budget,
            pyproject=pyproject,
            rounds_floor=opt("--gpu-rounds"),
            compare_given=opt("--gpu-compare") is not None,
            selection="skip" if opt("--gpu-skip") else ("only" if opt("--gpu-only") else "all"),
            configured=configured,
        )
        if settings.configured and not settings.disabled:
            _check_step_summary()
        if os.environ.get(CONFIRMING):  # a fresh run confirming a regression: its report alone
            return dataclasses.replace(
                settings, save=None, compare=None, compare_fail=(), compare_given=False, trace=None, html=None, csv=None
            )
        return settings


# the fields no row of the table sets: each is read from several flags, or from none
DERIVED = ("budget", "pyproject", "rounds_floor", "compare_given", "selection", "configured")
FILE_KEYS = FileKeys.of(TABLE)


def _value(o: Option, given: Given) -> Any:
    """A row's field: the command line's value, else the file's, else the table's default,
    through the row's converter."""
    value = given.opt(o.flag)
    if value is None and o.key is not None:
        value = given.file.get(o.key)
    value = o.default if value is None else value
    return value if o.convert is None else o.convert(value, given)


def _refuse_conflicts(opt: Callable[[str], Any]) -> None:
    for o in TABLE:
        if not opt(o.flag):
            continue
        for other in o.conflicts:
            if opt(other):
                raise ConfigError(f"{o.flag} and {other} cannot be given together: {o.why}")


def _run_budget(opt: Callable[[str], Any], file_budget: Budget) -> Budget:
    """The run's budget: the flags' keys over the budget file's over ``[tool.gpuprof.budget]``."""
    budget_file = opt("--gpu-budget-file")
    budget = file_budget if budget_file is None else read_budget_file(Path(budget_file)).merged_over(file_budget)
    return _flag_budget(opt).merged_over(budget)


def _check_numbers(opt: Callable[[str], Any]) -> None:
    for o in TABLE:
        if o.number is not None and o.key is not None and opt(o.flag) is not None:
            check_number(o.key, opt(o.flag), o.flag, o.number)


def _check_outputs(opt: Callable[[str], Any]) -> None:
    """Every output its own file. ``$GITHUB_STEP_SUMMARY`` is the CI's, not an option: it is
    checked writable where the plugin is configured (``_check_step_summary``)."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    _distinct_outputs(
        {flag: opt(flag) for flag in ("--gpu-report", "--gpu-html", "--gpu-trace", "--gpu-csv")}
        | {"GITHUB_STEP_SUMMARY": summary}
    )


def _check_step_summary() -> None:
    """``$GITHUB_STEP_SUMMARY``, where a run of the plugin's will append to it: checked now,
    before any test runs (a folder that is missing, a file that cannot be written), not
    after all of them."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    check_output("$GITHUB_STEP_SUMMARY", Path(summary))
    if Path(summary).is_file() and not os.access(summary, os.W_OK):
        raise ConfigError(f"$GITHUB_STEP_SUMMARY={summary}: not writable")


def _flag_budget(opt: Callable[[str], Any]) -> Budget:
    """The budget keys given as flags (``--gpu-min-utilization=0.8``), each checked as the
    budget file's would be."""
    budget = Budget()
    for o in BUDGET_FLAGS:
        value = opt(o.flag)
        if value is None or o.budget is None:
            continue
        if Budget.KEYS[o.budget].unit != "bytes":
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{o.flag}={value}: expected a number") from None
        try:
            budget = parse_budget({o.budget: value}, o.flag).merged_over(budget)
        except BudgetError as e:
            raise ConfigError(str(e)) from None
    return budget


def _distinct_outputs(paths: Mapping[str, str | None]) -> None:
    """Each output its own file: two given one path would overwrite each other and both
    say written."""
    seen: dict[str, str] = {}
    for option, value in paths.items():
        if not value:
            continue
        where = os.path.realpath(value)
        if where in seen:
            raise ConfigError(f"{seen[where]} and {option} are both {value}: give each output its own path")
        seen[where] = option


def marker_budget(nodeid: str, markers: list[pytest.Mark], base: Budget) -> Budget:
    """A test's ``gpu_budget`` markers merged key by key over the run's budget, the
    closest winning: the function's (the one written nearest it first, when stacked),
    then its class's, then its module's (``pytestmark``). A usage error names the test."""
    budget = base
    for marker in reversed(markers):  # iter_markers yields the closest first
        if marker.args:
            raise pytest.UsageError(
                f"pytest-gpuprof: {nodeid}: gpu_budget takes keyword arguments only, got {marker.args!r}"
            )
        try:
            budget = parse_budget(marker.kwargs, f"{nodeid}: @pytest.mark.gpu_budget", own=True).merged_over(budget)
        except BudgetError as e:
            raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
    return budget
