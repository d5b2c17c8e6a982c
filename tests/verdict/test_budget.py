import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.model import DeviceInterval, Sample, Span
from pytest_gpuprof.analysis.stats import Summary
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.output.text import failure_message
from pytest_gpuprof.verdict.budget import Budget, BudgetError, StepBudget, evaluate, parse_budget
from pytest_gpuprof.verdict.record import GpuRecord

MS = 1_000_000


def seed_like_metrics():
    """Single-lock partition: upload 0-580, sync 580-675, trim 675-716, kernels 716-1402, window 0-1418."""
    steps = (
        Span("upload", 1, 0, 580 * MS, span_id=1, bytes=4 << 30),
        Span("sync", 1, 580 * MS, 675 * MS),
        Span("trim", 1, 675 * MS, 716 * MS),
        Span("compute", 1, 716 * MS, 1402 * MS),
    )
    device = (
        DeviceInterval("memcpy", 0, int(79.5 * MS), bytes=4 << 30, span_id=1),
        DeviceInterval("kernel", 716 * MS, 1402 * MS),
    )
    regions = (Span("partition", 1, 0, 1417 * MS),)
    samples = (Sample(10, util=0.956),)
    return metrics.compute(Timeline(0, 1418 * MS, "cupti", steps, regions, device, samples))


def test_breach_message_explains_where_the_time_went():
    m = seed_like_metrics()
    breaches = evaluate(Budget(min_utilization=0.8), m)
    assert [b.key for b in breaches] == ["min_utilization"]
    text = failure_message(breaches, m)
    lines = text.splitlines()
    assert lines[0] == "GPU budget exceeded: utilization 48.4% < 80.0% (min_utilization)  [truth: cupti]"
    assert lines[1] == "  wall 1418.0 ms = kernels 686.0 ms + kernel-idle 732.0 ms"
    assert lines[2].startswith("  kernel-idle by step: upload 580.0 ms (4.00 GiB @ 54.0 GB/s, pinned), sync 95.0 ms")
    assert lines[2].endswith("trim 41.0 ms, unattributed 16.0 ms")
    assert lines[3] == "  brackets report 99.9% and NVML 95.6%: instrumentation over-reports by 51.6 points"


def test_a_window_whose_records_were_dropped_says_so_in_its_message_and_status():
    m = seed_like_metrics()
    note = "records lost: CUPTI dropped 12 activity records, so device time is undercounted"
    dropped = metrics.compute(Timeline(0, 1418 * MS, "cupti", (), (), (), (), (note,)))
    breaches = evaluate(Budget(min_utilization=0.8), dropped)
    assert failure_message(breaches, dropped).splitlines()[-1] == f"  note: {note}"
    assert "note:" not in failure_message(evaluate(Budget(min_utilization=0.8), m), m)
    record = GpuRecord("t.py::test", dropped, Budget(min_utilization=0.8), breaches, enforced=True)
    assert record.status == "FAIL: breach min_utilization; records lost"
    assert GpuRecord("t.py::test", dropped, Budget(), [], enforced=True).status == "records lost"
    assert GpuRecord("t.py::test", m, Budget(), [], enforced=True).status == "-"


def test_every_limit_kind_is_checked():
    m = seed_like_metrics()
    budget = Budget(
        min_utilization=0.4,
        max_overhead_ms=700,
        max_discrepancy=0.5,
        steps={
            "upload": StepBudget(max_ms=500, max_idle_ms=600, min_gbps=60, pageable="forbid"),
            "missing": StepBudget(max_ms=0),
        },
    )
    keys = [b.key for b in evaluate(budget, m)]
    assert keys == ["max_overhead_ms", "max_discrepancy", "steps.upload.max_ms", "steps.upload.min_gbps"]
    assert evaluate(Budget(steps={"upload": StepBudget(pageable="forbid")}), m) == []


def test_pageable_forbid_breaches_on_a_pageable_copy():
    steps = (Span("upload", 1, 0, 10 * MS, span_id=3),)
    device = (DeviceInterval("memcpy", 0, 10 * MS, bytes=80_000_000, pageable=True, span_id=3),)
    m = metrics.compute(Timeline(0, 10 * MS, "cupti", steps, (), device))
    breaches = evaluate(parse_budget({"steps": {"upload": {"pageable": "forbid"}}}, "t"), m)
    assert [b.key for b in breaches] == ["steps.upload.pageable"]
    assert "pageable" in failure_message(breaches, m)


def test_merge_is_key_by_key_with_the_higher_source_winning():
    base = parse_budget(
        {"min_utilization": 0.8, "max_overhead_ms": 5, "steps": {"upload": {"max_ms": 3, "min_gbps": 40}}}, "a"
    )
    top = parse_budget({"min_utilization": 0.5, "steps": {"upload": {"max_ms": 9}, "sync": {"max_ms": 1}}}, "b")
    merged = top.merged_over(base)
    assert merged.min_utilization == 0.5
    assert merged.max_overhead_ms == 5
    assert merged.steps["upload"] == StepBudget(max_ms=9, min_gbps=40)
    assert merged.steps["sync"] == StepBudget(max_ms=1)


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"min_util": 0.8}, "unknown budget key 'min_util'; valid keys: min_utilization, max_overhead_ms"),
        ({"min_utilization": "high"}, "'min_utilization' must be a number, not str 'high'"),
        ({"min_utilization": True}, "'min_utilization' must be a number"),
        ({"min_utilization": 1.5}, "'min_utilization' = 1.5 is out of range"),
        ({"max_overhead_ms": -1}, "'max_overhead_ms' = -1 is out of range"),
        ({"steps": {"upload": {"max_gb": 1}}}, "unknown budget key 'steps.upload.max_gb'; valid keys: max_ms"),
        ({"steps": {"upload": {"pageable": "never"}}}, "'steps.upload.pageable' must be one of 'forbid', 'allow'"),
        ({"steps": {"upload": 3}}, "'steps.upload' must be a table"),
        ({"steps": [1]}, "'steps' must be a table"),
    ],
)
def test_bad_budget_names_the_key_and_the_source(table, fragment):
    with pytest.raises(BudgetError) as info:
        parse_budget(table, "somewhere.toml")
    assert str(info.value).startswith("somewhere.toml: ")
    assert fragment in str(info.value)


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30))
def test_summary_matches_a_plain_reference(samples):
    s = Summary.of(samples)
    ordered = sorted(samples)
    assert s.median == pytest.approx(statistics.median(samples), abs=1e-6)
    assert (s.min, s.max) == (ordered[0], ordered[-1])
    quartiles = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else [samples[0]] * 3
    assert s.iqr == pytest.approx(quartiles[2] - quartiles[0], abs=1e-6)


@given(st.lists(st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False), min_size=1, max_size=40))
def test_a_summary_is_numpys_percentiles_to_the_bit(samples):
    import numpy as np

    s = Summary.of(samples)
    q1, median, q3 = np.percentile(np.asarray(samples, dtype=float), [25, 50, 75])
    assert (s.median, s.iqr, s.min, s.max) == (float(median), float(q3 - q1), min(samples), max(samples))
    assert s.samples == tuple(samples)
