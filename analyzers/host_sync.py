"""``host_sync``: the host blocked until the GPU caught up, and the GPU time it cost.

A *blocking call* is a runtime or driver API call that returns only once the
GPU has finished earlier work (version suffixes such as ``_v2`` and the
per-thread ``_ptds``/``_ptsz`` variants are stripped first):

* synchronize calls: ``cuda``/``hip`` ``{Device,Stream,Event,Ctx,Thread}Synchronize``
  and the driver's ``cu{Ctx,Stream,Event}Synchronize``. ``cudaStreamWaitEvent``
  is a GPU-side wait and does not block the host;
* blocking copies: synchronous copy calls (``cudaMemcpy``, ``cudaMemcpy2D``…,
  ``cuMemcpy*``, ``hipMemcpy*``, ``hipMemcpyWithStream``; not ``*Async``) except
  host-to-device copies of at most 64 KiB (they return once staged, nsys's
  rule), and asynchronous device-to-host copies into pageable memory (they
  return only when the copy is done).

Per device, an idle gap (a hole in the union of kernels, memcpys and memsets)
is *drained* by a blocking call when the GPU ran out of work while the call
was in progress and started again only after it returned. Its cost is the
counterfactual gain of not blocking: min(gap length, host time blocked from
the draining call's start to the end of the gap); a gap that was already
open when a call began costs the part of it spent inside blocking calls.
See docs/analyzers/host_sync.md.

:func:`op_stack` and :func:`enclosing_ops` (the innermost and outermost CPU
operator around a host call, by time on the same thread) are shared with the
``memcpy`` and ``hotspots`` analyzers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from stallscope import intervals
from stallscope.analyzers.base import AnalyzerResult, AnalyzerSpec, Finding, Metric, Threshold
from stallscope.jobdata import JobData

THRESHOLDS = (
    Threshold(
        "share_pct_low",
        3.0,
        "%",
        "GPU time lost to blocking calls, % of the span, for a low-severity finding",
        maximum=100,
    ),
    Threshold(
        "share_pct_medium",
        10.0,
        "%",
        "GPU time lost to blocking calls, % of the span, for a medium-severity finding",
        maximum=100,
    ),
    Threshold(
        "share_pct_high",
        25.0,
        "%",
        "GPU time lost to blocking calls, % of the span, for a high-severity finding",
        maximum=100,
    ),
    Threshold(
        "share_pct_critical",
        50.0,
        "%",
        "GPU time lost to blocking calls, % of the span, for a critical finding",
        maximum=100,
    ),
    Threshold(
        "min_impact_ms",
        1.0,
        "ms",
        "GPU time lost below which the share thresholds do not apply",
    ),
    Threshold(
        "per_step_low",
        3.0,
        "calls",
        "blocking calls per ProfilerStep that make at least a low-severity finding",
        minimum=1,
    ),
)
MAX_WINDOWS = 20
TOP_CALL_SITES = 10
SMALL_H2D_BYTES = 64 * 1024  # synchronous H2D copies up to this size return once staged
DRAIN_TOLERANCE_NS = 2_000  # CPU/GPU timestamps of old traces are whole microseconds

# API names after stripping version / per-thread-stream suffixes.
API_SQL = "regexp_replace(n.name, '(_v[0-9]+)?(_ptds|_ptsz)?(_v[0-9]+)?$', '')"
SYNC_API_REGEX = (
    r"^(cuda|hip)(Device|Stream|Event|Ctx|Thread)Synchronize$|^cu(Ctx|Stream|Event)Synchronize$"
)
COPY_API_REGEX = r"^(cuda|hip|cu)Memcpy"

_CALLS_SQL = f"""
WITH calls AS (
  SELECT h.pid, h.tid, h.start_ns, h.end_ns, h.correlation, {API_SQL} AS api
  FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
  WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver')
    AND regexp_matches({API_SQL}, '{SYNC_API_REGEX}|{COPY_API_REGEX}')
), g AS (
  SELECT correlation, min(device) AS device, sum(bytes) AS bytes,
         any_value(copy_kind) AS copy_kind, any_value(src_kind) AS src_kind,
         any_value(dst_kind) AS dst_kind, any_value(sync_kind) AS sync_kind
  FROM gpu WHERE trace_id = $trace AND kind IN ('memcpy', 'sync')
    AND correlation IN (SELECT correlation FROM calls)
  GROUP BY correlation
)
SELECT c.pid, c.tid, c.start_ns, c.end_ns, c.api,
       regexp_matches(c.api, '{SYNC_API_REGEX}') AS is_sync,
       coalesce(g.device, -1) AS device, coalesce(g.bytes, 0) AS bytes,
       coalesce(g.copy_kind, '') AS copy_kind, coalesce(g.dst_kind, '') AS dst_kind,
       coalesce(g.sync_kind, '') AS sync_kind
