"""The metric table is the one list of metrics: the dataclasses, the budget keys, compare
names and aggregation all follow it."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from pytest_gpuprof.analysis import descriptors as d
from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.memory import MemoryMetrics
from pytest_gpuprof.analysis.metrics import Metrics, NvmlMetrics
from pytest_gpuprof.analysis.model import DeviceInterval, Sample, Span
from pytest_gpuprof.analysis.rounds import aggregate
from pytest_gpuprof.analysis.step_metrics import StepMetrics
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.analysis.whatif import Prediction
from pytest_gpuprof.verdict.budget import Budget, StepBudget
from pytest_gpuprof.verdict.thresholds import parse_thresholds

MS = 1_000_000
_NOT_METRICS = {"truth", "steps", "nvml", "rounds", "notes", "unseen", "what_if", "sm_unseen", "top_kernels", "gpm"}
_NOT_METRICS |= {"kernel_totals"}  # by kernel: a table (descriptor scope "kernel")
_NOT_METRICS |= {"idle_by_code"}  # places with their ms: a list that explains unattributed_ms
_NOT_METRICS |= {"memory", "memory_unseen"}  # device memory: its own scope ("memory")
_NOT_METRICS |= {"processes"}  # per process: a table


@pytest.mark.parametrize(
    ("scope", "cls", "apart"),
    [
        ("window", Metrics, _NOT_METRICS),
        ("step", StepMetrics, {"copies"}),  # by direction: a table, not one figure
        ("nvml", NvmlMetrics, set()),
        ("what_if", Prediction, set()),
        (
            "memory",
            MemoryMetrics,
            {
                "peak_step",
                "peak_within",
                "source",
                "largest",
                "leaks",
                "sites",
                "note",
                "bounds",
                "step_leaks",
                "kept",
                "start_held",
            },
        ),
    ],
)
def test_every_field_that_holds_a_figure_has_its_descriptor(scope, cls, apart):
    fields = [f.name for f in dataclasses.fields(cls) if f.name not in apart]
    assert sorted(fields) == sorted(m.name for m in d.of_scope(scope))


def test_budget_keys_are_the_descriptors_limits():
    assert list(Budget.KEYS) == [
        "min_utilization",
        "max_overhead_ms",
        "max_discrepancy",
        "min_sm_utilization",
        "max_memory",
        "max_leaked_bytes",
    ]
    assert list(StepBudget.KEYS) == [
        "max_ms",
        "max_idle_ms",
        "min_gbps",
        "pageable",
        "min_sm_utilization",
        "max_memory",
        "max_leaked_bytes",
    ]
    with pytest.raises(TypeError, match="unknown keys"):
        Budget(min_util=0.5)


@pytest.mark.parametrize(
    "expr",
    [
        "unattributed_ms:+10%",
        "busy_ms:+1ms",
        "steps.a.b.idle_ms:+5%",
        "nvml.power_max_w:+5%",
        "gpm.sm_active:-2pt",
        "what_if.faster:upload:2.utilization:-1pt",
    ],
)
def test_every_comparable_metric_is_nameable_in_a_compare_expression(expr):
    assert parse_thresholds(expr)[0].text == expr


@pytest.mark.parametrize("expr", ["kernels:-1%", "steps.upload.pageable:+1%", "wall_ms:-1pt", "nvml.samples:+1%"])
def test_what_cannot_be_gated_is_refused(expr):
    with pytest.raises(ValueError, match="compare-fail expression"):
        parse_thresholds(expr)


def _round(upload_ms: int, idle_ms: int) -> Metrics:
    end = (upload_ms + 10 + idle_ms) * MS
    steps = (Span("upload", 1, 0, upload_ms * MS, span_id=1), Span("compute", 1, upload_ms * MS, end, span_id=2))
    device = (
        DeviceInterval("memcpy", 0, upload_ms * MS, bytes=upload_ms * MS, span_id=1),
        DeviceInterval("kernel", upload_ms * MS, (upload_ms + 10) * MS, span_id=2),
    )
    samples = (Sample(1, util=0.9, power_w=300.0), Sample(end - 1, util=0.7, power_w=100.0 + upload_ms))
    return metrics.compute(Timeline(0, end, "host", steps, (), device, samples))


def test_aggregate_takes_every_comparable_metric_as_the_median_of_its_rounds():
    rounds = [_round(4, 1), _round(9, 3), _round(5, 2)]
    merged = aggregate(rounds)
    for path, value in merged.flat().items():
        assert value == pytest.approx(statistics.median(r.flat()[path] for r in rounds)), path
    assert set(merged.flat()) == set(rounds[0].flat())
    assert merged.nvml is not None and merged.nvml.samples == 6
    assert "unattributed_ms" in merged.rounds


def test_rounds_keep_every_throttle_bit_any_round_had():
    from dataclasses import replace

    rounds = [_round(4, 1), _round(9, 3), _round(5, 2)]
    rounds = [replace(r, nvml=replace(r.nvml, throttle_reasons=bits)) for r, bits in zip(rounds, (0x0, 0x4, 0x20))]
    merged = aggregate(rounds)
    assert merged.nvml is not None and merged.nvml.throttle_reasons == 0x24
