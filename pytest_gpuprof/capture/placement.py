"""Which GPU a pytest-xdist worker uses: spread over the GPUs the caller lets it see,
before anything in the worker starts CUDA.

The caller's ``CUDA_VISIBLE_DEVICES`` is respected (its entries, in its order: indices,
UUIDs or MIG ids); without it, every GPU NVML counts. Worker i is given entry i mod their
number (of those ``--gpu-devices`` names, where given) by narrowing its own
``CUDA_VISIBLE_DEVICES`` to that one: PyTorch's, CuPy's and JAX's device 0 in the worker,
and the plugin's, are then the same GPU. Two workers on one GPU still take turns on it
(``--gpu-exclusive``): the lock is keyed by the GPU's UUID. A run that only has the plugin
installed (no ``--gpu-*`` option, no ``[tool.gpuprof]``) is never spread: its workers keep
every GPU, as multi-GPU tests need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class Placement:
    """A worker's GPU: its entry of the caller's list, and where it stands in that list."""

    entry: str
    number: int
    visible: tuple[str, ...]

    def describe(self, worker: str) -> str:
        return (
            f"gpuprof: xdist worker {worker} on GPU {self.entry} of {','.join(self.visible)} "
            f"({VISIBLE}={self.entry} in the worker)"
        )


def visible(environ: Mapping[str, str], count: Callable[[], int | None]) -> tuple[str, ...]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them: the caller's
    list (CUDA reads it up to its first empty entry), else each GPU ``count`` finds."""
    given = environ.get(VISIBLE)
    if given is not None:
        entries = []
        for entry in given.split(","):
            if not entry.strip():
                break
            entries.append(entry.strip())
        return tuple(entries)
    return tuple(str(i) for i in range(count() or 0))


def place(worker: int, gpus: tuple[str, ...], devices: tuple[int, ...] | str | None) -> Placement | None:
    """Worker ``worker``'s GPU among ``gpus`` (``devices``: ``--gpu-devices``, positions in
    that list); None where there is nothing to spread (one GPU or none)."""
    if devices is None or isinstance(devices, str):  # every GPU ("all", or not given)
        if len(gpus) < 2:
            return None
        numbers = list(range(len(gpus)))
    else:
        numbers = [i for i in devices if i < len(gpus)]
        if not numbers:
            return None
    number = numbers[worker % len(numbers)]
    return Placement(gpus[number], number, gpus)


def nvml_count() -> int | None:
    """How many GPUs NVML sees (no CUDA context is made); None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return None
