"""``gpu_idle``: where each GPU sat idle, and what its host was doing meanwhile.

Attribution is done by :mod:`stallscope.idle` (causes ``dataloader``,
``host_sync``, ``memcpy``, ``launch``, ``cpu``, ``unknown``). Metrics per
trace and device: ``idle_<cause>_ns`` for every cause. One finding per device
and cause whose idle time reaches a share of the span (thresholds below) and
at least ``min_impact_ms``. Documented in docs/analyzers/gpu_idle.md.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Where,
    graded_severity,
    graded_thresholds,
)
from stallscope.idle import (
    CAUSES,
    IdleAttribution,
    attribute_idle,
    host_ranges,
    mostly_range_only,
    top_host_ops,
)
from stallscope.jobdata import JobData
from stallscope.scope import step_scope

THRESHOLDS = (
    *graded_thresholds(
        "idle share of the span (one cause)", "idle time below which a cause is not reported"
    ),
)
MAX_WINDOWS = 20
# Idle time waiting for launches is reported by the launch_overhead analyzer,
# with launch counts and the CUDA Graphs estimate; here it is only a metric.
REPORTED_CAUSES = tuple(c for c in CAUSES if c != "launch")

CAUSE_TEXT = {
    "dataloader": (
        "waiting for input data",
        "Load data in the background: DataLoader(num_workers>0, pin_memory=True, persistent_workers=True, "
        "prefetch_factor>=2), move batches with .to(device, non_blocking=True), and keep preprocessing out of "
        "the training loop (or on the GPU).",
    ),
    "host_sync": (
        "blocked in host-device synchronization",
        "Remove synchronizations from the step: avoid .item(), .cpu(), print(tensor) and torch.cuda.synchronize() "
        "in the loop; accumulate metrics on the GPU and read them every N steps; use non_blocking copies and "
        "CUDA events instead of full syncs.",
    ),
    "memcpy": (
        "blocked in synchronous memory copies",
        "Copy from pinned memory with non_blocking=True (DataLoader(pin_memory=True) or tensor.pin_memory()), "
        "so copies run asynchronously and overlap compute.",
    ),
    "launch": (
        "waiting for kernel launches (CPU-bound launch path)",
        "Cut per-kernel launch overhead: capture the step in CUDA Graphs (torch.cuda.graphs or "
        "torch.compile(mode='reduce-overhead')), fuse small ops (torch.compile), use larger batches, and keep "
        "Python work out of the hot loop.",
    ),
    "cpu": (
        "waiting while the host ran other work",
        "Profile the host side of the gaps (the top operations below): move CPU work off the critical path, "
        "overlap it with GPU work, or run it in another process.",
    ),
    "queued": (
        "with the next work already queued (a GPU-side wait)",
        "The host had already issued the next operation: the GPU waited on itself, not on the host. With one "
        "stream this is per-kernel device overhead between short kernels: fuse them (torch.compile) or make "
        "them larger.",
    ),
    "unknown": (
        "with no host activity recorded on the launching threads",
        "Capture with CPU activity and record_function ranges (or Nsight Systems with OS runtime tracing) to see "
        "what the process was waiting for; check other processes and I/O.",
    ),
}


QUEUED_MULTI_STREAM_FIX = (
    "The host had already issued the next operation: the GPU waited on itself. Look for cross-stream "
    "dependencies (cudaStreamWaitEvent between compute, copy and NCCL streams) and per-kernel device overhead "
    "of very short kernels (fuse them); overlap independent work on other streams."
)
# Queued gaps shorter than this are the device's own latency between back-to-back kernels.
QUEUED_MIN_GAP_NS = 1_000

# ``unknown`` when the host side WAS profiled (operators, Python or OS calls
# recorded): the gap is in work the profiler does not record.
UNRECORDED_WORK_FIX = (
    "CPU activity was captured, but the launching thread ran no recorded operation in these gaps: it was in "
    "work the profiler does not record (Python between operators, time.sleep or I/O, waiting for the GIL, or "
    "descheduled). Sample the Python stack over these windows (py-spy, or Nsight Systems with "
    "--python-sampling=true) and move that work out of the step. In a multi-rank job, see nccl_wait: a rank "
    "whose host falls behind here is the straggler the others wait for."
)
_HOST_WORK_SQL = (
    "SELECT count(*) > 0 FROM host WHERE trace_id = ? AND kind IN ('cpu_op', 'python', 'osrt')"
)


def host_work_recorded(job: JobData, trace: str) -> bool:
    """Whether the trace records host work beyond launch calls and ranges (operators, Python, OS calls)."""
    key = ("host_work_recorded", trace)
    if key not in job.cache:
        job.cache[key] = bool(job.sql(_HOST_WORK_SQL, [trace]).fetchone()[0])
    return job.cache[key]


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        for device in job.devices(ref.trace_id):
            m = measure_device(job, Where(ref.trace_id, rank, int(device)), params)
            result.metrics.extend(metrics(m))
            result.findings.extend(speak(m, params))
    return result


class HostActivity(msgspec.Struct, kw_only=True):
    """What the launching host threads ran in a cause's longest gaps (:mod:`stallscope.idle`):
    the operations that overlap them most and the user ranges (record_function, NVTX) they
    were in, each as :func:`~stallscope.idle.top_host_ops` / :func:`~stallscope.idle.host_ranges`
    return them."""

    top_host_ops: list[dict]
    host_ranges: list[dict]


NO_HOST_ACTIVITY = HostActivity(top_host_ops=[], host_ranges=[])


class CauseIdle(msgspec.Struct, kw_only=True):
    """What one cause cost one device, measured (no prose): :func:`measure_cause`.

    The counted gaps are those whose time of the cause is a stall (for ``queued``,
    neither inside a CUDA graph replay nor shorter than QUEUED_MIN_GAP_NS).
    """

    cause: str
    impact_ns: int  # the cause's time in the counted gaps
    span_ns: int  # the device's span
    gap_count: int  # counted gaps
    longest_ns: int  # the cause's time in the counted gap where it is largest
    windows: list[list[int]]  # the counted gaps with the most of it, most first (MAX_WINDOWS)
    # the host in those windows; None where not measured (causes below the severity ladder);
    # empty for ``queued`` (the host had handed the work over) and ``unknown`` (nothing recorded)
    host: HostActivity | None
    # of a ``cpu`` impact: the time labelled ``cpu`` only because a record_function/NVTX range
    # was open, with nothing recorded under it (sleep, I/O or CPU work: the trace cannot tell)
    range_only_ns: int = 0

    @property
    def range_only(self) -> bool:
        """Whether most of the cause's time is range-only ``cpu`` time (``range_only_ns``)."""
        return self.cause == "cpu" and mostly_range_only(self.range_only_ns, self.impact_ns)

    @property
    def share_pct(self) -> float:
        """impact_ns as % of the span (unrounded; 0 without a span)."""
        return 100.0 * self.impact_ns / self.span_ns if self.span_ns else 0.0


