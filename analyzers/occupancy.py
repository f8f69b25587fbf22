"""``occupancy``: kernels that matter running at low occupancy, why, whether it hurts, the fix.

Per trace and device, kernels are grouped by launch signature (name, grid,
block, registers, shared memory). For each group: **theoretical occupancy**
from the launch configuration and the device limits
(:mod:`stallscope.gpu_specs`), the **limiter** (registers, shared memory,
warps or blocks per SM), **waves** per SM and the idle tail; Kineto's
``est. achieved occupancy %`` is shown as what it is (a grid-capped
estimate). When Nsight Compute results of the kernel are in the job
(:mod:`stallscope.ncu_metrics`): achieved occupancy, ncu's limiter, the top
warp-stall reasons, compute/memory speed-of-light and the **bound**
(compute, memory, latency), a roofline point; "not measured" where a section
is missing. A job of ncu results alone is analysed the same way, weighted by
ncu's kernel durations.

A finding is raised for a kernel with at least ``min_share_pct`` of the
device's kernel time whose theoretical occupancy is below ``low_pct``, or
whose achieved occupancy is ``achieved_gap_pts`` below theoretical, unless
ncu shows it at ``near_sol_pct`` of a throughput peak (then it is bound by
that unit, not by occupancy). Time lost (estimate) = kernel time x (1 -
max(occupancy / target, speed-of-light / 100)). Without ncu, tuned library
kernels (cuBLAS ``nvjet``, CUTLASS, cuDNN, flash attention) get one ``info``
finding that claims no time: they trade occupancy for tile size by design,
and a healthy run must pass ``--fail-on low``.

Metrics per trace and device: ``occupancy_weighted_pct`` (GPU-time-weighted
theoretical occupancy of compute kernels), ``low_occupancy_time_pct``,
``achieved_occupancy_weighted_pct`` (ncu). docs/analyzers/occupancy.md.

Measure, then speak (docs/architecture.md): :func:`measure` returns a typed
:class:`DeviceOccupancy` per device; :func:`metrics`, :func:`occupancy_rows` and
:func:`speak` read only it.
"""

from __future__ import annotations

import hashlib
import math
import re

import msgspec

from stallscope.analyzers.base import (
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
    graded_severity,
)
from stallscope.gpu_specs import (
    DeviceLimits,
    Occupancy,
    device_limits,
    occupancy,
    regs_for_blocks,
    smem_for_blocks,
    tail_idle_pct,
    waves,
)
from stallscope.jobdata import JobData
from stallscope.kernel_names import kernel_base_name
from stallscope.ncu_metrics import HOW_TO_MEASURE, Profile, profiles
from stallscope.report_types import OccupancyRow

THRESHOLDS = (
    Threshold("low_pct", 50.0, "%", "theoretical occupancy below this is low (and the target of the gain estimate)", maximum=100),
    Threshold("achieved_gap_pts", 20.0, "points", "achieved occupancy (Nsight Compute) this far below theoretical is flagged", maximum=100),
    Threshold("min_share_pct", 5.0, "%", "share of the device's kernel time a kernel needs to be considered", maximum=100),
    Threshold("near_sol_pct", 60.0, "%", "compute or memory throughput (% of peak, Nsight Compute) at which a kernel is bound by it, not by occupancy", maximum=100),
    Threshold("loss_pct_low", 2.0, "%", "estimated time lost, % of the device's kernel time, for a low-severity finding", maximum=100),
    Threshold("loss_pct_medium", 5.0, "%", "estimated time lost for a medium-severity finding", maximum=100),
    Threshold("loss_pct_high", 15.0, "%", "estimated time lost for a high-severity finding (the highest this analyzer gives)", maximum=100),
    Threshold("min_impact_ms", 0.5, "ms", "estimated time lost below which nothing is reported"),
)  # fmt: skip
TABLE_ROWS = 20
MAX_WINDOWS = 20
LIBRARY_KERNEL = re.compile(
    r"(?i)nvjet|cutlass|cublas|xmma|gemm|gemv|^bmm_|cudnn|flash|fmha|wgmma|tensorop|_mma_|trtllm"
    r"|^(ampere|volta|turing|hopper)_|(^|_)sm\d{2,3}[af]?(_|$)"
)
_OPTIONAL = (
    "est_occupancy_pct",
    "static_shared_mem_bytes",
    "dynamic_shared_mem_bytes",
    "shared_mem_bytes",
)


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    """Measure every device's kernels (:func:`measure`), then write the metrics, findings and
    ``occupancy`` table rows from those measurements alone."""
    result = AnalyzerResult()
    for m in measure(job, params):
        result.metrics.extend(metrics(m))
        result.findings.extend(speak(m, params))
        result.tables.occupancy.extend(occupancy_rows(m))
    return result


