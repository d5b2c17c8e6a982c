"""The habits pytest-benchmark users bring: measuring switched off, tests chosen by whether
they use the plugin, autosaved baselines, the table's columns, order and groups, a CSV, and
budget keys as flags. Each flag is shown to change the outcome against a run without it."""

import csv
import json
import subprocess

import pytest

from pytest_gpuprof.settings.options import BUDGET_FLAGS
from pytest_gpuprof.verdict.budget import Budget

# a single-lock pipeline on the virtual clock: 66.7% true, 100% bracketed, 22.4 ms of
# kernel-idle charged to the uploads (64 MiB each); a window that keeps 1 MiB; a plain test
SUITE = """
import pytest

CALLS = []

def test_pipeline(gpuprof, gpu_workload):
    metrics = gpuprof.measure(lambda: CALLS.append(gpu_workload.partitions(n=8, workers=2)), rounds=3, warmup=1)
    print("CALLS", len(CALLS))
    assert metrics.utilization < 0.7

@pytest.fixture
def kept():
    held = []
    yield held  # held past the call: freed in the fixture's teardown
    held.clear()

def test_keeps(gpuprof, gpu_workload, kept):
    gpuprof.measure(lambda: kept.append(gpu_workload.alloc(1 << 20)), rounds=1, warmup=0)

@pytest.mark.gpu_budget(min_utilization=0.1)
def test_marked():
    pass

def test_plain():
    pass
"""


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def outcomes(result):
    return {k: v for k, v in result.parseoutcomes().items() if k in ("passed", "failed", "skipped", "errors")}


# --gpu-disable


def test_disable_runs_the_code_once_and_judges_nothing(suite):
    result = suite.runpytest("-s", "--gpu-budget", "--gpu-min-utilization=0.99", "--gpu-disable", "-rs")
    assert result.ret == 0, result.stdout.str()
    # the pipeline's code ran once, no warm-up or rounds; reading a figure skips the test
    result.stdout.fnmatch_lines(
        ["*CALLS 1", "*--gpu-disable: nothing was measured, so the test cannot read 'utilization'"]
    )
    assert outcomes(result) == {"passed": 3, "skipped": 1}
    # the skip names the test's own line, not the plugin's
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_suite.py:*: pytest-gpuprof: --gpu-disable*"])
    assert "pytest_gpuprof" not in "".join(line for line in result.stdout.lines if line.startswith("SKIPPED"))
    result.stdout.fnmatch_lines(["*budgets off: --gpu-disable*", "gpuprof: --gpu-disable: the tests ran unmeasured*"])
    assert "true GPU utilization" not in result.stdout.str()  # no table: nothing was measured


def test_without_disable_the_same_run_fails(suite):
    result = suite.runpytest("-s", "--gpu-budget", "--gpu-min-utilization=0.99")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*CALLS 4"])  # one warm-up and three rounds
    assert outcomes(result) == {"passed": 3, "failed": 1}
    result.stdout.re_match_lines([r"GPU BUDGET test_suite.py::test_pipeline - Failed: GPU budget exceeded"])


def test_a_disabled_run_writes_a_report_that_measured_nothing(suite):
    result = suite.runpytest("--gpu-disable", "--gpu-report=r.json")
    assert result.ret == 0
    report = json.loads((suite.path / "r.json").read_text())
    assert report["tests"] == [] and "nothing was measured" in report["note"]


@pytest.mark.parametrize("before", [0, 1])
def test_an_interrupted_report_says_so_and_what_was_measured_before(pytester, before):
    """Ctrl-C once left a report saying both "was interrupted" and "nothing was measured: no
    test used gpuprof", as if the suite did not use the plugin."""
    measured = "def test_a(gpuprof, gpu_workload):\n    gpuprof.measure(lambda: gpu_workload.compute(ms=1), rounds=2)\n"
    stop = "def test_b():\n    raise KeyboardInterrupt\n"
    pytester.makepyfile(test_cut=(measured if before else "") + stop)
    result = pytester.runpytest_subprocess("--gpu-report=r.json")  # in this process, it would stop this run
    assert result.ret == pytest.ExitCode.INTERRUPTED
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["partial"] == "was interrupted"
    if before:
        assert report["note"] == "the run was interrupted: 1 test(s) measured before it ended"
    else:
        assert report["note"] == "the run was interrupted before any test was measured"
    assert "no test used gpuprof" not in report["note"]