class QueuedTime(msgspec.Struct, kw_only=True):
    """All of a device's ``queued`` time, stall or not (:func:`measure_queued`)."""

    queued_ns: int  # every gap's queued time
    gap_count: int  # gaps with queued time
    graph_replay_ns: int  # of it, in gaps inside one CUDA graph replay
    longest_ns: int  # the largest queued time of one gap


class DeviceIdle(msgspec.Struct, kw_only=True):
    """One device's idle time by cause: :func:`measure_device`. No prose: :func:`speak`
    writes the findings from it."""

    where: Where
    span_ns: int  # the device's span (its step scope when the trace has steps)
    in_steps: bool  # the span is the step scope
    totals: dict[str, int]  # idle ns per cause of CAUSES, over every gap
    causes: dict[str, CauseIdle]  # each of REPORTED_CAUSES, in that order
    queued: QueuedTime  # all its queued time, stall or not
    streams: int  # streams that ran kernels or copies on the device
    host_work_recorded: bool  # the trace records operators, Python or OS calls

    @property
    def queued_share_pct(self) -> float:
        """All queued time as % of the span (unrounded; 0 without a span)."""
        return 100.0 * self.queued.queued_ns / self.span_ns if self.span_ns else 0.0


def measure_device(job: JobData, where: Where, params: dict[str, float]) -> DeviceIdle:
    """Idle time of ``where.device`` by cause. The host activity of a cause is measured
    only when the cause reaches the severity ladder of ``params`` (it costs queries and
    only a reported cause shows it)."""
    trace, device = where.trace, int(where.device)
    attribution = attribute_idle(job, trace, device)
    span = attribution.span_end - attribution.span_start
    causes = {
        cause: measure_cause(job, where, cause, attribution, params) for cause in REPORTED_CAUSES
    }
    return DeviceIdle(
        where=where,
        span_ns=span,
        in_steps=step_scope(job, trace, device) is not None,
        totals=attribution.totals,
        causes=causes,
        queued=measure_queued(job, where, attribution),
        streams=device_streams(job, trace, device),
        host_work_recorded=host_work_recorded(job, trace),
    )


