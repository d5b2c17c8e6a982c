"""pytest hooks: wire options, markers and fixtures to the profiler, budgets and reports.

Heavy modules (numpy, CuPy, CUPTI, NVML) are imported when a session or test needs them,
so loading this plugin costs little on a machine that never measures anything.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_gpuprof.config import OPTIONS, ConfigError, Settings
from pytest_gpuprof.session import FIXTURES, PROFILER, GpuBudgetWarning, GpuSession, marker_budget

__all__ = ["GpuBudgetWarning"]

if TYPE_CHECKING:
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.profiler import Profiler
    from pytest_gpuprof.workload import GpuWorkload

SESSION = pytest.StashKey[GpuSession]()


def _allow_across_examples(item: pytest.Item) -> None:
    """``gpuprof`` and ``gpu_workload`` are meant to live across hypothesis examples (each
    example's ``measure`` is its own window), so hypothesis's function-scoped fixture
    health check does not apply to them. Hypothesis adjusts a test's settings in this
    same way for parametrized tests."""
    if "hypothesis" not in sys.modules:
        return
    from hypothesis import HealthCheck, is_hypothesis_test, settings

    function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
    if function is None or not is_hypothesis_test(function):
        return
    current = getattr(function, "_hypothesis_internal_use_settings", None) or settings()
    suppressed = {*current.suppress_health_check, HealthCheck.function_scoped_fixture}
    function._hypothesis_internal_use_settings = settings(current, suppress_health_check=suppressed)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuprof", "GPU utilization budgets (pytest-gpuprof)")
    for flag, kwargs in OPTIONS:
        group.addoption(flag, **kwargs)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    from pytest_gpuprof.verdict.budget import Budget, StepBudget

    keys = ", ".join(f"{k}=..." for k in Budget.KEYS)
    config.addinivalue_line(
        "markers",
        f"gpu_budget({keys}, steps={{NAME: {{{', '.join(StepBudget.KEYS)}}}}}): "
        "this test's GPU budget, over [tool.gpuprof.budget] and --gpu-budget-file",
    )
    config.addinivalue_line("markers", "gpu: the test needs a CUDA device; skipped with the reason otherwise")
    try:
        settings = Settings.from_pytest_config(config)
    except ConfigError as e:
        raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
    if "hypothesis" in sys.modules or config.getoption("hypothesis_profile", None) == "gpuprof":
        # hypothesis's own plugin has imported it already where it is installed: the
        # profile is there for settings.get_profile("gpuprof") in a test module, and
        # before hypothesis loads it by name for --hypothesis-profile=gpuprof
        from pytest_gpuprof.strategies import register_profile

        register_profile()
    session = GpuSession(config, settings)
    config.stash[SESSION] = session
    session.register()  # its hooks start nothing: a suite that never measures pays for none


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is not None:
        session.unregister()
        session.close()
        del config.stash[SESSION]


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION, None)
    return session.header() if session is not None else []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A marker's mistake is a usage error before any test runs; the budget itself is read
    when each test runs (``GpuSession.budget_of``), so that markers added later count."""
    session = config.stash[SESSION]
    for item in items:
        keywords = item.keywords  # holds every marker's name: a cheap test before the lookup
        if "gpu_budget" in keywords:
            marker_budget(item.nodeid, list(item.iter_markers("gpu_budget")), session.settings.budget)
        if not FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            _allow_across_examples(item)
        if "gpu" in keywords and item.get_closest_marker("gpu") is not None and session.backend_name != "cuda":
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA device: {session.backend_reason}"))


@pytest.fixture(scope="session")
def gpu_device(pytestconfig: pytest.Config) -> GpuDevice:
    """The device under test: name, memory, PCIe link, calibrated pinned bandwidths."""
    device = pytestconfig.stash[SESSION].device
    device.h2d_gbps  # noqa: B018 - calibrated now, in set-up: its copies are in no test's window
    return device


@pytest.fixture
def gpuprof(request: pytest.FixtureRequest) -> Iterator[Profiler]:
    """This test's profiler: ``step``, ``region``, ``measure``, ``metrics``, ``check``."""
    session = request.config.stash[SESSION]
    profiler = session.profiler(session.budget_of(request.node), request.node.nodeid)
    request.node.stash[PROFILER] = profiler
    try:
        yield profiler
    finally:
        session.release(request.node.nodeid, profiler)


@pytest.fixture
def gpu_workload(gpuprof: Profiler, gpu_device: GpuDevice, pytestconfig: pytest.Config) -> Iterator[GpuWorkload]:
    """Built-in prestage/compute workloads on this session's backend, recorded as steps."""
    from pytest_gpuprof.workload import GpuWorkload

    settings = pytestconfig.stash[SESSION].settings
    workload = GpuWorkload(gpuprof, gpu_device, rounds=settings.rounds, warmup=settings.warmup)
    gpuprof.backend.prepare()
    # the kernels' own buffers live for the session: not this test's memory
    gpuprof.exclude_held_memory()
    try:
        yield workload
    finally:
        workload.close()
