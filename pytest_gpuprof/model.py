"""The timeline of one measured window: host spans, device intervals, hardware samples.

Plain frozen data, all times in integer nanoseconds of the host's monotonic clock
(``time.perf_counter_ns``). Backends produce these; ``metrics`` consumes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, overload

import numpy as np

from pytest_gpuprof.occupancy import SmLimits

UNATTRIBUTED = "unattributed"
# how a note starts when the measurement lost device records (the window undercounts)
RECORDS_LOST = "records lost: "
NS_PER_MS = 1_000_000
Truth = Literal["cupti", "events", "host"]
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


# one ``DeviceWork`` row: ``DeviceInterval``'s fields, the kind and name as indices (into
# ``KINDS`` and ``DeviceWork.names``), ``span_id`` -1 where no backend tagged the work
ROW = np.dtype(
    [
        ("kind", np.int8),
        ("start", np.int64),
        ("end", np.int64),
        ("stream", np.int64),
        ("name", np.int32),
        ("bytes", np.int64),
        ("pageable", np.bool_),
        ("span_id", np.int64),
        ("thread", np.int64),
        ("issued", np.int64),
        ("blocks", np.int64),
        ("threads", np.int64),
        ("registers", np.int64),
        ("shared", np.int64),
    ]
)
NO_SPAN = -1


class DeviceWork(Sequence[DeviceInterval]):
    """Device intervals as columns: one numpy row each (``ROW``), the names apart.

    A window can hold a hundred thousand kernels; CUPTI's records become rows with no
    Python object per record, and the metrics read whole columns (``rows["start"]``).
    Indexing or iterating still gives ``DeviceInterval``s, made on demand, for code that
    reads a few of them (the HTML, tests).
    """

    __slots__ = ("names", "rows")

    def __init__(self, rows: np.ndarray | None = None, names: Sequence[str] = ()) -> None:
        self.rows = np.empty(0, dtype=ROW) if rows is None else rows
        self.names = tuple(names)

    @classmethod
    def of(cls, intervals: Iterable[DeviceInterval]) -> DeviceWork:
        """The rows of ``intervals`` (a ``DeviceWork`` is returned as it is)."""
        if isinstance(intervals, DeviceWork):
            return intervals
        names: dict[str, int] = {}
        rows = [
            (
                KINDS.index(d.kind),
                d.start,
                d.end,
                d.stream,
                names.setdefault(d.name, len(names)),
                d.bytes,
                d.pageable,
                NO_SPAN if d.span_id is None else d.span_id,
                *d[8:],
            )
            for d in intervals
        ]
        return cls(np.array(rows, dtype=ROW), tuple(names))

    @classmethod
    def join(cls, parts: Iterable[DeviceWork]) -> DeviceWork:
        """The rows of ``parts`` one after another, their names merged."""
        kept = [p for p in parts if len(p)]
        if len(kept) <= 1:
            return kept[0] if kept else cls()
        if all(p.names == kept[0].names for p in kept):  # one window's parts, or buffers of one kernel
            return cls(np.concatenate([p.rows for p in kept]), kept[0].names)
        names: dict[str, int] = {}
        pieces = []
        for part in kept:
            renamed = np.array([names.setdefault(n, len(names)) for n in part.names], dtype=np.int32)
            rows = part.rows.copy()
            rows["name"] = renamed[rows["name"]]
            pieces.append(rows)
        return cls(np.concatenate(pieces), tuple(names))

    def where(self, selected: np.ndarray) -> DeviceWork:
        """The rows a boolean mask or an index array selects (itself, where a mask keeps
        every row: the rows are not copied)."""
        if selected.dtype == np.bool_ and selected.all():
            return self
        return DeviceWork(self.rows[selected], self.names)

    def of_kind(self, kind: DeviceKind) -> np.ndarray:
        """A mask of the rows of ``kind``."""
        return self.rows["kind"] == KINDS.index(kind)

    def spans(self) -> np.ndarray:
        """(n, 2) starts and ends, as ``intervals`` takes them."""
        return np.stack([self.rows["start"], self.rows["end"]], axis=1)

    def inside(self, window: tuple[int, int]) -> np.ndarray:
        """Each row's time inside ``window``, in ns (0 for rows outside it)."""
        lo, hi = window
        return np.maximum(np.minimum(self.rows["end"], hi) - np.maximum(self.rows["start"], lo), 0)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> DeviceInterval: ...
    @overload
    def __getitem__(self, index: slice) -> DeviceWork: ...
    def __getitem__(self, index: int | slice) -> DeviceInterval | DeviceWork:
        if isinstance(index, slice):
            return self.where(np.arange(len(self))[index])
        return self._interval(self.rows[index].tolist())

    def __iter__(self) -> Iterator[DeviceInterval]:
        return map(self._interval, self.rows.tolist())

    def _interval(self, row: tuple) -> DeviceInterval:
        kind, start, end, stream, name, nbytes, pageable, span_id, *rest = row
        span = None if span_id == NO_SPAN else span_id
        return DeviceInterval(KINDS[kind], start, end, stream, self.names[name], nbytes, pageable, span, *rest)

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same intervals, in the same order."""
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable rows: not hashable

    def __repr__(self) -> str:
        return f"DeviceWork({list(self)!r})"


@dataclass(frozen=True, slots=True)
class Sample:
    """One hardware reading: NVML utilization (0..1), power (W), memory used (bytes)."""

    time: int
    util: float | None = None
    power_w: float | None = None
    mem_used_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything known about one window ``[start, end)``."""

    start: int
    end: int
    truth: Truth
    steps: tuple[Span, ...] = ()
    regions: tuple[Span, ...] = ()
    # a sequence of ``DeviceInterval``s is taken too, and held as ``DeviceWork``
    device: DeviceWork = field(default_factory=DeviceWork)
    samples: tuple[Sample, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # the device's SMs, where the backend knows them (for ``sm_utilization``)
    sm: SmLimits | None = None
    # NVML GPM's metrics between the window's edges (fractions), where the GPU has GPM
    gpm: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device, DeviceWork):
            object.__setattr__(self, "device", DeviceWork.of(self.device))
