"""JAX's device memory: which way it can be read, and its allocator's own statistics.

Under JAX's default allocator (a pool, preallocated or grown and never shrunk) the driver
never sees what JAX's code holds; JAX's allocator counts it (``device.memory_stats()``:
``bytes_in_use``, ``peak_bytes_in_use``), cheaply (1.4 us a call, measured), but keeps one
peak for the whole process, with nothing to reset it. ``JaxStats`` reads both at every
edge: where the process's peak rose between two edges, the stretch's peak is that peak,
exactly; where it did not, the stretch's peak lies between what was held at its edges and
the process's peak (``Reading.peak_low``), and a budget is judged only where the whole
range falls on one side of it. A stretch's allocations and their places are not seen.

Under the platform allocator (each array its own mapping) the driver's allocation calls
see every array (``driver_memory``), exactly and with the line that made it, for a Python
callback on each call: followed only where the test gates memory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from pytest_gpuprof.capture.driver_memory import DriverSource
from pytest_gpuprof.capture.memory_sources import MemorySource, Reading

PLATFORM = "set XLA_PYTHON_CLIENT_ALLOCATOR=platform to measure it"
STATS = (
    "read from JAX's allocator statistics on its first device at the edges: no allocation or its place is "
    "seen, and a stretch's peak is exact only where the process's peak rose in it (JAX keeps one peak for "
    "the process); XLA_PYTHON_CLIENT_ALLOCATOR=platform gives exact peaks and the places"
)
UNGATED = (
    "JAX's memory is read from the driver's allocation calls only where a memory budget asks for it "
    "(following them doubled a loop of small JAX steps on the H200)"
)


def jax_started() -> bool:
    """Whether JAX has started a GPU backend in this process (it holds device memory only then)."""
    if "jax" not in sys.modules:
        return False
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None)
    if isinstance(backends, dict):
        return any(name in backends for name in ("cuda", "gpu", "rocm"))
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started()) if callable(started) else True  # cannot tell: assume it has


def jax_pool() -> str | None:
    """Why JAX's memory cannot be read from the driver, from its allocator's settings
    (``None``: each array is its own allocation, which the driver sees)."""
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
    if allocator in ("platform", "cuda_async"):
        return None
    if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0"):
        return "JAX preallocated most of the device for its pool: what its code held in it is not seen"
    return "JAX's pool grows and never shrinks, and what its code held in it is not seen"


class JaxStats:
    """JAX's pool on one device, from its allocator's statistics (the module docstring)."""

    name = "jax"
    sees_each = False
    note = STATS
    failed: str | None = None

    def __init__(self, device: Any) -> None:
        self._device = device
        self._held, self._peak, _ = self._stats()

    @classmethod
    def of(cls, jax: Any) -> JaxStats | None:
        """The source for JAX's first GPU, ``None`` where its allocator keeps no statistics."""
        try:
            try:
                devices = jax.local_devices(backend="gpu")
            except Exception:  # an older JAX, or no backend by that name: its default one
                devices = jax.local_devices()
            return cls(devices[0])
        except Exception:  # no device, or no ``bytes_in_use`` in its statistics
            return None

    def _stats(self) -> tuple[int, int, int | None]:
        stats = self._device.memory_stats()
        pool = stats.get("pool_bytes")
        return int(stats["bytes_in_use"]), int(stats["peak_bytes_in_use"]), None if pool is None else int(pool)

    def read(self) -> Reading:
        try:
            held, peak, pool = self._stats()
        except Exception as e:  # the backend gone (a test that shut JAX down): said, never raised into the test
            self.failed = f"JAX's memory statistics could not be read ({type(e).__name__}: {e})"
            return Reading(self._held, self._peak)
        rose = peak > self._peak  # the process's peak was reached since the last read: exactly this stretch's
        low = max(held, self._held)
        self._held, self._peak = held, peak
        return Reading(held, peak, None, pool, pool, None if rose or low >= peak else low)

    def edge(self, seq: int, *, step: bool = False) -> None:
        pass

    def settle(self, step_of: Callable[[int], int | None]) -> dict[int, Reading] | None:
        return None

    def taken(self, lo: int, hi: int) -> list[Any]:
        return []

    def forget(self) -> None:
        pass

    def held_now(self) -> int:
        return self._stats()[0]

    def live_seqs(self) -> frozenset[int] | None:
        return None

    def close(self) -> None:
        pass


def for_jax(tick: Callable[[], int], *, gated: bool) -> tuple[MemorySource | None, str | None]:
    """The source that reads JAX's device memory, or why there is none: its statistics
    under its own pool; the driver's calls under the platform allocator, where ``gated``
    (each allocation costs a Python callback there: only tests that gate memory pay it)."""
    why = jax_pool()
    if why is not None:
        stats = JaxStats.of(sys.modules["jax"])
        return (
            (stats, None) if stats is not None else (None, f"{why}, and its allocator keeps no statistics ({PLATFORM})")
        )
    if not gated:
        return None, UNGATED
    try:
        from cupti import cupti
    except ImportError:
        return None, "JAX's memory is read from the driver through cupti-python, which is not installed"
    try:
        return DriverSource(tick, cupti), None
    except Exception as e:  # another CUPTI subscriber (a profiler) in this process
        return None, f"the driver's allocation calls could not be followed ({e})"
