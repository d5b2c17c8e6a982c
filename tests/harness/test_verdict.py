"""One verdict per test, however the test was written: markers that arrive late, checks
the test expected, comparisons that cannot fail, work outside the windows, skips, and
inputs and outputs that cannot be trusted. Each case here failed before the verdict was
built in one place (``verdict.outcome``)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from plugin_runs import UPLOAD_TEST, entry

from pytest_gpuprof.verdict.budget import Breach
from pytest_gpuprof.verdict.outcome import Check, Judged, TestVerdict, window_rule


def report_of(pytester, name="r.json"):
    return json.loads(pytester.path.joinpath(name).read_text())


# a window of 5 ms of kernels after a 16 MiB upload: well under 99% utilization
UPLOAD_THEN_KERNELS = """
import pytest

def test_upload(gpu_workload):
    gpu_workload.upload(16 << 20)
    gpu_workload.compute(ms=5)
"""

ADOPT_PLUGIN = """
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.gpu_budget(min_utilization=0.99))
"""


# 1. markers, however they arrive


def test_a_marker_added_by_a_plugin_given_with_p_fails_a_breach(pytester):
    pytester.makepyfile(gpuprof_adopt=ADOPT_PLUGIN, test_by_plugin=UPLOAD_THEN_KERNELS)
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "gpuprof_adopt", "--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    assert entry(report_of(pytester), "test_upload")["verdict"] == "FAIL: breach min_utilization"


def test_a_marker_added_by_a_plugin_measures_a_test_with_no_fixture(pytester):
    pytester.makepyfile(
        gpuprof_adopt=ADOPT_PLUGIN,
        test_by_plugin="""
        def test_plain(pytestconfig):
            import time
            time.sleep(0.01)
        """,
    )
    pytester.syspathinsert()
    # the real clock: the virtual one gives host code no time, and a window of 0 ms no utilization
    args = ("--gpu-host-clock=real", "-p", "gpuprof_adopt", "--gpu-budget", "--gpu-report=r.json")
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)  # measured whole: no kernels in the call, 0% < 99%
    assert entry(report_of(pytester), "test_plain")["verdict"] == "FAIL: breach min_utilization"


def test_a_trylast_conftest_hook_adds_a_marker_that_counts(pytester):
    pytester.makeconftest(
        ADOPT_PLUGIN.replace("def pytest_collection", "@pytest.hookimpl(trylast=True)\ndef pytest_collection")
    )
    pytester.makepyfile(UPLOAD_THEN_KERNELS)
    pytester.runpytest("--gpu-budget").assert_outcomes(failed=1)


@pytest.mark.parametrize("where", ["fixture", "test"])
def test_applymarker_counts_from_a_fixture_and_from_the_test(pytester, where):
    marker = "request.applymarker(pytest.mark.gpu_budget(min_utilization=0.99))"
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.fixture
        def strict(request):
            {marker if where == "fixture" else "pass"}

        def test_upload(gpu_workload, strict, request):
            {marker if where == "test" else "pass"}
            gpu_workload.upload(16 << 20)
            gpu_workload.compute(ms=5)
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    assert entry(report_of(pytester), "test_upload")["verdict"] == "FAIL: breach min_utilization"


def test_a_bad_marker_added_late_fails_its_test_with_the_reason(pytester):
    pytester.makepyfile(
        """
        import pytest

        def test_upload(gpu_workload, request):
            request.applymarker(pytest.mark.gpu_budget(min_utilisation=0.5))
            gpu_workload.compute(ms=5)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*unknown budget key*min_utilisation*"])


# 2. a regression in the verdict beside a breach warning, and its record in the JSON

SLOWER = """
import pytest

@pytest.mark.gpu_budget(min_utilization=0.99)
def test_loop(gpuprof, gpu_workload):
    gpuprof.measure(lambda: (gpu_workload.upload(4 << 20), gpu_workload.compute(ms={ms})), rounds=5, warmup=0)
"""


