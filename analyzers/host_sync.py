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
the draining call's start to the end of the gap), with time inside
graph-launch calls (inflated by CUPTI) taken off the gap first, and capped
at the gap's idle time that gpu_idle attributes to ``host_sync``
(:func:`sync_idle_per_gap`: each idle ns has one cause). Gaps already
open when a call began cost nothing here. See docs/analyzers/host_sync.md.

The definition of a blocking call is :mod:`stallscope.sync_calls` (shared with
the idle attribution); call sites come from :mod:`stallscope.host_ops` (shared
with the ``memcpy`` and ``hotspots`` analyzers).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa

from stallscope import intervals
from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
    graded_severity,
    graded_thresholds,
)
from stallscope.host_ops import call_sites
from stallscope.idle import CAUSES, attribute_idle, device_busy
from stallscope.jobdata import JobData
from stallscope.sync_calls import API_SQL, COPY_API_REGEX, SMALL_H2D_BYTES, SYNC_API_REGEX

THRESHOLDS = (
    *graded_thresholds(
        "GPU time lost to blocking calls, % of the span",
        "GPU time lost below which the share thresholds do not apply",
    ),
    Threshold(
        "per_step_low",
        3.0,
        "calls",
        "blocking calls per step that, with per_step_share_pct, make a low-severity finding",
        minimum=1,
    ),
    Threshold(
        "per_step_share_pct",
        1.0,
        "%",
        "GPU time lost, % of the span, that makes a low-severity finding when per_step_low is reached",
        maximum=100,
    ),
)
MAX_WINDOWS = 20
TOP_CALL_SITES = 10
DRAIN_TOLERANCE_NS = 2_000  # CPU/GPU timestamps of old traces are whole microseconds


