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

_SCOPE_SQL = """
SELECT min(g.start_ns), max(g.end_ns)
FROM gpu g
LEFT JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation AND h.kind IN ('runtime', 'driver')
JOIN ranges r ON r.trace_id = g.trace_id AND r.kind = 'step'
  AND coalesce(h.start_ns, g.start_ns) >= r.start_ns AND coalesce(h.start_ns, g.start_ns) < r.end_ns
WHERE g.trace_id = ? AND g.device = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
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
        row = job.sql(_SCOPE_SQL, [trace_id, device]).fetchone()
        if row is None or row[0] is None:
            job.cache[key] = None
        else:
            job.cache[key] = _widen(job, trace_id, device, int(row[0]), int(row[1]))
    return job.cache[key]


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
