"""``gpu_idle``: where each GPU sat idle, and what its host was doing meanwhile.

Attribution is done by :mod:`stallscope.idle` (causes ``dataloader``,
``host_sync``, ``memcpy``, ``launch``, ``cpu``, ``unknown``). Metrics per
trace and device: ``idle_<cause>_ns`` for every cause. One finding per device
and cause whose idle time reaches a share of the span (thresholds below) and
at least ``min_impact_ms``. Documented in docs/analyzers/gpu_idle.md.
"""

from __future__ import annotations

import numpy as np

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    graded_severity,
    graded_thresholds,
)
from stallscope.idle import CAUSES, IdleAttribution, attribute_idle, top_host_ops
from stallscope.jobdata import JobData

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
        "The host had already issued the next operation: the GPU waited on itself. Look for cross-stream "
        "dependencies (cudaStreamWaitEvent between compute, copy and NCCL streams), per-kernel device overhead "
        "of very short kernels (fuse them), or graph-node gaps; overlap independent work on other streams.",
    ),
    "unknown": (
        "with no host activity recorded on the launching threads",
        "Capture with CPU activity and record_function ranges (or Nsight Systems with OS runtime tracing) to see "
        "what the process was waiting for; check other processes and I/O.",
    ),
}


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


def _finding(
    job, trace, rank, device, cause, attribution: IdleAttribution, params
) -> Finding | None:
    index = CAUSES.index(cause)
    per_gap = (
        attribution.per_gap[:, index] if attribution.per_gap.size else np.zeros(0, dtype=np.int64)
    )
    impact = int(per_gap.sum())
    span = attribution.span_end - attribution.span_start
    share = 100.0 * impact / span if span else 0.0
    severity = graded_severity(share, impact, params)
    if severity is None:
        return None
    order = np.argsort(-per_gap, kind="stable")[:MAX_WINDOWS]
    order = order[per_gap[order] > 0]
    windows = [[int(attribution.gap_starts[i]), int(attribution.gap_ends[i])] for i in order]
    gaps_with_cause = int((per_gap > 0).sum())
    what, fix = CAUSE_TEXT[cause]
    if cause == "unknown" and host_work_recorded(job, trace):
        fix = UNRECORDED_WORK_FIX
    top_ops = top_host_ops(job, trace, attribution.threads, windows) if cause != "unknown" else []
    top_text = ", ".join(f"{op['name']} ({op['overlap_ns'] / 1e6:.2f} ms)" for op in top_ops[:3])
    detail = (
        f"GPU {device} was idle {impact / 1e6:.2f} ms ({share:.1f}% of its {span / 1e6:.2f} ms span) {what}, "
        f"in {gaps_with_cause} gaps (longest {per_gap.max() / 1e6:.3f} ms)."
    )
    if top_text:
        detail += f" The host was mostly in: {top_text}."
    return Finding(
        analyzer="gpu_idle",
        trace=trace,
        rank=rank,
        device=device,
        severity=severity,
        title=f"GPU {device} idle {share:.1f}% of the time {what}",
        detail=detail,
        recommendation=fix,
        impact_ns=impact,
        evidence={
            "key": cause,
            "cause": cause,
            "share_of_span_pct": round(share, 3),
            "gap_count": gaps_with_cause,
            "longest_gap_ns": int(per_gap.max()),
            "span_ns": span,
            "idle_by_cause_ns": attribution.totals,
            "top_host_ops": top_ops,
            **(
                {"host_work_recorded": host_work_recorded(job, trace)} if cause == "unknown" else {}
            ),
        },
        windows=windows,
    )


SPEC = AnalyzerSpec(
    id="gpu_idle",
    title="GPU idle time and its host-side cause",
    description="Idle gaps per GPU, each nanosecond attributed to what the launching host threads were doing.",
    run=run,
    thresholds=THRESHOLDS,
)
