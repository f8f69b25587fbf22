"""Why a GPU sat idle: attribute every idle nanosecond to what its host did.

For one trace and device, :func:`attribute_idle` finds the idle gaps (holes
in the union of the device's kernels, memcpys and memsets) and labels each
nanosecond of them with the first cause, in priority order, whose host
activity covers it on the threads that launch work onto that device:

1. ``dataloader`` — DataLoader iteration or user ranges that load data;
2. ``host_sync``  — synchronize calls and blocking device-to-host copies as
   :mod:`stallscope.sync_calls` defines them (the ``host_sync`` analyzer's
   definition), and the operators that read a GPU scalar (``.item()``,
   ``aten::_local_scalar_dense``);
3. ``memcpy``     — the host blocked in a synchronous or pageable copy call;
4. ``launch``     — the host busy issuing GPU work (launch API calls and the
   operators that made them): the queue is starved, a CPU-bound issue;
5. ``cpu``        — other host work (operators, Python) on those threads;
6. ``unknown``    — nothing recorded on those threads.

An ``unknown`` sliver of at most :data:`SLIVER_NS` next to ``launch`` or
``cpu`` time in the same gap is the Python between recorded operators, which
profilers do not record: it becomes ``launch`` if its gap has launch time,
else ``cpu`` (:func:`_absorb_host_slivers`). In a gap drained by a sync (it opened while
the host was blocked in one), the ``launch``/``cpu`` time after the sync, up
to the first time of another cause, is ``host_sync`` too
(:func:`_charge_drain_to_sync`).

Before that, a gap whose next operation had already been handed to the GPU
when the gap began (its launch call had returned) is ``queued`` as a whole:
the host was not what the GPU waited for (cross-stream dependencies, device
launch latency). Of the ``launch`` time, the part spent inside graph-launch
calls is kept apart (``graph_launch_per_gap``): under a profiler, CUPTI makes
a graph launch cost about a microsecond per node.

The result is columnar (numpy): one row per gap with the nanoseconds of each
cause. Documented in docs/analyzers/gpu_idle.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallscope import intervals
from stallscope.jobdata import JobData
from stallscope.report_types import IDLE_CAUSES
from stallscope.scope import idle_gaps, in_scope, span_of, step_scope
from stallscope.sync_calls import COPY_API_REGEX, SYNC_API_REGEX, api_name_sql

CAUSES = IDLE_CAUSES  # declared with the report types (the idle_<cause>_ns columns)
HOST_CAUSES = CAUSES[:5]  # labelled from host intervals, in priority order

DATALOADER_REGEX = (
    r"(?i)(dataloader|enumerate\(data|_next_data|data[_ ]?load|load[_ ]?data|get[_ ]?batch|fetch[_ ]?batch"
    r"|next[_ ]?batch|collate|prefetch)"
)
SYNC_OP_REGEX = r"^aten::(item|_local_scalar_dense|is_nonzero|equal)$"
MEMCPY_API_REGEX = COPY_API_REGEX
GRAPH_LAUNCH_REGEX = r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)"
STEP_RANGE_REGEX = r"^ProfilerStep#"
RANGE_CODE = 5  # _CLASSIFY_SQL's code for a user range (record_function, NVTX) that is not a step
LAUNCH_API_REGEX = (
    r"^(cudaLaunchKernel|cudaLaunchKernelExC|cudaLaunchCooperativeKernel|cuLaunchKernel|cuLaunchKernelEx"
    r"|cuLaunchCooperativeKernel|cudaGraphLaunch|cuGraphLaunch|hipLaunchKernel|hipExtLaunchKernel"
    r"|hipModuleLaunchKernel|hipExtModuleLaunchKernel|hipGraphLaunch)"
)


def mostly_range_only(range_only_ns: int, cpu_ns: int) -> bool:
    """Whether ``cpu`` idle time is named by the user range that covered it rather than as
    host work: at least half of it (``cpu_ns`` > 0) was labelled ``cpu`` only because a
    record_function/NVTX range was open with nothing recorded under it (``range_only_per_gap``)."""
    return cpu_ns > 0 and 2 * range_only_ns >= cpu_ns


@dataclass
class Segments:
    """The idle time as labelled pieces, sorted by start: piece ``i`` is
    ``[start[i], start[i] + length[i])`` of gap ``gap[i]``, attributed to
    ``CAUSES[label[i]]``. No piece crosses a step range's edge, so each lies
    in one host step (or none). Times are int64 ns."""

    start: np.ndarray
    length: np.ndarray
    label: np.ndarray
    gap: np.ndarray


@dataclass
class IdleAttribution:
    """Idle gaps of one device and the nanoseconds of each cause in each gap.

    ``per_gap[i, c]`` is the time of gap ``i`` attributed to ``CAUSES[c]``;
    rows sum to the gap's length. Times are int64 ns.
    """

    span_start: int
    span_end: int
    gap_starts: np.ndarray
    gap_ends: np.ndarray
    per_gap: np.ndarray
    threads: list[tuple[int, int]]
    graph_launch_per_gap: np.ndarray | None = (
        None  # of the ``launch`` time: inside graph-launch calls
    )
    segments: Segments | None = None  # the labelled pieces the per-gap sums are made of
    range_only_per_gap: np.ndarray | None = (
        None  # of the ``cpu`` time: inside a user range with nothing recorded under it
    )

    @property
    def totals(self) -> dict[str, int]:
        sums = (
            self.per_gap.sum(axis=0) if self.per_gap.size else np.zeros(len(CAUSES), dtype=np.int64)
        )
        return {cause: int(sums[i]) for i, cause in enumerate(CAUSES)}

    @property
    def dominant(self) -> np.ndarray:
        """Index into CAUSES of each gap's largest cause."""
        return self.per_gap.argmax(axis=1) if self.per_gap.size else np.zeros(0, dtype=np.int64)


