"""The run as the unit: Student's t quantiles against scipy, and the gate's own test, a
simulation of runs whose level moves from run to run (seeded), as a property: over A/A
sequences the false-alarm rate stays within the stated level, and a slowdown of the stated
smallest detectable change is found at least 90% of the time."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gpuprof.analysis.mann_whitney import ALPHA
from pytest_gpuprof.analysis.run_spread import POWER, Spread, t_quantile
from pytest_gpuprof.verdict.compare import assess, parse_thresholds

scipy_stats = pytest.importorskip("scipy.stats", reason="the test extra installs scipy")


@pytest.mark.parametrize("p", [0.95, 0.9])
@pytest.mark.parametrize("df", [*range(1, 40), 60, 100, 1000])
def test_t_quantiles_match_scipy(p, df):
    assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), abs=2e-4)


def test_a_spread_of_one_run_is_unknown_and_says_nothing_it_cannot_know():
    one = Spread.of([5.0])
    assert not one.known and one.bound is None and one.detectable is None
    two = Spread.of([5.0, 6.0], pooled=1)
    sd = math.sqrt(0.5)
    assert two.bound == pytest.approx(t_quantile(0.95, 1) * sd * math.sqrt(2))
    assert two.detectable == pytest.approx((t_quantile(0.95, 1) + t_quantile(0.9, 1)) * sd * math.sqrt(2))


SIMULATED = 2000


def _simulate(rng, runs, pooled, slowdown_in_detectables):
    """How often the gate says ``regression`` for a new run ``slowdown`` detectable changes
    slower than the baseline, the run levels normal with sd 1 around 100."""
    threshold = parse_thresholds("wall_ms:+0ms")[0]
    alarms = 0
    for _ in range(SIMULATED):
        levels = 100 + rng.normal(0, 1, runs)  # newest first
        spread = Spread.of(list(levels), pooled)
        baseline = [float(np.mean(levels[:pooled]))] * 5  # the rounds of one run share its level
        new = 100 + rng.normal(0, 1) + slowdown_in_detectables * spread.detectable
        # a run's rounds all at its level: the rounds alone would always be clear
        alarms += assess(threshold, baseline, [float(new) + 1e-9] * 5, spread).finding == "regression"
    return alarms / SIMULATED


@settings(max_examples=5, deadline=None)
@given(runs=st.integers(3, 12), pooled=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**32 - 1))
def test_unchanged_runs_raise_false_alarms_within_the_stated_level(runs, pooled, seed):
    rate = _simulate(np.random.default_rng(seed), runs, min(pooled, runs), 0.0)
    assert rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / SIMULATED)


@settings(max_examples=5, deadline=None)
@given(runs=st.integers(3, 12), pooled=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**32 - 1))
def test_a_slowdown_of_the_smallest_detectable_change_is_found_nine_times_in_ten(runs, pooled, seed):
    rate = _simulate(np.random.default_rng(seed), runs, min(pooled, runs), 1.0)
    assert rate >= POWER - 3 * math.sqrt(POWER * (1 - POWER) / SIMULATED)


def test_the_simulation_sees_a_gate_that_reads_rounds_alone():
    """The check can fail: without the spread (the rounds alone, as before), the same A/A
    runs raise far more false alarms than the stated level."""
    rng = np.random.default_rng(7)
    threshold = parse_thresholds("wall_ms:+0ms")[0]
    alarms = sum(
        assess(threshold, [100 + rng.normal()] * 5, [100 + rng.normal() + 1e-9] * 5).finding == "regression"
        for _ in range(SIMULATED)
    )
    assert alarms / SIMULATED > 0.3