_CALLS_SQL = f"""
WITH apis AS (  -- per distinct name, not per event
  SELECT name_id, api FROM (
    SELECT n.name_id, {API_SQL} AS api FROM names n WHERE n.trace_id = $trace)
  WHERE regexp_matches(api, '{SYNC_API_REGEX}|{COPY_API_REGEX}')
), calls AS (
  SELECT h.pid, h.tid, h.start_ns, h.end_ns, h.correlation, a.api
  FROM host h JOIN apis a ON a.name_id = h.name_id
  WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver')
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
    by_busy = job.sql(  # busiest first; the devices with GPU work counted from the same rows
        "SELECT device FROM gpu WHERE trace_id = ? AND kind IN ('kernel', 'memcpy', 'memset') "
        "GROUP BY device ORDER BY sum(end_ns - start_ns) DESC, device",
        [trace_id],
    ).fetchall()
    default = int(by_busy[0][0]) if by_busy else -1
    devices = sum(device is not None for (device,) in by_busy)
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


# --- the analyzer ---


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        _trace(job, result, ref.trace_id, rank, params)
    return result


def _trace(job: JobData, result: AnalyzerResult, trace: str, rank: int, params: dict) -> None:
    syncs = measure_trace(job, Where(trace, rank))
    result.metrics.extend(metrics(syncs))
    for device in syncs.devices.values():
        finding = speak(device, params) if device else None
        if finding:
            result.findings.append(finding)


class TraceSyncs(msgspec.Struct, kw_only=True):
    """One trace's blocking calls (:func:`measure_trace`): totals, and each device's cost."""

    where: Where  # device None: the trace as a whole
    calls: int
    blocked_ns: int  # host time inside the calls
    devices: dict[int, DeviceSyncs | None]  # every device with GPU work; None: nothing to charge


def measure_trace(job: JobData, where: Where) -> TraceSyncs:
    """The blocking calls of trace ``where.trace`` and, per device, what they cost."""
    trace = where.trace
    calls = blocking_calls(job, trace)
    durations = calls["end_ns"] - calls["start_ns"]
    devices = np.asarray(job.devices(trace, ("kernel", "memcpy", "memset")), dtype=np.int64)
    out = TraceSyncs(
        where=where,
        calls=int(durations.size),
        blocked_ns=int(durations.sum()),
        devices=dict.fromkeys(devices.tolist()),
    )
    if durations.size == 0:
        return out
    steps = job.steps(trace)
    step_union = intervals.union(steps["start_ns"], steps["end_ns"])
    in_step = intervals.covers(step_union, calls["start_ns"])
    sites = call_sites(
        job, trace, calls["pid"], calls["tid"], calls["start_ns"], calls["end_ns"], calls["api"]
    )
    context = SyncContext(
        item_calls=int(
            job.sql(
                """SELECT count(*) FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
                   WHERE h.trace_id = ? AND h.kind = 'cpu_op' AND n.name = 'aten::_local_scalar_dense'""",
                [trace],
            ).fetchall()[0][0]
        ),
        gpu_sync_events=_gpu_sync_events(job, trace),
        steps=int(steps["start_ns"].size),
        window=(int(steps["start_ns"].min()), int(steps["end_ns"].max()))
        if steps["start_ns"].size
        else None,
        graph_launches=graph_launches(job, trace),
    )
    for device in out.devices:
        mask = calls["device"] == device
        sub = {k: v[mask] for k, v in calls.items()}
        on = Where(trace, where.rank, int(device))
        out.devices[device] = measure_device(job, on, sub, in_step[mask], sites[mask], context)
    return out


def metrics(t: TraceSyncs) -> list[Metric]:
    """``sync_ns`` and ``sync_count`` of the trace, ``sync_lost_ns`` of each device."""
    trace, rank = t.where.trace, t.where.rank
    return [
        Metric(trace, rank, None, "sync_ns", t.blocked_ns, "ns"),
        Metric(trace, rank, None, "sync_count", t.calls, "count"),
        *(
            Metric(trace, rank, int(device), "sync_lost_ns", m.lost_ns if m else 0, "ns")
            for device, m in t.devices.items()
        ),
    ]


class SyncContext(msgspec.Struct, kw_only=True):
    """What one trace holds around its blocking calls (the same for each of its devices)."""

    item_calls: int  # aten::_local_scalar_dense operators (.item() and friends)
    gpu_sync_events: dict[str, dict]  # sync kind -> {count, ns} of the GPU's sync events
    steps: int  # ProfilerStep ranges
    window: tuple[int, int] | None  # first step start, last step end; None without steps
    graph_launches: tuple[np.ndarray, np.ndarray]  # union of graph-launch calls (starts, ends)


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
    gap_s: np.ndarray,
    gap_e: np.ndarray,
    call_s: np.ndarray,
    call_e: np.ndarray,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
) -> GapCost:
    """GPU time lost in each idle gap to the blocking calls [call_s, call_e) (sorted by start).

    A gap is *drained* by a call when the call was in progress as the GPU ran
    out of work (it started at or before the gap and ended after the gap's
    start, within DRAIN_TOLERANCE_NS) and the GPU restarted only after the
    call returned. A drained gap loses min(gap length, host time blocked in
    calls from the draining call's start to the gap's end); other gaps lose
    nothing here: a call that starts while the GPU is already idle did not
    empty its queue. Gap time inside ``exclude`` (sorted, disjoint intervals:
    graph-launch calls, which CUPTI inflates) is taken off the gap first.
    """
    n = gap_s.size
    lost = np.zeros(n, dtype=np.int64)
    owner = np.full(n, -1, dtype=np.int64)
    if n == 0 or call_s.size == 0:
        return GapCost(lost, owner, gap_s.copy())
    blocked_before = _covered_before(intervals.union(call_s, call_e))

    run_max = np.maximum.accumulate(call_e)
    holder = np.maximum.accumulate(np.where(call_e == run_max, np.arange(call_s.size), 0))
    j = np.searchsorted(call_s, gap_s, side="right") - 1
    k = np.maximum(j, 0)
    h = holder[k]
    drained = (
        (j >= 0)
        & (run_max[k] + DRAIN_TOLERANCE_NS > gap_s)
        & (call_e[h] <= gap_e + DRAIN_TOLERANCE_NS)
    )
    x = np.where(drained, call_s[h], gap_s)
    blocked = blocked_before(gap_e) - blocked_before(x)
    length = gap_e - gap_s
    if exclude is not None and exclude[0].size:
        excluded_before = _covered_before(exclude)
        length = length - (excluded_before(gap_e) - excluded_before(gap_s))
    lost = np.where(drained, np.maximum(np.minimum(length, blocked), 0), 0).astype(np.int64)
    owner = np.where(drained, h, -1)
    return GapCost(lost, owner, x)


def _covered_before(union: tuple[np.ndarray, np.ndarray]):
    """t -> length of the (sorted, disjoint) union that lies before t, vectorised."""
    u_s, u_e = union
    cum = np.concatenate([[0], np.cumsum(u_e - u_s)])

    def before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(u_s, t, side="right") - 1
        k = np.maximum(i, 0)
        if u_s.size == 0:
            return np.zeros(np.asarray(t).size, dtype=np.int64)
        return np.where(i >= 0, cum[k] + np.minimum(t, u_e[k]) - u_s[k], 0)

    return before


def sync_idle_per_gap(
    job: JobData, trace: str, device: int, gap_s: np.ndarray, gap_e: np.ndarray
) -> np.ndarray:
    """Per gap [gap_s, gap_e) (sorted, disjoint; int64 ns): idle ns that gpu_idle gives ``host_sync``.

    The idle attribution (:func:`stallscope.idle.attribute_idle`) labels each
    idle nanosecond with exactly one cause; a blocking call may be charged
    only the ``host_sync`` part, never time the host spent loading data,
    launching or in other work after the call returned. Its gaps are clipped
    to the step scope, so each lies inside one of these gaps (or none).
    """
    attribution = attribute_idle(job, trace, device)
    result = np.zeros(gap_s.size, dtype=np.int64)
    if gap_s.size == 0 or attribution.gap_starts.size == 0:
        return result
    sync_ns = attribution.per_gap[:, CAUSES.index("host_sync")]
    idx = np.searchsorted(gap_s, attribution.gap_starts, side="right") - 1
    inside = (idx >= 0) & (attribution.gap_starts < gap_e[np.maximum(idx, 0)])
    np.add.at(result, idx[inside], sync_ns[inside])
    return result


GRAPH_LAUNCH_REGEX = r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)$"


def graph_launches(job: JobData, trace: str) -> tuple[np.ndarray, np.ndarray]:
    """Union of the trace's CUDA/HIP graph-launch calls (any thread)."""
    cols = job.numpy(
        f"""SELECT h.start_ns, h.end_ns FROM host h
            WHERE h.trace_id = $1 AND h.kind IN ('runtime', 'driver') AND h.name_id IN (
              SELECT n.name_id FROM names n WHERE n.trace_id = $1
                AND regexp_matches({API_SQL}, '{GRAPH_LAUNCH_REGEX}'))""",
        [trace],
    )
    return intervals.union(cols["start_ns"], cols["end_ns"])


