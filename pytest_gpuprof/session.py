"""Session state: the backend, the device, the NVML sampler and every test's record."""

from __future__ import annotations

import functools
import gc
import os
import platform
import warnings
from collections.abc import Callable, Generator
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof.budget import Budget, not_measured
from pytest_gpuprof.config import Settings
from pytest_gpuprof.text import DEFAULT_THRESHOLDS, failure_message

if TYPE_CHECKING:
    from pytest_gpuprof import backends
    from pytest_gpuprof.compare import Change
    from pytest_gpuprof.device import GpuDevice
    from pytest_gpuprof.model import Timeline
    from pytest_gpuprof.nvml import NvmlSampler
    from pytest_gpuprof.profiler import Profiler, Window
    from pytest_gpuprof.report import GpuRecord


# the test's profiler, set by the gpuprof fixture
PROFILER = pytest.StashKey["Profiler"]()
# set at collection on a test with a budget and no fixture: its call is measured whole
WHOLE_CALL = pytest.StashKey[bool]()
BUDGET = pytest.StashKey[Budget]()
HOOKS_NAME = "gpuprof-session"


class GpuBudgetWarning(UserWarning):
    """A budget breach in a run without ``--gpu-budget``: reported, not enforced."""


class GpuMemoryLeak(AssertionError):
    """Device memory a test (or one of its hypothesis examples) took and did not give back."""


