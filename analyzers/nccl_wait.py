"""``nccl_wait``: ranks idle inside collectives, waiting for the rank that arrives last.

Collectives are matched across ranks by :mod:`stallscope.collectives`
(process group + sequence number, else process group + op + order, with clock
skew estimated from completion times). For each matched collective and rank:
``wait = max(0, min(end, last_arrival) − start)`` and ``transfer = end −
max(start, last_arrival)``, in ns. The straggler is the rank that arrived
last. What the straggler did instead is read from its own trace in the
windows [its previous collective's end, its arrival]: GPU busy share, idle
time by cause (:mod:`stallscope.idle`) and the host operations there.

Metrics per trace and device: ``nccl_wait_ns`` (sum of waits; multi-rank jobs
only) and ``collective_count`` (communication kernels). The time lost (a
finding's ``impact_ns``) is the *exposed* wait: waiting not hidden under the
rank's own compute kernels. One ``info`` finding per job lists the matched
collectives with algorithm and bus bandwidth, clock skew and data-quality
warnings. Documented in docs/analyzers/nccl_wait.md.
"""

from __future__ import annotations

import numpy as np

from stallscope import intervals
from stallscope.analyzers.base import (
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
from stallscope.idle import CAUSES, attribute_idle, launch_threads, top_host_ops
from stallscope.jobdata import JobData

THRESHOLDS = (
    *graded_thresholds('exposed wait / span', 'exposed wait below which nothing is reported'),
    Threshold(
        "min_wait_us", 100.0, "us",
        "a collective counts toward the straggler tally when some rank waited at least this long in it",
    ),
    Threshold(
        "skew_tolerance_us", 100.0, "us",
        "clock offsets between ranks below this are taken as one shared clock (not corrected)",
    ),
)  # fmt: skip
MAX_WINDOWS = 20
MAX_INSTANCES = 100


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    match = match_collectives(job, int(params["skew_tolerance_us"] * 1000))
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
        mine = _in_steps(rows, (rows["trace_id"] == trace) & (rows["device"] == device))
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
    if multi:
        result.findings.append(_summary(match, parts, min_wait))
    return result


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
        part = job.part_of(s_trace)  # the straggler's own reads: its rank's files only
        activity[key] = _straggler_activity(part, match, s_trace, s_device, min_wait)
    doing = activity[key]
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
            + f". {_doing_text(straggler, doing)}"
        ),
        recommendation=_recommendation(straggler, doing),
        impact_ns=exposed,
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


def _straggler_activity(
    job, match: CollectiveMatch, trace: str, device: int, min_wait: int
) -> dict:
    """What the straggler did in [its previous collective's end, its arrival] when others waited."""
    rows, inst = match.rows, match.instances
    mine = np.flatnonzero((rows["trace_id"] == trace) & (rows["device"] == device))
    ops = gpu_activity(job)[(trace, device)]
    lo = int(ops["start_ns"].min())
    prev_end = np.r_[lo, rows["end_ns"][mine][:-1]]
    ids = rows["inst"][mine]
    hit = rows["last"][mine] & (ids >= 0) & (inst["max_wait_ns"][np.maximum(ids, 0)] >= min_wait)
    hit &= _in_steps(rows, np.isin(np.arange(rows["step"].size), mine))[mine]
    a, b = prev_end[hit], rows["start_ns"][mine][hit]
    keep = b > a
    union = intervals.union(a[keep], b[keep])
    window = int((union[1] - union[0]).sum())
    if window == 0:
        return {"window_ns": 0}
    busy = covered_length(_union(ops, slice(None)), *union).sum()
    comp = covered_length(_union(ops, ops["is_kernel"] & ~ops["is_comm"]), *union).sum()
    idle = attribute_idle(job, trace, device)
    by_cause = {}
    if idle.per_gap.size:
        gap_len = np.maximum(idle.gap_ends - idle.gap_starts, 1)
        share = covered_length(union, idle.gap_starts, idle.gap_ends) / gap_len
        sums = (idle.per_gap * share[:, None]).sum(axis=0)
        by_cause = {c: int(sums[i]) for i, c in enumerate(CAUSES) if sums[i] >= 1}
    windows = [[int(s), int(e)] for s, e in zip(*union, strict=True)]
    return {
        "window_ns": window,
        "windows": len(windows),
        "gpu_busy_pct": round(100.0 * busy / window, 1),
        "compute_pct": round(100.0 * comp / window, 1),
        "idle_by_cause_ns": by_cause,
        "top_host_ops": top_host_ops(job, trace, launch_threads(job, trace, device), windows),
    }


