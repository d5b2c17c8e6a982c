"""The level a history holds now (``analysis.levels``): its two statistics against the plain
loops they stand for (hypothesis), each runner the rule must not be fooled by, through
``compare_tests`` as the gate calls it, and the run-wide share of the error rate."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gpuprof.analysis import levels
from pytest_gpuprof.analysis.run_spread import SUITE_RATE, Spread, bound_factor, tolerance_factor
from pytest_gpuprof.verdict.compare import compare_tests
from pytest_gpuprof.verdict.comparison import Comparison
from pytest_gpuprof.verdict.decision import decision, undecided_change
from pytest_gpuprof.verdict.thresholds import parse_thresholds

GATE = parse_thresholds("kernel_ms:+1%")


def _alone_loop(runs):
    limit = levels.ALONE.get(len(runs), levels.ALONE[max(levels.ALONE)])
    found = []
    for i in range(len(runs)):
        others = np.delete(runs, i)
        sd = float(np.std(others, ddof=1))
        distance = abs(float(runs[i]) - float(others.mean()))
        if (sd > 0 and distance > limit * sd) or (sd == 0 and distance > 1e-12 * np.abs(runs).max()):
            found.append(i)
    return found[0] if len(found) == 1 else None


def _shift_loop(runs):
    n, best, where = len(runs), 0.0, None
    for k in range(2, n - 1):
        new, old = runs[:k], runs[k:]
        pooled = ((new - new.mean()) ** 2).sum() + ((old - old.mean()) ** 2).sum()
        gap = abs(float(new.mean() - old.mean()))
        if pooled <= 1e-24 * max(float(((runs - runs.mean()) ** 2).sum()), 1e-300):
            t = math.inf if gap > 0 else 0.0
        else:
            t = gap / (math.sqrt(pooled / (n - 2)) * math.sqrt(1 / k + 1 / (n - k)))
        if t > best:
            best, where = t, k
    return where if best > levels.SHIFT.get(n, levels.SHIFT[max(levels.SHIFT)]) else None


@settings(max_examples=300, deadline=None)
@given(
    st.integers(6, 10).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(-0.05, 0.05), min_size=n, max_size=n),
            st.integers(0, n - 1),
            st.sampled_from([1.0, 0.9, 1.2, 3.0]),
            st.sampled_from(["lone", "step"]),
        )
    )
)
def test_the_statistics_match_their_loops(drawn):
    noise, where, factor, kind = drawn
    runs = 10 * (1 + np.asarray(noise))
    if kind == "lone":
        runs[where] *= factor
    else:
        runs[: max(where, 2)] *= factor
    assert levels._alone(runs) == _alone_loop(runs)
    assert levels._shift(runs) == _shift_loop(runs)


def _entry(level, rng):
    samples = list(level * (1 + rng.normal(0, 0.001, 9)))
    return {
        "nodeid": "t",
        "metrics": {"kernel_ms": float(np.median(samples))},
        "rounds": {"kernel_ms": {"samples": samples}},
    }


def _decide(history, level, rng):
    (change,) = compare_tests(GATE, history[0], _entry(level, rng), history)
    return change, decision(Comparison("t", "compared", (change,), tuple(GATE)))[0]


def test_a_lone_3x_run_is_left_out_and_a_1_5x_run_fails_on_the_next_comparison():
    rng = np.random.default_rng(3)
    for _ in range(50):
        levels_ = 10 * (1 + rng.normal(0, 0.01, 10))
        levels_[1] *= 3  # the second newest: a hiccup, or a bad commit reverted
        history = [_entry(v, rng) for v in levels_]
        change, decided = _decide(history, 15.0, rng)
        assert decided == "regression", change.describe()
        assert change.spread is not None and [(a.at, a.alone) for a in change.spread.aside] == [(1, True)]
        _, again = _decide(history, 30.0, rng)  # where the lone run lay: a level it held, undecided
        assert again == "undecided"


def test_a_step_on_main_is_straddled_then_becomes_the_level():
    rng = np.random.default_rng(4)
    old = [10 * (1 + rng.normal(0, 0.01)) for _ in range(10)]
    for after in (2, 3, 5):
        history = [_entry(9 * (1 + rng.normal(0, 0.01)), rng) for _ in range(after)]
        history += [_entry(v, rng) for v in old[: 10 - after]]
        change, decided = _decide(history, 10.0, rng)  # a pull request that undoes the step
        assert decided == "undecided", change.describe()
        why = undecided_change(change)
        assert why is not None
        if after == 2:
            assert change.spread is not None and change.spread.changed == 2
            assert "changed level 2 saves ago" in why.why
        else:
            assert change.spread is not None and change.spread.runs == after
            assert "before its level changed" in why.why
            _, on_top = _decide(history, 9 * 1.2, rng)  # 20% on top of the new level
            assert on_top == "regression"


def test_a_drift_explains_what_its_level_reached_and_a_steady_history_does_not():
    rng = np.random.default_rng(5)
    rising = [10 * (1 + 0.01 * (10 - i)) * (1 + rng.normal(0, 0.002)) for i in range(10)]  # newest first
    drifting = levels.learn(rising)
    assert drifting.drift is not None and drifting.drift == pytest.approx(0.1, rel=0.2)
    assert drifting.explains(11.1, 1) is not None and "drifts" in (drifting.explains(11.1, 1) or "")
    steady = levels.learn([10 * (1 + rng.normal(0, 0.002)) for _ in range(10)])
    assert steady.drift is None and steady.explains(11.1, 1) is None
    assert drifting.explains(13.0, 1) is None  # far past what the drift reaches


def test_a_run_of_many_comparisons_shares_the_error_rate():
    assert bound_factor(10, 9) == tolerance_factor(10)
    assert bound_factor(10, 9, 20) > tolerance_factor(10)
    wide = Spread(10, 1.0, 0.0, comparisons=20)
    assert wide.false_alarm == pytest.approx(1 - (1 - SUITE_RATE) ** (1 / 20), rel=1e-3)
    assert Spread(10, 1.0, 0.0).false_alarm == pytest.approx(0.0092, abs=0.0005)  # the tolerance bound's own


@pytest.mark.parametrize(
    "runner",
    [
        pytest.param(lambda rng, k: 1 + 0.0025 * k + rng.normal(0, 0.01), id="drift +0.25% a run"),
        pytest.param(lambda rng, k: 1 + rng.normal(0, 0.01), id="normal sd 1%"),
    ],
)
def test_unchanged_pull_requests_rarely_fail_twice(runner):
    """200 histories of 10 saved runs, 20 unchanged pull requests each, main saving between
    them (seeded): at most 5% of histories see two or more regressions (the target of
    docs/gates.md; benchmarks/gate_sim.py runs 1,000 a runner)."""
    rng = np.random.default_rng(6)
    twice = 0
    for _ in range(200):
        k = 0
        history = []
        for _ in range(10):
            k += 1
            history.insert(0, _entry(10 * runner(rng, k), rng))
        alarms = 0
        for _ in range(20):
            k += 1
            alarms += _decide(history, 10 * runner(rng, k), rng)[1] == "regression"
            k += 1
            history = [_entry(10 * runner(rng, k), rng), *history][:10]
        twice += alarms >= 2
    assert twice / 200 <= 0.05


def test_a_run_past_every_level_a_straddled_history_held_is_a_regression():
    rng = np.random.default_rng(8)
    history = [_entry(9 * (1 + rng.normal(0, 0.01)), rng) for _ in range(2)]
    history += [_entry(10 * (1 + rng.normal(0, 0.01)), rng) for _ in range(8)]
    change, decided = _decide(history, 15.0, rng)
    assert change.spread is not None and change.spread.changed == 2
    assert decided == "regression", change.describe()
