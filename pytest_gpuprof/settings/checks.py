"""The checks of what the settings read: a setting's value in its range, an output path
that can be written, ``[tool.gpuprof]`` and a budget file read and validated. Each failure
is a ``ConfigError`` naming the key and where it came from."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from pytest_gpuprof.verdict import validate as check
from pytest_gpuprof.verdict.budget import Budget, BudgetError, parse_budget
from pytest_gpuprof.verdict.validate import Number


class Keyed(Protocol):
    """A row of the settings table as the file's keys read it (``options.Option``)."""

    @property
    def key(self) -> str | None: ...
    @property
    def choices(self) -> tuple[str, ...] | None: ...
    @property
    def number(self) -> Number | None: ...


class FileKeys(NamedTuple):
    """The keys ``[tool.gpuprof]`` accepts, by kind: from a list, numeric, text."""

    choices: dict[str, tuple[str, ...]]
    numbers: dict[str, Number]
    text: tuple[str, ...]

    @classmethod
    def of(cls, options: Iterable[Keyed]) -> FileKeys:
        keyed = [o for o in options if o.key]
        return cls(
            {o.key: o.choices for o in keyed if o.key and o.choices},
            {o.key: o.number for o in keyed if o.key and o.number},
            tuple(o.key for o in keyed if o.key and not o.choices and not o.number),
        )


class ConfigError(check.Invalid):
    """A setting that cannot be used, with its key and source in the message."""


def check_number(key: str, value: Any, source: str, number: Number) -> None:
    """One of the numeric settings: a number of the right kind, in its range."""
    check.number(value, key, source, number, ConfigError)


# what a Linux file system holds: a name of 255 bytes, a path of 4,096 (with its NUL)
NAME_MAX, PATH_MAX = 255, 4096


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as a one-line message shows it: one past a screen's width cut in its middle."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]}"


def name_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the file system cannot hold ``path`` (a name too long), or ``None``: asked of
    the path's text, so that no call into the file system fails deep inside with it."""
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return f"a name in it is {len(os.fsencode(part)):,} bytes long; a file system takes at most {NAME_MAX}"
    if len(os.fsencode(os.path.abspath(path))) >= PATH_MAX:
        return f"the path is {len(os.fsencode(os.path.abspath(path))):,} bytes long; at most {PATH_MAX - 1}"
    return None


def check_output(option: str, path: Path, *, folder: bool = False) -> None:
    """An output path that can be written: checked at start-up, not after every test ran.
    A symbolic link is followed (its target is what gets written); a device node, FIFO or
    socket is refused, never replaced by a file; a name no file system holds is refused."""
    problem = name_problem(path)
    if problem is not None:
        raise ConfigError(f"{option}={shown_path(path)}: {problem}")
    target = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    if target.exists():
        if not folder and not target.is_dir() and not target.is_file():
            raise ConfigError(f"{option}={path}: {_file_kind(target)}, not a regular file; give a file path")
        if folder and not target.is_dir():
            raise ConfigError(f"{option}={path}: exists and is not a folder")
        if not folder and target.is_dir():
            raise ConfigError(f"{option}={path}: is a folder; give a file path")
        if not _can_create_in(target if folder else target.parent):
            raise ConfigError(f"{option}={path}: not writable")
        return
    parent = target.parent
    if not parent.is_dir():
        raise ConfigError(f"{option}={path}: the folder {parent} does not exist")
    if not _can_create_in(parent):
        raise ConfigError(f"{option}={path}: the folder {parent} is not writable")


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
    ):
        if test(mode):
            return f"is {name}"
    return "is a socket" if stat.S_ISSOCK(mode) else "is not a regular file"


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be created in ``folder``: tried, as the atomic writes will (a
    permission check alone passes for root on read-only file systems such as /proc)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".gpuprof-probe.", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def load_toml(path: Path) -> dict[str, Any]:
    # imported here: a run without a pyproject.toml or budget file never parses TOML
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the budget file: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): TOML is UTF-8") from None


def gpuprof_table(data: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The ``[tool.gpuprof]`` table of a TOML document, ``None`` where it has none; a
    ``tool`` or ``gpuprof`` that is not a table is named."""
    tool = data.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: 'tool' must be a table ([tool.gpuprof]), not {type(tool).__name__}")
    table = tool.get("gpuprof")
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: 'tool.gpuprof' must be a table ([tool.gpuprof]), not {type(table).__name__}")
    return table


def read_pyproject(path: Path | None, keys: FileKeys) -> tuple[dict[str, Any], Budget]:
    """``[tool.gpuprof]`` (without its budget) and its ``budget`` table, validated."""
    if path is None or not path.is_file():
        return {}, Budget()
    table = gpuprof_table(load_toml(path), path) or {}
    source = f"{path} [tool.gpuprof]"
    settings: dict[str, Any] = {}
    for key, value in check.table(table, "tool.gpuprof", source, ConfigError).items():
        if key == "budget":
            continue
        if key in keys.choices:
            check.choice(value, key, source, keys.choices[key], ConfigError)
        elif key in keys.numbers:
            check_number(key, value, source, keys.numbers[key])
        elif key in keys.text:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{source}: {key} = {value!r}: a non-empty string is expected")
        else:
            raise check.unknown(key, source, [*keys.choices, *keys.numbers, *keys.text, "budget"], "key", ConfigError)
        settings[key] = value
    try:
        budget = parse_budget(table.get("budget", {}), f"{path} [tool.gpuprof.budget]")
    except BudgetError as e:
        raise ConfigError(str(e)) from None
    return settings, budget


def read_budget_file(path: Path) -> Budget:
    """A ``--gpu-budget-file=FILE``: the schema of ``[tool.gpuprof.budget]``, at top level or under it."""
    problem = name_problem(path)
    if problem is not None:
        raise ConfigError(f"--gpu-budget-file={shown_path(path)}: {problem}")
    if not path.is_file():
        raise ConfigError(f"--gpu-budget-file={path}: no such file")
    data = load_toml(path)
    table = gpuprof_table(data, path)
    nested = (table or {}).get("budget") if "tool" in data else None
    if "tool" in data and not nested:
        raise ConfigError(f"{path}: a [tool] table without [tool.gpuprof.budget]: nothing here is a budget")
    others = sorted(set(table or {}) - {"budget"})
    if others:
        raise ConfigError(
            f"{path}: [tool.gpuprof] {', '.join(others)}: a budget file holds a budget only "
            "([tool.gpuprof.budget]); the run's settings belong in pyproject.toml's [tool.gpuprof] or on the command line"
        )
    try:
        return parse_budget(nested if nested is not None else data, str(path))
    except BudgetError as e:
        raise ConfigError(str(e)) from None


def summary_rows(value: str) -> int | None:
    """``--gpu-summary``: a number of rows, or all (None)."""
    if value == "all":
        return None
    try:
        rows = int(value)
    except ValueError:
        rows = -1
    if rows < 0:
        raise ConfigError(f"--gpu-summary={value}: expected a number of rows (0 or more) or 'all'")
    return rows


def device_list(value: str | None) -> tuple[int, ...] | str | None:
    """``--gpu-devices``: all, or the device indices listed."""
    if value is None or value == "all":
        return value
    try:
        devices = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise ConfigError(f"--gpu-devices={value}: expected 'all' or device indices such as 0,1") from None
    if not devices or min(devices) < 0:
        raise ConfigError(f"--gpu-devices={value}: expected 'all' or device indices such as 0,1")
    return devices
