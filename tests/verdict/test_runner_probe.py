"""The runner probe stands beside a host-bound change and never decides it: timed just
before each window, it read 1x to 7.6x beside a busy process on the same core, and dividing
it out passed slower code on a GPU (docs/gates.md, "The runner probe")."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_runs import entry, report_of

from pytest_gpuprof import cli
from pytest_gpuprof.verdict.compare import RUNNER, assess, compare_tests
from pytest_gpuprof.verdict.thresholds import parse_thresholds

JITTER = (1.0, 1.01, 0.99, 1.005, 0.995)  # five rounds around each figure


def run(kernel_ms, idle_ms, probe_ms, rounds=JITTER):
    """A test's report entry: each round ``kernel_ms`` of kernels and ``idle_ms`` beside them
    (the host's share), the runner probe timed before each (``None``: not timed)."""
    walls = [kernel_ms + idle_ms * j for j in rounds]
    kernels = [kernel_ms] * len(rounds)
    entry = {
        "nodeid": "t::a",
        "outcome": "passed",
        "metrics": {"wall_ms": walls[0], "kernel_ms": kernel_ms},
        "rounds": {
            "wall_ms": {"samples": walls},
            "kernel_ms": {"samples": kernels},
            "utilization": {"samples": [k / w for k, w in zip(kernels, walls, strict=True)]},
            "overhead_ms": {"samples": [w - k for k, w in zip(kernels, walls, strict=True)]},
        },
    }
    if probe_ms is not None:
        entry["metrics"][RUNNER] = probe_ms
        entry["rounds"][RUNNER] = {"samples": [probe_ms * j for j in rounds]}
    return entry


BASE = run(10.0, 20.0, 0.700)


@pytest.mark.parametrize("gate", ["wall_ms:+2%", "utilization:-2pt", "overhead_ms:+5%"])
def test_a_host_bound_line_names_both_probes_and_its_verdict_stands(gate):
    """The host 30% slower, the code unchanged: the probe says so, and the gate still fails
    (what a busy neighbour does to the probe makes it no ground for a pass)."""
    (change,) = compare_tests(parse_thresholds(gate), BASE, run(10.0, 26.0, 0.910))
    assert change.finding == "regression"
    assert change.describe().endswith(": regression (runner probe 0.700 ms in the baseline, 0.910 ms now)")
    assert change.to_dict()["runner"] == "runner probe 0.700 ms in the baseline, 0.910 ms now"


def test_kernel_time_names_no_probe_and_a_run_without_probes_names_none():
    (kernel,) = compare_tests(parse_thresholds("kernel_ms:+2%"), BASE, run(11.0, 26.0, 0.910))
    assert kernel.finding == "regression" and kernel.runner is None
    (old,) = compare_tests(parse_thresholds("wall_ms:+2%"), run(10.0, 20.0, None), run(10.0, 26.0, 0.910))
    assert old.finding == "regression" and old.runner is None
    (same,) = compare_tests(parse_thresholds("wall_ms:+2%"), BASE, run(10.0, 20.0, 0.700))
    assert same.finding == "unchanged" and "(runner probe 0.700 ms in the baseline, 0.700 ms now)" in same.describe()


@settings(max_examples=200, deadline=None)
@given(
    kernel=st.floats(0.5, 50.0),
    idle=st.floats(0.5, 50.0),
    code=st.floats(0.5, 2.0),
    probe=st.one_of(st.none(), st.floats(0.1, 10.0)),
)
def test_the_probe_never_changes_a_finding(kernel, idle, code, probe):
    """Brute force: every host-bound finding is the rounds' own, whatever the probes read."""
    base, now = run(kernel, idle, 0.700), run(kernel, idle * code, probe)
    for gate in parse_thresholds("wall_ms:+2%,utilization:-2pt,overhead_ms:+5%"):
        (change,) = compare_tests([gate], base, now)
        plain = assess(gate, samples(base, gate.metric), samples(now, gate.metric))
        assert change.finding == plain.finding
        assert (change.runner is None) == (probe is None)


def samples(entry, metric):
    return entry["rounds"][metric]["samples"]


def test_gpuprof_compare_prints_the_probes_and_fails_slower_code_on_any_runner(tmp_path, capsys):
    def report(test):
        machine = {"id": "host-aaa", "gpu": "g", "backend": "host"}
        return {"schema": 1, "created": "x", "machine": machine, "tests": [test]}

    files = {}
    for name, test in {"base": BASE, "fast": run(10.0, 26.0, 0.300), "slow": run(10.0, 26.0, 5.0)}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(report(test)))
    for runner, probe in (("fast", "0.300"), ("slow", "5.000")):
        assert cli.main(["compare", str(files["base"]), str(files[runner]), "--fail", "wall_ms:+2%", "-v"]) == 1
        out = capsys.readouterr().out
        assert f"): regression (runner probe 0.700 ms in the baseline, {probe} ms now)" in out


PROBED = """
def test_rounds(gpuprof, gpu_workload):
    gpuprof.measure(lambda: gpu_workload.compute(ms=1), rounds=3, warmup=1)

def test_whole(gpu_workload):
    gpu_workload.compute(ms=1)
"""


@pytest.mark.parametrize("clock", ["real", "virtual"])
def test_each_round_of_a_window_times_the_probe_on_the_real_clock_only(pytester, clock):
    """A measured round has its probe; a test measured whole, and any window of the virtual
    clock (where host code takes no time), has none: null, never 0."""
    pytester.makepyfile(test_probed=PROBED)
    result, report = report_of(pytester, f"--gpu-host-clock={clock}")
    result.assert_outcomes(passed=2)
    rounds, whole = entry(report, "test_rounds"), entry(report, "test_whole")
    assert whole["metrics"][RUNNER] is None and RUNNER not in whole.get("rounds", {})
    if clock == "virtual":
        assert rounds["metrics"][RUNNER] is None and RUNNER not in rounds["rounds"]
        return
    samples = rounds["rounds"][RUNNER]["samples"]
    assert len(samples) == 3 and all(ms > 0 for ms in samples)
    assert rounds["metrics"][RUNNER] == sorted(samples)[1]