def _doing_text(rank: int, doing: dict) -> str:
    if not doing.get("window_ns"):
        return ""
    causes = sorted(doing["idle_by_cause_ns"].items(), key=lambda kv: -kv[1])[:2]
    note = " (its host recorded no operation then: sleep, I/O or a blocking call)"
    idle = ", ".join(
        f"{c} {ns / 1e6:.1f} ms" + (note if c == "unknown" else "") for c, ns in causes
    )
    ops = ", ".join(o["name"] for o in doing["top_host_ops"][:3])
    # When the idle time is mostly unrecorded, the recorded operations are what the host did
    # around it, not the delay itself: say so rather than blame them.
    unrecorded = bool(causes) and causes[0][0] == "unknown"
    ops_text = (
        f"; its recorded host work in that time (around the unrecorded delay): {ops}"
        if unrecorded
        else f"; its host was in: {ops}"
    )
    return (
        f"Before arriving, rank {rank}'s GPU was busy {doing['gpu_busy_pct']:.0f}% of "
        f"{doing['window_ns'] / 1e6:.1f} ms (compute {doing['compute_pct']:.0f}%)"
        + (f"; its idle time by cause: {idle}" if idle else "")
        + (ops_text if ops else "")
        + "."
    )


def _recommendation(rank: int, doing: dict) -> str:
    if doing.get("window_ns") and doing["gpu_busy_pct"] < 50:
        return (
            f"Rank {rank}'s GPU sat idle waiting for its host before it joined: remove the host-side delay on that "
            "rank (data loading: more DataLoader workers, pinned memory, prefetch; rank-specific work such as "
            "logging, checkpointing or evaluation; Python garbage collection; a slow or oversubscribed CPU). "
            "Every other rank waits for the slowest one at each collective."
        )
    return (
        f"Rank {rank} was still computing: the ranks have unequal work. Balance it (even batch and sequence "
        "lengths, balanced pipeline stages, shards or expert routing), or check whether that GPU is slower "
        "(clocks, thermal throttling, a worse PCIe/NVLink path)."
    )


def _summary(match: CollectiveMatch, parts, min_wait: int) -> Finding:
    inst, rows = match.instances, match.rows
    n = inst["op"].size
    material = inst["max_wait_ns"] >= min_wait
    tally = {str(r): int((inst["straggler_rank"][material] == r).sum()) for r, _, _ in parts}
    caused = {str(r): 0 for r, _, _ in parts}
    ok = rows["inst"] >= 0
    culprit = inst["straggler_rank"][rows["inst"][ok]] if n else np.zeros(0, dtype=np.int64)
    for r in caused:
        caused[r] = int(rows["wait_ns"][ok][culprit == int(r)].sum())
    ops = _op_table(inst)
    skew = {str(r): match.skew_ns.get((t, d), 0) for r, t, d in parts}
    corrected = [r for r, t, d in parts if match.skew_corrected.get((t, d))]
    worst = max(caused, key=lambda r: caused[r]) if n else None
    return Finding(
        analyzer="nccl_wait",
        trace=parts[0][1],
        rank=parts[0][0],
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
            f"({int((~ok).sum())} kernels unmatched). Clock skew per rank (ns, from completion times): {skew}"
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
