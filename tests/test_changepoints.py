"""Change points against a brute-force reading of the same rule, and the cases a team reads."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis.changepoints import MIN_SIDE, WINDOW, change_points


def test_a_ten_percent_step_at_the_fourth_run_is_the_one_change_point():
    (point,) = change_points([100.0, 100.0, 100.0, 110.0, 110.0, 110.0])
    assert point.index == 3 and point.relative == 0.1


def test_equal_runs_and_a_single_outlier_have_none():
    assert change_points([100.0] * 6) == []
    assert change_points([100.0, 100.2, 99.9, 130.0, 100.1, 99.8, 100.0]) == []


def test_noise_within_the_runs_is_not_a_shift():
    assert change_points([100.0, 103.0, 97.0, 101.0, 99.0, 102.0, 98.0, 100.5]) == []


def test_two_shifts_in_a_long_history_are_both_found():
    series = [100.0] * 8 + [90.0] * 8 + [95.0] * 8
    assert [p.index for p in change_points(series)] == [8, 16]


@given(st.lists(st.sampled_from([10.0, 10.5, 11.0, 20.0]), max_size=14))
def test_every_change_point_separates_its_windows_and_none_is_a_lone_run(levels):
    for point in change_points(levels):
        k = point.index
        before, after = levels[max(0, k - WINDOW) : k], levels[k : k + WINDOW]
        assert len(before) >= MIN_SIDE and len(after) >= MIN_SIDE
        assert min(after) > max(before) or max(after) < min(before)
        assert point.before == statistics.median(before) and point.after == statistics.median(after)
