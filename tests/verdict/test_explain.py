"""``gpuprof explain``: each cause injected alone into a test on the host backend's virtual
clock is explained first with at least 80% of the test's change; two at once are both
named with their true shares; the split sums to the change."""

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof import cli
from pytest_gpuprof.verdict.explain import explain

PIPELINE = """
import os

CHANGE = os.environ.get("GPUPROF_CHANGE", "")

def test_pipeline(gpuprof, gpu_workload):
    def body():
        with gpuprof.step("upload"):
            gpu_workload.upload(64 << 20, pinned="pageable" not in CHANGE)
        with gpuprof.step("compute"):
            gpu_workload.compute(ms=4.4 if "slower" in CHANGE else 4.0)
            if "new kernel" in CHANGE:
                gpu_workload.compute(ms=1.0, kind="matmul")
    gpuprof.measure(body, rounds=3, warmup=0)
"""


def _report(pytester, name, change):
    os.environ["GPUPROF_CHANGE"] = change
    try:
        result = pytester.runpytest("--gpu-host-clock=virtual", f"--gpu-report={name}", "-p", "no:randomly")
    finally:
        del os.environ["GPUPROF_CHANGE"]
    result.assert_outcomes(passed=1)
    return json.loads(pytester.path.joinpath(name).read_text())["tests"][0]


@pytest.fixture
def runs(pytester):
    pytester.makepyfile(test_pipeline=PIPELINE)
    return lambda change: _report(pytester, f"{change or 'base'}.json".replace(" ", "-"), change)


@pytest.mark.parametrize(
    ("change", "first"),
    [
        ("slower", "kernel fft slower"),
        ("new kernel", "kernel matmul appeared"),
        ("pageable", "copies in step upload"),
    ],
)
def test_a_cause_injected_alone_is_explained_first_with_most_of_the_change(runs, change, first):
    found = explain(runs(""), runs(change))
    assert found.change_ms > 0
    top = found.causes[0]
    assert top.what == first, found.lines()
    assert found.share(top) >= 0.8, found.lines()
    assert abs(found.unexplained_ms) < 1e-6


def test_two_causes_at_once_are_both_named_with_their_true_shares(runs):
    base, slower, new, both = runs(""), runs("slower"), runs("new kernel"), runs("slower new kernel")
    alone = {c.what: c.ms for e in (explain(base, slower), explain(base, new)) for c in e.causes}
    found = explain(base, both)
    shares = {c.what: found.share(c) for c in found.causes}
    total = sum(alone.values())
    for what, ms in alone.items():
        assert abs(shares[what] - ms / total) <= 0.10, found.lines()


def test_the_command_prints_each_cause_and_writes_every_one_as_json(runs, pytester, capsys):
    runs("")
    runs("pageable")
    out_json = pytester.path / "why.json"
    rc = cli.main(
        ["explain", str(pytester.path / "base.json"), str(pytester.path / "pageable.json"), "--json", str(out_json)]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "test_pipeline.py::test_pipeline: wall " in out
    assert "copies in step upload: +" in out and "pinned -> " in out and "pageable" in out
    (entry,) = json.loads(out_json.read_text())
    assert entry["causes"][0]["what"] == "copies in step upload" and entry["causes"][0]["share"] >= 0.8


@given(
    kernels=st.dictionaries(st.sampled_from("abcd"), st.floats(0.1, 5), max_size=4),
    kernels_after=st.dictionaries(st.sampled_from("abcd"), st.floats(0.1, 5), max_size=4),
    idle=st.dictionaries(st.sampled_from(["up", "down"]), st.floats(0, 3), max_size=2),
    idle_after=st.dictionaries(st.sampled_from(["up", "down"]), st.floats(0, 3), max_size=2),
    stray=st.tuples(st.floats(0, 2), st.floats(0, 2)),
)
def test_the_causes_sum_to_the_change_of_wall_time(kernels, kernels_after, idle, idle_after, stray):
    """Against the identity a window holds: wall = kernel time + each step's idle + the idle
    in no step (kernels here never overlap, so the union is their sum)."""

    def entry(totals, steps, unattributed):
        kernel = sum(totals.values())
        wall = kernel + sum(steps.values()) + unattributed
        return {
            "nodeid": "t",
            "metrics": {
                "wall_ms": wall,
                "kernel_ms": kernel,
                "kernel_totals": totals,
                "steps": {n: {"idle_ms": v} for n, v in steps.items()},
                "unattributed_ms": unattributed,
            },
        }

    found = explain(entry(kernels, idle, stray[0]), entry(kernels_after, idle_after, stray[1]))
    assert sum(c.ms for c in found.causes) + found.unexplained_ms == pytest.approx(found.change_ms, abs=1e-9)
    assert abs(found.unexplained_ms) < 1e-6
