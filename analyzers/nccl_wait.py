"""``nccl_wait``: ranks idle inside collectives, waiting for the rank that arrives last.

Collectives are matched across ranks by :mod:`stallscope.collectives`
(process group + sequence number, else process group + op + order, with clock
skew estimated from completion times). For each matched collective and rank:
``wait = max(0, min(end, last_arrival) − start)`` and ``transfer = end −
max(start, last_arrival)``, in ns. The straggler is the rank that arrived
last. Why it was late is read from its own trace over its *lateness
intervals* (:mod:`stallscope.lateness`: aligned with the other ranks at the
previous shared collective's end or the step start, the extra time it took):
its GPU idle time by cause (:mod:`stallscope.idle`), its kernels against the
other ranks' (extra compute, slower GPU), its host ranges. ``saving_ns`` is a
what-if on the job's dependency graph (:mod:`stallscope.critical_path`): the
drop in summed step time if the straggler had kept the others' pace. A wait
that comes from before the straggler's first captured step is said to lie
outside the capture, graded low, with no saving. The job summary carries the
cross-rank critical path of each step.

Metrics per trace and device: ``nccl_wait_ns`` (sum of waits; multi-rank jobs
only) and ``collective_count`` (communication kernels). The time lost (a
finding's ``impact_ns``) is the *exposed* wait: waiting not hidden under the
rank's own compute kernels. One ``info`` finding per job lists the matched
collectives with algorithm and bus bandwidth, clock skew and data-quality
warnings. Documented in docs/analyzers/nccl_wait.md.
"""

from __future__ import annotations

import numpy as np

from stallscope import intervals, job_settings
from stallscope.analyzers.base import (
    SEVERITY_RANK,
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    graded_severity,
    graded_thresholds,
)
from stallscope.collectives import (
    CollectiveMatch,
    covered_length,
    gpu_activity,
    match_collectives,
    step_windows,
)
from stallscope.idle import CAUSES, launch_threads, top_host_ops
from stallscope.jobdata import JobData
from stallscope.lateness import (
    CAUSE_TEXT,
    critical_path_table,
    explain,
    host_ranges,
    lateness,
    rank_idle,
    saving_if_on_time,
    timeline,
)
from stallscope.report_types import (
    CollectiveOpRow,
    CriticalPathRow,
    RankWaitRow,
    Tables,
)

THRESHOLDS = (
    *graded_thresholds('exposed wait / span', 'exposed wait below which nothing is reported'),
    Threshold(
        "min_wait_us", 100.0, "us",
        "a collective counts toward the straggler tally when some rank waited at least this long in it",
    ),
    Threshold(
        "skew_tolerance_us", job_settings.SKEW_TOLERANCE_US, "us",
        "clock offsets between ranks below this are taken as one shared clock (not corrected); "
        "the job's setting: overlap and the wait matrix use it too",
    ),
)  # fmt: skip
MAX_WINDOWS = 20
MAX_INSTANCES = 100
MAX_INTERVALS = 200  # lateness intervals listed in evidence


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    # The threshold is the job's setting: overlap and views read the same value.
    match = match_collectives(
        job, job_settings.set_skew_tolerance_us(job, params["skew_tolerance_us"])
    )
    if match is None:
        return result
    rows = match.rows
    trace, device = rows["trace_id"], rows["device"]  # sorted by rank, trace, device
    first = np.flatnonzero(np.r_[True, (trace[1:] != trace[:-1]) | (device[1:] != device[:-1])])
    parts = [(int(rows["rank"][i]), str(trace[i]), int(device[i])) for i in first]
    multi = len(parts) > 1
    min_wait = int(params["min_wait_us"] * 1000)
    activity: dict[tuple[str, int], dict] = {}
    for rank, trace, device in parts:
        own = np.zeros(rows["inst"].size, dtype=bool)
        own[match.rows_of(trace, device)] = True  # its rows: one slice, no scan of all rows
        mine = _in_steps(rows, own)
        result.metrics.append(
            Metric(trace, rank, device, "collective_count", int(mine.sum()), "count")
        )
        if not multi:
            continue
        waited = int(rows["wait_ns"][mine].sum())
        result.metrics.append(Metric(trace, rank, device, "nccl_wait_ns", waited, "ns"))
        finding = _rank_finding(job, match, rank, trace, device, mine, min_wait, activity, params)
        if finding:
            result.findings.append(finding)
            result.tables.rank_waits.append(rank_wait_row(finding))
    if multi:
        result.findings.append(_summary(job, match, parts, min_wait, result.tables))
    return result


