"""The part of a trace that analyzers measure: the steps, when there are any.

Whole-run captures (Nsight Systems without a capture range, long Kineto
captures) include start-up — model loading, weight broadcasts, warm-up —
that would swamp the steady state. When a trace has step ranges
(``ProfilerStep#N``, NVTX ``step N``), the scope of a device is from the
first start to the last end of the GPU operations *launched inside a step*
(correlation id -> launch call -> step; an operation with no launch record
counts where it starts), widened to the GPU idle time the steps hold at
their edges: from the first step's start on the host (or the end of earlier
GPU work, if later) when the GPU was idle there, and to the last step's end
(or the start of later GPU work) when the GPU finished before it. A step
that waits for data before its first kernel is idle GPU time of that step.
Without step ranges the scope is the whole trace (``None``). Times are int64 ns.
"""

from __future__ import annotations

import numpy as np

from stallscope import intervals
from stallscope.jobdata import JobData

# The device's GPU operations with the start of their launch call (their own start without
# one); a NULL start or end becomes a bound that min/max pass over, as SQL's min/max skip NULL.
_NO_START, _NO_END = np.iinfo(np.int64).max, np.iinfo(np.int64).min
_LAUNCHED_SQL = f"""
SELECT coalesce(h.start_ns, g.start_ns) AS launch_ns,
       coalesce(g.start_ns, {_NO_START}) AS start_ns, coalesce(g.end_ns, {_NO_END}) AS end_ns
FROM gpu g
LEFT JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation AND h.kind IN ('runtime', 'driver')
WHERE g.trace_id = ? AND g.device = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
  AND coalesce(h.start_ns, g.start_ns) IS NOT NULL
"""
_STEPS_SQL = """
SELECT start_ns, end_ns FROM ranges
WHERE trace_id = ? AND kind = 'step' AND start_ns IS NOT NULL AND end_ns IS NOT NULL
"""


_EDGES_SQL = """
SELECT (SELECT min(start_ns) FROM ranges WHERE trace_id = $t AND kind = 'step'),
       (SELECT max(end_ns) FROM ranges WHERE trace_id = $t AND kind = 'step'),
       (SELECT max(end_ns) FROM gpu WHERE trace_id = $t AND device = $d
          AND kind IN ('kernel', 'memcpy', 'memset') AND start_ns < $lo),
       (SELECT min(start_ns) FROM gpu WHERE trace_id = $t AND device = $d
          AND kind IN ('kernel', 'memcpy', 'memset') AND end_ns > $hi)
"""


def step_scope(job: JobData, trace_id: str, device: int) -> tuple[int, int] | None:
    """[start, end) of the device's steps (see the module docstring), or None (cached)."""
    key = ("scope", trace_id, device)
    if key not in job.cache:
        work = launched_in_steps(job, trace_id, device)
        job.cache[key] = None if work is None else _widen(job, trace_id, device, *work)
    return job.cache[key]


def launched_in_steps(job: JobData, trace_id: str, device: int) -> tuple[int, int | None] | None:
    """First start and last end (ns) of the device's GPU operations launched inside a step
    range (by their launch call's start; without one, their own start), None if none was
    (NULL times skipped, as SQL's min and max do).

    The step ranges are merged once and each launch looked up in them by a sorted search:
    a join of the operations with the ranges on the trace costs operations x steps, the
    square of the trace's length when every step is kept.
    """
    steps = job.numpy(_STEPS_SQL, [trace_id])
    if steps["start_ns"].size == 0:
        return None
    ops = job.numpy(_LAUNCHED_SQL, [trace_id, device])
    inside = in_ranges(steps["start_ns"], steps["end_ns"], ops["launch_ns"])
    lo = int(ops["start_ns"][inside].min()) if inside.any() else _NO_START
    hi = int(ops["end_ns"][inside].max()) if inside.any() else _NO_END
    return None if lo == _NO_START else (lo, None if hi == _NO_END else hi)


