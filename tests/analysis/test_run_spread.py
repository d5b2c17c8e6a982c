"""The run as the unit: the t quantiles against scipy, the level and spread of a history
against brute force, and the gate's own test, a simulation of runs whose level moves from
run to run (seeded), as a property: each history holds its own false-alarm rate (the
tolerance bound), and a slowdown of the stated smallest detectable change is found at
least 90% of the time."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gpuprof.analysis.run_spread import (
    CONFIDENCE,
    COVERAGE,
    POWER,
    SHIFT,
    Spread,
    newest_level,
    t_quantile,
    tolerance_factor,
)
from pytest_gpuprof.verdict.compare import assess, parse_thresholds

scipy_stats = pytest.importorskip("scipy.stats", reason="the test extra installs scipy")


@pytest.mark.parametrize("p", [0.1, 0.9, 0.95, 0.975, 0.9972])
@pytest.mark.parametrize("df", [1, 2, 3, 5, 8, 9, 13, 30, 100, 1000])
def test_t_quantiles_match_scipy(p, df):
    assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-6)


@pytest.mark.parametrize("shift", [-1.0, 1.96, 4.4, 6.2])
@pytest.mark.parametrize("df", [1, 2, 4, 5, 9, 20])
def test_noncentral_t_quantiles_match_scipy(shift, df):
    for p in (0.5, 0.9, 0.99):
        assert t_quantile(p, df, shift) == pytest.approx(scipy_stats.nct.ppf(p, df, shift), rel=1e-6)


def test_bad_quantile_arguments_are_named():
    with pytest.raises(ValueError, match="0 degrees of freedom"):
        t_quantile(0.9, 0)
    with pytest.raises(ValueError, match=r"probability 1\.5"):
        t_quantile(1.5, 3)


def _brute_level(medians):
    """The newest level by brute force: every split's two-sample t in numpy."""
    x = np.asarray(medians, dtype=float)
    n = len(x)
    if n < 3:
        return n
    ts = []
    for j in range(1, n):
        new, old = x[:j], x[j:]
        pooled = (((new - new.mean()) ** 2).sum() + ((old - old.mean()) ** 2).sum()) / (n - 2)
        gap = abs(new.mean() - old.mean())
        scale = math.sqrt(pooled * (1 / j + 1 / (n - j)))
        ts.append(gap / scale if scale > 0 else (math.inf if gap > 0 else 0.0))
    j = int(np.argmax(ts)) + 1
    return j if ts[j - 1] > scipy_stats.t.ppf(1 - SHIFT / (2 * (n - 1)), n - 2) else n


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(1.0, 2.0), min_size=2, max_size=12),
    st.integers(0, 11),
    st.sampled_from([0.0, 0.05, 0.5]),
)
def test_the_level_and_spread_match_brute_force(medians, shifted, step):
    """Any history, a step put in its newest runs or not: the newest level, the spread
    around the levels and the centre as numpy computes them."""
    medians = [m + (step if i < shifted else 0.0) for i, m in enumerate(medians)]
    k = _brute_level(medians)
    assert newest_level(medians) == k
    spread = Spread.of(medians)
    parts = [np.asarray(medians[:k]), np.asarray(medians[k:])] if k < len(medians) else [np.asarray(medians)]
    squares = sum(((p - p.mean()) ** 2).sum() for p in parts)
    assert spread.level_runs == k and spread.levels == len(parts)
    assert spread.sd == pytest.approx(math.sqrt(squares / (len(medians) - len(parts))), abs=1e-12)
    assert spread.center == pytest.approx(float(np.mean(medians[:k])))
    factor = scipy_stats.nct.ppf(CONFIDENCE, len(medians) - len(parts), scipy_stats.norm.ppf(COVERAGE) * math.sqrt(k))
    assert spread.bound == pytest.approx(factor / math.sqrt(k) * spread.sd, rel=1e-6, abs=1e-12)


def test_a_spread_of_one_run_is_unknown_and_says_nothing_it_cannot_know():
    one = Spread.of([5.0])
    assert not one.known and one.bound is None and one.detectable is None
    assert one.beyond(1e9, 1)  # nothing to explain a change by
    two = Spread.of([5.0, 6.0])
    sd = math.sqrt(0.5)
    assert two.center == 5.5 and two.level_runs == 2
    assert two.bound == pytest.approx(tolerance_factor(1, 2) * sd)
    assert two.detectable == pytest.approx(two.bound + t_quantile(0.9, 1) * sd * math.sqrt(1.5))


def test_a_merge_that_moved_main_is_a_new_level_not_spread():
    """Main ran at 100 for seven runs and 90 for its newest three: the level is 90, the
    spread is the runs' around their own levels, and 100 again is a change."""
    rng = np.random.default_rng(3)
    medians = [*(90 + rng.normal(0, 0.5, 3)), *(100 + rng.normal(0, 0.5, 7))]
    spread = Spread.of(medians)
    assert spread.levels == 2 and spread.level_runs == 3
    assert spread.center == pytest.approx(90, abs=1) and spread.sd < 1
    assert spread.beyond(100, 1) and not spread.beyond(91, 1)


