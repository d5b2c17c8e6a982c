"""pytest hooks: wire options, markers and fixtures to the profiler, budgets and reports.

Heavy modules (numpy, CuPy, CUPTI, NVML) are imported when a session or test needs them,
so loading this plugin costs little on a machine that never measures anything.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.config import BACKENDS, HOST_CLOCKS, ConfigError, Settings
from pytest_gpuprof.session import BUDGET, PROFILER, WHOLE_CALL, GpuBudgetWarning, GpuSession
from pytest_gpuprof.verdict.budget import Budget, BudgetError, parse_budget

__all__ = ["GpuBudgetWarning"]

if TYPE_CHECKING:
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.profiler import Profiler
    from pytest_gpuprof.workload import GpuWorkload

SESSION = pytest.StashKey[GpuSession]()


FIXTURES = frozenset({"gpuprof", "gpu_workload"})


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


# each option's default, by flag: a run that sets none of them (and has no [tool.gpuprof]
# table) starts nothing until a test asks (read through config.getoption)
DEFAULTS: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuprof", "GPU utilization budgets (pytest-gpuprof)")

    def add(flag: str, **kwargs: Any) -> None:
        group.addoption(flag, **kwargs)
        DEFAULTS[flag] = kwargs.get("default", False if kwargs.get("action") == "store_true" else None)

    add("--gpu-budget", action="store_true", help="enforce GPU budgets: a breach fails the test")
    add(
        "--gpu-budget-file",
        default=None,
        metavar="FILE",
        help="a TOML budget, schema of [tool.gpuprof.budget]; over pyproject.toml, under markers",
    )
    add("--gpu-backend", choices=BACKENDS, default=None, help="auto (default), cuda or host")
    add(
        "--gpu-host-clock",
        choices=HOST_CLOCKS,
        default=None,
        help="host backend: real time (default), or virtual time in which kernels and copies take exactly "
        "what they ask and host code takes none (deterministic tests)",
    )
    add("--gpu-device", type=int, default=None, metavar="N", help="CUDA device index")
    add(
        "--gpu-devices",
        default=None,
        metavar="all|N,M,...",
        help="under pytest-xdist, pin worker i to device i mod the count; without it, pick the first",
    )
    add("--gpu-rounds", type=int, default=None, metavar="N", help="measured rounds of gpuprof.measure")
    add("--gpu-warmup", type=int, default=None, metavar="N", help="unmeasured warm-up rounds")
    add("--gpu-report", default=None, metavar="PATH", help="write the JSON report (schema 1) here")
    add("--gpu-trace", default=None, metavar="DIR", help="one Chrome-trace/Perfetto JSON per test")
    add("--gpu-html", default=None, metavar="PATH", help="one self-contained HTML report with timelines")
    add("--gpu-save", default=None, metavar="NAME", help="store this run as a baseline NNNN_NAME")
    add(
        "--gpu-compare",
        default=None,
        metavar="latest|NAME|PATH",
        help="compare with this machine's newest baseline (latest), its newest one named NAME, or the file PATH",
    )
    add(
        "--gpu-compare-fail",
        action="append",
        default=None,
        metavar="EXPR[,EXPR...]",
        help="fail a test whose metric regressed beyond this, clearly over the rounds: utilization:-2pt,wall_ms:+10%%",
    )
    add("--gpu-compare-any-machine", action="store_true", help="compare with a baseline of another machine id")
    add("--gpu-storage", default=".gpuprof", metavar="DIR", help="baseline folder (default .gpuprof)")
    add("--gpu-no-cupti", action="store_true", help="do not use CUPTI; truth falls back to CUDA events")
    add("--gpu-no-nvml", action="store_true", help="do not sample NVML")
    add("--gpu-nvml-interval", type=float, default=None, metavar="MS", help="NVML poll interval (default 20 ms)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gpu_budget(min_utilization=..., max_overhead_ms=..., max_discrepancy=..., steps={...}): "
        "this test's GPU budget, over [tool.gpuprof.budget] and --gpu-budget-file",
    )
    config.addinivalue_line("markers", "gpu: the test needs a CUDA device; skipped with the reason otherwise")
    try:
        settings = Settings.from_pytest_config(config, DEFAULTS)
    except ConfigError as e:
        raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
    if config.getoption("hypothesis_profile", None) == "gpuprof":
        # before hypothesis's own plugin loads the profile by name
        from pytest_gpuprof.strategies import register_profile

        register_profile()
    session = GpuSession(config, settings)
    config.stash[SESSION] = session
    if settings.configured or getattr(config.option, "dist", "no") != "no":
        session.register()  # else when a test starts it: a suite that never does runs none of its hooks


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
    session = config.stash[SESSION]
    for item in items:
        keywords = item.keywords  # holds every marker's name: a cheap test before the lookup
        markers = list(item.iter_markers("gpu_budget")) if "gpu_budget" in keywords else []
        marker = markers[0] if markers else None
        if markers:
            item.stash[BUDGET] = _marker_budget(item, markers, session.settings.budget)
        if not FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            _allow_across_examples(item)
        elif marker is not None or (
            session.settings.enforce
            and not session.settings.budget.empty
            and "gpu" in keywords
            and item.get_closest_marker("gpu") is not None
        ):
            # a budget on a test that uses no fixture: its whole call is the window
            item.stash[WHOLE_CALL] = True
            session.register()
        if "gpu" in keywords and item.get_closest_marker("gpu") is not None and session.backend_name != "cuda":
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA device: {session.backend_reason}"))


def _marker_budget(item: pytest.Item, markers: list[pytest.Mark], base: Budget) -> Budget:
    """The test's ``gpu_budget`` markers merged key by key over the run's budget, the
    closest winning: the function's (the one written nearest it first, when stacked),
    then its class's, then its module's (``pytestmark``)."""
    budget = base
    for marker in reversed(markers):  # iter_markers yields the closest first
        if marker.args:
            raise pytest.UsageError(
                f"pytest-gpuprof: {item.nodeid}: gpu_budget takes keyword arguments only, got {marker.args!r}"
            )
        try:
            budget = parse_budget(marker.kwargs, f"{item.nodeid}: @pytest.mark.gpu_budget", own=True).merged_over(
                budget
            )
        except BudgetError as e:
            raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
    return budget


@pytest.fixture(scope="session")
def gpu_device(pytestconfig: pytest.Config) -> GpuDevice:
    """The device under test: name, memory, PCIe link, calibrated pinned bandwidths."""
    return pytestconfig.stash[SESSION].device


@pytest.fixture
def gpuprof(request: pytest.FixtureRequest) -> Iterator[Profiler]:
    """This test's profiler: ``step``, ``region``, ``measure``, ``metrics``, ``check``."""
    session = request.config.stash[SESSION]
    profiler = session.profiler(request.node.stash.get(BUDGET, session.settings.budget), request.node.nodeid)
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
