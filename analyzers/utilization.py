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
* the busy time split into parts that never overlap (ns; with the idle time,
  span - busy, they sum to the span exactly): ``compute_only_ns`` =
  |compute - comm|, ``comm_under_compute_ns`` = |compute ∩ comm|,
  ``comm_only_ns`` = |comm - compute|, ``copy_only_ns`` = |copies - kernels|;
* ``kernel_count`` = number of kernels;
* ``step_time_ms_median`` (per trace) = median duration of ``ProfilerStep#N``
  ranges, in milliseconds.

One ``info`` finding per device: the busy/idle headline with idle time by cause.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import AnalyzerResult, AnalyzerSpec, Finding, Metric, Where, pct
from stallscope.idle import attribute_idle
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
            m = measure_device(job, Where(ref.trace_id, rank, int(device)), dev)
            if m is not None:
                result.metrics.extend(metrics(m))
                result.findings.append(speak(m, params))
        result.metrics.extend(step_metrics(measure_steps(job, Where(ref.trace_id, rank))))
    return result


class DeviceBusy(msgspec.Struct, kw_only=True):
    """How busy one device was over its span, ns of interval unions: :func:`measure_device`.
    No prose: :func:`speak` writes the headline from it."""

    where: Where
    span_ns: int  # the step scope, else first start to last end of its operations
    stepped: bool  # the span is the step scope
    busy_ns: int  # kernels, copies and memsets
    compute_ns: int  # non-communication kernels
    comm_ns: int  # communication kernels
    memcpy_ns: int  # copies and memsets
    kernel_ns: int  # every kernel, communication or not (their union)
    kernel_count: int
    gap_count: int  # idle gaps in the span
    windows: list[list[int]]  # the longest gaps, longest first (MAX_WINDOWS)
    idle_by_cause_ns: dict[str, int]  # gpu_idle's attribution (stallscope.idle)

    @property
    def idle_ns(self) -> int:
        return self.span_ns - self.busy_ns

    @property
    def exclusive_ns(self) -> dict[str, int]:
        """The busy time in parts that never overlap, ns (metric name -> ns); with
        :attr:`idle_ns` they sum to ``span_ns``. By inclusion-exclusion over the unions:
        |compute ∩ comm| = |compute| + |comm| - |kernels|, |copies - kernels| = |busy| - |kernels|."""
        under = self.compute_ns + self.comm_ns - self.kernel_ns
        return {
            "compute_only_ns": self.compute_ns - under,
            "comm_under_compute_ns": under,
            "comm_only_ns": self.comm_ns - under,
            "copy_only_ns": self.busy_ns - self.kernel_ns,
        }

    @property
    def idle_pct(self) -> float:
        """100 − the busy share (rounded to 3 decimals, as ``gpu_busy_pct``), 0 without a span."""
        return 100.0 - pct(self.busy_ns, self.span_ns) if self.span_ns else 0.0


class StepMedian(msgspec.Struct, kw_only=True):
    """The trace's host steps (``ProfilerStep#N``): :func:`measure_steps`."""

    where: Where
    count: int
    median_ns: float | None  # None without steps


def measure_device(job: JobData, where: Where, dev: dict) -> DeviceBusy | None:
    """The device's busy time by category over its span, from its GPU operations ``dev``
    (columns device, kind, is_comm, start_ns, end_ns, in start order); None when none of
    them is inside the step scope."""
    scope = step_scope(job, where.trace, int(where.device))
    keep, starts, ends = in_scope(dev["start_ns"], dev["end_ns"], scope)
    if not keep.any():
        return None
    is_kernel = dev["kind"][keep] == "kernel"
    is_comm = np.asarray(dev["is_comm"][keep], dtype=bool)
    lo, hi = span_of(starts, ends, scope)
    gap_starts, gap_ends = idle_gaps(starts, ends, scope)
    longest = np.argsort(gap_starts - gap_ends, kind="stable")[:MAX_WINDOWS]
    return DeviceBusy(
        where=where,
        span_ns=hi - lo,
        stepped=scope is not None,
        busy_ns=intervals.total(starts, ends),
        compute_ns=intervals.total(starts[is_kernel & ~is_comm], ends[is_kernel & ~is_comm]),
        comm_ns=intervals.total(starts[is_kernel & is_comm], ends[is_kernel & is_comm]),
        memcpy_ns=intervals.total(starts[~is_kernel], ends[~is_kernel]),
        kernel_ns=intervals.total(starts[is_kernel], ends[is_kernel]),
        kernel_count=int(is_kernel.sum()),
        gap_count=int(gap_starts.size),
        windows=[[int(gap_starts[i]), int(gap_ends[i])] for i in longest],
        idle_by_cause_ns=attribute_idle(job, where.trace, int(where.device)).totals,
    )


