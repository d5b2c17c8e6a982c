"""How much of the GPU the kernels of a window used: ``sm_utilization`` and the top
kernels, from each kernel's geometry (``occupancy``). Pure code.

``sm_utilization`` is the window's kernel time weighted by the fraction of SMs each
kernel's grid covered, over the wall time, and never more than ``utilization``: it equals
``utilization`` for kernels that fill the GPU, and about 1/132 of it for a one-block
kernel on an H200. A step's ``sm_utilization`` is the same weighting over its own
kernels' time: how full the GPU was while they ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pytest_gpuprof.analysis import intervals as iv
from pytest_gpuprof.analysis.device_work import DeviceWork
from pytest_gpuprof.analysis.model import NS_PER_MS, Span
from pytest_gpuprof.analysis.names import readable, short_names
from pytest_gpuprof.analysis.occupancy import Geometry, SmLimits, coverage, occupancy

TOP = 5


@dataclass(frozen=True, slots=True)
class KernelSummary:
    """One kernel name's launches in a window (the geometry of the longest launch)."""

    name: str  # demangled, as a person reads it
    count: int
    total_ms: float
    blocks: int
    threads: int
    sm_coverage: float | None
    occupancy: float | None
    mangled: str = ""  # as the linker sees it: what matches a kernel across runs
    short: str = ""  # at most 80 characters, unique within the window: what lines and labels show
    step: str = ""  # the step whose launches of it took the most time ("": no step issued it)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def unseen(kernels: DeviceWork, sm: SmLimits | None, reason: str) -> str | None:
    """Why the kernels' SM use is not known, or ``None`` when it is."""
    if sm is None:
        return reason
    if (kernels.rows["threads"] <= 0).any():
        return "some kernel records carry no geometry (grid, block): read as cupti-python's objects"
    return None


_SHAPE = ("blocks", "threads", "registers", "shared")


@dataclass(frozen=True, slots=True)
class Steps:
    """Each kernel row's issuing step: an index into ``names``, -1 where no step issued it."""

    index: np.ndarray
    names: tuple[str, ...]


def _most_step(group: np.ndarray, n_names: int, inside: np.ndarray, steps: Steps | None) -> np.ndarray:
    """For each kernel name, the step whose launches of it took the most time in the
    window (an index into ``steps.names``; -1 where no step issued any of it): one pass."""
    if steps is None or len(steps.index) != len(group) or not steps.names:
        return np.full(n_names, -1, dtype=np.int64)
    width = len(steps.names) + 1  # column 0: no step
    spent = np.bincount(group * width + steps.index + 1, weights=inside, minlength=n_names * width)
    spent = spent.reshape(n_names, width)[:, 1:]
    return np.where(spent.max(axis=1) > 0, spent.argmax(axis=1), -1)


def kernel_steps(steps: Sequence[Span], device: DeviceWork, ids: np.ndarray) -> Steps:
    """Each kernel row's issuing step, by name, from every row's issuer (``attribution.issuer_ids``)."""
    names = tuple(dict.fromkeys(s.name for s in steps))
    where = {s.span_id: names.index(s.name) for s in steps}
    kernel_ids = ids[device.of_kind("kernel")]
    unique, inverse = np.unique(kernel_ids, return_inverse=True)
    index = np.array([where.get(int(i), -1) for i in unique.tolist()], dtype=np.int64)[inverse.reshape(-1)]
    return Steps(index, names)


