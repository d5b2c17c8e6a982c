"""pytest-gpuprof: GPU performance as a test assertion.

The names a test imports: ``GpuBudgetExceeded`` (a breached budget), ``GpuMemoryLeak``
(device memory a test kept), ``GpuBudgetWarning`` (a breach reported without
``--gpu-budget``: ``-W error::pytest_gpuprof.GpuBudgetWarning`` fails on it) and ``Metrics``
(a window's figures). They load lazily, so
that importing the package (as pytest does for its plugin) costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["GpuBudgetExceeded", "GpuBudgetWarning", "GpuMemoryLeak", "Metrics", "__version__"]

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.measure.errors import GpuBudgetExceeded, GpuBudgetWarning, GpuMemoryLeak

_WHERE = {
    "GpuBudgetExceeded": "pytest_gpuprof.measure.errors",
    "GpuBudgetWarning": "pytest_gpuprof.measure.errors",
    "GpuMemoryLeak": "pytest_gpuprof.measure.errors",
    "Metrics": "pytest_gpuprof.analysis.metrics",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'pytest_gpuprof' has no attribute {name!r}")
