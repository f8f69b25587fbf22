"""The part of a trace that analyzers measure: the steps, when there are any.

Whole-run captures (Nsight Systems without a capture range, long Kineto
captures) include start-up — model loading, weight broadcasts, warm-up —
that would swamp the steady state. When a trace has step ranges
(``ProfilerStep#N``, NVTX ``step N``), the scope of a device is from the
first start to the last end of the GPU operations *launched inside a step*
(correlation id -> launch call -> step; an operation with no launch record
counts where it starts). Without step ranges the scope is the whole trace
(``None``). Times are int64 ns.
"""

from __future__ import annotations

import numpy as np

from stallscope.jobdata import JobData

_SCOPE_SQL = """
SELECT min(g.start_ns), max(g.end_ns)
FROM gpu g
LEFT JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation AND h.kind IN ('runtime', 'driver')
JOIN ranges r ON r.trace_id = g.trace_id AND r.kind = 'step'
  AND coalesce(h.start_ns, g.start_ns) >= r.start_ns AND coalesce(h.start_ns, g.start_ns) < r.end_ns
WHERE g.trace_id = ? AND g.device = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
"""


def step_scope(job: JobData, trace_id: str, device: int) -> tuple[int, int] | None:
    """[start, end) of the device's in-step GPU work, or None for the whole trace (cached)."""
    key = ("scope", trace_id, device)
    if key not in job.cache:
        row = job.sql(_SCOPE_SQL, [trace_id, device]).fetchone()
        job.cache[key] = None if row is None or row[0] is None else (int(row[0]), int(row[1]))
    return job.cache[key]


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
    ``CASE`` arm per device: a cheap filter, whatever the trace's size.
    """
    devices = job.sql(
        "SELECT DISTINCT device FROM gpu WHERE trace_id = ? AND device IS NOT NULL", [trace_id]
    ).fetchall()
    arms = []
    for (device,) in devices:
        scope = step_scope(job, trace_id, int(device))
        if scope is not None:
            start = f"{alias}.start_ns"
            arms.append(f"WHEN {int(device)} THEN {start} >= {scope[0]} AND {start} < {scope[1]}")
    return f"(CASE {alias}.device {' '.join(arms)} ELSE TRUE END)" if arms else "TRUE"
