"""``utilization``: how busy each GPU was over the profiled span.

Definitions (docs/analyzers/utilization.md), per trace and device:

* span = the device's step scope when the trace has steps (``scope.step_scope``:
  its in-step GPU work, widened to the idle time at the steps' edges), else
  first start to last end of its kernels, memcpys and memsets
  (synchronization events are waits, not work, and are left out);
* ``gpu_busy_pct`` = |union of kernels, memcpys, memsets| / span * 100;
* ``gpu_idle_pct`` = 100 - ``gpu_busy_pct``;
* ``compute_pct`` = |union of non-communication kernels| / span * 100;
* ``comm_pct`` = |union of communication kernels| / span * 100;
* ``memcpy_pct`` = |union of memcpys and memsets| / span * 100;
* ``kernel_count`` = number of kernels;
* ``step_time_ms_median`` (per trace) = median duration of ``ProfilerStep#N``
  ranges, in milliseconds.

One ``info`` finding per device: the busy/idle headline with idle time by cause.
"""

from __future__ import annotations

import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import AnalyzerResult, AnalyzerSpec, Finding, Metric, pct
from stallscope.jobdata import JobData
from stallscope.scope import idle_gaps, in_scope, span_of, step_scope

MAX_WINDOWS = 20


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        cols = job.numpy(
            "SELECT device, kind, is_comm, start_ns, end_ns FROM gpu "
            "WHERE trace_id = ? AND kind IN ('kernel', 'memcpy', 'memset') ORDER BY device, start_ns",
            [ref.trace_id],
        )
        for device in np.unique(cols["device"]):
            mask = cols["device"] == device
            dev = {k: np.asarray(v)[mask] for k, v in cols.items()}
            scope = step_scope(job, ref.trace_id, int(device))
            keep, dev["start_ns"], dev["end_ns"] = in_scope(dev["start_ns"], dev["end_ns"], scope)
            for column in ("device", "kind", "is_comm"):
                dev[column] = dev[column][keep]
            if keep.any():
                _device_metrics(job, result, ref.trace_id, rank, int(device), dev, scope)
        _step_metric(job, result, ref.trace_id, rank)
    return result


def _device_metrics(
    job: JobData,
    result: AnalyzerResult,
    trace: str,
    rank: int,
    device: int,
    dev: dict,
    scope: tuple[int, int] | None,
) -> None:
    starts, ends, kind = dev["start_ns"], dev["end_ns"], dev["kind"]
    is_comm = np.asarray(dev["is_comm"], dtype=bool)
    lo, hi = span_of(starts, ends, scope)
    span = hi - lo
    is_kernel = kind == "kernel"
    busy = intervals.total(starts, ends)
    parts = {
        "gpu_busy_pct": busy,
        "compute_pct": intervals.total(starts[is_kernel & ~is_comm], ends[is_kernel & ~is_comm]),
        "comm_pct": intervals.total(starts[is_kernel & is_comm], ends[is_kernel & is_comm]),
        "memcpy_pct": intervals.total(starts[~is_kernel], ends[~is_kernel]),
    }
    for name, covered in parts.items():
        result.metrics.append(Metric(trace, rank, device, name, pct(covered, span), "%"))
    idle_pct = 100.0 - pct(busy, span) if span else 0.0
    result.metrics.append(Metric(trace, rank, device, "gpu_idle_pct", round(idle_pct, 3), "%"))
    result.metrics.append(
        Metric(trace, rank, device, "kernel_count", int(is_kernel.sum()), "count")
    )
    result.metrics.append(Metric(trace, rank, device, "gpu_span_ns", span, "ns"))
    gaps = idle_gaps(starts, ends, scope)
    result.findings.append(
        _headline(job, trace, rank, device, gaps, span, busy, idle_pct, scope is not None)
    )


def _headline(job, trace, rank, device, gaps, span, busy, idle_pct, stepped) -> Finding:
    """An info finding per device: busy/idle shares and the idle time by cause (from gpu_idle)."""
    from stallscope.idle import attribute_idle

    gap_starts, gap_ends = gaps
    order = np.argsort(gap_starts - gap_ends, kind="stable")[:MAX_WINDOWS]  # longest first
    windows = [[int(gap_starts[i]), int(gap_ends[i])] for i in order]
    idle_ns = span - busy
    by_cause = attribute_idle(job, trace, device).totals
    ranked = sorted(((ns, cause) for cause, ns in by_cause.items() if ns > 0), reverse=True)
    causes = (
        ", ".join(f"{cause} {100 * ns / span:.1f}%" for ns, cause in ranked[:4]) if span else ""
    )
    return Finding(
        analyzer="utilization",
        trace=trace,
        rank=rank,
        device=device,
        severity="info",
        title=f"GPU {device} busy {100 - idle_pct:.1f}%, idle {idle_pct:.1f}% of {span / 1e6:.2f} ms",
        detail=(
            ("Over its profiled steps" if stepped else "From its first to its last activity")
            + f" GPU {device} ran kernels or copies for {busy / 1e6:.2f} ms "
            f"and sat idle for {idle_ns / 1e6:.2f} ms in {gap_starts.size} gaps"
            + (f"; idle by cause: {causes}." if causes else ".")
        ),
        recommendation="See the gpu_idle and launch_overhead findings for the causes and their fixes.",
        impact_ns=idle_ns,
        evidence={
            "span_ns": span,
            "busy_ns": busy,
            "idle_ns": idle_ns,
            "gap_count": int(gap_starts.size),
            "idle_by_cause_ns": by_cause,
        },
        windows=windows,
    )


def _step_metric(job: JobData, result: AnalyzerResult, trace: str, rank: int) -> None:
    cols = job.numpy(
        "SELECT end_ns - start_ns AS dur FROM ranges WHERE trace_id = ? AND kind = 'step'", [trace]
    )
    durations = cols["dur"]
    if durations.size:
        result.metrics.append(
            Metric(
                trace,
                rank,
                None,
                "step_time_ms_median",
                round(float(np.median(durations)) / 1e6, 6),
                "ms",
            )
        )
        result.metrics.append(Metric(trace, rank, None, "step_count", int(durations.size), "count"))


SPEC = AnalyzerSpec(
    id="utilization",
    title="GPU utilization",
    description="Busy, idle, compute, communication and copy shares of each GPU's profiled span.",
    run=run,
)