def coverages(kernels: DeviceWork, sm: SmLimits) -> np.ndarray:
    """Each kernel's SM coverage, worked out once per distinct geometry (a window's
    hundred thousand launches have a handful)."""
    rows = kernels.rows
    if len(rows) and all((rows[f] == rows[f][0]).all() for f in _SHAPE):  # one geometry (a storm)
        return np.full(len(rows), coverage(Geometry(*(int(rows[f][0]) for f in _SHAPE)), sm))
    shape = np.zeros(len(rows), dtype=np.int64)  # the index of each row's geometry
    first = np.zeros(0, dtype=np.int64)  # the first row of each geometry
    for field in _SHAPE:  # one column at a time: numpy sorts integers, not rows, fast
        values, value = np.unique(rows[field], return_inverse=True)
        _, first, shape = np.unique(shape * len(values) + value.reshape(-1), return_index=True, return_inverse=True)
        shape = shape.reshape(-1)
    covered = [coverage(Geometry(*(int(rows[f][i]) for f in _SHAPE)), sm) for i in first.tolist()]
    return np.array(covered, dtype=float)[shape]


def sm_weighted_ns(kernels: DeviceWork, sm: SmLimits, window: iv.Interval) -> float:
    """Kernel time inside ``window``, each kernel weighted by its SM coverage."""
    return float((kernels.inside(window) * coverages(kernels, sm)).sum())


def top_kernels(
    kernels: DeviceWork, sm: SmLimits | None, window: iv.Interval, steps: Steps | None = None
) -> tuple[KernelSummary, ...]:
    """The kernels that took the most time in the window, by name; ``steps``: each row's
    issuing step (an index into the names, -1 for none), whose most is each kernel's step."""
    if not len(kernels):
        return ()
    rows = kernels.rows
    names, group = np.unique(rows["name"], return_inverse=True)
    group = group.reshape(-1)
    counts = np.bincount(group)
    inside = kernels.inside(window)
    totals = np.bincount(group, weights=inside)
    most = _most_step(group, len(names), inside, steps)
    # each name's longest launch (its first, among equals): the first of its group by
    # falling duration
    order = np.lexsort((rows["start"] - rows["end"], group))
    longest = order[np.r_[0, np.flatnonzero(np.diff(group[order])) + 1]]
    out = []
    shown = short_names(kernels.names[n] for n in names.tolist())
    # the top names by time (ties in name order), before any of them is summarized: a
    # window of 50,000 kernels can hold as many names
    top = np.argsort(-(totals / NS_PER_MS), kind="stable")[:TOP]
    for name, count, total, at, issuer in zip(
        names[top].tolist(),
        counts[top].tolist(),
        totals[top].tolist(),
        longest[top].tolist(),
        most[top].tolist(),
        strict=True,
    ):
        shape = Geometry(*(int(rows[f][at]) for f in _SHAPE))
        step = steps.names[issuer] if steps is not None and issuer >= 0 else ""
        known = sm is not None and shape.threads > 0
        out.append(
            KernelSummary(
                name=readable(kernels.names[name]),
                count=count,
                total_ms=total / NS_PER_MS,
                blocks=shape.blocks,
                threads=shape.threads,
                sm_coverage=coverage(shape, sm) if known and sm is not None else None,
                occupancy=occupancy(shape, sm) if known and sm is not None else None,
                mangled=kernels.names[name],
                short=shown[kernels.names[name]],
                step=step,
            )
        )
    return tuple(out)


# the kernels whose totals a report keeps by name, per round; the rest are one entry
KEPT_KERNELS = 20
OTHER_KERNELS = "(other kernels)"


def kernel_totals(kernels: DeviceWork, window: iv.Interval) -> dict[str, float]:
    """Each kernel's time in the window (ms) by mangled name, largest first: the top
    ``KEPT_KERNELS``, and the rest as ``OTHER_KERNELS``, so that a report stays small."""
    if not len(kernels):
        return {}
    names, group = np.unique(kernels.rows["name"], return_inverse=True)
    totals = np.bincount(group.reshape(-1), weights=kernels.inside(window)) / NS_PER_MS
    ranked = sorted(
        zip((kernels.names[n] for n in names.tolist()), totals.tolist(), strict=True), key=lambda kv: -kv[1]
    )
    out = dict(ranked[:KEPT_KERNELS])
    rest = sum(ms for _, ms in ranked[KEPT_KERNELS:])
    if len(ranked) > KEPT_KERNELS:
        out[OTHER_KERNELS] = rest
    return out