def test_a_regression_and_a_breach_warning_are_both_in_the_verdict(pytester):
    pytester.makepyfile(test_loop=SLOWER.format(ms=2))
    pytester.runpytest("--gpu-save=base").assert_outcomes(passed=1, warnings=1)
    pytester.makepyfile(test_loop=SLOWER.format(ms=4))
    result = pytester.runpytest("--gpu-compare=base", "--gpu-compare-fail=kernel_ms:+5%", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    test = entry(report_of(pytester), "test_loop")
    assert test["verdict"] == "FAIL: regression kernel_ms; warn: breach min_utilization"
    (kernel,) = [c for c in test["comparisons"] if c["threshold"] == "kernel_ms:+5%"]
    assert kernel["finding"] == "regression" and kernel["rounds"] == [5, 5] and kernel["inert"] is False
    assert kernel["before"] == pytest.approx(2.0, rel=0.01) and kernel["after"] == pytest.approx(4.0, rel=0.01)
    assert 0 < kernel["p"] < 0.05
    result.stdout.fnmatch_lines(["*FAIL: regression kernel_ms; warn: breach min_utilization*"])


# 3. gates that cannot fail say so; --gpu-rounds and measure(rounds=) combine

MARKER_ONLY = """
import pytest

@pytest.mark.gpu_budget(min_utilization=0.0)
def test_whole(gpu_workload):
    gpu_workload.compute(ms={ms})
"""


def test_a_gate_on_a_test_of_one_round_says_it_cannot_fail(pytester):
    pytester.makepyfile(test_whole=MARKER_ONLY.format(ms=2))
    pytester.runpytest("--gpu-save=base").assert_outcomes(passed=1)
    pytester.makepyfile(test_whole=MARKER_ONLY.format(ms=6))
    result = pytester.runpytest("-v", "--gpu-compare=base", "--gpu-compare-fail=kernel_ms:+5%", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, warnings=1)
    test = entry(report_of(pytester), "test_whole")
    assert test["verdict"] == "warn: undecided kernel_ms; gate inert: kernel_ms:+5%"
    (kernel,) = [c for c in test["comparisons"] if c["threshold"] == "kernel_ms:+5%"]
    assert kernel["inert"] is True and kernel["rounds"] == [1, 1]
    out = result.stdout.str()
    assert "--gpu-compare-fail=kernel_ms:+5% cannot fail this test" in out
    assert "gate inert: kernel_ms:+5%" in out and "inert: 1 vs 1 rounds can never reach p < 0.05" in out


MEASURED = """
import pytest

def test_measured(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds={rounds}, warmup=0)
"""


def test_an_inert_gate_names_the_side_short_of_rounds(pytester):
    # a baseline of one round against a run of ten: the baseline is the cause, not the test
    pytester.makepyfile(test_measured=MEASURED.format(rounds=1))
    pytester.runpytest("--gpu-save=base").assert_outcomes(passed=1)
    pytester.makepyfile(test_measured=MEASURED.format(rounds=10))
    result = pytester.runpytest("--gpu-compare=base", "--gpu-compare-fail=kernel_ms:+5%")
    result.assert_outcomes(passed=1, warnings=1)
    out = result.stdout.str()
    assert "the baseline holds 1 round of kernel_ms against this run's 10" in out
    assert "4 or more rounds" not in out
    # and the other way round: the run is short
    pytester.makepyfile(test_measured=MEASURED.format(rounds=10))
    pytester.runpytest("--gpu-save=ten").assert_outcomes(passed=1)
    pytester.makepyfile(test_measured=MEASURED.format(rounds=1))
    out = pytester.runpytest("--gpu-compare=ten", "--gpu-compare-fail=kernel_ms:+5%").stdout.str()
    assert "this run has 1 round of kernel_ms against the baseline's 10: it needs 2 or more" in out


def test_gpu_rounds_raises_the_rounds_a_measure_asks_for(pytester):
    pytester.makepyfile(
        """
        def test_loop(gpuprof, gpu_workload):
            few = gpuprof.measure(lambda: gpu_workload.compute(ms=1), rounds=2, warmup=0)
            many = gpuprof.measure(lambda: gpu_workload.compute(ms=1), rounds=12, warmup=0)
            assert len(few.rounds["wall_ms"].samples) == 9
            assert len(many.rounds["wall_ms"].samples) == 12
        """
    )
    pytester.runpytest("--gpu-rounds=9").assert_outcomes(passed=1)


# 5. work outside measure() is said, never silently dropped


def test_device_work_outside_measure_is_reported_and_not_judged(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(min_utilization=0.9)
        def test_loop(gpuprof, gpu_workload):
            gpu_workload.upload(256 << 20)
            gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds=3, warmup=0)
            gpu_workload.upload(1 << 20)
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, warnings=2)
    before, after = entry(report_of(pytester), "test_loop")["outside_windows"]
    assert before.startswith("device work before a measure window: 1 memcpy (256.0 MiB")
    assert after.startswith("device work after the last measure window: 1 memcpy (1.0 MiB")
    assert "no budget judged it" in before
    result.stdout.fnmatch_lines(["*gpuprof: device work before a measure window: 1 memcpy (256.0 MiB*"])


