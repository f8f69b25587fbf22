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

import msgspec
import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
)
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
        m = measure_trace(job, Where(ref.trace_id, int(ref.meta.get("rank", 0))))
        if m is None:
            continue
        result.metrics.extend(metrics(m))
        result.tables.steps.extend(step_rows(m))
        for finding in speak(m, params):
            (jitters if finding.evidence["key"] == "jitter" else result.findings).append(finding)
    if jitters:
        result.findings.append(_one_jitter_per_job(jitters))
    return result


class StepTimes(msgspec.Struct, kw_only=True):
    """The durations of one trace's host steps (``ProfilerStep#N`` ranges), ns:
    :func:`measure_step_times`."""

    count: int
    median_ns: float
    p90_ns: float  # numpy's linear percentile
    max_ns: int
    excess_ns: int  # Σ (duration − median) over the steps slower than the median
    slowest: list[list[int]]  # [start, end] of up to 20 steps slower than the median, slowest first

    @property
    def p90_over_median(self) -> float:
        """p90 / median (unrounded; 0 at a 0 median)."""
        return self.p90_ns / self.median_ns if self.median_ns else 0.0


class TraceSteps(msgspec.Struct, kw_only=True):
    """One trace's steps: their times and the per-step table (:func:`measure_trace`).
    No prose: :func:`speak_jitter` and :func:`speak_table` write the findings from it."""

    where: Where  # the trace (no device: the rows carry theirs)
    times: StepTimes
    rows: list[StepRow]  # one per (device, step) with GPU work or idle time, every one

    @property
    def step_count(self) -> int:
        """How many steps have a row."""
        return len({row.step for row in self.rows})


def measure_trace(job: JobData, where: Where) -> TraceSteps | None:
    """The trace's step times and per-step table; None when it has no steps."""
    steps = job.steps(where.trace)
    if steps["step"].size == 0:
        return None
    return TraceSteps(
        where=where, times=measure_step_times(steps), rows=_per_step_rows(job, where, steps)
    )


def measure_step_times(steps: dict) -> StepTimes:
    """Median, p90, max and the excess over the median of ``steps`` (columns step,
    start_ns, end_ns; at least one step)."""
    durations = steps["end_ns"] - steps["start_ns"]
    median = float(np.median(durations))
    slow = np.flatnonzero(durations > median)
    worst = slow[np.argsort(-durations[slow])][:20]
    return StepTimes(
        count=int(durations.size),
        median_ns=median,
        p90_ns=float(np.percentile(durations, 90)),
        max_ns=int(durations.max()),
        excess_ns=int((durations[slow] - median).sum()),
        slowest=[[int(steps["start_ns"][i]), int(steps["end_ns"][i])] for i in worst],
    )


def metrics(m: TraceSteps) -> list[Metric]:
    """The trace's step-time metrics: p90, max, and max over median (None at a 0 median)."""
    t, w = m.times, m.where
    ratio = round(float(t.max_ns) / t.median_ns, 4) if t.median_ns else None
    return [
        Metric(w.trace, w.rank, None, "step_time_ms_p90", round(t.p90_ns / 1e6, 6), "ms"),
        Metric(w.trace, w.rank, None, "step_time_ms_max", round(float(t.max_ns) / 1e6, 6), "ms"),
        Metric(w.trace, w.rank, None, "step_time_max_over_median", ratio, "ratio"),
    ]


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


