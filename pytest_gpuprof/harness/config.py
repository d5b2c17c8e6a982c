"""Settings: the command line, ``[tool.gpuprof]`` and the budget file, validated once
(``Settings.from_pytest_config``); a test's budget markers over them (``marker_budget``).

Everything here is read at start-up; an error is a ``ConfigError`` naming the key and
where it came from, which the plugin turns into a pytest usage error (exit code 4).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_gpuprof.harness.checks import (
    ConfigError,
    check_number,
    check_output,
    device_list,
    load_toml,
    name_problem,
    read_budget_file,
    read_pyproject,
    shown_path,
    summary_rows,
)
from pytest_gpuprof.harness.options import BUDGET_FLAGS, BY_FLAG, CONFIRMING, DEFAULT, TABLE
from pytest_gpuprof.harness.touch import find_pyproject
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
        """Every setting, validated before any test runs: a mistake is a usage error naming
        the option or key, the value and what would be valid."""
        opt = config.getoption
        pyproject = find_pyproject(config)
        file_settings, file_budget = read_pyproject(pyproject)
        budget = _run_budget(opt, file_budget)
        _check_numbers(opt)
        pick = functools.partial(_pick, opt, file_settings)
        output = functools.partial(_output, opt)

        thresholds = _thresholds(opt("--gpu-compare-fail"))
        _refuse_conflicts(opt)
        save = _autosave_name(config.rootpath) if opt("--gpu-autosave") else _baseline_name(opt("--gpu-save"))
        storage = _storage(
            opt("--gpu-storage"), file_settings.get("storage"), config.rootpath, pyproject, save is not None
        )
        run_id = _run_id(opt("--gpu-run-id"))
        _check_outputs(opt)
        compare = opt("--gpu-compare")
        # the host clock alone starts nothing: it says how to run once something starts
        given = any(opt(o.flag) not in (None, False) for o in TABLE if o.flag != "--gpu-host-clock")
        disabled = bool(opt("--gpu-disable"))
        settings = cls(
            backend=pick("--gpu-backend"),
            host_clock=pick("--gpu-host-clock"),
            device=pick("--gpu-device"),
            rounds=pick("--gpu-rounds"),
            rounds_floor=opt("--gpu-rounds"),
            warmup=pick("--gpu-warmup"),
            enforce=opt("--gpu-budget"),
            budget=budget,
            report=output("--gpu-report"),
            cupti=not opt("--gpu-no-cupti") and not disabled,
            nvml=not opt("--gpu-no-nvml") and not disabled,
            nvml_interval_ms=float(pick("--gpu-nvml-interval")),
            pyproject=pyproject,
            devices=device_list(opt("--gpu-devices")),
            trace=output("--gpu-trace", folder=True),
            html=output("--gpu-html"),
            save=save,
            compare=compare if compare is not None else ("latest" if thresholds else None),
            compare_fail=thresholds,
            compare_given=compare is not None,
            compare_any_machine=opt("--gpu-compare-any-machine"),
            compare_undecided=pick("--gpu-compare-undecided"),
            compare_confirm=int(pick("--gpu-compare-confirm")),
            storage=storage,
            run_id=run_id,
            summary_rows=summary_rows(pick("--gpu-summary")),
            # --gpu-disable: no source is started, no device held (nothing is measured)
            nvtx=pick("--gpu-nvtx") == "on" and not disabled,
            sample=pick("--gpu-sample") == "on" and not disabled,
            exclusive=pick("--gpu-exclusive") == "auto" and not disabled,
            lock_timeout_s=float(pick("--gpu-lock-timeout")),
            children=pick("--gpu-children") == "on" and not disabled,
            disabled=disabled,
            selection="skip" if opt("--gpu-skip") else ("only" if opt("--gpu-only") else "all"),
            columns=_columns(opt("--gpu-columns")),
            sort=_sort(opt("--gpu-sort")),
            group_by=opt("--gpu-group-by"),
            csv=output("--gpu-csv"),
            memory_top=int(pick("--gpu-memory-top")),
            configured=given or bool(set(file_settings) - {"host_clock"}) or not file_budget.empty,
        )
        if settings.configured and not disabled:
            _check_step_summary()
        if os.environ.get(CONFIRMING):  # a fresh run confirming a regression: its report alone
            return dataclasses.replace(
                settings, save=None, compare=None, compare_fail=(), compare_given=False, trace=None, html=None, csv=None
            )
        return settings


# what each of --gpu-disable and --gpu-skip cannot go with: a baseline or a gate of figures
# nobody measured, or the other way of choosing tests
_CONFLICTS = {
    "--gpu-disable": (
        "--gpu-skip",
        "--gpu-only",
        "--gpu-save",
        "--gpu-autosave",
        "--gpu-compare",
        "--gpu-compare-fail",
    ),
    "--gpu-skip": ("--gpu-only", "--gpu-save", "--gpu-autosave", "--gpu-compare", "--gpu-compare-fail"),
    "--gpu-only": ("--gpu-save", "--gpu-autosave", "--gpu-compare", "--gpu-compare-fail"),
    "--gpu-save": ("--gpu-autosave",),
}


def _refuse_conflicts(opt: Callable[[str], Any]) -> None:
    for flag, others in _CONFLICTS.items():
        if not opt(flag):
            continue
        for other in others:
            if opt(other):
                raise ConfigError(f"{flag} and {other} cannot be given together: {_WHY[flag]}")


_WHY = {
    "--gpu-disable": "--gpu-disable measures nothing, so nothing can be saved, compared or chosen by it",
    "--gpu-skip": "--gpu-skip runs no test that measures anything",
    "--gpu-only": (
        "--gpu-only runs part of the suite: such a run is no baseline, and a gate on it passes the rest unseen"
    ),
    "--gpu-save": "--gpu-autosave names the baseline itself",
}


def _run_budget(opt: Callable[[str], Any], file_budget: Budget) -> Budget:
    """The run's budget: the flags' keys over the budget file's over ``[tool.gpuprof.budget]``."""
    budget_file = opt("--gpu-budget-file")
    budget = file_budget if budget_file is None else read_budget_file(Path(budget_file)).merged_over(file_budget)
    return _flag_budget(opt).merged_over(budget)


