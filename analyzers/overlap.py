"""``overlap``: how much communication (and copying) is hidden under compute.

Per trace and device, over unions of intervals (int64 ns):

* ``comm_overlap_pct`` = |compute ∩ comm| / |comm| × 100 (HTA's definition);
* ``exposed_comm_ns`` = |comm − compute|: communication with no compute kernel
  running beside it (TraceLens' "exposed communication");
* ``comm_ns`` = |comm|, and ``exposed_comm_wait_ns``: the part of the exposed
  communication spent waiting for a later rank (jobs with several ranks);
* ``memcpy_overlap_pct`` = |memcpy ∩ (compute ∪ comm)| / |memcpy| × 100 and
  ``exposed_memcpy_ns`` = |memcpy − compute − comm| (memsets count as copies).

Communication kernels are ``gpu.is_comm`` (collective metadata first, names
as the fallback: docs/schema.md); compute = every other kernel. Per step
(``ProfilerStep#N``; a GPU operation belongs to the step that launched it),
the same numbers go into the finding's evidence.

Exposed communication is split in two with :mod:`stallscope.collectives`:
the part spent *waiting* for a late rank (reported by ``nccl_wait``) and the
rest, the exposed transfer. Only the exposed transfer is this analyzer's time
lost (``impact_ns``): a finding when it is a material share of the span, with
the fix for the collectives seen (DDP buckets, FSDP prefetch, a separate
stream, fewer tiny collectives). Documented in docs/analyzers/overlap.md.
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
    pct,
)
from stallscope.collectives import covered_length, gpu_activity, match_collectives, step_windows
from stallscope.jobdata import JobData
from stallscope.scope import step_scope

THRESHOLDS = (
    *graded_thresholds('exposed transfer / span', 'exposed transfer below which nothing is reported'),
    Threshold("tiny_collective_kb", 1024.0, "KB", "median collective size below which collectives are called tiny"),
)  # fmt: skip
MAX_WINDOWS = 20
MAX_STEPS_IN_EVIDENCE = 50


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    activity = gpu_activity(job)
    match, ranked = None, False
    missing = _missing_ranks(job)
    for ref in job.traces:
        for (trace, device), ops in activity.items():
            if trace != ref.trace_id or not (ops["is_comm"].any() or (~ops["is_kernel"]).any()):
                continue
            if match is None and ops["is_comm"].any():
                match = match_collectives(job)
                ranked = match is not None and _participants(match) > 1
            waits = match.waits_of(trace, device) if match else (np.zeros(0, np.int64),) * 2
            rank = int(ref.meta.get("rank", 0))
            part = job.part_of(trace)  # per-trace queries read this rank's files only
            _device(part, result, trace, rank, device, ops, waits, params, missing, ranked)
    return result


def _uses_ddp(job: JobData, trace: str) -> bool:
    """Whether the trace shows DistributedDataParallel (its forward range, or its reducer)."""
    return job.sql(
        "SELECT EXISTS (SELECT 1 FROM names WHERE trace_id = ? AND (starts_with(name, "
        "'DistributedDataParallel') OR contains(name, 'c10d::Reducer')))",
        [trace],
    ).fetchone()[0]


def _missing_ranks(job: JobData) -> tuple[int, int] | None:
    """(ranks present, world size) when the traces say the job had more ranks than it holds."""
    ranks = {int(ref.meta.get("rank", 0)) for ref in job.traces}
    worlds = [w for ref in job.traces if isinstance(w := ref.meta.get("world_size"), int)]
    world = max(worlds, default=0)
    return (len(ranks), world) if world > len(ranks) else None


def _participants(match) -> int:
    """How many (trace, device) pairs take part in the job's collectives."""
    rows = match.rows
    return len(set(zip(rows["trace_id"].tolist(), rows["device"].tolist(), strict=True)))


