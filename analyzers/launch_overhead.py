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

import msgspec

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
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
        steps = job.steps(ref.trace_id)["start_ns"].size
        for device in job.devices(ref.trace_id):
            where = Where(ref.trace_id, rank, int(device))
            m = measure_device(job, where, steps=int(steps), params=params)
            result.metrics.extend(metrics(m))
            result.findings.extend(speak(m, params))
    return result


class LaunchStats(msgspec.Struct, kw_only=True):
    """One device's launch path and the GPU idle time waiting on it: :func:`measure_device`.

    Counts are over the device's kernels in the step scope joined to their
    launch calls; ns on the trace's clock. No prose: :func:`speak` writes the
    findings from it.
    """

    where: Where
    steps: int  # ProfilerStep ranges of the trace
    kernels: int
    launches: int  # distinct launch calls (graph launches included)
    graph_launches: int
    driver_launches: int
    short_kernels: int  # kernels shorter than their (non-graph) launch call
    single_kernels: int  # kernels launched one by one (not by a graph launch)
    median_kernel_ns: float | None
    median_launch_ns: float | None  # of non-graph launch calls
    mean_graph_launch_ns: float | None
    span_ns: int  # the idle attribution's span
    waited_ns: int  # idle time whose cause is launch, graph launches excluded
    graph_wait_ns: int  # idle time inside graph launches
    gain_ns: (
        int  # estimated saving of capturing the step in a CUDA Graph (launch_cost.graph_saving)
    )
    host_idle_ns: int  # launch + cpu idle of the gaps with launch time: what a replay replaces
    profiler_ns: int  # of host_idle_ns, what the profiler's host cost explains
    event_cost_ns: int  # the per-event profiler cost assumed
    host_slowdown: float  # the host's pace against the calibration capture (launch_cost)
    inner_gap_ns: int | None  # 10th percentile of in-operator gaps (reported, not used)
    host_busy_ns: int | None  # the launching threads' own time over the span (launch_cost.HostWork)
    host_work_ns: int | None  # that recorded work unprofiled, by the host-work model
    gain_upper_ns: int  # the saving with the per-event cost alone (no slowdown)
    windows: list[list[int]]  # the longest waits for launches
    graph_windows: list[list[int]]  # the longest waits inside graph launches

    @property
    def share_pct(self) -> float:
        return 100.0 * self.waited_ns / self.span_ns if self.span_ns else 0.0

    @property
    def graph_share_pct(self) -> float:
        return 100.0 * self.graph_wait_ns / self.span_ns if self.span_ns else 0.0

    @property
    def short_kernel_pct(self) -> float:
        return 100.0 * self.short_kernels / self.single_kernels if self.single_kernels else 0.0


def measure_device(job: JobData, where: Where, *, steps: int, params: dict) -> LaunchStats:
    """Launch counts and the launch wait of one device (``steps``: the trace's step count)."""
    trace, device = where.trace, where.device
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
    if attribution.per_gap.size:
        graph_per_gap = attribution.graph_launch_per_gap
        per_gap = attribution.per_gap[:, CAUSES.index("launch")] - graph_per_gap
    else:
        graph_per_gap = per_gap = attribution.per_gap.reshape(-1)
    waited = int(per_gap.sum())
    what_if = graph_saving(
        job,
        trace,
        device,
        attribution,
        steps,
        replay_ns=int(params["graph_replay_us"] * 1000),
        event_cost_ns=int(params["profiler_event_us"] * 1000),
    )
    return LaunchStats(
        where=where,
        steps=steps,
        kernels=kernels,
        launches=launches,
        graph_launches=graph_launches,
        driver_launches=driver_launches,
        short_kernels=short,
        single_kernels=single,
        median_kernel_ns=median_kernel,
        median_launch_ns=median_launch,
        mean_graph_launch_ns=mean_graph,
        span_ns=attribution.span_end - attribution.span_start,
        waited_ns=waited,
        graph_wait_ns=int(graph_per_gap.sum()),
        gain_ns=what_if.saving_ns,
        host_idle_ns=what_if.host_idle_ns,
        profiler_ns=what_if.profiler_ns,
        event_cost_ns=what_if.event_cost_ns,
        host_slowdown=what_if.slowdown,
        inner_gap_ns=what_if.inner_gap_ns,
        host_busy_ns=what_if.host_busy_ns,
        host_work_ns=what_if.host_work_ns,
        gain_upper_ns=what_if.upper_ns,
        windows=_windows(attribution, per_gap),
        graph_windows=_windows(attribution, graph_per_gap),
    )


def metrics(m: LaunchStats) -> list[Metric]:
    w = m.where
    return [
        Metric(w.trace, w.rank, w.device, name, value, unit)
        for name, value, unit in (
            ("launch_overhead_pct", round(m.share_pct, 3), "%"),
            ("graph_launch_wait_pct", round(m.graph_share_pct, 3), "%"),
            ("launch_count", int(m.launches), "count"),
            ("graph_launch_count", int(m.graph_launches), "count"),
            ("short_kernel_pct", round(m.short_kernel_pct, 3), "%"),
        )
    ]