# -- what is measured --------------------------------------------------------------------
class KernelOccupancy(msgspec.Struct, kw_only=True):
    """One kernel signature (name, grid, block, registers, shared memory) of a device.

    Field order is the evidence's key order (``kernels`` of the table finding); ``occ`` (the
    :func:`stallscope.gpu_specs.occupancy` result the fix text reads) is not evidence."""

    kernel: str
    launches: int
    gpu_ns: int  # summed duration of its launches
    share_pct: float  # % of the device's kernel time (2 decimals)
    is_comm: bool
    grid: list[int | None]  # [x, y, z]
    block: list[int | None]  # [x, y, z]
    registers_per_thread: int | None
    shared_mem_bytes: int | None  # static + dynamic per block
    theoretical_occupancy_pct: float | None  # 4 decimals; None: not computable
    occupancy_from: str  # launch configuration, Nsight Compute, or why not computable
    limiter: list[str] | None  # the resources at the minimum
    blocks_per_sm: int | None
    limits_blocks_per_sm: dict[str, int | None] | None  # blocks per SM each resource allows
    waves_per_sm: float | None  # grid blocks / (blocks per SM x SMs), 3 decimals
    tail_idle_pct: float | None  # block slots left idle by the last wave, 1 decimal
    kineto_est_achieved_occupancy_pct: float | None  # Kineto's grid-capped estimate
    ncu: dict | str  # Nsight Compute's measurements (_ncu_part), or why there are none
    occ: Occupancy | None = None

    @property
    def ncu_measured(self) -> dict | None:
        """Nsight Compute's measurements, None when the kernel was not profiled."""
        return self.ncu if isinstance(self.ncu, dict) else None


class LowOccupancy(msgspec.Struct, kw_only=True):
    """A kernel that loses time to occupancy (:func:`measure_low`), enough to report."""

    kernel: KernelOccupancy
    kind: str  # low_theoretical or achieved_gap (Nsight Compute)
    achieved_pct: float | None  # Nsight Compute's achieved occupancy
    lost_ns: int  # estimated time lost: gpu_ns x (1 - max(occupancy / target, SOL / 100))
    library: bool  # a tuned library kernel seen on a timeline alone (no time claimed)
    windows: list[list[int]] = []  # its longest launches (timelines)


class DeviceOccupancy(msgspec.Struct, kw_only=True):
    """One device's kernels and their occupancy (:func:`measure_device`). No prose:
    :func:`speak` writes the findings from it."""

    where: Where  # device None: a job of Nsight Compute results alone
    source: str  # where GPU time comes from: "timeline" or "ncu" (its durations)
    kineto: bool  # the timeline is a Kineto trace (its estimates are named so)
    limits: DeviceLimits | None
    total_ns: int  # the device's kernel time (> 0)
    kernels: list[KernelOccupancy]  # most GPU time first
    weighted_pct: float | None  # GPU-time-weighted theoretical occupancy of compute kernels
    low_time_pct: float | None  # % of compute-kernel time below low_pct
    achieved_weighted_pct: float | None  # the same of ncu's achieved occupancy
    under_sm_count_pct: float  # see under_sm_count_pct()
    low: list[LowOccupancy]  # the kernels that lose time, table order


def measure(job: JobData, params: dict[str, float]) -> list[DeviceOccupancy]:
    """Every device with kernel time: timelines (with their paired Nsight Compute results),
    then the ranks that have Nsight Compute results alone."""
    out = []
    timelines = [r for r in job.traces if r.meta.get("source") != "ncu"]
    for ref in timelines:
        groups = _timeline_groups(job, ref.trace_id)
        if not groups:
            continue
        ncu = profiles(job, timeline=ref.trace_id)
        for device in sorted({g["device"] for g in groups}):
            where = Where(ref.trace_id, int(ref.meta.get("rank") or 0), device)
            m = measure_device(
                job, where, [g for g in groups if g["device"] == device], ncu, params,
                limits=_limits(job, ref.trace_id, device), source="timeline",
                kineto=ref.meta.get("source") == "kineto",
            )  # fmt: skip
            out.extend([m] if m else [])
    paired = {r.meta.get("rank") for r in timelines}
    ncu_refs = [r for r in job.traces if r.meta.get("source") == "ncu"]
    for rank in sorted({r.meta.get("rank") for r in ncu_refs} - paired):
        refs = [r for r in ncu_refs if r.meta.get("rank") == rank]
        ncu = profiles(job, ncu_traces=[r.trace_id for r in refs])
        where = Where(refs[0].trace_id, int(refs[0].meta.get("rank") or 0), None)
        m = measure_device(
            job, where, _ncu_groups(ncu), ncu, params,
            limits=next((d for r in refs if (d := _limits(job, r.trace_id, None))), None),
            source="ncu", kineto=False,
        )  # fmt: skip
        out.extend([m] if m else [])
    return out


