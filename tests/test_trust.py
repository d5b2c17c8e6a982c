"""No gate silently off: every budget applies, and every verdict is recorded wherever it
is shown. Each test here is a mistake a user makes, or a path a verdict takes, in a real
pytest session on the host backend's virtual clock."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

UPLOAD_TEST = """
import pytest

{marker}
def test_upload(gpu_workload):
    gpu_workload.upload(1 << 20)
    gpu_workload.compute(ms=2)
"""


def report_of(pytester, *args, name="r.json"):
    result = pytester.runpytest("--gpu-budget", f"--gpu-report={name}", *args)
    return result, json.loads(pytester.path.joinpath(name).read_text())


def entry(report, name):
    (test,) = [t for t in report["tests"] if t["nodeid"].endswith(name)]
    return test


def test_a_step_budget_on_a_step_that_never_ran_is_a_breach_naming_the_steps_that_did(pytester):
    pytester.makepyfile(UPLOAD_TEST.format(marker='@pytest.mark.gpu_budget(steps={"uplaod": {"max_idle_ms": 1000}})'))
    result, report = report_of(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*step 'uplaod' never ran in the window; steps were: compute, upload (steps.uplaod)*"])
    test = entry(report, "test_upload")
    assert test["verdict"] == "FAIL: breach steps.uplaod"
    assert test["budget"]["breaches"][0]["kind"] == "missing"


def test_a_project_wide_step_budget_applies_where_the_step_runs(pytester):
    pytester.makepyprojecttoml("[tool.gpuprof.budget.steps.decode]\nmax_ms = 1000\n")
    pytester.makepyfile(UPLOAD_TEST.format(marker=""))
    result, report = report_of(pytester)
    result.assert_outcomes(passed=1)
    assert entry(report, "test_upload")["verdict"] == "ok"


def test_a_step_made_without_with_is_reported_and_its_budget_breaches(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(steps={"upload": {"max_ms": 1000}})
        def test_forgot_with(gpuprof, gpu_workload):
            gpuprof.step("upload")
            gpu_workload.compute(ms=2)
        """
    )
    result, report = report_of(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gpuprof.step('upload') was made but never entered*"])
    test = entry(report, "test_forgot_with")
    assert test["verdict"] == "FAIL: breach steps.upload"
    assert any("never entered" in note for note in test["metrics"]["notes"])


def test_a_step_entered_and_never_left_is_counted_and_reported(pytester):
    pytester.makepyfile(
        """
        def test_never_left(gpuprof, gpu_workload):
            gpuprof.step("load").__enter__()
            gpu_workload.upload(1 << 20)
        """
    )
    result, report = report_of(pytester)
    result.assert_outcomes(passed=1)
    test = entry(report, "test_never_left")
    assert "load" in test["metrics"]["steps"]
    assert any("entered and never left" in note for note in test["metrics"]["notes"])
    result.stdout.fnmatch_lines(["*GpuBudgetWarning: gpuprof: gpuprof.step('load') was entered and never left*"])


CLASS_TEST = """
import pytest

pytestmark = pytest.mark.gpu_budget(max_overhead_ms=10_000)

@pytest.mark.gpu_budget(min_utilization=0.99)
class TestPipeline:
    @pytest.mark.gpu_budget(steps={"upload": {"max_ms": 10_000}})
    def test_method(self, gpu_workload):
        gpu_workload.upload(64 << 20)
        gpu_workload.compute(ms=2)

@pytest.mark.gpu_budget(steps={"upload": {"max_ms": 10_000}})
@pytest.mark.gpu_budget(min_utilization=0.99, max_overhead_ms=0.5)
def test_stacked(gpu_workload):
    gpu_workload.upload(64 << 20)
    gpu_workload.compute(ms=2)

@pytest.mark.gpu_budget(min_utilization=0.99)
@pytest.mark.gpu_budget(min_utilization=0.0)
def test_closest_wins(gpu_workload):
    gpu_workload.upload(64 << 20)
    gpu_workload.compute(ms=2)
"""


def test_markers_of_the_class_the_module_and_stacked_ones_merge_key_by_key(pytester):
    pytester.makepyfile(CLASS_TEST)
    result, report = report_of(pytester)
    result.assert_outcomes(failed=2, passed=1)
    method = entry(report, "test_method")
    assert method["budget"]["limits"]["min_utilization"] == 0.99  # the class's
    assert method["budget"]["limits"]["max_overhead_ms"] == 10_000  # the module's
    assert method["verdict"] == "FAIL: breach min_utilization"
    stacked = entry(report, "test_stacked")
    assert stacked["verdict"] == "FAIL: breach max_overhead_ms,min_utilization"
    assert entry(report, "test_closest_wins")["budget"]["limits"]["min_utilization"] == 0.0


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
    result = pytester.runpytest("-W", "error::pytest_gpuprof.session.GpuBudgetWarning", "--gpu-report=r.json")
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


def test_a_fixture_kept_past_its_test_raises_naming_the_test(pytester):
    pytester.makepyfile(
        """
        kept = []

        def test_first(gpuprof):
            kept.append(gpuprof)
            with gpuprof.step("a"):
                pass

        def test_second():
            with kept[0].step("b"):
                pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*this gpuprof belongs to *test_first, which has ended*"])


def test_a_region_inside_a_step_leaves_the_steps_work_to_the_step(pytester):
    pytester.makepyfile(
        """
        def test_outer(gpuprof, gpu_workload):
            with gpuprof.step("outer"), gpuprof.region("partition"):
                gpuprof.backend.upload(1 << 20)
            m = gpuprof.check()
            assert m.steps["outer"].bytes == 1 << 20
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_compare_without_a_fail_expression_says_that_nothing_gates(pytester):
    pytester.makepyfile(UPLOAD_TEST.format(marker=""))
    pytester.runpytest("--gpu-save=main").assert_outcomes(passed=1)
    result = pytester.runpytest("--gpu-compare=main")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*nothing gates on these changes: give --gpu-compare-fail=*"])


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


THREAD_TEST = """
import threading

def test_threaded(gpuprof, gpu_workload):
    def work():
        with gpuprof.step("worker"):
            gpu_workload.compute(ms=2)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert gpuprof.check().steps["worker"].count == 1
"""


def test_a_thread_the_test_starts_runs_on_the_real_clock(pytester):
    pytester.makepyfile(THREAD_TEST)
    pytester.runpytest_subprocess("--gpu-host-clock=real", timeout=120).assert_outcomes(passed=1)


def test_the_virtual_clock_refuses_a_thread_the_test_starts_at_once_saying_what_to_do(pytester):
    pytester.makepyfile(THREAD_TEST)
    # in a process of its own, with a limit: a clock that hangs fails this test, not the suite
    result = pytester.runpytest_subprocess("--gpu-host-clock=virtual", timeout=120)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*thread 'Thread-*', which the test started, used the host backend on its virtual clock*--gpu-host-clock=real*"
        ]
    )


