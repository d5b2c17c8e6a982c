"""The rules a gate is trusted by across a CI workflow (docs/design.md): a breach belongs to
its window, a failed hypothesis test reads its failing example's breach, and only a
complete, accepted run becomes a baseline. Each case here gave the wrong verdict before."""

import json

import pytest
from plugin_runs import entry, page_data_of, report_of

TWO_WINDOWS = """
import pytest
from pytest_gpuprof import GpuBudgetExceeded

@pytest.mark.gpu_budget(min_utilization=0.9)
def test_two_windows(gpuprof, gpu_workload):
    gpuprof.measure(lambda: (gpu_workload.upload(8 << 20), gpu_workload.compute(ms=2)), rounds=1, warmup=0)
    try:
        gpuprof.check()
    except GpuBudgetExceeded:
        pass
    gpuprof.measure(lambda: (gpu_workload.upload(64 << 20), gpu_workload.compute(ms=1)), rounds=1, warmup=0)
"""


def test_a_caught_check_excuses_only_the_window_it_judged(pytester):
    pytester.makepyfile(TWO_WINDOWS)
    result, report = report_of(pytester, "--gpu-trace=traces")
    result.assert_outcomes(failed=1)
    test = entry(report, "test_two_windows")
    assert test["verdict"] == "FAIL: breach min_utilization"
    assert [b["window"] for b in test["budget"]["breaches"]] == [1]
    assert test["metrics"]["utilization"] < 0.3  # the second window's figures, not the first's
    result.stdout.fnmatch_lines(["*test_two_windows [[]measure 2/2[]]*FAIL: breach min_utilization*"])
    result.stdout.fnmatch_lines(["*(window 'measure', 2 of 2)*"])


HYPOTHESIS = """
import pytest_gpuprof.strategies
from hypothesis import given, settings, strategies as st

@settings(settings.get_profile("gpuprof"), max_examples=10)
@given(size=st.integers(32 << 20, 64 << 20))
def test_sizes(gpuprof, gpu_workload, size):
    gpuprof.measure(lambda: (gpu_workload.upload(size), gpu_workload.compute(ms=1)), rounds=2)
    gpuprof.check(min_utilization=0.5)
"""


def test_a_failed_hypothesis_test_reads_its_breach_never_expected(pytester):
    pytester.makepyfile(HYPOTHESIS)
    for enforce in ((), ("--gpu-budget",)):
        result = pytester.runpytest(*enforce, "--gpu-report=r.json")
        result.assert_outcomes(failed=1)
        test = entry(json.loads(pytester.path.joinpath("r.json").read_text()), "test_sizes")
        assert (test["outcome"], test["verdict"]) == ("failed", "FAIL: breach min_utilization")
        assert test["budget"]["breaches"]


SUITE = """
import os

def test_loop(gpuprof, gpu_workload):
    slow = 2 if os.environ.get("GPUPROF_SLOW") else 0
    gpuprof.measure(lambda: (gpu_workload.compute(ms=5 + slow)), rounds=5, warmup=1)

def test_other(gpu_workload):
    gpu_workload.compute(ms=1)
"""


def test_collect_only_deselected_and_failed_runs_never_become_the_baseline(pytester, monkeypatch):
    monkeypatch.delenv("GPUPROF_SLOW", raising=False)
    pytester.makepyfile(SUITE)
    pytester.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    for args, why in (
        (("--collect-only",), "was --collect-only"),
        (("-k", "loop"), "deselected 1 test"),
    ):
        result = pytester.runpytest("--gpu-save=main", *args)
        result.stdout.fnmatch_lines([f"gpuprof: no baseline saved: {why}*"])
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    # a failed gate saves nothing, so the next identical run still fails against main
    for _ in range(2):
        result = pytester.runpytest("-v", "--gpu-save=main", "--gpu-compare=main", "--gpu-compare-fail=kernel_ms:+5%")
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(["*test_loop: *regression*", "*no baseline saved: had failed tests*"])
        result.stdout.fnmatch_lines(
            ["compared with baseline .gpuprof/*/main@*.json (the newest accepted baseline named 'main'*"]
        )
    assert len(list(pytester.path.joinpath(".gpuprof").glob("*/*.json"))) == 1


def test_a_threshold_pointing_the_better_way_is_refused_for_every_metric(pytester):
    pytester.makepyfile(SUITE)
    for expression, fix in (("wall_ms:-5%", "wall_ms:+5%"), ("kernel_ms:-5%", "kernel_ms:+5%")):
        result = pytester.runpytest(f"--gpu-compare-fail={expression}")
        assert result.ret == 4
        result.stderr.fnmatch_lines([f"*gets worse going up: write {fix}*"])


def test_two_outputs_on_one_path_are_refused(pytester):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--gpu-report=out.json", "--gpu-html=out.json")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--gpu-report and --gpu-html are both out.json*"])


# 6. a rerun plugin: the final outcome decides, with the rerun count

FLAKY = """
import pathlib
import pytest

@pytest.mark.gpu_budget(min_utilization=0.0)
def test_flaky(gpu_workload):
    gpu_workload.compute(ms=2)
    marker = pathlib.Path("ran-once")
    if not marker.exists():
        marker.write_text("")
        raise AssertionError("first run fails")

@pytest.mark.gpu_budget(min_utilization=0.0)
def test_broken(gpu_workload):
    gpu_workload.compute(ms=2)
    raise AssertionError("always")
"""


def test_a_rerun_test_reads_its_final_outcome_and_the_rerun_count(pytester):
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(FLAKY)
    result, report = report_of(pytester, "--reruns=2", "--gpu-html=page.html", "--junitxml=junit.xml")
    assert result.parseoutcomes() == {"passed": 1, "failed": 1, "rerun": 3}
    flaky, broken = entry(report, "test_flaky"), entry(report, "test_broken")
    assert (flaky["outcome"], flaky["reruns"], flaky["verdict"]) == ("passed", 1, "ok")
    assert (broken["outcome"], broken["reruns"]) == ("failed", 2)
    page = {
        t["id"].rsplit("::", 1)[1]: t for t in page_data_of(pytester.path.joinpath("page.html").read_text())["tests"]
    }
    assert (page["test_flaky"]["outcome"], page["test_flaky"]["reruns"]) == ("passed", 1)
    assert (page["test_broken"]["outcome"], page["test_broken"]["reruns"]) == ("failed", 2)
    junit = pytester.path.joinpath("junit.xml").read_text()
    assert '<property name="gpuprof.reruns" value="1" />' in junit
    assert '<property name="gpuprof.reruns" value="2" />' in junit