def _device(
    job, result, trace, rank, device, ops, waits, params, missing=None, ranked=False
) -> None:
    kernel = ops["is_kernel"]
    comm_mask, comp_mask = kernel & ops["is_comm"], kernel & ~ops["is_comm"]
    comm, comp, copy = (_union(ops, m) for m in (comm_mask, comp_mask, ~kernel))
    seg = _Segments([comm, comp, copy, intervals.union(*waits)], step_windows(ops))
    in_comm, in_comp, in_copy, in_wait = (m & seg.scope for m in seg.masks)
    exposed = in_comm & ~in_comp
    totals = {
        "comm": seg.total(in_comm),
        "exposed": seg.total(exposed),
        "wait": seg.total(exposed & in_wait),
        "copy": seg.total(in_copy),
        "copy_exposed": seg.total(in_copy & ~in_comp & ~in_comm),
    }
    metric = _metric_adder(result, trace, rank, device)
    if totals["comm"]:
        metric("comm_overlap_pct", pct(totals["comm"] - totals["exposed"], totals["comm"]), "%")
        metric("exposed_comm_ns", totals["exposed"], "ns")
        metric("comm_ns", totals["comm"], "ns")
        if ranked:  # waiting is measurable only against other ranks' collectives
            metric("exposed_comm_wait_ns", totals["wait"], "ns")
    if totals["copy"]:
        metric(
            "memcpy_overlap_pct", pct(totals["copy"] - totals["copy_exposed"], totals["copy"]), "%"
        )
        metric("exposed_memcpy_ns", totals["copy_exposed"], "ns")
    transfer = totals["exposed"] - totals["wait"]
    span = (
        seg.total(seg.scope) if seg.steps.size else int(ops["end_ns"].max() - ops["start_ns"].min())
    )
    share = 100.0 * transfer / span if span else 0.0
    if not totals["comm"]:
        return
    severity = graded_severity(share, transfer, params)
    context = _context(job, trace, device, ops, comm_mask, comp_mask, params)
    overlap_pct = pct(totals["comm"] - totals["exposed"], totals["comm"])
    steps = seg.per_step({"comm_ns": in_comm, "exposed_comm_ns": exposed, "exposed_wait_ns": exposed & in_wait, "memcpy_ns": in_copy, "exposed_memcpy_ns": in_copy & ~in_comp & ~in_comm})  # fmt: skip
    for row in steps:
        row["comm_overlap_pct"] = pct(row["comm_ns"] - row["exposed_comm_ns"], row["comm_ns"])
    per_step = f" ({transfer / len(steps) / 1e6:.2f} ms per step)" if steps else ""
    windows = intervals.union(seg.start[exposed & ~in_wait], seg.end[exposed & ~in_wait])
    longest = np.argsort(windows[0] - windows[1], kind="stable")[:MAX_WINDOWS]
    if severity is None:  # below the ladder: say why in numbers, never "nothing to fix" over a loss
        context["tips"] = _below_threshold_tips(
            context["tips"], totals, transfer, overlap_pct, share, len(steps), params
        )
    result.findings.append(
        Finding(
            analyzer="overlap",
            trace=trace,
            rank=rank,
            device=device,
            severity=severity or "info",
            title=(
                f"GPU {device}: {transfer / 1e6:.1f} ms of communication not hidden under compute "
                f"({overlap_pct:.0f}% overlapped, {share:.1f}% of the time)"
                if severity
                else f"GPU {device}: communication {overlap_pct:.0f}% hidden under compute, "
                f"{transfer / 1e6:.2f} ms exposed transfer ({share:.1f}% of the time)"
            ),
            detail=(
                f"Communication kernels ran {totals['comm'] / 1e6:.2f} ms on GPU {device}; {overlap_pct:.1f}% of that "
                f"time had a compute kernel beside it. {totals['exposed'] / 1e6:.2f} ms was exposed, of which "
                f"{totals['wait'] / 1e6:.2f} ms waiting for other ranks (see nccl_wait) and {transfer / 1e6:.2f} ms "
                f"moving data with nothing else to do{per_step}. {context['summary']}"
                + (
                    f" Only {missing[0]} of the job's {missing[1]} ranks are in this analysis: waiting "
                    "for the missing ones cannot be told from moving data, so part of the exposed time "
                    "may be waiting (ingest every rank's trace together to split them)."
                    if missing
                    else ""
                )
            ),
            recommendation=" ".join(context["tips"]),
            impact_ns=transfer,
            evidence={
                "comm_ns": totals["comm"],
                "exposed_comm_ns": totals["exposed"],
                "exposed_wait_ns": totals["wait"],
                "exposed_transfer_ns": transfer,
                "comm_overlap_pct": overlap_pct,
                "memcpy_ns": totals["copy"],
                "exposed_memcpy_ns": totals["copy_exposed"],
                "share_of_span_pct": round(share, 3),
                "scope": "steps" if seg.steps.size else "trace",
                "ranks_present": missing[0] if missing else None,
                "world_size": missing[1] if missing else None,
                "comm_streams": context["comm_streams"],
                "shared_streams": context["shared_streams"],
                "ops": context["ops"],
                "collectives_per_step": context["per_step"],
                "median_collective_bytes": context["median_bytes"],
                "steps": steps[:MAX_STEPS_IN_EVIDENCE],
            },
            windows=[[int(windows[0][i]), int(windows[1][i])] for i in longest],
        )
    )


