"""Interval arithmetic, checked against answers worked out by hand."""

import numpy as np

from stallscope import intervals


def arr(*values):
    return np.array(values, dtype=np.int64)


def test_union_merges_overlapping_and_touching_keeps_disjoint():
    # [0,10) [5,15) merge; [15,20) touches 15 -> merges; [30,40) stays apart
    s, e = intervals.union(arr(5, 0, 30, 15), arr(15, 10, 40, 20))
    assert s.tolist() == [0, 30]
    assert e.tolist() == [20, 40]


def test_total_counts_overlap_once():
    # [0,10) + [5,15) = 15; [20,30) = 10 -> 25
    assert intervals.total(arr(0, 5, 20), arr(10, 15, 30)) == 25


def test_nested_interval_does_not_shorten_union():
    # [0,100) contains [10,20); next [50,60) also inside
    s, e = intervals.union(arr(0, 10, 50), arr(100, 20, 60))
    assert (s.tolist(), e.tolist()) == ([0], [100])


def test_empty_inputs():
    assert intervals.total(arr(), arr()) == 0
    assert intervals.intersection_total((arr(), arr()), (arr(0), arr(5))) == 0


def test_intersection_total():
    # A = [0,10) u [20,30); B = [5,25) -> overlap [5,10) + [20,25) = 10
    assert intervals.intersection_total((arr(0, 20), arr(10, 30)), (arr(5), arr(25))) == 10


def test_gaps_between_union_intervals():
    s, e = intervals.gaps(arr(0, 5, 20, 50), arr(10, 12, 30, 60))
    assert s.tolist() == [12, 30]
    assert e.tolist() == [20, 50]


def test_covers_points_in_half_open_union():
    union = (np.array([10, 30]), np.array([20, 40]))
    points = np.array([5, 10, 19, 20, 25, 30, 39, 40, 50])
    assert intervals.covers(union, points).tolist() == [
        False, True, True, False, False, True, True, False, False
    ]  # fmt: skip
    assert intervals.covers((np.array([]), np.array([])), points).tolist() == [False] * 9