def rank_wait_row(f: Finding) -> RankWaitRow:
    """A waiting rank's row of the report's ``rank_waits`` table: its finding's numbers."""
    e = f.evidence
    return RankWaitRow(
        trace=f.trace,
        rank=f.rank,
        device=f.device,
        straggler_rank=e["straggler_rank"],
        waited_ns=e["nccl_wait_ns"],
        exposed_wait_ns=e["exposed_wait_ns"],
        share_of_span_pct=e["share_of_span_pct"],
        wait_outside_capture_ns=e["wait_outside_capture_ns"],
        saving_ns=f.saving_ns,
    )


def _rank_finding(job, match, rank, trace, device, mine, min_wait, activity, params):
    """The finding for one waiting rank, or None when its exposed wait is small."""
    rows, inst = match.rows, match.instances
    waiting = mine & (rows["wait_ns"] > 0)
    if not waiting.any():
        return None
    starts, waits = rows["start_ns"][waiting], rows["wait_ns"][waiting]
    ops = gpu_activity(job)[(trace, device)]
    compute = _union(ops, ops["is_kernel"] & ~ops["is_comm"])
    exposed_each = waits - covered_length(compute, starts, starts + waits)
    w_s, w_e = intervals.union(starts, starts + waits)
    exposed = int((w_e - w_s).sum() - covered_length(compute, w_s, w_e).sum())
    step_ids, lo, hi = step_windows(ops)  # the profiled steps when there are any
    span = (
        int((hi - lo).sum()) if step_ids.size else int(ops["end_ns"].max() - ops["start_ns"].min())
    )
    share = 100.0 * exposed / span if span else 0.0
    severity = graded_severity(share, exposed, params)
    if severity is None:
        return None
    culprit = inst["straggler_rank"][rows["inst"][waiting]]
    by_rank = {int(r): int(waits[culprit == r].sum()) for r in np.unique(culprit)}
    straggler = max(by_rank, key=lambda r: (by_rank[r], -r))
    material = waiting & (inst["max_wait_ns"][np.maximum(rows["inst"], 0)] >= min_wait)
    last_in = int((inst["straggler_rank"][rows["inst"][material]] == straggler).sum())
    steps = _per_step(rows["step"][waiting], waits, exposed_each, culprit)
    main_in = sum(1 for s in steps if s["straggler_rank"] == straggler)
    s_trace, s_device = _participant_of(inst, straggler)
    key = (s_trace, s_device)
    if key not in activity:
        activity[key] = _straggler_story(job, match, s_trace, s_device)
    doing, why = activity[key]
    outside = _wait_outside(job, match, trace, device)
    # the wait comes from before the straggler's capture when that part outweighs what the
    # straggler's own captured timeline explains (later waits are then knock-on of it)
    explained = 0 if why is None else why["explained_ns"]
    before_capture = outside >= min_wait and outside >= explained
    saved = None if why is None or before_capture else why["what_if"]["saving_ns"]
    # a straggler whose being on time would not shorten the step is not the fix to lead with
    alone_not_enough = saved is not None and saved < max(
        exposed / 10, params["min_impact_ms"] * 1e6
    )
    if (before_capture or alone_not_enough) and SEVERITY_RANK[severity] > SEVERITY_RANK["low"]:
        severity = "low"
    order = np.argsort(-waits, kind="stable")[:MAX_WINDOWS]
    top = np.argsort(-inst["max_wait_ns"][rows["inst"][waiting]], kind="stable")[:5]
    consistency = f"{main_in}/{len(steps)} steps" if steps and steps[0]["step"] is not None else ""
    return Finding(
        analyzer="nccl_wait",
        trace=trace,
        rank=rank,
        device=device,
        severity=severity,
        title=(
            f"Rank {rank} sat {exposed / 1e6:.1f} ms ({share:.0f}% of GPU {device}'s time) in "
            f"collectives waiting for rank {straggler}"
        ),
        detail=(
            f"Rank {rank} spent {waits.sum() / 1e6:.2f} ms inside {int(waiting.sum())} collectives before the "
            f"last rank arrived, {exposed / 1e6:.2f} ms of it with no compute of its own running. "
            f"Rank {straggler} arrived last in {last_in} of the {int(material.sum())} collectives with a wait of "
            f"at least {min_wait / 1000:.0f} µs"
            + (f" and caused most of the wait in {consistency}" if consistency else "")
            + ". "
            + (
                _outside_text(straggler, why, outside)
                if before_capture
                else _doing_text(straggler, doing, why)
                + (_not_enough_text(straggler, saved, exposed) if alone_not_enough else "")
            )
        ),
        recommendation=(
            _outside_recommendation(straggler)
            if before_capture
            else _several_recommendation(straggler)
            if alone_not_enough
            else _recommendation(straggler, why)
        ),
        impact_ns=exposed,
        saving_ns=saved,
        evidence={
            "straggler_rank": straggler,
            "straggler_ranks": {str(r): ns for r, ns in sorted(by_rank.items())},
            "straggler_last_in": f"{last_in}/{int(material.sum())} collectives",
            "straggler_main_cause_in": consistency,
            "nccl_wait_ns": int(waits.sum()),
            "exposed_wait_ns": exposed,
            "share_of_span_pct": round(share, 3),
            "steps": steps,
            "top_waits": [_instance_dict(inst, int(i)) for i in rows["inst"][waiting][top]],
            "straggler_activity": doing,
            "lateness": None if why is None else {k: v for k, v in why.items() if k != "what_if"},
            "wait_outside_capture_ns": outside,
            "what_if": None if why is None or before_capture else why["what_if"],
            "clock_skew_ns": match.skew_ns.get((trace, device), 0),
            "data_quality": match.warnings,
        },
        windows=[[int(starts[i]), int(starts[i] + waits[i])] for i in order],
    )


