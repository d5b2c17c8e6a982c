"""The comparison a CI reader sees fits a screen: each test that moved, with its decision
and one line a change of at most 160 characters carrying before, after, the change and how
sure; the unchanged ones counted; ``-v`` keeps every line."""

SUITE = """
import os
import pytest

@pytest.mark.parametrize("k", range(5))
def test_kernel(gpuprof, gpu_workload, k):
    ms = 4.0 + k
    if k == 2 and os.environ.get("SLOW"):
        ms *= 1.2
    gpuprof.measure(lambda: gpu_workload.compute(ms=ms), rounds=5, warmup=0)
"""
GATE = ("--gpu-compare=main", "--gpu-host-clock=virtual", "--gpu-compare-fail=kernel_ms:+5%,wall_ms:+10%")


def _block(lines):
    start = next(i for i, line in enumerate(lines) if line.startswith("compared with baseline"))
    end = next(i for i, line in enumerate(lines) if line.startswith("gpuprof gate against"))
    return lines[start:end]


def test_a_five_test_comparison_with_one_regression_fits_a_screen(pytester, monkeypatch):
    pytester.makepyfile(test_five=SUITE)
    for _ in range(3):
        pytester.runpytest("--gpu-save=main", "--gpu-host-clock=virtual").assert_outcomes(passed=5)
    monkeypatch.setenv("SLOW", "1")
    result = pytester.runpytest(*GATE)
    result.assert_outcomes(passed=4, failed=1)
    block = _block(result.stdout.lines)
    assert len(block) <= 15 and all(len(line) <= 160 for line in block), block
    result.stdout.fnmatch_lines(
        [
            "  test_five.py::test_kernel[[]2[]]: regression",
            "      kernel_ms 6.000 -> 7.200 (+20.0%): regression, p=0.004, past the runs' bound 6.000",
            "  4 test(s) unchanged (-v or --gpu-summary=all shows every line)",
        ]
    )
    assert "smallest detectable change" not in "\n".join(block)  # nothing that says nothing
    verbose = pytester.runpytest(*GATE, "-v")
    assert len(_block(verbose.stdout.lines)) > len(block)
    verbose.stdout.fnmatch_lines(["*kernel_ms: baseline 6.000 -> 7.200 (+1.200, +20.0%; limit kernel_ms:+5%*"])


def test_a_short_line_writes_each_figure_in_its_own_unit():
    from pytest_gpuprof.verdict.decision import _short

    line = _short(
        {
            "metric": "memory.peak_bytes",
            "line": "memory.peak_bytes: baseline 10,485,760 B -> ...",
            "before": 10485760.0,
            "after": 12582912.0,
            "finding": "regression",
            "p": 0.004,
            "gates": True,
        }
    )
    assert line == "memory.peak_bytes 10,485,760 B -> 12,582,912 B (+20.0%): regression, p=0.004"
    utilization = _short({"metric": "utilization", "before": 0.4187, "after": 0.3549, "finding": "inconclusive"})
    assert utilization.startswith("utilization 41.87% -> 35.49% (-15.2%): inconclusive")


def test_a_window_under_a_millisecond_reads_in_us_and_an_upload_has_one_rate():
    """A 4 us window's times read in us (every one of its lines in one unit), a size in one
    scale (``1.0 KiB``), and the idle line's rate is the rate the budget gates: the rounds'
    median, where the shown window moved its bytes at another."""
    from pytest_gpuprof.analysis.metrics import Metrics
    from pytest_gpuprof.analysis.stats import Summary
    from pytest_gpuprof.analysis.step_metrics import StepMetrics
    from pytest_gpuprof.output.text import explain

    step = StepMetrics(count=1, host_ms=0.003, host_ms_max=0.003, idle_ms=0.003, bytes=1024, gbps=0.6, pageable=False)
    rate = Summary(median=0.3, min=0.2, max=0.6, iqr=0.1, samples=(0.2, 0.3, 0.6))
    metrics = Metrics(
        wall_ms=0.004, kernel_ms=0.001, copy_ms=0.003, busy_ms=0.004, utilization=0.25, busy_utilization=1.0,
        reported_utilization=None, discrepancy=None, overhead_ms=0.003, unattributed_ms=0.0, kernels=1,
        truth="host", steps={"upload": step}, rounds={"steps.upload.gbps": rate, "wall_ms": rate},
    )  # fmt: skip
    lines = explain(metrics)
    assert lines[0] == "wall 4.0 us = kernels 1.0 us + kernel-idle 3.0 us  (medians of 3 rounds)", lines
    assert "upload 3.0 us (1.0 KiB @ 0.3 GB/s, pinned)" in lines[1], lines
    assert "0.6" not in lines[1] and " ms" not in " ".join(lines[:2])
