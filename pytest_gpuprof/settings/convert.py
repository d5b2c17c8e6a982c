"""How a setting's value becomes its ``Settings`` field: each row of ``options.TABLE`` names
one of these. A converter takes the value the run gives (the command line's, else
``[tool.gpuprof]``'s, else the table's default) and what else the run was given (``Given``),
checks it, and returns the field's value; a mistake is a ``ConfigError`` naming the option.
Every check is imported when a converter runs: loading the plugin reads the table alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.thresholds import Threshold

# the value a flag is given, the file's value and the run's facts: a converter reads them
Convert = Callable[[Any, "Given"], Any]
__all__ = ["Convert", "Given"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Given:
    """What a run was given: the command line (``opt``), ``[tool.gpuprof]`` (``file``) and
    where pytest runs."""

    opt: Callable[[str], Any]
    file: Mapping[str, Any]
    rootpath: Path
    pyproject: Path | None

    @property
    def disabled(self) -> bool:
        """``--gpu-disable``: no source is started, no device held (nothing is measured)."""
        return bool(self.opt("--gpu-disable"))

    @property
    def saving(self) -> bool:
        return bool(self.opt("--gpu-save") or self.opt("--gpu-autosave"))


def on(value: str, given: Given) -> bool:
    """An ``on|off`` setting, off under ``--gpu-disable``."""
    return value == "on" and not given.disabled


def auto(value: str, given: Given) -> bool:
    """An ``auto|off`` setting, off under ``--gpu-disable``."""
    return value == "auto" and not given.disabled


def not_given(value: bool | None, given: Given) -> bool:
    """A ``--gpu-no-*`` switch as what it leaves on, off under ``--gpu-disable`` too."""
    return not value and not given.disabled


def whole(value: Any, _: Given) -> int:
    return int(value)


def real(value: Any, _: Given) -> float:
    return float(value)


def switch(value: bool | None, _: Given) -> bool:
    return bool(value)


def file_path(flag: str, *, folder: bool = False) -> Convert:
    """An output path, checked writable now, not after every test ran."""

    def convert(value: str | None, _: Given) -> Path | None:
        from pytest_gpuprof.settings.checks import check_output

        if value is None:
            return None
        check_output(flag, Path(value), folder=folder)
        return Path(value)

    return convert


def devices(value: str | None, _: Given) -> tuple[int, ...] | str | None:
    from pytest_gpuprof.settings.checks import device_list

    return device_list(value)


def rows(value: str, _: Given) -> int | None:
    from pytest_gpuprof.settings.checks import summary_rows

    return summary_rows(value)


def compare(value: str | None, given: Given) -> str | None:
    """``--gpu-compare``; ``latest`` where only ``--gpu-compare-fail`` is given."""
    if value is not None:
        return value
    return "latest" if given.opt("--gpu-compare-fail") else None


def thresholds(value: list[str] | None, _: Given) -> tuple[Threshold, ...]:
    """``--gpu-compare-fail``'s expressions, every one given."""
    from pytest_gpuprof.settings.checks import ConfigError

    if not value:
        return ()
    from pytest_gpuprof.verdict.thresholds import CompareError, parse_thresholds

    try:
        return tuple(parse_thresholds(",".join(value)))
    except CompareError as e:
        raise ConfigError(f"--gpu-compare-fail: {e}") from None


def columns(value: str | None, _: Given) -> tuple[str, ...] | None:
    from pytest_gpuprof.output.columns import parse_columns

    return None if value is None else _shaped("--gpu-columns", value, parse_columns)


def sort(value: str | None, _: Given) -> str | None:
    from pytest_gpuprof.output.columns import check_sort

    return None if value is None else _shaped("--gpu-sort", value, check_sort)


def _shaped(flag: str, value: str, check: Callable[[str], T]) -> T:
    """A setting of the terminal table's shape, checked by ``output.columns``."""
    from pytest_gpuprof.output.columns import ColumnError
    from pytest_gpuprof.settings.checks import ConfigError

    try:
        return check(value)
    except ColumnError as e:
        raise ConfigError(f"{flag}={value}: {e}") from None


def baseline_name(value: str | None, given: Given) -> str | None:
    """``--gpu-save``'s name, checked before any test runs; ``--gpu-autosave``'s, the commit
    (``-dirty`` where tracked files changed) and the time: ``3c874f0a1b_20261204T221439``,
    ``nogit`` outside a git checkout."""
    from pytest_gpuprof.settings.checks import ConfigError

    if given.opt("--gpu-autosave"):
        from pytest_gpuprof.output.git import described

        return f"{described(given.rootpath)}_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    if value is not None:
        from pytest_gpuprof.baselines.records import BaselineError, check_name

        try:
            check_name(value)
        except BaselineError as e:
            raise ConfigError(str(e)) from None
    return value


def run_id(value: str | None, _: Given) -> str | None:
    """``--gpu-run-id``, else the CI's run id; checked before any test runs."""
    from pytest_gpuprof.baselines.records import BaselineError, check_run_id, run_id_from_environment
    from pytest_gpuprof.settings.checks import ConfigError

    if value is None:
        return run_id_from_environment()
    try:
        return check_run_id(value)
    except BaselineError as e:
        raise ConfigError(str(e)) from None


def storage(picked: str, given: Given) -> str:
    """``--gpu-storage`` (a folder from the current one), else ``storage`` of ``[tool.gpuprof]``
    (a folder from the file's), else the default at pytest's rootdir: one store per project,
    whatever the current folder (``baselines.place``). A folder is checked writable where a
    run saves to it, a URL for its scheme and library."""
    from pytest_gpuprof.baselines.place import at_root
    from pytest_gpuprof.settings.checks import ConfigError, check_output, name_problem, shown_path

    value: object = given.opt("--gpu-storage")
    if value is None and given.file.get("storage") is not None:
        configured = given.file["storage"]
        folder = given.pyproject.parent if given.pyproject else given.rootpath
        value = at_root(configured, folder) if isinstance(configured, str) else configured
    elif value is None:
        value = at_root(picked, given.rootpath)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"storage = {value!r}: a folder or a URL (s3://bucket/prefix, memory://...) is expected")
    from pytest_gpuprof.baselines.reach import StoreError, check_url, is_url

    if not is_url(value):
        problem = name_problem(value)
        if problem is not None:
            raise ConfigError(f"--gpu-storage={shown_path(value)}: {problem}")
        if given.saving:
            check_output("--gpu-storage", Path(value), folder=True)
        return value
    try:
        check_url(value)
        if given.saving:  # a bucket that is not there fails now, not after every test ran
            from pytest_gpuprof.baselines.store import Store

            Store(value).reach()
    except StoreError as e:
        raise ConfigError(f"--gpu-storage: {e}") from None
    return value
