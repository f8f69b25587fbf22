"""``launch_overhead``: GPUs starved by the CPU's kernel-launch path.

Counts launches (runtime ``cudaLaunchKernel*``, driver ``cuLaunchKernel*``,
graph launches, HIP equivalents), compares each kernel's GPU time with the
duration of the API call that launched it, and takes the GPU idle time whose
cause is ``launch`` (see :mod:`stallscope.idle`) as the time lost.

Metrics per trace and device: ``launch_overhead_pct`` (idle time waiting for
launches / span × 100), ``launch_count``, ``graph_launch_count``,
``short_kernel_pct`` (kernels shorter than their launch call, % of kernels).
Documented in docs/analyzers/launch_overhead.md.
"""

from __future__ import annotations

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    graded_severity,
    graded_thresholds,
)
from stallscope.idle import CAUSES, LAUNCH_API_REGEX, attribute_idle
from stallscope.jobdata import JobData
from stallscope.launch_cost import PROFILER_EVENT_NS, graph_saving
from stallscope.scope import scope_sql

THRESHOLDS = (
    *graded_thresholds(
        "idle share of the span waiting for launches",
        "idle time waiting for launches below which nothing is reported",
    ),
    Threshold(
        "graph_replay_us",
        10.0,
        "us",
        "assumed CPU cost of one CUDA Graph replay, for the gain estimate",
    ),
    Threshold(
        "profiler_event_us",
        PROFILER_EVENT_NS / 1000,
        "us",
        "host cost the profiler adds to each recorded operator or API call, taken out of the gain estimate",
    ),
)
MAX_WINDOWS = 20

_STATS_SQL = f"""
WITH launches AS (
  SELECT h.correlation, h.start_ns, h.end_ns, regexp_replace(n.name, '_v[0-9]+$', '') AS api
  FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
  WHERE h.trace_id = ? AND h.kind IN ('runtime', 'driver') AND regexp_matches(n.name, '{LAUNCH_API_REGEX}')
), kernels AS (
  SELECT g.start_ns, g.end_ns, g.correlation FROM gpu g
  WHERE g.trace_id = ? AND g.device = ? AND g.kind = 'kernel' AND {{scope}}
)
SELECT
  (SELECT count(*) FROM kernels) AS kernels,
  count(DISTINCT l.correlation) AS launches,
  count(DISTINCT l.correlation) FILTER (WHERE l.api LIKE '%Graph%') AS graph_launches,
  count(DISTINCT l.correlation) FILTER (WHERE l.api LIKE 'cu%' AND l.api NOT LIKE 'cuda%') AS driver_launches,
  count(*) FILTER (WHERE k.end_ns - k.start_ns < l.end_ns - l.start_ns AND l.api NOT LIKE '%Graph%') AS short_kernels,
  count(*) FILTER (WHERE l.api NOT LIKE '%Graph%') AS single_kernels,
  median(k.end_ns - k.start_ns) AS median_kernel_ns,
  median(l.end_ns - l.start_ns) FILTER (WHERE l.api NOT LIKE '%Graph%') AS median_launch_ns,
  avg(l.end_ns - l.start_ns) FILTER (WHERE l.api LIKE '%Graph%') AS mean_graph_launch_ns
FROM kernels k JOIN launches l ON l.correlation = k.correlation
"""


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    for ref in job.traces:
        rank = int(ref.meta.get("rank", 0))
        steps = job.sql(
            "SELECT count(*) FROM ranges WHERE trace_id = ? AND kind = 'step'", [ref.trace_id]
        ).fetchone()[0]
        for device in job.devices(ref.trace_id):
            _device(job, result, ref.trace_id, rank, int(device), int(steps), params)
    return result