def _per_step(step, waits, exposed, culprit) -> list[dict]:
    """Per step: wait, largest single wait, exposed wait, and the rank that caused most of it."""
    steps, si = np.unique(step, return_inverse=True)
    ranks, ri = np.unique(culprit, return_inverse=True)
    caused = np.bincount(si * ranks.size + ri, waits, minlength=steps.size * ranks.size)
    largest = np.zeros(steps.size, dtype=np.int64)
    np.maximum.at(largest, si, waits)
    wait, exposed_sum = np.bincount(si, waits, steps.size), np.bincount(si, exposed, steps.size)
    main = ranks[caused.reshape(steps.size, ranks.size).argmax(axis=1)]  # ties: lowest rank
    return [
        {
            "step": None if s < 0 else int(s),
            "wait_ns": int(wait[i]),
            "largest_wait_ns": int(largest[i]),
            "exposed_wait_ns": int(exposed_sum[i]),
            "straggler_rank": int(main[i]),
        }
        for i, s in enumerate(steps.tolist())
    ]


def _in_steps(rows: dict, mask: np.ndarray) -> np.ndarray:
    """``mask`` narrowed to kernels launched inside a step, when the rank has steps at all."""
    inside = mask & (rows["step"] >= 0)
    return inside if inside.any() else mask


def _participant_of(inst, rank: int) -> tuple[str, int]:
    i = int(np.flatnonzero(inst["straggler_rank"] == rank)[0])
    return str(inst["straggler_trace"][i]), int(inst["straggler_device"][i])


def _lateness_of(job, match: CollectiveMatch):
    """The job's timeline and per-(instance, rank) lateness table (cached on the job)."""
    key = ("lateness", id(match))
    if key not in job.cache:
        tl = timeline(job, match)
        job.cache[key] = (tl, lateness(match, tl))
    return job.cache[key]


def _part_of(tl, trace: str, device: int) -> int:
    """The participant index of (trace, device) in the timeline (a dict built once)."""
    if "part_index" not in tl.kernels:
        tl.kernels["part_index"] = {(t, d): p for p, (_, t, d) in enumerate(tl.parts)}
    return tl.kernels["part_index"][(trace, device)]


