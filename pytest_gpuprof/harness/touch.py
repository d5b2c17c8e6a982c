"""What makes a run or a test the plugin's, read cheaply.

The plugin loads into every pytest run of its environment. A suite that never uses it pays
for these checks alone: ``plugin`` starts the session, and registers its per-test hooks,
where one of them says yes (docs/design.md, "Start-up"). Nothing here imports more than
``settings.options``, whose flags pytest must know before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_gpuprof.harness import xdist
from pytest_gpuprof.settings.options import TABLE

if TYPE_CHECKING:
    from _pytest.nodes import Node

    from pytest_gpuprof.measure.profiler import Profiler

__all__ = ["DEVICE_FIXTURES", "FIXTURES", "MARKERS", "NOT_STARTED", "PROFILER", "asked", "find_pyproject", "touches"]

# the fixtures that measure a test; a test with a budget and neither is measured whole
FIXTURES = frozenset({"gpuprof", "gpu_workload"})
DEVICE_FIXTURES = FIXTURES | {"gpu_device"}
# the markers that make a test the plugin's
MARKERS = frozenset({"gpu", "gpu_budget"})

# the test's profiler, set by the gpuprof fixture (or for a test measured whole)
PROFILER: pytest.StashKey[Profiler] = pytest.StashKey()

# the header of a run that asked nothing of the plugin at start-up
NOT_STARTED = (
    "gpuprof: not started (no --gpu-* option, no [tool.gpuprof]): "
    "a test that uses gpuprof, gpu_workload, gpu_device or the gpu marker starts it"
)


def touches(item: pytest.Item) -> bool:
    """Whether the plugin has anything to do for this test, as it reads now: one of its
    fixtures, or a ``gpu`` or ``gpu_budget`` marker (however it arrived). Every per-test hook
    asks this first, and returns at once where the answer is no: a suite that never uses the
    plugin pays one look at each test's fixtures and markers."""
    if not DEVICE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
        return True
    node: Node | None = item
    while node is not None:  # ``iter_markers`` without its generators: this runs for every test
        for mark in node.own_markers:
            if mark.name in MARKERS:
                return True
        node = node.parent
    return False


def find_pyproject(config: pytest.Config) -> Path | None:
    """The run's ``pyproject.toml``: pytest's ini file where it is one, else the root's."""
    inipath = config.inipath
    if inipath is not None and inipath.name == "pyproject.toml":
        return inipath
    candidate = config.rootpath / "pyproject.toml"
    return candidate if candidate.is_file() else None


def asked(config: pytest.Config) -> bool:
    """Whether the run asks anything of the plugin before a test does: a ``--gpu-*``
    option, the plugin's hypothesis profile, or a ``pyproject.toml`` that names it
    (``config.Settings`` then reads and checks ``[tool.gpuprof]`` at start-up; a file that
    never says "gpuprof" has no such table, and one that cannot be read is for it to say).
    And an xdist controller: it collects no test, yet gathers what its workers measured."""
    if any(config.getoption(o.flag) not in (None, False) for o in TABLE):
        return True
    if xdist.controls(config):
        return True
    if config.getoption("hypothesis_profile", None) == "gpuprof":
        return True
    path = find_pyproject(config)
    try:
        return path is not None and b"gpuprof" in path.read_bytes()
    except OSError:
        return True