class GpuSession:
    """The plugin's state for one pytest process.

    Nothing GPU-side starts until something asks for it: where the run configures
    pytest-gpuprof (a ``--gpu-*`` option or a ``[tool.gpuprof]`` table), the backend is
    chosen at start-up and named in the header; otherwise, when a test first uses a
    fixture or the ``gpu`` marker, so that a suite that never does pays no CuPy import,
    CUDA context or CUPTI tracing for the plugin being installed.
    """

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self._selected: tuple[str, str] | None = None
        if settings.configured:
            self._select()
        self.records: dict[str, GpuRecord] = {}
        self.outcomes: dict[str, tuple[str, bool]] = {}
        self.changes: dict[str, list[Change]] = {}
        self.timelines: dict[str, Timeline | None] = {}
        self.views: dict[str, dict[str, Any]] = {}
        self.crashed: dict[str, str] = {}
        self.written: list[str] = []
        self.baseline: dict[str, Any] | None = None
        self.baseline_path: Path | None = None
        self._backend: backends.Backend | None = None

    def _select(self) -> tuple[str, str]:
        """The backend's name and why it was chosen; the device of this process."""
        if self._selected is None:
            from pytest_gpuprof import backends

            try:
                name, reason = backends.select(self.settings.backend, 0)
                count = backends.cuda_device_count() if name == "cuda" else None
                self.settings = replace(self.settings, device=self._pick_device(self.settings, count))
                if count is not None and self.settings.device >= count:
                    raise RuntimeError(f"--gpu-device={self.settings.device}, but only {count} device(s) are visible")
            except RuntimeError as e:
                raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
            self._selected = name, reason
        return self._selected

    def register(self) -> None:
        """Hook this session into pytest (once)."""
        if self.config.pluginmanager.get_plugin(HOOKS_NAME) is None:
            self.config.pluginmanager.register(SessionHooks(self), HOOKS_NAME)

    def unregister(self) -> None:
        hooks = self.config.pluginmanager.get_plugin(HOOKS_NAME)
        if hooks is not None:
            self.config.pluginmanager.unregister(hooks)

    @property
    def runs_tests(self) -> bool:
        """False for ``--collect-only`` and for a pytest-xdist controller: nothing to measure here."""
        controller = getattr(self.config.option, "dist", "no") != "no" and not self.is_worker
        return not (self.config.option.collectonly or controller)

    @property
    def started(self) -> bool:
        return self._selected is not None

    @property
    def backend_name(self) -> str:
        return self._select()[0]

    @property
    def backend_reason(self) -> str:
        return self._select()[1]

    def _pick_device(self, settings: Settings, cuda_devices: int | None) -> int:
        """The device of this process: ``--gpu-devices`` spreads xdist workers over devices
        (worker i on device i mod the count); host 'devices' are logical slots, one per worker."""
        if settings.devices is None:
            return settings.device
        worker = getattr(self.config, "workerinput", {}).get("workerid")
        index = int(worker[2:]) if worker else 0
        if settings.devices == "all":
            if cuda_devices is not None:
                count = cuda_devices
            else:
                count = int(getattr(self.config, "workerinput", {}).get("workercount", 1))
            devices: tuple[int, ...] = tuple(range(max(count, 1)))
        else:
            assert not isinstance(settings.devices, str)
            devices = settings.devices
        return devices[index % len(devices)]

    @property
    def backend(self) -> backends.Backend:
        if self._backend is None:
            from pytest_gpuprof import backends

            self.register()  # a test asked for the GPU: from now on its hooks run
            self._backend = backends.create(
                self.backend_name, self.settings.device, cupti=self.settings.cupti, clock=self.settings.host_clock
            )
        return self._backend

    @property
    def truth(self) -> str:
        return self._backend.truth if self._backend is not None else ("host" if self.backend_name == "host" else "?")

    @cached_property
    def device(self) -> GpuDevice:
        from pytest_gpuprof.device import GpuDevice

        return GpuDevice(self.backend, self.backend.info())

    @cached_property
    def sampler(self) -> NvmlSampler | None:
        if not self.settings.nvml or self.backend_name != "cuda":
            return None
        from pytest_gpuprof.nvml import NvmlSampler

        return NvmlSampler.start(self.settings.device, self.settings.nvml_interval_ms)

    def nvml_status(self) -> str:
        if not self.settings.nvml:
            return "off (--gpu-no-nvml)"
        if self.backend_name != "cuda":
            return "off (host backend: no GPU to sample)"
        from pytest_gpuprof.nvml import probe

        return probe(self.settings.device)

    def header(self) -> list[str]:
        if not self.started:
            return [
                "gpuprof: not started (no --gpu-* option, no [tool.gpuprof]): "
                "a test that uses gpuprof, gpu_workload, gpu_device or the gpu marker starts it"
            ]
        s = self.settings
        lines = [f"gpuprof: backend {self.backend_name} ({self.backend_reason})"]
        if self.backend_name == "cuda" and not self.runs_tests:
            why = "--collect-only" if self.config.option.collectonly else "each pytest-xdist worker starts its own"
            lines.append(f"gpuprof: device not started here ({why})")
        elif self.backend_name == "cuda":
            info = self.backend.info()
            lines.append(
                f"gpuprof: device {info.index} {info.name}, {info.memory_bytes / (1 << 30):.0f} GiB, "
                f"driver {info.driver}, PCIe {info.pcie}"
            )
            lines.append(
                f"gpuprof: truth {self.backend.truth}; CUPTI {self.backend.cupti_status()}; NVML {self.nvml_status()}"
            )
        else:
            clock = (
                "virtual clock (kernels and copies take exactly the time asked, host code none)"
                if s.host_clock == "virtual"
                else "real clock"
            )
            lines.append(
                f"gpuprof: device host CPU ({platform.machine()}): workloads run on CPU threads, {clock}, "
                "truth 'host'; CUPTI off (no GPU); NVML off (no GPU)"
            )
        mode = "enforced (--gpu-budget)" if s.enforce else "reported as warnings (no --gpu-budget)"
        where = f"; config {s.pyproject}" if s.pyproject else ""
        lines.append(f"gpuprof: budgets {mode}; rounds {s.rounds}, warmup {s.warmup}{where}")
        return lines

    # per test
    def profiler(self, budget: Budget) -> Profiler:
        from pytest_gpuprof.profiler import Profiler

        return Profiler(
            self.backend,
            budget=budget,
            rounds=self.settings.rounds,
            warmup=self.settings.warmup,
            sampler=self.sampler,
            enforce=self.settings.enforce,
        )

    def verdict(self, nodeid: str, profiler: Profiler) -> str | None:
        """Record the test's windows; the budget message of its first breaching one, if any."""
        windows = profiler.final_windows()
        if not windows:
            return None
        self._record(nodeid, profiler, windows)
        breaching = [w for w in windows if w.breaches and not w.settled]
        if not breaching:
            return None
        first = breaching[0]
        message = failure_message(first.breaches, first.metrics)
        if len(windows) > 1:
            message += f"\n  (window '{first.label}', {windows.index(first) + 1} of {len(windows)})"
        return message

    def _record(self, nodeid: str, profiler: Profiler, windows: list[Window]) -> None:
        from pytest_gpuprof.report import GpuRecord

        primary = next((w for w in windows if w.breaches), windows[-1])
        self.timelines[nodeid] = primary.timeline
        if self.settings.trace is not None and primary.timeline is not None:
            from pytest_gpuprof.trace import write_trace

            write_trace(self.settings.trace, nodeid, primary.timeline)
        self.records[nodeid] = GpuRecord(
            nodeid=nodeid,
            metrics=primary.metrics,
            budget=profiler.budget,
            breaches=primary.breaches,
            enforced=self.settings.enforce,
            windows=len(windows),
            device=self.settings.device,
        )

    # baselines
    def load_baseline(self) -> None:
        if self.settings.compare is None or not self.runs_tests:
            return
        from pytest_gpuprof import storage

        wanted = None if self.settings.compare == "latest" else self.settings.compare
        machine = self.machine()
        try:
            path = storage.find(self.settings.storage, machine["id"], wanted)
            baseline = storage.load(path)
        except storage.BaselineError as e:
            raise pytest.UsageError(f"pytest-gpuprof: --gpu-compare: {e}") from None
        theirs = baseline["machine"]
        if theirs["id"] != machine["id"] and not self.settings.compare_any_machine:
            raise pytest.UsageError(
                f"pytest-gpuprof: --gpu-compare: {path} was measured on machine {theirs['id']} "
                f"({theirs.get('gpu')}, driver {theirs.get('driver')}, PCIe {theirs.get('pcie')}, "
                f"{theirs.get('backend')}); this is {machine['id']} ({machine['gpu']}, driver {machine['driver']}, "
                f"PCIe {machine['pcie']}, {machine['backend']}). Pass --gpu-compare-any-machine to compare anyway"
            )
        self.baseline, self.baseline_path = baseline, path

    def regression(self, nodeid: str) -> str | None:
        """Compare this test with the baseline; the failure message when it clearly regressed
        and ``--gpu-compare-fail`` was given."""
        record = self.records.get(nodeid)
        if self.baseline is None or record is None:
            return None
        from pytest_gpuprof.compare import compare_tests, parse_thresholds

        base = next((t for t in self.baseline["tests"] if t.get("nodeid") == nodeid), None)
        if base is None:
            return None  # a new test: nothing to compare with
        thresholds = self.settings.compare_fail or parse_thresholds(DEFAULT_THRESHOLDS)
        changes = compare_tests(thresholds, base, record.to_dict())
        self.changes[nodeid] = changes
        regressed = [c for c in changes if c.verdict == "regression"]
        if not regressed or not self.settings.compare_fail:
            return None
        lines = [f"GPU regression against baseline {self.baseline_path}:"]
        lines += [f"  {c.describe()}" for c in regressed]
        return "\n".join(lines)

    def release(self, nodeid: str, profiler: Profiler) -> None:
        """End of a test: wait for its device work, record it if the call did not, and
        check that its device memory came back. Only a test that passed is held to that: a
        failed test's traceback may still hold buffers, and an interrupted one (Ctrl-C)
        never finished."""
        outcome = self.outcomes.get(nodeid, ("interrupted", False))[0]
        try:
            self.backend.synchronize()
        finally:
            if nodeid not in self.records and outcome != "interrupted":
                windows = profiler.final_windows()
                if windows:
                    self._record(nodeid, profiler, windows)
            self.backend.drain()
        gc.collect()
        held = self.backend.memory_in_use() - profiler.memory_before
        passed = outcome == "passed"
        leaks = list(profiler.leaks) if passed else []
        if held > 0 and passed:
            leaks.append(f"{held:,} bytes ({held / (1 << 30):.3g} GiB) of device memory still held after the test")
        if leaks:
            self.backend.trim()
            raise GpuMemoryLeak("GPU memory leak: " + "; ".join(leaks))

    # what the hooks ask for
    def judge(self, item: pytest.Item) -> None:
        """After a test's call: record it, warn about or fail a breach, gate a regression."""
        profiler = item.stash.get(PROFILER, None)
        if profiler is None:
            return
        message = self.verdict(item.nodeid, profiler)
        record = self.records.get(item.nodeid)
        if record is not None:
            item.user_properties.extend(record.properties())
        regression = self.regression(item.nodeid)
        failures = [m for m in (message if self.settings.enforce else None, regression) if m]
        for line in not_measured(profiler.budget, record.metrics) if record is not None else []:
            try:  # neither kept nor breached: said so, never a failure
                warnings.warn(GpuBudgetWarning(f"GPU budget not judged: {line}"), stacklevel=1)
            except GpuBudgetWarning:
                pass  # warnings are errors here (-W error); the summary's verdict still says it
        if message is not None and not self.settings.enforce:
            try:
                warnings.warn(GpuBudgetWarning(message), stacklevel=1)
            except GpuBudgetWarning:  # warnings are errors here (-W error): fail with the message
                failures.append(message)
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)

    def logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = (report.outcome, hasattr(report, "wasxfail"))
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes.setdefault(report.nodeid, ("failed", False))
        view = getattr(report, "gpuprof", None)
        if isinstance(view, dict):
            self.views[report.nodeid] = view
        if report.failed and (report.when == "???" or "crashed while running" in str(report.longrepr)):
            # pytest-xdist's report for the test a worker was running when it died
            self.crashed[report.nodeid] = str(report.longrepr).strip().splitlines()[-1][:300]

    def annotate(self, item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
        if call.when == "teardown" and item.nodeid in self.records:
            # Everything the controller needs travels with the report (pytest-xdist sends
            # its __dict__), so a worker's tests are reported like local ones.
            report.gpuprof = self.view(item.nodeid)  # type: ignore[attr-defined]

    def view(self, nodeid: str) -> dict[str, Any]:
        """One test as every output needs it: report entry, table row, breach and compare lines, page data."""
        from pytest_gpuprof.report import breach_details, row

        record = self.records[nodeid]
        record.outcome, record.xfail = self.outcomes.get(nodeid, ("passed", False))
        view: dict[str, Any] = {
            "test": record.to_dict(),
            "row": row(record),
            "details": breach_details(record),
            "compare": self.compare_lines(nodeid),
            "machine": self.machine(),
        }
        if self.settings.html is not None:
            from pytest_gpuprof.html import page_data

            view["html"] = page_data(record, self.timelines.get(nodeid))
        return view

    def compare_lines(self, nodeid: str) -> list[str]:
        if self.baseline is None:
            return []
        if not any(t.get("nodeid") == nodeid for t in self.baseline["tests"]):
            return [f"{nodeid}: new (not in the baseline)"]
        changes = self.changes.get(nodeid, [])
        notable = [c for c in changes if c.verdict != "unchanged"]
        verdict = ", ".join(sorted({c.verdict for c in notable})) or "unchanged"
        return [f"{nodeid}: {verdict}", *(f"    {c.describe()}" for c in notable)]

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def merged(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every test once, in run order, and the machine: from this process or the workers."""
        tests = [v["test"] for v in self.views.values()]
        tests += [
            {"nodeid": nodeid, "outcome": "failed", "crashed": reason}
            for nodeid, reason in self.crashed.items()
            if nodeid not in self.views
        ]
        machines = [v["machine"] for v in self.views.values()]
        machine = dict(machines[0]) if machines else self.machine()
        devices = sorted({t["device"] for t in tests if "device" in t})
        if devices:
            machine["devices"] = devices
        return tests, machine

    def summary(self, terminalreporter: Any) -> None:
        if self.is_worker:
            return
        if not (self.views or self.crashed):
            for line in self.written:  # what was written, or could not be, for a run that measured nothing
                terminalreporter.write_line(line)
            return
        from pytest_gpuprof.report import table

        views = list(self.views.values())
        tr = terminalreporter
        truths = sorted({v["test"]["metrics"]["truth"] for v in views}) or [self.truth]
        tr.section(f"gpuprof: true GPU utilization (truth: {', '.join(truths)}, backend: {self.backend_name})")
        if self._backend is not None and not self.settings.configured:  # a test started it after the header
            for line in self.header():
                tr.write_line(line)
        for line in table([v["row"] for v in views]):
            tr.write_line(line)
        for nodeid, reason in self.crashed.items():
            tr.write_line(f"{nodeid}: lost: {reason}")
        details = [line for v in views for line in v["details"]]
        if details:
            tr.write_line("")
            tr.write_line("budget breaches and where the time went:")
            for line in details:
                tr.write_line(line)
        compare = [line for v in views for line in v["compare"]]
        if compare:
            tr.write_line("")
            tr.write_line(f"compared with baseline {self.baseline_path or self.settings.compare}:")
            for line in compare:
                tr.write_line(f"  {line}")
        sharing = self.sharing_note(views)
        if sharing:
            tr.write_line(sharing)
        for line in self.written:
            tr.write_line(line)
        if self.settings.trace is not None:
            tr.write_line(f"gpuprof: one trace per test in {self.settings.trace} (open in ui.perfetto.dev)")

    def sharing_note(self, views: list[dict[str, Any]]) -> str | None:
        workers = self.config.getoption("numprocesses", None) if not self.is_worker else None
        if not workers:
            return None
        devices = sorted({v["test"].get("device", 0) for v in views})
        if len(devices) < int(workers):
            return f"gpuprof: {workers} xdist workers shared {len(devices)} device(s) {devices}: their timings overlap"
        return f"gpuprof: {workers} xdist workers on devices {devices}"

    def machine(self) -> dict[str, Any]:
        from pytest_gpuprof.report import machine_record

        return machine_record(self.device.to_dict(), self.truth)

    def write_outputs(self, partial: str | None) -> bool:
        """The JSON report, the HTML, the baseline and the step summary, each written whole
        or not at all; ``partial`` says why the run ended early, if it did. False when one
        could not be written (each failure is a line of the summary)."""
        s = self.settings
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if self.is_worker or (s.report is None and s.save is None and s.html is None and not summary):
            return True
        from pytest_gpuprof.files import write_atomic, write_json
        from pytest_gpuprof.report import build_report, markdown_summary

        tests, machine = self.merged()
        report = build_report(tests, machine)
        if partial:
            report["partial"] = partial
        if not tests:
            report["note"] = "nothing was measured: no test used gpuprof, gpu_workload or a gpu_budget marker"
        ok = True

        def write(what: str, path: Path | str, action: Callable[[], object], done: str) -> None:
            nonlocal ok
            try:
                action()
            except OSError as e:
                ok = False
                self.written.append(f"gpuprof: could not write the {what} {path}: {e.strerror or e}")
            else:
                self.written.append(done)

        if (json_path := s.report) is not None:
            done = f"gpuprof: JSON report written to {json_path}"
            write("JSON report", json_path, functools.partial(write_json, json_path, report), done)
        if (html_path := s.html) is not None:
            from pytest_gpuprof.html import render

            page = render([v["html"] for v in self.views.values() if v.get("html")], machine)
            done = f"gpuprof: HTML report written to {html_path}"
            write("HTML report", html_path, functools.partial(write_atomic, html_path, page), done)
        if (name := s.save) is not None:
            from pytest_gpuprof import storage

            if partial:
                self.written.append(f"gpuprof: no baseline saved: the run {partial}")
            else:
                saved: list[Path] = []
                write("baseline", s.storage, lambda: saved.append(storage.save(report, s.storage, name)), "")
                if saved:
                    empty = "" if tests else " (no test measured anything: it holds no test)"
                    self.written[-1] = f"gpuprof: baseline saved as {saved[0]}{empty}"
        if summary:
            compare = [line for v in self.views.values() for line in v["compare"]]

            def append_summary() -> None:
                with open(summary, "a", encoding="utf-8") as f:
                    f.write(markdown_summary([t for t in tests if "metrics" in t], machine, compare))

            write("step summary", summary, append_summary, f"gpuprof: step summary appended to {summary}")
        return ok

    def close(self) -> None:
        if "sampler" in self.__dict__ and self.sampler is not None:
            self.sampler.stop()
        if self._backend is not None:
            self._backend.close()
            self._backend = None


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
        if not item.stash.get(WHOLE_CALL, False):
            result = yield
            self._session.judge(item)
            return result
        session = self._session
        profiler = session.profiler(item.stash.get(BUDGET, session.settings.budget))
        item.stash[PROFILER] = profiler
        try:
            with profiler.window("test") as done:
                result = yield
        finally:
            session.backend.drain()  # the call's device work is in its window, or lost with it
        profiler.record(done[0])
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
