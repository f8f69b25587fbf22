"""The CPU operators around host calls: call sites for host_sync, memcpy and hotspots.

:func:`op_stack` builds a trace's per-thread sorted table of CPU operators
(cached on the job); :func:`enclosing_ops` finds the innermost and outermost
operator around each host call by time on the same thread; :func:`call_sites`
labels calls ``outer > inner`` (or ``<API> (outside any operator)``).
Times are int64 ns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallscope.jobdata import JobData

# A trace's launch calls by correlation id: when the host launched each GPU operation (the
# first runtime/driver call carrying its correlation). A CTE for queries bound with $trace.
LAUNCH_CTE = """launch AS (
  SELECT correlation, min(start_ns) AS launch_ns FROM host
  WHERE trace_id = $trace AND kind IN ('runtime', 'driver') AND correlation IS NOT NULL GROUP BY 1
)"""
# The same over every trace of a job at once (keyed by trace and correlation id): for set-wise
# queries, where a query per trace would bind every rank's files.
JOB_LAUNCH_CTE = """launch AS (
  SELECT trace_id, correlation, min(start_ns) AS launch_ns FROM host
  WHERE kind IN ('runtime', 'driver') AND correlation IS NOT NULL GROUP BY 1, 2
)"""


@dataclass
class OpStack:
    """A trace's CPU operators (``cpu_op``, without ``ProfilerStep#N``), per thread.

    Sorted by thread, then start, then longest first, so a parent precedes
    its children. ``adj`` maps starts onto one increasing axis (thread blocks
    laid end to end), which lets one ``searchsorted`` serve every thread.
    """

    threads: dict[tuple[int, int], int]
    lo: np.ndarray
    shift: np.ndarray  # per thread block: start - adj
    block_max: np.ndarray  # per thread block: largest adj value
    adj: np.ndarray
    end: np.ndarray
    name_id: np.ndarray
    top_before: np.ndarray  # index of the last top-level operator at or before each one


def op_stack(job: JobData, trace_id: str) -> OpStack:
    key = ("host_sync.op_stack", trace_id)
    if key in job.cache:
        return job.cache[key]
    cols = job.numpy(
        """SELECT h.pid, h.tid, h.start_ns, h.end_ns, h.name_id
           FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
           WHERE h.trace_id = ? AND h.kind = 'cpu_op' AND NOT starts_with(n.name, 'ProfilerStep#')
           ORDER BY h.pid, h.tid, h.start_ns, h.end_ns DESC""",
        [trace_id],
    )
    pid, tid = np.asarray(cols["pid"]), np.asarray(cols["tid"])
    start, end = np.asarray(cols["start_ns"]), np.asarray(cols["end_ns"])
    n = start.size
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        stack = OpStack({}, empty, empty, empty, empty, empty, empty, empty)
        job.cache[key] = stack
        return stack
    change = np.ones(n, dtype=bool)
    change[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    lo = np.flatnonzero(change)
    counts = np.diff(np.append(lo, n))
    block_min = start[lo]
    block_end = np.maximum.reduceat(end, lo)
    width = block_end - block_min + 1
    base = np.concatenate([[0], np.cumsum(width)[:-1]])
    shift = block_min - base
    per_op_shift = np.repeat(shift, counts)
    adj = start - per_op_shift
    adj_end = end - per_op_shift
    prev_max = np.empty(n, dtype=np.int64)
    prev_max[0] = np.iinfo(np.int64).min
    prev_max[1:] = np.maximum.accumulate(adj_end)[:-1]
    is_top = change | (adj >= prev_max)
    top_before = np.maximum.accumulate(np.where(is_top, np.arange(n), -1))
    threads = {(int(pid[i]), int(tid[i])): b for b, i in enumerate(lo.tolist())}
    stack = OpStack(
        threads, lo, shift, base + width - 1, adj, end, np.asarray(cols["name_id"]), top_before
    )
    job.cache[key] = stack
    return stack


MAX_SCAN = 1024


def enclosing_ops(
    stack: OpStack, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Indices into ``stack`` of the innermost and outermost operator enclosing each call.

    -1 where no operator on the call's thread encloses it. The innermost is
    found by walking back from the last operator that started before the
    call; past ``MAX_SCAN`` operators it falls back to the outermost.
    """
    m = np.asarray(start).size
    inner = np.full(m, -1, dtype=np.int64)
    outer = np.full(m, -1, dtype=np.int64)
    if m == 0 or stack.adj.size == 0:
        return inner, outer
    block = _thread_blocks(stack, np.asarray(pid, dtype=np.int64), np.asarray(tid, dtype=np.int64))
    has = block >= 0
    if not has.any():
        return inner, outer
    q = np.flatnonzero(has)
    b = block[q]
    q_adj = np.minimum(np.asarray(start)[q] - stack.shift[b], stack.block_max[b])
    pos = np.searchsorted(stack.adj, q_adj, side="right") - 1
    ok = pos >= stack.lo[b]
    q, pos = q[ok], pos[ok]
    q_end = np.asarray(end)[q]
    top = stack.top_before[pos]
    enclosed = stack.end[top] >= q_end
    q, pos, top, q_end = q[enclosed], pos[enclosed], top[enclosed], q_end[enclosed]
    outer[q] = top
    cur = pos
    for _ in range(MAX_SCAN):
        if q.size == 0:
            break
        hit = stack.end[cur] >= q_end
        inner[q[hit]] = cur[hit]
        keep = ~hit
        q, cur, top, q_end = q[keep], cur[keep] - 1, top[keep], q_end[keep]
    if q.size:
        inner[q] = top
    return inner, outer