def _per_step_rows(job: JobData, where: Where, steps: dict) -> list[StepRow]:
    """One row per (device, step): step_ms, GPU ns by category and idle ns by cause.

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
        {"trace": where.trace},
    )
    rows = []
    for device in np.unique(gpu["device"]).tolist():
        dev = {k: np.asarray(v)[gpu["device"] == device] for k, v in gpu.items()}
        rows.extend(_device_rows(job, Where(where.trace, where.rank, int(device)), steps, dev))
    return rows


def _device_rows(job: JobData, where: Where, steps: dict, dev: dict) -> list[StepRow]:
    """The rows of one device, whose GPU operations are ``dev`` (columns of the query
    above), in step order; steps with neither its work nor its idle time have none."""
    owner = _launch_step(dev, steps)
    attribution = attribute_idle(job, where.trace, int(where.device))
    idle = _idle_per_step(attribution, steps, dev, owner)
    edges = (attribution.span_start, attribution.span_end)
    rows = []
    rows_of = rows_by_step(owner, steps["step"].size)
    for index, number in enumerate(steps["step"].tolist()):
        mine = rows_of[index]
        if not mine.size and not idle[index].any():
            continue
        busy = _busy(dev, mine, edges)
        rows.append(
            StepRow(
                trace=where.trace,
                rank=where.rank,
                device=where.device,
                step=int(number),
                step_ms=round((steps["end_ns"][index] - steps["start_ns"][index]) / 1e6, 6),
                window_ns=busy["busy_ns"] + int(idle[index].sum()),
                **busy,
                **{f"idle_{cause}_ns": int(idle[index, c]) for c, cause in enumerate(CAUSES)},
            )
        )
    return rows


def step_rows(m: TraceSteps) -> list[StepRow]:
    """The report's ``steps`` rows of one trace: the first MAX_STEPS_IN_EVIDENCE rows
    of its per-step table (as the findings' evidence)."""
    return m.rows[:MAX_STEPS_IN_EVIDENCE]


def evidence_rows(m: TraceSteps) -> list[dict]:
    """The per-step table as the findings' evidence holds it (the rows of the ``steps``
    table without trace and rank, keys in the table's documented order)."""
    return [_evidence_row(row) for row in step_rows(m)]


def _evidence_row(row: StepRow) -> dict:
    out = {"step": row.step, "device": row.device, "step_ms": row.step_ms}
    for name in ("compute_ns", "comm_ns", "memcpy_ns", "busy_ns", "window_ns"):
        out[name] = getattr(row, name)
    for cause in CAUSES:
        out[f"idle_{cause}_ns"] = getattr(row, f"idle_{cause}_ns")
    return out


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


def rows_by_step(owner: np.ndarray, n: int) -> list[np.ndarray]:
    """Per step index in [0, n): the rows (operations) whose ``owner`` it is, in row order.

    One stable sort for all steps: a mask over every operation per step cost
    operations x steps, the square of a trace's length when its steps are kept.
    """
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(n + 1), side="left")
    return [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _busy(dev: dict, mine: np.ndarray, edges: tuple[int, int]) -> dict[str, int]:
    """GPU ns of the operations ``mine`` (one step's rows), clipped to the measured span."""
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


def speak(m: TraceSteps, params: dict[str, float]) -> list[Finding]:
    """The trace's findings: its jitter finding, if any (``run`` keeps one per job:
    :func:`_one_jitter_per_job`), and the per-step table."""
    jitter = speak_jitter(m, params)
    return [*([jitter] if jitter else []), speak_table(m)]


def speak_jitter(m: TraceSteps, params: dict[str, float]) -> Finding | None:
    """The jitter finding of one trace, graded by p90 / median; None under ``min_steps``
    steps, at a 0 median, or below ``jitter_low``."""
    t, w = m.times, m.where
    if t.count < params["min_steps"] or not t.median_ns:
        return None
    ratio = t.p90_over_median
    severity = next(
        (lvl for lvl in ("high", "medium", "low") if ratio >= params[f"jitter_{lvl}"]), None
    )
    if severity is None:
        return None
    median, p90 = t.median_ns, t.p90_ns
    return Finding(
        analyzer="step_breakdown",
        trace=w.trace,
        rank=w.rank,
        device=None,
        severity=severity,
        title=f"Step time varies: p90 is {ratio:.2f}x the median",
        detail=(
            f"{t.count} steps: median {median / 1e6:.2f} ms, p90 {p90 / 1e6:.2f} ms, max {t.max_ns / 1e6:.2f} ms. "
            f"Steps slower than the median took {t.excess_ns / 1e6:.2f} ms more in total."
        ),
        recommendation=(
            "Compare a slow step with a typical one (windows): look for periodic work (evaluation, checkpointing, "
            "logging, garbage collection, data-loader hiccups) or variable input sizes, and move it off the step "
            "or make it asynchronous."
        ),
        impact_ns=t.excess_ns,
        saving_ns=t.excess_ns,
        evidence={
            "key": "jitter",
            "median_ns": int(median),
            "p90_ns": int(p90),
            "p90_over_median": round(ratio, 4),
            "steps": evidence_rows(m),
        },
        windows=t.slowest,
    )


def speak_table(m: TraceSteps) -> Finding:
    """The ``info`` finding that carries the trace's per-step table."""
    n, median, p90 = m.step_count, m.times.median_ns, m.times.p90_ns
    return Finding(
        analyzer="step_breakdown",
        trace=m.where.trace,
        rank=m.where.rank,
        device=None,
        severity="info",
        title=f"Step breakdown: {n} step{'s' if n != 1 else ''}, median {median / 1e6:.2f} ms",
        detail=f"Per step and GPU: compute, communication, copies and idle time by cause (median step {median / 1e6:.2f} ms, p90 {p90 / 1e6:.2f} ms).",
        recommendation="Use the per-step table to see which category grows in slow steps.",
        impact_ns=0,
        evidence={"key": "table", "steps": evidence_rows(m)},
    )


SPEC = AnalyzerSpec(
    id="step_breakdown",
    order=40,
    per_rank=True,
    title="Step breakdown and jitter",
    description="Per-step GPU compute, communication, copies and idle time by cause; step-time jitter.",
    run=run,
    thresholds=THRESHOLDS,
    combine_ranks=combine_ranks,
)
