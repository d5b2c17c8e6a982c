"""A test's figures over its rounds: each metric as its descriptor says (``aggregate``)."""

from __future__ import annotations

import functools
import operator
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_gpuprof.analysis import descriptors as d
from pytest_gpuprof.analysis.memory import PEAK, highest
from pytest_gpuprof.analysis.metrics import Metrics, NvmlMetrics
from pytest_gpuprof.analysis.stats import Summary
from pytest_gpuprof.analysis.whatif import Prediction


def aggregate(rounds: Sequence[Metrics]) -> Metrics:
    """Each metric over the rounds as its descriptor says (medians, mostly), with every
    comparable metric's ``Summary`` in ``rounds``; the rest is the last round's."""
    if not rounds:
        raise ValueError("aggregate needs at least one round")
    paths: dict[str, list[float]] = defaultdict(list)
    for m in rounds:
        for path, value in m.flat().items():
            paths[path].append(value)
    summaries = {path: Summary.of(values) for path, values in paths.items()}

    def over(prefix: str, each: Iterable[Any], scope: d.Scope) -> dict[str, Any]:
        return _over(prefix, each, scope, summaries)

    last = rounds[-1]
    window = over("", rounds, "window")
    steps = {
        name: replace(figures, **over(f"steps.{name}.", (m.steps.get(name) for m in rounds), "step"))
        for name, figures in last.steps.items()
    }
    nvml = None if last.nvml is None else NvmlMetrics(**over("nvml.", (m.nvml for m in rounds), "nvml"))
    gpm = (
        None
        if last.gpm is None
        else {k: v for k, v in over("gpm.", (m.gpm for m in rounds), "gpm").items() if k in last.gpm}
    )
    what_if = {
        name: Prediction(**over(f"what_if.{name}.", (m.what_if.get(name) for m in rounds), "what_if"))
        for name in last.what_if
    }
    kernels = {name: summaries[f"kernels.{name}.total_ms"].median for name in last.kernel_totals}
    sampled = [dict(m.idle_by_code) for m in rounds if m.idle_by_code is not None]
    places = {where for each in sampled for where in each}
    medians = ((where, statistics.median(each.get(where, 0.0) for each in sampled)) for where in places)
    aggregated = replace(
        last,
        **window,
        kernel_totals=kernels,
        steps=steps,
        nvml=nvml,
        rounds=summaries,
        unseen=next((m.unseen for m in rounds if m.unseen), None),
        what_if=what_if,
        gpm=gpm,
        memory=None
        if last.memory is None
        else replace(last.memory, **over("memory.", (m.memory for m in rounds), "memory")),
        idle_by_code=None
        if not sampled
        else tuple(sorted(((w, ms) for w, ms in medians if ms > 0), key=lambda item: (-item[1], item[0]))),
    )
    return _ranged(rounds, aggregated)


def _ranged(rounds: Sequence[Metrics], m: Metrics) -> Metrics:
    """The memory peaks some round knows as a range only (JAX's statistics), over the
    rounds: the most of every round's least and of every round's most; a figure where the
    two meet, else ``None`` with the range in ``memory.bounds``."""
    paths = sorted({path for r in rounds if r.memory is not None for path in r.memory.bounds})
    if m.memory is None or not paths:
        return m
    bounds: dict[str, tuple[int, int]] = {}
    exact: dict[str, int] = {}
    for path in paths:
        lo, hi = highest(k for k in (_known(r, path) for r in rounds) if k is not None)
        if lo == hi:
            exact[path] = lo
        else:
            bounds[path] = (lo, hi)
    steps = dict(m.steps)
    for path in paths:
        name = _step(path)
        if name is not None and name in steps:
            steps[name] = replace(steps[name], memory_peak_bytes=exact.get(path))
    ranged = PEAK in bounds
    peak = None if ranged else exact.get(PEAK, m.memory.peak_bytes)
    step = None if ranged else m.memory.peak_step
    return replace(m, steps=steps, memory=replace(m.memory, peak_bytes=peak, peak_step=step, bounds=bounds))


def _known(m: Metrics, path: str) -> tuple[int, int] | None:
    """A round's memory peak at ``path``: its range, or its figure twice (``None``: none)."""
    if m.memory is None:
        return None
    if path in m.memory.bounds:
        return m.memory.bounds[path]
    if path == PEAK:
        value = m.memory.peak_bytes
    else:
        step = m.steps.get(_step(path) or "")
        value = step.memory_peak_bytes if step is not None else None
    return None if value is None else (value, value)


def _over(prefix: str, each: Iterable[Any], scope: d.Scope, summaries: Mapping[str, Summary]) -> dict[str, Any]:
    """The figures of one owner (the window, a step, NVML...), from each round's."""
    owners = [o for o in each if o is not None]
    out: dict[str, Any] = {}
    for metric in d.of_scope(scope):
        values = [v for o in owners if (v := _get(o, metric.name)) is not None]
        if metric.aggregate == "any":
            out[metric.name] = any(values)
        elif metric.aggregate == "max":
            out[metric.name] = max(values) if values else None
        elif metric.aggregate == "sum":
            out[metric.name] = sum(values)
        elif metric.aggregate == "or":
            out[metric.name] = functools.reduce(operator.or_, values) if values else None
        elif not values:
            out[metric.name] = None
        else:
            median = summaries[prefix + metric.name].median if metric.comparable else Summary.of(values).median
            out[metric.name] = round(median) if metric.whole else float(median)
    return out


def _get(owner: Any, name: str) -> Any:
    return owner.get(name) if isinstance(owner, Mapping) else getattr(owner, name)


def _step(path: str) -> str | None:
    """The step of ``steps.NAME.memory_peak_bytes`` (``None``: the window's path)."""
    parts = d.split_path(path)
    return parts[1] if parts is not None and parts[0] == "step" else None
