"""What a test sees raised or warned when its GPU budget does not hold (the names that
``pytest_gpuprof`` exports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_gpuprof.output.text import failure_message

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.verdict.budget import Breach, Verdict


class GpuBudgetExceeded(AssertionError):
    """A window's metrics breached its budget; the message explains where the time went."""

    def __init__(self, message: str, breaches: list[Breach], metrics: Metrics) -> None:
        super().__init__(message)
        self.breaches = breaches
        self.metrics = metrics


class GpuBudgetWarning(UserWarning):
    """A budget breach in a run without ``--gpu-budget``: reported, not enforced."""


class NotMeasuredError(Exception):
    """A figure read that was never measured (``--gpu-disable``): outside pytest, where the
    pytest layer makes it a skip of the test."""


class GpuMemoryLeak(AssertionError):
    """Device memory a test (or one of its hypothesis examples) took and did not give back."""


def budget_error(verdict: Verdict, metrics: Metrics, *, confirmations: int | None = None) -> GpuBudgetExceeded:
    """The error of a breached ``verdict`` on ``metrics``; ``confirmations``: how many more
    measurements repeated the breach (a hypothesis example's)."""
    breaches = list(verdict.breaches)
    return GpuBudgetExceeded(failure_message(breaches, metrics, confirmations=confirmations), breaches, metrics)
