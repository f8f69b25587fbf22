"""Interval arithmetic on int64 nanosecond arrays (numpy, no Python loops).

Every function takes ``starts`` and ``ends`` of equal length with
``ends >= starts`` (half-open intervals [start, end)).
"""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint intervals covering exactly the union of the inputs."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if starts.size == 0:
        return starts.copy(), ends.copy()
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum.accumulate(ends[order])
    # a new merged interval starts where an interval begins after every earlier one ended
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], e[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], e[last]


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of the intervals, in the input unit."""
    us, ue = union(starts, ends)
    return int((ue - us).sum())


def intersection_total(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of (union of a) ∩ (union of b)."""
    a_s, a_e = union(*a)
    b_s, b_e = union(*b)
    if a_s.size == 0 or b_s.size == 0:
        return 0
    # |A ∩ B| = |A| + |B| - |A ∪ B|
    both_s = np.concatenate([a_s, b_s])
    both_e = np.concatenate([a_e, b_e])
    return int((a_e - a_s).sum() + (b_e - b_s).sum() - total(both_s, both_e))


def gaps(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The holes between the union's intervals (from the first start to the last end)."""
    us, ue = union(starts, ends)
    return ue[:-1], us[1:]


def covers(union: tuple[np.ndarray, np.ndarray], points: np.ndarray) -> np.ndarray:
    """Whether each point (ns) lies inside the sorted, disjoint ``union`` of [start, end)."""
    starts, ends = union
    if starts.size == 0:
        return np.zeros(points.size, dtype=bool)
    idx = np.searchsorted(starts, points, side="right") - 1
    ok = idx >= 0
    result = np.zeros(points.size, dtype=bool)
    result[ok] = points[ok] < ends[idx[ok]]
    return result