def attribute_idle(job: JobData, trace_id: str, device: int) -> IdleAttribution:
    """Idle attribution of one device (computed once per JobData, then cached)."""
    key = ("idle", trace_id, device)
    if key not in job.cache:
        job.cache[key] = _attribute(job, trace_id, device)
    return job.cache[key]


def device_busy(job: JobData, trace_id: str, device: int) -> dict[str, np.ndarray]:
    """``start_ns``, ``end_ns`` of the device's kernels, copies and memsets, in no set order
    (cached: idle attribution, host_sync and memcpy read them)."""
    key = ("device_busy", trace_id, device)
    if key not in job.cache:
        job.cache[key] = job.numpy(
            "SELECT start_ns, end_ns FROM gpu WHERE trace_id = ? AND device = ? "
            "AND kind IN ('kernel', 'memcpy', 'memset')",
            [trace_id, device],
        )
    return job.cache[key]


def _attribute(job: JobData, trace_id: str, device: int) -> IdleAttribution:
    busy = device_busy(job, trace_id, device)
    scope = step_scope(job, trace_id, device)
    _, starts, ends = in_scope(busy["start_ns"], busy["end_ns"], scope)
    if starts.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return IdleAttribution(0, 0, empty, empty, np.zeros((0, len(CAUSES)), dtype=np.int64), [])
    gap_s, gap_e = idle_gaps(starts, ends, scope)
    threads = launch_threads(job, trace_id, device)
    cause_unions, graph_union, user_ranges = _host_unions(job, trace_id, threads)
    steps = job.steps(trace_id)
    step_edges = np.unique(np.concatenate([steps["start_ns"], steps["end_ns"]]))
    per_gap, graph_per_gap, segments, range_only = _label_gaps(
        gap_s,
        gap_e,
        cause_unions,
        graph_union,
        np.asarray(step_edges, dtype=np.int64),
        user_ranges,
    )
    queued = _queued_gaps(job, trace_id, device, gap_s, gap_e)
    per_gap[queued] = 0
    per_gap[queued, CAUSES.index("queued")] = (gap_e - gap_s)[queued]
    graph_per_gap[queued] = 0
    range_only[queued] = 0
    segments.label[queued[segments.gap]] = CAUSES.index("queued")
    span_start, span_end = span_of(starts, ends, scope)
    return IdleAttribution(
        span_start, span_end, gap_s, gap_e, per_gap, threads, graph_per_gap, segments, range_only
    )


