"""pytest hooks, all of them: wire options, markers and fixtures to the session (``session``),
the profiler, budgets and reports.

Heavy modules (numpy, CuPy, CUPTI, NVML) are imported when a session or test needs them,
so loading this plugin costs little on a machine that never measures anything.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.harness import touch, xdist
from pytest_gpuprof.harness.touch import FIXTURES, PROFILER
from pytest_gpuprof.settings.options import TABLE

__all__ = ["GpuBudgetWarning"]

if TYPE_CHECKING:
    from pytest_gpuprof.baselines.rule import RunFacts
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.capture.placement import Placement
    from pytest_gpuprof.harness.config import Settings
    from pytest_gpuprof.harness.session import GpuSession
    from pytest_gpuprof.measure.errors import GpuBudgetWarning
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.windows import Window
    from pytest_gpuprof.measure.workload import GpuWorkload

SESSION = pytest.StashKey["GpuSession"]()


def __getattr__(name: str) -> Any:
    if name == "GpuBudgetWarning":  # loaded when asked for: this module loads into every pytest run
        from pytest_gpuprof.measure.errors import GpuBudgetWarning

        return GpuBudgetWarning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_gpuprof.harness import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuprof", "GPU utilization budgets (pytest-gpuprof)")
    for option in TABLE:
        group.addoption(option.flag, **option.argparse())


# the oldest pytest the package declares (pyproject.toml) and is tested on (.ci/run)
OLDEST_PYTEST = (8, 0)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    version = tuple(int(p) for p in pytest.__version__.split(".")[:2] if p.isdigit())
    if version < OLDEST_PYTEST:
        raise pytest.UsageError(
            f"pytest-gpuprof needs pytest {'.'.join(map(str, OLDEST_PYTEST))} or newer; this is pytest "
            f"{pytest.__version__}: pip install 'pytest>=8.0'"
        )
    keys = ", ".join(f"{k}=..." for k in descriptors.limits("window", "memory"))  # the budget's keys
    config.addinivalue_line(
        "markers",
        f"gpu_budget({keys}, steps={{NAME: {{{', '.join(descriptors.limits('step'))}}}}}): "
        "this test's GPU budget, over [tool.gpuprof.budget] and --gpu-budget-file",
    )
    config.addinivalue_line("markers", "gpu: the test needs a CUDA device; skipped with the reason otherwise")
    if touch.asked(config):
        _start(config)


def _start(config: pytest.Config) -> GpuSession:
    """The session, made once: at start-up where the run asks anything of the plugin (an
    option, ``[tool.gpuprof]``), else as the first test that is the plugin's is collected
    or calls on it (``touch``). Its hooks come with it: a suite that never uses the plugin
    pays for the few of this module alone."""
    session = config.stash.get(SESSION, None)
    if session is not None:
        return session
    from pytest_gpuprof.harness.config import ConfigError, Settings
    from pytest_gpuprof.harness.session import GpuSession

    try:
        settings = Settings.from_pytest_config(config)
    except ConfigError as e:
        raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
    except OSError as e:  # a path the checks let by that the system refused: named, never a traceback
        raise pytest.UsageError(f"pytest-gpuprof: {str(e.filename)[:120]}: {e.strerror or e}") from None
    if "hypothesis" in sys.modules or config.getoption("hypothesis_profile", None) == "gpuprof":
        # the package's "hypothesis" entry point registers the profile as hypothesis is
        # imported; this covers a plugin loaded by -p from a path that installed nothing
        from pytest_gpuprof.strategies import register_profile

        register_profile()
    settings, placed = _spread(config, settings)
    session = GpuSession(config, settings, placed)
    config.stash[SESSION] = session
    if config.pluginmanager.get_plugin(HOOKS_NAME) is None:
        config.pluginmanager.register(SessionHooks(session), HOOKS_NAME)
    return session


def _spread(config: pytest.Config, settings: Settings) -> tuple[Settings, Placement | None]:
    """An xdist worker's GPU, chosen before anything in it starts CUDA (``capture.placement``):
    only in a run that configures the plugin (a run that merely has it installed keeps every
    GPU in every worker), and not where the device is pinned (``--gpu-device``) or the
    backend is the host's."""
    worker = xdist.of(config).worker
    if worker is None or not settings.configured or settings.backend == "host" or settings.device != 0:
        return settings, None
    from pytest_gpuprof.capture import placement

    placed = placement.place(int(worker[2:]), placement.visible(os.environ, placement.nvml_count), settings.devices)
    if placed is None:
        return settings, None
    os.environ[placement.VISIBLE] = placed.entry
    return replace(settings, devices=None), placed


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is not None:
        hooks = config.pluginmanager.get_plugin(HOOKS_NAME)
        if hooks is not None:
            config.pluginmanager.unregister(hooks)
        session.close()
        del config.stash[SESSION]


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION, None)
    return session.header() if session is not None else [touch.NOT_STARTED]