def measure_cause(
    job: JobData, where: Where, cause: str, attribution: IdleAttribution, params: dict[str, float]
) -> CauseIdle:
    """One cause's stall time on the device, its longest gaps and (when it reaches the
    ladder of ``params``) what the host ran in them."""
    per_gap = _cause_per_gap(attribution, cause)
    counted = _counted_gaps(job, where, cause, attribution, per_gap)
    shown = np.where(counted, per_gap, 0)
    order = np.argsort(-shown, kind="stable")[:MAX_WINDOWS]
    order = order[shown[order] > 0]
    windows = [[int(attribution.gap_starts[i]), int(attribution.gap_ends[i])] for i in order]
    c = CauseIdle(
        cause=cause,
        impact_ns=int(per_gap[counted].sum()),
        span_ns=attribution.span_end - attribution.span_start,
        gap_count=int(counted.sum()),
        longest_ns=int(shown.max()) if shown.size else 0,
        windows=windows,
        host=None,
        range_only_ns=_range_only_ns(attribution, cause, counted),
    )
    if graded_severity(c.share_pct, c.impact_ns, params) is not None:
        c.host = _host_activity(job, where.trace, cause, attribution, windows)
    return c


def _range_only_ns(attribution: IdleAttribution, cause: str, counted: np.ndarray) -> int:
    """ns of the ``cpu`` time in the counted gaps that only an open user range labelled
    (nothing recorded under it); 0 for other causes."""
    only = attribution.range_only_per_gap
    if cause != "cpu" or only is None or not only.size:
        return 0
    return int(only[counted].sum())


def _cause_per_gap(attribution: IdleAttribution, cause: str) -> np.ndarray:
    """ns of ``cause`` in each gap."""
    if not attribution.per_gap.size:
        return np.zeros(0, dtype=np.int64)
    return attribution.per_gap[:, CAUSES.index(cause)]


def _counted_gaps(job, where: Where, cause, attribution, per_gap: np.ndarray) -> np.ndarray:
    """Per gap: its time of ``cause`` is a stall (for ``queued``: not inside a CUDA graph
    replay and not shorter than QUEUED_MIN_GAP_NS, the device's own latency)."""
    counted = per_gap > 0
    if cause == "queued" and counted.any():
        counted &= ~graph_internal_gaps(job, where.trace, int(where.device), attribution)
        counted &= (attribution.gap_ends - attribution.gap_starts) >= QUEUED_MIN_GAP_NS
    return counted


def measure_queued(job: JobData, where: Where, attribution: IdleAttribution) -> QueuedTime:
    """All of the device's ``queued`` time, with the part inside CUDA graph replays
    (zeros without any)."""
    per_gap = _cause_per_gap(attribution, "queued")
    total = int(per_gap.sum())
    graph = graph_internal_gaps(job, where.trace, int(where.device), attribution) if total else None
    return QueuedTime(
        queued_ns=total,
        gap_count=int((per_gap > 0).sum()),
        graph_replay_ns=int(per_gap[graph].sum()) if total else 0,
        longest_ns=int(per_gap.max()) if per_gap.size else 0,
    )


def _host_activity(job, trace, cause, attribution, windows) -> HostActivity:
    """The host ranges and operations that cover the windows (none for ``queued``:
    the host had already handed the work over, what it did next is beside the point)."""
    if cause in ("queued", "unknown"):
        return NO_HOST_ACTIVITY
    return HostActivity(
        top_host_ops=top_host_ops(job, trace, attribution.threads, windows),
        host_ranges=host_ranges(job, trace, attribution.threads, windows),
    )


