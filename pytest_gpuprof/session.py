"""Session state: the backend, the device, the NVML sampler and every test's record."""

from __future__ import annotations

import platform
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gpuprof import backends
from pytest_gpuprof.budget import Budget, failure_message
from pytest_gpuprof.config import Settings

if TYPE_CHECKING:
    from pytest_gpuprof.device import GpuDevice
    from pytest_gpuprof.nvml import NvmlSampler
    from pytest_gpuprof.profiler import Profiler, Window
    from pytest_gpuprof.report import GpuRecord


class GpuSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        try:
            self.backend_name, self.backend_reason = backends.select(settings.backend, settings.device)
        except RuntimeError as e:
            raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
        self.records: dict[str, GpuRecord] = {}
        self.outcomes: dict[str, tuple[str, bool]] = {}
        self._backend: backends.Backend | None = None

    @property
    def backend(self) -> backends.Backend:
        if self._backend is None:
            self._backend = backends.create(self.backend_name, self.settings.device, cupti=self.settings.cupti)
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
        s = self.settings
        lines = [f"gpuprof: backend {self.backend_name} ({self.backend_reason})"]
        if self.backend_name == "cuda":
            info = self.backend.info()
            lines.append(
                f"gpuprof: device {info.index} {info.name}, {info.memory_bytes / (1 << 30):.0f} GiB, "
                f"driver {info.driver}, PCIe {info.pcie}"
            )
            lines.append(
                f"gpuprof: truth {self.backend.truth}; CUPTI {self.backend.cupti_status()}; NVML {self.nvml_status()}"
            )
        else:
            lines.append(
                f"gpuprof: device host CPU ({platform.machine()}): workloads run on CPU threads, "
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
        )

    def verdict(self, nodeid: str, profiler: Profiler) -> str | None:
        """Record the test's windows; the budget message of its first breaching one, if any."""
        windows = profiler.final_windows()
        if not windows:
            return None
        self._record(nodeid, profiler, windows)
        breaching = [w for w in windows if w.breaches]
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
        self.records[nodeid] = GpuRecord(
            nodeid=nodeid,
            metrics=primary.metrics,
            budget=profiler.budget,
            breaches=primary.breaches,
            enforced=self.settings.enforce,
            windows=len(windows),
        )

    def release(self, nodeid: str, profiler: Profiler) -> None:
        """End of a test: wait for its device work; record it if the call did not."""
        try:
            self.backend.synchronize()
        finally:
            if nodeid not in self.records:
                windows = profiler.final_windows()
                if windows:
                    self._record(nodeid, profiler, windows)
            self.backend.drain()

    # hooks
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = (report.outcome, hasattr(report, "wasxfail"))
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes[report.nodeid] = ("failed", False)

    def finished(self) -> list[GpuRecord]:
        for nodeid, record in self.records.items():
            record.outcome, record.xfail = self.outcomes.get(nodeid, ("passed", False))
        return list(self.records.values())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        records = self.finished()
        if not records:
            return
        from pytest_gpuprof.report import breach_details, table

        tr = terminalreporter
        tr.section(f"gpuprof: true GPU utilization (truth: {self.truth}, backend: {self.backend_name})")
        for line in table(records):
            tr.write_line(line)
        details = breach_details(records)
        if details:
            tr.write_line("")
            tr.write_line("budget breaches and where the time went:")
            for line in details:
                tr.write_line(line)
        if self.settings.report is not None:
            tr.write_line(f"gpuprof: JSON report written to {self.settings.report}")

    def machine(self) -> dict[str, Any]:
        from pytest_gpuprof.report import machine_record

        return machine_record(self.device.to_dict(), self.truth)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.settings.report is None:
            return
        from pytest_gpuprof.report import build_report, write_json

        write_json(self.settings.report, build_report(self.finished(), self.machine()))

    def close(self) -> None:
        if "sampler" in self.__dict__ and self.sampler is not None:
            self.sampler.stop()
        if self._backend is not None:
            self._backend.close()
            self._backend = None