def _wait_outside(job, match: CollectiveMatch, trace: str, device: int) -> int:
    """The part of this rank's in-step wait due to stragglers whose first captured step started later."""
    tl, late = _lateness_of(job, match)
    key = ("wait_outside", id(match))
    if key not in job.cache:  # per participant at once: its in-step rows when it has any
        in_step = late["step"] >= 0
        has_steps = in_step.groupby(late["part"]).transform("any")
        counted = late["wait_outside_ns"].where(in_step | ~has_steps, 0)
        job.cache[key] = counted.groupby(late["part"]).sum().to_dict()
    return int(job.cache[key].get(_part_of(tl, trace, device), 0))


def _straggler_story(
    job, match: CollectiveMatch, trace: str, device: int
) -> tuple[dict, dict | None]:
    """What the straggler did in its lateness intervals, why it was late, and the what-if saving.

    Returns (``straggler_activity``, ``lateness`` with ``what_if``), see docs/analyzers/nccl_wait.md.
    """
    tl, late = _lateness_of(job, match)
    part = _part_of(tl, trace, device)
    late = late[late["step"] >= 0] if (late["step"] >= 0).any() else late
    ex = explain(job, tl, late, part)
    if not ex.intervals:
        return {"window_ns": 0}, None
    skew = tl.skew[part]
    own = [[a + skew, b + skew] for a, b in ex.intervals if b > a]
    doing = _activity(job, trace, device, own)
    ranges, loader_ns = host_ranges(job, tl, part, ex.intervals)
    causes = dict(ex.causes_ns)
    if causes.get("unknown", 0) and loader_ns >= causes["unknown"] / 2:
        # a data-loading range on another thread of its process covers the unrecorded time
        moved = min(loader_ns, causes["unknown"])
        causes["unknown"] -= moved
        causes["dataloader"] = causes.get("dataloader", 0) + moved
        causes = {c: v for c, v in causes.items() if v > 0}
    main = max(causes, key=lambda c: causes[c]) if causes else None
    # a user range (record_function, NVTX) on its process that spans most of the unrecorded time names it
    named = next((r for r in ranges if r["kind"] in ("annotation", "nvtx")), None)
    covering = (
        named["name"]
        if main == "unknown" and named and named["overlap_ns"] >= causes["unknown"] / 2
        else None
    )
    refs = sorted(
        {
            int(r)
            for r in late.loc[late["last"] & (late["part"] == part) & (late["late_ns"] > 0), "ref"]
        }
    )
    why = {
        "late_ns": ex.late_ns,
        "explained_ns": ex.removable_ns,
        "knock_on_ns": ex.knock_on_ns,
        "causes_ns": dict(sorted(causes.items(), key=lambda kv: -kv[1])),
        "main_cause": main,
        "reference_ranks": [tl.parts[r][0] for r in refs],
        "intervals": [[a + skew, b + skew] for a, b in ex.intervals[:MAX_INTERVALS]],
        "kernels": ex.kernels,
        "host_ranges": ranges,
        "dataloader_range_ns": loader_ns,
        "covering_range": covering,
        "what_if": saving_if_on_time(tl, ex.cuts),
    }
    return doing, why