def pytest_collection_finish(session: pytest.Session) -> None:
    """A marker's mistake is a usage error before any test runs; the budget itself is read
    when each test runs (``items.budget_of``), so that markers added later count. Read once
    collection is done: what any plugin's ``pytest_collection_modifyitems`` added counts."""
    config = session.config
    _warn_conftest_marks(config)
    gpu = config.stash.get(SESSION, None)
    if gpu is None:
        if not any(touch.touches(item) for item in session.items):
            return
        gpu = _start(config)
    from pytest_gpuprof.harness.config import marker_budget

    selection = gpu.settings.selection
    for item in session.items:
        keywords = item.keywords  # holds every marker's name: a cheap test before the lookup
        if selection != "all" and (touch.touches(item) == (selection == "skip")):
            why = "it uses pytest-gpuprof" if selection == "skip" else "it does not use pytest-gpuprof"
            item.add_marker(pytest.mark.skip(reason=f"--gpu-{selection}: {why}"))
        if "gpu_budget" in keywords:
            marker_budget(item.nodeid, list(item.iter_markers("gpu_budget")), gpu.settings.budget)
        if not FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            _allow_across_examples(item)
        if "gpu" in keywords and item.get_closest_marker("gpu") is not None and not gpu.runtime.kind.gpu:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA device: {gpu.runtime.backend_reason}"))


def _warn_conftest_marks(config: pytest.Config) -> None:
    """A ``pytestmark`` in a conftest.py marks nothing (pytest reads it in test modules
    only): a budget written there would be silently off."""
    for plugin in config.pluginmanager.get_plugins():
        if not str(getattr(plugin, "__file__", "")).endswith("conftest.py"):
            continue
        marks = getattr(plugin, "pytestmark", [])
        marks = marks if isinstance(marks, list) else [marks]
        if any(getattr(m, "name", None) in ("gpu_budget", "gpu") for m in marks):
            from pytest_gpuprof.measure.errors import GpuBudgetWarning

            warnings.warn(
                GpuBudgetWarning(
                    f"{plugin.__file__}: pytestmark in a conftest.py applies to no test; put the budget in "
                    "[tool.gpuprof.budget], in each module's pytestmark, or add it in a pytest_collection_modifyitems hook"
                ),
                stacklevel=1,
            )


@pytest.fixture(scope="session")
def gpu_device(pytestconfig: pytest.Config) -> GpuDevice:
    """The device under test: name, memory, PCIe link, calibrated pinned bandwidths."""
    device = _start(pytestconfig).device
    device.h2d_gbps  # noqa: B018 - calibrated now, in set-up: its copies are in no test's window
    return device


