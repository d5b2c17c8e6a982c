"""pytest-xdist: workers pinned to devices (host 'devices' are logical slots), one merged report."""

import json
from pathlib import Path

import pytest
from plugin_runs import page_data_of

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
    return pytester.runpytest("--gpu-backend=host", "--gpu-budget", "--gpu-report=r.json", *args)


def test_merged_report_holds_every_test_once_with_its_slot(pytester):
    pytester.makepyfile(SUITE)
    result = run(pytester, "-n", "2", "--gpu-devices=all", "--gpu-save=main")
    result.assert_outcomes(passed=6, failed=1)
    report = json.loads(Path(pytester.path, "r.json").read_text())
    ids = [t["nodeid"] for t in report["tests"]]
    assert len(ids) == len(set(ids)) == 7
    assert {t["device"] for t in report["tests"]} == {0, 1}
    assert report["machine"]["devices"] == [0, 1]
    # a run with a failed test is no baseline, under xdist as without it
    assert not Path(pytester.path, ".gpuprof").exists()
    result.stdout.fnmatch_lines(["gpuprof: no baseline saved: had failed tests*"])
    result.stdout.fnmatch_lines(["*gpuprof: 2 xdist workers on devices [[]0, 1]*"])
    # the same verdict as without xdist, with the same message
    result.stdout.fnmatch_lines(["*GPU budget exceeded: utilization 0.0% < 50.0% (min_utilization)*"])
    result.stdout.fnmatch_lines(["*test_idle*FAIL: breach min_utilization*"])


def test_a_passing_xdist_run_is_saved_once_by_the_controller(pytester):
    pytester.makepyfile(SUITE)
    run(pytester, "-n", "2", "--gpu-save=main", "-k", "not idle").stdout.fnmatch_lines(
        ["gpuprof: no baseline saved: ran with -k: not every collected test ran*"]
    )
    pytester.makepyfile(
        test_ok="def test_a(gpu_workload):\n    gpu_workload.compute(ms=1)\n\n"
        "def test_b(gpu_workload):\n    gpu_workload.compute(ms=1)\n"
    )
    run(pytester, "-n", "2", "--gpu-save=main", "test_ok.py").assert_outcomes(passed=2)
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


def test_a_crashed_worker_loses_only_its_test(pytester):
    pytester.makepyfile(
        SUITE
        + """
def test_crash(gpuprof):
    with gpuprof.step("doomed"):
        os._exit(3)
"""
    )
    result = run(pytester, "-n", "2", "--gpu-devices=all")
    result.assert_outcomes(passed=6, failed=2)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(Path(pytester.path, "r.json").read_text())["tests"]}
    assert "crashed" in tests["test_crash"] and tests["test_crash"]["outcome"] == "failed"
    assert len(tests) == 8
    result.stdout.fnmatch_lines(["*test_crash: lost: *crashed*"])


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
        result = pytester.runpytest("-n", "2")
        result.assert_outcomes(passed=6)
        return [line.split()[0] for line in result.stdout.lines if line.startswith("test_the_xdist_summary")]

    first = rows()
    assert first == sorted(first) and len(first) == 6  # equal figures: in test order, whoever finished first
    assert rows() == first


def test_the_html_page_holds_the_timeline_of_every_workers_tests(pytester):
    pytester.makepyfile(SUITE)
    result = run(pytester, "-n", "2", "--gpu-html=r.html")
    result.assert_outcomes(passed=6, failed=1)
    page = Path(pytester.path, "r.html").read_text()
    ids = [t["nodeid"] for t in json.loads(Path(pytester.path, "r.json").read_text())["tests"]]
    # each test's page data came across from its worker, with its lanes
    data = page_data_of(page)
    pages = {p["id"]: p for p in data["tests"]}
    assert sorted(pages) == sorted(ids)
    assert all(pages[i]["lanes"] for i in ids if "pipeline" in i)