def measure_device(
    job: JobData,
    where: Where,
    groups: list[dict],
    ncu: dict[tuple, Profile],
    params: dict[str, float],
    *,
    limits: DeviceLimits | None,
    source: str,
    kineto: bool,
) -> DeviceOccupancy | None:
    """One device's kernel ``groups`` (:func:`_timeline_groups`, :func:`_ncu_groups`) with their
    Nsight Compute profiles ``ncu``; None without kernel time. ``params`` set the flags."""
    total = sum(r["gpu_ns"] for r in groups)
    if not total:
        return None
    kernels = [_kernel(r, limits, ncu.get(_key(r)), total, params) for r in groups]
    compute = [k for k in kernels if not k.is_comm and k.theoretical_occupancy_pct is not None]
    measured = [k for k in kernels if not k.is_comm and k.ncu_measured
                and k.ncu_measured.get("achieved_occupancy_pct") is not None]  # fmt: skip
    low = [f for k in kernels if (f := measure_low(k, total, params))]
    if source == "timeline":
        for f in low:
            f.windows = _windows(job, where, f.kernel)
    return DeviceOccupancy(
        where=where,
        source=source,
        kineto=kineto,
        limits=limits,
        total_ns=total,
        kernels=kernels,
        weighted_pct=_weighted(compute, lambda k: k.theoretical_occupancy_pct),
        low_time_pct=_low_time_pct(compute, params["low_pct"]),
        achieved_weighted_pct=_weighted(measured, lambda k: k.ncu["achieved_occupancy_pct"]),
        under_sm_count_pct=under_sm_count_pct(kernels, limits, total),
        low=low,
    )


def _low_time_pct(compute: list[KernelOccupancy], low_pct: float) -> float | None:
    """% of compute-kernel time at a theoretical occupancy below ``low_pct``; None without it."""
    ns = sum(k.gpu_ns for k in compute)
    if not ns:
        return None
    return 100 * sum(k.gpu_ns for k in compute if k.theoretical_occupancy_pct < low_pct) / ns


def _timeline_groups(job: JobData, trace: str) -> list[dict]:
    have = job.columns("gpu")
    col = {c: (f"g.{c}" if c in have else "NULL") for c in _OPTIONAL}
    smem = f"coalesce({col['shared_mem_bytes']}, {col['static_shared_mem_bytes']} + {col['dynamic_shared_mem_bytes']})"
    rows = job.sql(
        f"""
        SELECT g.device, n.name, g.grid_x, g.grid_y, g.grid_z, g.block_x, g.block_y, g.block_z,
               g.registers_per_thread AS regs, {smem} AS smem, count(*) AS launches,
               sum(g.end_ns - g.start_ns) AS gpu_ns, avg({col["est_occupancy_pct"]}) AS kineto_est,
               bool_or(coalesce(g.is_comm, false)) AS is_comm
        FROM gpu g JOIN names n ON n.trace_id = g.trace_id AND n.name_id = g.name_id
        WHERE g.trace_id = ? AND g.kind = 'kernel'
        GROUP BY ALL ORDER BY gpu_ns DESC, n.name
        """,
        [trace],
    ).fetchall()
    keys = ("device", "kernel", "gx", "gy", "gz", "bx", "by", "bz", "regs", "smem", "launches",
            "gpu_ns", "kineto_est", "is_comm")  # fmt: skip
    return [dict(zip(keys, r, strict=True)) for r in rows]


def _ncu_groups(ncu: dict[tuple, Profile]) -> list[dict]:
    """Kernel groups of an ncu-only job: GPU time = ncu duration x profiled launches."""
    rows = []
    for (kernel, grid, block), p in ncu.items():
        static, dynamic = p.get("static_smem_bytes"), p.get("dynamic_smem_bytes")
        regs = p.get("registers_per_thread")
        rows.append({
            "device": None, "kernel": kernel, **_xyz("g", grid), **_xyz("b", block),
            "regs": None if regs is None else int(regs),
            "smem": None if static is None or dynamic is None else int(round(static + dynamic)),
            "launches": p.results, "gpu_ns": int((p.get("duration_ns") or 0) * p.results),
            "kineto_est": None, "is_comm": False,
        })  # fmt: skip
    return sorted(rows, key=lambda r: (-r["gpu_ns"], r["kernel"]))


def _xyz(prefix: str, dims) -> dict:
    return {f"{prefix}{a}": (dims[i] if dims else None) for i, a in enumerate("xyz")}