@pytest.fixture
def gpuprof(request: pytest.FixtureRequest) -> Iterator[Profiler]:
    """This test's profiler: ``step``, ``region``, ``measure``, ``metrics``, ``check``."""
    from pytest_gpuprof.harness import items

    session = _start(request.config)
    profiler = session.profiler(items.budget_of(session.settings, request.node), request.node.nodeid)
    request.node.stash[PROFILER] = profiler
    try:
        yield profiler
    finally:
        session.release(request.node.nodeid, profiler)


@pytest.fixture
def gpu_workload(gpuprof: Profiler, gpu_device: GpuDevice, pytestconfig: pytest.Config) -> Iterator[GpuWorkload]:
    """Built-in prestage/compute workloads on this session's backend, recorded as steps."""
    from pytest_gpuprof.measure.workload import GpuWorkload

    settings = _start(pytestconfig).settings
    workload = GpuWorkload(gpuprof, gpu_device, rounds=settings.rounds, warmup=settings.warmup)
    gpuprof.backend.prepare()
    # the kernels' own buffers live for the session: not this test's memory
    gpuprof.exclude_held_memory()
    try:
        yield workload
    finally:
        workload.close()


# the options that run part of what was collected: a run given one is no baseline, in a
# run of one process as under xdist (whose controller collects nothing, so it cannot count
# what its workers deselected)
_NARROWING = (("keyword", "-k"), ("markexpr", "-m"), ("deselect", "--deselect"), ("lf", "--lf"))


def _named_parts(config: pytest.Config) -> list[str]:
    """The command line's test ids and files: a run of ``tests/x.py::test_y`` or of
    ``tests/x.py`` is part of a suite, where a folder (or ``testpaths``) is a suite."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return []
    named = []
    for arg in config.args:
        path = arg.split("::", 1)[0]
        if "::" in arg:
            named.append(f"the test id {arg}")
        elif os.path.isfile(os.path.join(config.invocation_params.dir, path)):
            named.append(f"the file {arg}")
    return named


# whether the plugin has anything to do for a test (``touch.touches``), read at its start
# and again when its call starts
TOUCHED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Every test's call, the one per-test hook registered in every run (docs/design.md,
    "Start-up"). A test of the plugin's is measured (its whole call, where it has a budget
    and no fixture) and judged as its call ends. Its markers are read again: a fixture may
    have added one since the test began (``applymarker``; one inside the call comes too
    late to measure the call whole). A test that is nothing of the plugin's as its call
    starts runs untouched, unless it asks for a fixture by name inside the call
    (``getfixturevalue``): that measures it, and it is judged too."""
    stash = item.stash
    whole = _call_starts(item) if touch.touches(item) or PROFILER in stash else None
    try:
        if whole is None:
            result = yield
        else:
            with whole:
                result = yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        if PROFILER in stash:
            _start(item.config).give_verdict(item, raised=e)  # a failing call keeps its verdict (a failed check())
        raise
    if PROFILER in stash:
        stash[TOUCHED] = True  # measured from inside its call: its reports are the plugin's too
        _start(item.config).give_verdict(item)
    return result


def _call_starts(item: pytest.Item) -> AbstractContextManager[None] | None:
    """A test of the plugin's, as its call starts: the session started, the budget its
    markers give now; where it has a budget and no fixture, its whole call as a window, to
    be entered around the call."""
    from pytest_gpuprof.harness import items

    item.stash[TOUCHED] = True
    session = _start(item.config)
    budget = items.budget_of(session.settings, item)  # whatever added a marker since collection
    if not items.measures_whole(session.settings, item):
        profiler = item.stash.get(PROFILER, None)
        if profiler is not None:
            profiler.start_call(budget)
        return None
    profiler = item.stash[PROFILER] = session.profiler(budget, item.nodeid)
    return _whole_call(session, profiler)


@contextlib.contextmanager
def _whole_call(session: GpuSession, profiler: Profiler) -> Iterator[None]:
    done: list[Window] = []
    try:
        with profiler.collector.window("test") as done:
            yield
    finally:
        try:
            session.backend.source.drain()  # the call's device work is in its window, or lost with it
            if done:
                profiler.keep(done[0])
        finally:
            profiler.end()


