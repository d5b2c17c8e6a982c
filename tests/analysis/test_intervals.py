import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gpuprof.analysis import intervals as iv


@pytest.fixture(autouse=True, params=["python", "numpy"])
def path(request, monkeypatch):
    """Every property on both paths: plain Python for few intervals, numpy for many."""
    if request.param == "numpy":
        monkeypatch.setattr(iv, "SMALL", 0)


GRID = 60
interval = st.tuples(st.integers(0, GRID), st.integers(0, GRID)).map(lambda t: (min(t), max(t)))
intervals = st.lists(interval, max_size=12)


def covered(spans, t):
    return any(s <= t < e for s, e in spans)


@given(intervals)
def test_union_covers_exactly_the_points_of_its_input(spans):
    merged = iv.union(spans)
    assert [covered(merged, t) for t in range(GRID)] == [covered(spans, t) for t in range(GRID)]
    # sorted, disjoint and not touching: a gap separates neighbours
    assert all(a[1] < b[0] for a, b in itertools.pairwise(merged))
    assert all(s < e for s, e in merged)


@given(intervals)
def test_length_counts_each_covered_point_once(spans):
    assert iv.length(spans) == sum(covered(spans, t) for t in range(GRID))


@given(intervals, interval)
def test_clip_and_gaps_partition_the_window(spans, window):
    inside = iv.covered_length(spans, window)
    holes = iv.gaps(iv.union(spans), window)
    assert inside == sum(covered(spans, t) for t in range(*window))
    assert inside + sum(e - s for s, e in holes) == window[1] - window[0]
    assert not any(covered(spans, t) for s, e in holes for t in range(s, e))


def test_union_merges_touching_intervals():
    assert iv.union([(5, 7), (0, 2), (2, 4), (6, 9), (3, 3)]) == [(0, 4), (5, 9)]


def test_gaps_of_nothing_is_the_window():
    assert iv.gaps([], (3, 8)) == [(3, 8)]


@given(intervals, intervals)
def test_intersect_keeps_exactly_the_points_of_both(a, b):
    both = iv.intersect(iv.union(a), iv.union(b))
    assert [covered(both, t) for t in range(GRID)] == [covered(a, t) and covered(b, t) for t in range(GRID)]
    assert all(x[1] <= y[0] for x, y in itertools.pairwise(both))


def plain(result):
    """``result`` with every number checked to be a Python int (numpy's would not cross
    xdist's wire)."""
    flat = [result] if isinstance(result, int) else [x for pair in result for x in pair]
    assert all(type(x) is int for x in flat), result
    return result


@given(intervals, intervals, interval)
def test_an_array_of_intervals_gives_what_the_list_gives_in_python_ints(spans, others, window):
    array = np.array(spans, dtype=np.int64).reshape(-1, 2)
    assert plain(iv.union(array)) == iv.union(spans)
    assert plain(iv.clip(array, window)) == iv.clip(spans, window)
    assert plain(iv.length(array)) == iv.length(spans)
    assert plain(iv.covered_length(array, window)) == iv.covered_length(spans, window)
    disjoint = iv.union(spans)
    assert plain(iv.gaps(np.array(disjoint, dtype=np.int64).reshape(-1, 2), window)) == iv.gaps(disjoint, window)
    assert iv.merged(array, window).tolist() == [list(p) for p in iv.union(iv.clip(spans, window))]
    assert iv.holes(np.array(disjoint, dtype=np.int64).reshape(-1, 2), window).tolist() == [
        list(p) for p in iv.gaps(disjoint, window)
    ]
    a, b = iv.union(spans), iv.union(others)
    as_array = np.array(a, dtype=np.int64).reshape(-1, 2)
    assert plain(iv.intersect(as_array, b)) == iv.intersect(a, b) == plain(iv.intersect(b, as_array))
