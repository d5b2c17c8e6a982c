"""Every metric, described once: its name, unit, how rounds aggregate it, the budget key
that limits it, and why it can be ``None``.

``Metrics`` and ``StepMetrics`` hold the values; everything that walks over metrics reads
this table: the flat paths of a report and of compare expressions, the medians over
rounds, which figures are fractions (percentages, compared in points), the budget keys
with their ranges and directions, and the reason a limit could not be judged. Adding a
metric is one ``Metric`` here plus its computation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Literal, NamedTuple

Scope = Literal["window", "step", "kernel", "nvml", "gpm", "what_if", "memory"]
Unit = Literal["ms", "fraction", "bytes", "count", "GB/s", "W", "MHz", "flag", "flags"]
# how the rounds of a measure() become one figure: the median (rounded for whole
# numbers), whether any round had it (flags), the sum (sample counts), or the highest
# (peaks of memory: what runs out is the highest), or every bit any round had (a bitmask)
Aggregate = Literal["median", "any", "sum", "max", "or"]
Direction = Literal["min", "max", "forbid"]
Way = Literal["up", "down"]
# which way a metric without a budget key gets worse, by its unit: time, bytes, counts and
# power up; fractions of the wall time, bandwidths and clocks down
_WORSE_BY_UNIT: Mapping[str, Way] = {"fraction": "down", "GB/s": "down", "MHz": "down"}


class Limit(NamedTuple):
    """A budget key on a metric: ``min_utilization`` is a floor, ``max_ms`` a ceiling,
    ``pageable = "forbid"`` a flag that must stay off."""

    key: str
    direction: Direction


class Metric(NamedTuple):
    name: str
    scope: Scope
    unit: Unit
    meaning: str
    limit: Limit | None = None
    aggregate: Aggregate = "median"
    # nameable in compare expressions and kept in a report's rounds
    comparable: bool = True
    # where the value is None: the attribute of ``Metrics`` that says why, else the reason
    unseen_by: str | None = None
    unseen: str = ""

    @property
    def worse(self) -> Way:
        """Which way this metric gets worse: the one rule for every budget key, compare
        expression and finding (docs/design.md, "The direction rule"). A budget key says it
        (a floor gets worse going down); otherwise the unit does."""
        if self.limit is not None and self.limit.direction in ("min", "max"):
            return "down" if self.limit.direction == "min" else "up"
        return _WORSE_BY_UNIT.get(self.unit, "up")

    @property
    def whole(self) -> bool:
        return self.unit in ("bytes", "count", "flags")

    @property
    def fraction(self) -> bool:
        return self.unit == "fraction"


_DEVICE = "unseen"  # Metrics.unseen: the source saw none of the window's device work
_MEMORY = "memory_unseen"  # Metrics.memory_unseen: no allocator the plugin reads was in use

METRICS: tuple[Metric, ...] = (
    Metric("wall_ms", "window", "ms", "the measured window, host clock"),
    Metric("kernel_ms", "window", "ms", "length of the union of kernel intervals", unseen_by=_DEVICE),
    Metric("copy_ms", "window", "ms", "length of the union of memcpy intervals", unseen_by=_DEVICE),
    Metric("busy_ms", "window", "ms", "union of kernel, memcpy and memset intervals", unseen_by=_DEVICE),
    Metric(
        "utilization",
        "window",
        "fraction",
        "kernel_ms / wall_ms: the true utilization",
        Limit("min_utilization", "min"),
        unseen_by=_DEVICE,
    ),
    Metric(
        "overhead_ms",
        "window",
        "ms",
        "wall_ms - kernel_ms",
        Limit("max_overhead_ms", "max"),
        unseen_by=_DEVICE,
    ),
    Metric("busy_utilization", "window", "fraction", "busy_ms / wall_ms", unseen_by=_DEVICE),
    Metric(
        "reported_utilization",
        "window",
        "fraction",
        "union of gpuprof.region() brackets / wall_ms",
        unseen="the window has no gpuprof.region() brackets",
    ),
    Metric(
        "discrepancy",
        "window",
        "fraction",
        "reported_utilization - utilization",
        Limit("max_discrepancy", "max"),
        unseen="the window has no gpuprof.region() brackets to compare with",
    ),
    Metric("unattributed_ms", "window", "ms", "kernel-idle time that no step caused", unseen_by=_DEVICE),
    Metric(
        "sm_utilization",
        "window",
        "fraction",
        "kernel time weighted by the fraction of SMs the grids covered, over wall_ms",
        Limit("min_sm_utilization", "min"),
        unseen_by="sm_unseen",
        unseen="no kernel ran",
    ),
    Metric("kernels", "window", "count", "kernels launched in the window", comparable=False),
    Metric(
        "runner_probe_ms",
        "window",
        "ms",
        "a fixed Python loop timed just before the window: how fast the runner's host ran then",
        unseen="timed before each window of gpuprof.measure() and gpuprof.window() on the real clock only",
    ),
    Metric("count", "step", "count", "instances of the step (nested ones of one name count once)"),
    Metric("host_ms", "step", "ms", "total host time of the step in the window", Limit("max_ms", "max")),
    Metric("host_ms_max", "step", "ms", "the longest instance of the step"),
    Metric("idle_ms", "step", "ms", "kernel-idle time charged to the step itself", unseen_by=_DEVICE),
    Metric(
        "idle_ms_inclusive",
        "step",
        "ms",
        "kernel-idle time charged to the step and to the steps nested in it",
        Limit("max_idle_ms", "max"),
        unseen_by=_DEVICE,
    ),
    Metric("bytes", "step", "bytes", "bytes of the host-device copies the step issued"),
    Metric(
        "gbps",
        "step",
        "GB/s",
        "the step's copy bytes over their device time",
        Limit("min_gbps", "min"),
        unseen="the step copied nothing",
    ),
    Metric(
        "pageable",
        "step",
        "flag",
        "any of the step's copies read pageable host memory",
        Limit("pageable", "forbid"),
        aggregate="any",
        comparable=False,
    ),
    Metric(
        "sm_utilization",
        "step",
        "fraction",
        "the SM-weighted share of the step's kernel time",
        Limit("min_sm_utilization", "min"),
        unseen_by="sm_unseen",
        unseen="the step issued no kernel",
    ),
    Metric(
        "memory_peak_bytes",
        "step",
        "bytes",
        "the most device memory held while the step was open, over what the window began with",
        Limit("max_memory", "max"),
        aggregate="max",
        unseen_by=_MEMORY,
    ),
    Metric(
        "leaked_bytes",
        "step",
        "bytes",
        "device memory allocated while the step or a step nested in it was open, and not freed by the end of the test's call",
        Limit("max_leaked_bytes", "max"),
        aggregate="max",
        unseen_by=_MEMORY,
        unseen="the allocator is read by its counters only: its allocations are not seen one by one",
    ),
    Metric("total_ms", "kernel", "ms", "the time of one kernel (by its mangled name) in the window"),
    Metric("util_mean", "nvml", "fraction", "NVML utilization.gpu, mean over the window's samples"),
    Metric("power_mean_w", "nvml", "W", "board power, mean"),
    Metric("power_max_w", "nvml", "W", "board power, highest sample"),
    Metric("mem_used_max_bytes", "nvml", "bytes", "device memory used, highest sample"),
    Metric("sm_clock_mhz", "nvml", "MHz", "the SM clock, mean over the window's samples"),
    Metric(
        "throttle_reasons",
        "nvml",
        "flags",
        "why the clocks were held down in the window: NVML's clock event reasons, every bit a sample had",
        aggregate="or",
        comparable=False,
    ),
    Metric("samples", "nvml", "count", "NVML samples in the window", aggregate="sum", comparable=False),
    Metric("sm_active", "gpm", "fraction", "NVML GPM: SM active"),
    Metric("sm_occupancy", "gpm", "fraction", "NVML GPM: SM occupancy"),
    Metric("tensor_active", "gpm", "fraction", "NVML GPM: tensor pipes active"),
    Metric("dram_bw_util", "gpm", "fraction", "NVML GPM: DRAM bandwidth used"),
    Metric(
        "peak_bytes",
        "memory",
        "bytes",
        "the most device memory the window's code held at once, over what the window began with",
        Limit("max_memory", "max"),
        aggregate="max",
        unseen_by=_MEMORY,
    ),
    Metric(
        "reserved_peak_bytes",
        "memory",
        "bytes",
        "the most the process had reserved from the driver (pools included)",
        aggregate="max",
        unseen_by=_MEMORY,
    ),
    Metric(
        "leaked_bytes",
        "memory",
        "bytes",
        "device memory allocated in the window and not freed by the end of the test's call",
        Limit("max_leaked_bytes", "max"),
        aggregate="max",
        unseen_by=_MEMORY,
    ),
    Metric(
        "cached_bytes",
        "memory",
        "bytes",
        "what the frameworks' pools kept at the window's end without the code holding it (a cache, not a leak)",
        aggregate="max",
        unseen_by=_MEMORY,
    ),
    Metric("wall_ms", "what_if", "ms", "the predicted wall time of a scenario"),
    Metric("utilization", "what_if", "fraction", "the predicted true utilization of a scenario"),
)


@functools.cache
def of_scope(scope: Scope) -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.scope == scope)


@functools.cache
def names(scope: Scope, *, comparable: bool = True) -> tuple[str, ...]:
    """The metric names of ``scope`` (the comparable ones, unless ``comparable=False``)."""
    return tuple(m.name for m in of_scope(scope) if m.comparable or not comparable)


def limits(*scopes: Literal["window", "step", "memory"]) -> dict[str, Metric]:
    """The budget keys of ``scopes``, each with the metric it limits."""
    return {m.limit.key: m for scope in scopes for m in of_scope(scope) if m.limit is not None}


# a what-if scenario: overlap:STEP, pinned:STEP, faster:STEP:F
SCENARIO = re.compile(r"^(?:(?P<kind>overlap|pinned):(?P<step>.+)|faster:(?P<faster>.+):(?P<factor>\d+(?:\.\d+)?))$")
_PREFIXES: Mapping[str, Scope] = {
    "steps": "step",
    "kernels": "kernel",
    "nvml": "nvml",
    "gpm": "gpm",
    "what_if": "what_if",
    "memory": "memory",
}


def split_path(path: str) -> tuple[Scope, str | None, str] | None:
    """``steps.upload.idle_ms`` -> ("step", "upload", "idle_ms"); ``nvml.util_mean`` ->
    ("nvml", None, "util_mean"); ``wall_ms`` -> ("window", None, "wall_ms"). A step name
    or a scenario may hold dots and colons: the metric is the last part. ``None`` where
    the path is not a metric's shape."""
    head, dot, rest = path.partition(".")
    if not dot:
        return "window", None, path
    scope = _PREFIXES.get(head)
    if scope is None:
        return None
    if scope in ("step", "kernel", "what_if"):
        owner, _, name = rest.rpartition(".")
        return (scope, owner, name) if owner else None
    return scope, None, rest