def test_fixture_set_up_is_in_no_window_and_not_reported_as_outside(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def staged(gpu_workload):
            gpu_workload.upload(8 << 20)

        @pytest.mark.gpu_budget(min_utilization=0.9)
        def test_loop(gpuprof, gpu_workload, staged):
            gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds=3, warmup=0)
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(passed=1)
    assert "outside_windows" not in entry(report_of(pytester), "test_loop")


# 6. verdicts that agree with the outcome

EXPECTED_BREACH = """
import pytest
from pytest_gpuprof import GpuBudgetExceeded

@pytest.mark.gpu_budget({marker})
def test_single_lock(gpuprof, gpu_workload):
    gpu_workload.partitions(n=4, upload_bytes=16 << 20, compute_ms=2, workers=2, strategy="single-lock", rounds=1, warmup=0)
    with pytest.raises(GpuBudgetExceeded):
        gpuprof.check(min_utilization=0.99)
"""


def test_a_breach_the_test_expected_reads_expected(pytester):
    pytester.makepyfile(EXPECTED_BREACH.format(marker=""))
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(passed=1)
    test = entry(report_of(pytester), "test_single_lock")
    assert test["verdict"] == "expected: breach min_utilization"
    assert test["checks"] == [
        {"breaches": test["judgement"]["expected"], "expected": True, "window": 0, "asked": ["min_utilization"]}
    ]


def test_the_project_budget_still_fails_a_test_that_expected_another_breach(pytester):
    pytester.makepyfile(EXPECTED_BREACH.format(marker="max_discrepancy=0.01"))
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    assert entry(report_of(pytester), "test_single_lock")["verdict"] == "FAIL: breach max_discrepancy"