def _queued_gaps(
    job: JobData, trace_id: str, device: int, gap_s: np.ndarray, gap_e: np.ndarray
) -> np.ndarray:
    """Gaps whose next GPU operation was already handed over when the gap began."""
    ops = job.numpy(
        f"""SELECT g.start_ns, min(h.end_ns) AS launch_end
           FROM gpu g
           JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation AND h.kind IN ('runtime', 'driver')
           JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
           WHERE g.trace_id = ? AND g.device = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
             AND regexp_matches(n.name, '{LAUNCH_API_REGEX}|{MEMCPY_API_REGEX}|Memset')
           GROUP BY g.start_ns ORDER BY g.start_ns""",
        [trace_id, device],
    )
    queued = np.zeros(gap_s.size, dtype=bool)
    if ops["start_ns"].size == 0 or gap_s.size == 0:
        return queued
    idx = np.searchsorted(ops["start_ns"], gap_e, side="left")
    found = idx < ops["start_ns"].size
    found[found] &= ops["start_ns"][idx[found]] == gap_e[found]
    hit = idx[found]
    handed_over = ops["launch_end"][hit] <= gap_s[found]
    queued[np.flatnonzero(found)[handed_over]] = True
    return queued


def launch_threads(job: JobData, trace_id: str, device: int) -> list[tuple[int, int]]:
    """(pid, tid) of the host threads whose API calls put work on ``device``."""
    rows = job.sql(
        """SELECT DISTINCT h.pid, h.tid FROM host h
           JOIN gpu g ON g.trace_id = h.trace_id AND g.correlation = h.correlation
           WHERE h.trace_id = ? AND g.device = ? AND h.kind IN ('runtime', 'driver')""",
        [trace_id, device],
    ).fetchall()
    return [(int(p), int(t)) for p, t in rows]


_CLASSIFY_SQL = f"""
WITH nm AS (
  SELECT name_id, name, regexp_replace(name, '_v[0-9]+$', '') AS api, {api_name_sql("name")} AS bare_api
  FROM names WHERE trace_id = $trace
), flags AS (
  SELECT name_id,
    regexp_matches(name, '{DATALOADER_REGEX}') AS dl,
    regexp_matches(bare_api, '{SYNC_API_REGEX}') AS sync_api,
    regexp_matches(name, '{SYNC_OP_REGEX}') AS sync_op,
    regexp_matches(api, '{MEMCPY_API_REGEX}') AS memcpy_api,
    regexp_matches(api, 'Async') AS is_async,
    regexp_matches(api, '{LAUNCH_API_REGEX}') AS launch_api,
    regexp_matches(api, '{GRAPH_LAUNCH_REGEX}') AS graph_api
  FROM nm
), copies AS (
  SELECT correlation,
    bool_or(copy_kind = 'DtoH') AS d2h, bool_or(copy_kind IS DISTINCT FROM 'DtoH') AS other,
    bool_or(dst_kind = 'pageable') AS to_pageable, bool_or(src_kind = 'pageable') AS from_pageable
  FROM gpu WHERE trace_id = $trace AND kind = 'memcpy' GROUP BY correlation
), structural AS (  -- ranges that enclose steps, not work: ProfilerStep#N, NVTX steps, a loop-wide range
  SELECT name_id FROM nm WHERE regexp_matches(name, '{STEP_RANGE_REGEX}')
  UNION SELECT name_id FROM ranges WHERE trace_id = $trace AND kind = 'step'
  UNION SELECT a.name_id FROM host a JOIN ranges s ON s.trace_id = a.trace_id AND s.kind = 'step'
    AND a.start_ns <= s.start_ns AND a.end_ns >= s.end_ns
  WHERE a.trace_id = $trace AND a.kind = 'annotation'
), launch_ext AS (
  SELECT DISTINCT h.external_id FROM host h JOIN flags f USING (name_id)
  WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver') AND f.launch_api AND h.external_id IS NOT NULL
)
SELECT h.start_ns, h.end_ns,
  CASE
    WHEN f.dl THEN 0
    WHEN (api_call AND f.sync_api) OR (h.kind = 'cpu_op' AND f.sync_op)
      OR (api_call AND f.memcpy_api AND coalesce(c.d2h, false) AND (NOT f.is_async OR coalesce(c.to_pageable, false))) THEN 1
    WHEN api_call AND f.memcpy_api AND coalesce(c.other, false) AND (NOT f.is_async OR coalesce(c.from_pageable, false)) THEN 2
    WHEN (api_call AND f.launch_api) OR (h.kind = 'cpu_op' AND h.external_id IN (SELECT external_id FROM launch_ext)) THEN 3
    WHEN h.kind IN ('cpu_op', 'python', 'runtime', 'driver', 'overhead') THEN 4
    WHEN h.kind = 'annotation' AND h.name_id NOT IN (SELECT name_id FROM structural) THEN {RANGE_CODE}
    ELSE -1
  END AS cause,
  api_call AND f.graph_api AS graph
FROM (SELECT *, kind IN ('runtime', 'driver') AS api_call FROM host WHERE trace_id = $trace) h
JOIN flags f USING (name_id)
LEFT JOIN copies c ON c.correlation = h.correlation
WHERE (h.pid, h.tid) IN (SELECT pid, tid FROM _threads)
   OR (h.kind = 'annotation' AND h.pid IN (SELECT pid FROM _threads))
"""