def _activity(job, trace: str, device: int, windows: list[list[int]]) -> dict:
    """GPU busy and compute share, idle by cause and host operations over ``windows`` (own clock)."""
    ops = gpu_activity(job)[(trace, device)]
    union = intervals.union(
        np.array([w[0] for w in windows], dtype=np.int64),
        np.array([w[1] for w in windows], dtype=np.int64),
    )
    window = int((union[1] - union[0]).sum())
    if window == 0:
        return {"window_ns": 0}
    own = job.part_of(trace)  # this rank's files only
    busy = covered_length(_union(ops, slice(None)), *union).sum()
    comp = covered_length(_union(ops, ops["is_kernel"] & ~ops["is_comm"]), *union).sum()
    idle = rank_idle(job, trace, device)
    by_cause = {}
    if idle.per_gap.size:
        gap_len = np.maximum(idle.gap_ends - idle.gap_starts, 1)
        share = covered_length(union, idle.gap_starts, idle.gap_ends) / gap_len
        sums = (idle.per_gap * share[:, None]).sum(axis=0)
        by_cause = {c: int(sums[i]) for i, c in enumerate(CAUSES) if sums[i] >= 1}
    merged = [[int(s), int(e)] for s, e in zip(*union, strict=True)]
    return {
        "window_ns": window,
        "windows": len(merged),
        "gpu_busy_pct": round(100.0 * busy / window, 1),
        "compute_pct": round(100.0 * comp / window, 1),
        "idle_by_cause_ns": by_cause,
        "top_host_ops": top_host_ops(own, trace, launch_threads(own, trace, device), merged),
    }


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def _doing_text(rank: int, doing: dict, why: dict | None) -> str:
    if why is None or not doing.get("window_ns"):
        return (
            f"Rank {rank} took no longer than the other ranks to reach these collectives from a common point "
            "(the previous collective or the step start): the capture does not show why it was last."
        )
    causes = ", ".join(f"{CAUSE_TEXT[c]} {_ms(ns)}" for c, ns in list(why["causes_ns"].items())[:3])
    ranges = ", ".join(r["name"] for r in why["host_ranges"][:3])
    unrecorded = why["main_cause"] == "unknown" and not why.get("covering_range")
    return (
        f"Aligned at the previous collective (or the step start), rank {rank} took {_ms(why['late_ns'])} longer "
        f"in all than the next-latest rank to arrive (its GPU busy {doing['gpu_busy_pct']:.0f}% in those "
        f"{_ms(doing['window_ns'])}); its own trace accounts for {_ms(why['explained_ns'])} of it"
        + (f": {causes}" if causes else "")
        + (
            f"; {_ms(why['knock_on_ns'])} is knock-on (kernels the other ranks had already run while they waited)"
            if why["knock_on_ns"] >= 1e5
            else ""
        )
        + (
            f". Its host ranges then (around the unrecorded time, not its cause): {ranges}"
            if ranges and unrecorded
            else f". Its host was in: {ranges}"
            if ranges
            else ""
        )
        + f". Were rank {rank} on time, the captured steps would take {_ms(why['what_if']['saving_ns'])} less in "
        "all (a what-if on the job's dependency graph)."
    )


def _outside_text(rank: int, why: dict | None, outside: int) -> str:
    return (
        f"{_ms(outside)} of this wait is rank {rank}'s first captured step starting later than this rank's: "
        f"counted from their own step starts, the ranks reached the collective at about the same offset. "
        f"The delay lies before rank {rank}'s capture begins; the trace cannot show what rank {rank} did then."
    )


def _not_enough_text(rank: int, saved: int, exposed: int) -> str:
    return (
        f" So rank {rank} alone does not set the step time: other ranks arrive nearly as late, or the step's end "
        f"is set elsewhere (see the critical path in the `collectives` finding); of this rank's {_ms(exposed)} "
        f"of exposed wait, making rank {rank} on time recovers {_ms(saved)}."
    )


def _several_recommendation(rank: int) -> str:
    return (
        f"Rank {rank} is not the only late rank: follow the critical path of the step (the `collectives` finding, "
        "Distributed page) to the ranks and work that set its end, and fix those first."
    )


def _outside_recommendation(rank: int) -> str:
    return (
        f"Capture what comes before this step on rank {rank}: profile more steps (a longer `active` in the "
        "profiler schedule, so the gap between steps is inside the capture) and start the profilers on every "
        "rank at the same step. Then see what rank "
        f"{rank} does before its step starts (data loading, checkpointing, rank-specific work). Until then "
        "this trace cannot name the cause."
    )


