"""``utilization``: how busy each GPU was over the profiled span.

Definitions (docs/analyzers/utilization.md), per trace and device:

* span = first start to last end of the device's kernels, memcpys and memsets
  (synchronization events are waits, not work, and are left out);
* ``gpu_busy_pct`` = |union of kernels, memcpys, memsets| / span * 100;
* ``gpu_idle_pct`` = 100 - ``gpu_busy_pct``;
* ``compute_pct`` = |union of non-communication kernels| / span * 100;
* ``comm_pct`` = |union of communication kernels| / span * 100;
* ``memcpy_pct`` = |union of memcpys and memsets| / span * 100;
* ``kernel_count`` = number of kernels;
* ``step_time_ms_median`` (per trace) = median duration of ``ProfilerStep#N``
  ranges, in milliseconds.

One finding per device whose idle share reaches a threshold.
"""

from __future__ import annotations

import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import AnalyzerResult, AnalyzerSpec, Finding, Metric, Threshold
from stallscope.jobdata import JobData

THRESHOLDS = (
    Threshold(
        "idle_pct_low",
        10.0,
        "%",
        "GPU idle share of the span that makes a low-severity finding",
        maximum=100,
    ),
    Threshold(
        "idle_pct_medium",
        25.0,
        "%",
        "GPU idle share of the span that makes a medium-severity finding",
        maximum=100,
    ),
    Threshold(
        "idle_pct_high",
        50.0,
        "%",
        "GPU idle share of the span that makes a high-severity finding",
        maximum=100,
    ),
)
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
            _device_metrics(result, ref.trace_id, rank, int(device), dev, params)
        _step_metric(job, result, ref.trace_id, rank)
    return result


def _device_metrics(
    result: AnalyzerResult, trace: str, rank: int, device: int, dev: dict, params: dict
) -> None:
    starts, ends, kind = dev["start_ns"], dev["end_ns"], dev["kind"]
    is_comm = np.asarray(dev["is_comm"], dtype=bool)
    span = int(ends.max() - starts.min())
    is_kernel = kind == "kernel"
    busy = intervals.total(starts, ends)
    parts = {
        "gpu_busy_pct": busy,
        "compute_pct": intervals.total(starts[is_kernel & ~is_comm], ends[is_kernel & ~is_comm]),
        "comm_pct": intervals.total(starts[is_kernel & is_comm], ends[is_kernel & is_comm]),
        "memcpy_pct": intervals.total(starts[~is_kernel], ends[~is_kernel]),
    }
    for name, covered in parts.items():
        result.metrics.append(Metric(trace, rank, device, name, _pct(covered, span), "%"))
    idle_pct = 100.0 - _pct(busy, span) if span else 0.0
    result.metrics.append(Metric(trace, rank, device, "gpu_idle_pct", round(idle_pct, 3), "%"))
    result.metrics.append(
        Metric(trace, rank, device, "kernel_count", int(is_kernel.sum()), "count")
    )
    result.metrics.append(Metric(trace, rank, device, "gpu_span_ns", span, "ns"))
    finding = _idle_finding(trace, rank, device, starts, ends, span, busy, idle_pct, params)
    if finding:
        result.findings.append(finding)


def _idle_finding(
    trace, rank, device, starts, ends, span, busy, idle_pct, params
) -> Finding | None:
    severity = None
    for level in ("high", "medium", "low"):
        if idle_pct >= params[f"idle_pct_{level}"]:
            severity = level
            break
    if severity is None:
        return None
    gap_starts, gap_ends = intervals.gaps(starts, ends)
    order = np.argsort(gap_starts - gap_ends, kind="stable")[:MAX_WINDOWS]  # longest first
    windows = [[int(gap_starts[i]), int(gap_ends[i])] for i in order]
    idle_ns = span - busy
    longest = int(gap_ends[order[0]] - gap_starts[order[0]]) if order.size else 0
    return Finding(
        analyzer="utilization",
        trace=trace,
        rank=rank,
        device=device,
        severity=severity,
        title=f"GPU {device} idle {idle_pct:.1f}% of the profiled span",
        detail=(
            f"Over {span / 1e6:.2f} ms from its first to its last activity, GPU {device} ran kernels or copies "
            f"for {busy / 1e6:.2f} ms and sat idle for {idle_ns / 1e6:.2f} ms in {gap_starts.size} gaps "
            f"(longest {longest / 1e6:.3f} ms)."
        ),
        recommendation=(
            "Find what the host was doing during the longest gaps (data loading, synchronization, "
            "Python overhead, kernel launches) and overlap or remove it: more DataLoader workers with "
            "pin_memory, fewer host syncs, CUDA Graphs or torch.compile for launch-bound code."
        ),
        impact_ns=idle_ns,
        evidence={
            "span_ns": span,
            "busy_ns": busy,
            "idle_ns": idle_ns,
            "gap_count": int(gap_starts.size),
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


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


SPEC = AnalyzerSpec(
    id="utilization",
    title="GPU utilization",
    description="Busy, idle, compute, communication and copy shares of each GPU's profiled span.",
    run=run,
    thresholds=THRESHOLDS,
)
