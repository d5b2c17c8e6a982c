"""What the host was running while the device idled and no step explains why: sampled
Python stacks charged against the unattributed idle. Pure functions over plain data.

The sampler takes rounds: at one instant, each thread's stack (``HostSample``). A round
stands for the time since the round before it, for at most ``reach`` nanoseconds (a
sampler held off longer than that says nothing of the gap). Backwards, because a sampler
that wakes while another thread holds the GIL gets it only when that thread lets go (at
the interpreter's switch interval, 5 ms by default): the gap it waited through is the
holder's, and the holder is what the round sees. The idle inside a round's time is split
evenly among the threads it saw, each share to where that thread was; idle after the last
round, or beyond a round's reach, stays unexplained. The figures explain
``unattributed_ms``; they never change it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis.model import HostSample

# a round says nothing of the host more than this before it was taken (100 ms)
REACH_NS = 100_000_000


@dataclass(frozen=True, slots=True)
class Piece:
    """A stretch of unexplained idle and where the sampled threads were then (nanoseconds
    of the stretch per place, adding up to its length)."""

    start: int
    end: int
    shares: dict[str, float]


def pieces(
    samples: Sequence[HostSample],
    idle: Sequence[iv.Interval] | np.ndarray,
    threads: Collection[int] | None = None,
    reach: int = REACH_NS,
) -> list[Piece]:
    """The idle (sorted, disjoint) cut by the rounds of ``samples`` of ``threads`` (all
    threads where ``None``): one piece per round's time and idle stretch that meet, in
    time order."""
    rounds: dict[int, list[str]] = defaultdict(list)
    for sample in samples:
        if threads is None or sample.thread in threads:
            rounds[sample.time].append(sample.where)
    if not rounds or not len(idle):
        return []
    times = sorted(rounds)
    starts = [max(earlier, at - reach) for at, earlier in zip(times, [times[0] - reach, *times[:-1]], strict=True)]
    spans = np.asarray(idle, dtype=np.int64).reshape(-1, 2).tolist()
    out: list[Piece] = []
    k = 0
    for start, at in zip(starts, times, strict=True):
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        where = rounds[at]
        j = k
        while j < len(spans) and spans[j][0] < at:
            lo, hi = max(start, spans[j][0]), min(at, spans[j][1])
            if hi > lo:
                shares: dict[str, float] = defaultdict(float)
                for place in where:
                    shares[place] += (hi - lo) / len(where)
                out.append(Piece(lo, hi, dict(shares)))
            j += 1
    return out


def totals(cut: Sequence[Piece]) -> list[tuple[str, float]]:
    """The pieces' nanoseconds per place, largest first (ties by name)."""
    out: dict[str, float] = defaultdict(float)
    for piece in cut:
        for place, ns in piece.shares.items():
            out[place] += ns
    return sorted(out.items(), key=lambda item: (-item[1], item[0]))
