"""Device intervals as columns: ``DeviceWork``, a numpy table with one row per kernel,
copy or memset, the form a window's device work takes from the backends to the metrics.

Its own module, apart from ``model``, so that loading the plugin does not import numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

from pytest_gpuprof.analysis.model import KINDS, DeviceInterval, DeviceKind

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