SIMULATED = 2000
# the margin of a simulated rate, in standard errors: at 4, a property that holds fails one
# example in 30,000 (the rates themselves, over 20,000 histories a size: false alarms
# 1.0-2.0% for 12 down to 3 runs, power 0.896-0.899, just short of 0.9 by the few histories
# split in two)
MARGIN = 4


def _simulate(rng, runs, pooled, slowdown_in_detectables):
    """How often the gate says ``regression`` for a new run ``slowdown`` detectable changes
    slower than the history's level, the run levels normal with sd 1 around 100."""
    threshold = parse_thresholds("wall_ms:+0ms")[0]
    alarms = 0
    for _ in range(SIMULATED):
        levels = 100 + rng.normal(0, 1, runs)  # newest first
        spread = Spread.of(list(levels))
        baseline = [float(np.mean(levels[:pooled]))] * 5  # the rounds of one run share its level
        new = 100 + rng.normal(0, 1) + slowdown_in_detectables * (spread.detectable or 0.0)
        # a run's rounds all at its level: the rounds alone would always be clear
        alarms += assess(threshold, baseline, [float(new) + 1e-9] * 5, spread).finding == "regression"
    return alarms / SIMULATED


@settings(max_examples=5, deadline=None)
@given(runs=st.integers(3, 12), pooled=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**32 - 1))
def test_unchanged_runs_raise_false_alarms_within_the_stated_level(runs, pooled, seed):
    rate = _simulate(np.random.default_rng(seed), runs, min(pooled, runs), 0.0)
    assert rate <= 1 - COVERAGE + MARGIN * math.sqrt(COVERAGE * (1 - COVERAGE) / SIMULATED)


@settings(max_examples=5, deadline=None)
@given(runs=st.integers(3, 12), seed=st.integers(0, 2**32 - 1))
def test_each_history_holds_its_own_false_alarm_rate(runs, seed):
    """The tolerance bound's promise, per history: the chance that a new unchanged run lies
    past the bound (exact for normal runs, given the history) exceeds 1 - COVERAGE in at
    most 1 - CONFIDENCE of histories."""
    rng = np.random.default_rng(seed)
    over = 0
    for _ in range(SIMULATED):
        spread = Spread.of(list(rng.normal(0, 1, runs)))
        assert spread.center is not None and spread.bound is not None
        over += scipy_stats.norm.sf(spread.center + spread.bound) > 1 - COVERAGE
    # newest_level's false splits (SHIFT at most) shrink some histories' level to few runs
    assert over / SIMULATED <= 1 - CONFIDENCE + SHIFT + MARGIN * math.sqrt(0.1 * 0.9 / SIMULATED)


@settings(max_examples=5, deadline=None)
@given(runs=st.integers(3, 12), pooled=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**32 - 1))
def test_a_slowdown_of_the_smallest_detectable_change_is_found_nine_times_in_ten(runs, pooled, seed):
    rate = _simulate(np.random.default_rng(seed), runs, min(pooled, runs), 1.0)
    assert rate >= POWER - MARGIN * math.sqrt(POWER * (1 - POWER) / SIMULATED)


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


def test_the_per_history_check_sees_a_prediction_bound():
    """The check can fail: the prediction bound the gate used before (t(0.95) s
    sqrt(1 + 1/n) above the mean) holds its rate only over histories; far more than 1 -
    CONFIDENCE of histories exceed 1 - COVERAGE under it."""
    rng = np.random.default_rng(11)
    over = 0
    for _ in range(SIMULATED):
        runs = rng.normal(0, 1, 10)
        bound = scipy_stats.t.ppf(0.95, 9) * runs.std(ddof=1) * math.sqrt(1.1)
        over += scipy_stats.norm.sf(runs.mean() + bound) > 1 - COVERAGE
    assert over / SIMULATED > 0.5


def test_a_line_states_the_level_its_bound_and_a_shift():
    """The comparison line names the history's level and bound, and the runs it kept
    after a shift; a run back at main's old level reads ``regression``."""
    threshold = parse_thresholds("wall_ms:+2%")[0]
    spread = Spread.of([90.0, 90.2, 89.8, 100.1, 99.9, 100.0, 100.2, 99.8, 100.0, 100.1])
    change = assess(threshold, [90.0] * 5, [100.0] * 5, spread)
    line = change.describe()
    assert change.finding == "regression"
    new, old = np.array([90.0, 90.2, 89.8]), np.array([100.1, 99.9, 100.0, 100.2, 99.8, 100.0, 100.1])
    sd = math.sqrt((((new - new.mean()) ** 2).sum() + ((old - old.mean()) ** 2).sum()) / 8)
    bound = scipy_stats.nct.ppf(CONFIDENCE, 8, scipy_stats.norm.ppf(COVERAGE) * math.sqrt(3)) / math.sqrt(3) * sd
    assert f"between runs sd {sd:.3f} over 10 runs (level 90.000 ± {bound:.3f}, the newest 3 after a shift)" in line
    steady = assess(threshold, [90.0] * 5, [90.5] * 5, spread)
    assert steady.finding == "unchanged" and "the newest 3 after a shift" in steady.describe()