def test_a_test_skipped_after_a_breaching_window_reads_skipped(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(min_utilization=0.99)
        def test_skips(gpuprof, gpu_workload):
            gpuprof.measure(lambda: gpu_workload.upload(4 << 20), rounds=1, warmup=0)
            pytest.skip("not on this machine")
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(skipped=1)
    test = entry(report_of(pytester), "test_skips")
    assert (test["outcome"], test["verdict"]) == ("skipped", "skipped")


def test_a_leak_is_in_the_verdict(pytester):
    pytester.makepyfile(
        """
        import pytest
        kept = []

        @pytest.mark.gpu_budget(min_utilization=0.0)
        def test_leaks(gpu_workload):
            kept.append(gpu_workload.alloc(1 << 20))
            gpu_workload.compute(ms=1)
        """
    )
    result = pytester.runpytest("--gpu-report=r.json")
    result.assert_outcomes(passed=1, errors=1)
    assert entry(report_of(pytester), "test_leaks")["verdict"] == "FAIL: leak"


# the rule itself, on hand-made records

UTIL = Breach("utilization", 0.5, 0.8, "min", "min_utilization")
DISC = Breach("discrepancy", 0.4, 0.2, "max", "max_discrepancy")


@pytest.mark.parametrize(
    ("verdict", "status"),
    [
        (TestVerdict(), "-"),
        (TestVerdict(budget_set=True), "ok"),
        (TestVerdict(budget_set=True, unjudged=("sm_utilization not measured: x",)), "not measured"),
        (TestVerdict(budget_set=True, breaches=(UTIL,)), "warn: breach min_utilization"),
        (TestVerdict(budget_set=True, breaches=(UTIL,), breaches_failed=True), "FAIL: breach min_utilization"),
        (
            TestVerdict(budget_set=True, breaches=(UTIL,), regressions=("kernel_ms",)),
            "FAIL: regression kernel_ms; warn: breach min_utilization",
        ),
        (
            TestVerdict(budget_set=True, breaches=(UTIL,), xfail=True, outcome="skipped"),
            "xfail: breach min_utilization",
        ),
        (TestVerdict(budget_set=True, breaches=(UTIL,), breaches_failed=True, outcome="skipped"), "skipped"),
        (TestVerdict(budget_set=True, expected=(UTIL,)), "expected: breach min_utilization"),
        (TestVerdict(gated=True, inert=("kernel_ms:+5%",)), "ok; gate inert: kernel_ms:+5%"),
        (TestVerdict(records_lost=True), "records lost"),
        (TestVerdict(budget_set=True, leaks=("x",), records_lost=True), "FAIL: leak; records lost"),
    ],
)
def test_the_verdict_rule(verdict, status):
    assert verdict.status == status
    assert verdict.failed == status.startswith("FAIL")


def test_a_caught_check_expects_only_the_keys_it_breached():
    one = [Judged((UTIL, DISC))]
    counted, expected = window_rule(one, [Check((UTIL,), expected=True, window=0), Check((DISC,), window=0)])
    assert ([b.key for b in counted], expected) == (["max_discrepancy"], [UTIL])
    # a caught check asked about utilization only: the project budget's discrepancy still counts
    asked = Check((UTIL, DISC), expected=True, asked=frozenset({"min_utilization"}), window=0)
    counted, expected = window_rule(one, [asked])
    assert ([b.key for b in counted], expected) == (["max_discrepancy"], [UTIL])
    assert window_rule(one, [Check((UTIL, DISC), expected=True, window=0)]) == ([], [UTIL, DISC])


# 8-10. inputs and outputs that cannot be trusted


def test_merge_refuses_a_test_present_in_two_reports(tmp_path, capsys):
    from pytest_gpuprof import cli

    m = {"wall_ms": 10.0, "kernel_ms": 5.0, "truth": "host"}
    machine = {"id": "host-x", "gpu": "cpu", "driver": "", "pcie": "none", "backend": "host"}
    paths = []
    for name in ("a.json", "b.json"):
        report = {"schema": 1, "machine": machine, "tests": [{"nodeid": "t.py::test_x", "metrics": m}]}
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(report))
    assert cli.main(["merge", *map(str, paths), "-o", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert "t.py::test_x" in err and "a.json" in err and "b.json" in err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda t: t["rounds"]["wall_ms"].update(samples=["a", "b"]), "rounds.wall_ms.samples"),
        (lambda t: t.update(metrics=None), "metrics"),
        (lambda t: t["metrics"].update(kernel_ms="fast"), "metrics.kernel_ms"),
    ],
)
def test_a_malformed_baseline_is_one_line_and_the_test_keeps_its_outcome(pytester, damage, field):
    pytester.makepyfile(
        """
        def test_loop(gpuprof, gpu_workload):
            gpuprof.measure(lambda: gpu_workload.compute(ms=2), rounds=3, warmup=0)
        """
    )
    pytester.runpytest("--gpu-save=base").assert_outcomes(passed=1)
    (saved,) = pytester.path.joinpath(".gpuprof").glob("*/*.json")
    baseline = json.loads(saved.read_text())
    damage(baseline["tests"][0])
    saved.write_text(json.dumps(baseline))
    result = pytester.runpytest("--gpu-compare=base", "--gpu-compare-fail=kernel_ms:+5%", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines([f"*{saved.name}*{field}*comparison not made*"])
    assert "Traceback" not in result.stdout.str()
    assert "comparisons" not in entry(report_of(pytester), "test_loop")


def test_a_report_through_a_symlink_writes_its_target(pytester):
    pytester.makepyfile(UPLOAD_THEN_KERNELS)
    target = pytester.path / "real.json"
    target.write_text("{}")
    (pytester.path / "link.json").symlink_to(target)
    pytester.runpytest("--gpu-report=link.json").assert_outcomes(passed=1)
    assert (pytester.path / "link.json").is_symlink()
    assert json.loads(target.read_text())["tests"][0]["nodeid"].endswith("test_upload")


def test_a_fifo_or_device_report_path_is_refused_before_the_first_test(pytester):
    pytester.makepyfile(UPLOAD_THEN_KERNELS)
    fifo = pytester.path / "pipe.json"
    os.mkfifo(fifo)
    result = pytester.runpytest("--gpu-report=pipe.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-report=pipe.json: is a FIFO, not a regular file*"])
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    if os.path.exists("/dev/null"):
        result = pytester.runpytest("--gpu-html=/dev/null")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*--gpu-html=/dev/null: is a character device*"])
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# 11. smaller things, each confusing a user


