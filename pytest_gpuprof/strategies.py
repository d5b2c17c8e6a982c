"""Hypothesis strategies that hit the sizes where transfer and allocator code breaks.

``buffer_sizes`` draws a size (uniform over the range, or log-uniform so that small sizes
come up as often as large ones), then, most of the time, moves it down to the nearest edge
at or below it: a power of two or one byte either side of it, a multiple of an alignment
that copies and allocators care about (256 B DMA, 512 B CuPy pool unit, 4 KiB page, 2 MiB
large page) or one byte either side, an odd size, the range's lower end. The range's ends
come up as hypothesis draws them. Without ``max_bytes`` the top is a quarter of the free
device memory (CUDA) or of the free host memory (host backend).

Edges only ever move a size down, so where a size breaches a budget the size it was moved
from breaches too (budgets on sizes are monotone): hypothesis then drops the move and
shrinks the size itself, to the smallest breaching size, exactly where the breach is
deterministic, whatever the threshold: at, between or far from powers of two.
"""

from __future__ import annotations

import os
from typing import Any

# DMA engines move 256-byte units; CuPy's pool rounds every block to 512 bytes; pages.
ALIGNMENTS = (256, 512, 4096, 2 << 20)
PROFILE = "gpuprof"


def register_profile() -> None:
    """The ``gpuprof`` settings profile: GPU timing has no deadline and few examples, and a
    failing example is not "explained" (hypothesis's last phase runs it again with each part
    varied, tens of measured runs more, to say which parts did not matter: with a size or
    two drawn, the shrunk example says it already). Registered once: again, inside a
    test with settings of its own, hypothesis would warn."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.errors import InvalidArgument

    try:
        settings.get_profile(PROFILE)
        return
    except InvalidArgument:
        pass
    settings.register_profile(
        PROFILE,
        deadline=None,
        max_examples=20,
        phases=[phase for phase in Phase if phase is not Phase.explain],
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
        print_blob=True,
    )


# after register_profile: where this module is what first imports hypothesis, hypothesis's
# import runs its entry points, this module's register_profile among them, before the
# line below returns (the function imports what it needs itself)
try:
    from hypothesis import strategies as st
except ImportError as e:  # an extra: the plugin itself never needs hypothesis
    raise ImportError("pytest_gpuprof.strategies needs hypothesis: pip install 'pytest-gpuprof[hypothesis]'") from e


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
        log_uniform = st.integers(min_bytes.bit_length(), top.bit_length()).flatmap(
            lambda bits: st.integers(max(min_bytes, 1 << (bits - 1)), min(top, (1 << bits) - 1))
        )
        # the size first, the move after it: hypothesis shrinks the move to "as drawn" first
        sized = st.tuples(st.one_of(st.integers(min_bytes, top), log_uniform), st.sampled_from(EDGES))
        drawn = sized.map(lambda pair: snap(pair[1], pair[0], min_bytes))
        if align is None:
            return drawn
        return drawn.map(lambda n: _aligned(n, align, min_bytes)).filter(lambda n: n <= top)

    return st.deferred(build)


# how a drawn size moves down to an edge: "as drawn" first (the one shrinking ends on),
# and twice, so that a third of the sizes are plain ones
EDGES = (
    "as drawn",
    "as drawn",
    "power of two",
    "one short of a power of two",
    "one past a power of two",
    *(
        f"{how}{unit}"
        for unit in ALIGNMENTS
        for how in ("multiple of ", "one short of a multiple of ", "one past a multiple of ")
    ),
    "odd",
    "lower end",
)


def snap(edge: str, n: int, lo: int = 1) -> int:
    """The largest size at or below ``n`` (and at least ``lo``) that ``edge`` names; ``n``
    where there is none."""
    if edge == "lower end":
        return lo
    power = 1 << (n.bit_length() - 1)  # the largest power of two at or below n
    if edge == "power of two":
        moved = power
    elif edge == "one short of a power of two":
        moved = (power << 1) - 1 if (power << 1) - 1 <= n else power - 1
    elif edge == "one past a power of two":
        moved = power + 1 if power + 1 <= n else (power >> 1) + 1
    elif edge == "odd":
        moved = n if n % 2 else n - 1
    elif edge.startswith(("multiple of ", "one short of a multiple of ", "one past a multiple of ")):
        unit = int(edge.rsplit(" ", 1)[1])
        offset = {"multiple": 0, "one short": -1, "one past": 1}[edge.split(" of ")[0].removesuffix(" a multiple")]
        moved = (n - offset) // unit * unit + offset
        moved = moved if moved > max(offset, 0) else n
    else:
        return n
    return moved if lo <= moved <= n else n


def _aligned(n: int, align: int, lo: int) -> int:
    """``n`` down to a multiple of ``align``, or the first multiple at or above ``lo``."""
    down = n // align * align
    return down if down >= lo and down > 0 else -(-max(lo, 1) // align) * align


def partition_counts(max_partitions: int = 16) -> Any:
    """Partition counts for ``partitions(n=...)``: 1, 2, workers-adjacent counts, the rest."""
    return st.one_of(st.sampled_from([1, 2, 3, max_partitions]), st.integers(1, max_partitions))


register_profile()