FROM calls c LEFT JOIN g ON g.correlation = c.correlation
WHERE regexp_matches(c.api, '{SYNC_API_REGEX}')
   OR (NOT contains(c.api, 'Async')
       AND NOT (g.copy_kind = 'HtoD' AND coalesce(g.bytes, 0) <= {SMALL_H2D_BYTES}))
   OR (contains(c.api, 'Async') AND g.copy_kind = 'DtoH' AND g.dst_kind = 'pageable')
ORDER BY c.start_ns
"""


def blocking_calls(job: JobData, trace_id: str) -> dict[str, np.ndarray]:
    """The trace's blocking calls (columns of _CALLS_SQL), each with its device.

    The device comes from the GPU row with the call's correlation id (the
    ``cuda_sync`` event or the copy); otherwise from the last launch the same
    thread made before the call; otherwise the trace's busiest device.
    """
    key = ("host_sync.calls", trace_id)
    if key in job.cache:
        return job.cache[key]
    cols = job.con.execute(_CALLS_SQL, {"trace": trace_id}).fetchnumpy()
    cols = {k: np.asarray(v) for k, v in cols.items()}
    missing = cols["device"] < 0
    if missing.any():
        cols["device"][missing] = _fallback_devices(job, trace_id, cols, missing)
    job.cache[key] = cols
    return cols


def _fallback_devices(job: JobData, trace_id: str, cols: dict, missing: np.ndarray) -> np.ndarray:
    busiest = job.sql(
        "SELECT device FROM gpu WHERE trace_id = ? AND kind IN ('kernel', 'memcpy', 'memset') "
        "GROUP BY device ORDER BY sum(end_ns - start_ns) DESC, device LIMIT 1",
        [trace_id],
    ).fetchone()
    default = int(busiest[0]) if busiest else -1
    devices = job.sql(
        "SELECT count(DISTINCT device) FROM gpu WHERE trace_id = ? AND kind IN ('kernel', 'memcpy', 'memset')",
        [trace_id],
    ).fetchone()[0]
    if devices <= 1:
        return np.full(int(missing.sum()), default, dtype=cols["device"].dtype)
    idx = np.flatnonzero(missing)
    queries = pa.table(
        {"i": idx, "pid": cols["pid"][idx], "tid": cols["tid"][idx], "ts": cols["start_ns"][idx]}
    )
    con = job.con
    con.register("_host_sync_queries", queries)
    found = con.execute(
        """WITH launches AS (
              SELECT h.pid, h.tid, h.start_ns, g.device
              FROM host h JOIN (SELECT DISTINCT correlation, device FROM gpu
                                WHERE trace_id = $trace AND kind IN ('kernel', 'memcpy', 'memset')) g
                ON g.correlation = h.correlation
              WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver'))
            SELECT q.i, coalesce(l.device, $default) AS device
            FROM _host_sync_queries q ASOF LEFT JOIN launches l
              ON q.pid = l.pid AND q.tid = l.tid AND q.ts >= l.start_ns
            ORDER BY q.i""",
        {"trace": trace_id, "default": default},
    ).fetchnumpy()
    con.unregister("_host_sync_queries")
    return np.asarray(found["device"], dtype=cols["device"].dtype)


# --- the CPU operators around host calls (shared with memcpy and hotspots) ---


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
    pairs = np.stack([np.asarray(pid, dtype=np.int64), np.asarray(tid, dtype=np.int64)], axis=1)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    block_of_uniq = np.array([stack.threads.get((int(p), int(t)), -1) for p, t in uniq], dtype=np.int64)
    block = block_of_uniq[inverse.reshape(-1)]
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


def name_lookup(job: JobData, trace_id: str, name_ids: np.ndarray) -> dict[int, str]:
    ids = sorted({int(i) for i in np.unique(name_ids) if i >= 0})
    if not ids:
        return {}
    rows = job.sql(
        "SELECT name_id, name FROM names WHERE trace_id = ? AND list_contains(?, name_id)",
        [trace_id, ids],
    ).fetchall()
    return {int(i): str(n) for i, n in rows}


def call_sites(
    job: JobData, trace_id: str, pid, tid, start, end, api: np.ndarray
) -> np.ndarray:
    """One label per call: ``outer > inner`` operator names, or the API outside any operator."""
    stack = op_stack(job, trace_id)
    inner, outer = enclosing_ops(stack, pid, tid, start, end)
    has = inner >= 0
    ids = np.concatenate([stack.name_id[inner[has]], stack.name_id[outer[has]]])
    names = name_lookup(job, trace_id, ids)
    labels = np.array([f"{a} (outside any operator)" for a in api.tolist()], dtype=object)
    for i in np.flatnonzero(has).tolist():
        inner_name = names.get(int(stack.name_id[inner[i]]), "?")
        outer_name = names.get(int(stack.name_id[outer[i]]), "?")
        labels[i] = inner_name if inner[i] == outer[i] else f"{outer_name} > {inner_name}"
    return labels


# --- the analyzer ---


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        _trace(job, result, ref.trace_id, rank, params)
    return result


def _trace(job: JobData, result: AnalyzerResult, trace: str, rank: int, params: dict) -> None:
    calls = blocking_calls(job, trace)
    durations = calls["end_ns"] - calls["start_ns"]
    result.metrics.append(Metric(trace, rank, None, "sync_ns", int(durations.sum()), "ns"))
    result.metrics.append(Metric(trace, rank, None, "sync_count", int(durations.size), "count"))
    devices = job.numpy(
        "SELECT DISTINCT device FROM gpu WHERE trace_id = ? AND kind IN ('kernel', 'memcpy', 'memset') ORDER BY 1",
        [trace],
    )["device"]
    if durations.size == 0:
        for device in devices.tolist():
            result.metrics.append(Metric(trace, rank, int(device), "sync_lost_ns", 0, "ns"))
        return
    steps = job.numpy(
        "SELECT start_ns, end_ns FROM ranges WHERE trace_id = ? AND kind = 'step'", [trace]
    )
    step_union = intervals.union(steps["start_ns"], steps["end_ns"])
    in_step = _covered(calls["start_ns"], step_union)
    sites = call_sites(
        job, trace, calls["pid"], calls["tid"], calls["start_ns"], calls["end_ns"], calls["api"]
    )
    context = {
        "item_calls": int(
            job.sql(
                """SELECT count(*) FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
                   WHERE h.trace_id = ? AND h.kind = 'cpu_op' AND n.name = 'aten::_local_scalar_dense'""",
                [trace],
            ).fetchone()[0]
        ),
        "gpu_sync_events": _gpu_sync_events(job, trace),
        "steps": int(steps["start_ns"].size),
    }
    for device in devices.tolist():
        mask = calls["device"] == device
        sub = {k: v[mask] for k, v in calls.items()}
        lost = _device(
            job, result, trace, rank, int(device), sub, in_step[mask], sites[mask], context, params
        )
        result.metrics.append(Metric(trace, rank, int(device), "sync_lost_ns", lost, "ns"))


def _gpu_sync_events(job: JobData, trace: str) -> dict:
    rows = job.sql(
        "SELECT sync_kind, count(*), sum(end_ns - start_ns) FROM gpu WHERE trace_id = ? AND kind = 'sync' "
        "GROUP BY 1 ORDER BY 1",
        [trace],
    ).fetchall()
    return {str(k): {"count": int(c), "ns": int(s)} for k, c, s in rows}


@dataclass
class GapCost:
    lost: np.ndarray  # per gap, ns
    owner: np.ndarray  # per gap, index of the call it is charged to (-1: none)
    window_start: np.ndarray


def gap_costs(
    gap_s: np.ndarray, gap_e: np.ndarray, call_s: np.ndarray, call_e: np.ndarray
) -> GapCost:
    """GPU time lost in each idle gap to the blocking calls [call_s, call_e) (sorted by start).

    A gap drained by a call (the call contains the gap's start, within
    DRAIN_TOLERANCE_NS, and returned before the gap ended) loses
    min(gap, host time blocked in calls from the draining call's start to the
    gap's end). Any other gap loses the time it overlaps blocking calls.
    """
    n = gap_s.size
    lost = np.zeros(n, dtype=np.int64)
    owner = np.full(n, -1, dtype=np.int64)
    window_start = gap_s.copy()
    if n == 0 or call_s.size == 0:
        return GapCost(lost, owner, window_start)
    u_s, u_e = intervals.union(call_s, call_e)
    cum = np.concatenate([[0], np.cumsum(u_e - u_s)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(u_s, t, side="right") - 1
        inside = np.where(i >= 0, np.minimum(t, u_e[np.maximum(i, 0)]) - u_s[np.maximum(i, 0)], 0)
        return cum[np.maximum(i, 0)] * (i >= 0) + inside

    run_max = np.maximum.accumulate(call_e)
    holder = np.maximum.accumulate(np.where(call_e == run_max, np.arange(call_s.size), 0))
    j = np.searchsorted(call_s, gap_s, side="right") - 1
    valid = j >= 0
    jj = np.maximum(j, 0)
    h = holder[jj]
    drained = (
        valid
        & (run_max[jj] + DRAIN_TOLERANCE_NS > gap_s)
        & (call_e[h] <= gap_e + DRAIN_TOLERANCE_NS)
    )
    inside_call = valid & (run_max[jj] > gap_e) & ~drained
    x = np.where(drained, call_s[h], gap_s)
    blocked = covered_before(gap_e) - covered_before(x)
    lost = np.where(drained, np.minimum(gap_e - gap_s, blocked), blocked)
    lost[inside_call] = 0
    owner = np.where(drained, h, -1)
    first = np.searchsorted(call_s, gap_s, side="left")
    other = ~drained & ~inside_call & (lost > 0) & (first < call_s.size)
    owner[other] = first[other]
    window_start = np.where(drained, x, gap_s)
    return GapCost(lost.astype(np.int64), owner, window_start)


def _device(
    job: JobData,
    result: AnalyzerResult,
    trace: str,
    rank: int,
    device: int,
    calls: dict,
    in_step: np.ndarray,
    sites: np.ndarray,
    context: dict,
    params: dict,
) -> int:
    busy = job.numpy(
        "SELECT start_ns, end_ns FROM gpu WHERE trace_id = ? AND device = ? AND kind IN ('kernel', 'memcpy', 'memset')",
        [trace, device],
    )
    if busy["start_ns"].size == 0 or calls["start_ns"].size == 0:
        return 0
    span = int(busy["end_ns"].max() - busy["start_ns"].min())
    gap_s, gap_e = intervals.gaps(busy["start_ns"], busy["end_ns"])
    order = np.argsort(calls["start_ns"], kind="stable")
    calls = {k: v[order] for k, v in calls.items()}
    in_step, sites = in_step[order], sites[order]
    cost = gap_costs(gap_s, gap_e, calls["start_ns"], calls["end_ns"])
    lost = int(cost.lost.sum())
    share = 100.0 * lost / span if span else 0.0
    steps = context["steps"]
    per_step = float(in_step.sum()) / steps if steps else 0.0
    severity = _severity(share, lost, per_step, params)
    if severity is None:
        return lost
    durations = calls["end_ns"] - calls["start_ns"]
    evidence = {
        "share_of_span_pct": round(share, 3),
        "span_ns": span,
        "blocking_calls": int(durations.size),
        "blocked_ns": int(durations.sum()),
        "calls_in_steps": int(in_step.sum()),
        "steps": steps,
        "calls_per_step": round(per_step, 2),
        "gaps_charged": int((cost.lost > 0).sum()),
        "by_api": _by_api(calls, durations),
        "d2h_blocking_copies": _d2h(calls),
        "item_calls": context["item_calls"],
        "gpu_sync_events": context["gpu_sync_events"],
        "call_sites": _by_site(sites, durations, cost),
    }
    top = np.argsort(-cost.lost, kind="stable")[:MAX_WINDOWS]
    top = top[cost.lost[top] > 0]
    windows = [[int(cost.window_start[i]), int(gap_e[i])] for i in top]
    per_step_text = f" ({per_step:.1f} per step)" if steps else ""
    worst = evidence["call_sites"][0]["call_site"] if evidence["call_sites"] else "?"
    apis = ", ".join(f"{a['api']} ×{a['count']}" for a in evidence["by_api"][:4])
    result.findings.append(
        Finding(
            analyzer="host_sync",
            trace=trace,
            rank=rank,
            device=device,
            severity=severity,
            title=(
                f"GPU {device}: {durations.size} host syncs{per_step_text} cost "
                f"{lost / 1e6:.2f} ms of GPU time ({share:.1f}% of the span)"
            ),
            detail=(
                f"The host blocked {durations.sum() / 1e6:.2f} ms in {durations.size} synchronizing calls "
                f"({apis}); "
                f"{evidence['gaps_charged']} GPU idle gaps followed them, {lost / 1e6:.3f} ms charged to the syncs. "
                f"Top call site: {worst}. {context['item_calls']} scalar reads (aten::_local_scalar_dense) in the trace."
            ),
            recommendation=_recommendation(evidence["call_sites"], calls),
            impact_ns=lost,
            evidence=evidence,
            windows=windows,
        )
    )
    return lost


def _severity(share: float, lost: int, per_step: float, params: dict) -> str | None:
    if lost >= params["min_impact_ms"] * 1e6:
        for level in ("critical", "high", "medium", "low"):
            if share >= params[f"share_pct_{level}"]:
                return level
    if per_step >= params["per_step_low"]:
        return "low"
    return None


def _by_api(calls: dict, durations: np.ndarray) -> list[dict]:
    apis, inverse = np.unique(calls["api"].astype(str), return_inverse=True)
    counts = np.bincount(inverse, minlength=apis.size)
    blocked = np.bincount(inverse, weights=durations, minlength=apis.size)
    order = np.argsort(-blocked, kind="stable")
    return [
        {"api": str(apis[i]), "count": int(counts[i]), "blocked_ns": int(blocked[i])} for i in order
    ]


def _d2h(calls: dict) -> dict:
    mask = ~calls["is_sync"] & (calls["copy_kind"] == "DtoH")
    return {"count": int(mask.sum()), "bytes": int(calls["bytes"][mask].sum())}


def _by_site(sites: np.ndarray, durations: np.ndarray, cost: GapCost) -> list[dict]:
    labels, inverse = np.unique(sites.astype(str), return_inverse=True)
    counts = np.bincount(inverse, minlength=labels.size)
    blocked = np.bincount(inverse, weights=durations, minlength=labels.size)
    charged = cost.owner >= 0
    lost = np.bincount(
        inverse[cost.owner[charged]], weights=cost.lost[charged], minlength=labels.size
    )
    order = np.lexsort((-blocked, -lost))[:TOP_CALL_SITES]
    return [
        {
            "call_site": str(labels[i]),
            "count": int(counts[i]),
            "blocked_ns": int(blocked[i]),
            "gpu_lost_ns": int(lost[i]),
        }
        for i in order
    ]


_FIXES = (
    (
        r"aten::(item|_local_scalar_dense|is_nonzero|equal)",
        "Read GPU scalars less often: keep running losses and metrics on the GPU and call .item() "
        "every N steps, and avoid Python control flow on GPU tensors (if t:, int(t), float(t)).",
    ),
    (
        r"aten::(to|_to_copy|copy_|cpu)",
        "Make copies asynchronous: .to(device, non_blocking=True) from pinned memory "
        "(DataLoader(pin_memory=True) or tensor.pin_memory()); for GPU-to-CPU results copy into a "
        "pinned buffer with non_blocking=True and wait on a CUDA event only when the value is needed.",
    ),
    (
        r"aten::(nonzero|masked_select|unique|_unique2|index|repeat_interleave|bincount)",
        "Avoid data-dependent shapes in the step (nonzero, boolean-mask indexing, unique, "
        "repeat_interleave without output_size): each must read a size back from the GPU.",
    ),
    (
        r"outside any operator",
        "Remove torch.cuda.synchronize() / stream.synchronize() / event.synchronize() from the "
        "training loop; keep them only around code you time, or use CUDA events to time.",
    ),
)


def _recommendation(sites: list[dict], calls: dict) -> str:
    import re

    fixes: list[str] = []
    for site in sites[:5]:
        for pattern, text in _FIXES:
            if re.search(pattern, site["call_site"]) and text not in fixes:
                fixes.append(text)
    if ((calls["copy_kind"] == "DtoH") & (calls["dst_kind"] == "pageable")).any():
        text = _FIXES[1][1]
        if text not in fixes:
            fixes.append(text)
    if not fixes:
        fixes.append(
            "Remove host synchronization from the step: each one drains the GPU queue, so the "
            "host's next launches run with the GPU idle."
        )
    return " ".join(fixes)


def _covered(points: np.ndarray, union: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    starts, ends = union
    if starts.size == 0:
        return np.zeros(points.size, dtype=bool)
    idx = np.searchsorted(starts, points, side="right") - 1
    ok = idx >= 0
    result = np.zeros(points.size, dtype=bool)
    result[ok] = points[ok] < ends[idx[ok]]
    return result


SPEC = AnalyzerSpec(
    id="host_sync",
    title="Host synchronization",
    description=(
        "Synchronize calls and blocking copies (.item(), torch.cuda.synchronize, pageable "
        "device-to-host copies): count, host time blocked, and the GPU idle time they cause."
    ),
    run=run,
    thresholds=THRESHOLDS,
)