def _recommendation(rank: int, why: dict | None) -> str:
    main = None if why is None else why["main_cause"]
    tail = " Every other rank waits for the slowest one at each collective."
    if main == "dataloader":
        return (
            f"Rank {rank} was late because it waited for its input data: speed up its data loading (more DataLoader "
            "workers, pin_memory=True, a larger prefetch_factor, persistent_workers; decode and augment ahead of "
            "time; check that rank's storage and CPU)." + tail
        )
    if main == "host_sync":
        return (
            f"Rank {rank} blocked its host on GPU syncs the other ranks did not make (`.item()`, `.cpu()`, "
            "`torch.cuda.synchronize()`, often rank-0-only logging or metrics): remove or defer them."
            + tail
        )
    if main in ("cpu", "launch", "memcpy"):
        return (
            f"Rank {rank}'s host spent longer in Python/CPU work than the others: move rank-specific work "
            "(logging, metrics, checkpointing, evaluation) off the step or to a background thread; check garbage "
            "collection and whether that rank's CPU cores are oversubscribed (OMP_NUM_THREADS, pinning)."
            + tail
        )
    if main == "unknown" and why.get("covering_range"):
        return (
            f"Rank {rank}'s host was inside `{why['covering_range']}` while it fell behind (no GPU work, no recorded "
            "operator): shorten or remove that work on that rank, or move it off the step." + tail
        )
    if main == "unknown":
        return (
            f"Rank {rank}'s host recorded nothing while it fell behind (a sleep, I/O, a blocking call, garbage "
            "collection, or another thread holding the GIL): the trace cannot name it. Wrap that rank's data "
            "loading and per-step extras in `torch.profiler.record_function` (or NVTX) ranges, or capture it with "
            "Nsight Systems OS-runtime tracing (`-t osrt`) or py-spy, then remove the delay on that rank."
            + tail
        )
    if main == "extra_compute":
        return (
            f"Rank {rank} ran more or larger kernels than the others: the ranks have unequal work. Balance it "
            "(even batch and sequence lengths per rank, balanced shards, pipeline stages or expert routing)."
            + tail
        )
    if main == "slower_gpu":
        return (
            f"Rank {rank}'s GPU ran the same kernels, at the same launch grid, slower than the others: check its "
            "clocks, power and thermal throttling (`nvidia-smi -q -d PERFORMANCE,CLOCK`), other processes on that "
            "GPU, and its PCIe/NVLink path." + tail
        )
    if main == "queued":
        return (
            f"Rank {rank}'s GPU waited on its own other streams before it joined: look at the cross-stream "
            "dependencies on that rank." + tail
        )
    return (
        f"Rank {rank} arrived last, but from a common point it did the same work as the others in the same time: "
        "the capture does not show why. Capture more steps on every rank to find where its lateness begins."
    )


SKEWS_LISTED = 8  # ranks whose clock skew the summary's detail names one by one


def _skew_text(skew: dict[str, int]) -> str:
    """The ranks' clock skews (ns) for the summary's detail: all of them up to
    :data:`SKEWS_LISTED` ranks, else the ranks at 0 counted and the others named (at most
    :data:`SKEWS_LISTED`, the largest first); the evidence keeps every rank's."""
    if len(skew) <= SKEWS_LISTED:
        return str(skew)
    off = sorted((r for r in skew if skew[r]), key=lambda r: (-abs(skew[r]), int(r)))
    zero = len(skew) - len(off)
    named = ", ".join(f"rank {r} {skew[r]}" for r in off[:SKEWS_LISTED])
    more = f", and {len(off) - SKEWS_LISTED} more" if len(off) > SKEWS_LISTED else ""
    return f"0 on {zero} of {len(skew)} ranks" + (f"; {named}{more}" if off else "")


