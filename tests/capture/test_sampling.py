"""The host code behind the unattributed idle, in real pytest sessions on the host
backend's real clock (sampling has nothing to sample on the virtual clock, where host code
takes no time). What is asserted is who is named, with a share far from any load's reach:
the named function spins for 150 ms a time, against a sampling round each millisecond
(a round that comes late, the sampler held off by a loaded machine, charges the gap to
where it finds the thread: on a 2-core machine beside two busy processes and a suite, 63 ms
over the test's four transitions)."""

from __future__ import annotations

import json

import pytest

NAMED = """
import time

import pytest


def prepare_batch():
    end = time.perf_counter() + SPIN
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


def run(pytester, *args, spin=0.15):
    """The spinning test, whose host loop holds the device idle ``spin`` seconds a batch
    (long enough for the 1 ms sampler to place it on a busy machine)."""
    pytester.makepyfile(test_named=NAMED.replace("SPIN", str(spin)))
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
    # of what the samples explain, the spinning loop's share (a sampler starved by a busy
    # machine for longer than a round's reach leaves idle unexplained: never misplaced)
    assert spinning > 0 and spinning >= 0.8 * sum(named.values())
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
    result, test = run(pytester, *off, spin=0.02)  # nothing is sampled: no need to wait long
    assert "idle_by_code" not in test["metrics"]
    assert test["metrics"]["unattributed_ms"] > 0
    result.stdout.no_fnmatch_line("*host in:*")


def test_a_bad_sample_value_is_a_usage_error_naming_the_key(pytester):
    pytester.makepyprojecttoml('[tool.gpuprof]\nsample = "maybe"\n')
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*[[]tool.gpuprof[]]*sample*on*off*maybe*"])


def test_a_place_is_the_users_frame_and_the_library_function_it_called(tmp_path):
    import sys

    from pytest_gpuprof.capture.stacks import Places

    lib = tmp_path / "site" / "loaderlib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "wrap.py").write_text("def inner(f):\n    def inner(*a):\n        return f(*a)\n    return inner\n")
    (lib / "data.py").write_text(
        "import sys\nfrom loaderlib.wrap import inner\n\n"
        "class Loader:\n"
        "    def __next__(self):\n        return self._next_data()\n\n"
        "    @inner\n    def _next_data(self):\n        return self._fetch()\n\n"
        "    def _fetch(self):\n        return sys._getframe()\n"
    )
    user = tmp_path / "proj" / "test_train.py"
    user.parent.mkdir()
    user.write_text(
        "def epoch(loader):\n    return next(loader)\n\ndef here():\n    import sys\n    return sys._getframe()\n"
    )
    sys.path[:0] = [str(lib.parent), str(user.parent)]
    try:
        import test_train
        from loaderlib.data import Loader

        places = Places(roots=(str(lib.parent),), here=str(user.parent))
        # the user called __next__ (a dunder): named by the function of that file under it,
        # past the decorator's wrapper from another file
        assert places.of(test_train.epoch(Loader())) == "test_train.py:2 epoch > loaderlib/data.py:_next_data"
        assert places.of(test_train.here()) == "test_train.py:6 here"
    finally:
        del sys.path[:2]
        for name in ("test_train", "loaderlib", "loaderlib.data", "loaderlib.wrap"):
            sys.modules.pop(name, None)


def test_the_sampler_reads_the_threads_frames_with_the_collector_held_off(monkeypatch):
    """Before CPython 3.12 a collection inside ``sys._current_frames()`` can hang the process
    with the GIL held (gh-106883: a CI suite stopped at 91% for good); the sampler holds the
    collector off for the call, and leaves it as it found it, on or off."""
    import gc
    import sys

    from pytest_gpuprof.capture import stacks

    seen = []
    monkeypatch.setattr(sys, "_current_frames", lambda: seen.append(gc.isenabled()) or {})
    was = gc.isenabled()
    try:
        gc.enable()
        assert stacks._current_frames() == {} and gc.isenabled()
        gc.disable()
        assert stacks._current_frames() == {} and not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == ([sys.version_info >= (3, 12), False])
