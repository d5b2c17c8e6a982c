"""A regression confirmed on a GPU (``--gpu-compare-confirm``): the fresh run is a pytest
process of its own on the device the run holds (it inherits the hold, it does not wait for
it), and a kernel made slower by a fixed number of cycles is confirmed; one bad run that
the fresh run does not repeat is undecided."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.gpu

SUITE = '''
import os, pathlib
import cupy as cp

SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}""", "spin")
KHZ = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)


def test_spin(gpuprof):
    slower = float(os.environ.get("SLOWER", "1"))
    hiccup = pathlib.Path(__file__).with_name("hiccup")
    if hiccup.exists():
        hiccup.unlink()
        slower *= 1.3
    stream = cp.cuda.Stream(non_blocking=True)

    def body():
        with stream:
            for _ in range(4):
                SPIN((1,), (32,), (cp.int64(int(2.0 * KHZ * slower)),))
        stream.synchronize()

    gpuprof.measure(body, rounds=5, warmup=1)
'''


def _compare(pytester, plugin_args, *args):
    started = time.monotonic()
    result = pytester.runpytest_subprocess(
        *plugin_args,
        "--gpu-compare=main",
        "--gpu-compare-fail=kernel_ms:+5%",
        "--gpu-lock-timeout=60",
        "--gpu-report=r.json",
        *args,
    )
    (entry,) = json.loads(pytester.path.joinpath("r.json").read_text())["tests"]
    return result, entry, time.monotonic() - started


def test_a_slower_kernel_is_confirmed_and_a_lone_bad_run_is_not(pytester, plugin_args, monkeypatch):
    pytest.importorskip("cupy")
    pytester.makepyfile(test_spin=SUITE)
    for _ in range(3):
        pytester.runpytest_subprocess(*plugin_args, "--gpu-save=main").assert_outcomes(passed=1)
    monkeypatch.setenv("SLOWER", "1.2")
    result, entry, took = _compare(pytester, plugin_args)
    result.assert_outcomes(failed=1)
    assert entry["gate"]["decision"] == "regression" and entry["gate"]["confirmed_by"] == 1
    assert took < 120, took  # the fresh run used the device this run held: no wait for the lock
    monkeypatch.setenv("SLOWER", "1")
    pytester.path.joinpath("hiccup").touch()
    result, entry, _ = _compare(pytester, plugin_args)
    result.assert_outcomes(passed=1, warnings=1)
    assert entry["gate"]["decision"] == "undecided"
    (kernel,) = [c for c in entry["comparisons"] if c["metric"] == "kernel_ms"]
    assert kernel["unconfirmed"].startswith("0 of 1 fresh runs repeated it")
