"""The run as the unit: the t quantiles against scipy, the level, spread and bound of a
history against numpy and scipy, and the gate's own test, a simulation of runs whose level moves from
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
    Spread,
    t_quantile,
    tolerance_factor,
)
from pytest_gpuprof.verdict.compare import assess
from pytest_gpuprof.verdict.thresholds import parse_thresholds

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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 2.0), min_size=2, max_size=12))
def test_the_level_spread_and_bound_match_numpy_and_scipy(medians):
    spread = Spread.of(medians)
    n = len(medians)
    assert spread.center == pytest.approx(float(np.mean(medians)))
    assert spread.sd == pytest.approx(float(np.std(medians, ddof=1)), abs=1e-12)
    factor = scipy_stats.nct.ppf(CONFIDENCE, n - 1, scipy_stats.norm.ppf(COVERAGE) * math.sqrt(n)) / math.sqrt(n)
    assert spread.bound == pytest.approx(factor * spread.sd, rel=1e-6, abs=1e-12)
    power = scipy_stats.t.ppf(POWER, n - 1) * spread.sd * math.sqrt(1 + 1 / n)
    assert spread.detectable == pytest.approx(spread.bound + power, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize(("n", "factor"), [(5, 4.202), (10, 2.911), (20, 2.396)])
def test_the_tolerance_factor_meets_the_published_table(n, factor):
    """The one-sided normal tolerance factor at 95% coverage and 95% confidence, as its
    published tables give it."""
    z = scipy_stats.norm.ppf(0.95)
    assert t_quantile(0.95, n - 1, z * math.sqrt(n)) / math.sqrt(n) == pytest.approx(factor, abs=1e-3)


def test_a_spread_of_one_run_is_unknown_and_says_nothing_it_cannot_know():
    one = Spread.of([5.0])
    assert one.sd is None and one.bound is None and one.detectable is None
    assert one.beyond(1e9, 1)  # nothing to explain a change by
    two = Spread.of([5.0, 6.0])
    sd = math.sqrt(0.5)
    assert two.center == 5.5
    assert two.bound == pytest.approx(tolerance_factor(2) * sd)
    assert two.detectable == pytest.approx(two.bound + t_quantile(0.9, 1) * sd * math.sqrt(1.5))


def test_a_runner_of_two_speeds_is_one_level():
    """An H100 runner whose first saved run was fast and the next five slow (JAX
    utilization, 2026-12-06): the six are one level, spread included, so an unchanged run at
    either speed passes. Split at its shift, the five slow runs alone said +-10pt, and
    two unchanged runs of six failed."""
    saved = [0.5006, 0.4728, 0.4637, 0.4325, 0.4509, 0.7128]  # newest first
    spread = Spread.of(saved)
    assert spread.center == pytest.approx(float(np.mean(saved)))
    for now in (0.3615, 0.2984, 0.7128):
        assert not spread.beyond(now, -1) and not spread.beyond(now, 1)


SIMULATED = 2000
# the margin of a simulated rate, in standard errors: at 4, a property that holds fails one
# example in 30,000
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
    assert over / SIMULATED <= 1 - CONFIDENCE + MARGIN * math.sqrt(0.1 * 0.9 / SIMULATED)


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


def test_a_line_states_the_level_and_its_bound():
    """The comparison line names the history's level and bound; a run past them reads
    ``regression``, one within them ``unchanged`` however far from the baseline's figure."""
    threshold = parse_thresholds("wall_ms:+2%")[0]
    saved = [100.1, 99.9, 100.0, 100.2, 99.8, 100.0, 100.1, 99.7, 100.3, 100.0]
    spread = Spread.of(saved)
    bound = tolerance_factor(10) * float(np.std(saved, ddof=1))
    change = assess(threshold, [97.0] * 5, [101.0] * 5, spread)
    assert change.finding == "regression"
    assert (
        f"between runs sd {np.std(saved, ddof=1):.3f} over 10 runs (level 100.010 ± {bound:.3f})" in change.describe()
    )
    within = assess(threshold, [97.0] * 5, [100.4] * 5, spread)
    assert within.finding == "inconclusive"  # past the threshold from 97, within the spread


# --- the trimmed mean of gpuprof ab's pairs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=40))
def test_the_trimmed_mean_and_its_error_match_scipy(values):
    """Yuen's figures against scipy's trimmed mean and winsorized sample, their textbook
    definitions."""
    from scipy.stats import mstats

    from pytest_gpuprof.analysis.trimmed import Trimmed, trimmed_count

    n, g = len(values), trimmed_count(len(values))
    found = Trimmed.of(values)
    assert found.center == pytest.approx(scipy_stats.trim_mean(values, g / n), rel=1e-9, abs=1e-9)
    winsorized = np.asarray(mstats.winsorize(np.asarray(values), limits=(g / n, g / n)), dtype=float)
    assert found.se == pytest.approx(np.std(winsorized, ddof=1) / ((1 - 2 * g / n) * math.sqrt(n)), rel=1e-9, abs=1e-9)


def test_below_six_values_it_is_students_t():
    from pytest_gpuprof.analysis.trimmed import Trimmed, trimmed_count, trimmed_quantile

    assert [trimmed_count(n) for n in (2, 5, 6, 9, 10, 15, 200)] == [0, 0, 1, 1, 2, 3, 40]
    for n in (2, 3, 4, 5):
        assert trimmed_quantile(0.985, n) == t_quantile(0.985, n - 1)
    found = Trimmed.of([1.0, 2.0, 4.0, 8.0])
    assert found.center == pytest.approx(3.75) and found.se == pytest.approx(np.std([1, 2, 4, 8], ddof=1) / 2)
    with pytest.raises(ValueError, match="1 values, 2 or more"):
        Trimmed.of([1.0])


@pytest.mark.parametrize("n", [5, 6, 10, 20])
@pytest.mark.parametrize("confidence", [0.985, 0.995])
def test_the_trimmed_intervals_hold_their_level_for_normal_pairs(n, confidence):
    """Seeded, a generator apart from the one the quantiles were drawn with: a one-sided
    end is passed ``1 - confidence`` of the time, within four standard errors. Yuen's own t
    (``n - 2g - 1`` degrees of freedom) passes the 99.5% end 0.8% of the time at 10 pairs,
    the 98.5% end 2.1% of the time at 6."""
    from pytest_gpuprof.analysis.trimmed import Trimmed

    rng = np.random.default_rng(1000 + n)
    trials = 20_000
    passed = sum(Trimmed.of(list(rng.normal(0, 1, n))).low(confidence) > 0 for _ in range(trials))
    alpha = 1 - confidence
    assert abs(passed / trials - alpha) <= 4 * math.sqrt(alpha * (1 - alpha) / trials)


def test_the_trimmed_detectable_change_is_found_as_often_as_stated():
    """Seeded: 5 and 10 normal pairs print their detectable change at 90% power; fresh pairs
    at that true change put their interval's low end past the limit 90% of the time."""
    from pytest_gpuprof.analysis.trimmed import Trimmed

    rng = np.random.default_rng(77)
    for n in (5, 10):
        trials, found = 4000, 0
        for _ in range(trials):
            printed = Trimmed.of(list(rng.normal(0, 1, n))).detectable(0.0, 0.985, 0.9)
            found += Trimmed.of(list(rng.normal(printed, 1, n))).low(0.985) > 0
        assert abs(found / trials - 0.9) <= 4 * math.sqrt(0.09 / trials)