def _summary(job, match: CollectiveMatch, parts, min_wait: int, tables: Tables) -> Finding:
    """The job's ``info`` finding on its matched collectives; its ops and critical path also
    go to ``tables`` (``collective_ops``, ``critical_path``: rows of the finding's place)."""
    inst, rows = match.instances, match.rows
    n = inst["op"].size
    material = inst["max_wait_ns"] >= min_wait
    tally = {str(r): int((inst["straggler_rank"][material] == r).sum()) for r, _, _ in parts}
    ok = rows["inst"] >= 0
    culprit = inst["straggler_rank"][rows["inst"][ok]] if n else np.zeros(0, dtype=np.int64)
    ranks, at = np.unique(culprit, return_inverse=True)  # the wait each rank caused, at once
    sums = dict(
        zip(ranks.tolist(), np.bincount(at, rows["wait_ns"][ok], ranks.size).tolist(), strict=True)
    )
    caused = {str(r): int(sums.get(int(r), 0)) for r, _, _ in parts}
    ops = _op_table(inst)
    skew = {str(r): match.skew_ns.get((t, d), 0) for r, t, d in parts}
    corrected = [r for r, t, d in parts if match.skew_corrected.get((t, d))]
    worst = max(caused, key=lambda r: caused[r]) if n else None
    path = critical_path_table(job, _lateness_of(job, match)[0]) if n else []
    trace, rank = parts[0][1], parts[0][0]
    tables.collective_ops.extend(
        CollectiveOpRow(trace=trace, rank=rank, device=None, **op) for op in ops
    )
    tables.critical_path.extend(
        CriticalPathRow(
            trace=trace, rank=rank, device=None, step=s.step, time_ns=s.time_ns, segments=s.segments
        )
        for s in path
    )
    return Finding(
        analyzer="nccl_wait",
        trace=trace,
        rank=rank,
        device=None,
        severity="info",
        title=(
            f"Collectives: {n} matched across {len(parts)} ranks"
            + (
                f"; rank {worst} arrived last in {tally[worst]} of {int(material.sum())} with waits"
                if worst and material.any()
                else ""
            )
        ),
        detail=(
            f"{n} collectives matched by {', '.join(sorted(set(match.methods.values())))} "
            f"({int((~ok).sum())} kernels unmatched). Clock skew per rank (ns, from completion times): {_skew_text(skew)}"
            + (f"; corrected for ranks {corrected}" if corrected else "; no correction needed")
            + (f". Data quality: {' '.join(match.warnings)}" if match.warnings else ".")
        ),
        recommendation="See the per-rank nccl_wait findings; the table of collectives shows size, algorithm and bus bandwidth.",
        evidence={
            "key": "collectives",
            "matched": n,
            "unmatched_kernels": int((~ok).sum()),
            "methods": match.methods,
            "clock_skew_ns": skew,
            "skew_corrected_ranks": corrected,
            "straggler_tally": tally,
            "wait_caused_ns": caused,
            "ops": ops,
            "collectives": [_instance_dict(inst, i) for i in range(min(n, MAX_INSTANCES))],
            "data_quality": match.warnings,
            "critical_path": path,
        },
        windows=[
            [int(inst["start_ns"][i]), int(inst["last_ns"][i])]
            for i in np.argsort(-inst["max_wait_ns"])[:MAX_WINDOWS]
            if inst["max_wait_ns"][i] > 0
        ],
    )


def _op_table(inst) -> list[dict]:
    out = []
    combo = np.char.add(np.char.add(inst["group"].astype(str), "\x1f"), inst["op"].astype(str))
    for key in np.unique(combo).tolist():
        g, o = key.split("\x1f")
        m = (inst["group"] == g) & (inst["op"] == o)
        bw = inst["busbw_gbps"][m]
        bw = bw[~np.isnan(bw)]
        out.append(
            {
                "group": g,
                "op": o,
                "count": int(m.sum()),
                "algorithms": [a for a in np.unique(inst["algorithm"][m]).tolist() if a],
                "median_bytes": int(np.median(inst["bytes"][m]))
                if (inst["bytes"][m] >= 0).all()
                else None,
                "median_transfer_ns": int(np.median(inst["transfer_ns"][m])),
                "median_busbw_gbps": round(float(np.median(bw)), 2) if bw.size else None,
                "wait_ns": int(inst["max_wait_ns"][m].sum()),
            }
        )
    return out


def _instance_dict(inst, i: int) -> dict:
    def num(x):
        return None if np.isnan(x) else round(float(x), 2)

    return {
        "group": str(inst["group"][i]),
        "op": str(inst["op"][i]),
        "key": int(inst["key"][i]),
        "start_ns": int(inst["start_ns"][i]),
        "ranks": int(inst["size"][i]),
        "last_rank": int(inst["straggler_rank"][i]),
        "max_wait_ns": int(inst["max_wait_ns"][i]),
        "transfer_ns": int(inst["transfer_ns"][i]),
        "bytes": None if inst["bytes"][i] < 0 else int(inst["bytes"][i]),
        "algorithm": str(inst["algorithm"][i]) or None,
        "algbw_gbps": num(inst["algbw_gbps"][i]),
        "busbw_gbps": num(inst["busbw_gbps"][i]),
    }


def _union(ops: dict, mask) -> tuple[np.ndarray, np.ndarray]:
    return intervals.union(ops["start_ns"][mask], ops["end_ns"][mask])


SPEC = AnalyzerSpec(
    id="nccl_wait",
    title="NCCL wait and stragglers",
    description="Time ranks spend inside collectives waiting for the last rank; who the straggler is and what it was doing.",
    run=run,
    thresholds=THRESHOLDS,
)