def _thread_blocks(stack: OpStack, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """The OpStack thread block of each (pid, tid), -1 when the thread has no operators.

    Sorting groups equal threads into runs, so the Python lookup runs once per
    distinct thread, not per call.
    """
    if pid.size and (pid == pid[0]).all() and (tid == tid[0]).all():  # one thread: no sort
        return np.full(pid.size, stack.threads.get((int(pid[0]), int(tid[0])), -1), dtype=np.int64)
    order = np.lexsort((tid, pid))
    p, t = pid[order], tid[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
    starts = np.flatnonzero(new)
    run_block = np.array(
        [stack.threads.get((int(p[i]), int(t[i])), -1) for i in starts], dtype=np.int64
    )
    block = np.empty(order.size, dtype=np.int64)
    block[order] = np.repeat(run_block, np.diff(np.append(starts, order.size)))
    return block


def name_lookup(job: JobData, trace_id: str, name_ids: np.ndarray) -> dict[int, str]:
    """name_id -> name of the ``name_ids`` (negative ones, "none", skipped) found in the trace's
    ``names``; ids it lacks are absent. The trace's names are read once per JobData (one
    query for every analyzer's look-ups: a trace interns each distinct name once)."""
    ids = {int(i) for i in np.unique(name_ids) if i >= 0}
    if not ids:
        return {}
    names = trace_names(job, trace_id)
    return {i: names[i] for i in sorted(ids) if i in names}


def trace_names(job: JobData, trace_id: str) -> dict[int, str]:
    """name_id -> name (``str``) of every row of the trace's ``names`` (cached per JobData)."""
    key = ("host_ops.names", trace_id)
    if key not in job.cache:
        rows = job.sql("SELECT name_id, name FROM names WHERE trace_id = ?", [trace_id]).fetchall()
        job.cache[key] = {int(i): str(n) for i, n in rows}
    return job.cache[key]


def call_sites(job: JobData, trace_id: str, pid, tid, start, end, api: np.ndarray) -> np.ndarray:
    """One label per call: ``outer > inner`` operator names, or the API outside any operator.

    Labels are built once per distinct (outer, inner) pair or API name, not per call.
    """
    stack = op_stack(job, trace_id)
    inner, outer = enclosing_ops(stack, pid, tid, start, end)
    has = inner >= 0
    inner_id = np.where(has, stack.name_id[np.maximum(inner, 0)] if stack.name_id.size else -1, -1)
    outer_id = np.where(has, stack.name_id[np.maximum(outer, 0)] if stack.name_id.size else -1, -1)
    names = name_lookup(job, trace_id, np.concatenate([inner_id, outer_id]))
    labels = np.empty(inner.size, dtype=object)
    if (~has).any():
        apis, api_inverse = np.unique(np.asarray(api)[~has].astype(str), return_inverse=True)
        api_labels = np.array([f"{a} (outside any operator)" for a in apis], dtype=object)
        labels[~has] = api_labels[api_inverse.reshape(-1)]
    if has.any():
        key = (inner_id[has].astype(np.int64) << 32) | outer_id[has].astype(np.int64)
        keys, key_inverse = np.unique(key, return_inverse=True)
        pair_labels = []
        for k in keys.tolist():
            inner_name = names.get(k >> 32, "?")
            outer_name = names.get(k & 0xFFFFFFFF, "?")
            same = inner_name == outer_name
            pair_labels.append(inner_name if same else f"{outer_name} > {inner_name}")
        labels[has] = np.array(pair_labels, dtype=object)[key_inverse.reshape(-1)]
    return labels
