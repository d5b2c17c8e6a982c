"""pytest-gpuprof: GPU performance as a test assertion.

The names a test imports: ``GpuBudgetExceeded`` (a breached budget), ``GpuMemoryLeak``
(device memory a test kept) and ``Metrics`` (a window's figures). They load lazily, so
that importing the package (as pytest does for its plugin) costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["GpuBudgetExceeded", "GpuMemoryLeak", "Metrics", "__version__"]

if TYPE_CHECKING:
    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.harness.profiler import GpuBudgetExceeded
    from pytest_gpuprof.harness.session import GpuMemoryLeak

_WHERE = {
    "GpuBudgetExceeded": "pytest_gpuprof.harness.profiler",
    "GpuMemoryLeak": "pytest_gpuprof.harness.session",
    "Metrics": "pytest_gpuprof.analysis.metrics",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'pytest_gpuprof' has no attribute {name!r}")