# the smaller ones
def test_a_baseline_named_like_a_file_is_refused_with_the_name_to_use(pytester):
    pytester.makepyfile(UPLOAD_TEST.format(marker=""))
    result = pytester.runpytest("--gpu-save=v1.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-save='v1.json': give the baseline a name, not a file name: --gpu-save=v1*"])


def _report(tmp_path, name, nodeid="t::a", **extra):
    from tests.test_compare import report

    path = tmp_path / name
    data = report(tests=[{"nodeid": nodeid, "outcome": "passed", "metrics": {"wall_ms": 1.0}}])
    path.write_text(json.dumps({**data, **extra}))
    return path


def test_merge_refuses_a_folder_or_a_missing_folder_and_keeps_any_partial_run(tmp_path, capsys):
    from pytest_gpuprof import cli

    done = _report(tmp_path, "done.json")
    cut = _report(tmp_path, "cut.json", nodeid="t::b", partial="was interrupted")
    assert cli.main(["merge", str(done), str(cut), "-o", str(tmp_path)]) == 2
    assert "is a folder; give a file path" in capsys.readouterr().err
    assert cli.main(["merge", str(done), str(cut), "-o", str(tmp_path / "missing" / "m.json")]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "missing").exists()
    merged = tmp_path / "m.json"
    assert cli.main(["merge", str(cut), str(done), "-o", str(merged)]) == 0
    assert json.loads(merged.read_text())["partial"] == "was interrupted (1 of 2)"
    capsys.readouterr()
    assert cli.main(["show", str(merged)]) == 0
    assert "partial: the run was interrupted (1 of 2)" in capsys.readouterr().out


def test_compare_names_a_metric_in_neither_report_as_such(tmp_path, capsys):
    from pytest_gpuprof import cli

    a, b = _report(tmp_path, "a.json"), _report(tmp_path, "b.json")
    assert cli.main(["compare", str(a), str(b), "--fail", "steps.uplod.host_ms:+5%"]) == 0
    out = capsys.readouterr().out
    assert "steps.uplod.host_ms: not measured in the baseline nor in this run: this gate cannot act" in out
    assert "gate inert: steps.uplod.host_ms:+5%" in out and "not in baseline" not in out


@pytest.mark.parametrize(("command", "words"), [("show", "JSON report"), ("compare", "METRIC:+N%"), ("merge", "file")])
def test_each_command_describes_its_arguments(command, words, capsys):
    from pytest_gpuprof import cli

    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    assert words in capsys.readouterr().out


def test_a_window_without_kernels_predicts_nothing():
    from pytest_gpuprof.analysis import metrics
    from pytest_gpuprof.analysis.model import DeviceInterval, Span
    from pytest_gpuprof.analysis.timeline import Timeline

    ms = 1_000_000
    steps = (Span("upload", 1, 0, 10 * ms, span_id=1),)
    copy = DeviceInterval("memcpy", 0, 10 * ms, bytes=1 << 20, span_id=1)
    timeline = Timeline(0, 10 * ms, "host", steps, (), (copy,))
    assert metrics.compute(timeline).what_if == {}
    assert metrics.what_if(timeline, "overlap:upload") is None


