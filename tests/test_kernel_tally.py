"""kernel_tally: running per-name tallies equal a count from scratch, in any query order."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from stallscope.kernel_tally import KernelTally, group_kernels


def _from_scratch(start, code, dur, grid, names, end):
    """(count, total ns, {code: most common grid, ties to the smallest}) of kernels before end."""
    keep = start < end
    c, d, g = code[keep], dur[keep], grid[keep]
    pairs = Counter(zip(c.tolist(), g.tolist(), strict=True))
    mode = {}
    for (cc, gg), n in sorted(pairs.items()):
        if cc not in mode or n > pairs[(cc, mode[cc])]:
            mode[cc] = gg
    return np.bincount(c, minlength=names), np.bincount(c, d, minlength=names), mode


def _kernels(seed: int, n: int = 400, names: int = 7):
    rng = np.random.default_rng(seed)
    start = np.sort(rng.integers(0, 10_000, n))  # repeated starts on purpose
    code = rng.integers(0, names, n)
    dur = rng.integers(1, 5_000, n)
    grid = rng.integers(0, 3, n)  # few grids: many ties
    return start, code, dur, grid


@pytest.mark.parametrize("seed", range(8))
def test_any_order_of_queries_gives_the_from_scratch_tally(seed):
    names = 7
    start, code, dur, grid = _kernels(seed, names=names)
    tally = KernelTally(start, code, dur, grid, names)
    rng = np.random.default_rng(100 + seed)
    ends = np.r_[np.sort(rng.integers(-5, 10_100, 30)), rng.integers(-5, 10_100, 30)]
    for end in ends.tolist():  # rising first, then any order (earlier ones start over)
        tally.advance(end)
        count, total, mode = _from_scratch(start, code, dur, grid, names, end)
        assert tally.count.tolist() == count.tolist()
        assert tally.total_ns.tolist() == total.tolist()
        codes = np.arange(names)
        expected = [mode.get(c, -1) for c in codes.tolist()]
        assert tally.mode_grid(codes).tolist() == expected


def test_a_tie_goes_to_the_smallest_grid_whatever_came_first():
    start = np.array([0, 1, 2, 3], dtype=np.int64)
    code = np.zeros(4, dtype=np.int64)
    grid = np.array([9, 9, 4, 4], dtype=np.int64)
    tally = KernelTally(start, code, np.ones(4, dtype=np.int64), grid, 2)
    assert tally.advance(2).mode_grid(np.array([0, 1])).tolist() == [9, -1]
    assert tally.advance(3).mode_grid(np.array([0])).tolist() == [9]  # 9 twice, 4 once
    assert tally.advance(4).mode_grid(np.array([0])).tolist() == [4]  # two each: the smaller


def test_group_kernels_splits_by_participant_and_step_in_start_order():
    part = np.array([1, 0, 0, 1, 0], dtype=np.int64)
    step = np.array([0, 2, 1, 0, 2], dtype=np.int64)
    start = np.array([50, 30, 10, 20, 5], dtype=np.int64)
    code = np.array([0, 1, 0, 1, 1], dtype=np.int64)
    dur = np.array([1, 2, 3, 4, 5], dtype=np.int64)
    groups = group_kernels(part, step, start, code, dur, np.zeros(5, dtype=np.int64), 2)
    assert sorted(groups) == [(0, 1), (0, 2), (1, 0)]
    assert groups[(0, 2)].advance(31).total_ns.tolist() == [0.0, 7.0]
    assert groups[(1, 0)].advance(21).count.tolist() == [0, 1]  # only the kernel at 20
    assert group_kernels(*(np.zeros(0, dtype=np.int64),) * 6, 2) == {}
