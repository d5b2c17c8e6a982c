"""Gates that see one kernel: each kernel's time kept by name per round, and
``--gpu-compare-fail=kernels:+N%`` naming the kernels that got slower (virtual clock)."""

from __future__ import annotations

import json

import pytest

TWO_KERNELS = """
import os

def test_two_kernels(gpuprof, gpu_workload):
    slower = float(os.environ.get("SLOWER", "1.0"))
    def body():
        with gpuprof.step("work"):
            gpu_workload.compute(ms=2, kind="fft")
            gpu_workload.compute(ms=10 * slower, kind="matmul")
    gpuprof.measure(body, rounds=5, warmup=0)
"""


@pytest.fixture
def baseline(pytester, monkeypatch):
    pytester.makepyfile(TWO_KERNELS)
    monkeypatch.setenv("SLOWER", "1.0")
    pytester.runpytest("--gpu-save=main", "--gpu-report=base.json").assert_outcomes(passed=1)
    return json.loads(pytester.path.joinpath("base.json").read_text())


def test_the_report_keeps_each_kernels_time_per_round(baseline):
    (test,) = baseline["tests"]
    assert test["metrics"]["kernel_totals"] == {"matmul": pytest.approx(10.0), "fft": pytest.approx(2.0)}
    assert test["rounds"]["kernels.matmul.total_ms"]["samples"] == [pytest.approx(10.0)] * 5


def test_one_kernel_one_percent_slower_fails_the_kernel_gate_naming_it(pytester, monkeypatch, baseline):
    monkeypatch.setenv("SLOWER", "1.01")
    result = pytester.runpytest("--gpu-compare=main", "--gpu-compare-fail=kernels:+0.5%", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*GPU regression against baseline*",
            "*kernel matmul ms: baseline 10.000 -> 10.100 (+0.100, +1.0%*p=*): regression",
        ]
    )
    assert "kernel fft ms" not in "\n".join(line for line in result.stdout.lines if "regression" in line)
    test = json.loads(pytester.path.joinpath("r.json").read_text())["tests"][0]
    assert test["verdict"] == "FAIL: regression kernel matmul ms"  # by its short name, as the comparison says
    assert pytester.runpytest("--gpu-compare=main", "--gpu-compare-fail=kernel_ms:+0.5%").ret == 1


def test_equal_code_fails_neither_gate(pytester, monkeypatch, baseline):
    result = pytester.runpytest("--gpu-compare=main", "--gpu-compare-fail=kernels:+0.5%,kernel_ms:+0.5%")
    result.assert_outcomes(passed=1)


def test_a_kernel_that_vanished_is_listed(pytester, baseline):
    pytester.makepyfile(TWO_KERNELS.replace('kind="fft"', 'kind="matmul"'))
    result = pytester.runpytest("--gpu-compare=main", "--gpu-compare-fail=kernels:+5%")
    result.assert_outcomes(failed=1)  # matmul now holds the fft's 2 ms as well
    result.stdout.fnmatch_lines(["*kernel fft ms: vanished (2.000 ms in the baseline)*"])


def test_a_kernel_that_appeared_is_listed_and_changes_come_largest_first():
    from pytest_gpuprof.verdict.compare import change_lines, compare_tests
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    def test(**totals):
        rounds = {f"kernels.{k}.total_ms": {"samples": [v] * 5} for k, v in totals.items()}
        return {"metrics": {"kernel_totals": totals}, "rounds": rounds}

    before, after = test(a=1.0, b=10.0), test(a=1.5, b=12.0, _Z3addPfS_i=3.0)
    changes = compare_tests(parse_thresholds("kernels:+5%"), before, after)
    lines = change_lines("t::x", changes)
    assert lines[1] == "    kernel add ms: appeared (3.000 ms now)"  # +3 ms, by its short name
    assert lines[2].startswith("    kernel b ms: baseline 10.000 -> 12.000")  # +2 ms
    assert lines[3].startswith("    kernel a ms: baseline 1.000 -> 1.500")  # +0.5 ms


def test_the_kernel_gate_takes_slower_only():
    from pytest_gpuprof.verdict.thresholds import CompareError, parse_thresholds

    assert parse_thresholds("kernels:+2%")[0].metric == "kernels"
    for bad in ("kernels:-2%", "kernels:+2pt"):
        with pytest.raises(CompareError, match="gates each kernel's time"):
            parse_thresholds(bad)


HISTORY = """
import os

def test_loop(gpu_workload, gpuprof):
    ms = float(os.environ["MS"])
    gpuprof.measure(lambda: gpu_workload.compute(ms=ms), rounds=5, warmup=0)
"""


def _history(pytester, monkeypatch, levels):
    pytester.makepyfile(HISTORY)
    for i, ms in enumerate(levels):
        monkeypatch.setenv("MS", str(ms))
        pytester.runpytest(f"--gpu-save=run{i}").assert_outcomes(passed=1)
    return pytester.path / ".gpuprof"


