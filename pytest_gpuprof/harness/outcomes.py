"""Each test's outcome as pytest's reports give it: the final run's where a rerun plugin
repeated the test, how many runs it took, the views xdist workers sent with their reports,
and the tests whose worker died."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gpuprof.output.views import TestView

__all__ = ["Outcomes"]


class Outcomes:
    def __init__(self) -> None:
        self.final: dict[str, tuple[str, bool]] = {}  # every test run here: outcome, xfail
        self.runs: dict[str, int] = {}  # how many times each test's set-up ran (a rerun plugin repeats it)
        self.views: dict[str, TestView] = {}  # every measured test, from here or the workers
        self.crashed: dict[str, str] = {}  # tests whose xdist worker died

    def words(self) -> dict[str, str]:
        """Every test this process (or its workers) ran, by its outcome as pytest's last line
        says it: passed, failed, skipped, xfailed, xpassed. What ``gpuprof ab`` reads to judge
        a pull request whole: a failed test fails it, whatever its figures."""
        out = {}
        for nodeid, (outcome, xfail) in self.final.items():
            if xfail:
                outcome = "xfailed" if outcome == "skipped" else ("xpassed" if outcome == "passed" else outcome)
            out[nodeid] = outcome
        return out

    def of(self, nodeid: str, default: str = "passed") -> tuple[str, bool]:
        return self.final.get(nodeid, (default, False))

    def reruns(self, nodeid: str) -> int:
        return self.runs.get(nodeid, 1) - 1

    def set_up(self, nodeid: str) -> bool:
        """A set-up begins: whether it is a rerun of the test."""
        self.runs[nodeid] = self.runs.get(nodeid, 0) + 1
        return self.runs[nodeid] > 1

    def made(self, nodeid: str, when: str, report: pytest.TestReport) -> None:
        """The outcome as the report is made: a rerun plugin logs its reports only after
        the whole run (and renames a repeated run's), so the log may not have said it yet."""
        if when == "call" or (when == "setup" and report.outcome != "passed"):
            self.final[nodeid] = (report.outcome, hasattr(report, "wasxfail"))
        if when == "teardown" and report.failed:  # an error in tear-down (a leak, a fixture) fails the test
            self.final[nodeid] = ("failed", self.of(nodeid)[1])

    def logged(self, report: pytest.TestReport) -> None:
        if report.outcome == "rerun":
            return  # a rerun plugin's name for a run it repeats: the final run's outcome counts
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.final[report.nodeid] = (report.outcome, hasattr(report, "wasxfail"))
        elif report.when == "teardown" and report.outcome == "failed":
            self.final.setdefault(report.nodeid, ("failed", False))
        view: Any = getattr(report, "gpuprof", None)
        if isinstance(view, dict):
            self.views[report.nodeid] = TestView.from_dict(view)
        if report.failed and (report.when == "???" or "crashed while running" in str(report.longrepr)):
            # pytest-xdist's report for the test a worker was running when it died
            self.crashed[report.nodeid] = str(report.longrepr).strip().splitlines()[-1][:300]