# the session's hooks, registered with it (``pytest_configure``)
HOOKS_NAME = "gpuprof-session"


class SessionHooks:
    """The session's pytest hooks, each asking the session for one thing.

    A separate object with plain attributes only: pytest 8.0-8.2 read every attribute of
    a registered plugin while looking for fixtures, which would run the session's lazy
    properties (start a backend) for nothing.
    """

    def __init__(self, session: GpuSession) -> None:
        self._session = session
        self._collection_errors = 0
        self._deselected = 0
        self._failures_recorded = True  # --lf: whether a failure was recorded when the run started

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._collection_errors += 1

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        cache = getattr(session.config, "cache", None)
        self._failures_recorded = cache is None or bool(cache.get("cache/lastfailed", {}))
        self._session.load_baseline()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        item.stash[TOUCHED] = touched = touch.touches(item)
        if not touched:
            return (yield)
        self._session.hold_device(item)
        try:
            return (yield)
        finally:
            self._session.let_go()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._session.refused(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if item.stash.get(TOUCHED, True) or self._session.measured(item.nodeid):
            self._session.annotate(item, call, report)
        _skip_at_the_test(item, report)
        return report

    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        """A test the plugin failed is a failure of its own kind: ``G`` in the progress line,
        GPU BUDGET (a breach) or GPU REGRESSION (a gate) under ``-v`` and in the ``-r f``
        list; counted with the failures. The word is a plain string, red as every failure
        is: pytest before 8.3 prints a (word, markup) pair in its short summary as a tuple."""
        word = getattr(report, "gpuprof_failed", None)
        if report.when == "call" and report.failed and isinstance(word, str):
            return "failed", "G", word
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._session.logreport(report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self._session.summary(terminalreporter)

    def _run_facts(self, session: pytest.Session, exitstatus: int, cut_short: str | None) -> RunFacts:
        """What the baseline rule reads of this run (``baselines.rule``)."""
        from pytest_gpuprof.baselines.rule import RunFacts

        option = session.config.option
        narrowed = [flag for name, flag in _NARROWING if getattr(option, name, None) and not self._ran_all(name)]
        narrowed += _named_parts(session.config)
        return RunFacts(
            cut_short=cut_short,
            collect_only=bool(getattr(option, "collectonly", False)),
            deselected=self._deselected,
            narrowed=tuple(narrowed),
            failed=exitstatus == pytest.ExitCode.TESTS_FAILED,
            run_id=self._session.settings.run_id,
        )

    def _ran_all(self, option: str) -> bool:
        """Whether ``--lf`` left every collected test in: with no failure recorded when the
        run started, pytest runs them all (an xdist controller reads the cache its workers
        read; a failure recorded skips files, which no deselected count shows)."""
        return option == "lf" and not self._deselected and not self._failures_recorded

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        partial = None
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            partial = "was interrupted"
        elif exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
            partial = f"ended with pytest's exit code {int(exitstatus)}"
        elif self._collection_errors:
            partial = f"had {self._collection_errors} error(s) during collection"
        elif session.shouldstop or session.shouldfail:
            partial = f"stopped early ({session.shouldstop or session.shouldfail})"
        facts = self._run_facts(session, exitstatus, partial)
        if not self._session.write_outputs(facts) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _skip_at_the_test(item: pytest.Item, report: pytest.TestReport) -> None:
    """A skip the plugin raised (``--gpu-disable``: a figure read that was never measured)
    names the test's own line, as a skip mark's does, never a line of the plugin."""
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, _, reason = longrepr
        if Path(str(path)).resolve().is_relative_to(Path(__file__).parent):
            where, line, _ = item.reportinfo()
            report.longrepr = (str(where), (line or 0) + 1, reason)
