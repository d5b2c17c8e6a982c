"""Steps and regions as a user writes them: budgets on steps that ran, did not, or never
ended; nesting; regions inside steps. In real pytest sessions on the virtual clock."""

from __future__ import annotations

import pytest
from plugin_runs import UPLOAD_TEST, entry, report_of


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
