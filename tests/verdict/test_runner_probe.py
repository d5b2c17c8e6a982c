"""A slower runner is not slower code: a host-bound change that the runner probe explains
reads ``runner``; code that got slower reads ``regression`` on any runner."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gpuprof import cli
from pytest_gpuprof.analysis.run_spread import Spread
from pytest_gpuprof.verdict.compare import RUNNER, assess, compare_tests, parse_thresholds

JITTER = (1.0, 1.01, 0.99, 1.005, 0.995)  # five rounds around each figure


def run(kernel_ms, idle_ms, probe_ms, rounds=JITTER):
    """A test's report entry: each round ``kernel_ms`` of kernels and ``idle_ms`` beside them
    (the host's share), the runner probe timed before each."""
    walls = [kernel_ms + idle_ms * j for j in rounds]
    kernels = [kernel_ms] * len(rounds)
    return {
        "nodeid": "t::a",
        "outcome": "passed",
        "metrics": {"wall_ms": walls[0], "kernel_ms": kernel_ms, RUNNER: probe_ms},
        "rounds": {
            "wall_ms": {"samples": walls},
            "kernel_ms": {"samples": kernels},
            "utilization": {"samples": [k / w for k, w in zip(kernels, walls, strict=True)]},
            "overhead_ms": {"samples": [w - k for k, w in zip(kernels, walls, strict=True)]},
            RUNNER: {"samples": [probe_ms * j for j in rounds]},
        },
    }


BASE = run(10.0, 20.0, 0.700)


@pytest.mark.parametrize("gate", ["wall_ms:+2%", "utilization:-2pt", "overhead_ms:+5%"])
def test_a_host_30_percent_slower_reads_runner_naming_both_probes(gate):
    (change,) = compare_tests(parse_thresholds(gate), BASE, run(10.0, 26.0, 0.910))
    assert change.finding == "runner"
    assert (
        "(runner probe 0.700 ms in the baseline, 0.910 ms now: the host 30% slower; at the baseline's speed, unchanged)"
        in change.describe()
    )
    assert change.to_dict()["runner"].startswith("runner probe 0.700 ms")


def test_slower_code_on_the_same_runner_is_a_regression_and_names_no_runner():
    (change,) = compare_tests(parse_thresholds("wall_ms:+2%"), BASE, run(10.0, 26.0, 0.700))
    assert change.finding == "regression" and change.runner is None


def test_slower_code_on_a_slower_runner_is_a_regression_at_the_baselines_speed_too():
    """The gate must fail here: the host 30% slower explains 6 of the 13 ms more."""
    (change,) = compare_tests(parse_thresholds("wall_ms:+2%"), BASE, run(10.0, 33.0, 0.910))
    assert change.finding == "regression"
    assert "the host 30% slower; a regression at the baseline's speed too" in change.describe()


def test_kernel_time_is_never_the_runners():
    (change,) = compare_tests(parse_thresholds("kernel_ms:+2%"), BASE, run(11.0, 26.0, 0.910))
    assert change.finding == "regression" and change.runner is None


def test_a_probe_that_is_not_clearly_slower_explains_nothing():
    """One round a side can never be clear; a probe within the runners' own spread neither."""
    one = run(10.0, 20.0, 0.700, rounds=(1.0,))
    (change,) = compare_tests(parse_thresholds("wall_ms:+2%"), one, run(10.0, 26.0, 0.910, rounds=(1.0,)))
    assert change.finding != "runner"
    history = [run(10.0, 20.0 * level, 0.700 * level) for level in (0.8, 1.0, 1.25, 0.9, 1.3, 1.1)]
    (wide,) = compare_tests(parse_thresholds("wall_ms:+2%"), BASE, run(10.0, 40.0, 0.910), history=history)
    assert Spread.of([0.700 * level for level in (0.8, 1.0, 1.25, 0.9, 1.3, 1.1)]).bound > 0.21
    assert wide.finding == "regression" and wide.runner is None


def test_a_baseline_saved_before_the_probe_compares_as_before():
    old = json.loads(json.dumps(BASE))
    del old["metrics"][RUNNER], old["rounds"][RUNNER]
    (change,) = compare_tests(parse_thresholds("wall_ms:+2%"), old, run(10.0, 26.0, 0.910))
    assert change.finding == "regression" and change.runner is None


finite = st.floats(0.5, 50.0)


@settings(max_examples=200, deadline=None)
@given(
    kernel=finite,
    idle=finite,
    host=st.one_of(st.just(1.0), st.floats(1.05, 3.0)),
    code=st.one_of(st.just(1.0), st.floats(1.0, 2.0)),
)
def test_the_runner_explains_no_more_than_the_host_did(kernel, idle, host, code):
    """Brute force: the rounds at the baseline's speed are ``kernel + idle * code`` (the
    runner's share divided out exactly); their finding is the verdict's, and on an
    unchanged runner (``host`` 1) the verdict is the plain rounds' own."""
    gate = parse_thresholds("wall_ms:+2%")
    now = run(kernel, idle * code * host, 0.700 * host)
    (change,) = compare_tests(gate, base_of(kernel, idle), now)
    plain = assess(gate[0], base_of(kernel, idle)["rounds"]["wall_ms"]["samples"], now["rounds"]["wall_ms"]["samples"])
    if host == 1.0 or plain.finding != "regression":
        assert change.finding == plain.finding
        return
    at_base = assess(
        gate[0],
        base_of(kernel, idle)["rounds"]["wall_ms"]["samples"],
        run(kernel, idle * code, 1)["rounds"]["wall_ms"]["samples"],
    )
    assert (change.finding == "regression") == (at_base.finding == "regression")
    assert change.finding in ("regression", "runner")


def base_of(kernel, idle):
    return run(kernel, idle, 0.700)


def test_gpuprof_compare_passes_a_slower_runner_and_fails_slower_code(tmp_path, capsys):
    def report(entry):
        return {
            "schema": 1,
            "created": "x",
            "machine": {"id": "host-aaa", "gpu": "g", "backend": "host"},
            "tests": [entry],
        }

    files = {}
    for name, entry in {"base": BASE, "runner": run(10.0, 26.0, 0.910), "code": run(10.0, 33.0, 0.910)}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(report(entry)))
    assert cli.main(["compare", str(files["base"]), str(files["runner"]), "--fail", "wall_ms:+2%"]) == 0
    assert "t::a: runner" in capsys.readouterr().out
    assert cli.main(["compare", str(files["base"]), str(files["code"]), "--fail", "wall_ms:+2%"]) == 1
    out = capsys.readouterr().out
    assert "t::a: regression" in out and "a regression at the baseline's speed too" in out
