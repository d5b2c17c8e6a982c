"""The plugin's state for one pytest process, and what happens around each test (the hooks
that call it are in ``plugin``).

The session wires the rooms together (docs/design.md, "Layers"): ``runtime`` (the
backend, device, sampler and header), ``baselines.gate`` (baseline and comparison), ``wrap_up``
(summary, files), ``windows`` (each window judged); here only what happens around each
test: its profiler, its record, its warning or failure, its leak check, its view.
"""

from __future__ import annotations

import dataclasses
import gc
import warnings
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.analysis.sources import CUPTI
from pytest_gpuprof.harness import items
from pytest_gpuprof.harness.config import Settings
from pytest_gpuprof.harness.outcomes import Outcomes
from pytest_gpuprof.harness.runtime import DeviceRuntime
from pytest_gpuprof.harness.touch import PROFILER
from pytest_gpuprof.harness.wrap_up import Outputs
from pytest_gpuprof.measure.errors import GpuBudgetExceeded, GpuBudgetWarning, GpuMemoryLeak
from pytest_gpuprof.output.text import failure_message, human_bytes
from pytest_gpuprof.output.views import TestResult, TestView
from pytest_gpuprof.verdict.budget import Budget

if TYPE_CHECKING:
    from pytest_gpuprof.baselines.gate import Gate
    from pytest_gpuprof.baselines.rule import RunFacts
    from pytest_gpuprof.capture import backends
    from pytest_gpuprof.capture.children import ChildWatch
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.capture.placement import Placement
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.verdict.comparison import Comparison
    from pytest_gpuprof.verdict.record import Compared, GpuRecord


# why a test could not hold its device (``--gpu-exclusive``): its set-up fails with it
NO_DEVICE = pytest.StashKey[str]()


# how a test the plugin failed reads in pytest's progress and summary (``pytest_report_teststatus``)
GPU_BUDGET, GPU_REGRESSION, GPU_UNDECIDED = "GPU BUDGET", "GPU REGRESSION", "GPU UNDECIDED"
GPU_GATE_ERROR = "GPU GATE ERROR"