def _host_unions(job: JobData, trace_id: str, threads: list[tuple[int, int]]):
    """Unions of the host intervals of each host cause (in HOST_CAUSES order), of graph
    launches, and of user ranges (record_function / NVTX ranges that enclose no whole step,
    on any thread of the launching processes).

    Each host row gets the first cause it shows, in priority order: the
    labelled result is the same as with one union per cause, since a row's
    lower-priority causes are covered by its higher one anyway.
    """
    con = job.con
    make = "CREATE OR REPLACE TEMP TABLE _threads AS SELECT pid::BIGINT AS pid, tid::BIGINT AS tid"
    if threads:  # one statement (integer literals), not a table and an insert per thread
        rows = ", ".join(f"({int(pid)}, {int(tid)})" for pid, tid in threads)
        con.execute(f"{make} FROM (VALUES {rows}) AS t(pid, tid)")
    else:  # no launch correlation recorded: every host thread counts
        con.execute(
            f"{make} FROM (SELECT DISTINCT pid, tid FROM host WHERE trace_id = ?)", [trace_id]
        )
    cols = con.execute(_CLASSIFY_SQL, {"trace": trace_id}).fetchnumpy()
    starts, ends = cols["start_ns"], cols["end_ns"]
    cause = np.asarray(cols["cause"])
    graph = np.asarray(cols["graph"], dtype=bool)
    unions = [
        intervals.union(starts[cause == code], ends[cause == code])
        for code in range(len(HOST_CAUSES))
    ]
    user_ranges = intervals.union(starts[cause == RANGE_CODE], ends[cause == RANGE_CODE])
    return unions, intervals.union(starts[graph], ends[graph]), user_ranges


