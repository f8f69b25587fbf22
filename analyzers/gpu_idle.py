"""``gpu_idle``: where each GPU sat idle, and what its host was doing meanwhile.

Attribution is done by :mod:`stallscope.idle` (causes ``dataloader``,
``host_sync``, ``memcpy``, ``launch``, ``cpu``, ``unknown``). Metrics per
trace and device: ``idle_<cause>_ns`` for every cause. One finding per device
and cause whose idle time reaches a share of the span (thresholds below) and
at least ``min_impact_ms``. Documented in docs/analyzers/gpu_idle.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    graded_severity,
    graded_thresholds,
)
from stallscope.idle import (
    CAUSES,
    IdleAttribution,
    attribute_idle,
    host_ranges,
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
            attribution = attribute_idle(job, ref.trace_id, int(device))
            totals = attribution.totals
            for cause in CAUSES:
                result.metrics.append(
                    Metric(ref.trace_id, rank, int(device), f"idle_{cause}_ns", totals[cause], "ns")
                )
            for cause in REPORTED_CAUSES:
                finding = _finding(job, ref.trace_id, rank, int(device), cause, attribution, params)
                if finding:
                    result.findings.append(finding)
    return result


@dataclass
class CauseIdle:
    """What one cause cost one device, measured (no prose).

    ``per_gap``: ns of the cause in each gap; ``counted``: the gaps whose time
    is a stall (for ``queued``, neither inside a CUDA graph replay nor shorter
    than QUEUED_MIN_GAP_NS); ``impact``: the counted time (int ns); ``share``:
    % of ``span``.
    """

    cause: str
    per_gap: np.ndarray
    counted: np.ndarray
    impact: int
    span: int
    share: float
    in_steps: bool


def _measure(job, trace, device, cause, attribution: IdleAttribution) -> CauseIdle:
    index = CAUSES.index(cause)
    per_gap = (
        attribution.per_gap[:, index] if attribution.per_gap.size else np.zeros(0, dtype=np.int64)
    )
    counted = per_gap > 0
    if cause == "queued" and counted.any():
        counted &= ~graph_internal_gaps(job, trace, device, attribution)
        counted &= (attribution.gap_ends - attribution.gap_starts) >= QUEUED_MIN_GAP_NS
    impact = int(per_gap[counted].sum())
    span = attribution.span_end - attribution.span_start
    share = 100.0 * impact / span if span else 0.0
    in_steps = step_scope(job, trace, device) is not None
    return CauseIdle(cause, per_gap, counted, impact, span, share, in_steps)


def _finding(
    job, trace, rank, device, cause, attribution: IdleAttribution, params
) -> Finding | None:
    m = _measure(job, trace, device, cause, attribution)
    severity = graded_severity(m.share, m.impact, params)
    if cause == "queued" and severity is None:
        return _device_latency_note(job, trace, rank, device, m, attribution, params)
    if severity is None:
        return None
    shown = np.where(m.counted, m.per_gap, 0)
    order = np.argsort(-shown, kind="stable")[:MAX_WINDOWS]
    order = order[shown[order] > 0]
    windows = [[int(attribution.gap_starts[i]), int(attribution.gap_ends[i])] for i in order]
    host = _host_evidence(job, trace, cause, attribution, windows)
    what, fix = _what_and_fix(job, trace, device, cause, host["host_ranges"])
    gaps = int(m.counted.sum())
    detail = (
        f"GPU {device} was idle {m.impact / 1e6:.2f} ms ({m.share:.1f}% of its {m.span / 1e6:.2f} ms span) "
        f"{what}, in {gaps} gaps (longest {shown.max() / 1e6:.3f} ms)."
        + _host_text(host, len(windows))
    )
    return Finding(
        analyzer="gpu_idle",
        trace=trace,
        rank=rank,
        device=device,
        severity=severity,
        title=f"GPU {device} idle {m.share:.1f}% of the time {what}",
        detail=detail,
        recommendation=fix,
        impact_ns=m.impact,
        saving_ns=m.impact,
        evidence={
            "key": cause,
            "cause": cause,
            "share_of_span_pct": round(m.share, 3),
            "gap_count": gaps,
            "longest_gap_ns": int(shown.max()),
            "span_ns": m.span,
            "scope": "steps" if m.in_steps else "trace",
            "idle_by_cause_ns": attribution.totals,
            **host,
            **(
                {"host_work_recorded": host_work_recorded(job, trace)} if cause == "unknown" else {}
            ),
        },
        windows=windows,
    )


def _what_and_fix(job, trace, device, cause, ranges: list[dict]) -> tuple[str, str]:
    """The cause's words and fix, fitted to what the trace shows (streams, user ranges)."""
    what, fix = CAUSE_TEXT[cause]
    if cause == "unknown" and host_work_recorded(job, trace):
        fix = UNRECORDED_WORK_FIX
    if cause == "queued":
        fix = QUEUED_MULTI_STREAM_FIX if device_streams(job, trace, device) > 1 else fix
    if cause == "cpu" and ranges:
        fix = (
            f"The GPU waits while the host is in `{ranges[0]['name']}`: queue the next GPU work before it "
            "runs (so the GPU has work meanwhile), move it to another thread or process, or shorten it "
            "(sample its Python with py-spy). " + fix
        )
    return what, fix