def lookup(path: str) -> Metric | None:
    """The metric a flat path names (``steps.upload.gbps``, ``what_if.overlap:upload.utilization``),
    ``None`` where it names none."""
    parts = split_path(path)
    if parts is None:
        return None
    scope, owner, name = parts
    if scope == "what_if" and (owner is None or SCENARIO.match(owner) is None):
        return None
    return next((m for m in of_scope(scope) if m.name == name), None)


def comparable(path: str) -> bool:
    """Whether ``path`` names a metric that a compare expression can gate."""
    metric = lookup(path)
    return metric is not None and metric.comparable


def is_fraction(path: str) -> bool:
    """Whether the metric at ``path`` is a fraction of the wall time (shown as a
    percentage, compared in points)."""
    metric = lookup(path)
    return metric is not None and metric.fraction


def fractions() -> tuple[str, ...]:
    """The fraction metrics as a person names them, for messages."""
    prefix = {
        "window": "",
        "step": "steps.NAME.",
        "kernel": "kernels.NAME.",
        "nvml": "nvml.",
        "gpm": "gpm.",
        "what_if": "what_if.SCENARIO.",
        "memory": "memory.",
    }
    return tuple(prefix[m.scope] + m.name for m in METRICS if m.fraction)


def grammar() -> str:
    """Every nameable metric, as the compare expressions' error message lists them."""
    return (
        f"{', '.join(names('window'))}, kernels (each kernel's total_ms), steps.NAME.{{{','.join(names('step'))}}}, "
        f"nvml.{{{','.join(names('nvml'))}}}, gpm.{{{','.join(names('gpm'))}}}, "
        f"what_if.SCENARIO.{{{','.join(names('what_if'))}}}, memory.{{{','.join(names('memory'))}}}"
    )