def measure_steps(job: JobData, where: Where) -> StepMedian:
    """How many host steps the trace has and their median duration."""
    steps = job.steps(where.trace)
    durations = steps["end_ns"] - steps["start_ns"]
    median = float(np.median(durations)) if durations.size else None
    return StepMedian(where=where, count=int(durations.size), median_ns=median)


def metrics(m: DeviceBusy) -> list[Metric]:
    """The device's shares of its span (%), kernel count, span and its busy time's exclusive
    parts (ns)."""
    w, span = m.where, m.span_ns
    shares = {
        "gpu_busy_pct": m.busy_ns,
        "compute_pct": m.compute_ns,
        "comm_pct": m.comm_ns,
        "memcpy_pct": m.memcpy_ns,
    }
    out = [Metric(w.trace, w.rank, w.device, n, pct(ns, span), "%") for n, ns in shares.items()]
    out.append(Metric(w.trace, w.rank, w.device, "gpu_idle_pct", round(m.idle_pct, 3), "%"))
    out.append(Metric(w.trace, w.rank, w.device, "kernel_count", m.kernel_count, "count"))
    out.append(Metric(w.trace, w.rank, w.device, "gpu_span_ns", span, "ns"))
    out += [Metric(w.trace, w.rank, w.device, n, ns, "ns") for n, ns in m.exclusive_ns.items()]
    return out


def step_metrics(m: StepMedian) -> list[Metric]:
    """``step_time_ms_median`` and ``step_count`` (none without steps)."""
    if m.median_ns is None:
        return []
    w = m.where
    return [
        Metric(w.trace, w.rank, None, "step_time_ms_median", round(m.median_ns / 1e6, 6), "ms"),
        Metric(w.trace, w.rank, None, "step_count", m.count, "count"),
    ]


def speak(m: DeviceBusy, params: dict[str, float]) -> Finding:
    """An info finding per device: busy/idle shares and the idle time by cause (from gpu_idle).
    ``utilization`` has no thresholds: ``params`` is empty, taken as every analyzer's speak takes it."""
    device, span, idle_pct = m.where.device, m.span_ns, m.idle_pct
    ranked = sorted(
        ((ns, cause) for cause, ns in m.idle_by_cause_ns.items() if ns > 0), reverse=True
    )
    causes = (
        ", ".join(f"{cause} {100 * ns / span:.1f}%" for ns, cause in ranked[:4]) if span else ""
    )
    return Finding(
        analyzer="utilization",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity="info",
        title=f"GPU {device} busy {100 - idle_pct:.1f}%, idle {idle_pct:.1f}% of {span / 1e6:.2f} ms",
        detail=(
            ("Over its profiled steps" if m.stepped else "From its first to its last activity")
            + f" GPU {device} ran kernels or copies for {m.busy_ns / 1e6:.2f} ms "
            f"and sat idle for {m.idle_ns / 1e6:.2f} ms in {m.gap_count} gaps"
            + (f"; idle by cause: {causes}." if causes else ".")
        ),
        recommendation="See the gpu_idle and launch_overhead findings for the causes and their fixes.",
        impact_ns=m.idle_ns,
        evidence={
            "span_ns": span,
            "busy_ns": m.busy_ns,
            "idle_ns": m.idle_ns,
            "gap_count": m.gap_count,
            "idle_by_cause_ns": m.idle_by_cause_ns,
        },
        windows=m.windows,
    )


SPEC = AnalyzerSpec(
    id="utilization",
    order=10,
    per_rank=True,
    title="GPU utilization",
    description="Busy, idle, compute, communication and copy shares of each GPU's profiled span.",
    run=run,
)