def metrics(m: DeviceIdle) -> list[Metric]:
    """``idle_<cause>_ns`` for every cause of CAUSES."""
    w = m.where
    return [Metric(w.trace, w.rank, w.device, f"idle_{c}_ns", m.totals[c], "ns") for c in CAUSES]


def speak(m: DeviceIdle, params: dict[str, float]) -> list[Finding]:
    """The device's findings, one per reported cause that reaches the ladder; ``queued``
    time below it may still give the ``info`` device-latency note."""
    findings = []
    for cause, c in m.causes.items():
        severity = graded_severity(c.share_pct, c.impact_ns, params)
        if severity is not None:
            findings.append(speak_cause(m, c, severity))
        elif cause == "queued":
            findings.extend(f for f in [speak_device_latency(m, params)] if f)
    return findings


def speak_cause(m: DeviceIdle, c: CauseIdle, severity: str) -> Finding:
    """The finding of one cause's stall time on the device, at ``severity``."""
    device, host = m.where.device, c.host or NO_HOST_ACTIVITY
    what, fix = _what_and_fix(m, c, host.host_ranges)
    detail = (
        f"GPU {device} was idle {c.impact_ns / 1e6:.2f} ms ({c.share_pct:.1f}% of its {m.span_ns / 1e6:.2f} ms span) "
        f"{what}, in {c.gap_count} gaps (longest {c.longest_ns / 1e6:.3f} ms)."
        + _host_text(host, len(c.windows))
    )
    return Finding(
        analyzer="gpu_idle",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity=severity,
        title=f"GPU {device} idle {c.share_pct:.1f}% of the time {what}",
        detail=detail,
        recommendation=fix,
        impact_ns=c.impact_ns,
        saving_ns=c.impact_ns,
        evidence={
            "key": c.cause,
            "cause": c.cause,
            "share_of_span_pct": round(c.share_pct, 3),
            "gap_count": c.gap_count,
            "longest_gap_ns": c.longest_ns,
            "span_ns": m.span_ns,
            "scope": "steps" if m.in_steps else "trace",
            "idle_by_cause_ns": m.totals,
            "top_host_ops": host.top_host_ops,
            "host_ranges": host.host_ranges,
            **({"host_work_recorded": m.host_work_recorded} if c.cause == "unknown" else {}),
            **({"range_only_ns": c.range_only_ns} if c.cause == "cpu" else {}),
        },
        windows=c.windows,
    )


def _what_and_fix(m: DeviceIdle, c: CauseIdle, ranges: list[dict]) -> tuple[str, str]:
    """The cause's words and fix, fitted to what the trace shows (streams, user ranges)."""
    cause = c.cause
    what, fix = CAUSE_TEXT[cause]
    if c.range_only and ranges:
        name = ranges[0]["name"]
        return (
            f"while the host was inside `{name}` with nothing recorded under it",
            f"The GPU waits while the host is in `{name}`, where the trace records no operator and no "
            "CUDA call: look at what that range does (a sleep, I/O, a blocking call or CPU work), then "
            "shorten it, move it off the step, or queue the next GPU work before it. To see which, capture "
            "with Nsight Systems OS-runtime tracing (-t osrt) or sample its Python with py-spy.",
        )
    if cause == "unknown" and m.host_work_recorded:
        fix = UNRECORDED_WORK_FIX
    if cause == "queued":
        fix = QUEUED_MULTI_STREAM_FIX if m.streams > 1 else fix
    if cause == "cpu" and ranges:
        fix = (
            f"The GPU waits while the host is in `{ranges[0]['name']}`: queue the next GPU work before it "
            "runs (so the GPU has work meanwhile), move it to another thread or process, or shorten it "
            "(sample its Python with py-spy). " + fix
        )
    return what, fix


