"""Real pytest sessions on the host backend, read through their outcomes and reports."""

import json

import pytest
from plugin_runs import entry, report_of

IDLE_TEST = """

def test_idle(gpuprof):
    with gpuprof.step("prepare"):
        gpuprof.backend.clock.spend(20_000_000)
"""

WORKLOAD_TEST = """
def test_pipeline(gpu_workload):
    gpu_workload.partitions(n=2, upload_bytes=1 << 20, compute_ms=2, rounds=2, warmup=0)
"""


def write_pyproject(pytester, budget="", settings=""):
    pytester.makepyprojecttoml(
        f"[tool.pytest.ini_options]\n\n[tool.gpuprof]\n{settings}\n[tool.gpuprof.budget]\n{budget}\n"
    )


def test_breach_fails_the_test_with_the_explanation(pytester):
    write_pyproject(pytester, "min_utilization = 0.5")
    pytester.makepyfile(IDLE_TEST + "\ndef test_untouched():\n    pass\n")
    result = pytester.runpytest("--gpu-budget")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*GPU budget exceeded: utilization 0.0% < 50.0% (min_utilization)  [[]truth: host]",
            "*wall * ms = kernels 0.0 ms + kernel-idle * ms",
            "*kernel-idle by step: prepare * ms, unattributed * ms",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_without_gpu_budget_a_breach_is_a_warning(pytester):
    write_pyproject(pytester, "min_utilization = 0.5")
    pytester.makepyfile(IDLE_TEST)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*GpuBudgetWarning: GPU budget exceeded: utilization 0.0% < 50.0%*"])
    result.stdout.fnmatch_lines(["*test_idle*warn: breach min_utilization*"])
    assert result.ret == 0


@pytest.mark.parametrize(
    ("pyproject", "budget_file", "marker", "fails"),
    [
        ("min_utilization = 0.5", None, None, True),
        ("min_utilization = 0.5", "min_utilization = 0.0", None, False),  # file over pyproject
        ("min_utilization = 0.0", "min_utilization = 0.5", None, True),
        ("min_utilization = 0.5", "min_utilization = 0.5", "min_utilization=0.0", False),  # marker over file
        ("", None, "min_utilization=0.5", True),
        ("", None, None, False),
    ],
)
def test_precedence_marker_then_file_then_pyproject(pytester, pyproject, budget_file, marker, fails):
    write_pyproject(pytester, pyproject)
    args = ["--gpu-budget"]
    if budget_file is not None:
        pytester.path.joinpath("budget.toml").write_text(budget_file + "\n")
        args = ["--gpu-budget", "--gpu-budget-file=budget.toml"]
    decorator = f"@pytest.mark.gpu_budget({marker})\n" if marker else ""
    pytester.makepyfile("import pytest, time\n\n" + decorator + IDLE_TEST.split("\n", 2)[2])
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=0 if fails else 1, failed=1 if fails else 0)


def test_budget_file_may_nest_under_tool_gpuprof_budget(pytester):
    pytester.path.joinpath("b.toml").write_text("[tool.gpuprof.budget.steps.prepare]\nmax_ms = 1\n")
    pytester.makepyfile(IDLE_TEST)
    result = pytester.runpytest("--gpu-budget", "--gpu-budget-file=b.toml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*steps.prepare.host_ms * ms > 1.0 ms (steps.prepare.max_ms)*"])


@pytest.mark.parametrize(
    ("budget", "settings", "expected"),
    [
        ("min_util = 0.8", "", "unknown budget key 'min_util'; valid keys: min_utilization, max_overhead_ms"),
        ('min_utilization = "0.8"', "", "'min_utilization' must be a number, not str '0.8'"),
        ("min_utilization = 80", "", "'min_utilization' = 80 is out of range"),
        ("[tool.gpuprof.budget.steps.upload]\nmin_gbps = -1", "", "'steps.upload.min_gbps' = -1 is out of range"),
        ("[tool.gpuprof.budget.steps.upload]\nmax_mss = 1", "", "unknown budget key 'steps.upload.max_mss'"),
        ('[tool.gpuprof.budget.steps.upload]\npageable = "no"', "", "'steps.upload.pageable' must be one of"),
        (
            "",
            "round = 3",
            "unknown key 'round'; valid keys: backend, host_clock, compare_undecided, nvtx, sample, exclusive, children, rounds, warmup",
        ),
        ("", 'rounds = "many"', "'rounds' must be a whole number"),
        ("", "rounds = 0", "'rounds' = 0 is out of range"),
        ("", 'backend = "rocm"', "'backend' must be one of 'auto', 'cuda', 'host', not 'rocm'"),
    ],
)
def test_bad_pyproject_is_a_usage_error_naming_key_and_file(pytester, budget, settings, expected):
    write_pyproject(pytester, budget, settings)
    pytester.makepyfile("def test_never_runs():\n    raise AssertionError('test body executed')\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest-gpuprof: *pyproject.toml [[]tool.gpuprof*{expected}*"])
    assert "test body executed" not in result.stdout.str()