# --gpu-skip, --gpu-only: fixtures and markers, however the marker arrives

HOOK = """
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        if item.name == "test_plain":
            item.add_marker(pytest.mark.gpu_budget(max_overhead_ms=1000))
"""


@pytest.mark.parametrize("hooked", [False, True], ids=["as written", "marker added by a hook"])
def test_skip_skips_the_tests_that_use_the_plugin_and_only_runs_only_those(suite, hooked):
    if hooked:
        suite.makeconftest(HOOK)
    users = 4 if hooked else 3
    skipped = suite.runpytest("--gpu-skip", "-rs")
    assert outcomes(skipped) == {"skipped": users, **({} if hooked else {"passed": 1})}
    skipped.stdout.fnmatch_lines(["*--gpu-skip: it uses pytest-gpuprof"])
    only = suite.runpytest("--gpu-only", "-rs")
    assert outcomes(only) == {"passed": users, **({} if hooked else {"skipped": 1})}
    if not hooked:
        only.stdout.fnmatch_lines(["*test_suite.py: --gpu-only: it does not use pytest-gpuprof"])
    assert outcomes(suite.runpytest()) == {"passed": 4}  # and without either, everything runs


@pytest.mark.parametrize(
    ("given", "why"),
    [
        (["--gpu-disable", "--gpu-skip"], "--gpu-disable and --gpu-skip cannot be given together"),
        (["--gpu-disable", "--gpu-only"], "--gpu-disable and --gpu-only cannot"),
        (["--gpu-skip", "--gpu-only"], "--gpu-skip and --gpu-only cannot"),
        (["--gpu-disable", "--gpu-save=main"], "--gpu-disable and --gpu-save cannot"),
        (["--gpu-disable", "--gpu-compare=main"], "--gpu-disable and --gpu-compare cannot"),
        (["--gpu-disable", "--gpu-compare-fail=wall_ms:+5%"], "--gpu-disable and --gpu-compare-fail cannot"),
        (["--gpu-skip", "--gpu-autosave"], "--gpu-skip and --gpu-autosave cannot"),
        (["--gpu-save=main", "--gpu-autosave"], "--gpu-save and --gpu-autosave cannot"),
    ],
)
def test_flags_that_contradict_each_other_are_refused(suite, given, why):
    result = suite.runpytest(*given)
    assert result.ret == 4
    assert why in result.stderr.str()


# --gpu-autosave


def test_autosave_names_the_baseline_after_the_commit_and_latest_finds_it(suite):
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=suite.path, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=suite.path, capture_output=True, text=True)
    saved = suite.runpytest("--gpu-autosave")
    assert saved.ret == 0
    (stored,) = (suite.path / ".gpuprof").rglob("*.json")
    assert stored.name.startswith(f"{head.stdout.strip()}_2")  # COMMIT_YYYYMMDDTHHMMSS@...
    compared = suite.runpytest("--gpu-compare=latest", "--gpu-compare-fail=kernel_ms:+5%")
    assert compared.ret == 0
    compared.stdout.fnmatch_lines([f"compared with baseline *{head.stdout.strip()}_2*"])
    assert "new (not in the baseline)" not in compared.stdout.str()


def test_autosave_refuses_a_run_that_is_no_baseline_as_save_does(suite):
    result = suite.runpytest("--gpu-autosave", "-k", "pipeline")
    assert "gpuprof: no baseline saved: deselected 3 test(s)" in result.stdout.str()
    assert not (suite.path / ".gpuprof").exists()


# the table: columns, order, groups


def table_lines(result):
    """The terminal table: its heading (the line that starts with "test") to the blank line."""
    out = result.stdout.lines
    title = next(i for i, line in enumerate(out) if "true GPU utilization" in line)
    start = next(i for i in range(title, len(out)) if out[i].startswith("test "))
    end = next((i for i in range(start, len(out)) if not out[i].strip() or out[i].startswith("=")), len(out))
    return out[start:end]


def test_columns_choose_the_tables_columns_and_any_metric(suite):
    result = suite.runpytest("--gpu-columns=utilization,kernel_ms,steps.upload.idle_ms,memory.peak_bytes")
    heading, *rows = table_lines(result)
    assert heading.split() == ["test", "util", "kernel_ms", "steps.upload.idle_ms", "memory.peak_bytes"]
    pipeline = next(r for r in rows if "test_pipeline" in r).split()
    assert pipeline[1:4] == ["66.7%", "44.7", "22.4"] and pipeline[4:] == ["64.0", "MiB"]
    marked = next(r for r in rows if "test_marked" in r).split()
    assert marked[1:4] == ["-", "-", "-"]  # the whole test, no device work: not seen, never 0
    default = suite.runpytest()
    assert table_lines(default)[0].split()[:3] == ["test", "wall", "ms"]


