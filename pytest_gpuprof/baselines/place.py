"""Where a project's baselines live: one store per project, whatever the current folder.

pytest and every ``gpuprof`` command find the same root: the nearest folder, from the
current one up, holding one of pytest's configuration files (``pytest.ini``,
``pyproject.toml``, ``tox.ini``, ``setup.cfg``), as pytest's rootdir is found for a run
given no paths. The default store is ``.gpuprof`` there; a ``storage`` key of
``[tool.gpuprof]`` that is a relative folder is taken from the root too. A folder given on
a command line is the user's: relative to the current folder, as every path there is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pytest_gpuprof.baselines.reach import is_url

# pytest's configuration files, in the order pytest looks for them
CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def project_root(start: Path) -> Path:
    """The nearest folder from ``start`` up that holds a configuration file; ``start`` where
    none does."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if any((folder / name).is_file() for name in CONFIG_FILES):
            return folder
    return start


def at_root(value: str, root: Path) -> str:
    """A store named by a project's file or by default: a relative folder taken from ``root``;
    a URL or an absolute folder as it is."""
    if is_url(value) or Path(value).is_absolute():
        return value
    return str(root / value)


def default_storage(start: Path, default: str) -> str:
    """The store a ``gpuprof`` command reads where ``--storage`` is not given: the root's
    ``[tool.gpuprof] storage``, else ``default`` (``.gpuprof``) at the root (``project_root``)."""
    root = project_root(start)
    configured = default
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib

        try:
            table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("gpuprof", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            table = {}  # a file pytest itself will refuse, naming it; the default store meanwhile
        value = table.get("storage") if isinstance(table, dict) else None
        if isinstance(value, str) and value:
            configured = value
    return at_root(configured, root)
