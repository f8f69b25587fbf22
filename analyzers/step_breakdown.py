"""``step_breakdown``: each training step's GPU time by category, and step jitter.

Steps are the ``ProfilerStep#N`` ranges. A GPU operation belongs to the step
during which the host *launched* it (correlation id -> launch call -> step),
so a step's GPU window runs from its first GPU operation to the first GPU
operation of the next step; operations without a launch record fall back to
the host step window. Per step and device: compute, communication and copy
time (unions clipped to the window) and idle time by cause (gaps assigned by
where they start). The per-step table is the report's ``steps`` table (typed rows)
and the ``table`` finding's evidence. Documented in docs/analyzers/step_breakdown.md.
"""

from __future__ import annotations

import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import AnalyzerResult, AnalyzerSpec, Finding, Metric, Threshold
from stallscope.host_ops import LAUNCH_CTE
from stallscope.idle import CAUSES, attribute_idle
from stallscope.jobdata import JobData
from stallscope.report_types import StepRow

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
        result.tables.steps.extend(step_rows(ref.trace_id, rank, table))
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
        out.tables.extend(result.tables)
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
    """One row per (step, device): step_ms, GPU ns by category and idle ns by cause.

    Rows of a device sum to its job totals: every idle nanosecond of the step
    scope is in exactly one row (:func:`_idle_per_step`), every GPU operation
    in the row of the step that launched it.
    """
    gpu = job.numpy(
        f"""WITH {LAUNCH_CTE}
           SELECT g.device, g.kind, g.is_comm, g.start_ns, g.end_ns,
                  coalesce(l.launch_ns, g.start_ns) AS launch_ns
           FROM gpu g LEFT JOIN launch l ON l.correlation = g.correlation
           WHERE g.trace_id = $trace AND g.kind IN ('kernel', 'memcpy', 'memset') ORDER BY g.device, g.start_ns""",
        {"trace": trace},
    )
    rows = []
    for device in np.unique(gpu["device"]).tolist():
        dev = {k: np.asarray(v)[gpu["device"] == device] for k, v in gpu.items()}
        owner = _launch_step(dev, steps)
        attribution = attribute_idle(job, trace, int(device))
        idle = _idle_per_step(attribution, steps, dev, owner)
        edges = (attribution.span_start, attribution.span_end)
        for index, number in enumerate(steps["step"].tolist()):
            mine = owner == index
            if not mine.any() and not idle[index].any():
                continue
            row = {
                "step": int(number),
                "device": int(device),
                "step_ms": round((steps["end_ns"][index] - steps["start_ns"][index]) / 1e6, 6),
            }
            row.update(_busy(dev, mine, edges))
            row["window_ns"] = row["busy_ns"] + int(idle[index].sum())
            for c, cause in enumerate(CAUSES):
                row[f"idle_{cause}_ns"] = int(idle[index, c])
            rows.append(row)
    return rows


def step_rows(trace: str, rank: int, table: list[dict]) -> list[StepRow]:
    """The report's ``steps`` rows of one trace: its per-step table (the first
    MAX_STEPS_IN_EVIDENCE rows, as the finding's evidence)."""
    return [StepRow(trace=trace, rank=rank, **row) for row in table[:MAX_STEPS_IN_EVIDENCE]]


def _launch_step(dev: dict, steps: dict) -> np.ndarray:
    """Index of the step whose host range holds each operation's launch call (its own
    start without a launch record: the query's coalesce, since numpy drops SQL NULLs'
    masks); -1 outside every step."""
    return _host_step(steps, dev["launch_ns"].astype(np.int64))


def _host_step(steps: dict, times: np.ndarray) -> np.ndarray:
    """Index of the step range [start, end) that holds each time, -1 where none does."""
    starts, ends = steps["start_ns"], steps["end_ns"]
    index = np.searchsorted(starts, times, side="right") - 1
    inside = (index >= 0) & (times < ends[np.clip(index, 0, None)])
    return np.where(inside, index, -1)


def _idle_per_step(attribution, steps: dict, dev: dict, owner: np.ndarray) -> np.ndarray:
    """[step, cause] idle ns. A piece of idle time belongs to the step the host was in
    at that moment (the step whose range contains its cause: the data-loader wait at
    the start of step N is step N's). Pieces outside every host step (the GPU still
    draining after the host left the last step) go to the step that launched the
    operation ending their gap, else to the last step that started before them."""
    n = steps["step"].size
    idle = np.zeros((n, len(CAUSES)), dtype=np.int64)
    seg = attribution.segments
    if seg is None or seg.start.size == 0:
        return idle
    step = _host_step(steps, seg.start)
    loose = step < 0
    if loose.any():
        gap_end = attribution.gap_ends[seg.gap[loose]]
        nxt = np.searchsorted(dev["start_ns"], gap_end, side="left")
        has = nxt < dev["start_ns"].size
        by_op = np.full(nxt.size, -1, dtype=np.int64)
        by_op[has] = owner[nxt[has]]
        before = np.clip(
            np.searchsorted(steps["start_ns"], seg.start[loose], side="right") - 1, 0, n - 1
        )
        step[loose] = np.where(by_op >= 0, by_op, before)
    np.add.at(idle, (step, seg.label), seg.length)
    return idle


def _busy(dev: dict, mine: np.ndarray, edges: tuple[int, int]) -> dict[str, int]:
    """GPU ns of the operations ``mine`` (one step's), clipped to the measured span."""
    lo, hi = edges
    starts, ends = np.clip(dev["start_ns"][mine], lo, hi), np.clip(dev["end_ns"][mine], lo, hi)
    kernel = dev["kind"][mine] == "kernel"
    comm = np.asarray(dev["is_comm"][mine], dtype=bool)
    return {
        "compute_ns": intervals.total(starts[kernel & ~comm], ends[kernel & ~comm]),
        "comm_ns": intervals.total(starts[kernel & comm], ends[kernel & comm]),
        "memcpy_ns": intervals.total(starts[~kernel], ends[~kernel]),
        "busy_ns": intervals.total(starts, ends),
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
        saving_ns=excess,
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
