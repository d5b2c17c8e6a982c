"""pytest-xdist: workers pinned to devices (host 'devices' are logical slots), one merged report."""

import json
from pathlib import Path

import pytest
from plugin_runs import WITHOUT_HYPOTHESIS, page_data_of

pytest.importorskip("xdist")

SUITE = """
import os, time, pytest

@pytest.mark.parametrize("i", range(6))
def test_pipeline(gpu_workload, i):
    gpu_workload.partitions(n=2, upload_bytes=1 << 20, compute_ms=1, rounds=1, warmup=0)

@pytest.mark.gpu_budget(min_utilization=0.5)
def test_idle(gpuprof):
    with gpuprof.step("prepare"):
        gpuprof.backend.clock.spend(10_000_000)
"""


def run(pytester, *args):
    return pytester.runpytest("--gpu-backend=host", "--gpu-budget", "--gpu-report=r.json", *WITHOUT_HYPOTHESIS, *args)


CRASH = """
def test_crash(gpuprof):
    with gpuprof.step("doomed"):
        os._exit(3)
"""


def test_one_run_on_two_workers_merges_every_test_its_page_and_a_crashed_worker(pytester):
    """One ``-n 2`` run (each worker's start is most of such a test's time) read for four
    things: the merged report holds every test once with its device slot; a run with a
    failed test is no baseline; each test's page data came across from its worker; and a
    worker that crashed loses only its own test."""
    pytester.makepyfile(SUITE + CRASH)
    result = run(pytester, "-n", "2", "--gpu-devices=all", "--gpu-save=main", "--gpu-html=r.html")
    result.assert_outcomes(passed=6, failed=2)
    report = json.loads(Path(pytester.path, "r.json").read_text())
    ids = [t["nodeid"] for t in report["tests"]]
    assert len(ids) == len(set(ids)) == 8
    assert {t["device"] for t in report["tests"] if not t["nodeid"].endswith("::test_crash")} == {0, 1}
    assert report["machine"]["devices"] == [0, 1]
    # a run with a failed test is no baseline, under xdist as without it
    assert not Path(pytester.path, ".gpuprof").exists()
    result.stdout.fnmatch_lines(["gpuprof: no baseline saved: had failed tests*"])
    result.stdout.fnmatch_lines(["*gpuprof: 2 xdist workers on devices [[]0, 1]*"])
    # the same verdict as without xdist, with the same message
    result.stdout.fnmatch_lines(["*GPU budget exceeded: utilization 0.0% < 50.0% (min_utilization)*"])
    result.stdout.fnmatch_lines(["*test_idle*FAIL: breach min_utilization*"])
    # each test's page data came across from its worker, with its lanes (the lost test
    # has none: its worker died before it could send them)
    pages = {p["id"]: p for p in page_data_of(Path(pytester.path, "r.html").read_text())["tests"]}
    assert sorted(pages) == sorted(i for i in ids if not i.endswith("::test_crash"))
    assert all(pages[i]["lanes"] for i in ids if "pipeline" in i)
    # the crashed worker lost its test, and only that one
    tests = {t["nodeid"].split("::")[1]: t for t in report["tests"]}
    assert "crashed" in tests["test_crash"] and tests["test_crash"]["outcome"] == "failed"
    result.stdout.fnmatch_lines(["*test_crash: lost: *crashed*"])


def test_a_passing_xdist_run_is_saved_once_by_the_controller(pytester):
    pytester.makepyfile(SUITE)
    run(pytester, "-n", "2", "--gpu-save=main", "-k", "not idle").stdout.fnmatch_lines(
        ["gpuprof: no baseline saved: ran with -k: not every collected test ran*"]
    )
    # a folder is a suite (a file or a test id is part of one, as -k is)
    Path(pytester.path, "ok").mkdir()
    Path(pytester.path, "ok", "test_ok.py").write_text(
        "def test_a(gpu_workload):\n    gpu_workload.compute(ms=1)\n\n"
        "def test_b(gpu_workload):\n    gpu_workload.compute(ms=1)\n"
    )
    run(pytester, "-n", "2", "--gpu-save=main", "ok").assert_outcomes(passed=2)
    assert len(list(Path(pytester.path, ".gpuprof").glob("*/*.json"))) == 1


def test_same_verdicts_without_xdist(pytester):
    pytester.makepyfile(SUITE)
    run(pytester).assert_outcomes(passed=6, failed=1)
    report = json.loads(Path(pytester.path, "r.json").read_text())
    assert {t["nodeid"].split("::")[1]: t["outcome"] for t in report["tests"]}["test_idle"] == "failed"
    assert {t["device"] for t in report["tests"]} == {0}


def test_workers_sharing_one_device_are_told(pytester):
    pytester.makepyfile(SUITE)
    result = run(pytester, "-n", "2", "--gpu-devices=0", "--gpu-exclusive=off")
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["*gpuprof: 2 xdist workers shared 1 device(s) [[]0]: their timings overlap*"])
    result = run(pytester, "-n", "2", "--gpu-devices=0")
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["*shared 1 device(s) [[]0]; on the host backend's virtual clock their figures*"])


def test_bad_device_list_is_a_usage_error(pytester):
    pytester.makepyfile(SUITE)
    result = run(pytester, "--gpu-devices=zero")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpu-devices=zero: expected 'all' or device indices such as 0,1*"])


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
        result = pytester.runpytest("-n", "2", *WITHOUT_HYPOTHESIS)
        result.assert_outcomes(passed=6)
        return [line.split()[0] for line in result.stdout.lines if line.startswith("test_the_xdist_summary")]

    first = rows()
    assert first == sorted(first) and len(first) == 6  # equal figures: in test order, whoever finished first
    assert rows() == first
