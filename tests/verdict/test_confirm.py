"""A regression is confirmed before it fails (``--gpu-compare-confirm``): the test runs again
in fresh pytest processes, and a regression one of them does not repeat is undecided.

The runner is made deterministic: each run of the test takes the kernel time its
environment says (the host backend's virtual clock), and a run that finds the file
``hiccup`` takes it away and is 30% slower, as one bad minute of a runner is."""

import json

import pytest

SUITE = """
import os, pathlib

def test_pipeline(gpuprof, gpu_workload):
    ms = float(os.environ.get("GPUPROF_MS", "10"))
    hiccup = pathlib.Path(__file__).with_name("hiccup")
    if hiccup.exists():
        hiccup.unlink()
        ms *= 1.3
    gpuprof.measure(lambda: gpu_workload.compute(ms=ms), rounds=5, warmup=0)
"""
MAIN_RUNS = (10.1, 10.3, 9.8, 10.2, 9.9, 10.0)  # the newest last
GATE = "--gpu-compare-fail=kernel_ms:+5%"


@pytest.fixture
def saved(pytester, monkeypatch):
    pytester.makepyfile(test_pipeline=SUITE)
    for ms in MAIN_RUNS:
        monkeypatch.setenv("GPUPROF_MS", str(ms))
        pytester.runpytest("--gpu-save=main", "--gpu-host-clock=virtual").assert_outcomes(passed=1)
    return pytester


def _run(pytester, monkeypatch, ms, *args):
    monkeypatch.setenv("GPUPROF_MS", str(ms))
    result = pytester.runpytest("--gpu-compare=main", "--gpu-host-clock=virtual", GATE, "--gpu-report=r.json", *args)
    (entry,) = json.loads(pytester.path.joinpath("r.json").read_text())["tests"]
    return result, entry


def test_a_regression_one_fresh_run_does_not_repeat_is_undecided(saved, monkeypatch):
    saved.path.joinpath("hiccup").touch()
    result, entry = _run(saved, monkeypatch, 10.0)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "gpuprof: test_pipeline.py::test_pipeline: undecided: kernel_ms: moved *x the threshold kernel_ms:+5%, "
            "but not confirmed: 0 of 1 fresh runs repeated it: 10 (unchanged)*"
        ]
    )
    assert entry["gate"]["decision"] == "undecided"
    (kernel,) = [c for c in entry["comparisons"] if c["metric"] == "kernel_ms"]
    assert kernel["finding"] == "inconclusive" and kernel["unconfirmed"].startswith("0 of 1 fresh runs")


def test_a_regression_the_fresh_runs_repeat_fails_and_says_so(saved, monkeypatch):
    result, entry = _run(saved, monkeypatch, 13.0, "--gpu-compare-confirm=2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GPU regression against baseline*", "*confirmed by 2 fresh runs of the test*"])
    assert entry["gate"]["decision"] == "regression" and entry["gate"]["confirmed_by"] == 2


def test_with_confirmation_off_the_first_run_decides(saved, monkeypatch):
    saved.path.joinpath("hiccup").touch()
    result, entry = _run(saved, monkeypatch, 10.0, "--gpu-compare-confirm=0")
    result.assert_outcomes(failed=1)
    assert entry["gate"]["decision"] == "regression"
    assert "confirmed" not in result.stdout.str()


def test_a_fresh_run_that_cannot_measure_leaves_the_regression_standing(saved, monkeypatch):
    """The fresh run finds the test broken (here: no such test any more): the regression
    fails its test, and the note says it could not be confirmed."""
    saved.path.joinpath("test_pipeline.py").write_text(
        SUITE.replace("ms *= 1.3", "ms *= 1.3\n    pathlib.Path(__file__).write_text('')")
    )
    saved.path.joinpath("hiccup").touch()
    result, entry = _run(saved, monkeypatch, 10.0)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*note: not confirmed (fresh run 1 exited * without measuring the test*): the regression stands*"]
    )
    assert entry["gate"]["decision"] == "regression"
