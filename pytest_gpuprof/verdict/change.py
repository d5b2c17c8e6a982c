"""What one metric's change was against its baseline (``Change``): its finding, its figures,
the spread between runs and the rounds behind it, and the line that says it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.descriptors import is_fraction
from pytest_gpuprof.analysis.mann_whitney import ALPHA, can_fail
from pytest_gpuprof.analysis.names import readable, short
from pytest_gpuprof.analysis.run_spread import Spread
from pytest_gpuprof.verdict.thresholds import Threshold

# how a comparison gets enough rounds to fail: only measure() repeats its window
WAY_OUT = (
    "measure in gpuprof.measure() with 4 or more rounds a side (--gpu-rounds raises them); "
    "a test measured whole or by its steps is one round"
)


Finding = Literal[
    "regression", "inconclusive", "improvement", "unchanged", "missing", "absent", "appeared", "vanished", "clock"
]


@dataclass(frozen=True, slots=True)
class Change:
    threshold: Threshold
    finding: Finding
    baseline: float | None
    current: float | None
    p_value: float | None = None
    samples: tuple[int, int] = (0, 0)
    spread: Spread | None = None  # between runs, from the baseline's history; None: not asked
    clock: str | None = None  # the SM clocks of both sides, where the change is theirs
    runner: str | None = None  # the runner probes of both sides, beside a host-bound change
    # a regression that fresh runs of the test did not repeat (``confirmed``): what they read
    unconfirmed: str | None = None

    @property
    def inert(self) -> bool:
        """Whether this comparison could never have found a regression: too few rounds on
        a side for any p-value below ``ALPHA``, or the metric measured on neither side. A
        metric on one side only (missing, a kernel that appeared or vanished) is a finding
        of its own, not a test of rounds."""
        if self.finding == "absent":
            return True
        return self.finding not in ("missing", "appeared", "vanished") and not can_fail(*self.samples)

    @property
    def detectable(self) -> float | None:
        """The smallest true change from the baseline's figure, the threshold included, that
        this comparison catches ``POWER`` of the time (``Spread.detectable_from``), as a
        change in the metric's units toward worse; ``None`` where the spread is unknown."""
        spread = self.spread
        if spread is None or self.baseline is None:
            return None
        t = self.threshold
        found = spread.detectable_from(self.baseline, t.delta(self.baseline), t.direction)
        noise = spread.noise
        if found is None or noise is None or t.direction < 0 or is_fraction(t.metric) or self.baseline <= noise:
            return found
        # a time's spread grows with it: a run of the slower code moves by as much more
        return found / (1 - noise / self.baseline)

    @property
    def blind(self) -> bool:
        """Whether the spread between runs hides a change of the threshold's size: a change
        of the threshold alone lies within what unchanged runs do (``Spread.detectable``
        beyond the threshold), so that passing says little."""
        spread = self.spread
        if spread is None or spread.detectable is None or self.baseline is None:
            return False
        return spread.detectable > self.threshold.delta(self.baseline)

    def to_dict(self) -> dict[str, Any]:
        """The record a test's verdict was built from: metric, before, after, threshold,
        rounds a side, p, finding, and ``inert``."""
        return {
            "metric": self.threshold.metric,
            "threshold": self.threshold.text,
            "finding": self.finding,
            "before": self.baseline,
            "after": self.current,
            "rounds": list(self.samples),
            "p": self.p_value,
            "inert": self.inert,
            **({"detectable": self.detectable} if self.detectable is not None else {}),
            **({"between_runs": self.spread.to_dict()} if self.spread is not None else {}),
            **({"clock": self.clock} if self.clock else {}),
            **({"runner": self.runner} if self.runner else {}),
            **({"unconfirmed": self.unconfirmed} if self.unconfirmed else {}),
        }

    @property
    def kernel(self) -> str | None:
        """The kernel's mangled name, for a change of one kernel's time."""
        parts = descriptors.split_path(self.threshold.metric)
        return parts[1] if parts is not None and parts[0] == "kernel" else None

    def label(self, names: Mapping[str, str] | None = None) -> str:
        """What a line calls the changed figure: the metric, or ``kernel NAME ms`` with the
        kernel's short name (``names``: ``kernel_names`` of the lines shown together)."""
        kernel = self.kernel
        if kernel is None:
            return self.threshold.metric
        return f"kernel {(names or {}).get(kernel) or short(readable(kernel))} ms"

    def describe(self, names: Mapping[str, str] | None = None, gating: bool = True) -> str:
        """The change as a line; ``gating``: whether a ``--gpu-compare-fail`` expression
        set its threshold (else a finding beyond it reads ``changed``, the default named)."""
        t = self.threshold
        what = self.label(names)
        if self.finding in ("appeared", "vanished"):
            ms = self.current if self.finding == "appeared" else self.baseline
            return f"{what}: {self.finding} ({ms:.3f} ms {'now' if self.finding == 'appeared' else 'in the baseline'})"
        if self.finding == "absent":
            return f"{what}: not measured in the baseline nor in this run: this gate cannot act ({t.text})"
        if self.baseline is None or self.current is None:
            side = "baseline" if self.baseline is None else "this run"
            return f"{what}: not in {side}"
        fmt = formatter(t.metric)
        change = self.current - self.baseline
        relative = f", {100 * change / self.baseline:+.1f}%" if self.baseline else ""
        test = f"; one-sided Mann-Whitney p={self.p_value:.3g}" if self.p_value is not None else ""
        inert = ""
        if self.inert:
            inert = f" (inert: {self.samples[0]} vs {self.samples[1]} rounds can never reach p < {ALPHA}; {self.inert_cause()})"
        unconfirmed = f"not confirmed: {self.unconfirmed}" if self.unconfirmed else None
        beside = "".join(f" ({why})" for why in (self.clock, self.runner, unconfirmed) if why)
        return (
            f"{what}: baseline {fmt(self.baseline)} -> {fmt(self.current)} "
            f"({fmt(change, True)}{relative}; limit {t.text}; {self.samples[0]} vs {self.samples[1]} rounds{test}"
            f"{self._between_runs(fmt)}): {self.named(gating)}{beside}{inert}"
        )

    def _between_runs(self, fmt: Callable[..., str]) -> str:
        """The spread between runs and the smallest change it lets a comparison see."""
        spread = self.spread
        if spread is None:
            return ""
        if spread.sd is None:
            runs = f"{spread.runs} baseline run" if spread.runs == 1 else f"{spread.runs} baseline runs"
            return f"; between-run spread unknown ({runs}): no regression can be told from one process's rounds"
        if spread.runs == 1:  # ``Spread.of(exact=True)``: the virtual clock
            return "; between runs none (the virtual clock: one code, one figure)"
        detectable = self.detectable or 0.0
        relative = (
            f" ({100 * detectable / abs(self.baseline):.1f}%)"
            if self.baseline and not is_fraction(self.threshold.metric)
            else ""
        )
        return (
            f"; between runs sd {fmt(spread.sd, False)} over {spread.runs} runs "
            f"(level {fmt(spread.center, False)} ± {fmt(spread.bound or 0.0, True).lstrip('+')}), "
            f"smallest detectable change {fmt(detectable, True).lstrip('+')}{relative}"
        )

    def inert_cause(self) -> str:
        """Why this comparison could never fail, naming the side that is short of rounds and
        how many it would need against the other."""
        before, now = self.samples
        metric = self.threshold.metric
        if self.finding == "absent":
            return f"{metric} was measured in neither the baseline nor this run"
        if before < now:
            need = rounds_needed(now)
            return (
                f"the baseline holds {_rounds(before)} of {metric} against this run's {now}: "
                f"save a baseline from a run of {need} or more rounds (gpuprof.measure(), --gpu-rounds)"
            )
        if now < before:
            need = rounds_needed(before)
            return (
                f"this run has {_rounds(now)} of {metric} against the baseline's {before}: it needs {need} or more "
                "(gpuprof.measure() repeats its window, --gpu-rounds raises them; a test measured whole "
                "or by its steps is one round)"
            )
        return WAY_OUT

    def named(self, gating: bool) -> str:
        """The finding as a line says it: ``regression`` only where a gate the user set
        judged it; beyond a default threshold it is ``changed``."""
        if self.finding == "regression" and not gating:
            return f"changed (beyond the default {self.threshold.text}, not a gate)"
        return self.finding


def _rounds(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"


def rounds_needed(other: int) -> int:
    """The fewest rounds on one side that can reach ``ALPHA`` against ``other`` rounds on
    the other (0 if none can)."""
    return next((k for k in range(1, 200) if can_fail(k, other)), 0)


def formatter(metric: str) -> Callable[..., str]:
    if is_fraction(metric):
        return lambda v, signed=False: f"{100 * v:+.2f}pt" if signed else f"{100 * v:.2f}%"
    described = descriptors.lookup(metric)
    if described is not None and described.unit == "bytes":  # whole bytes, with thousands apart
        return lambda v, signed=False: f"{v:+,.0f} B" if signed else f"{v:,.0f} B"
    return lambda v, signed=False: f"{v:+.3f}" if signed else f"{v:.3f}"
