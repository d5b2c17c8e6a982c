"""xdist workers spread over the GPUs the caller lets them see, before CUDA starts."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plugin_runs import WITHOUT_HYPOTHESIS

from pytest_gpuprof.capture.placement import VISIBLE, Placement, place, visible


def test_the_callers_list_is_kept_in_its_order_up_to_an_empty_entry():
    assert visible({VISIBLE: "3,1"}, lambda: 8) == ("3", "1")
    assert visible({VISIBLE: "GPU-aa, GPU-bb"}, lambda: 8) == ("GPU-aa", "GPU-bb")
    assert visible({VISIBLE: "2,,5"}, lambda: 8) == ("2",)  # CUDA stops at the first empty entry
    assert visible({VISIBLE: ""}, lambda: 8) == ()  # no GPU at all
    assert visible({}, lambda: 3) == ("0", "1", "2")
    assert visible({}, lambda: None) == ()


@given(st.integers(0, 63), st.lists(st.sampled_from("0123456789"), min_size=0, max_size=8, unique=True))
def test_workers_go_round_the_gpus_and_one_gpu_is_left_alone(worker, gpus):
    gpus = tuple(gpus)
    placed = place(worker, gpus, None)
    if len(gpus) < 2:
        assert placed is None
    else:
        assert placed == Placement(gpus[worker % len(gpus)], worker % len(gpus), gpus)
        # every GPU gets a worker before any gets a second
        firsts = {place(w, gpus, None).entry for w in range(len(gpus))}
        assert firsts == set(gpus)


def test_gpu_devices_names_places_in_the_callers_list():
    gpus = ("4", "5", "6")
    assert [place(w, gpus, (2, 0)).entry for w in range(4)] == ["6", "4", "6", "4"]
    assert place(0, gpus, (7,)) is None  # none of them is visible: the runtime says so
    assert place(1, gpus, "all").entry == "5"


CHECK = """
import os, json, pathlib

def test_where(worker_id):
    pathlib.Path(f"where-{worker_id}.json").write_text(json.dumps(os.environ.get("CUDA_VISIBLE_DEVICES")))
"""


def where(pytester):
    return {p.stem.split("-", 1)[1]: json.loads(p.read_text()) for p in pytester.path.glob("where-*.json")}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), {"gw0": "3", "gw1": "7"}),
        (("--gpu-devices=1",), {"gw0": "7", "gw1": "7"}),
        (("--gpu-backend=host",), {"gw0": "3,7", "gw1": "3,7"}),
    ],
)
def test_each_worker_sees_its_own_gpu_before_its_tests_run(pytester, monkeypatch, args, expected):
    pytest.importorskip("xdist")
    monkeypatch.setenv(VISIBLE, "3,7")
    pytester.makepyfile(CHECK.replace("test_where", "test_a") + CHECK.replace("test_where", "test_b"))
    result = pytester.runpytest("-n", "2", "-p", "no:randomly", *WITHOUT_HYPOTHESIS, "--gpu-rounds=3", *args)
    result.assert_outcomes(passed=2)
    got = where(pytester)
    assert set(got) <= set(expected) and got == {w: expected[w] for w in got}, got


class _Config:
    def __init__(self, worker):
        self.workerinput = {"workerid": worker}


def test_a_pinned_device_or_the_host_backend_is_not_spread(monkeypatch):
    from pytest_gpuprof.harness.config import Settings
    from pytest_gpuprof.plugin import _spread

    monkeypatch.setenv(VISIBLE, "0,1")
    on = {"configured": True}
    assert _spread(_Config("gw1"), Settings(device=1, **on)) == (Settings(device=1, **on), None)
    assert _spread(_Config("gw1"), Settings(backend="host", **on)) == (Settings(backend="host", **on), None)
    assert _spread(object(), Settings(**on)) == (Settings(**on), None)  # not a worker
    # a run that only has the plugin installed: its workers keep every GPU
    assert _spread(_Config("gw1"), Settings()) == (Settings(), None)
    import os

    assert os.environ[VISIBLE] == "0,1"
    settings, placed = _spread(_Config("gw1"), Settings(devices="all", **on))
    assert placed is not None and placed.entry == "1" and settings.devices is None
    assert os.environ[VISIBLE] == "1"


def test_a_run_that_does_not_configure_the_plugin_leaves_every_gpu_to_every_worker(pytester, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv(VISIBLE, "3,7")
    pytester.makepyfile(CHECK.replace("test_where", "test_a") + CHECK.replace("test_where", "test_b"))
    result = pytester.runpytest("-n", "2", "-p", "no:randomly", *WITHOUT_HYPOTHESIS)
    result.assert_outcomes(passed=2)
    assert set(where(pytester).values()) == {"3,7"}