def _device(
    job: JobData, result: AnalyzerResult, trace: str, rank: int, device: int, steps: int, params
) -> None:
    row = job.sql(
        _STATS_SQL.replace("{scope}", scope_sql(job, trace)), [trace, trace, device]
    ).fetchone()
    (
        kernels,
        launches,
        graph_launches,
        driver_launches,
        short,
        single,
        median_kernel,
        median_launch,
        mean_graph,
    ) = row
    attribution = attribute_idle(job, trace, device)
    span = attribution.span_end - attribution.span_start
    if attribution.per_gap.size:
        graph_per_gap = attribution.graph_launch_per_gap
        per_gap = attribution.per_gap[:, CAUSES.index("launch")] - graph_per_gap
    else:
        graph_per_gap = per_gap = attribution.per_gap.reshape(-1)
    waited, graph_wait = int(per_gap.sum()), int(graph_per_gap.sum())
    share = 100.0 * waited / span if span else 0.0
    graph_share = 100.0 * graph_wait / span if span else 0.0
    short_pct = 100.0 * short / single if single else 0.0
    for name, value, unit in (
        ("launch_overhead_pct", round(share, 3), "%"),
        ("graph_launch_wait_pct", round(graph_share, 3), "%"),
        ("launch_count", int(launches), "count"),
        ("graph_launch_count", int(graph_launches), "count"),
        ("short_kernel_pct", round(short_pct, 3), "%"),
    ):
        result.metrics.append(Metric(trace, rank, device, name, value, unit))
    graph = _graph_finding(
        trace,
        rank,
        device,
        attribution,
        graph_per_gap,
        graph_share,
        graph_launches,
        kernels,
        mean_graph,
        params,
    )
    if graph:
        result.findings.append(graph)
    severity = graded_severity(share, waited, params)
    if severity is None:
        return
    what_if = graph_saving(
        job,
        trace,
        device,
        attribution,
        steps,
        replay_ns=int(params["graph_replay_us"] * 1000),
        event_cost_ns=int(params["profiler_event_us"] * 1000),
    )
    gain = what_if.saving_ns
    windows = _windows(attribution, per_gap)
    per_step = f", {launches / steps:.0f} per step" if steps else ""
    result.findings.append(
        Finding(
            analyzer="launch_overhead",
            trace=trace,
            rank=rank,
            device=device,
            severity=severity,
            title=(
                f"GPU {device} starved by kernel launches: idle {share:.1f}% of the time waiting for the CPU"
                if severity in ("critical", "high")
                else f"GPU {device} waited {share:.1f}% of the time for the CPU to launch kernels"
            ),
            detail=(
                f"{launches} launches{per_step} ({driver_launches} through the driver API, {graph_launches} graph "
                f"launches) for {kernels} kernels; {short_pct:.0f}% of kernels ran shorter than the API call that "
                f"launched them (median kernel {_us(median_kernel)} µs, median launch call {_us(median_launch)} µs). "
                f"The GPU waited {waited / 1e6:.2f} ms for the CPU to issue work ({what_if.host_idle_ns / 1e6:.2f} ms "
                "with the operator work between launches). The profiler slows the host, about "
                f"{what_if.event_cost_ns / 1000:.1f} µs per recorded call, which explains an estimated "
                f"{what_if.profiler_ns / 1e6:.2f} ms of that: unprofiled the wait is shorter; time a few steps "
                "without the profiler (torch.cuda.Event) before and after the fix."
            ),
            recommendation=(
                "Capture the steady-state step in a CUDA Graph (torch.compile(mode='reduce-overhead') or "
                "torch.cuda.CUDAGraph) so one launch replays all kernels, and fuse small elementwise ops "
                f"(torch.compile); estimated gain {gain / 1e6:.2f} ms of step time over this trace, unprofiled."
            ),
            impact_ns=waited,
            saving_ns=gain,
            evidence={
                "launches": int(launches),
                "driver_launches": int(driver_launches),
                "graph_launches": int(graph_launches),
                "kernels": int(kernels),
                "short_kernel_pct": round(short_pct, 3),
                "median_kernel_ns": _int(median_kernel),
                "median_launch_ns": _int(median_launch),
                "steps": steps,
                "estimated_gain_ns": gain,
                "host_idle_ns": what_if.host_idle_ns,
                "profiler_overhead_ns": what_if.profiler_ns,
                "share_of_span_pct": round(share, 3),
            },
            windows=windows,
        )
    )


def _windows(attribution, per_gap) -> list[list[int]]:
    order = per_gap.argsort()[::-1][:MAX_WINDOWS]
    return [
        [int(attribution.gap_starts[i]), int(attribution.gap_ends[i])]
        for i in order
        if per_gap[i] > 0
    ]


def _graph_finding(
    trace, rank, device, attribution, per_gap, share, graph_launches, kernels, mean_graph, params
):
    """Waiting inside graph launches: ``info`` only, since CUPTI inflates them while profiling.

    (Not a severity that ``--fail-on low`` gates on: a profiler artifact must not fail CI.)
    """
    waited = int(per_gap.sum())
    if graded_severity(share, waited, params) is None:
        return None
    return Finding(
        analyzer="launch_overhead",
        trace=trace,
        rank=rank,
        device=device,
        severity="info",
        title=f"GPU {device} waited {share:.1f}% of the time for CUDA Graph launches (likely profiler overhead)",
        detail=(
            f"{graph_launches} graph launches took {_us(mean_graph)} µs each on average; the GPU waited "
            f"{waited / 1e6:.2f} ms for them. While profiling, CUPTI adds roughly 1 µs per graph node to every "
            "graph launch, so this wait is mostly an artifact of the profiler; unprofiled, a graph launch costs "
            "microseconds to tens of microseconds."
        ),
        recommendation=(
            "Confirm with an unprofiled step timing (torch.cuda.Event around the step). If the wait is real, "
            "launch the graph earlier (avoid a synchronize right before it so the CPU runs ahead) or split very "
            "large graphs."
        ),
        impact_ns=waited,
        evidence={
            "key": "graph",
            "graph_launches": int(graph_launches),
            "kernels": int(kernels),
            "mean_graph_launch_ns": _int(mean_graph),
            "share_of_span_pct": round(share, 3),
        },
        windows=_windows(attribution, per_gap),
    )


def _int(value) -> int | None:
    return None if value is None else int(value)


def _us(value) -> str:
    return "-" if value is None else f"{value / 1000:.1f}"


SPEC = AnalyzerSpec(
    id="launch_overhead",
    title="Kernel-launch overhead",
    description="GPU time lost waiting for the CPU to launch kernels; launch counts and the CUDA Graphs estimate.",
    run=run,
    thresholds=THRESHOLDS,
)