def test_sort_orders_by_a_metric_worst_first_or_by_name(suite):
    by_util = [r.split()[0] for r in table_lines(suite.runpytest("--gpu-sort=utilization"))[1:]]
    # the worst first; tests whose window has no utilization (0 ms long) last
    assert by_util[0].endswith("test_pipeline") and {t.split("::")[1] for t in by_util[1:]} == {
        "test_keeps",
        "test_marked",
    }
    by_wall = [r.split()[0] for r in table_lines(suite.runpytest("--gpu-sort=wall_ms"))[1:]]
    assert by_wall[0].endswith("test_pipeline")  # a time gets worse going up
    by_name = [r.split()[0] for r in table_lines(suite.runpytest("--gpu-sort=name"))[1:]]
    assert by_name == sorted(by_name)
    by_default = [r.split()[0] for r in table_lines(suite.runpytest())[1:]]
    assert by_default != by_name and by_default[0].endswith("test_pipeline")  # the largest kernel-idle first


def test_group_by_puts_a_line_over_each_group(pytester):
    pytester.makepyfile(
        test_a="""
        import pytest

        @pytest.mark.parametrize("n", [1, 2])
        def test_p(gpuprof, gpu_workload, n):
            gpuprof.measure(lambda: gpu_workload.compute(ms=n), rounds=1, warmup=0)
        """,
        test_b="def test_q(gpuprof, gpu_workload):\n    gpu_workload.compute(ms=3)\n",
    )
    lines = table_lines(pytester.runpytest("--gpu-group-by=module"))
    assert [line for line in lines if line.startswith("--")] == [
        "-- module test_a.py (2 rows)",
        "-- module test_b.py (1 row)",
    ]
    lines = table_lines(pytester.runpytest("--gpu-group-by=param"))
    assert [line for line in lines if line.startswith("--")] == [
        "-- param 1 (1 row)",
        "-- param 2 (1 row)",
        "-- param (no parameters) (1 row)",
    ]


@pytest.mark.parametrize(
    ("flag", "why"),
    [
        ("--gpu-columns=utilisation", "--gpu-columns=utilisation: 'utilisation' names no metric"),
        ("--gpu-sort=fastest", "--gpu-sort=fastest: 'fastest' names no metric"),
        ("--gpu-columns=,", "--gpu-columns=,: no column named"),
    ],
)
def test_a_column_or_sort_that_names_nothing_is_refused(suite, flag, why):
    result = suite.runpytest(flag)
    assert result.ret == 4 and why in result.stderr.str()


# --gpu-csv