def test_the_xdist_summary_is_the_same_from_run_to_run(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("ms", [1, 1, 1, 1, 1, 1])
        def test_k(gpu_workload, ms):
            gpu_workload.compute(ms=ms)
        """
    )

    def rows():
        result = pytester.runpytest("-n", "2")
        result.assert_outcomes(passed=6)
        return [line.split()[0] for line in result.stdout.lines if line.startswith("test_the_xdist_summary")]

    first = rows()
    assert first == sorted(first) and len(first) == 6  # equal figures: in test order, whoever finished first
    assert rows() == first


def test_the_summary_shows_failures_first_and_counts_the_rest(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("i", range(300))
        @pytest.mark.gpu_budget(max_overhead_ms=1000)
        def test_trivial(i):
            pass

        @pytest.mark.gpu_budget(min_utilization=0.5)
        def test_zz_idle(gpuprof):
            with gpuprof.step("prepare"):
                gpuprof.backend.clock.spend(5_000_000)
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(passed=300, failed=1)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "gpuprof: true GPU utilization" in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("=") and i > start and "short test summary" in line)
    summary = lines[start:end]
    assert len(summary) <= 40, "\n".join(summary)
    assert "test_zz_idle" in summary[summary.index(next(x for x in summary if x.startswith("test "))) + 1]
    assert "and 281 more measured, none failed or breached; --gpu-summary=all lists them" in summary
    assert len(json.loads(pytester.path.joinpath("r.json").read_text())["tests"]) == 301
    every = pytester.runpytest("--gpu-summary=all")
    assert sum(line.startswith("test_the_summary") and "::test_trivial[" in line for line in every.stdout.lines) == 300


def test_an_outer_steps_budget_sees_what_ran_in_the_steps_inside_it(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(steps={"load_batch": {"max_idle_ms": 1}})
        def test_load(gpuprof, gpu_workload):
            with gpuprof.step("load_batch"):
                gpu_workload.upload(64 << 20)
            gpu_workload.compute(ms=2)
        """
    )
    result, report = report_of(pytester)
    result.assert_outcomes(failed=1)
    test = entry(report, "test_load")
    assert test["verdict"] == "FAIL: breach steps.load_batch.max_idle_ms"
    load = test["metrics"]["steps"]["load_batch"]
    assert load["bytes"] == 64 << 20 and load["idle_ms"] == 0.0 and load["idle_ms_inclusive"] > 1
    # the shares still add up: the inner step holds the idle, the outer one its own part
    steps = test["metrics"]["steps"]
    total = sum(s["idle_ms"] for s in steps.values()) + test["metrics"]["unattributed_ms"]
    assert total == pytest.approx(test["metrics"]["overhead_ms"])


def test_the_idle_lane_blames_the_copy_not_a_step_open_on_another_thread():
    from pytest_gpuprof.analysis import metrics
    from pytest_gpuprof.analysis.lanes import idle_items
    from pytest_gpuprof.analysis.model import DeviceInterval, Span
    from pytest_gpuprof.analysis.timeline import Timeline

    ms = 1_000_000
    steps = (Span("upload", 1, 0, 1 * ms, span_id=1), Span("sync", 2, 0, 10 * ms, span_id=2))
    device = (
        DeviceInterval("memcpy", 1 * ms, 10 * ms, bytes=1 << 20, span_id=1),
        DeviceInterval("kernel", 10 * ms, 11 * ms),
    )
    timeline = Timeline(0, 11 * ms, "host", steps, (), device)
    m = metrics.compute(timeline)
    drawn = {}
    for item in idle_items(timeline):
        for name, charged in item.args["charged_ms"].items():
            drawn[name] = drawn.get(name, 0.0) + charged
    assert m.steps["upload"].idle_ms == pytest.approx(9.5)
    assert drawn == pytest.approx({name: ms_ for name, ms_ in m.idle_by_step() if ms_})


def test_the_step_summary_reads_the_same_verdict(pytester, monkeypatch):
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile(CHECK_TEST)
    pytester.runpytest().assert_outcomes(failed=1, passed=1)
    text = summary.read_text()
    assert "| FAIL: breach min_utilization |" in text and "| ok |" in text


def test_the_backend_is_probed_on_the_device_asked_for(monkeypatch, pytestconfig):
    from pytest_gpuprof.capture import backends
    from pytest_gpuprof.config import Settings
    from pytest_gpuprof.runtime import DeviceRuntime

    probed = []

    def select(kind, device):
        probed.append(device)
        return "cuda", f"CUDA device {device} is visible"

    monkeypatch.setattr(backends, "select", select)
    monkeypatch.setattr(backends, "cuda_device_count", lambda: 4)
    runtime = DeviceRuntime(pytestconfig, Settings(device=2))
    assert runtime.select() == ("cuda", "CUDA device 2 is visible", 2)
    assert probed == [2]
