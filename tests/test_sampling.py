"""The host code behind the unattributed idle, in real pytest sessions on the host
backend's real clock (sampling has nothing to sample on the virtual clock, where host code
takes no time). What is asserted is who is named, with a share far from any load's reach:
the named function spins for 60 ms a time, against a sampling round each millisecond."""

from __future__ import annotations

import json

import pytest

NAMED = """
import time

import pytest


def prepare_batch():
    end = time.perf_counter() + 0.06
    while time.perf_counter() < end:
        pass


@pytest.mark.gpu_budget(min_utilization=0.99)
def test_loop(gpu_workload):
    for _ in range(4):
        gpu_workload.compute(ms=5)
        gpu_workload.sync()
        prepare_batch()
    gpu_workload.compute(ms=5)
"""


def run(pytester, *args):
    pytester.makepyfile(test_named=NAMED)
    result = pytester.runpytest("--gpu-host-clock=real", "--gpu-report=r.json", "--gpu-html=r.html", *args)
    (test,) = json.loads(pytester.path.joinpath("r.json").read_text())["tests"]
    return result, test


def test_a_marker_only_test_names_the_function_its_host_spent_the_idle_in(pytester):
    result, test = run(pytester, "--gpu-budget")
    result.assert_outcomes(failed=1)
    metrics = test["metrics"]
    named = {c["where"]: c["ms"] for c in metrics["idle_by_code"]}
    # the spinning loop's lines (8 and 9, as the interpreter steps through them)
    spinning = sum(
        ms for where, ms in named.items() if where in ("test_named.py:8 prepare_batch", "test_named.py:9 prepare_batch")
    )
    assert spinning >= 0.8 * metrics["unattributed_ms"]
    assert metrics["idle_by_code"][0]["where"].endswith(" prepare_batch")
    # it explains the unattributed idle, it does not add to it
    assert sum(named.values()) <= metrics["unattributed_ms"] + 1e-6
    result.stdout.fnmatch_lines(
        [
            "*kernel-idle by step: *unattributed *",
            "*unattributed, host in: test_named.py:? prepare_batch * ms (*%)*",
            "*test_named.py::test_loop * unattributed * ms, *% in test_named.py:? prepare_batch*FAIL*",
        ]
    )
    page = pytester.path.joinpath("r.html").read_text()
    assert '"kind": "host"' in page and " prepare_batch" in page


@pytest.mark.parametrize("off", [("--gpu-sample=off",), ("-o", "dummy=1")])
def test_sampling_off_names_nothing(pytester, off):
    if off[0] == "-o":  # the pyproject key instead of the option
        pytester.makepyprojecttoml('[tool.gpuprof]\nsample = "off"\n')
        off = ()
    result, test = run(pytester, *off)
    assert "idle_by_code" not in test["metrics"]
    assert test["metrics"]["unattributed_ms"] > 0
    result.stdout.no_fnmatch_line("*host in:*")


def test_a_bad_sample_value_is_a_usage_error_naming_the_key(pytester):
    pytester.makepyprojecttoml('[tool.gpuprof]\nsample = "maybe"\n')
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*[[]tool.gpuprof[]]*sample*on*off*maybe*"])
