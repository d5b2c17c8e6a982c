"""What a test item asks of the plugin, as its markers and fixtures read when it runs: its
budget, whether its whole call is measured, whether it uses the device."""

from __future__ import annotations

import pytest

from pytest_gpuprof.harness.config import Settings, marker_budget
from pytest_gpuprof.harness.touch import DEVICE_FIXTURES, FIXTURES
from pytest_gpuprof.verdict.budget import Budget

__all__ = ["budget_of", "measures_whole", "starts_backend", "uses_device"]


def budget_of(settings: Settings, item: pytest.Item) -> Budget:
    """The test's budget as its ``gpu_budget`` markers read now, over the run's: read when
    the test runs, so that a marker a plugin, a hook or ``applymarker`` added after
    collection applies as one written on the function does."""
    markers = list(item.iter_markers("gpu_budget"))
    if not markers:
        return settings.budget
    return marker_budget(item.nodeid, markers, settings.budget)


def measures_whole(settings: Settings, item: pytest.Item) -> bool:
    """A test with a budget and no fixture: its whole call is the window."""
    if settings.disabled or not FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
        return False
    if item.get_closest_marker("gpu_budget") is not None:
        return True
    return settings.enforce and not settings.budget.empty and item.get_closest_marker("gpu") is not None


def uses_device(settings: Settings, item: pytest.Item) -> bool:
    """Whether the test runs device work through the plugin: its fixtures, the ``gpu``
    marker, or a budget that measures its whole call; never one skipped outright (a ``gpu``
    test where there is no CUDA device)."""
    skipped = item.get_closest_marker("skip") is not None
    return not skipped and (item.get_closest_marker("gpu") is not None or starts_backend(settings, item))


def starts_backend(settings: Settings, item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return not DEVICE_FIXTURES.isdisjoint(names) or measures_whole(settings, item)