def _host_evidence(job, trace, cause, attribution, windows) -> dict:
    """The host ranges and operations that cover the windows (none for ``queued``:
    the host had already handed the work over, what it did next is beside the point)."""
    if cause in ("queued", "unknown"):
        return {"top_host_ops": [], "host_ranges": []}
    return {
        "top_host_ops": top_host_ops(job, trace, attribution.threads, windows),
        "host_ranges": host_ranges(job, trace, attribution.threads, windows),
    }


def _host_text(host: dict, windows: int) -> str:
    """' In the N longest gaps the host was in `range` (record_function/NVTX range, X ms per
    gap in M of them). Inside, it ran: ops.' — or the ops alone when no range covers them."""
    text = ""
    ranges = host["host_ranges"]
    if ranges:
        text += f" In the {windows} longest gaps the host was in " + ", ".join(
            f"`{r['name']}` (record_function/NVTX range, {r['overlap_ns'] / max(r['windows'], 1) / 1e6:.2f} ms "
            f"per gap in {r['windows']} of them)"
            for r in ranges[:2]
        )
        text += "."
    ops = [op for op in host["top_host_ops"] if op["kind"] != "annotation"][:3]
    if ops:
        text += (" Inside, it ran: " if ranges else " The host was mostly in: ") + ", ".join(
            f"{op['name']} ({op['overlap_ns'] / 1e6:.2f} ms)" for op in ops
        )
        text += "."
    return text


def _device_latency_note(job, trace, rank, device, m: CauseIdle, attribution, params):
    """``queued`` time that is no stall (gaps inside graph replays, sub-microsecond device
    latency between back-to-back kernels): an ``info`` line when it is a material share."""
    total = int(m.per_gap.sum())
    share = 100.0 * total / m.span if m.span else 0.0
    if graded_severity(share, total, params) is None:
        return None
    graph = graph_internal_gaps(job, trace, device, attribution)
    graph_ns = int(m.per_gap[graph].sum())
    return Finding(
        analyzer="gpu_idle",
        trace=trace,
        rank=rank,
        device=device,
        severity="info",
        title=f"GPU {device}: {share:.1f}% of the time in device-side gaps between queued kernels (not a stall)",
        detail=(
            f"{int((m.per_gap > 0).sum())} gaps of {total / 1e6:.2f} ms in all opened with the next kernel "
            f"already queued; {graph_ns / 1e6:.2f} ms of it between the kernels of one CUDA graph replay and the "
            f"rest in gaps under {QUEUED_MIN_GAP_NS / 1e3:.0f} µs (longest {m.per_gap.max() / 1e3:.2f} µs): the "
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
            "queued_ns": total,
            "graph_replay_ns": graph_ns,
            "share_of_span_pct": round(share, 3),
            "span_ns": m.span,
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
    title="GPU idle time and its host-side cause",
    description="Idle gaps per GPU, each nanosecond attributed to what the launching host threads were doing.",
    run=run,
    thresholds=THRESHOLDS,
)