def test_history_marks_a_ten_percent_step_at_the_fourth_run_and_only_it(pytester, monkeypatch, capsys):
    from pytest_gpuprof import cli

    stored = _history(pytester, monkeypatch, [10, 10, 10, 11, 11, 11])
    capsys.readouterr()  # the runs' own output
    assert cli.main(["history", "--storage", str(stored), "--metric", "kernel_ms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("kernel_ms  (6 runs, 1 change point(s))")
    changed = [line for line in lines[1:] if "<- change" in line]
    assert len(changed) == 1 and changed[0].lstrip().startswith("run3 ") and "+10.0%" in changed[0]


def test_history_of_equal_runs_has_no_change_point_and_writes_a_page(pytester, monkeypatch, capsys, tmp_path):
    from pytest_gpuprof import cli

    stored = _history(pytester, monkeypatch, [10] * 6)
    capsys.readouterr()
    assert cli.main(["history", "--storage", str(stored)]) == 0
    assert "<- change" not in capsys.readouterr().out
    page = tmp_path / "history.html"
    assert cli.main(["history", "--storage", str(stored), "-o", str(page)]) == 0
    text = page.read_text()
    assert text.count("<section") == 3 and 'class="change"' not in text  # wall, kernels, utilization


def test_a_baseline_records_its_commit_and_branch(pytester, monkeypatch):
    import json
    import subprocess

    pytester.makepyfile(HISTORY)
    subprocess.run(["git", "init", "-q", "-b", "feature"], cwd=pytester.path, check=True)
    subprocess.run(
        ["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x"],
        cwd=pytester.path,
        check=True,
    )
    monkeypatch.setenv("MS", "1")
    pytester.runpytest("--gpu-save=main").assert_outcomes(passed=1)
    (saved,) = (pytester.path / ".gpuprof").glob("*/*.json")
    report = json.loads(saved.read_text())
    assert report["branch"] == "feature" and len(report["commit"]) == 40 and report["created"]


def test_a_kernel_too_small_to_matter_is_not_gated():
    from pytest_gpuprof.verdict.compare import compare_tests
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    def test(fill, gemm):
        totals = {"fill": fill, "gemm": gemm}
        rounds = {f"kernels.{k}.total_ms": {"samples": [v] * 5} for k, v in totals.items()}
        return {"metrics": {"kernel_ms": fill + gemm, "kernel_totals": totals}, "rounds": rounds}

    changes = compare_tests(parse_thresholds("kernels:+0.5%"), test(0.005, 30.0), test(0.0054, 30.0))
    assert [c.kernel for c in changes] == ["gemm"]  # the 5 us fill kernel, +8%, is under 1% of the kernel time
    changes = compare_tests(parse_thresholds("kernels:+0.5%"), test(0.5, 30.0), test(0.54, 30.0))
    assert {c.kernel: c.finding for c in changes} == {"fill": "regression", "gemm": "unchanged"}


def test_history_marks_the_runs_a_gate_would_stop_with_the_gates_own_rule():
    """``history`` and the gate read runs by one rule: a run beyond the tolerance bound of
    the runs before it is marked; runs within their spread are not, however they wander."""
    from pytest_gpuprof.baselines.history import outside_the_spread

    steady = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.1]
    assert outside_the_spread(steady) == ()
    assert outside_the_spread([*steady, 12.0]) == (7,)
    assert outside_the_spread([*steady, 8.0]) == (7,)  # either way from the level
    assert outside_the_spread([*steady, 12.0, 12.1]) == (7,)  # 12.0 began a level; 12.1 is of it
    assert outside_the_spread([10.0, 10.0]) == ()  # two runs: no spread to judge by


DRAWN = """
from hypothesis import given, settings
from pytest_gpuprof.strategies import buffer_sizes


def test_loop(gpu_workload, gpuprof):
    gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds=3, warmup=0)


@settings(settings.get_profile("gpuprof"), max_examples=4)
@given(size=buffer_sizes(1 << 10, 1 << 24))
def test_sizes(gpuprof, gpu_workload, size):
    gpuprof.measure(lambda: gpu_workload.upload(size), rounds=1, warmup=0)
"""


def test_a_hypothesis_test_is_not_charted_as_a_trend_and_the_history_says_why(pytester, capsys, tmp_path):
    """Its figures are those of the last example, whose sizes were drawn: a trend of them
    would chart the draw. The record counts its examples; the history names it on stderr,
    not charted, and charts the other test as before."""
    import json

    from pytest_gpuprof import cli

    pytest.importorskip("hypothesis")
    pytester.makepyfile(DRAWN)
    for i in range(3):
        result = pytester.runpytest(f"--gpu-save=run{i}", "--gpu-host-clock=virtual", "--gpu-report=r.json")
        result.assert_outcomes(passed=2)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    assert tests["test_sizes"]["examples"] >= 1 and "examples" not in tests["test_loop"]
    capsys.readouterr()
    assert cli.main(["history", "--storage", str(pytester.path / ".gpuprof")]) == 0
    out, err = capsys.readouterr()
    assert "test_loop" in out and "test_sizes" not in out
    assert "::test_sizes: measured inside hypothesis examples" in err
