"""A test's life inside hypothesis examples: every example's ``measure`` is its own window,
a breach counts only once re-measuring repeats it, an example run again keeps its first
judgement, and an example's device memory must come back when it ends.

Hypothesis is imported only when a test runs inside one of its examples.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_gpuprof.measure.errors import GpuBudgetExceeded, budget_error
from pytest_gpuprof.verdict.budget import Budget, Verdict, judge

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.capture.backends import Backend
    from pytest_gpuprof.measure.windows import Window

# more measurements that must repeat a breach inside an example before it counts
CONFIRMATIONS = 2


def running() -> bool:
    """Whether the caller runs inside a hypothesis example."""
    if "hypothesis" not in sys.modules:
        return False
    from hypothesis import currently_in_test_context

    return bool(currently_in_test_context())


def _example_id() -> int:
    """Which hypothesis example is running (inside one)."""
    from hypothesis.control import current_build_context

    return id(current_build_context())


def _example_choices() -> tuple[Any, ...] | None:
    """The choices hypothesis made for the running example, which identify it when it is
    run again. Hypothesis has no public API for them: this reads ``ConjectureData.choices``
    (hypothesis 6.1xx), and without it judgements are simply not remembered."""
    from hypothesis.control import current_build_context

    choices = getattr(current_build_context().data, "choices", None)
    return tuple(choices) if choices is not None else None


@dataclass(frozen=True, slots=True)
class Checked:
    """One ``gpuprof.check()``: its verdict, the metrics it judged, what it raised, and
    the keys it was asked about (``None``: the test's whole budget)."""

    verdict: Verdict
    metrics: Metrics
    error: GpuBudgetExceeded | None
    asked: frozenset[str] | None
    window: int | None = None  # the index of the window it judged; None: the test so far
    example: bool = False  # it ran inside a hypothesis example


class Examples:
    def __init__(self, backend: Backend, leaks: list[str]) -> None:
        self._backend = backend
        self._leaks = leaks  # the profiler's: a leak is reported with the test
        self._watched: set[int] = set()
        # the example of the latest measure(), and how to measure it again
        self._remeasure: tuple[int, Callable[[], Metrics]] | None = None
        self._judged: dict[tuple[Any, str], tuple[Verdict, Metrics]] = {}
        # the example the test itself was set up inside, if any (a pytest run inside a
        # hypothesis test: pytester): that one is not this test's example
        self._outer = _example_id() if running() else None

    def running(self) -> bool:
        """Whether the caller runs inside one of this test's hypothesis examples."""
        return running() and _example_id() != self._outer

    def remember(self, remeasure: Callable[[], Metrics]) -> None:
        """How to measure the running example's window again, to confirm a breach."""
        self._remeasure = (_example_id(), remeasure)

    def measured_this_one(self) -> bool:
        """Whether the running example (if any) has measured a window."""
        return self._remeasure is not None and self.running() and self._remeasure[0] == _example_id()

    def judgement(self, verdict: Verdict, metrics: Metrics) -> tuple[Verdict, Metrics]:
        """The judgement of the running example, given the ``verdict`` of its window's
        ``metrics``: the verdict that counts (no breach: it keeps the budget) and the
        metrics it was judged on.

        A breach counts once ``CONFIRMATIONS`` more measurements repeat it. When
        hypothesis runs the same example again (to shrink, or to show the failure), it
        gets the judgement the example already had: a window near its threshold, measured
        again, can fall either side, and hypothesis would report that as Flaky.
        """
        choices = _example_choices()
        key = (choices, repr(verdict.budget))
        if choices is not None and key in self._judged:
            return self._judged[key]
        judged = (self._confirm(verdict.budget) if verdict.breached else verdict), metrics
        if choices is not None:
            self._judged[key] = judged
        return judged

    def _confirm(self, budget: Budget) -> Verdict:
        """The verdict of the last of ``CONFIRMATIONS`` more measurements, or the first
        that keeps ``budget``: a noisy near-threshold window would otherwise fail an
        example that passes when hypothesis replays it, which it reports as Flaky."""
        assert self._remeasure is not None
        verdict = Verdict(budget)
        for _ in range(CONFIRMATIONS):
            verdict = judge(budget, self._remeasure[1]())
            if not verdict.breached:
                return verdict
        return verdict

    def check(self, budget: Budget, metrics: Metrics, asked: frozenset[str] | None, window: int | None) -> Checked:
        """A ``gpuprof.check()`` of ``metrics`` (the latest window's, index ``window``, or the
        test's so far) on ``budget``: after the running example's ``measure()``, judged as
        that judges its own budget."""
        verdict = judge(budget, metrics)
        confirmed = self.measured_this_one()
        if confirmed:
            verdict, metrics = self.judgement(verdict, metrics)
        confirmations = CONFIRMATIONS if confirmed else None
        error = budget_error(verdict, metrics, confirmations=confirmations) if verdict.breached else None
        return Checked(verdict, metrics, error, asked, window, self.running())

    def settle(self, window: Window) -> None:
        """Judge the running example's latest ``measure()`` window as it counts: a breach
        confirmed by re-measuring raises (kept as the window's error), one that re-measuring
        cleared is none."""
        verdict, judged = self.judgement(window.verdict, window.metrics)
        window.verdict, window.settled = verdict, True
        if verdict.breached:
            window.error = budget_error(verdict, judged, confirmations=CONFIRMATIONS)
            raise window.error

    def watch_memory(self) -> None:
        """Check, when the running example ends, that its device memory came back (and
        forget how to re-measure it)."""
        from hypothesis.control import cleanup

        context = _example_id()
        if context in self._watched:
            return
        self._watched.add(context)
        before = self._backend.memory_in_use()

        def check() -> None:
            self._remeasure = None
            # buffers freed by their last reference are back already; a full collection
            # (tens of ms in a process holding hypothesis and numpy, in every example) only
            # where some are not: those held in a reference cycle
            if self._backend.memory_in_use() > before:
                gc.collect()
            held = self._backend.memory_in_use() - before
            if held > 0:
                self._leaks.append(f"a hypothesis example kept {held:,} bytes of device memory after it ended")

        cleanup(check)
