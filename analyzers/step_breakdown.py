"""``step_breakdown``: each training step's GPU time by category, and step jitter.

Steps are the ``ProfilerStep#N`` ranges. A GPU operation belongs to the step
during which the host *launched* it (correlation id -> launch call -> step),
so a step's GPU window runs from its first GPU operation to the first GPU
operation of the next step; operations without a launch record fall back to
the host step window. Per step and device: compute, communication and copy
time (unions clipped to the window) and idle time by cause (gaps assigned by
where they start). Documented in docs/analyzers/step_breakdown.md.
"""

from __future__ import annotations

import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import AnalyzerResult, AnalyzerSpec, Finding, Metric, Threshold
from stallscope.idle import CAUSES, attribute_idle
from stallscope.jobdata import JobData

THRESHOLDS = (
    Threshold(
        "jitter_low",
        1.2,
        "x",
        "p90 / median step time for a low-severity jitter finding",
        minimum=1,
    ),
    Threshold(
        "jitter_medium",
        1.5,
        "x",
        "p90 / median step time for a medium-severity jitter finding",
        minimum=1,
    ),
    Threshold(
        "jitter_high",
        2.0,
        "x",
        "p90 / median step time for a high-severity jitter finding",
        minimum=1,
    ),
    Threshold("min_steps", 5, "steps", "fewest steps for a jitter finding", minimum=2),
)
MAX_STEPS_IN_EVIDENCE = 200


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    jitters: list[Finding] = []
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        steps = job.numpy(
            "SELECT step, start_ns, end_ns FROM ranges WHERE trace_id = ? AND kind = 'step' ORDER BY start_ns",
            [ref.trace_id],
        )
        if steps["step"].size == 0:
            continue
        durations = steps["end_ns"] - steps["start_ns"]
        median = float(np.median(durations))
        p90 = float(np.percentile(durations, 90))
        for name, value, unit in (
            ("step_time_ms_p90", round(p90 / 1e6, 6), "ms"),
            ("step_time_ms_max", round(float(durations.max()) / 1e6, 6), "ms"),
            (
                "step_time_max_over_median",
                round(float(durations.max()) / median, 4) if median else None,
                "ratio",
            ),
        ):
            result.metrics.append(Metric(ref.trace_id, rank, None, name, value, unit))
        table = _per_step_table(job, ref.trace_id, steps)
        jitter = _jitter_finding(ref.trace_id, rank, steps, durations, median, p90, params)
        if jitter:
            jitter.evidence["steps"] = table[:MAX_STEPS_IN_EVIDENCE]
            jitters.append(jitter)
        result.findings.append(_table_finding(ref.trace_id, rank, table, median, p90))
    if jitters:
        result.findings.append(_one_jitter_per_job(jitters))
    return result


def combine_ranks(results: list[AnalyzerResult]) -> AnalyzerResult:
    """The job's result from each rank's alone (``run`` over one rank's traces, in rank
    order): the same as ``run`` over the job, whose one jitter finding names them all."""
    out = AnalyzerResult()
    jitters = []
    for result in results:
        out.metrics.extend(result.metrics)
        for finding in result.findings:
            is_jitter = finding.evidence.get("key") == "jitter"
            (jitters if is_jitter else out.findings).append(finding)
    if jitters:
        out.findings.append(_one_jitter_per_job(jitters))
    return out


def _one_jitter_per_job(jitters: list[Finding]) -> Finding:
    """The worst rank's jitter finding, naming the others: in a synchronous job every rank
    runs at the pace of the slowest, so the same jitter shows on each."""
    worst = max(jitters, key=lambda f: (f.evidence["p90_over_median"], -f.rank))
    if len(jitters) > 1:
        others = sorted((f for f in jitters if f is not worst), key=lambda f: f.rank)
        worst.detail += (
            " The same shows on rank(s) "
            + ", ".join(f"{f.rank} ({f.evidence['p90_over_median']:.2f}x)" for f in others)
            + ": in a synchronous job every rank steps at the pace of the slowest."
        )
        worst.evidence["other_ranks"] = [
            {"rank": f.rank, "p90_over_median": f.evidence["p90_over_median"]} for f in others
        ]
    return worst


def _per_step_table(job: JobData, trace: str, steps: dict) -> list[dict]:
    """One row per (step, device): step_ms and GPU ns by category."""
    gpu = job.numpy(
        """SELECT g.device, g.kind, g.is_comm, g.start_ns, g.end_ns, h.start_ns AS launch_ns
           FROM gpu g LEFT JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation
             AND h.kind IN ('runtime', 'driver')
           WHERE g.trace_id = ? AND g.kind IN ('kernel', 'memcpy', 'memset') ORDER BY g.device, g.start_ns""",
        [trace],
    )
    step_starts, step_ends, numbers = steps["start_ns"], steps["end_ns"], steps["step"]
    rows = []
    for device in np.unique(gpu["device"]).tolist():
        dev = {k: np.asarray(v)[gpu["device"] == device] for k, v in gpu.items()}
        anchor = np.where(
            np.isnan(dev["launch_ns"].astype(float)), dev["start_ns"], dev["launch_ns"]
        ).astype(np.int64)
        owner = np.searchsorted(step_starts, anchor, side="right") - 1
        inside = (owner >= 0) & (anchor < step_ends[np.clip(owner, 0, None)])
        attribution = attribute_idle(job, trace, int(device))
        edges = (attribution.span_start, attribution.span_end)
        gap_step = _window_of(attribution.gap_starts, dev, owner, inside, edges)
        for index, number in enumerate(numbers.tolist()):
            mask = inside & (owner == index)
            if not mask.any():
                continue
            lo, hi = _window(dev, owner, inside, index, edges)
            row = {
                "step": int(number),
                "device": int(device),
                "step_ms": round((step_ends[index] - step_starts[index]) / 1e6, 6),
            }
            row.update(_busy(dev, lo, hi))
            idle = (
                attribution.per_gap[gap_step == index].sum(axis=0)
                if attribution.per_gap.size
                else None
            )
            for c, cause in enumerate(CAUSES):
                row[f"idle_{cause}_ns"] = int(idle[c]) if idle is not None else 0
            rows.append(row)
    return rows


