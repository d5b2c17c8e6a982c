"""The ``cuda`` backend's kernels: FFTs and matmuls sized once to known device times.

Inputs, outputs and FFT plans are made once: a kernel that allocated its output could
reach cudaMalloc, which may wait for the whole device, the other worker's copies too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("fft", "matmul")
LARGE_MS, SMALL_MS = 1.0, 0.1


@dataclass(frozen=True, slots=True)
class Kernel:
    launch: Callable[[], None]
    ms: float


def _fft(cp: Any, batch: int) -> Callable[[], None]:
    from cupy.cuda import cufft
    from cupyx.scipy.fftpack import get_fft_plan

    data = cp.ones((batch, 1 << 20), dtype=cp.complex64)
    out = cp.empty_like(data)
    plan = get_fft_plan(data, axes=(-1,), value_type="C2C")
    return lambda: plan.fft(data, out, cufft.CUFFT_FORWARD)


def _matmul(cp: Any, n: int) -> Callable[[], None]:
    data = cp.ones((n, n), dtype=cp.float32)
    out = cp.empty_like(data)
    return lambda: cp.matmul(data, data, out=out)


class Kernels:
    """Each kind's large and small kernel, sized on first use (``prepare`` does it before
    any window)."""

    def __init__(self, cp: Any, device: Any) -> None:
        self._cp = cp
        self._device = device
        self._units: dict[str, tuple[Kernel, Kernel]] = {}

    def sizes(self, kind: str) -> tuple[Kernel, Kernel]:
        """A large and a small kernel of ``kind``, each with its device time in ms.

        Python launches a kernel in tens of microseconds, so kernels of a fraction of a
        millisecond leave the device waiting for the host: ``compute`` launches ~1 ms
        kernels and tops up the remainder with ~0.1 ms ones. ``fft``: batched 2^20-point
        complex64 FFTs (an NTT stand-in, memory-bound); ``matmul``: fp32 products of
        4096^2 and 1024^2 (compute-bound).
        """
        if kind in self._units:
            return self._units[kind]
        cp = self._cp
        with self._device:
            if kind == "fft":
                row_ms = self._time(_fft(cp, 16)) / 16
                large = _fft(cp, max(1, round(LARGE_MS / row_ms)))
                small = _fft(cp, max(1, round(SMALL_MS / row_ms)))
            elif kind == "matmul":
                large, small = _matmul(cp, 4096), _matmul(cp, 1024)
            else:
                raise ValueError(f"compute(kind={kind!r}): kind must be one of {', '.join(KINDS)}")
            sizes = (Kernel(large, self._time(large)), Kernel(small, self._time(small)))
        self._units[kind] = sizes
        return sizes

    def _time(self, launch: Callable[[], None]) -> float:
        """Device time of one launch in ms: 10 back-to-back launches between events, after 2."""
        cp = self._cp
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            for _ in range(2):
                launch()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            for _ in range(10):
                launch()
            end.record(stream)
            end.synchronize()
        return float(cp.cuda.get_elapsed_time(start, end)) / 10