WELL_HIDDEN_PCT = 90.0  # communication this much overlapped has nothing left to hide


def _below_threshold_tips(tips, totals, transfer, overlap_pct, share, steps, params) -> list[str]:
    """Advice for exposed transfer under the low-severity share: the numbers, then the fix
    that fits (or why none is needed). "Nothing to fix" only when communication is hidden."""
    if totals["wait"] > transfer:
        return [
            "Most exposed communication here is waiting for a late rank: see the nccl_wait findings."
        ]
    if overlap_pct >= WELL_HIDDEN_PCT or transfer == 0:
        return [f"Nothing to fix: {overlap_pct:.0f}% of communication is hidden under compute."]
    per_step = f"{transfer / steps / 1e6:.2f} ms per step, " if steps else ""
    size = (
        f"The exposed transfer ({per_step}{share:.1f}% of the time) is under the "
        f"{params['share_pct_low']:g}% at which it is reported as a loss: hiding all of it gains at most "
        f"{share:.1f}%."
    )
    return [size, *tips]


class _Segments:
    """Elementary segments between all edges of some unions and of the step windows.

    ``masks[i]``: segments inside ``unions[i]``; ``scope``: segments inside a
    step window (every segment when there are no steps); ``which``: step index.
    """

    def __init__(self, unions: list[tuple[np.ndarray, np.ndarray]], windows):
        self.steps, lo, hi = windows
        edges = np.sort(np.concatenate([e for u in unions for e in u] + [lo, hi]))
        edges = edges[np.r_[True, edges[1:] != edges[:-1]]] if edges.size else edges
        self.start, self.end = edges[:-1], edges[1:]
        self.length = self.end - self.start
        self.masks = [covered_length(u, self.start, self.end) > 0 for u in unions]
        self.which = np.searchsorted(lo, self.start, side="right") - 1
        if self.steps.size:
            self.scope = (self.which >= 0) & (self.start < hi[np.maximum(self.which, 0)])
        else:
            self.scope = np.ones(self.start.size, dtype=bool)

    def total(self, mask: np.ndarray) -> int:
        return int(self.length[mask].sum())

    def per_step(self, columns: dict[str, np.ndarray]) -> list[dict]:
        """Totals of each column's segments per step."""
        rows = [{"step": int(s)} for s in self.steps]
        if not rows:
            return rows
        for name, mask in columns.items():
            m = mask & self.scope
            sums = np.bincount(self.which[m], self.length[m], minlength=self.steps.size)
            for row, value in zip(rows, sums, strict=True):
                row[name] = int(value)
        return rows