class GpuSession:
    """Nothing GPU-side starts until something asks for it: where the run configures
    pytest-gpuprof (a ``--gpu-*`` option or a ``[tool.gpuprof]`` table), the backend is
    chosen at start-up and named in the header; otherwise, when a test first uses a
    fixture or the ``gpu`` marker, so that a suite that never does pays no CuPy import,
    CUDA context or CUPTI tracing for the plugin being installed.
    """

    def __init__(self, config: pytest.Config, settings: Settings, placed: Placement | None = None) -> None:
        self.config = config
        self.settings = settings  # resolved once, at start-up
        self.runtime = DeviceRuntime(config, settings, placed)
        self.gate: Gate | None = None  # the baseline a comparison reads (``load_baseline``)
        self.first_baseline = False  # --gpu-compare on a store with nothing of this machine, in a run that saves
        self.outputs = Outputs(config, settings)
        self.results: dict[str, TestResult] = {}  # measured here
        self.tests = Outcomes()
        self.waited: dict[str, tuple[float, str]] = {}  # --gpu-exclusive: each wait (ms), for whom
        # tests the plugin failed, with the word their report shows: a budget, a regression
        self.failed_by_gate: dict[str, str] = {}

    # the device side, as the fixtures and the header ask for it
    @property
    def backend(self) -> backends.Backend:
        return self.runtime.backend

    @property
    def device(self) -> GpuDevice:
        return self.runtime.device

    def header(self) -> list[str]:
        from pytest_gpuprof.harness.header import header

        return header(self.runtime)

    # per test
    def profiler(self, budget: Budget, owner: str = "this test") -> Profiler:
        return _profiler(self.runtime, self.settings, budget, owner)

    def hold_device(self, item: pytest.Item) -> None:
        """Under ``--gpu-exclusive=auto``, hold the test's device alone among this plugin's
        processes from its set-up to its tear-down (``DeviceRuntime.hold``); CPU-only tests
        take no lock and run in parallel."""
        if self.runtime.runs_tests and items.uses_device(self.settings, item):
            from pytest_gpuprof.capture.exclusive import LockError

            start = items.starts_backend(self.settings, item)
            try:
                self.waited[item.nodeid] = self.runtime.hold(item.nodeid, start=start)
            except LockError as e:  # the test's set-up errors with it (``refused``)
                item.stash[NO_DEVICE] = str(e)

    def refused(self, item: pytest.Item) -> None:
        """At the test's set-up: the device it could not hold (a planted lock, a wait that
        ran out), as the set-up's error."""
        why = item.stash.get(NO_DEVICE, None)
        if why is not None:
            pytest.fail(why, pytrace=False)

    def let_go(self) -> None:
        self.runtime.let_go()

    def result(
        self, nodeid: str, profiler: Profiler, raised: BaseException | None = None, compare: bool = False
    ) -> TestResult | None:
        """What the test measured and judged (``measure.record.build``; ``compare``: against
        the baseline too), kept where its verdict is built from; its windows' traces written
        (``--gpu-trace``)."""
        from pytest_gpuprof.measure import record

        built = record.build(
            nodeid,
            profiler,
            raised,
            enforced=self.settings.enforce,
            device=self.runtime.device_number,
            compare=self._compare if compare and self.gate is not None else None,
        )
        if built is None:
            return None
        result = TestResult(built.record, built.timeline, built.comparison, built.primary)
        if self.settings.trace is not None and self.outputs.trace_failed is None:
            from pytest_gpuprof.output.trace import write_trace

            count = result.record.windows
            try:
                for index, window in built.shown:
                    if window.timeline is not None:
                        write_trace(self.settings.trace, nodeid, window.timeline, window=(index, count, result.primary))
            except OSError as e:  # a full disk: the run fails once, at its end; no test's outcome changes
                self.outputs.trace_failed = (
                    f"gpuprof: could not write the traces to {self.settings.trace}: {e.strerror or e}"
                )
        self.results[nodeid] = result
        return result

    def give_verdict(self, item: pytest.Item, raised: BaseException | None = None) -> None:
        """After a test's call: record its verdict, then warn about or fail a breach and
        gate a regression (``raised``: the call failed already; it is recorded only)."""
        profiler = item.stash.get(PROFILER, None)
        if profiler is None:
            return
        refused = self.backend.clock.refused
        if refused:  # a thread the virtual clock cannot follow: the test is refused, not measured
            refusal = "\n".join(refused)
            refused.clear()
            if raised is None:
                pytest.fail(refusal, pytrace=False)
            return
        try:
            profiler.rebudget(items.budget_of(self.settings, item))  # applymarker inside the call counts too
        except pytest.UsageError as e:
            if raised is None:
                pytest.fail(str(e), pytrace=False)
            return
        result = self.result(item.nodeid, profiler, raised, compare=True)
        if result is None:
            return
        record = result.record
        gated = self._gate_says(result) if self.gate is not None else []
        if raised is not None:
            return
        message = None
        if not record.failed_check:
            messages = [
                failure_message(w.breaches, w.metrics, window=w.where)
                for w in record.breached_windows
                if not profiler.windows[w.index].settled
            ]
            message = "\n".join(messages) or None
        failures = [(message, GPU_BUDGET)] if message is not None and self.settings.enforce else []
        for text, word in gated:
            if word is None:
                _warn(item, text)
            else:
                failures.append((text, word))
        for line in _said(result, profiler):
            _warn(item, line)
        if message is not None and not self.settings.enforce and not _warn(item, message):
            failures.append((message, GPU_BUDGET))  # warnings are errors here (-W error): fail with the message
            result.warned_as_error = True
        if failures:
            self.failed_by_gate[item.nodeid] = failures[0][1]
            pytest.fail("\n".join(text for text, _ in failures), pytrace=False)

    def _compare(self, record: GpuRecord) -> tuple[Comparison, Compared]:
        """The test against its baseline, confirmed by fresh runs where it regressed
        (``--gpu-compare-confirm``), and what its record keeps of it."""
        from pytest_gpuprof.verdict.decision import decision
        from pytest_gpuprof.verdict.record import Compared

        assert self.gate is not None
        environment = self.runtime.environment()
        comparison = self.gate.compare(record.nodeid, record.to_dict(), environment)
        if self.settings.compare_confirm and decision(comparison)[0] == "regression":
            comparison = self._confirm(record.nodeid, comparison, environment)
        return comparison, Compared.of(comparison, self.settings.compare_undecided == "fail")

    def _gate_says(self, result: TestResult) -> list[tuple[str, str | None]]:
        """What the gate says of the test, each with the word its failure reads (``None``: a
        warning only): the comparison's own error, a regression, an undecided gate (failed
        under ``--gpu-compare-undecided=fail``)."""
        from pytest_gpuprof.verdict.decision import decision, undecided_message

        comparison = result.comparison
        if comparison is None or self.gate is None:
            return []
        if comparison.error:
            return [(f"gpuprof: the gate could not compare this test: {comparison.why_not}", GPU_GATE_ERROR)]
        said: list[tuple[str, str | None]] = []
        regression = comparison.failure()
        if regression is not None:
            said.append((regression, GPU_REGRESSION))
        undecided = decision(comparison)[1]
        if undecided:
            text = undecided_message(undecided, comparison.source or self.gate.where)
            if result.record.compared.undecided_failed:
                said.append((text, GPU_UNDECIDED))
            else:
                said.append((f"gpuprof: {text} (--gpu-compare-undecided=fail fails it)", None))
        return said

    def _confirm(self, nodeid: str, comparison: Comparison, environment: dict[str, Any]) -> Comparison:
        """``comparison``'s regressions put to fresh runs of the test (``harness.reruns``);
        where none could be made, the regression stands and the note says why."""
        from pytest_gpuprof.harness import reruns
        from pytest_gpuprof.verdict.comparison import confirmed

        assert self.gate is not None
        try:
            entries = reruns.fresh_entries(self.config, self.settings, nodeid, self.settings.compare_confirm)
        except reruns.RerunError as e:
            note = f"not confirmed ({e}): the regression stands"
            return dataclasses.replace(comparison, note="; ".join(n for n in (comparison.note, note) if n))
        return confirmed(comparison, [self.gate.compare(nodeid, e, environment) for e in entries])

    def release(self, nodeid: str, profiler: Profiler) -> None:
        """End of a test: wait for its device work, record it if the call did not, and
        check that its device memory came back. Only a test that passed is held to that: a
        failed test's traceback may still hold buffers, and an interrupted one (Ctrl-C)
        never finished."""
        outcome = self.tests.of(nodeid, "interrupted")[0]
        try:
            self.backend.synchronize()
        finally:
            try:
                if nodeid not in self.results and outcome != "interrupted":
                    self.result(nodeid, profiler)
                self.backend.source.drain()
            finally:
                profiler.end()
        if profiler.disabled:
            return  # --gpu-disable: nothing is judged, its memory included
        leaks = _leaks(self.backend, profiler) if outcome == "passed" else []
        if leaks:
            self.backend.trim()
            if nodeid in self.results:
                self.results[nodeid].leaks = tuple(leaks)
            raise GpuMemoryLeak("GPU memory leak: " + "; ".join(leaks))

    def measured(self, nodeid: str) -> bool:
        """Whether this process measured the test (a record made, or made at its set-up)."""
        return nodeid in self.results

    def logreport(self, report: pytest.TestReport) -> None:
        self.tests.logged(report)
        failed = getattr(report, "gpuprof_trace_failed", None)  # from an xdist worker
        if isinstance(failed, str) and self.outputs.trace_failed is None:
            self.outputs.trace_failed = failed

    def annotate(self, item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
        if call.when == "setup" and self.tests.set_up(item.nodeid):
            self.results.pop(item.nodeid, None)  # a rerun: its record is this run's alone
        self.tests.made(item.nodeid, call.when, report)
        if call.when == "call" and report.failed:
            self._mark_gate_failure(item.nodeid, call, report)
        if call.when == "teardown" and call.excinfo is not None and isinstance(call.excinfo.value, GpuMemoryLeak):
            # the plugin's own finding: its one line, not a traceback through the plugin's source
            report.longrepr = f"GpuMemoryLeak: {call.excinfo.value}"
        if call.when == "teardown" and item.nodeid in self.results:
            view = self.view(item.nodeid)
            # JUnit XML reads the tear-down report's properties: every measured test has them
            report.user_properties.extend(self.results[item.nodeid].record.properties())
            # Everything the controller needs travels with the report (pytest-xdist sends
            # its __dict__), so a worker's tests are reported like local ones.
            report.gpuprof = view.to_dict()  # type: ignore[attr-defined]
        if call.when == "teardown":
            # the test has its view: what it measured (timelines, windows, the profiler the
            # item keeps) is let go, so that a suite's memory stays flat in its tests
            self.results.pop(item.nodeid, None)
            if PROFILER in item.stash:
                del item.stash[PROFILER]
        if call.when == "teardown" and self.outputs.trace_failed is not None:
            report.gpuprof_trace_failed = self.outputs.trace_failed  # type: ignore[attr-defined]

    def _mark_gate_failure(self, nodeid: str, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
        """A call the plugin failed (a breach, a regression, an uncaught ``check()``): its
        report says so (``pytest_report_teststatus``: ``G``, GPU BUDGET) and carries a
        ``gpuprof`` section with the figures of the windows that failed it, and its changes
        against the baseline (the failure's message says why)."""
        from pytest_gpuprof.output.report import section

        raised = call.excinfo.value if call.excinfo is not None else None
        word = GPU_BUDGET if isinstance(raised, GpuBudgetExceeded) else self.failed_by_gate.get(nodeid)
        if word is None:
            return
        report.gpuprof_failed = word  # type: ignore[attr-defined]
        result = self.results.get(nodeid)
        if result is not None:
            compare = _compare_lines(result)
            report.sections.append(("gpuprof", section(result.record, compare, self.settings.memory_top)))

    def view(self, nodeid: str) -> TestView:
        from pytest_gpuprof.output.run_files import FILES, view
        from pytest_gpuprof.verdict.record import Ending

        result = self.results[nodeid]
        outcome, xfail = self.tests.of(nodeid)
        waited_ms, waited_for = self.waited.get(nodeid, (0.0, ""))
        ending = Ending(
            outcome, xfail, self.tests.reruns(nodeid), waited_ms, waited_for, result.leaks, result.warned_as_error
        )
        result.record = dataclasses.replace(result.record, ending=ending)  # the record's second and last making
        per_file = [f for f in FILES if f.where(self.settings) is not None]
        compare = _compare_lines(result)
        machine = self.runtime.machine()
        machine["environment"] = self.runtime.environment()
        return view(result, compare, machine, per_file)

    def load_baseline(self) -> None:
        """The baseline this run compares with (``baselines.gate``); a usage error where it
        cannot be used."""
        s = self.settings
        if s.compare is None or not self.runtime.runs_tests:
            return
        from pytest_gpuprof.baselines.gate import Gate
        from pytest_gpuprof.baselines.records import BaselineError

        try:
            self.gate = Gate.open(
                s.compare, self.runtime.machine(), s.compare_fail, s.storage, s.compare_any_machine, s.save is not None
            )
        except BaselineError as e:
            flag = "--gpu-compare" if s.compare_given else "--gpu-compare-fail (compared with the latest baseline)"
            raise pytest.UsageError(f"pytest-gpuprof: {flag}: {e}") from None
        self.first_baseline = self.gate is None

    # the end of the run
    def _views(self) -> dict[str, TestView]:
        """Every measured test once: in run order, or by test id where xdist workers
        report them in whatever order they finish."""
        if getattr(self.config.option, "dist", "no") != "no":
            return dict(sorted(self.tests.views.items()))
        return self.tests.views

    def summary(self, terminalreporter: Any) -> None:
        if self.runtime.is_worker:
            return
        if self.settings.disabled:
            terminalreporter.write_line(
                "gpuprof: --gpu-disable: the tests ran unmeasured: no figure was taken, no budget or gate judged"
            )
        title = ""
        if self.tests.views or self.tests.crashed:  # else nothing to show, and nothing to start for it
            truths = sorted({v.test["metrics"]["truth"] for v in self.tests.views.values()}) or [self.runtime.truth]
            title = f"gpuprof: true GPU utilization (truth: {', '.join(truths)}, backend: {self.runtime.kind.name})"
        # a test started the backend after pytest printed the header: say how it runs
        late = self.runtime.started and not self.settings.configured
        self.outputs.summary(
            terminalreporter,
            self._views(),
            self.tests.crashed,
            title=title,
            header=self.header() if late else [],
            compared_with=self._compared_with(),
        )

    def _compared_with(self) -> str | None:
        """The baseline the summary names: where it is, and why it was chosen."""
        if self.gate is not None:
            return f"{self.gate.where} ({self.gate.chosen}{'; ' + self.gate.note if self.gate.note else ''})"
        if self.first_baseline:
            from pytest_gpuprof.baselines.records import shown

            return (
                f"nothing: {shown(self.settings.storage)} holds no baseline of machine {self.runtime.machine()['id']} yet; "
                "this run saves the first, and every test is new (ungated)"
            )
        return None

    def write_outputs(self, run: RunFacts) -> bool:
        """The run's files, and the baseline where the rule lets ``run`` be one."""
        if self.runtime.is_worker:
            return True
        return self.outputs.write(self._views(), self.tests.crashed, self.runtime.machine, run, self.tests.words())

    def close(self) -> None:
        self.runtime.close()


def _compare_lines(result: TestResult) -> list[str]:
    """The test's lines against the baseline, headed by the gate's decision."""
    if result.comparison is None:
        return []
    from pytest_gpuprof.verdict.decision import lines

    return lines(result.comparison)


def _warn(item: pytest.Item, message: str) -> bool:
    """Warn at the test's own line; ``False`` where warnings are errors (``-W error``)."""
    path, line = str(item.path), (item.location[1] or 0) + 1
    try:
        warnings.warn_explicit(GpuBudgetWarning(message), GpuBudgetWarning, path, line)
    except GpuBudgetWarning:
        return False
    return True


def _said(result: TestResult, profiler: Profiler) -> list[str]:
    """What a test's warnings say besides a breach: limits not judged (never a failure),
    device work no window held, a baseline or a gate that cannot judge it, steps made and
    never entered or never left."""
    record = result.record
    lines = [f"GPU budget not judged: {line}" for line in record.unjudged]
    if not profiler.budget.empty or record.compared.gated:
        lines += [f"gpuprof: {line}" for line in record.outside]
    comparison = result.comparison
    if comparison is not None:
        if comparison.why_not is not None and not comparison.gating:  # gated: said as undecided
            lines.append(f"gpuprof: baseline {comparison.why_not}")
    return lines + [f"gpuprof: {line}" for line in profiler.problems()]


def _leaks(backend: backends.Backend, profiler: Profiler) -> list[str]:
    """What a passed test took and did not give back: its windows' leaks, and device memory
    still held after it."""
    if backend.memory_in_use() > profiler.memory_before:
        gc.collect()  # only then: buffers in a reference cycle (a full collection costs tens of ms)
    held = backend.memory_in_use() - profiler.memory_before
    leaks = list(profiler.leaks)
    if held > 0:
        leaks.append(f"{held:,} bytes ({human_bytes(held)}) of device memory still held after the test")
    return leaks


def _child_watch(settings: Settings, backend: backends.Backend) -> ChildWatch | None:
    """Where the test's children write their device work (``--gpu-children``, CUPTI only:
    they record it the same way)."""
    if not settings.children or backend.source.kind != CUPTI:
        return None
    from pytest_gpuprof.capture.children import ChildWatch

    return ChildWatch()


def _profiler(runtime: DeviceRuntime, s: Settings, budget: Budget, owner: str) -> Profiler:
    """A test's profiler, on the session's device, sampler and settings."""
    from pytest_gpuprof.measure.profiler import Profiler
    from pytest_gpuprof.measure.windows import Channels

    profiler = Profiler(
        runtime.backend,
        budget=budget,
        rounds=s.rounds,
        warmup=s.warmup,
        rounds_floor=s.rounds_floor,
        enforce=s.enforce,
        owner=owner,
        disabled=s.disabled,
        skip=pytest.skip,
        channels=Channels(
            sampler=runtime.sampler,
            pinned_gbps=lambda: runtime.device.h2d_gbps,
            gpm=runtime.gpm,
            stacks=runtime.stacks,
            children=_child_watch(s, runtime.backend),
        ),
    )
    gated = any(t.metric.startswith("memory.") or t.metric.endswith(".memory_peak_bytes") for t in s.compare_fail)
    if (gated or s.memory_top) and profiler.spans.memory is not None:
        profiler.spans.memory.see_each()  # a gate on memory needs its peaks between edges, the top its places
    return profiler
