"""The timeline of one measured window: host spans, device intervals, hardware samples.

Plain frozen data, all times in integer nanoseconds of the host's monotonic clock
(``time.perf_counter_ns``). Backends produce these; ``metrics`` consumes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

UNATTRIBUTED = "unattributed"
# how a note starts when the measurement lost device records (the window undercounts)
RECORDS_LOST = "records lost: "
NS_PER_MS = 1_000_000
GIB = 1 << 30  # binary units, as GPU memory is counted
MIB = 1 << 20
Truth = str  # the name of the capture source that measured a window (analysis.sources)
DeviceKind = Literal["kernel", "memcpy", "memset"]
KINDS: tuple[DeviceKind, ...] = ("kernel", "memcpy", "memset")  # a ``DeviceWork`` row's kind is an index here


@dataclass(frozen=True, slots=True)
class Span:
    """A host step or region: what the code says it is doing, on one thread (``thread``:
    its native id, as the operating system and CUPTI name it)."""

    name: str
    thread: int
    start: int
    end: int
    depth: int = 0
    span_id: int = 0
    bytes: int | None = None
    pageable: bool = False
    stream: int | None = None


class DeviceInterval(NamedTuple):
    """Something the device did: a kernel, a copy or a memset, on one stream.

    Which host step issued it (``attribution.issuers``): ``span_id`` where the backend tagged
    it as it was submitted; else ``thread`` and ``issued``, the native id of the thread
    that made the launch or copy call and the host time of that call (from CUPTI's API
    records), whose innermost open step is the issuer; else, for a copy, the step open
    on its ``stream`` when the copy started.

    A named tuple, not a frozen dataclass like the rest: a window can hold a hundred
    thousand of these, and a tuple is made several times faster.
    """

    kind: DeviceKind
    start: int
    end: int
    stream: int = 0
    name: str = ""
    bytes: int = 0
    pageable: bool = False
    span_id: int | None = None
    thread: int = 0
    issued: int = 0
    # a kernel's geometry (CUPTI): blocks in its grid, threads per block, registers per
    # thread, shared memory per block in bytes; 0 where not known
    blocks: int = 0
    threads: int = 0
    registers: int = 0
    shared: int = 0


@dataclass(frozen=True, slots=True)
class Sample:
    """One hardware reading: NVML utilization (0..1), power (W), memory used (bytes)."""

    time: int
    util: float | None = None
    power_w: float | None = None
    mem_used_bytes: int | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: int | None = None  # NVML's clock event reasons (a bitmask)


class HostSample(NamedTuple):
    """Where one thread of the host was at one instant: a sampled Python stack, cut to the
    innermost frame of the user's code and the library function under it (``where``).
    One sampling round stamps each thread it saw with the round's ``time``."""

    time: int
    thread: int
    where: str


class MemoryMark(NamedTuple):
    """Device memory at one edge (a window's, a step's). Edges and allocations are ordered
    by ``seq``, one count for both (host stamps can tie: the host backend's virtual clock
    gives host code no time). The bytes held now, the most held since the mark before
    (``peak_seq``: the allocation that reached it, where the source sees each one), what the
    process had reserved from the driver now and at most since the mark before (``None``:
    not known), and the steps open after this edge (their span ids). ``peak_low``: where
    the source knows the peak since the mark before only as a range, its least (``peak``
    its most); ``None``: ``peak`` is exact."""

    seq: int
    time: int
    held: int
    peak: int
    peak_seq: int | None = None
    reserved: int | None = None
    reserved_peak: int | None = None
    open: tuple[int, ...] = ()
    peak_low: int | None = None


class Allocation(NamedTuple):
    """One allocation the source saw: made at ``seq``, freed at ``end_seq`` (``None``: not
    yet), its size, the place in the user's code that made it, and the innermost step open
    on its thread then (its span id)."""

    seq: int
    end_seq: int | None
    nbytes: int
    where: str
    span_id: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryLog:
    """A window's memory marks, from ``source``; the allocations of the sources that see
    each one (``None``: none does; ``every``: all of them do), and a note on what they
    cannot see."""

    source: str
    marks: tuple[MemoryMark, ...]
    allocations: tuple[Allocation, ...] | None = None
    note: str | None = None
    every: bool = True


# a copy's direction, from its name as CUPTI (``ActivityMemcpyKind``) and the host backend
# give it; "A" is a CUDA array, on the device. A copy whose direction the source does not
# tell (CUDA events at the edges of a step that declared ``bytes=``) has none.
CopyDirection = Literal["h2d", "d2h", "d2d", "p2p", "h2h"]
DIRECTIONS: dict[str, CopyDirection] = {
    "HTOD": "h2d",
    "HTOA": "h2d",
    "DTOH": "d2h",
    "ATOH": "d2h",
    "DTOD": "d2d",
    "DTOA": "d2d",
    "ATOD": "d2d",
    "ATOA": "d2d",
    "PTOP": "p2p",
    "HTOH": "h2h",
}


def copy_direction(name: str) -> CopyDirection | None:
    return DIRECTIONS.get(name.upper())