def _context(job, trace, device, ops, comm_mask, comp_mask, params) -> dict:
    """What the communication looks like, and the fixes that fit it."""
    comm_streams = sorted(set(ops["stream"][comm_mask].tolist()))
    shared = sorted(set(comm_streams) & set(ops["stream"][comp_mask].tolist()))
    # The collectives of the step scope (set-up broadcasts of a whole-run capture are out).
    scope = step_scope(job, trace, device)
    where = "trace_id = ? AND device = ?" + (
        f" AND start_ns >= {scope[0]} AND start_ns < {scope[1]}" if scope else ""
    )
    rows = job.sql(
        f"SELECT op, count(*), median(coalesce(in_bytes, out_bytes)) FROM collectives "
        f"WHERE {where} GROUP BY 1 ORDER BY 2 DESC",
        [trace, device],
    ).fetchall()
    counts = {str(op): int(n) for op, n, _ in rows}
    sizes = job.sql(
        f"SELECT median(coalesce(in_bytes, out_bytes)) FROM collectives WHERE {where}",
        [trace, device],
    ).fetchone()[0]
    in_step = ops["step"] >= 0
    steps = np.unique(ops["step"][in_step]).size
    per_step = round(int((comm_mask & in_step).sum()) / steps, 1) if steps else None
    main = rows[0][0] if rows else "unknown"
    tips = []
    if shared:
        tips.append(
            f"Communication runs on the compute stream ({', '.join(map(str, shared))}): issue collectives on their own "
            "stream (async_op=True, or a dedicated torch.cuda.Stream) so they can run beside compute."
        )
    if main == "allreduce" and _uses_ddp(job, trace):
        tips.append(
            "DistributedDataParallel is in use, so gradient buckets already all-reduce while backward runs: "
            "what stays exposed is mostly the last buckets after backward ends. Tune bucket_cap_mb (smaller "
            "buckets start sooner and shrink the exposed last bucket, larger ones cut per-call latency), set "
            "gradient_as_bucket_view=True, and static_graph=True when the graph does not change; with "
            "gradient accumulation, skip the all-reduce of the inner steps with no_sync()."
        )
    elif main == "allreduce":
        tips.append(
            "For gradient all-reduce use DistributedDataParallel, which all-reduces gradient buckets while backward "
            "still runs (instead of one all_reduce loop after loss.backward()); tune bucket_cap_mb (smaller buckets "
            "start sooner and shrink the exposed last bucket, larger ones cut per-call latency), and set "
            "gradient_as_bucket_view=True to save the bucket copies."
        )
    elif main in ("allgather", "reducescatter"):
        tips.append(
            "With FSDP, prefetch the next all-gather: backward_prefetch=BackwardPrefetch.BACKWARD_PRE and "
            "forward_prefetch=True (FSDP2: set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), "
            "and keep reshard_after_forward=False for the last blocks."
        )
    elif main == "alltoall":
        tips.append(
            "Overlap all-to-all with expert or embedding compute by splitting the batch into chunks and pipelining "
            "dispatch, compute and combine."
        )
    tiny_kb = params["tiny_collective_kb"]
    if sizes is not None and sizes < tiny_kb * 1024:
        tips.append(
            f"The collectives are small (median {sizes / 1024:.0f} KB): they are latency-bound, so use fewer, larger "
            "ones (flatten or coalesce tensors, larger buckets)."
        )
    if not tips:
        tips.append("Start communication earlier or overlap it with independent compute.")
    ops_text = (
        ", ".join(f"{n} {op}" for op, n in counts.items())
        or f"{int(comm_mask.sum())} communication kernels"
    )
    summary = (
        f"Collectives: {ops_text}"
        + (f" ({per_step} per step" if per_step is not None else "")
        + (f", median {sizes / 1e6:.2f} MB" if sizes is not None else "")
        + (")" if per_step is not None else "")
        + f" on stream(s) {', '.join(map(str, comm_streams))}."
    )
    return {
        "tips": tips,
        "summary": summary,
        "comm_streams": comm_streams,
        "shared_streams": shared,
        "ops": counts,
        "per_step": per_step,
        "median_bytes": None if sizes is None else int(sizes),
    }


def _union(ops: dict, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return intervals.union(ops["start_ns"][mask], ops["end_ns"][mask])


def _metric_adder(result, trace, rank, device):
    def add(name, value, unit):
        result.metrics.append(Metric(trace, rank, device, name, value, unit))

    return add


SPEC = AnalyzerSpec(
    id="overlap",
    title="Communication overlap",
    description="Communication and copies hidden under compute, exposed communication per rank and step, and the fix.",
    run=run,
    thresholds=THRESHOLDS,
)
