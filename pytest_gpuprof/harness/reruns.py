"""Fresh runs of a test that the gate found regressed (``--gpu-compare-confirm``).

A history of saved runs cannot tell one unlucky run (a heavy tail, a runner's bad minute)
from slower code; a second, independent run can. Before a regression fails its test, the
test runs again, alone, in fresh pytest processes measured as this one was, each writing
its own report; the gate compares each with the same baseline, and a regression that one
of them does not repeat is undecided (``verdict.comparison.confirmed``). A fresh run saves,
compares and draws nothing (``CONFIRMING``), and reads no ``addopts``: its options are this
run's measuring settings, written out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gpuprof.settings.options import CONFIRMING

if TYPE_CHECKING:
    import pytest

    from pytest_gpuprof.harness.config import Settings
    from pytest_gpuprof.verdict.entry import Entry

# a fresh run that takes longer than this is ended, and confirms nothing
TIMEOUT_S = 1800.0


class RerunError(RuntimeError):
    """A fresh run that gave no figures: why, in one line."""


def command(config: pytest.Config, settings: Settings, nodeid: str, report: Path) -> list[str]:
    """The fresh run's command line: this test alone, measured with this run's settings."""
    args = [sys.executable, "-m", "pytest", nodeid, "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    if config.pluginmanager.get_plugin("gpuprof") is None:  # loaded with -p, not as installed
        args += ["-p", "pytest_gpuprof.plugin"]
    args += [
        f"--gpu-report={report}",
        f"--gpu-backend={settings.backend}",
        f"--gpu-device={settings.device}",
        f"--gpu-warmup={settings.warmup}",
        *([f"--gpu-rounds={settings.rounds_floor}"] if settings.rounds_floor is not None else []),
        *([f"--gpu-host-clock={settings.host_clock}"] if settings.host_clock else []),
        *(["--gpu-no-cupti"] if not settings.cupti else []),
        *(["--gpu-no-nvml"] if not settings.nvml else []),
    ]
    return args


def fresh_entries(config: pytest.Config, settings: Settings, nodeid: str, runs: int) -> list[Entry]:
    """The test's report entry from each of ``runs`` fresh runs; ``RerunError`` where one
    gave none (a crash, a collection error, a run past ``TIMEOUT_S``)."""
    from pytest_gpuprof.baselines.records import clean, load
    from pytest_gpuprof.baselines.reference import test_of

    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS")}
    env[CONFIRMING] = "1"
    entries = []
    with tempfile.TemporaryDirectory(prefix="gpuprof-confirm-") as scratch:
        for i in range(runs):
            report = Path(scratch) / f"run{i}.json"
            try:
                done = subprocess.run(
                    command(config, settings, nodeid, report),
                    cwd=config.rootpath,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                raise RerunError(f"fresh run {i + 1} ran past {TIMEOUT_S:g} s and was ended") from None
            entry = test_of(load(str(report)), nodeid) if report.is_file() else None
            if entry is None:
                tail = clean(" ".join((done.stdout + done.stderr).strip().splitlines()[-3:]))[:300]
                raise RerunError(f"fresh run {i + 1} exited {done.returncode} without measuring the test: {tail}")
            entries.append(entry)
    return entries