def test_bad_budget_file_is_a_usage_error(pytester):
    pytester.makepyfile("def test_never_runs():\n    pass\n")
    pytester.path.joinpath("b.toml").write_text("max_overhead = 3\n")
    result = pytester.runpytest("--gpu-budget", "--gpu-budget-file=b.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*b.toml: unknown budget key 'max_overhead'; valid keys:*"])
    pytester.path.joinpath("c.toml").write_text("min_utilization = [\n")
    result = pytester.runpytest("--gpu-budget-file=c.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*c.toml: not valid TOML*"])
    result = pytester.runpytest("--gpu-budget-file=missing.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-budget-file=missing.toml: no such file*"])


def test_bad_marker_is_a_usage_error_before_any_test_runs(pytester):
    pytester.makepyfile(
        """
        import pytest

        def test_first():
            raise AssertionError("test body executed")

        @pytest.mark.gpu_budget(min_utilisation=0.8)
        def test_typo(gpuprof):
            pass
        """
    )
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*test_typo: @pytest.mark.gpu_budget: unknown budget key 'min_utilisation'; valid keys: min_utilization*"]
    )
    assert "test body executed" not in result.stdout.str()


def test_bad_command_line_values_are_usage_errors(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--gpu-rounds=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-rounds: 'rounds' = 0 is out of range*"])


def test_header_names_backend_and_why(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--gpu-backend=host")
    result.stdout.fnmatch_lines(
        [
            "gpuprof: backend host (asked for with --gpu-backend=host)",
            "gpuprof: device host CPU (*): workloads run on CPU threads, virtual clock (*), truth 'host'; CUPTI off (no GPU); NVML off (no GPU)",
            "gpuprof: budgets reported as warnings (no --gpu-budget); rounds 5, warmup 1*",
        ]
    )


def test_auto_backend_says_why_it_chose_host(pytester, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cupy", None)  # as on a machine without CuPy
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--gpu-budget")
    result.stdout.fnmatch_lines(["gpuprof: backend host (no CUDA device: CuPy is not installed*", "*budgets enforced*"])
    result = pytester.runpytest("--gpu-backend=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-backend=cuda, but CuPy is not installed*"])


def test_a_suite_that_does_not_use_the_plugin_starts_nothing(pytester, monkeypatch):
    from pytest_gpuprof.capture import backends

    def refuse(*args, **kwargs):
        raise AssertionError("a backend was chosen")

    monkeypatch.setattr(backends, "select", refuse)  # no CuPy import, no CUDA, no CUPTI
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["gpuprof: not started (no --gpu-* option, no ?tool.gpuprof?): a test that uses *"])
    result.assert_outcomes(passed=1)


def test_loading_the_plugin_imports_no_numerical_or_gpu_library():
    import subprocess
    import sys

    # the plugin, and the baseline store that a runner's save and the gpuprof command load
    probe = (
        "import sys, pytest_gpuprof.plugin, pytest_gpuprof.baselines.store; "
        "print([m for m in ('numpy', 'cupy', 'cupti', 'pynvml') if m in sys.modules])"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_a_test_that_uses_the_plugin_starts_it_and_the_summary_says_how(pytester, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cupy", None)  # as on a machine without CuPy
    pytester.makepyfile(WORKLOAD_TEST)
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(
        [
            "gpuprof: not started*",
            "*gpuprof: true GPU utilization (truth: host, backend: host)*",
            "gpuprof: backend host (no CUDA device: CuPy is not installed*",
            "gpuprof: device host CPU (*",
            "test_a_test_that_uses_the_plugin_starts_it_and_the_summary_says_how.py::test_pipeline *",
        ]
    )
    result.assert_outcomes(passed=1)


def test_a_gpuprof_table_starts_the_backend_with_the_session(pytester, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cupy", None)
    write_pyproject(pytester, settings="rounds = 3")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(
        ["gpuprof: backend host (no CUDA device: CuPy is not installed*", "*rounds 3, warmup 1*"]
    )


def test_gpu_marker_skips_with_the_reason_on_the_host_backend(pytester):
    pytester.makepyfile("import pytest\n\n@pytest.mark.gpu\ndef test_needs_cuda():\n    pass\n")
    result = pytester.runpytest("-rs", "--gpu-backend=host")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA device: asked for with --gpu-backend=host*"])


def test_a_test_skipped_outright_starts_nothing_and_holds_no_device(pytester):
    """A gpu test this machine skips, or one skipped by its own marker, never runs: no
    backend started for it, no device held (``--gpu-exclusive``) while it is skipped."""
    pytester.makepyfile(
        """
        import threading, pytest

        @pytest.mark.gpu
        def test_a_needs_cuda():
            pass

        @pytest.mark.skip(reason="not today")
        def test_b_skipped(gpu_workload):
            pass

        def test_c_nothing_started():
            assert not [t.name for t in threading.enumerate() if t.name.startswith("gpuprof-")]
        """
    )
    result = pytester.runpytest("--gpu-backend=host", "--gpu-exclusive=auto", "--gpu-report=r.json")
    result.assert_outcomes(passed=1, skipped=2)
    assert "waited_ms" not in json.dumps(json.loads(pytester.path.joinpath("r.json").read_text()))


def test_strict_xfail_on_a_breach_is_xfailed_and_summarised(pytester):
    write_pyproject(pytester, "min_utilization = 0.5")
    pytester.makepyfile(
        "import pytest, time\n\n"
        "@pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason='idles')\n" + IDLE_TEST.split("\n", 2)[2]
    )
    result = pytester.runpytest("--gpu-budget")
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(["*test_idle*xfail: breach min_utilization*", "*kernel-idle by step: prepare*"])
    assert result.ret == 0


def test_json_report(pytester):
    write_pyproject(pytester, "min_utilization = 0.5\n[tool.gpuprof.budget.steps.upload]\nmax_ms = 10000")
    pipeline = "import pytest\n\n@pytest.mark.gpu_budget(min_utilization=0.0)" + WORKLOAD_TEST
    pytester.makepyfile(IDLE_TEST + pipeline + "\ndef test_no_gpu():\n    pass\n")
    pytester.mkdir("out")
    result = pytester.runpytest("--gpu-report=out/report.json")
    result.assert_outcomes(passed=3, warnings=1)
    report = json.loads(pytester.path.joinpath("out/report.json").read_text())
    assert report["schema"] == 1
    assert set(report["machine"]) >= {"id", "gpu", "driver", "pcie", "backend", "truth"}
    assert report["machine"]["backend"] == "host" and report["machine"]["truth"] == "host"
    tests = {t["nodeid"].split("::")[1]: t for t in report["tests"]}
    assert set(tests) == {"test_idle", "test_pipeline"}
    idle = tests["test_idle"]
    assert idle["outcome"] == "passed"
    assert idle["metrics"]["utilization"] == 0.0
    assert idle["metrics"]["truth"] == "host"
    assert idle["budget"]["limits"] == {"min_utilization": 0.5, "steps": {"upload": {"max_ms": 10000.0}}}
    assert idle["budget"]["breaches"] == [
        {"metric": "utilization", "value": 0.0, "limit": 0.5, "kind": "min", "key": "min_utilization", "window": 0}
    ]
    pipeline = tests["test_pipeline"]
    assert pipeline["budget"]["limits"]["min_utilization"] == 0.0
    assert pipeline["metrics"]["steps"]["upload"]["count"] == 2
    assert pipeline["metrics"]["steps"]["upload"]["bytes"] == 2 << 20
    assert pipeline["metrics"]["reported_utilization"] > 0
    assert len(pipeline["rounds"]["utilization"]["samples"]) == 2
    assert set(pipeline["rounds"]["wall_ms"]) == {"median", "min", "max", "iqr", "samples"}
    assert not list(pytester.path.joinpath("out").glob(".*tmp"))


def test_failing_test_is_reported_with_its_outcome(pytester):
    pytester.makepyfile(
        """
        def test_raises_in_step(gpuprof, gpu_workload):
            with gpuprof.step("outer"):
                gpu_workload.compute(ms=1)
                raise RuntimeError("boom")
        """
    )
    result = pytester.runpytest("--gpu-report=r.json", "--gpu-backend=host")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RuntimeError: boom*"])
    (test,) = json.loads(pytester.path.joinpath("r.json").read_text())["tests"]
    assert test["outcome"] == "failed"
    assert set(test["metrics"]["steps"]) == {"outer", "compute"}
    assert test["metrics"]["kernel_ms"] > 0


def test_gpuprof_check_asserts_now(pytester):
    pytester.makepyfile(
        """
        import pytest, time
        from pytest_gpuprof import GpuBudgetExceeded

        def test_check(gpuprof, gpu_workload):
            def body():
                gpu_workload.compute(ms=2)
                with gpuprof.step("prepare"):
                    gpuprof.backend.clock.spend(1_000_000)

            m = gpuprof.measure(body, rounds=3, warmup=0)
            assert gpuprof.check(max_overhead_ms=1e6) is m
            with pytest.raises(GpuBudgetExceeded) as info:
                gpuprof.check(min_utilization=0.9)
            assert "min_utilization" in str(info.value)
            assert info.value.breaches[0].metric == "utilization"
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_under_w_error_a_breach_fails_with_its_message(pytester):
    write_pyproject(pytester, "min_utilization = 0.5")
    pytester.makepyfile(IDLE_TEST)
    result = pytester.runpytest("-W", "error::pytest_gpuprof.GpuBudgetWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GPU budget exceeded: utilization 0.0% < 50.0% (min_utilization)*"])
    assert "Traceback" not in result.stdout.str()


def test_a_budget_marker_on_a_test_without_fixtures_measures_its_whole_call(pytester, tmp_path):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_budget(min_utilization=0.5)
        def test_existing_gpu_test():
            assert 1 + 1 == 2

        @pytest.mark.gpu_budget(min_utilization=0.0)
        def test_within_budget():
            pass

        def test_no_budget():
            pass
        """
    )
    report = tmp_path / "r.json"
    # the real clock: on the virtual one host code takes no time, and a window of 0 ms has no utilization
    result = pytester.runpytest("--gpu-host-clock=real", "--gpu-budget", f"--gpu-report={report}")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*_ test_existing_gpu_test _*", "GPU budget exceeded: utilization 0.0% < 50.0%*"])
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(report.read_text())["tests"]}
    assert set(tests) == {"test_existing_gpu_test", "test_within_budget"}
    assert tests["test_existing_gpu_test"]["budget"]["breaches"][0]["metric"] == "utilization"
    # without --gpu-budget the same breach is a warning, as for any test
    pytester.runpytest("--gpu-host-clock=real").assert_outcomes(passed=3, warnings=1)


def test_an_sm_budget_on_the_host_backend_is_not_measured_and_said_so(pytester):
    pytester.makepyfile(IDLE_TEST)
    write_pyproject(pytester, "min_sm_utilization = 0.5")
    result = pytester.runpytest("--gpu-budget")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        ["*GPU budget not judged: min_sm_utilization not measured: the host backend runs on a CPU, which has no SMs*"]
    )
    result.stdout.fnmatch_lines(["*test_idle*not measured*"])


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


def test_the_backend_is_probed_on_the_device_asked_for(monkeypatch, pytestconfig):
    from pytest_gpuprof.capture import backends
    from pytest_gpuprof.harness.config import Settings
    from pytest_gpuprof.harness.runtime import DeviceRuntime

    probed = []

    def select(kind, device):
        probed.append(device)
        return backends.CUDA, f"CUDA device {device} is visible"

    monkeypatch.setattr(backends, "select", select)
    monkeypatch.setattr(backends, "cuda_device_count", lambda: 4)
    runtime = DeviceRuntime(pytestconfig, Settings(device=2))
    assert runtime.select() == (backends.CUDA, "CUDA device 2 is visible", 2)
    assert probed == [2]


def test_a_tests_timelines_are_let_go_when_it_ends(pytester):
    """A suite's memory stays flat in its tests: once a test has its view, its timelines,
    windows and profiler are let go (200 tests of 1,000 steps once held 300 MB more than 20)."""
    pytester.makeconftest(
        """
import gc

def pytest_sessionfinish(session):
    from pytest_gpuprof.analysis.timeline import Timeline
    gc.collect()
    alive = sum(isinstance(o, Timeline) for o in gc.get_objects())
    session.config.stash_alive = alive
    print(f"TIMELINES_ALIVE {alive}")
"""
    )
    pytester.makepyfile(
        """
import pytest

@pytest.mark.parametrize("i", range(30))
def test_steps(gpuprof, i):
    for _ in range(50):
        with gpuprof.step("s"):
            pass
"""
    )
    from plugin_runs import WITHOUT_HYPOTHESIS

    # a process of its own: this worker's other tests leave their objects in this one
    result = pytester.runpytest_subprocess("-s", "--gpu-host-clock=virtual", *WITHOUT_HYPOTHESIS)
    result.assert_outcomes(passed=30)
    import re

    (alive,) = re.findall(r"TIMELINES_ALIVE (\d+)", result.stdout.str())
    assert int(alive) <= 1
