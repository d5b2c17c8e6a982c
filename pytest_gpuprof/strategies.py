"""Hypothesis strategies that hit the sizes where transfer and allocator code breaks.

``buffer_sizes`` draws, besides plain integers in range: powers of two and their
neighbours (2^k - 1, 2^k + 1), multiples of the alignments that copies and allocators
care about (256 B DMA, 512 B CuPy pool unit, 4 KiB page, 2 MiB large page) and one byte
either side of them, odd sizes, and the range's own ends. Without ``max_bytes`` the top
is a quarter of the free device memory (CUDA) or of the free host memory (host backend).
"""

from __future__ import annotations

import os
from typing import Any

try:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
except ImportError as e:  # an extra: the plugin itself never needs hypothesis
    raise ImportError("pytest_gpuprof.strategies needs hypothesis: pip install 'pytest-gpuprof[hypothesis]'") from e

# DMA engines move 256-byte units; CuPy's pool rounds every block to 512 bytes; pages.
ALIGNMENTS = (256, 512, 4096, 2 << 20)
PROFILE = "gpuprof"


def register_profile() -> None:
    """The ``gpuprof`` settings profile: GPU timing has no deadline and few examples."""
    settings.register_profile(
        PROFILE,
        deadline=None,
        max_examples=20,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
        print_blob=True,
    )


def free_memory_bytes() -> int:
    """Free device memory where CuPy sees a device, else free host memory."""
    try:
        import cupy

        free, _total = cupy.cuda.runtime.memGetInfo()
        return int(free)
    except Exception:
        pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 1 << 18
        return int(pages * os.sysconf("SC_PAGE_SIZE"))


def buffer_sizes(min_bytes: int = 1, max_bytes: int | None = None, *, align: int | None = None) -> Any:
    """Byte counts in ``[min_bytes, max_bytes]``, weighted towards the sizes that break things.

    ``align``: draw only multiples of it (a kernel that needs whole float4 vectors, say).
    """
    if min_bytes < 1:
        raise ValueError(f"buffer_sizes(min_bytes={min_bytes}): must be at least 1")
    if align is not None and align < 1:
        raise ValueError(f"buffer_sizes(align={align}): must be at least 1")

    def build() -> Any:
        top = max_bytes if max_bytes is not None else max(min_bytes, free_memory_bytes() // 4)
        if top < min_bytes:
            raise ValueError(f"buffer_sizes: max_bytes={top} is below min_bytes={min_bytes}")
        edges = sorted(e for e in _edges(min_bytes, top) if min_bytes <= e <= top)
        plain = st.integers(min_bytes, top)
        odd = plain.map(lambda n: n | 1).filter(lambda n: n <= top)
        log_uniform = st.integers(min_bytes.bit_length(), top.bit_length()).flatmap(
            lambda bits: st.integers(max(min_bytes, 1 << (bits - 1)), min(top, (1 << bits) - 1))
        )
        drawn = st.one_of(st.sampled_from(edges), st.sampled_from(edges), log_uniform, odd, plain)
        if align is None:
            return drawn
        return drawn.map(lambda n: max(align, n // align * align)).filter(lambda n: min_bytes <= n <= top)

    return st.deferred(build)


def _edges(lo: int, hi: int) -> set[int]:
    edges = {lo, hi, lo + 1, hi - 1}
    for bit in range(hi.bit_length() + 1):
        power = 1 << bit
        edges.update((power - 1, power, power + 1))
    for unit in ALIGNMENTS:
        for k in (1, 2, 3, 7):
            edges.update((k * unit - 1, k * unit, k * unit + 1))
    return edges


def partition_counts(max_partitions: int = 16) -> Any:
    """Partition counts for ``partitions(n=...)``: 1, 2, workers-adjacent counts, the rest."""
    return st.one_of(st.sampled_from([1, 2, 3, max_partitions]), st.integers(1, max_partitions))


register_profile()