def _check_numbers(opt: Callable[[str], Any]) -> None:
    for o in TABLE:
        if o.number is not None and o.key is not None and opt(o.flag) is not None:
            check_number(o.key, opt(o.flag), o.flag)


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


def _autosave_name(root: Path) -> str:
    """``--gpu-autosave``'s baseline name: the commit (``-dirty`` where tracked files changed) and
    the time, ``3c874f0a1b_20261204T221439``; ``nogit`` outside a git checkout."""
    import subprocess
    import time

    commit = "nogit"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if head.returncode == 0 and head.stdout.strip():
            commit = head.stdout.strip()
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if dirty.stdout.strip():
                commit += "-dirty"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"{commit}_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"


def _columns(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    from pytest_gpuprof.output.columns import ColumnError, parse_columns

    try:
        return parse_columns(value)
    except ColumnError as e:
        raise ConfigError(f"--gpu-columns={value}: {e}") from None


def _sort(value: str | None) -> str | None:
    if value is None:
        return None
    from pytest_gpuprof.output.columns import ColumnError, check_sort

    try:
        return check_sort(value)
    except ColumnError as e:
        raise ConfigError(f"--gpu-sort={value}: {e}") from None


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


def _pick(opt: Callable[[str], Any], file_settings: Mapping[str, Any], flag: str) -> Any:
    """The command line's value, else the file's, else the table's default."""
    o = BY_FLAG[flag]
    value = opt(flag)
    if value is None and o.key is not None:
        value = file_settings.get(o.key)
    return o.default if value is None else value


def _output(opt: Callable[[str], Any], flag: str, *, folder: bool = False) -> Path | None:
    """An output path given on the command line, checked writable now."""
    value = opt(flag)
    if value is None:
        return None
    check_output(flag, Path(value), folder=folder)
    return Path(value)


def _thresholds(given: list[str] | None) -> tuple[Threshold, ...]:
    """``--gpu-compare-fail``'s expressions, every one given."""
    if not given:
        return ()
    from pytest_gpuprof.verdict.thresholds import CompareError, parse_thresholds

    try:
        return tuple(parse_thresholds(",".join(given)))
    except CompareError as e:
        raise ConfigError(f"--gpu-compare-fail: {e}") from None


def _storage(given: str | None, configured: object, rootpath: Path, pyproject: Path | None, saving: bool) -> str:
    """``--gpu-storage`` (a folder from the current one), else ``storage`` of ``[tool.gpuprof]``
    (a folder from the file's), else ``.gpuprof`` at pytest's rootdir: one store per project,
    whatever the current folder (``baselines.place``). A folder is checked writable where a
    run saves to it, a URL for its scheme and library."""
    from pytest_gpuprof.baselines.place import at_root

    if given is not None:
        value: object = given
    elif configured is not None:
        value = (
            at_root(configured, pyproject.parent if pyproject else rootpath)
            if isinstance(configured, str)
            else configured
        )
    else:
        value = at_root(DEFAULT["--gpu-storage"], rootpath)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"storage = {value!r}: a folder or a URL (s3://bucket/prefix, memory://...) is expected")
    from pytest_gpuprof.baselines.reach import StoreError, check_url, is_url

    if not is_url(value):
        problem = name_problem(value)
        if problem is not None:
            raise ConfigError(f"--gpu-storage={shown_path(value)}: {problem}")
        if saving:
            check_output("--gpu-storage", Path(value), folder=True)
        return value
    try:
        check_url(value)
        if saving:  # a bucket that is not there fails now, not after every test ran
            from pytest_gpuprof.baselines.store import Store

            Store(value).reach()
    except StoreError as e:
        raise ConfigError(f"--gpu-storage: {e}") from None
    return value


def _run_id(value: str | None) -> str | None:
    """``--gpu-run-id``, else the CI's run id; checked before any test runs."""
    from pytest_gpuprof.baselines.records import BaselineError, check_run_id, run_id_from_environment

    if value is None:
        return run_id_from_environment()
    try:
        return check_run_id(value)
    except BaselineError as e:
        raise ConfigError(str(e)) from None


def _baseline_name(name: str | None) -> str | None:
    """``--gpu-save``'s name, checked before any test runs."""
    if name is not None:
        from pytest_gpuprof.baselines.records import BaselineError, check_name

        try:
            check_name(name)
        except BaselineError as e:
            raise ConfigError(str(e)) from None
    return name


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