def _label_gaps(
    gap_s: np.ndarray,
    gap_e: np.ndarray,
    unions: list[tuple[np.ndarray, np.ndarray]],
    graph_union: tuple[np.ndarray, np.ndarray],
    extra_edges: np.ndarray | None = None,
    user_ranges: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, Segments, np.ndarray]:
    """Per-gap ns of each cause (priority order), by a sweep over all boundaries.

    Also returns, per gap, the ``launch`` time spent inside graph-launch
    calls, the labelled segments, and the ``cpu`` time labelled so only because
    a user range covered it (nothing recorded under the range: a sleep, I/O or
    CPU work, the trace cannot tell which). ``extra_edges`` (step range edges) only
    split segments; they change no label. ``user_ranges``: time still
    ``unknown`` after the sliver rule but inside a user range is ``cpu``
    (host work the profiler did not record, in a range the program marked).
    """
    per_gap = np.zeros((gap_s.size, len(CAUSES)), dtype=np.int64)
    graph = np.zeros(gap_s.size, dtype=np.int64)
    if gap_s.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return per_gap, graph, Segments(empty, empty, empty, empty), graph.copy()
    lo, hi = gap_s[0], gap_e[-1]
    edges = [gap_s, gap_e, *graph_union] + [e for u in unions for e in u]
    points = np.sort(
        np.clip(np.concatenate(edges), lo, hi)
    )  # not np.unique: its hash path is ~20x slower here
    points = points[np.concatenate(([True], points[1:] != points[:-1]))]
    seg_start, seg_len = points[:-1], np.diff(points)
    in_gap = intervals.covers((gap_s, gap_e), seg_start)
    seg_start, seg_len = seg_start[in_gap], seg_len[in_gap]
    label = np.full(seg_start.size, CAUSES.index("unknown"), dtype=np.int64)
    unlabeled = np.ones(seg_start.size, dtype=bool)
    for index, union in enumerate(unions):
        hit = unlabeled & intervals.covers(union, seg_start)
        label[hit] = index
        unlabeled &= ~hit
    gap_index = np.searchsorted(gap_s, seg_start, side="right") - 1
    label = _absorb_host_slivers(label, gap_index, seg_len)
    label = _charge_drain_to_sync(label, gap_index, seg_len)
    seg = Segments(seg_start, seg_len, label, gap_index)
    cuts = [e for e in (extra_edges, *(user_ranges or ())) if e is not None and e.size]
    if cuts:  # after the sliver and drain rules, which read lengths: cuts must not shorten
        seg = _split_at(seg, np.concatenate(cuts))
    range_only = np.zeros(gap_s.size, dtype=np.int64)
    if user_ranges is not None:
        in_range = (seg.label == CAUSES.index("unknown")) & intervals.covers(user_ranges, seg.start)
        seg.label[in_range] = CAUSES.index("cpu")
        np.add.at(range_only, seg.gap[in_range], seg.length[in_range])
    np.add.at(per_gap, (seg.gap, seg.label), seg.length)
    in_graph = (seg.label == CAUSES.index("launch")) & intervals.covers(graph_union, seg.start)
    np.add.at(graph, seg.gap[in_graph], seg.length[in_graph])
    return per_gap, graph, seg, range_only


def _split_at(seg: Segments, edges: np.ndarray) -> Segments:
    """The same segments cut at ``edges`` (sorted or not), labels kept.

    Cutting happens after labelling: the sliver and drain rules read segment
    lengths, and a step edge must not turn a long stretch into short ones.
    """
    if seg.start.size == 0:
        return seg
    ends = seg.start + seg.length
    owner = np.searchsorted(seg.start, edges, side="right") - 1
    ok = owner >= 0
    inside = np.zeros(edges.size, dtype=bool)
    inside[ok] = (edges[ok] > seg.start[owner[ok]]) & (edges[ok] < ends[owner[ok]])
    if not inside.any():
        return seg
    points = np.concatenate([seg.start, edges[inside]])
    which = np.concatenate([np.arange(seg.start.size), owner[inside]])
    order = np.lexsort((which, points))
    points, which = points[order], which[order]
    nxt = np.concatenate([points[1:], [np.iinfo(np.int64).max]])
    length = np.minimum(nxt, ends[which]) - points
    return Segments(points, length, seg.label[which], seg.gap[which])


DRAIN_ABSORBS = (CAUSES.index("launch"), CAUSES.index("cpu"))
SLIVER_NS = 50_000  # unrecorded host time up to this (Python between ops) counts as host work
LATENCY_SLIVER_NS = 10_000  # at a gap's end: up to a kernel's launch latency after the host's work


