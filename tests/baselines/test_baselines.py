"""Regression gates end to end: save a baseline, slow a test down, compare."""

import json
import os
import re
from pathlib import Path

import pytest
from plugin_runs import UPLOAD_TEST, WITHOUT_HYPOTHESIS

SUITE = """
import os

def run(gpuprof, gpu_workload, idle_ms):
    def body():
        gpu_workload.compute(ms=5)
        with gpuprof.step("prepare"):
            gpuprof.backend.clock.spend(idle_ms * 1_000_000)
    return gpuprof.measure(body, rounds=5, warmup=1)

def test_steady(gpuprof, gpu_workload):
    run(gpuprof, gpu_workload, 5)

def test_slowed(gpuprof, gpu_workload):
    # the injected slowdown: 5 ms of host idle more than the baseline, deterministically
    run(gpuprof, gpu_workload, 10 if os.environ.get("GPUPROF_SLOW") else 5)
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.delenv("GPUPROF_SLOW", raising=False)
    pytester.makepyfile(SUITE)
    return pytester


def test_slowed_test_fails_with_both_figures_and_the_rest_pass(suite, monkeypatch):
    result = suite.runpytest("--gpu-save=main")
    result.assert_outcomes(passed=2)
    assert len(list(Path(suite.path, ".gpuprof").glob("host-*/main@*.json"))) == 1
    result.stdout.fnmatch_lines(["gpuprof: baseline saved as .gpuprof/host-*/main@*.json"])
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    result = suite.runpytest("-v", "--gpu-compare=latest", "--gpu-compare-fail=wall_ms:+20%,utilization:-5pt")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*GPU regression against baseline .gpuprof/host-*/main@*.json:",
            "*wall_ms: baseline * -> * (+*; limit wall_ms:+20%; 5 vs 5 rounds; one-sided Mann-Whitney p=*): regression",
            "*utilization: baseline *% -> *% (-*pt*limit utilization:-5pt*): regression",
        ]
    )
    p_values = [float(p) for p in re.findall(r"Mann-Whitney p=([0-9.e-]+)[;)].*: regression", result.stdout.str())]
    assert p_values and all(p < 0.05 for p in p_values)
    result.stdout.re_match_lines(
        [r"GPU REGRESSION test_slowed_test_fails_with_both_figures_and_the_rest_pass.py::test_slowed"]
    )
    result.stdout.fnmatch_lines(["compared with baseline *", "*test_steady: unchanged", "*test_slowed: regression"])


def test_unchanged_code_passes_the_gate(suite):
    suite.runpytest("--gpu-save=main").assert_outcomes(passed=2)
    result = suite.runpytest("--gpu-compare=main", "--gpu-compare-fail=wall_ms:+20%")
    result.assert_outcomes(passed=2)


def test_without_compare_fail_a_change_is_only_reported_as_changed(suite, monkeypatch):
    suite.runpytest("--gpu-save=main")
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    result = suite.runpytest("-v", "--gpu-compare=latest")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*test_slowed: changed", "*wall_ms: baseline*: changed (beyond the default wall_ms:+10%, not a gate)"]
    )
    result.stdout.no_fnmatch_line("*: regression*")


def test_a_gated_metric_is_always_shown_even_unchanged(suite, monkeypatch):
    suite.runpytest("--gpu-save=main")
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    result = suite.runpytest("-v", "--gpu-compare=latest", "--gpu-compare-fail=kernel_ms:+50%")
    result.assert_outcomes(passed=2)  # kernel time did not change: only the wall time did
    result.stdout.fnmatch_lines(["*test_slowed: unchanged", "*kernel_ms: baseline*limit kernel_ms:+50%*: unchanged"])
    result.stdout.no_fnmatch_line("*: regression*")


def test_new_test_is_new_not_a_crash(suite):
    suite.runpytest("--gpu-save=main")
    suite.makepyfile(test_added="def test_added(gpu_workload):\n    gpu_workload.compute(ms=1)\n")
    result = suite.runpytest("-v", "--gpu-compare=latest", "--gpu-compare-fail=wall_ms:+20%")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_added.py::test_added: new (not in the baseline)",
            "gpuprof: 1 of 3 tests ungated: new (not in the baseline)",
        ]
    )


def test_another_machines_baseline_is_refused_unless_asked(suite):
    suite.runpytest("--gpu-save=main")
    (path,) = Path(suite.path, ".gpuprof").glob("host-*/main@*.json")
    data = json.loads(path.read_text())
    data["machine"].update(id="cuda-0123456789", gpu="NVIDIA H200", backend="cuda")
    other = Path(suite.path, "h200.json")
    other.write_text(json.dumps(data))
    result = suite.runpytest(f"--gpu-compare={other}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*h200.json was measured on machine cuda-0123456789 (gpu NVIDIA H200*Pass --gpu-compare-any-machine*"]
    )
    result = suite.runpytest(f"--gpu-compare={other}", "--gpu-compare-any-machine")
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--gpu-compare-fail=wall_ms:10%"], "--gpu-compare-fail: compare-fail expression 'wall_ms:10%': expected"),
        (["--gpu-compare=latest"], "--gpu-compare: no baseline for machine host-"),
        (["--gpu-compare=/nowhere/nope.json"], "--gpu-compare: /nowhere/nope.json: no such report file"),
        (["--gpu-compare-fail=wal_ms:+20%"], "no metric 'wal_ms' (did you mean wall_ms?); metrics are wall_ms, "),
        (["--gpu-save=a/b"], "--gpu-save='a/b': a baseline name is 1 to 64 letters"),
        (["--gpu-save="], "--gpu-save='': a baseline name is 1 to 64 letters"),
        (["--gpu-save=" + "x" * 65], "a baseline name is 1 to 64 letters"),
        (["--gpu-report=/proc/x.json"], "--gpu-report=/proc/x.json: the folder /proc is not writable"),
        (["--gpu-report=."], "--gpu-report=.: is a folder; give a file path"),
        (["--gpu-html=nowhere/r.html"], "--gpu-html=nowhere/r.html: the folder nowhere does not exist"),
        (["--gpu-trace=/proc/tr"], "--gpu-trace=/proc/tr: the folder /proc is not writable"),
        (
            ["--gpu-rounds=100000000"],
            "--gpu-rounds: 'rounds' = 100000000 is out of range: it must be at least 1 and at most 10000",
        ),
        (["--gpu-nvml-interval=nan"], "--gpu-nvml-interval: 'nvml_interval' = nan is out of range"),
        (["--gpu-compare=nightly"], "--gpu-compare: no baseline named 'nightly' for machine host-"),
    ],
)
def test_gate_usage_errors(suite, args, fragment):
    result = suite.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{fragment}*"])


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("{", "corrupt or truncated JSON"), ('{"schema": 9, "machine": {"id": "x"}, "tests": []}', "schema 9 is newer")],
)
def test_bad_baseline_file_is_a_clear_usage_error(suite, content, fragment):
    Path(suite.path, "bad.json").write_text(content)
    result = suite.runpytest(f"--gpu-compare={Path(suite.path, 'bad.json')}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*bad.json: {fragment}*"])


def test_metrics_reach_junit_xml_and_the_github_step_summary(suite, monkeypatch):
    summary = Path(suite.path, "summary.md")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    suite.runpytest("--junitxml=junit.xml").assert_outcomes(passed=2)
    xml = Path(suite.path, "junit.xml").read_text()
    assert re.search(r'<property name="gpuprof.utilization" value="0\.\d+"', xml)
    assert '<property name="gpuprof.truth" value="host"' in xml
    text = summary.read_text()
    assert "| test | wall ms | utilization | reported | overhead ms | verdict |" in text
    assert "test_steady" in text


def test_the_gates_pages_workflow_examples_are_valid_yaml():
    import yaml

    readme = Path(__file__).parents[2].joinpath("docs", "gates.md").read_text()
    sharded, in_one_job, cached = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    (step,) = [
        s["run"] for s in yaml.safe_load(in_one_job)["jobs"]["gpu-ab"]["steps"] if "gpuprof ab" in s.get("run", "")
    ]
    from pytest_gpuprof.cli import _parser

    args = _parser().parse_args(step.replace("${{ github.base_ref }}", "main").split()[1:])
    assert (
        args.command == "ab"
        and args.pairs == 5
        and args.fail
        and args.pytest_args[1:3] == ["tests/perf", "--gpu-rounds=9"]
    )
    for block in (sharded, cached):
        workflow = yaml.safe_load(block)
        steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
        assert any("--gpu-save=main" in s for s in steps)
        assert any("--gpu-compare-fail=" in s for s in steps)
    # the shards share the CI's run id, so each saves its part of one baseline
    job = yaml.safe_load(sharded)["jobs"]["gpu-perf"]
    assert job["strategy"]["matrix"]["shard"] == [1, 2]
    assert all("--gpu-storage=$GPU_STORE" in s.get("run", "") for s in job["steps"] if "--gpu-" in s.get("run", ""))


INTERRUPTIBLE = """
from pathlib import Path

