"""Running per-name tallies of one participant's compute kernels in one step, up to a time.

:func:`stallscope.lateness.explain` compares, for every late collective, the
straggler's kernels from its step start to its arrival with the reference's.
Counting each such prefix from scratch costs the step's kernels per instance:
the square of the trace's length when a capture has no step markers (one step)
and thousands of collectives. A :class:`KernelTally` instead advances over
the kernels that started since its last query, so a run of queries with
rising end times reads each kernel once. A query earlier than the last starts
over from the step's first kernel: the answer never depends on the order of
the queries.

Per name code it keeps the launch count, the summed duration (ns, float64 as
``np.bincount`` gives it: sums of integer ns below 2**53 are exact, so the
result does not depend on how the prefix was cut) and the most common launch
grid (ties: the smallest grid).
"""

from __future__ import annotations

import numpy as np


class KernelTally:
    """Tallies of the kernels (sorted by start, ns) of one (participant, step) before an end.

    ``count`` (launches) and ``total_ns`` (summed duration) are indexed by name code and
    exist once :meth:`advance` has been called (``names`` entries each: a job holds
    one tally per participant and step, and only the straggler's and its references'
    are ever queried). ``start``, ``code``, ``dur``, ``grid``: the step's compute kernels in start
    order (int64; ``code`` indexes a job-wide name list of ``names`` entries).
    """

    def __init__(
        self,
        start: np.ndarray,
        code: np.ndarray,
        dur: np.ndarray,
        grid: np.ndarray,
        names: int,
    ) -> None:
        self._start, self._code, self._dur, self._grid = start, code, dur, grid
        self._names = names
        self.upto_index = -1  # the tallies are made on the first query: most groups get none

    def _reset(self) -> None:
        self.upto_index = 0
        self.count = np.zeros(self._names, dtype=np.int64)
        self.total_ns = np.zeros(self._names, dtype=np.float64)
        self._pairs: dict[tuple[int, int], int] = {}
        self._best: dict[int, tuple[int, int]] = {}  # code -> (grid, launches)

    def advance(self, end: int) -> KernelTally:
        """Take in the kernels starting before ``end`` (ns); returns self."""
        k = int(np.searchsorted(self._start, end, side="left"))
        if k < self.upto_index or self.upto_index < 0:
            self._reset()
        lo, self.upto_index = self.upto_index, k
        if k > lo:
            self._take(self._code[lo:k], self._dur[lo:k], self._grid[lo:k])
        return self

    def _take(self, code: np.ndarray, dur: np.ndarray, grid: np.ndarray) -> None:
        self.count += np.bincount(code, minlength=self._names)
        self.total_ns += np.bincount(code, dur, minlength=self._names)
        pairs, counts = np.unique(np.stack([code, grid]), axis=1, return_counts=True)
        for c, g, n in zip(pairs[0].tolist(), pairs[1].tolist(), counts.tolist(), strict=True):
            now = self._pairs.get((c, g), 0) + n
            self._pairs[(c, g)] = now
            best = self._best.get(c)
            # a pair's count only grows, so the mode changes only to the pair just counted
            if best is None or now > best[1] or (now == best[1] and g < best[0]):
                self._best[c] = (g, now)

    def mode_grid(self, codes: np.ndarray) -> np.ndarray:
        """The most common grid of each name code in ``codes`` so far (−1: none launched)."""
        best = self._best
        return np.array([best[c][0] if c in best else -1 for c in codes.tolist()], dtype=np.int64)


def group_kernels(
    part: np.ndarray,
    step: np.ndarray,
    start: np.ndarray,
    code: np.ndarray,
    dur: np.ndarray,
    grid: np.ndarray,
    names: int,
) -> dict[tuple[int, int], KernelTally]:
    """One :class:`KernelTally` per (participant, step) of the given kernels (int64 columns)."""
    order = np.lexsort((start, step, part))
    part, step, start = part[order], step[order], start[order]
    code, dur, grid = code[order], dur[order], grid[order]
    if not part.size:
        return {}
    cut = np.flatnonzero(np.r_[True, (part[1:] != part[:-1]) | (step[1:] != step[:-1]), True])
    return {
        (int(part[lo]), int(step[lo])): KernelTally(
            start[lo:hi], code[lo:hi], dur[lo:hi], grid[lo:hi], names
        )
        for lo, hi in zip(cut[:-1], cut[1:], strict=True)
    }