def _limits(job: JobData, trace: str, device: int | None) -> DeviceLimits | None:
    cur = job.sql(
        "SELECT * FROM devices WHERE trace_id = ? AND (? IS NULL OR device = ?) ORDER BY device",
        [trace, device, device],
    )
    cols = [d[0] for d in cur.description]
    row = cur.fetchone()
    dev = device_limits(dict(zip(cols, row, strict=True))) if row else None
    if (
        dev is None and device is not None and job.may_hold("kernel_metrics")
    ):  # e.g. an nsys trace without TARGET_INFO_GPU: ask ncu
        other = job.sql(
            "SELECT DISTINCT trace_id FROM kernel_metrics WHERE timeline_trace_id = ?", [trace]
        ).fetchall()
        dev = next((d for (t,) in other if (d := _limits(job, t, device))), None)
    return dev


def _weighted(rows: list[KernelOccupancy], value) -> float | None:
    """GPU-time-weighted mean of ``value(row)``; None without GPU time."""
    ns = sum(t.gpu_ns for t in rows)
    return sum(value(t) * t.gpu_ns for t in rows) / ns if ns else None


def _key(r: dict) -> tuple:
    grid = (r["gx"], r["gy"], r["gz"]) if r["gx"] else None
    block = (r["bx"], r["by"], r["bz"]) if r["bx"] else None
    return (r["kernel"], grid, block)


def _kernel(
    r: dict, dev: DeviceLimits | None, prof: Profile | None, total: int, params
) -> KernelOccupancy:
    """One kernel group's occupancy from its launch configuration (else Nsight Compute's)."""
    threads = (r["bx"] or 0) * (r["by"] or 0) * (r["bz"] or 0)
    # No register count (ROCm traces): the other limits alone would overstate it.
    occ = occupancy(dev, threads, r["regs"], r["smem"]) if dev and r["regs"] is not None else None
    grid_blocks = (r["gx"] or 0) * (r["gy"] or 0) * (r["gz"] or 0)
    wave = waves(dev, grid_blocks, occ.blocks_per_sm) if occ and dev else None
    theo = occ.occupancy_pct if occ else (prof.get("theoretical_pct") if prof else None)
    return KernelOccupancy(
        kernel=r["kernel"], launches=int(r["launches"]), gpu_ns=int(r["gpu_ns"]),
        share_pct=round(100 * r["gpu_ns"] / total, 2), is_comm=bool(r["is_comm"]),
        grid=[r["gx"], r["gy"], r["gz"]], block=[r["bx"], r["by"], r["bz"]],
        registers_per_thread=r["regs"], shared_mem_bytes=r["smem"],
        theoretical_occupancy_pct=None if theo is None else round(theo, 4),
        occupancy_from=_source_of(occ, theo, dev, r),
        limiter=occ.limiters if occ else (prof.limiters() if prof else None),
        blocks_per_sm=occ.blocks_per_sm if occ else None,
        limits_blocks_per_sm=occ.limits if occ else None,
        waves_per_sm=None if wave is None else round(wave, 3),
        tail_idle_pct=None if wave is None else round(tail_idle_pct(wave), 1),
        kineto_est_achieved_occupancy_pct=None if r["kineto_est"] is None else round(r["kineto_est"], 1),
        ncu=_ncu_part(prof, params) if prof else "no Nsight Compute profile of this kernel",
        occ=occ,
    )  # fmt: skip


def _source_of(occ, theo, dev, r) -> str:
    if occ:
        return "launch configuration" + (
            " (no shared memory size: an upper bound)" if r["smem"] is None else ""
        )
    if theo is not None:
        return "Nsight Compute"
    if dev is None:
        return "not computable: device limits unknown"
    return "not computable: " + (
        "no register count in the trace" if r["regs"] is None else "no block size"
    )


