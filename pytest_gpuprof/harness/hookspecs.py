"""The hooks a project implements, in a conftest.py or a plugin, to add to what
pytest-gpuprof records (registered with ``pluginmanager.add_hookspecs``).

Each is called with keyword arguments and may change the dict it is given in place; what
it adds travels into the JSON report, the stored baseline and the HTML page's machine line.
Fields the report schema names keep their types (``pytest_gpuprof/schemas/``).
"""

from __future__ import annotations

from typing import Any

import pluggy
import pytest

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_gpuprof_machine_info(config: pytest.Config, machine: dict[str, Any]) -> None:
    """Add to or change the machine record (a CI runner's name, a container image). Its
    ``id`` is computed before the hook: it chooses which baselines a run compares with, so
    a hook that changes ``id`` changes that too. Called once per pytest process (an xdist
    worker's record travels with its tests)."""


@hookspec
def pytest_gpuprof_update_json(config: pytest.Config, report: dict[str, Any]) -> None:
    """Change the JSON report before it is written and stored as a baseline: add fields
    (commit info, a build URL, a team's labels). Called once, in the process that writes."""
