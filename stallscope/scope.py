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


def launched_in_steps(gpu: str = "g") -> str:
    """SQL condition on the ``gpu`` row alias: the operation is in the step scope's work.

    True when the trace has no step ranges (whole-trace behaviour), or when the
    operation's launch call (runtime/driver, matched by correlation id; its
    ``start_ns`` if there is none) starts inside a step: the same
    operations that :func:`step_scope` spans. A semi-join, so each GPU row is
    counted once even if several launch records share its correlation id.
    """
    launch = f"""coalesce((SELECT min(h.start_ns) FROM host h WHERE h.trace_id = {gpu}.trace_id
      AND h.correlation = {gpu}.correlation AND h.kind IN ('runtime', 'driver')), {gpu}.start_ns)"""
    return f"""(NOT EXISTS (SELECT 1 FROM ranges r WHERE r.trace_id = {gpu}.trace_id AND r.kind = 'step')
  OR EXISTS (SELECT 1 FROM ranges r WHERE r.trace_id = {gpu}.trace_id AND r.kind = 'step'
    AND {launch} >= r.start_ns AND {launch} < r.end_ns))"""