def speak(m: LaunchStats, params: dict) -> list[Finding]:
    """The graph-launch finding (when its wait is material), then the launch-wait finding."""
    graph = _graph_finding(m, params)
    findings = [graph] if graph else []
    share, waited = m.share_pct, m.waited_ns
    severity = graded_severity(share, waited, params)
    if severity is None:
        return findings
    device, steps, launches, gain = m.where.device, m.steps, m.launches, m.gain_ns
    per_step = f", {launches / steps:.0f} per step" if steps else ""
    findings.append(
        Finding(
            analyzer="launch_overhead",
            trace=m.where.trace,
            rank=m.where.rank,
            device=device,
            severity=severity,
            title=(
                f"GPU {device} starved by kernel launches: idle {share:.1f}% of the time waiting for the CPU"
                if severity in ("critical", "high")
                else f"GPU {device} waited {share:.1f}% of the time for the CPU to launch kernels"
            ),
            detail=(
                f"{launches} launches{per_step} ({m.driver_launches} through the driver API, {m.graph_launches} graph "
                f"launches) for {m.kernels} kernels; {m.short_kernel_pct:.0f}% of kernels ran shorter than the API call that "
                f"launched them (median kernel {_us(m.median_kernel_ns)} µs, median launch call {_us(m.median_launch_ns)} µs). "
                f"The GPU waited {waited / 1e6:.2f} ms for the CPU to issue work ({m.host_idle_ns / 1e6:.2f} ms "
                f"with the operator work between launches). {_profiler_sentence(m)} Unprofiled the wait is "
                "shorter; time a few steps without the profiler (torch.cuda.Event) before and after the fix."
            ),
            recommendation=(
                "Capture the steady-state step in a CUDA Graph (torch.compile(mode='reduce-overhead') or "
                "torch.cuda.CUDAGraph) so one launch replays all kernels, and fuse small elementwise ops "
                f"(torch.compile); estimated gain {gain / 1e6:.2f} ms{_upper(m)} of step time over this trace, "
                "unprofiled."
            ),
            impact_ns=waited,
            saving_ns=gain,
            evidence={
                "launches": int(launches),
                "driver_launches": int(m.driver_launches),
                "graph_launches": int(m.graph_launches),
                "kernels": int(m.kernels),
                "short_kernel_pct": round(m.short_kernel_pct, 3),
                "median_kernel_ns": _int(m.median_kernel_ns),
                "median_launch_ns": _int(m.median_launch_ns),
                "steps": steps,
                "estimated_gain_ns": gain,
                "host_idle_ns": m.host_idle_ns,
                "profiler_overhead_ns": m.profiler_ns,
                "host_slowdown": m.host_slowdown,
                "inner_gap_ns": m.inner_gap_ns,
                "host_busy_ns": m.host_busy_ns,
                "host_work_ns": m.host_work_ns,
                "saving_upper_ns": m.gain_upper_ns,
                "share_of_span_pct": round(share, 3),
            },
            windows=m.windows,
        )
    )
    return findings


def _profiler_sentence(m: LaunchStats) -> str:
    """What the profiler's cost explains, and, on a slowed host, what the trace cannot tell."""
    cost = f"{m.event_cost_ns / 1000:.1f} µs per recorded call"
    if m.host_slowdown <= 1.0:
        return (
            f"The profiler slows the host, about {cost}, which explains an estimated "
            f"{m.profiler_ns / 1e6:.2f} ms of that."
        )
    return (
        f"The launching threads were busy {_ms(m.host_busy_ns)} ms over this trace, {m.host_slowdown:.1f}× what "
        f"their recorded work ({_ms(m.host_work_ns)} ms unprofiled by the calibrated host-work model) and "
        f"{cost} explain: the profiler slowed the host further (CUPTI's callbacks run inside every CUDA call, "
        "library calls included), or this CPU is slower than the calibration host; the trace cannot tell "
        f"which. Taking the slowdown as the profiler's, it explains an estimated {m.profiler_ns / 1e6:.2f} ms "
        f"of that; taking only the per-call cost, the gain would be up to {m.gain_upper_ns / 1e6:.2f} ms."
    )


def _ms(value) -> str:
    return "?" if value is None else f"{value / 1e6:.1f}"


def _upper(m: LaunchStats) -> str:
    return f" (up to {m.gain_upper_ns / 1e6:.2f} ms)" if m.gain_upper_ns > m.gain_ns else ""


def _windows(attribution, per_gap) -> list[list[int]]:
    order = per_gap.argsort()[::-1][:MAX_WINDOWS]
    return [
        [int(attribution.gap_starts[i]), int(attribution.gap_ends[i])]
        for i in order
        if per_gap[i] > 0
    ]


def _graph_finding(m: LaunchStats, params: dict) -> Finding | None:
    """Waiting inside graph launches: ``info`` only, since CUPTI inflates them while profiling.

    (Not a severity that ``--fail-on low`` gates on: a profiler artifact must not fail CI.)
    """
    waited, share, device = m.graph_wait_ns, m.graph_share_pct, m.where.device
    if graded_severity(share, waited, params) is None:
        return None
    return Finding(
        analyzer="launch_overhead",
        trace=m.where.trace,
        rank=m.where.rank,
        device=device,
        severity="info",
        title=f"GPU {device} waited {share:.1f}% of the time for CUDA Graph launches (likely profiler overhead)",
        detail=(
            f"{m.graph_launches} graph launches took {_us(m.mean_graph_launch_ns)} µs each on average; the GPU waited "
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
            "graph_launches": int(m.graph_launches),
            "kernels": int(m.kernels),
            "mean_graph_launch_ns": _int(m.mean_graph_launch_ns),
            "share_of_span_pct": round(share, 3),
        },
        windows=m.graph_windows,
    )


def _int(value) -> int | None:
    return None if value is None else int(value)


def _us(value) -> str:
    return "-" if value is None else f"{value / 1000:.1f}"


SPEC = AnalyzerSpec(
    id="launch_overhead",
    order=30,
    per_rank=True,
    title="Kernel-launch overhead",
    description="GPU time lost waiting for the CPU to launch kernels; launch counts and the CUDA Graphs estimate.",
    run=run,
    thresholds=THRESHOLDS,
)