def _ncu_part(p: Profile, params) -> dict:
    theo, achieved = p.get("theoretical_pct"), p.get("achieved_pct")
    sm, mem = p.get("compute_sol_pct"), p.get("memory_sol_pct")
    roof = p.roofline()
    return {
        "profiled_launches": p.results,
        "theoretical_occupancy_pct": _r(theo) if theo is not None else HOW_TO_MEASURE["occupancy"],
        "achieved_occupancy_pct": _r(achieved),
        "limiter": p.limiters() or HOW_TO_MEASURE["occupancy"],
        "compute_sol_pct": _r(sm) if sm is not None else HOW_TO_MEASURE["sol"],
        "memory_sol_pct": _r(mem) if mem is not None else HOW_TO_MEASURE["sol"],
        "bound": p.bound(params["near_sol_pct"]) or HOW_TO_MEASURE["sol"],
        "top_stalls": p.top_stalls() or HOW_TO_MEASURE["stalls"],
        "roofline": roof or HOW_TO_MEASURE["roofline"],
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def measure_low(k: KernelOccupancy, total: int, params) -> LowOccupancy | None:
    """The time ``k`` loses to occupancy, when it is a compute kernel with ``min_share_pct`` of
    the device's kernel time ``total`` below ``low_pct`` theoretical (or ``achieved_gap_pts``
    under it, measured), not bound at ``near_sol_pct`` of a throughput peak, and the loss
    reaches the severity ladder; else None."""
    if k.is_comm or k.share_pct < params["min_share_pct"] or k.theoretical_occupancy_pct is None:
        return None
    theo, ncu = k.theoretical_occupancy_pct, k.ncu_measured
    achieved = ncu.get("achieved_occupancy_pct") if ncu else None
    peak = _sol_peak(ncu)
    if peak is not None and peak >= params["near_sol_pct"]:
        return None  # bound by compute or memory throughput: occupancy is not what limits it
    if theo < params["low_pct"]:
        kind = "low_theoretical"
        ratio = (achieved if achieved is not None else theo) / params["low_pct"]
    elif achieved is not None and theo - achieved > params["achieved_gap_pts"]:
        kind, ratio = "achieved_gap", achieved / theo
    else:
        return None
    lost = int(k.gpu_ns * max(0.0, 1.0 - max(min(ratio, 1.0), (peak or 0.0) / 100)))
    if _loss_severity(lost, total, params) is None:
        return None
    return LowOccupancy(
        kernel=k, kind=kind, achieved_pct=achieved, lost_ns=lost,
        library=ncu is None and LIBRARY_KERNEL.search(k.kernel) is not None,
    )  # fmt: skip


def _sol_peak(ncu: dict | None) -> float | None:
    """The higher of Nsight Compute's compute and memory speed-of-light %, None: not measured."""
    sol = [
        v
        for v in ((ncu or {}).get("compute_sol_pct"), (ncu or {}).get("memory_sol_pct"))
        if isinstance(v, float | int)
    ]
    return max(sol) if sol else None


def _loss_severity(lost: int, total: int, params) -> str | None:
    return graded_severity(100 * lost / total, lost, params, prefix="loss_pct")


# -- the metrics, findings and table rows, written from the measurement alone -------------
def metrics(m: DeviceOccupancy) -> list[Metric]:
    """``occupancy_weighted_pct`` and ``low_occupancy_time_pct`` (when computable), and
    ``achieved_occupancy_weighted_pct`` (Nsight Compute)."""
    w, out = m.where, []
    if m.weighted_pct is not None:
        out.append(Metric(w.trace, w.rank, w.device, "occupancy_weighted_pct", round(m.weighted_pct, 3), "%"))  # fmt: skip
        out.append(Metric(w.trace, w.rank, w.device, "low_occupancy_time_pct", round(m.low_time_pct, 3), "%"))  # fmt: skip
    if m.achieved_weighted_pct is not None:
        value = round(m.achieved_weighted_pct, 3)
        out.append(Metric(w.trace, w.rank, w.device, "achieved_occupancy_weighted_pct", value, "%"))
    return out


def occupancy_rows(m: DeviceOccupancy) -> list[OccupancyRow]:
    """The device's rows of the report's ``occupancy`` table (the first :data:`TABLE_ROWS`)."""
    return [occupancy_row(m.where, k) for k in m.kernels[:TABLE_ROWS]]


OCCUPANCY_COLUMNS = (
    "kernel", "launches", "gpu_ns", "share_pct", "is_comm", "grid", "block",
    "registers_per_thread", "shared_mem_bytes", "theoretical_occupancy_pct", "occupancy_from",
    "limiter", "blocks_per_sm", "waves_per_sm", "tail_idle_pct", "kineto_est_achieved_occupancy_pct",
)  # fmt: skip


def occupancy_row(where: Where, k: KernelOccupancy) -> OccupancyRow:
    """A kernel signature's row of the ``occupancy`` table, with Nsight Compute's achieved
    occupancy, bound and top stall when it was profiled."""
    ncu = k.ncu_measured or {}
    stalls = ncu.get("top_stalls")
    top_stall = (
        f"{stalls[0]['reason']} {stalls[0]['share_pct']}%"
        if isinstance(stalls, list) and stalls
        else stalls
    )
    return OccupancyRow(
        trace=where.trace,
        rank=where.rank,
        device=where.device,
        **{c: getattr(k, c) for c in OCCUPANCY_COLUMNS},
        ncu_achieved_occupancy_pct=ncu.get("achieved_occupancy_pct"),
        ncu_bound=ncu.get("bound"),
        ncu_top_stall=top_stall,
    )


def speak(m: DeviceOccupancy, params: dict[str, float]) -> list[Finding]:
    """The device's findings: one per kernel losing time (table order), one ``info`` finding
    for the library kernels seen on a timeline alone, and the table finding."""
    low = [(f, s) for f in m.low if (s := _loss_severity(f.lost_ns, m.total_ns, params))]
    findings = [speak_low(m, f, severity) for f, severity in low if not f.library]
    library = [f for f, _ in low if f.library]
    if library:
        findings.append(_library_finding(m, library))
    findings.append(_table_finding(m))
    return findings


def _kernel_dict(k: KernelOccupancy) -> dict:
    """The kernel as the evidence lists it (every field but ``occ``)."""
    out = msgspec.structs.asdict(k)
    del out["occ"]
    return out


def _low_evidence(m: DeviceOccupancy, f: LowOccupancy) -> dict:
    return {
        **_kernel_dict(f.kernel),
        "key": _key_of(f.kernel),
        "kind": f.kind,
        "estimated_loss_ns": f.lost_ns,
        "source": m.source,
        "library_kernel": f.library,
    }


def speak_low(m: DeviceOccupancy, f: LowOccupancy, severity: str) -> Finding:
    """A kernel's low-occupancy finding: why (the limiter), whether it hurts, the fix."""
    k, achieved, ncu = f.kernel, f.achieved_pct, f.kernel.ncu_measured
    theo, name = k.theoretical_occupancy_pct, kernel_base_name(k.kernel) or k.kernel
    why, fix = _why_and_fix(f.kind, k, m.limits, achieved)
    return Finding(
        analyzer="occupancy", trace=m.where.trace, rank=m.where.rank, device=m.where.device,
        severity=severity,
        title=(f"{name}: {theo:.1f}% theoretical occupancy ({'/'.join(k.limiter or ['?'])}-limited), "
               f"{k.share_pct:.0f}% of GPU time" if f.kind == "low_theoretical" else
               f"{name}: achieved occupancy {achieved:.1f}% of a theoretical {theo:.1f}%, "
               f"{k.share_pct:.0f}% of GPU time"),
        detail=f"{k.launches} launches, {k.gpu_ns / 1e6:.2f} ms. {why} {_hurts(ncu, name)}",
        recommendation=fix, impact_ns=f.lost_ns, evidence=_low_evidence(m, f),
        saving_ns=f.lost_ns if ncu is not None else None, windows=f.windows,
    )  # fmt: skip


def _why_and_fix(
    kind: str, row: KernelOccupancy, dev: DeviceLimits | None, achieved: float | None
) -> tuple[str, str]:
    """Why the kernel runs at low occupancy (its limiters), and the fix for each."""
    occ, threads = row.occ, math.prod(b or 1 for b in row.block)
    wave_text = ""
    if row.waves_per_sm is not None and row.waves_per_sm < 1:
        wave_text = (f" The grid fills only {100 * row.waves_per_sm:.0f}% of the GPU's block slots "
                     "(less than one wave): launch more blocks (split the work, split-K).")  # fmt: skip
    if kind == "achieved_gap":
        tail = (
            f"; the last of {row.waves_per_sm:.2f} waves leaves {row.tail_idle_pct:.0f}% of block slots idle"
            if row.waves_per_sm
            else ""
        )
        return (f"Warps are active only {achieved:.1f}% of the time against {row.theoretical_occupancy_pct:.1f}% possible{tail}.",
                "Look for load imbalance between blocks, a small or uneven grid (tail effect), or long-running "
                "early-exit warps; give each block similar work and enough waves (several per SM)." + wave_text)  # fmt: skip
    if occ is None or dev is None:
        return ("The limiter comes from Nsight Compute.", "See the limiter in the evidence.")
    b, b2 = occ.blocks_per_sm, occ.blocks_per_sm + 1
    text = {
        "shared_memory": (f"Shared memory: each block takes {occ.smem_per_block} B (with {dev.reserved_smem_per_block} B reserved "
                          f"by the driver) of {dev.smem_per_sm} B per SM, so {b} block(s) fit.",
                          _smem_fix(dev, occ.warps_per_block, b, threads)),
        "registers": (f"Registers: {row.registers_per_thread} per thread ({occ.regs_per_warp} per warp) allow {b} block(s) "
                      f"of {occ.warps_per_block} warps.",
                      f"Cap registers at {regs_for_blocks(dev, threads, b2)} per thread for {b2} blocks per SM: "
                      f"__launch_bounds__({threads}, {b2}) or -maxrregcount (check for spills); in Triton smaller "
                      "BLOCK sizes or more num_warps spread the tile over more threads."),
        "warps": (f"Block size: {occ.warps_per_block} warps per block fit {b} time(s) into {dev.max_warps_per_sm} warps per SM.",
                  f"Use a block size that divides {dev.max_warps_per_sm} warps (e.g. 256 or 512 threads)."),
        "blocks": (f"Small blocks: {threads} threads x at most {dev.max_blocks_per_sm} blocks per SM.",
                   f"Use bigger blocks (at least {32 * math.ceil(dev.max_warps_per_sm / dev.max_blocks_per_sm)} threads) "
                   "or more work per block; in Triton raise num_warps."),
    }  # fmt: skip
    parts = [text[limiter] for limiter in occ.limiters]  # ties: every limiter must give way
    return " ".join(p[0] for p in parts), " ".join(p[1] for p in parts) + wave_text


def _smem_fix(dev: DeviceLimits, warps_per_block: int, blocks: int, threads: int) -> str:
    """The shared-memory budget per block for one more block per SM, and for half occupancy.

    With small blocks, shared memory alone cannot get far: the block-count limit
    caps occupancy at ``max_blocks_per_sm x warps_per_block``; then bigger blocks
    are the fix too.
    """

    def occupancy_at(n: int) -> float:
        return 100.0 * min(n * warps_per_block, dev.max_warps_per_sm) / dev.max_warps_per_sm

    half = math.ceil(dev.max_warps_per_sm / 2 / max(warps_per_block, 1))
    target = max(blocks + 1, min(dev.max_blocks_per_sm, half))
    budgets = [(n, smem_for_blocks(dev, n)) for n in sorted({target, blocks + 1}, reverse=True)]
    options = "; ".join(
        f"at most {budget} B per block allows {n} blocks per SM ({occupancy_at(n):.0f}% occupancy)"
        for n, budget in budgets
        if budget > 0
    )
    text = (
        f"Use smaller shared-memory tiles: {options} (fewer pipeline stages, smaller BLOCK sizes; in "
        "Triton lower num_stages or the tile sizes)."
    )
    ceiling = occupancy_at(dev.max_blocks_per_sm)
    if ceiling <= 50:
        text += (
            f" With {threads} threads per block even {dev.max_blocks_per_sm} blocks per SM reach only "
            f"{ceiling:.0f}%: use bigger blocks (256 threads or more) so that each block's shared memory "
            "serves more warps."
        )
    return text


def _hurts(ncu: dict | None, name: str) -> str:
    if ncu is None:
        return (
            f"Whether it hurts is not measured: profile it with ncu --set full -k regex:{name}"
            " and ingest the CSV pages with this trace."
        )
    stalls = ncu["top_stalls"]
    top = (
        ", ".join(f"{s['reason']} {s['share_pct']}%" for s in stalls)
        if isinstance(stalls, list)
        else stalls
    )
    return (
        f"Nsight Compute: {ncu['bound']}-bound (compute {_pct(ncu['compute_sol_pct'])}, memory "
        f"{_pct(ncu['memory_sol_pct'])} of peak); top warp stalls: {top}."
    )


def _library_finding(m: DeviceOccupancy, library: list[LowOccupancy]) -> Finding:
    """Library kernels seen only on a timeline: one info finding, no time claimed as lost."""
    rows = [_low_evidence(m, f) for f in library]
    share = sum(r["share_pct"] for r in rows)
    occs = sorted({r["theoretical_occupancy_pct"] for r in rows})
    names = [kernel_base_name(r["kernel"]) for r in rows]
    listed = "; ".join(f"{n} {r['theoretical_occupancy_pct']:.1f}% ({'/'.join(r['limiter'] or ['?'])}, "
                       f"{r['share_pct']:.0f}% of GPU time)" for n, r in zip(names, rows, strict=True))  # fmt: skip
    occ_text = f"{occs[0]:.1f}%" if len(occs) == 1 else f"{occs[0]:.1f}-{occs[-1]:.1f}%"
    regex = "|".join(sorted({re.escape(n) for n in names}))[:200]
    return Finding(
        analyzer="occupancy", trace=m.where.trace, rank=m.where.rank, device=m.where.device, severity="info",
        title=(f"{len(rows)} library GEMM/attention kernel(s) run at {occ_text} theoretical occupancy, "
               f"{share:.0f}% of GPU time (by design; whether it hurts is not measured)"),
        detail=(f"{listed}. cuBLAS, CUTLASS, cuDNN and flash-attention kernels use large register and "
                "shared-memory tiles and are often compute-bound at low occupancy; the timeline cannot tell."),
        recommendation=(f"Confirm with Nsight Compute (ncu --set full -k regex:'{regex}') and ingest its CSV pages "
                        "with this trace. If they turn out latency-bound: shapes that are multiples of 64/128, "
                        "another algorithm (torch.compile mode='max-autotune'), or batching small GEMMs."),
        impact_ns=0,
        evidence={"key": "library", "kernels": rows,
                  "estimated_loss_upper_bound_ns": sum(r["estimated_loss_ns"] for r in rows)},
        windows=library[0].windows,
    )  # fmt: skip


def _pct(value) -> str:
    return f"{value:.0f}%" if isinstance(value, float | int) else "not measured"


def _table_finding(m: DeviceOccupancy) -> Finding:
    """The device's ``info`` finding: weighted occupancy, kernels under the SM count, the table."""
    trace, rank, device = m.where.trace, m.where.rank, m.where.device
    dev, weighted = m.limits, m.weighted_pct
    source = "kineto" if m.kineto else m.source
    rows = [_kernel_dict(k) for k in m.kernels[:TABLE_ROWS]]
    device_text = f"GPU {device}" if device is not None else "Nsight Compute kernels"
    small_pct = m.under_sm_count_pct
    small_text = (
        f"; {small_pct:.0f}% of compute-kernel time in grids with fewer blocks than SMs (SMs left empty)"
        if small_pct >= 25
        else ""
    )
    return Finding(
        analyzer="occupancy", trace=trace, rank=rank, device=device, severity="info",
        title=(f"{device_text}: GPU-time-weighted theoretical occupancy {weighted:.1f}%{small_text}" if weighted is not None
               else f"{device_text}: occupancy unknown (no device limits or launch configuration)"),
        detail=(f"{len(m.kernels)} kernel signatures, {m.total_ns / 1e6:.2f} ms of kernel time; device limits: "
                f"{dev.name + ' (' + dev.source + ')' if dev else 'unknown'}. The per-kernel table is in the evidence"
                + (" (Kineto's est. achieved occupancy is a grid-capped estimate, not a measurement)." if source == "kineto"
                   else "." if source == "timeline" else "; GPU time is ncu's duration of the profiled launches.")),
        recommendation="See the occupancy findings for the kernels that lose time, and their fixes.",
        evidence={"key": "table", "source": "timeline" if source == "kineto" else source, "kernels": rows,
                  "under_one_wave_pct": round(small_pct, 2),
                  "device_limits": dev.__dict__ if dev else None},
    )  # fmt: skip


def under_sm_count_pct(table: list[KernelOccupancy], dev: DeviceLimits | None, total: int) -> float:
    """% of all kernel time in compute kernels whose grid has fewer blocks than the GPU has
    SMs: those SMs get no block at all, whatever the per-SM occupancy says.

    Communication kernels are left out (they wait on the network, they do not
    compute), and so are grids with at least one block per SM (a grid under one
    *wave* but over the SM count keeps every SM busy). 0 when the SM count is unknown.
    """
    if not total or dev is None or not dev.sm_count:
        return 0.0
    small = sum(t.gpu_ns for t in table if not t.is_comm and 0 < _blocks(t.grid) < dev.sm_count)
    return 100 * small / total


def _blocks(grid: list) -> int:
    return math.prod(int(g or 0) for g in grid) if grid else 0


def _windows(job: JobData, where: Where, row: KernelOccupancy) -> list[list[int]]:
    """The kernel's longest launches, [start_ns, end_ns]."""
    dims = " AND ".join(f"g.{c} IS NOT DISTINCT FROM ?" for c in
                        ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread"))  # fmt: skip
    rows = job.sql(
        f"SELECT g.start_ns, g.end_ns FROM gpu g JOIN names n ON n.trace_id = g.trace_id AND n.name_id = g.name_id"
        f" WHERE g.trace_id = ? AND g.device = ? AND g.kind = 'kernel' AND n.name = ? AND {dims}"
        f" ORDER BY g.end_ns - g.start_ns DESC, g.start_ns LIMIT {MAX_WINDOWS}",
        [where.trace, where.device, row.kernel, *row.grid, *row.block, row.registers_per_thread],
    ).fetchall()
    return [[int(a), int(b)] for a, b in rows]


def _key_of(row: KernelOccupancy) -> str:
    text = f"{row.kernel}|{row.grid}|{row.block}|{row.registers_per_thread}|{row.shared_mem_bytes}"
    return "kernel-" + hashlib.blake2b(text.encode(), digest_size=5).hexdigest()


SPEC = AnalyzerSpec(
    id="occupancy",
    order=110,
    per_rank=True,
    title="Occupancy",
    description="Kernels with a material share of GPU time at low occupancy: limiter, bound, fix.",
    run=run,
    thresholds=THRESHOLDS,
)