def test_done(gpu_workload):
    gpu_workload.compute(ms=1)

def test_long_pipeline(gpu_workload):
    Path("inside").write_text("")
    gpu_workload.partitions(n=100_000, upload_bytes=1 << 20, compute_ms=1, rounds=1, warmup=0)
"""


@pytest.mark.parametrize("clock", ["virtual", "real"])
def test_ctrl_c_inside_partitions_ends_the_run_cleanly_and_saves_nothing(pytester, pytestconfig, clock):
    import signal
    import subprocess
    import sys
    import time

    pytester.makepyfile(INTERRUPTIBLE)
    # the virtual clock (the suite's and the examples') and the real one (a user's run,
    # whose threads wait on threading's primitives only)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *WITHOUT_HYPOTHESIS, f"--gpu-host-clock={clock}"]
    args += ["--gpu-save=main", "--gpu-report=r.json"]
    if not pytestconfig.pluginmanager.has_plugin("gpuprof"):  # not installed: load it from the tree
        args += ["-p", "pytest_gpuprof.plugin"]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a hang shows every thread's stack (SIGABRT below)

    def as_at_a_terminal() -> None:
        # A run started in the background inherits SIGINT ignored (and Python then installs
        # no handler): the child gets SIGINT as a user's terminal run does, whatever ran us.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    run = subprocess.Popen(
        args,
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=as_at_a_terminal,
    )
    deadline = time.monotonic() + 60
    while not pytester.path.joinpath("inside").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # well inside partitions(): 100,000 of them take many minutes
    run.send_signal(signal.SIGINT)
    try:
        out, _ = run.communicate(timeout=180)  # a few seconds, unless the machine is very busy
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGABRT)
        out, _ = run.communicate()
        raise AssertionError(f"the interrupted run did not end within 180 s:\n{out}") from None
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out and "GpuMemoryLeak" not in out and "Traceback" not in out
    assert "gpuprof: no baseline saved: the run was interrupted" in out
    assert not list(pytester.path.glob(".gpuprof/*/*.json"))
    report = json.loads(pytester.path.joinpath("r.json").read_text())
    assert report["partial"] == "was interrupted"
    assert [t["nodeid"].split("::")[1] for t in report["tests"]] == ["test_done"]


def test_a_run_stopped_by_maxfail_saves_no_baseline(pytester):
    pytester.makepyfile("def test_fails(gpuprof):\n    assert False\n\ndef test_later(gpuprof):\n    pass\n")
    result = pytester.runpytest("-x", "--gpu-save=main")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gpuprof: no baseline saved: the run stopped early (*"])
    assert not list(pytester.path.glob(".gpuprof/*/*.json"))


def test_a_run_that_measured_nothing_still_writes_its_outputs(pytester):
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest("--gpu-report=r.json", "--gpu-save=main")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "gpuprof: JSON report written to r.json",
            "gpuprof: no baseline saved: no test measured anything: a baseline holds at least one measured test",
        ]
    )
    report = json.loads(pytester.path.joinpath("r.json").read_text())
    assert report["tests"] == [] and report["note"].startswith("nothing was measured")
    assert not pytester.path.joinpath(".gpuprof").exists()


def test_a_write_that_fails_at_the_end_is_one_line_and_fails_the_run(pytester):
    pytester.mkdir("out")
    pytester.makepyfile(
        "import shutil\nfrom pathlib import Path\n\ndef test_removes_the_folder(gpuprof):\n"
        "    with gpuprof.step('s'):\n        pass\n    shutil.rmtree('out')\n"
        "    Path('out').write_text('a file where the folder was')\n"
    )
    result = pytester.runpytest("--gpu-report=out/r.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gpuprof: could not write the JSON report out/r.json: *"])
    result.stdout.fnmatch_lines(["*gpuprof: true GPU utilization*"])  # the summary is still there
    assert "Traceback" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_run_with_a_collection_error_saves_no_baseline(pytester):
    pytester.makepyfile(test_good="def test_ok(gpuprof):\n    pass\n", test_broken="import no_such_module\n")
    result = pytester.runpytest("--gpu-save=main", "--continue-on-collection-errors")
    result.stdout.fnmatch_lines(["gpuprof: no baseline saved: the run had 1 error(s) during collection"])
    assert not list(pytester.path.glob(".gpuprof/*/*.json"))


def test_reports_and_baselines_share_one_file_mode(tmp_path):
    import stat

    from pytest_gpuprof.baselines.store import Store
    from pytest_gpuprof.output.files import write_json

    report = {"schema": 1, "machine": {"id": "host-0123456789"}, "tests": []}
    write_json(tmp_path / "r.json", report)
    saved = Path(Store(tmp_path / "store").save(report, "main"))
    mode = stat.S_IMODE((tmp_path / "r.json").stat().st_mode)
    assert stat.S_IMODE(saved.stat().st_mode) == mode
    assert mode & 0o444 == 0o444 & ~_umask()  # readable as an ordinary file, as the umask allows
    assert not list(tmp_path.rglob(".gpuprof.*.tmp"))  # no temporary file left behind


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_compare_without_a_fail_expression_says_that_nothing_gates(pytester):
    pytester.makepyfile(UPLOAD_TEST.format(marker=""))
    pytester.runpytest("--gpu-save=main").assert_outcomes(passed=1)
    result = pytester.runpytest("--gpu-compare=main")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*nothing gates on these changes: give --gpu-compare-fail=*"])


# the smaller ones
def test_a_baseline_named_like_a_file_is_refused_with_the_name_to_use(pytester):
    pytester.makepyfile(UPLOAD_TEST.format(marker=""))
    result = pytester.runpytest("--gpu-save=v1.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-save='v1.json': give the baseline a name, not a file name: --gpu-save=v1*"])