def _absorb_host_slivers(
    label: np.ndarray, gap_index: np.ndarray, seg_len: np.ndarray
) -> np.ndarray:
    """Relabel short ``unknown`` segments that touch ``launch`` or ``cpu`` time in their gap.

    ``label``, ``gap_index`` and ``seg_len`` (ns) describe the gap segments,
    sorted by start. An ``unknown`` segment of at most SLIVER_NS whose
    previous or next segment in the same gap is ``launch`` or ``cpu`` is the
    interpreter between two recorded operations (argument parsing, Python
    code, the profiler's own bookkeeping). It becomes ``launch`` when its gap
    has any ``launch`` time (in a launch-bound loop it is part of the cost of
    issuing each kernel, even beside a tiny non-launch call such as
    ``cuKernelGetName``), else ``cpu``. A sliver that ends its gap (after
    the host's last recorded work) counts only up to LATENCY_SLIVER_NS, a
    kernel's launch latency. Longer stretches (a sleep, I/O, a blocking call)
    and slivers with no recorded host work beside them stay ``unknown``.
    Returns a new array.
    """
    unknown, launch, cpu = (CAUSES.index(c) for c in ("unknown", "launch", "cpu"))
    out = label.copy()
    if label.size < 2:
        return out
    host = (label == launch) | (label == cpu)
    same_prev = np.concatenate(([False], gap_index[1:] == gap_index[:-1]))
    same_next = np.concatenate((same_prev[1:], [False]))
    touches = (same_prev & np.concatenate(([False], host[:-1]))) | (
        same_next & np.concatenate((host[1:], [False]))
    )
    # At the gap's end, after the host's last recorded work, only a device
    # launch latency's worth: later, the work was handed over and the GPU was late.
    last_in_gap = ~same_next
    limit = np.where(last_in_gap, LATENCY_SLIVER_NS, SLIVER_NS)
    sliver = (label == unknown) & (seg_len <= limit) & touches
    gap_has_launch = np.zeros(int(gap_index.max()) + 1, dtype=bool)
    gap_has_launch[gap_index[label == launch]] = True
    out[sliver] = np.where(gap_has_launch[gap_index[sliver]], launch, cpu)
    return out


def _charge_drain_to_sync(
    label: np.ndarray, gap_index: np.ndarray, seg_len: np.ndarray
) -> np.ndarray:
    """Relabel as ``host_sync`` the launch/cpu time a sync exposed in the gap it drained.

    ``label`` is each gap segment's cause (index into CAUSES), segments sorted
    by start; ``gap_index`` and ``seg_len`` (ns) each segment's gap and length. A gap whose first segment
    is ``host_sync`` opened while the host was blocked in a sync: the sync
    drained the GPU queue. The ``launch`` and ``cpu`` segments that follow
    (and ``unknown`` slivers of at most SLIVER_NS: Python between
    recorded operators), up to the first segment of any other cause, are host
    work that would have overlapped GPU work without the sync, so they become
    ``host_sync``. From a ``dataloader``, ``memcpy`` or longer ``unknown``
    segment on (a sleep, the GIL: its own fault), the gap keeps its labels. Returns a new array; each segment
    still has exactly one cause.
    """
    if label.size == 0:
        return label
    sync = CAUSES.index("host_sync")
    first = np.concatenate(([True], gap_index[1:] != gap_index[:-1]))
    first_idx = np.maximum.accumulate(np.where(first, np.arange(label.size), 0))
    drained = label[first_idx] == sync
    sliver = (label == CAUSES.index("unknown")) & (seg_len <= SLIVER_NS)
    absorbs = np.isin(label, DRAIN_ABSORBS) | sliver
    breaker = (~absorbs & (label != sync)).astype(np.int64)
    cum = np.cumsum(breaker)
    broken = cum - (cum[first_idx] - breaker[first_idx]) > 0
    out = label.copy()
    out[drained & absorbs & ~broken] = sync
    return out