def test_the_gpuprof_profile_needs_no_import_first(pytester):
    pytester.makepyfile(
        """
        from hypothesis import given, settings, strategies as st

        @settings(settings.get_profile("gpuprof"), max_examples=2)
        @given(st.integers(0, 3))
        def test_sizes(n):
            assert settings().deadline is None
        """
    )
    # a process of its own: nothing here has imported hypothesis before the test module
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_the_strategies_import_first_in_a_fresh_process():
    """``import pytest_gpuprof.strategies`` before anything imported hypothesis: hypothesis's
    import runs its entry points, the profile's among them, while the strategies module is
    still being imported."""
    code = "import pytest_gpuprof.strategies as s; from hypothesis import settings; settings.get_profile(s.PROFILE)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("expression", "fix"), [("utilization:+2pt", "utilization:-2pt"), ("overhead_ms:-3%", "overhead_ms:+3%")]
)
def test_a_compare_sign_that_points_the_better_way_is_refused(expression, fix):
    from pytest_gpuprof.verdict.thresholds import CompareError, parse_thresholds

    with pytest.raises(CompareError, match=f"gets worse going .*: write {re.escape(fix)}"):
        parse_thresholds(expression)


def test_metrics_before_anything_was_measured_is_a_clear_error(pytester):
    pytester.makepyfile(
        """
        import pytest

        def test_early(gpuprof):
            with pytest.raises(ValueError, match="gpuprof.metrics: nothing measured yet in .*test_early"):
                gpuprof.metrics
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_window_of_no_time_has_no_utilization_and_breaches_nothing(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(min_utilization=0.5)
        def test_nothing():
            pass
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, warnings=1)
    test = entry(report_of(pytester), "test_nothing")
    assert test["metrics"]["utilization"] is None and test["verdict"] == "not measured"
    result.stdout.fnmatch_lines(["*GPU budget not judged: min_utilization not measured: the window lasted 0 ms*"])


def test_usage_errors_that_used_to_pass_or_mislead(pytester):
    pytester.makepyfile(UPLOAD_THEN_KERNELS)
    result = pytester.runpytest("--gpu-device=5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-device=5: the host backend has one device, 0*"])
    result = pytester.runpytest("--gpu-compare-fail=wall_ms:+5%")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-compare-fail (compared with the latest baseline): no baseline*"])


def test_a_summary_of_no_rows_prints_no_header(pytester):
    pytester.makepyfile(UPLOAD_THEN_KERNELS)
    result = pytester.runpytest("--gpu-summary=0")
    result.assert_outcomes(passed=1)
    assert "largest idle cause" not in result.stdout.str()
    result.stdout.fnmatch_lines(["and 1 more measured, none failed or breached (1 with no budget or gate)*"])


def test_a_backtick_in_a_test_id_keeps_its_code_span():
    from pytest_gpuprof.output.report import markdown_summary

    m = {"wall_ms": 1.0, "utilization": 0.5, "reported_utilization": None, "overhead_ms": 0.5}
    summary = markdown_summary([{"nodeid": "t.py::test[a`b|c]", "metrics": m, "verdict": "ok"}], {}, [])
    assert "| ``t.py::test[a`b\\|c]`` |" in summary


def test_history_names_what_was_wrong(tmp_path, capsys):
    from pytest_gpuprof import cli

    assert cli.main(["history", "--storage", str(tmp_path / "nonexistent")]) == 2
    assert "nonexistent: no such folder" in capsys.readouterr().err
    machine = tmp_path / "host-x"
    machine.mkdir()
    report = {
        "schema": 1,
        "machine": {"id": "host-x"},
        "tests": [{"nodeid": "t.py::test_steady", "metrics": {"wall_ms": 1.0}}],
    }
    (machine / "0001_a.json").write_text(json.dumps(report))
    assert cli.main(["history", "--storage", str(tmp_path), "--metric", "wal_ms"]) == 2
    assert "--metric wal_ms: no such metric" in capsys.readouterr().err
    assert cli.main(["history", "--storage", str(tmp_path), "--test", "steady"]) == 2
    assert "try --test '*steady*'" in capsys.readouterr().err
    assert cli.main(["history", "--storage", str(tmp_path), "--test", "*steady*"]) == 0


def test_rounds_of_uploads_only_make_no_declared_bytes_note(pytester):
    pytester.makepyfile(
        """
        def test_up(gpuprof, gpu_workload):
            m = gpuprof.measure(lambda: gpu_workload.upload(64 << 20), rounds=3, warmup=1)
            assert m.notes == () and m.steps["upload"].count == 1
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_asyncio_tasks_with_steps_on_one_thread_are_said(pytester):
    pytester.makepyfile(
        """
        import asyncio

        def test_tasks(gpuprof, gpu_workload):
            async def worker(name, ms):
                with gpuprof.step(name):
                    await asyncio.sleep(0)
                    gpu_workload.compute(ms=ms)
                    await asyncio.sleep(0)
                    gpu_workload.compute(ms=ms)

            async def main():
                await asyncio.gather(worker("a", 1), worker("b", 2), worker("c", 3))

            asyncio.run(main())
            (note,) = [n for n in gpuprof.metrics.notes if "overlap without nesting" in n]
            assert "asyncio tasks" in note
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_every_output_shows_the_one_verdict_of_a_marker_from_a_plugin(pytester, monkeypatch):
    pytester.makepyfile(gpuprof_adopt=ADOPT_PLUGIN, test_by_plugin=UPLOAD_THEN_KERNELS)
    pytester.syspathinsert()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    args = ("-p", "gpuprof_adopt", "--gpu-budget", "--gpu-report=r.json", "--junitxml=j.xml", "--gpu-html=h.html")
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    verdict = "FAIL: breach min_utilization"
    assert entry(report_of(pytester), "test_upload")["verdict"] == verdict
    result.stdout.fnmatch_lines([f"*test_by_plugin.py::test_upload *{verdict}"])
    assert f'name="gpuprof.verdict" value="{verdict}"' in (pytester.path / "j.xml").read_text()
    (line,) = [x for x in (pytester.path / "summary.md").read_text().splitlines() if "test_upload" in x]
    assert line.endswith(f"| {verdict} |")
    assert re.findall(r'"verdict": ?"([^"]*)"', (pytester.path / "h.html").read_text()) == [verdict]


def test_a_kernel_that_appeared_or_vanished_is_a_finding_not_an_inert_gate():
    from pytest_gpuprof.verdict.change import Change
    from pytest_gpuprof.verdict.compare import inert_gates
    from pytest_gpuprof.verdict.thresholds import parse_thresholds

    (gate,) = parse_thresholds("kernels:+1%")
    changes = [Change(gate, "appeared", None, 2.0), Change(gate, "vanished", 2.0, None)]
    assert not any(c.inert for c in changes) and inert_gates(changes, [gate]) == []
    assert Change(gate, "inconclusive", 1.0, 3.0, 0.5, (1, 1)).inert


CHECK_TEST = """
import pytest
from pytest_gpuprof import GpuBudgetExceeded

def test_failing_check(gpu_workload, gpuprof):
    gpu_workload.upload(64 << 20)
    gpu_workload.compute(ms=2)
    gpuprof.check(min_utilization=0.99)

def test_passing_check(gpu_workload, gpuprof):
    gpu_workload.upload(1 << 20)
    gpu_workload.compute(ms=2)
    gpuprof.check(min_utilization=0.01)
"""


def test_a_check_passing_or_failing_is_the_tests_recorded_verdict(pytester):
    pytester.makepyfile(CHECK_TEST)
    result = pytester.runpytest("--gpu-report=r.json", "--junitxml=j.xml")  # no --gpu-budget: check() still asserts
    result.assert_outcomes(failed=1, passed=1)
    report = json.loads(pytester.path.joinpath("r.json").read_text())
    failing = entry(report, "test_failing_check")
    assert failing["outcome"] == "failed"
    assert failing["verdict"] == "FAIL: breach min_utilization"
    assert failing["budget"]["limits"] == {"min_utilization": 0.99}
    assert [b["key"] for b in failing["budget"]["breaches"]] == ["min_utilization"]
    passing = entry(report, "test_passing_check")
    assert (passing["verdict"], passing["budget"]["limits"]) == ("ok", {"min_utilization": 0.01})
    result.stdout.fnmatch_lines(["*test_failing_check*FAIL: breach min_utilization*", "budget breaches and where*"])
    properties = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")
    }
    assert properties["test_failing_check"]["gpuprof.verdict"] == "FAIL: breach min_utilization"
    assert properties["test_passing_check"]["gpuprof.verdict"] == "ok"


def test_a_breach_failed_by_warnings_as_errors_reads_fail(pytester):
    pytester.makepyfile(UPLOAD_TEST.format(marker="@pytest.mark.gpu_budget(min_utilization=0.99)"))
    result = pytester.runpytest("-W", "error::pytest_gpuprof.GpuBudgetWarning", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    report = json.loads(pytester.path.joinpath("r.json").read_text())
    assert entry(report, "test_upload")["verdict"] == "FAIL: breach min_utilization"


def test_a_breach_warning_points_at_the_test(pytester):
    pytester.makepyfile(UPLOAD_TEST.format(marker="@pytest.mark.gpu_budget(min_utilization=0.99)"))
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        ["*test_a_breach_warning_points_at_the_test.py:*: GpuBudgetWarning: GPU budget exceeded*"]
    )
    assert "session.py" not in result.stdout.str()


def test_a_teardown_error_is_the_tests_outcome_in_the_report(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def broken():
            yield
            raise RuntimeError("teardown failed")

        def test_torn(gpu_workload, broken):
            gpu_workload.compute(ms=2)
        """
    )
    result = pytester.runpytest("--gpu-report=r.json")
    result.assert_outcomes(passed=1, errors=1)
    assert entry(json.loads(pytester.path.joinpath("r.json").read_text()), "test_torn")["outcome"] == "failed"


def test_a_regression_gate_failure_is_the_tests_verdict(pytester, monkeypatch):
    pytester.makepyfile(
        """
        import os

        def test_slower(gpu_workload):
            gpu_workload.partitions(n=2, upload_bytes=1 << 20, compute_ms=int(os.environ["MS"]), rounds=5, warmup=0)
        """
    )
    monkeypatch.setenv("MS", "2")
    pytester.runpytest("--gpu-save=main").assert_outcomes(passed=1)
    monkeypatch.setenv("MS", "4")
    result = pytester.runpytest("--gpu-compare=main", "--gpu-compare-fail=wall_ms:+10%", "--gpu-report=r.json")
    result.assert_outcomes(failed=1)
    test = entry(json.loads(pytester.path.joinpath("r.json").read_text()), "test_slower")
    assert test["verdict"] == "FAIL: regression wall_ms"


def test_the_step_summary_reads_the_same_verdict(pytester, monkeypatch):
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile(CHECK_TEST)
    pytester.runpytest().assert_outcomes(failed=1, passed=1)
    text = summary.read_text()
    assert "| FAIL: breach min_utilization |" in text and "| ok |" in text


WINDOWED = """
import pytest

@pytest.mark.gpu_budget(min_utilization=0.9)
def test_window_breaches(gpuprof, gpu_workload):
    with gpuprof.window("pipeline"):
        gpu_workload.upload(8 << 20)
        gpu_workload.compute(ms=1)

def test_window_passes(gpuprof, gpu_workload):
    with gpuprof.window("pipeline") as done:
        gpu_workload.compute(ms=1)
    assert done and done[0].metrics.kernel_ms > 0
"""


def test_a_window_a_test_opens_itself_is_judged_and_reported(pytester):
    """``gpuprof.window()`` measured its block and dropped it: the test was in no output at
    all (no row, no JSON entry, no page) and its budget judged nothing. It is a window of the
    test as a ``measure()`` round is."""
    import json

    pytester.makepyfile(WINDOWED)
    result = pytester.runpytest("--gpu-budget", "--gpu-host-clock=virtual", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_window_breaches*utilization * < 90.0% (min_utilization)*"])
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    assert set(tests) == {"test_window_breaches", "test_window_passes"}
    assert tests["test_window_breaches"]["verdict"] != "ok" and tests["test_window_passes"]["windows"] == 1
