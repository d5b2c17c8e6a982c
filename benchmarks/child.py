"""A child pytest that loads the plugin, installed or not: the benchmarks measure in such
processes (CUPTI, NVML and the plugin's capture belong to a process)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plugin_args() -> list[str]:
    """``-p pytest_gpuprof.plugin`` where the plugin is not installed (a source tree);
    nothing where its entry point loads it (``-p`` would load it twice)."""
    from importlib.metadata import entry_points

    installed = any(e.name == "gpuprof" for e in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_gpuprof.plugin"]


def pytest_command(*args: str, plugin: bool = True) -> list[str]:
    """``python -m pytest -q`` without its cache, with the plugin unless ``plugin`` is false."""
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(plugin_args() if plugin else ()), *args]


def env(*folders: str | Path) -> dict[str, str]:
    """This environment with ``folders`` and the source tree importable (a child runs in a
    folder of its own)."""
    paths = [*map(str, folders), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