def _host_text(host: HostActivity, windows: int) -> str:
    """' In the N longest gaps the host was in `range` (record_function/NVTX range, X ms per
    gap in M of them). Inside, it ran: ops.' — or the ops alone when no range covers them."""
    text = ""
    ranges = host.host_ranges
    if ranges:
        text += f" In the {windows} longest gaps the host was in " + ", ".join(
            f"`{r['name']}` (record_function/NVTX range, {r['overlap_ns'] / max(r['windows'], 1) / 1e6:.2f} ms "
            f"per gap in {r['windows']} of them)"
            for r in ranges[:2]
        )
        text += "."
    ops = [op for op in host.top_host_ops if op["kind"] != "annotation"][:3]
    if ops:
        text += (" Inside, it ran: " if ranges else " The host was mostly in: ") + ", ".join(
            f"{op['name']} ({op['overlap_ns'] / 1e6:.2f} ms)" for op in ops
        )
        text += "."
    return text


def speak_device_latency(m: DeviceIdle, params: dict[str, float]) -> Finding | None:
    """``queued`` time that is no stall (gaps inside graph replays, sub-microsecond device
    latency between back-to-back kernels): an ``info`` line when it is a material share."""
    q, share = m.queued, m.queued_share_pct
    if graded_severity(share, q.queued_ns, params) is None:
        return None
    device = m.where.device
    return Finding(
        analyzer="gpu_idle",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity="info",
        title=f"GPU {device}: {share:.1f}% of the time in device-side gaps between queued kernels (not a stall)",
        detail=(
            f"{q.gap_count} gaps of {q.queued_ns / 1e6:.2f} ms in all opened with the next kernel "
            f"already queued; {q.graph_replay_ns / 1e6:.2f} ms of it between the kernels of one CUDA graph replay and the "
            f"rest in gaps under {QUEUED_MIN_GAP_NS / 1e3:.0f} µs (longest {q.longest_ns / 1e3:.2f} µs): the "
            "device's own per-kernel latency, which neither the host nor the stream order causes."
        ),
        recommendation=(
            "Nothing to fix on the host side. Fewer, larger kernels (fusion with torch.compile) are the only "
            "way to shrink per-kernel device latency."
        ),
        impact_ns=0,
        evidence={
            "key": "device_latency",
            "cause": "queued",
            "queued_ns": q.queued_ns,
            "graph_replay_ns": q.graph_replay_ns,
            "share_of_span_pct": round(share, 3),
            "span_ns": m.span_ns,
            "min_gap_ns": QUEUED_MIN_GAP_NS,
        },
    )


def graph_internal_gaps(job: JobData, trace: str, device: int, attribution) -> np.ndarray:
    """Per gap: True when the operations on both sides were launched by one call (the
    same correlation id: the nodes of one CUDA graph replay)."""
    key = ("graph_internal_gaps", trace, device)
    if key in job.cache:
        return job.cache[key]
    ops = job.numpy(
        "SELECT start_ns, end_ns, coalesce(correlation, -1) AS corr FROM gpu WHERE trace_id = ? "
        "AND device = ? AND kind IN ('kernel', 'memcpy', 'memset') ORDER BY start_ns",
        [trace, device],
    )
    gap_s, gap_e = attribution.gap_starts, attribution.gap_ends
    result = np.zeros(gap_s.size, dtype=bool)
    if ops["start_ns"].size and gap_s.size:
        starts, corr = np.asarray(ops["start_ns"]), np.asarray(ops["corr"])
        order_end = np.argsort(ops["end_ns"], kind="stable")
        ends = np.asarray(ops["end_ns"])[order_end]
        after = np.clip(np.searchsorted(starts, gap_e, side="left"), 0, starts.size - 1)
        before = np.clip(np.searchsorted(ends, gap_s, side="right") - 1, 0, ends.size - 1)
        prev_corr = corr[order_end][before]
        result = (corr[after] == prev_corr) & (prev_corr >= 0) & (starts[after] == gap_e)
    job.cache[key] = result
    return result


def device_streams(job: JobData, trace: str, device: int) -> int:
    """How many streams ran kernels or copies on the device."""
    return int(
        job.sql(
            "SELECT count(DISTINCT stream) FROM gpu WHERE trace_id = ? AND device = ? "
            "AND kind IN ('kernel', 'memcpy', 'memset')",
            [trace, device],
        ).fetchone()[0]
    )


SPEC = AnalyzerSpec(
    id="gpu_idle",
    order=20,
    per_rank=True,
    title="GPU idle time and its host-side cause",
    description="Idle gaps per GPU, each nanosecond attributed to what the launching host threads were doing.",
    run=run,
    thresholds=THRESHOLDS,
)
