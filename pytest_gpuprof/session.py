"""The plugin's state for one pytest process, and its per-test hooks.

The session wires the rooms together (docs/design.md, "Module map"): ``runtime`` (the
backend, device, sampler and header), ``gate`` (baseline and comparison), ``outputs``
(summary, files), ``budget.judge`` (the verdict); here only what happens around each
test: its profiler, its record, its warning or failure, its leak check, its view.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Generator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.analysis.model import GIB
from pytest_gpuprof.config import Settings
from pytest_gpuprof.gate import Gate
from pytest_gpuprof.output.text import failure_message
from pytest_gpuprof.output.views import TestResult, TestView
from pytest_gpuprof.outputs import Outputs
from pytest_gpuprof.runtime import DeviceRuntime
from pytest_gpuprof.verdict.budget import Budget

if TYPE_CHECKING:
    from pytest_gpuprof.capture import backends
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.profiler import Profiler
    from pytest_gpuprof.windows import Window


# the test's profiler, set by the gpuprof fixture (or for a test measured whole)
PROFILER = pytest.StashKey["Profiler"]()
# set at collection on a test with a budget and no fixture: its call is measured whole
WHOLE_CALL = pytest.StashKey[bool]()
# a test's budget from its marker, over the run's
BUDGET = pytest.StashKey[Budget]()
HOOKS_NAME = "gpuprof-session"


class GpuBudgetWarning(UserWarning):
    """A budget breach in a run without ``--gpu-budget``: reported, not enforced."""


class GpuMemoryLeak(AssertionError):
    """Device memory a test (or one of its hypothesis examples) took and did not give back."""


class GpuSession:
    """Nothing GPU-side starts until something asks for it: where the run configures
    pytest-gpuprof (a ``--gpu-*`` option or a ``[tool.gpuprof]`` table), the backend is
    chosen at start-up and named in the header; otherwise, when a test first uses a
    fixture or the ``gpu`` marker, so that a suite that never does pays no CuPy import,
    CUDA context or CUPTI tracing for the plugin being installed.
    """

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings  # resolved once, at start-up
        self.runtime = DeviceRuntime(config, settings)
        self.gate = Gate(settings)
        self.outputs = Outputs(config, settings)
        self.results: dict[str, TestResult] = {}  # measured here
        self.outcomes: dict[str, tuple[str, bool]] = {}  # every test run here: outcome, xfail
        self.views: dict[str, TestView] = {}  # every measured test, from here or the workers
        self.crashed: dict[str, str] = {}  # tests whose xdist worker died

    def register(self) -> None:
        """Hook this session into pytest (once)."""
        if self.config.pluginmanager.get_plugin(HOOKS_NAME) is None:
            self.config.pluginmanager.register(SessionHooks(self), HOOKS_NAME)

    def unregister(self) -> None:
        hooks = self.config.pluginmanager.get_plugin(HOOKS_NAME)
        if hooks is not None:
            self.config.pluginmanager.unregister(hooks)

    # the device side, as the fixtures and the header ask for it
    @property
    def backend(self) -> backends.Backend:
        return self.runtime.backend

    @property
    def backend_name(self) -> str:
        return self.runtime.backend_name

    @property
    def backend_reason(self) -> str:
        return self.runtime.backend_reason

    @property
    def device(self) -> GpuDevice:
        return self.runtime.device

    def header(self) -> list[str]:
        return self.runtime.header()

    # per test
    def profiler(self, budget: Budget, owner: str = "this test") -> Profiler:
        from pytest_gpuprof.profiler import Profiler

        s = self.settings
        return Profiler(
            self.backend,
            budget=budget,
            rounds=s.rounds,
            warmup=s.warmup,
            sampler=self.runtime.sampler,
            enforce=s.enforce,
            pinned_gbps=lambda: self.device.h2d_gbps,
            gpm=self.runtime.gpm,
            owner=owner,
            stacks=self.runtime.stacks,
        )

    def record(self, nodeid: str, profiler: Profiler) -> TestResult | None:
        """The test's one verdict, kept where every output reads it: its windows judged on
        its budget, and every ``check()`` it made, passing or failing."""
        from pytest_gpuprof.output.report import GpuRecord

        windows = profiler.final_windows()
        if not windows:
            return None
        primary = _primary(windows)
        window = windows[primary]
        verdict, metrics, failed_by = window.verdict, window.metrics, None
        budget = profiler.budget
        for checked, judged in profiler.verdicts:
            budget = checked.budget.merged_over(budget)
            if checked.breached:
                verdict, metrics, failed_by = checked, judged, "check"
        problems = profiler.problems()
        if problems:
            metrics = replace(metrics, notes=(*metrics.notes, *problems))
        if self.settings.trace is not None and window.timeline is not None:
            from pytest_gpuprof.output.trace import write_trace

            write_trace(self.settings.trace, nodeid, window.timeline)
        record = GpuRecord(
            nodeid=nodeid,
            metrics=metrics,
            budget=budget,
            breaches=list(verdict.breaches),
            enforced=self.settings.enforce,
            windows=len(windows),
            device=self.runtime.device_index,
            failed_by=failed_by,
            unjudged=list(verdict.unjudged),
        )
        result = self.results[nodeid] = TestResult(record, window.timeline, primary=primary)
        return result

    def judge(self, item: pytest.Item, *, raised: bool = False) -> None:
        """After a test's call: record its verdict, then warn about or fail a breach and
        gate a regression (``raised``: the call failed already; it is recorded only)."""
        profiler = item.stash.get(PROFILER, None)
        if profiler is None:
            return
        refused = self.backend.clock.refused
        if refused:  # a thread the virtual clock cannot follow: the test is refused, not measured
            refusal = "\n".join(refused)
            refused.clear()
            if not raised:
                pytest.fail(refusal, pytrace=False)
            return
        result = self.record(item.nodeid, profiler)
        if result is None:
            return
        record = result.record
        result.changes, regression = self.gate.compare(item.nodeid, record.to_dict())
        if regression is not None:
            record.regressions = [c.threshold.metric for c in self.gate.regressed(result.changes)]
        if raised:
            return
        message = None
        window = profiler.windows[result.primary]
        if record.failed_by is None and window.verdict.breached and not window.settled:
            where = (window.label, result.primary, len(profiler.windows)) if len(profiler.windows) > 1 else None
            message = failure_message(record.breaches, record.metrics, window=where)
        failures = [m for m in (message if self.settings.enforce else None, regression) if m]
        for line in record.unjudged:  # neither kept nor breached: said so, never a failure
            _warn(item, f"GPU budget not judged: {line}")
        for line in profiler.problems():  # steps made and never entered, or never left
            _warn(item, f"gpuprof: {line}")
        if message is not None and not self.settings.enforce and not _warn(item, message):
            failures.append(message)  # warnings are errors here (-W error): fail with the message
        if failures:
            record.failed_by = "budget" if message in failures else "regression"
            pytest.fail("\n".join(failures), pytrace=False)

    def release(self, nodeid: str, profiler: Profiler) -> None:
        """End of a test: wait for its device work, record it if the call did not, and
        check that its device memory came back. Only a test that passed is held to that: a
        failed test's traceback may still hold buffers, and an interrupted one (Ctrl-C)
        never finished."""
        outcome = self.outcomes.get(nodeid, ("interrupted", False))[0]
        try:
            self.backend.synchronize()
        finally:
            try:
                if nodeid not in self.results and outcome != "interrupted":
                    self.record(nodeid, profiler)
                self.backend.drain()
            finally:
                profiler.end()
        gc.collect()
        held = self.backend.memory_in_use() - profiler.memory_before
        passed = outcome == "passed"
        leaks = list(profiler.leaks) if passed else []
        if held > 0 and passed:
            leaks.append(f"{held:,} bytes ({held / GIB:.3g} GiB) of device memory still held after the test")
        if leaks:
            self.backend.trim()
            raise GpuMemoryLeak("GPU memory leak: " + "; ".join(leaks))

    def logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = (report.outcome, hasattr(report, "wasxfail"))
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes.setdefault(report.nodeid, ("failed", False))
        view = getattr(report, "gpuprof", None)
        if isinstance(view, dict):
            self.views[report.nodeid] = TestView.from_dict(view)
        if report.failed and (report.when == "???" or "crashed while running" in str(report.longrepr)):
            # pytest-xdist's report for the test a worker was running when it died
            self.crashed[report.nodeid] = str(report.longrepr).strip().splitlines()[-1][:300]

    def annotate(self, item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
        if call.when == "teardown" and item.nodeid in self.results:
            if report.failed:  # an error in tear-down (a leak, a fixture) fails the test
                self.outcomes[item.nodeid] = ("failed", self.outcomes.get(item.nodeid, ("passed", False))[1])
            view = self.view(item.nodeid)
            # JUnit XML reads the tear-down report's properties: every measured test has them
            report.user_properties.extend(self.results[item.nodeid].record.properties())
            # Everything the controller needs travels with the report (pytest-xdist sends
            # its __dict__), so a worker's tests are reported like local ones.
            report.gpuprof = view.to_dict()  # type: ignore[attr-defined]

    def view(self, nodeid: str) -> TestView:
        from pytest_gpuprof.output.report import breach_details, row

        result = self.results[nodeid]
        record = result.record
        record.outcome, record.xfail = self.outcomes.get(nodeid, ("passed", False))
        html = None
        if self.settings.html is not None:
            from pytest_gpuprof.output.html import page_data

            html = page_data(record, result.timeline)
        return TestView(
            test=record.to_dict(),
            row=row(record),
            details=breach_details(record),
            compare=self.gate.lines(nodeid, result.changes),
            machine=self.runtime.machine(),
            html=html,
        )

    def load_baseline(self) -> None:
        if self.settings.compare is not None and self.runtime.runs_tests:
            self.gate.load(self.runtime.machine())

    # the end of the run
    def _views(self) -> dict[str, TestView]:
        """Every measured test once: in run order, or by test id where xdist workers
        report them in whatever order they finish."""
        if getattr(self.config.option, "dist", "no") != "no":
            return dict(sorted(self.views.items()))
        return self.views

    def summary(self, terminalreporter: Any) -> None:
        if self.runtime.is_worker:
            return
        title = ""
        if self.views or self.crashed:  # else nothing to show, and nothing to start for it
            truths = sorted({v.test["metrics"]["truth"] for v in self.views.values()}) or [self.runtime.truth]
            title = f"gpuprof: true GPU utilization (truth: {', '.join(truths)}, backend: {self.runtime.backend_name})"
        # a test started the backend after pytest printed the header: say how it runs
        late = self.runtime.started and not self.settings.configured
        self.outputs.summary(
            terminalreporter,
            self._views(),
            self.crashed,
            title=title,
            header=self.header() if late else [],
            compared_with=self.gate.path or self.settings.compare,
        )

    def write_outputs(self, partial: str | None) -> bool:
        if self.runtime.is_worker:
            return True
        return self.outputs.write(self._views(), self.crashed, self.runtime.machine, partial)

    def close(self) -> None:
        self.runtime.close()


def _primary(windows: list[Window]) -> int:
    """The window a test is reported by: the first whose breach counts (not settled inside
    its hypothesis example), else the first with a breach, else the last."""
    breaching = [i for i, w in enumerate(windows) if w.verdict.breached]
    counting = [i for i in breaching if not windows[i].settled]
    return (counting or breaching or [len(windows) - 1])[0]


def _warn(item: pytest.Item, message: str) -> bool:
    """Warn at the test's own line; ``False`` where warnings are errors (``-W error``)."""
    path, line = str(item.path), (item.location[1] or 0) + 1
    try:
        warnings.warn_explicit(GpuBudgetWarning(message), GpuBudgetWarning, path, line)
    except GpuBudgetWarning:
        return False
    return True


class SessionHooks:
    """The session's pytest hooks, each asking the session for one thing.

    A separate object with plain attributes only: pytest 8.0-8.2 read every attribute of
    a registered plugin while looking for fixtures, which would run the session's lazy
    properties (start a backend) for nothing.
    """

    def __init__(self, session: GpuSession) -> None:
        self._session = session
        self._collection_errors = 0

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._collection_errors += 1

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._session.load_baseline()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        session = self._session
        whole = item.stash.get(WHOLE_CALL, False)
        if whole:
            profiler = session.profiler(item.stash.get(BUDGET, session.settings.budget), item.nodeid)
            item.stash[PROFILER] = profiler
        try:
            if whole:
                done: list[Window] = []
                try:
                    with profiler.window("test") as done:
                        result = yield
                finally:
                    try:
                        session.backend.drain()  # the call's device work is in its window, or lost with it
                        if done:
                            profiler.record(done[0])
                    finally:
                        profiler.end()
            else:
                result = yield
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:
            session.judge(item, raised=True)  # a failing call keeps its verdict (a failed check())
            raise
        session.judge(item)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        self._session.annotate(item, call, report)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._session.logreport(report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self._session.summary(terminalreporter)

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
        if not self._session.write_outputs(partial) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
