import gc
import importlib
import pkgutil
import sys

import pytest

import pytest_gpuprof


@pytest.fixture(autouse=True)
def virtual_clock(request, monkeypatch):
    """Every pytest session a test starts runs the host backend on the virtual clock, so
    that its figures do not depend on how busy this machine is; and it keeps the plugin's
    budget warnings as warnings, whatever this run's warning filters (-W error)."""
    # a CI's run id makes a narrowed run a shard of that run (``--gpu-run-id``): the suite
    # runs as it would outside CI, and the store's tests give run ids themselves
    for var in ("GITHUB_RUN_ID", "CI_PIPELINE_ID", "BUILDKITE_BUILD_ID", "CIRCLE_WORKFLOW_ID", "BUILD_BUILDID"):
        monkeypatch.delenv(var, raising=False)
    # every report and baseline the suite's runs write is checked against the shipped schemas
    monkeypatch.setenv("PYTEST_GPUPROF_CHECK_SCHEMA", "1")
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # which clears PYTEST_ADDOPTS when it starts
        monkeypatch.setenv("PYTEST_ADDOPTS", "--gpu-host-clock=virtual -W default::pytest_gpuprof.GpuBudgetWarning")
        # no bytecode cached for the files a test writes (the suite's own is, conftest.py):
        # a file written again within the second at the same size would pass the
        # timestamp check of Python's cache and of pytest 8's rewritten modules, and the
        # old code would run
        monkeypatch.setattr(sys, "dont_write_bytecode", True)


# ``--hypothesis-profile=thorough``: every property test with far more examples, to run
# once in a while (docs/design.md, "Layers"); the suite's own runs keep hypothesis's default
try:
    from hypothesis import settings as _settings
except ImportError:  # pragma: no cover - the test extra installs it
    pass
else:
    _settings.register_profile("thorough", max_examples=20_000, deadline=None)


# pytester's in-process runs drop the modules first imported inside them, so that the next
# run imports them again (and numpy cannot be imported twice in one process): import up
# front everything the plugin loads lazily, the package's every module and what its report
# and store read. A run of one test file that starts pytest many times is twice as fast.
def _import_up_front() -> None:
    lazy = [
        m.name
        for m in pkgutil.walk_packages(pytest_gpuprof.__path__, "pytest_gpuprof.")
        if m.name != "pytest_gpuprof.__main__"
    ]
    for name in [
        "numpy",
        *lazy,
        "jsonschema",
        "fsspec",
        "fsspec.implementations.local",
        "fsspec.implementations.memory",
    ]:
        try:
            importlib.import_module(name)
        except ImportError:  # an extra this environment lacks (the test extra has them all)
            pass


def pytest_configure(config):
    # where tests run: not in an xdist controller, whose workers start sooner without it
    if config.getoption("dist", "no") == "no" or hasattr(config, "workerinput"):
        _import_up_front()


def pytest_collection_finish(session):
    """What collection imported (hypothesis, numpy, moto, the package) lives as long as the
    process: kept out of the garbage collector's full passes, which walked it about 65
    times a suite at 0.1 s each (6.4 s of the two workers' CPU). And a full pass every
    hundredth middle one instead of every tenth: the in-process runs leave long-lived
    objects behind quickly enough to start one every few seconds (4.2 s with the freeze
    alone, 2.4 s with both)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(700, 10, 100)