def test_csv_holds_a_row_per_test_and_window(suite):
    suite.makepyfile(
        test_two="""
        def test_two_windows(gpuprof, gpu_workload):
            gpuprof.measure(lambda: gpu_workload.compute(ms=5), rounds=1, warmup=0)
            gpu_workload.partitions(n=4, workers=2, strategy="two-lock", rounds=1, warmup=0)
        """
    )
    result = suite.runpytest("--gpu-csv=out.csv")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["gpuprof: CSV file written to out.csv"])
    with open(suite.path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    (pipeline,) = [r for r in rows if r["test"].endswith("test_pipeline")]  # its rounds' medians
    assert pipeline["label"] == "measure" and float(pipeline["utilization"]) == pytest.approx(2 / 3, abs=1e-3)
    two = [r for r in rows if r["test"].endswith("test_two_windows")]
    assert [(r["window"], r["label"]) for r in two] == [("0", "measure"), ("1", "partitions[two-lock]")]
    assert float(two[0]["kernel_ms"]) == pytest.approx(5) and "steps.upload.idle_ms" in two[1]
    marked = next(r for r in rows if r["test"].endswith("test_marked"))
    assert marked["kernel_ms"] == "" and marked["outcome"] == "passed"  # not seen: empty, never 0
    assert not [r for r in rows if r["test"].endswith("test_plain")]


def test_csv_path_is_checked_before_any_test_runs(suite):
    result = suite.runpytest("--gpu-csv=nowhere/out.csv")
    assert result.ret == 4 and "--gpu-csv=nowhere/out.csv: the folder nowhere does not exist" in result.stderr.str()


# budget keys as flags

# each flag, a value its test breaches and one it keeps
BREACHES = {
    "--gpu-min-utilization": ("test_pipeline", "0.9", "0.5"),
    "--gpu-max-overhead-ms": ("test_pipeline", "10", "100"),
    "--gpu-max-discrepancy": ("test_pipeline", "0.1", "0.5"),
    "--gpu-max-memory": ("test_pipeline", "32 MiB", "1 GiB"),
    "--gpu-max-leaked-bytes": ("test_keeps", "0", "2 MiB"),
}


def test_every_test_level_budget_key_is_a_flag():
    assert {o.budget for o in BUDGET_FLAGS} == set(Budget.KEYS)
    judged_off_the_gpu = set(Budget.KEYS) - {"min_sm_utilization"}  # CUPTI's: tests/gpu
    assert {BREACHES_KEY(flag) for flag in BREACHES} == judged_off_the_gpu


def BREACHES_KEY(flag):
    return flag.removeprefix("--gpu-").replace("-", "_")


@pytest.mark.parametrize("flag", sorted(BREACHES))
def test_a_budget_flag_fails_the_test_that_breaches_it(suite, flag):
    test, breached, kept = BREACHES[flag]
    failed = suite.runpytest("--gpu-budget", f"{flag}={breached}", "-k", test)
    assert failed.ret == 1, flag
    failed.stdout.fnmatch_lines([f"*({BREACHES_KEY(flag)})*"])
    assert suite.runpytest("--gpu-budget", f"{flag}={kept}", "-k", test).ret == 0, flag


def test_a_budget_flag_sits_over_the_files_and_under_markers(suite):
    suite.makepyprojecttoml("[tool.gpuprof.budget]\nmin_utilization = 0.9\n")
    assert suite.runpytest("--gpu-budget", "-k", "pipeline").ret == 1  # the file's 0.9
    assert suite.runpytest("--gpu-budget", "--gpu-min-utilization=0.5", "-k", "pipeline").ret == 0  # over the file
    suite.makepyfile(
        test_marked_pipeline="""
        import pytest

        @pytest.mark.gpu_budget(min_utilization=0.9)
        def test_m(gpuprof, gpu_workload):
            gpu_workload.partitions(n=8, workers=2)
        """
    )
    result = suite.runpytest("--gpu-budget", "--gpu-min-utilization=0.5", "test_marked_pipeline.py")
    assert result.ret == 1  # the marker's 0.9 under the flag's 0.5


@pytest.mark.parametrize(
    ("flag", "why"),
    [
        ("--gpu-min-utilization=lots", "--gpu-min-utilization=lots: expected a number"),
        ("--gpu-min-utilization=1.5", "--gpu-min-utilization: 'min_utilization' = 1.5"),
        ("--gpu-max-memory=2 GX", "--gpu-max-memory: max_memory = '2 GX': not a size"),
        ("--gpu-max-overhead-ms=inf", "--gpu-max-overhead-ms"),
    ],
)
def test_a_bad_budget_flag_names_itself(suite, flag, why):
    result = suite.runpytest(flag)
    assert result.ret == 4 and why in result.stderr.str(), result.stderr.str()


# a budget in a conftest.py's pytestmark is silently off in pytest: said


def test_pytestmark_in_a_conftest_is_warned_about(suite):
    suite.makeconftest("import pytest\npytestmark = pytest.mark.gpu_budget(min_utilization=0.9)\n")
    result = suite.runpytest("-k", "plain")
    result.stdout.fnmatch_lines(["*conftest.py: pytestmark in a conftest.py applies to no test*"])
    suite.makeconftest("import pytest\n")
    assert "pytestmark in a conftest.py" not in suite.runpytest("-k", "plain").stdout.str()


def test_the_host_header_points_to_the_virtual_clock_on_the_real_one(pytester, monkeypatch):
    pytester.makepyfile("def test_x(gpuprof):\n    pass\n")
    monkeypatch.setenv("PYTEST_ADDOPTS", "")
    real = pytester.runpytest("--gpu-backend=host")
    real.stdout.fnmatch_lines(["*real clock (figures vary with this machine's load: --gpu-host-clock=virtual*"])
    virtual = pytester.runpytest("--gpu-backend=host", "--gpu-host-clock=virtual")
    assert "figures vary" not in virtual.stdout.str()