class DeviceSyncs(msgspec.Struct, kw_only=True):
    """One device's blocking calls and the GPU time they cost: :func:`measure_device`.

    ns on the trace's clock; ``span_ns`` is the device's first to last GPU
    operation, inside the steps when the trace has them. No prose: :func:`speak`
    writes the finding from it.
    """

    where: Where
    span_ns: int
    lost_ns: int  # GPU idle time charged to the calls (the counterfactual gain)
    calls: int  # blocking calls on the device
    blocked_ns: int  # host time inside them
    calls_in_steps: int
    steps: int
    gaps_charged: int  # idle gaps with a cost
    by_api: list[dict]  # [{api, count, blocked_ns}], most blocked first
    d2h_blocking_copies: dict  # {count, bytes} of blocking device-to-host copies
    pageable_d2h: bool  # a device-to-host copy into pageable memory among the calls
    item_calls: int
    gpu_sync_events: dict[str, dict]
    call_sites: list[dict]  # [{call_site, count, blocked_ns, gpu_lost_ns}], top first
    windows: list[list[int]]  # the costliest gaps, from their draining call's start

    @property
    def share_pct(self) -> float:
        """``lost_ns`` as a share of the span (unrounded)."""
        return 100.0 * self.lost_ns / self.span_ns if self.span_ns else 0.0

    @property
    def per_step(self) -> float:
        """Blocking calls per step (0 without steps)."""
        return float(self.calls_in_steps) / self.steps if self.steps else 0.0