def in_ranges(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Whether each point (ns) lies in at least one of the ranges ``[starts, ends)`` (any
    ranges: overlapping, empty or reversed ones too)."""
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    keep = ends > starts  # an empty or reversed range holds no point
    points = np.asarray(points, dtype=np.int64)
    return intervals.covers(intervals.union(starts[keep], ends[keep]), points)


def _widen(job: JobData, trace_id: str, device: int, lo: int, hi: int) -> tuple[int, int]:
    """``[lo, hi)`` (the in-step GPU work) widened to the idle time at the steps' edges."""
    first_step, last_step, before, after = job.sql(
        _EDGES_SQL, {"t": trace_id, "d": device, "lo": lo, "hi": hi}
    ).fetchone()
    start = max(first_step, before) if before is not None else first_step
    end = min(last_step, after) if after is not None else last_step
    return min(lo, int(start)), max(hi, int(end))


def span_of(starts: np.ndarray, ends: np.ndarray, scope: tuple[int, int] | None) -> tuple[int, int]:
    """The measured span: the scope, or without steps first start to last end (non-empty input)."""
    return scope if scope is not None else (int(starts.min()), int(ends.max()))


def idle_gaps(
    starts: np.ndarray, ends: np.ndarray, scope: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray]:
    """(gap starts, gap ends): the holes in the union of ``[starts, ends)`` over the span,
    including the idle time at the span's edges (before the first and after the last
    activity, which only a widened step scope has)."""
    gap_s, gap_e = intervals.gaps(starts, ends)
    if starts.size == 0:
        return gap_s, gap_e
    lo, hi = span_of(starts, ends, scope)
    first, last = int(starts.min()), int(ends.max())
    head = ([lo], [first]) if lo < first else ([], [])
    tail = ([last], [hi]) if hi > last else ([], [])
    return (
        np.concatenate(
            [np.asarray(head[0], dtype=np.int64), gap_s, np.asarray(tail[0], dtype=np.int64)]
        ),
        np.concatenate(
            [np.asarray(head[1], dtype=np.int64), gap_e, np.asarray(tail[1], dtype=np.int64)]
        ),
    )


def in_scope(starts: np.ndarray, ends: np.ndarray, scope: tuple[int, int] | None):
    """(keep, starts, ends): which intervals touch the scope, and the kept ones clipped to it."""
    if scope is None:
        return np.ones(starts.size, dtype=bool), starts, ends
    lo, hi = scope
    keep = (ends > lo) & (starts < hi)
    return keep, np.clip(starts[keep], lo, hi), np.clip(ends[keep], lo, hi)


def scope_sql(job: JobData, trace_id: str, alias: str = "g") -> str:
    """SQL condition on a ``gpu`` row: it starts inside its device's step scope.

    The scope is :func:`step_scope`'s (first start to last end of the GPU work
    launched inside steps), the same window the idle and utilization figures
    use; set-up before the first step and tear-down after the last are out.
    ``TRUE`` for devices of a trace without step ranges. Literal bounds, one
    ``CASE`` arm per device: a cheap filter, whatever the trace's size. Cached per JobData.
    """
    key = ("scope_sql", trace_id, alias)
    if key not in job.cache:
        job.cache[key] = _scope_sql(job, trace_id, alias)
    return job.cache[key]


def _scope_sql(job: JobData, trace_id: str, alias: str) -> str:
    devices = sorted({d for d, _ in job.device_kinds(trace_id) if d is not None})
    arms = []
    for device in devices:
        scope = step_scope(job, trace_id, int(device))
        if scope is not None:
            start = f"{alias}.start_ns"
            arms.append(f"WHEN {int(device)} THEN {start} >= {scope[0]} AND {start} < {scope[1]}")
    return f"(CASE {alias}.device {' '.join(arms)} ELSE TRUE END)" if arms else "TRUE"