def _window(
    dev: dict, owner: np.ndarray, inside: np.ndarray, index: int, edges: tuple[int, int]
) -> tuple[int, int]:
    """The GPU window of step ``index``: its first operation to the next step's first.

    The last window reaches the end of the device's measured span (``edges``,
    the step scope: the idle time after the last step's work while its host
    step ran). The idle time before the first step's first operation stays
    outside every window: as each window holds the wait *after* its step's
    work, that wait belongs to the step before, which was not profiled.
    """
    starts = dev["start_ns"]
    mine = inside & (owner == index)
    lo = int(starts[mine].min())
    later = inside & (owner > index)
    hi = (
        int(starts[later].min())
        if later.any()
        else max(int(dev["end_ns"][mine].max()), int(edges[1]))
    )
    return lo, hi


def _window_of(
    gap_starts: np.ndarray, dev: dict, owner: np.ndarray, inside: np.ndarray, edges: tuple[int, int]
) -> np.ndarray:
    """Step index of each gap (by where it starts), -1 outside every step window."""
    result = np.full(gap_starts.size, -1, dtype=np.int64)
    for index in range(int(owner.max()) + 1 if owner.size else 0):
        if not (inside & (owner == index)).any():
            continue
        lo, hi = _window(dev, owner, inside, index, edges)
        result[(gap_starts >= lo) & (gap_starts < hi)] = index
    return result


def _busy(dev: dict, lo: int, hi: int) -> dict[str, int]:
    starts, ends = np.clip(dev["start_ns"], lo, hi), np.clip(dev["end_ns"], lo, hi)
    kernel = dev["kind"] == "kernel"
    comm = np.asarray(dev["is_comm"], dtype=bool)
    return {
        "compute_ns": intervals.total(starts[kernel & ~comm], ends[kernel & ~comm]),
        "comm_ns": intervals.total(starts[kernel & comm], ends[kernel & comm]),
        "memcpy_ns": intervals.total(starts[~kernel], ends[~kernel]),
        "busy_ns": intervals.total(starts, ends),
        "window_ns": hi - lo,
    }


def _jitter_finding(trace, rank, steps, durations, median, p90, params) -> Finding | None:
    if durations.size < params["min_steps"] or not median:
        return None
    ratio = p90 / median
    severity = next(
        (lvl for lvl in ("high", "medium", "low") if ratio >= params[f"jitter_{lvl}"]), None
    )
    if severity is None:
        return None
    slow = np.flatnonzero(durations > median)
    excess = int((durations[slow] - median).sum())
    worst = slow[np.argsort(-durations[slow])][:20]
    return Finding(
        analyzer="step_breakdown",
        trace=trace,
        rank=rank,
        device=None,
        severity=severity,
        title=f"Step time varies: p90 is {ratio:.2f}x the median",
        detail=(
            f"{durations.size} steps: median {median / 1e6:.2f} ms, p90 {p90 / 1e6:.2f} ms, max {durations.max() / 1e6:.2f} ms. "
            f"Steps slower than the median took {excess / 1e6:.2f} ms more in total."
        ),
        recommendation=(
            "Compare a slow step with a typical one (windows): look for periodic work (evaluation, checkpointing, "
            "logging, garbage collection, data-loader hiccups) or variable input sizes, and move it off the step "
            "or make it asynchronous."
        ),
        impact_ns=excess,
        evidence={
            "key": "jitter",
            "median_ns": int(median),
            "p90_ns": int(p90),
            "p90_over_median": round(ratio, 4),
        },
        windows=[[int(steps["start_ns"][i]), int(steps["end_ns"][i])] for i in worst],
    )


def _table_finding(trace: str, rank: int, table: list[dict], median: float, p90: float) -> Finding:
    steps = sorted({row["step"] for row in table})
    return Finding(
        analyzer="step_breakdown",
        trace=trace,
        rank=rank,
        device=None,
        severity="info",
        title=f"Step breakdown: {len(steps)} step{'s' if len(steps) != 1 else ''}, median {median / 1e6:.2f} ms",
        detail=f"Per step and GPU: compute, communication, copies and idle time by cause (median step {median / 1e6:.2f} ms, p90 {p90 / 1e6:.2f} ms).",
        recommendation="Use the per-step table to see which category grows in slow steps.",
        impact_ns=0,
        evidence={"key": "table", "steps": table[:MAX_STEPS_IN_EVIDENCE]},
    )


SPEC = AnalyzerSpec(
    id="step_breakdown",
    title="Step breakdown and jitter",
    description="Per-step GPU compute, communication, copies and idle time by cause; step-time jitter.",
    run=run,
    thresholds=THRESHOLDS,
    combine_ranks=combine_ranks,
)