def measure_device(
    job: JobData,
    where: Where,
    calls: dict,
    in_step: np.ndarray,
    sites: np.ndarray,
    context: SyncContext,
) -> DeviceSyncs | None:
    """The cost of one device's blocking ``calls`` (:func:`blocking_calls`' columns for
    that device; ``in_step``: whether each starts in a step; ``sites``: their call
    sites). None when the device ran nothing or made no blocking call."""
    trace, device = where.trace, where.device
    busy = device_busy(job, trace, device)
    if busy["start_ns"].size == 0 or calls["start_ns"].size == 0:
        return None
    first, last = int(busy["start_ns"].min()), int(busy["end_ns"].max())
    gap_s, gap_e = intervals.gaps(busy["start_ns"], busy["end_ns"])
    window = context.window
    if window and min(last, window[1]) > max(first, window[0]):
        # with ProfilerSteps, only the steps count (not setup such as model.to(device))
        first, last = max(first, window[0]), min(last, window[1])
        keep = (gap_s >= first) & (gap_s < last)
        gap_s, gap_e = gap_s[keep], gap_e[keep]
    order = np.argsort(calls["start_ns"], kind="stable")
    calls = {k: v[order] for k, v in calls.items()}
    in_step, sites = in_step[order], sites[order]
    cost = gap_costs(gap_s, gap_e, calls["start_ns"], calls["end_ns"], context.graph_launches)
    cost.lost = np.minimum(cost.lost, sync_idle_per_gap(job, trace, device, gap_s, gap_e))
    durations = calls["end_ns"] - calls["start_ns"]
    top = np.argsort(-cost.lost, kind="stable")[:MAX_WINDOWS]
    top = top[cost.lost[top] > 0]
    return DeviceSyncs(
        where=where,
        span_ns=last - first,
        lost_ns=int(cost.lost.sum()),
        calls=int(durations.size),
        blocked_ns=int(durations.sum()),
        calls_in_steps=int(in_step.sum()),
        steps=context.steps,
        gaps_charged=int((cost.lost > 0).sum()),
        by_api=_by_api(calls, durations),
        d2h_blocking_copies=_d2h(calls),
        pageable_d2h=bool(
            ((calls["copy_kind"] == "DtoH") & (calls["dst_kind"] == "pageable")).any()
        ),
        item_calls=context.item_calls,
        gpu_sync_events=context.gpu_sync_events,
        call_sites=_by_site(sites, durations, cost),
        windows=[[int(cost.window_start[i]), int(gap_e[i])] for i in top],
    )


def speak(m: DeviceSyncs, params: dict) -> Finding | None:
    """The device's finding, or None when the loss is under every threshold."""
    lost, share, per_step, device = m.lost_ns, m.share_pct, m.per_step, m.where.device
    severity = _severity(share, lost, per_step, params)
    if severity is None:
        return None
    per_step_text = f" ({per_step:.1f} per step)" if m.steps else ""
    worst = m.call_sites[0]["call_site"] if m.call_sites else "?"
    apis = ", ".join(f"{a['api']} ×{a['count']}" for a in m.by_api[:4])
    return Finding(
        analyzer="host_sync",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity=severity,
        title=(
            f"GPU {device}: {m.calls} host syncs{per_step_text} cost "
            f"{lost / 1e6:.2f} ms of GPU time ({share:.1f}% of the span)"
        ),
        detail=(
            f"The host blocked {m.blocked_ns / 1e6:.2f} ms in {m.calls} synchronizing calls "
            f"({apis}); "
            f"{m.gaps_charged} GPU idle gaps followed them, {lost / 1e6:.3f} ms charged to the syncs. "
            f"Top call site: {worst}. {m.item_calls} scalar reads (aten::_local_scalar_dense) in the trace."
        ),
        recommendation=_recommendation(m.call_sites, m.pageable_d2h),
        impact_ns=lost,
        saving_ns=lost,
        evidence={
            "share_of_span_pct": round(float(share), 3),
            "span_ns": m.span_ns,
            "blocking_calls": m.calls,
            "blocked_ns": m.blocked_ns,
            "calls_in_steps": m.calls_in_steps,
            "steps": m.steps,
            "calls_per_step": round(float(per_step), 2),
            "gaps_charged": m.gaps_charged,
            "by_api": m.by_api,
            "d2h_blocking_copies": m.d2h_blocking_copies,
            "item_calls": m.item_calls,
            "gpu_sync_events": m.gpu_sync_events,
            "call_sites": m.call_sites,
        },
        windows=m.windows,
    )


def _severity(share: float, lost: int, per_step: float, params: dict) -> str | None:
    graded = graded_severity(share, lost, params)
    if graded:
        return graded
    if per_step >= params["per_step_low"] and share >= params["per_step_share_pct"]:
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


def _recommendation(sites: list[dict], pageable_d2h: bool) -> str:
    """The fixes for the top call sites (and for copies into pageable memory)."""
    import re

    fixes: list[str] = []
    for site in sites[:5]:
        for pattern, text in _FIXES:
            if re.search(pattern, site["call_site"]) and text not in fixes:
                fixes.append(text)
    if pageable_d2h:
        text = _FIXES[1][1]
        if text not in fixes:
            fixes.append(text)
    if not fixes:
        fixes.append(
            "Remove host synchronization from the step: each one drains the GPU queue, so the "
            "host's next launches run with the GPU idle."
        )
    return " ".join(fixes)


SPEC = AnalyzerSpec(
    id="host_sync",
    order=80,
    per_rank=True,
    title="Host synchronization",
    description=(
        "Synchronize calls and blocking copies (.item(), torch.cuda.synchronize, pageable "
        "device-to-host copies): count, host time blocked, and the GPU idle time they cause."
    ),
    run=run,
    thresholds=THRESHOLDS,
)