def top_host_ops(
    job: JobData,
    trace_id: str,
    threads: list[tuple[int, int]],
    windows: list[list[int]],
    limit: int = 5,
):
    """Host operations that overlap ``windows`` most: [{name, kind, overlap_ns, count}]."""
    if not windows:
        return []
    con = job.con
    con.execute("CREATE OR REPLACE TEMP TABLE _windows (ws BIGINT, we BIGINT)")
    con.executemany("INSERT INTO _windows VALUES (?, ?)", [tuple(w) for w in windows])
    con.execute("CREATE OR REPLACE TEMP TABLE _threads (pid BIGINT, tid BIGINT)")
    if threads:
        con.executemany("INSERT INTO _threads VALUES (?, ?)", threads)
    else:
        con.execute(
            "INSERT INTO _threads SELECT DISTINCT pid, tid FROM host WHERE trace_id = ?", [trace_id]
        )
    rows = con.execute(
        """SELECT n.name, h.kind, sum(least(h.end_ns, w.we) - greatest(h.start_ns, w.ws)) AS overlap, count(*)
           FROM host h JOIN _windows w ON h.start_ns < w.we AND h.end_ns > w.ws
           JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
           WHERE h.trace_id = ? AND (h.pid, h.tid) IN (SELECT pid, tid FROM _threads)
             AND NOT regexp_matches(n.name, '^ProfilerStep#')
           GROUP BY 1, 2 ORDER BY overlap DESC, 1 LIMIT ?""",
        [trace_id, limit],
    ).fetchall()
    return [{"name": r[0], "kind": r[1], "overlap_ns": int(r[2]), "count": int(r[3])} for r in rows]


def host_ranges(
    job: JobData,
    trace_id: str,
    threads: list[tuple[int, int]],
    windows: list[list[int]],
    limit: int = 3,
) -> list[dict]:
    """The user ranges (``record_function``, NVTX) the host was in during ``windows``.

    Ranges on any thread of the launching processes count (a sampler or a
    scheduler may run beside the launching thread); ranges that enclose whole
    steps (``ProfilerStep#N``, a loop-wide range) say nothing and are left
    out. Returns [{name, overlap_ns, windows, thread}]: ``overlap_ns`` is the
    time the range covers inside the windows (nested ranges each count),
    ``windows`` in how many windows it appears.
    """
    if not windows:
        return []
    con = job.con
    con.execute("CREATE OR REPLACE TEMP TABLE _windows (ws BIGINT, we BIGINT)")
    con.executemany("INSERT INTO _windows VALUES (?, ?)", [tuple(w) for w in windows])
    pids = sorted({p for p, _ in threads}) or [
        int(r[0])
        for r in job.sql("SELECT DISTINCT pid FROM host WHERE trace_id = ?", [trace_id]).fetchall()
    ]
    rows = con.execute(
        f"""WITH spans AS (
              SELECT h.name_id, h.tid, w.ws,
                     least(h.end_ns, w.we) - greatest(h.start_ns, w.ws) AS overlap
              FROM host h JOIN _windows w ON h.start_ns < w.we AND h.end_ns > w.ws
              WHERE h.trace_id = $trace AND h.kind = 'annotation' AND list_contains($pids, h.pid)
                AND NOT EXISTS (SELECT 1 FROM ranges s WHERE s.trace_id = $trace AND s.kind = 'step'
                                AND h.start_ns <= s.start_ns AND h.end_ns >= s.end_ns))
           SELECT n.name, sum(overlap), count(DISTINCT ws), min(tid)
           FROM spans JOIN names n ON n.trace_id = $trace AND n.name_id = spans.name_id
           WHERE NOT regexp_matches(n.name, '{STEP_RANGE_REGEX}')
           GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT $limit""",
        {"trace": trace_id, "pids": pids, "limit": limit},
    ).fetchall()
    return [
        {"name": r[0], "overlap_ns": int(r[1]), "windows": int(r[2]), "tid": int(r[3])}
        for r in rows
    ]
