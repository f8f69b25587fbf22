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
    graded_severity,
    graded_thresholds,
    pct,
)
from stallscope.collectives import covered_length, gpu_activity, match_collectives, step_windows
from stallscope.jobdata import JobData
from stallscope.rank_card import collective_summaries
from stallscope.report_types import CommOverlapRow

THRESHOLDS = (
    *graded_thresholds('exposed transfer / span', 'exposed transfer below which nothing is reported'),
    Threshold("tiny_collective_kb", 1024.0, "KB", "median collective size below which collectives are called tiny"),
)  # fmt: skip
MAX_WINDOWS = 20
MAX_STEPS_IN_EVIDENCE = 50


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    result = AnalyzerResult()
    activity = gpu_activity(job)
    missing = _missing_ranks(job)
    devices_of: dict[str, list[int]] = {}  # trace -> its devices, in activity order
    for trace, device in activity:
        devices_of.setdefault(trace, []).append(device)
    wheres = []
    for ref in job.traces:
        for trace, device in ((ref.trace_id, d) for d in devices_of.get(ref.trace_id, [])):
            ops = activity[(trace, device)]
            if ops["is_comm"].any() or (~ops["is_kernel"]).any():
                wheres.append(Where(trace, int(ref.meta.get("rank", 0)), device))
    match = None
    if any(activity[(w.trace, w.device)]["is_comm"].any() for w in wheres):
        match = match_collectives(job)
    ranked = match is not None and _participants(match) > 1
    for m in measure_devices(job, wheres, match, missing=missing, ranked=ranked):
        result.metrics.extend(metrics(m))
        result.tables.comm_overlap.extend(comm_rows(m))
        finding = speak(m, params)
        if finding:
            result.findings.append(finding)
    return result


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


class Collectives(msgspec.Struct, kw_only=True):
    """What one device's communication looks like (:func:`measure_collectives`)."""

    comm_kernels: int  # communication kernels of the device
    comm_streams: list[int]  # streams that run them
    shared_streams: list[int]  # of those, the ones that also run compute kernels
    ops: dict[str, int]  # collective op -> count in the step scope, most first
    per_step: float | None  # communication kernels per step (1 decimal); None without steps
    median_bytes: float | None  # median collective size; None when the trace lacks sizes
    uses_ddp: bool  # the trace shows DistributedDataParallel
    has_backward: bool = False  # the trace has autograd backward ops (training, not forward-only)

    @property
    def main_op(self) -> str:
        return next(iter(self.ops), "unknown")


class CommOverlap(msgspec.Struct, kw_only=True):
    """One device's communication and copies against its compute: :func:`measure_device`.

    Lengths are ns of interval unions inside the step scope (the trace when it
    has no steps). No prose: :func:`speak` writes the finding from it.
    """

    where: Where
    comm_ns: int  # |comm|
    exposed_ns: int  # |comm - compute|
    wait_ns: int  # the part of exposed_ns spent waiting for a later rank
    copy_ns: int  # |memcpy ∪ memset|
    copy_exposed_ns: int  # |copies - compute - comm|
    span_ns: int  # the step scope's length (first to last GPU operation without steps)
    scope: str  # "steps" or "trace"
    ranked: bool  # waiting is measured against other ranks' collectives
    missing: tuple[int, int] | None  # (ranks present, world size) when ranks are missing
    steps: list[dict]  # per step: comm, exposed, wait and copy ns, comm_overlap_pct
    windows: list[list[int]]  # the longest stretches of exposed transfer
    collectives: Collectives | None  # None without communication

    @property
    def transfer_ns(self) -> int:
        """Exposed communication that is not waiting: data moving with nothing else to do."""
        return self.exposed_ns - self.wait_ns

    @property
    def overlap_pct(self) -> float:
        return pct(self.comm_ns - self.exposed_ns, self.comm_ns)

    @property
    def share_pct(self) -> float:
        """The exposed transfer as a share of the span (unrounded)."""
        return 100.0 * self.transfer_ns / self.span_ns if self.span_ns else 0.0


def measure_device(
    job: JobData,
    where: Where,
    ops: dict,
    waits: tuple[np.ndarray, np.ndarray],
    *,
    missing: tuple[int, int] | None = None,
    ranked: bool = False,
) -> CommOverlap:
    """One device's overlap from its GPU operations ``ops`` (:func:`gpu_activity`) and
    the intervals it waited for later ranks ``waits`` (starts, ends)."""
    kernel = ops["is_kernel"]
    comm_mask, comp_mask = kernel & ops["is_comm"], kernel & ~ops["is_comm"]
    comm, comp, copy = (_union(ops, m) for m in (comm_mask, comp_mask, ~kernel))
    seg = _Segments([comm, comp, copy, intervals.union(*waits)], step_windows(ops))
    in_comm, in_comp, in_copy, in_wait = (m & seg.scope for m in seg.masks)
    exposed = in_comm & ~in_comp
    steps = seg.per_step({"comm_ns": in_comm, "exposed_comm_ns": exposed, "exposed_wait_ns": exposed & in_wait, "memcpy_ns": in_copy, "exposed_memcpy_ns": in_copy & ~in_comp & ~in_comm})  # fmt: skip
    for row in steps:
        row["comm_overlap_pct"] = pct(row["comm_ns"] - row["exposed_comm_ns"], row["comm_ns"])
    windows = intervals.union(seg.start[exposed & ~in_wait], seg.end[exposed & ~in_wait])
    longest = np.argsort(windows[0] - windows[1], kind="stable")[:MAX_WINDOWS]
    comm_ns = seg.total(in_comm)
    return CommOverlap(
        where=where,
        comm_ns=comm_ns,
        exposed_ns=seg.total(exposed),
        wait_ns=seg.total(exposed & in_wait),
        copy_ns=seg.total(in_copy),
        copy_exposed_ns=seg.total(in_copy & ~in_comp & ~in_comm),
        span_ns=seg.total(seg.scope)
        if seg.steps.size
        else int(ops["end_ns"].max() - ops["start_ns"].min()),
        scope="steps" if seg.steps.size else "trace",
        ranked=ranked,
        missing=missing,
        steps=steps,
        windows=[[int(windows[0][i]), int(windows[1][i])] for i in longest],
        collectives=measure_collectives(job, where, ops, comm_mask, comp_mask) if comm_ns else None,
    )


def measure_devices(
    job: JobData,
    wheres: list[Where],
    match,
    *,
    missing: tuple[int, int] | None = None,
    ranked: bool = False,
) -> list[CommOverlap]:
    """:func:`measure_device` of every device in ``wheres`` at once (the same numbers).

    All devices' operations and waits are laid end to end on one axis (each device's own
    clock shifted into a block of its own), so the unions, elementary segments and sums are
    a few numpy passes over the job instead of ~100 numpy calls per device. A device whose
    steps' first operations are not in step order is measured alone (:func:`measure_device`).
    """
    if not wheres:
        return []
    activity = gpu_activity(job)
    opss = [activity[(w.trace, w.device)] for w in wheres]
    waits = [
        match.waits_of(w.trace, w.device) if match else (np.zeros(0, np.int64),) * 2 for w in wheres
    ]
    batch = _Batch(opss, waits)
    out = []
    for d, (w, ops) in enumerate(zip(wheres, opss, strict=True)):
        if batch.irregular[d]:
            out.append(measure_device(job, w, ops, waits[d], missing=missing, ranked=ranked))
            continue
        comm_ns = int(batch.totals["comm"][d])
        n_steps = int(batch.step_count[d])
        out.append(
            CommOverlap(
                where=w,
                comm_ns=comm_ns,
                exposed_ns=int(batch.totals["exposed"][d]),
                wait_ns=int(batch.totals["wait"][d]),
                copy_ns=int(batch.totals["copy"][d]),
                copy_exposed_ns=int(batch.totals["copy_exposed"][d]),
                span_ns=int(batch.totals["scope"][d])
                if n_steps
                else int(ops["end_ns"].max() - ops["start_ns"].min()),
                scope="steps" if n_steps else "trace",
                ranked=ranked,
                missing=missing,
                steps=batch.step_rows(d),
                windows=batch.windows_of(d),
                collectives=batch.collectives(job, w, d) if comm_ns else None,
            )
        )
    return out


class _Batch:
    """:func:`measure_device`'s segments for many devices on one axis (see
    :func:`measure_devices`). Per device ``d``: ``totals[name][d]`` (ns), its step rows and
    its longest exposed-transfer windows (own clock)."""

    def __init__(self, opss: list[dict], waits: list[tuple[np.ndarray, np.ndarray]]):
        n_dev = len(opss)
        sizes = np.array([o["start_ns"].size for o in opss], dtype=np.int64)
        self.cut = np.r_[0, np.cumsum(sizes)]
        dev = np.repeat(np.arange(n_dev), sizes)
        cat = {c: np.concatenate([o[c] for o in opss]) for c in ("is_kernel", "is_comm", "start_ns", "end_ns", "step", "stream")}  # fmt: skip
        self.kernel, self.comm = cat["is_kernel"], cat["is_comm"]
        self._streams(dev, cat["stream"], cat["step"] >= 0)
        w_sizes = np.array([a.size for a, _ in waits], dtype=np.int64)
        w_dev = np.repeat(np.arange(n_dev), w_sizes)
        w_s = np.concatenate([a for a, _ in waits]).astype(np.int64)
        w_e = np.concatenate([b for _, b in waits]).astype(np.int64)
        # each device's block: its own times shifted by shift[d]; one ns apart from the next
        big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        lo, hi = np.full(n_dev, big), np.full(n_dev, small)
        np.minimum.at(lo, dev, cat["start_ns"])
        np.maximum.at(hi, dev, cat["end_ns"])
        np.minimum.at(lo, w_dev, w_s)
        np.maximum.at(hi, w_dev, w_e)
        lo, hi = np.where(lo == big, 0, lo), np.where(hi == small, 0, hi)
        width = np.maximum(hi - lo, 0) + 2
        base = np.r_[0, np.cumsum(width)[:-1]]
        self.base, self.block_end = base, base + width - 2
        self.shift = base - lo
        start, end = cat["start_ns"] + self.shift[dev], cat["end_ns"] + self.shift[dev]
        kernel, comm = self.kernel, self.comm

        def union(mask):
            return intervals.union(start[mask], end[mask])

        unions = [
            union(kernel & comm),
            union(kernel & ~comm),
            union(~kernel),
            intervals.union(w_s + self.shift[w_dev], w_e + self.shift[w_dev]),
        ]
        # steps per device (np.unique per device = sorted by (device, step)) and windows
        owned = cat["step"] >= 0
        self.step_dev, self.step_id = _unique_pairs(dev[owned], cat["step"][owned])
        idx = np.searchsorted(self.step_dev * (1 << 40) + self.step_id, dev[owned] * (1 << 40) + cat["step"][owned])  # fmt: skip
        s_lo = np.full(self.step_id.size, big)
        s_hi = np.zeros(self.step_id.size, dtype=np.int64)
        np.minimum.at(s_lo, idx, start[owned])
        np.maximum.at(s_hi, idx, end[owned])
        same = self.step_dev[1:] == self.step_dev[:-1]  # step k+1 is on step k's device
        s_hi[:-1] = np.where(same, s_lo[1:], s_hi[:-1])
        # a device whose step windows do not start in step order is measured alone (its
        # steps left out here: the windows must be sorted along the axis)
        back = (s_lo[1:] <= s_lo[:-1]) & same
        self.irregular = np.bincount(self.step_dev[1:][back], minlength=n_dev) > 0
        keep = ~self.irregular[self.step_dev]
        self.step_dev, self.step_id = self.step_dev[keep], self.step_id[keep]
        s_lo, s_hi = s_lo[keep], s_hi[keep]
        self.step_count = np.bincount(self.step_dev, minlength=n_dev)
        self.step_first = np.r_[0, np.cumsum(self.step_count)[:-1]]
        edges = _sorted_unique(np.concatenate([e for u in unions for e in u] + [s_lo, s_hi]))
        seg_s, seg_e = edges[:-1], edges[1:]
        seg_dev = np.searchsorted(base, seg_s, side="right") - 1
        valid = seg_e <= self.block_end[np.maximum(seg_dev, 0)]
        self.length = seg_e - seg_s
        in_comm, in_comp, in_copy, in_wait = (_covers(u, seg_s) for u in unions)
        which = np.searchsorted(s_lo, seg_s, side="right") - 1
        wk = np.maximum(which, 0)
        has_steps = self.step_count[np.maximum(seg_dev, 0)] > 0
        if s_lo.size:
            in_step = (which >= 0) & (self.step_dev[wk] == seg_dev) & (seg_s < s_hi[wk])
        else:  # no device has steps
            in_step = np.zeros(seg_s.size, dtype=bool)
        scope = valid & np.where(has_steps, in_step, True)
        in_comm, in_comp, in_copy, in_wait = (
            m & scope for m in (in_comm, in_comp, in_copy, in_wait)
        )
        exposed = in_comm & ~in_comp
        masks = {
            "comm": in_comm,
            "exposed": exposed,
            "wait": exposed & in_wait,
            "copy": in_copy,
            "copy_exposed": in_copy & ~in_comp & ~in_comm,
            "scope": scope,
        }
        sd = np.maximum(seg_dev, 0)
        self.totals = {
            k: np.bincount(sd[m], self.length[m], minlength=n_dev).astype(np.int64)
            for k, m in masks.items()
        }
        per_step = {"comm_ns": "comm", "exposed_comm_ns": "exposed", "exposed_wait_ns": "wait", "memcpy_ns": "copy", "exposed_memcpy_ns": "copy_exposed"}  # fmt: skip
        n_steps = self.step_id.size
        self.step_sums = {
            col: np.bincount(wk[masks[k] & in_step], self.length[masks[k] & in_step], minlength=n_steps).astype(np.int64)
            for col, k in per_step.items()
        }  # fmt: skip
        win = exposed & ~in_wait
        ws, we = intervals.union(seg_s[win], seg_e[win])
        w_dev_of = np.searchsorted(base, ws, side="right") - 1
        order = np.lexsort((np.arange(ws.size), ws - we, w_dev_of))  # per device, longest first
        self.win_s, self.win_e, self.win_dev = ws[order], we[order], w_dev_of[order]

    def step_rows(self, d: int) -> list[dict]:
        """Device ``d``'s per-step rows, as :meth:`_Segments.per_step` and measure_device."""
        lo = int(self.step_first[d])
        rows = []
        for k in range(lo, lo + int(self.step_count[d])):
            row = {"step": int(self.step_id[k])}
            for col, sums in self.step_sums.items():
                row[col] = int(sums[k])
            row["comm_overlap_pct"] = pct(row["comm_ns"] - row["exposed_comm_ns"], row["comm_ns"])
            rows.append(row)
        return rows

    def windows_of(self, d: int) -> list[list[int]]:
        """Device ``d``'s :data:`MAX_WINDOWS` longest exposed-transfer stretches (own clock)."""
        a = int(np.searchsorted(self.win_dev, d, side="left"))
        b = min(int(np.searchsorted(self.win_dev, d, side="right")), a + MAX_WINDOWS)
        s = int(self.shift[d])
        return [
            [int(x) - s, int(y) - s] for x, y in zip(self.win_s[a:b], self.win_e[a:b], strict=True)
        ]

    def _streams(self, dev, stream, in_step) -> None:
        """Per device: its communication streams, those shared with compute, its
        communication kernels and those launched in a step (:func:`measure_collectives`)."""
        n_dev = self.cut.size - 1
        comm, comp = self.kernel & self.comm, self.kernel & ~self.comm

        def streams_of(mask) -> list[list[int]]:
            devs, values = _unique_pairs(dev[mask], stream[mask])
            cut = np.searchsorted(devs, np.arange(n_dev + 1))
            values = values.tolist()
            return [values[a:b] for a, b in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True)]

        self.comm_streams, self.comp_streams = streams_of(comm), streams_of(comp)
        self.comm_count = np.bincount(dev[comm], minlength=n_dev)
        self.comm_in_step = np.bincount(dev[comm & in_step], minlength=n_dev)

    def collectives(self, job: JobData, where: Where, d: int) -> Collectives:
        """:func:`measure_collectives` of device ``d`` from the batch's columns."""
        comm_streams = self.comm_streams[d]
        summary = collective_summaries(job).get((where.trace, where.device)) or {
            "ops": {}, "median_bytes": None, "uses_ddp": False
        }  # fmt: skip
        steps = int(self.step_count[d])
        main = next(iter(summary["ops"]), None)
        return Collectives(
            comm_kernels=int(self.comm_count[d]),
            comm_streams=comm_streams,
            shared_streams=sorted(set(comm_streams) & set(self.comp_streams[d])),
            ops=dict(summary["ops"]),
            per_step=round(int(self.comm_in_step[d]) / steps, 1) if steps else None,
            median_bytes=summary["median_bytes"],
            uses_ddp=main == "allreduce" and summary["uses_ddp"],
            has_backward=where.trace in backward_traces(job),
        )


def _covers(union: tuple[np.ndarray, np.ndarray], seg_s: np.ndarray) -> np.ndarray:
    """Whether the sorted, disjoint ``union`` covers each elementary segment starting at
    ``seg_s``: the segments are cut at every edge of the union, so each lies wholly inside
    one of its intervals or outside all of them, and its start tells which (one search,
    the same answer as ``covered_length(union, seg_s, seg_e) > 0``)."""
    us, ue = union
    if us.size == 0:
        return np.zeros(seg_s.size, dtype=bool)
    j = np.searchsorted(us, seg_s, side="right") - 1
    return (j >= 0) & (seg_s < ue[np.maximum(j, 0)])


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """``np.unique(x)`` of an int64 array, by one sort."""
    x = np.sort(x)
    return x[np.r_[True, x[1:] != x[:-1]]] if x.size else x


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs of two int64 arrays, sorted by a then b (one int64 key)."""
    if a.size == 0:
        return a.astype(np.int64), b.astype(np.int64)
    b_lo = int(b.min())
    span = int(b.max()) - b_lo + 1
    key = _sorted_unique(a.astype(np.int64) * span + (b.astype(np.int64) - b_lo))
    return key // span, key % span + b_lo


def metrics(m: CommOverlap) -> list[Metric]:
    """The overlap metrics (comm ones with communication, memcpy ones with copies)."""
    w = m.where
    out = []
    if m.comm_ns:
        out.append(Metric(w.trace, w.rank, w.device, "comm_overlap_pct", m.overlap_pct, "%"))
        out.append(Metric(w.trace, w.rank, w.device, "exposed_comm_ns", m.exposed_ns, "ns"))
        out.append(Metric(w.trace, w.rank, w.device, "comm_ns", m.comm_ns, "ns"))
        if m.ranked:  # waiting is measurable only against other ranks' collectives
            out.append(Metric(w.trace, w.rank, w.device, "exposed_comm_wait_ns", m.wait_ns, "ns"))
    if m.copy_ns:
        hidden = pct(m.copy_ns - m.copy_exposed_ns, m.copy_ns)
        out.append(Metric(w.trace, w.rank, w.device, "memcpy_overlap_pct", hidden, "%"))
        out.append(Metric(w.trace, w.rank, w.device, "exposed_memcpy_ns", m.copy_exposed_ns, "ns"))
    return out


def comm_rows(m: CommOverlap) -> list[CommOverlapRow]:
    """The device's row of the report's ``comm_overlap`` table (none without communication)."""
    if not m.comm_ns or m.collectives is None:
        return []
    w = m.where
    return [
        CommOverlapRow(
            trace=w.trace,
            rank=w.rank,
            device=w.device,
            comm_ns=m.comm_ns,
            comm_overlap_pct=m.overlap_pct,
            exposed_comm_ns=m.exposed_ns,
            exposed_wait_ns=m.wait_ns,
            memcpy_ns=m.copy_ns,
            exposed_memcpy_ns=m.copy_exposed_ns,
        )
    ]


def speak(m: CommOverlap, params: dict) -> Finding | None:
    """The device's finding (None without communication): graded by the exposed
    transfer's share of the span, ``info`` below the ladder."""
    c = m.collectives
    if not m.comm_ns or c is None:
        return None
    device, transfer, share, overlap_pct = m.where.device, m.transfer_ns, m.share_pct, m.overlap_pct
    severity = graded_severity(share, transfer, params)
    tips = _tips(c, params)
    per_step = f" ({transfer / len(m.steps) / 1e6:.2f} ms per step)" if m.steps else ""
    if severity is None:  # below the ladder: say why in numbers, never "nothing to fix" over a loss
        tips = _below_threshold_tips(tips, m, params)
    missing = m.missing
    return Finding(
        analyzer="overlap",
        trace=m.where.trace,
        rank=m.where.rank,
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
            f"Communication kernels ran {m.comm_ns / 1e6:.2f} ms on GPU {device}; {overlap_pct:.1f}% of that "
            f"time had a compute kernel beside it. {m.exposed_ns / 1e6:.2f} ms was exposed, of which "
            f"{m.wait_ns / 1e6:.2f} ms waiting for other ranks (see nccl_wait) and {transfer / 1e6:.2f} ms "
            f"moving data with nothing else to do{per_step}. {_summary(c)}"
            + (
                f" Only {missing[0]} of the job's {missing[1]} ranks are in this analysis: waiting "
                "for the missing ones cannot be told from moving data, so part of the exposed time "
                "may be waiting (ingest every rank's trace together to split them)."
                if missing
                else ""
            )
        ),
        recommendation=" ".join(tips),
        impact_ns=transfer,
        evidence={
            "comm_ns": m.comm_ns,
            "exposed_comm_ns": m.exposed_ns,
            "exposed_wait_ns": m.wait_ns,
            "exposed_transfer_ns": transfer,
            "comm_overlap_pct": overlap_pct,
            "memcpy_ns": m.copy_ns,
            "exposed_memcpy_ns": m.copy_exposed_ns,
            "share_of_span_pct": round(share, 3),
            "scope": m.scope,
            "ranks_present": missing[0] if missing else None,
            "world_size": missing[1] if missing else None,
            "comm_streams": c.comm_streams,
            "shared_streams": c.shared_streams,
            "ops": c.ops,
            "collectives_per_step": c.per_step,
            "median_collective_bytes": None if c.median_bytes is None else int(c.median_bytes),
            "steps": m.steps[:MAX_STEPS_IN_EVIDENCE],
        },
        windows=m.windows,
    )


WELL_HIDDEN_PCT = 90.0  # communication this much overlapped has nothing left to hide


def _below_threshold_tips(tips: list[str], m: CommOverlap, params: dict) -> list[str]:
    """Advice for exposed transfer under the low-severity share: the numbers, then the fix
    that fits (or why none is needed). "Nothing to fix" only when communication is hidden."""
    transfer, overlap_pct, share = m.transfer_ns, m.overlap_pct, m.share_pct
    if m.wait_ns > transfer:
        return [
            "Most exposed communication here is waiting for a late rank: see the nccl_wait findings."
        ]
    if overlap_pct >= WELL_HIDDEN_PCT or transfer == 0:
        return [f"Nothing to fix: {overlap_pct:.0f}% of communication is hidden under compute."]
    per_step = f"{transfer / len(m.steps) / 1e6:.2f} ms per step, " if m.steps else ""
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


def measure_collectives(
    job: JobData, where: Where, ops: dict, comm_mask: np.ndarray, comp_mask: np.ndarray
) -> Collectives:
    """The device's collectives in the step scope (set-up broadcasts of a whole-run
    capture are out), their streams and sizes. The scope, op counts, sizes and DDP come
    from the rank cards (:func:`stallscope.rank_card.collective_summaries`: two queries over
    all ranks' cards, not a query per rank)."""
    comm_streams = sorted(set(ops["stream"][comm_mask].tolist()))
    shared = sorted(set(comm_streams) & set(ops["stream"][comp_mask].tolist()))
    summary = collective_summaries(job).get((where.trace, where.device)) or {
        "ops": {}, "median_bytes": None, "uses_ddp": False
    }  # fmt: skip
    in_step = ops["step"] >= 0
    steps = np.unique(ops["step"][in_step]).size
    main = next(iter(summary["ops"]), None)
    return Collectives(
        comm_kernels=int(comm_mask.sum()),
        comm_streams=comm_streams,
        shared_streams=shared,
        ops=dict(summary["ops"]),
        per_step=round(int((comm_mask & in_step).sum()) / steps, 1) if steps else None,
        median_bytes=summary["median_bytes"],
        uses_ddp=main == "allreduce" and summary["uses_ddp"],
        has_backward=where.trace in backward_traces(job),
    )


_BACKWARD_SQL = """
SELECT DISTINCT trace_id FROM names WHERE list_contains(?, trace_id)
  AND (contains(lower(name), 'backward') OR starts_with(name, 'autograd::engine'))
"""


def backward_traces(job: JobData) -> set[str]:
    """The job's traces with an autograd backward pass (an op named ``...Backward...`` or
    ``autograd::engine...``); one query for the job, cached on ``job``. A trace without
    one is forward-only (inference or serving), so gradient all-reduce advice does not fit."""
    if "backward_traces" not in job.cache:
        traces = [ref.trace_id for ref in job.traces]
        rows = job.sql(_BACKWARD_SQL, [traces]).fetchall()
        job.cache["backward_traces"] = {str(r[0]) for r in rows}
    return job.cache["backward_traces"]


def _tiny(c: Collectives, params: dict) -> bool:
    """Whether the median collective is under ``tiny_collective_kb`` (latency-bound)."""
    return c.median_bytes is not None and c.median_bytes < params["tiny_collective_kb"] * 1024


def _tips(c: Collectives, params: dict) -> list[str]:
    """The fixes that fit the collectives seen."""
    shared, main, sizes = c.shared_streams, c.main_op, c.median_bytes
    tips = []
    if shared:
        tips.append(
            f"Communication runs on the compute stream ({', '.join(map(str, shared))}): issue collectives on their own "
            "stream (async_op=True, or a dedicated torch.cuda.Stream) so they can run beside compute."
        )
    if main == "allreduce" and c.uses_ddp:
        tips.append(
            "DistributedDataParallel is in use, so gradient buckets already all-reduce while backward runs: "
            "what stays exposed is mostly the last buckets after backward ends. Tune bucket_cap_mb (smaller "
            "buckets start sooner and shrink the exposed last bucket, larger ones cut per-call latency), set "
            "gradient_as_bucket_view=True, and static_graph=True when the graph does not change; with "
            "gradient accumulation, skip the all-reduce of the inner steps with no_sync()."
        )
    elif main == "allreduce" and not c.has_backward:
        tips.append(
            "The trace records no backward pass (no autograd or *Backward operators), so these all-reduces are "
            "not gradient all-reduces of a recorded backward; in forward-only work (inference, tensor-parallel "
            "serving) they carry activations. Overlap them with compute: async tensor parallelism or fused "
            "compute-collective kernels (e.g. GEMM + all-reduce), and start the next layer's independent compute "
            "while the all-reduce runs"
            + (
                "."
                if _tiny(c, params)
                else "; fewer, larger collectives also cut per-call latency."
            )
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
    if _tiny(c, params):
        tips.append(
            f"The collectives are small (median {sizes / 1024:.0f} KB): they are latency-bound, so use fewer, larger "
            "ones (flatten or coalesce tensors, larger buckets)."
        )
    if not tips:
        tips.append("Start communication earlier or overlap it with independent compute.")
    return tips


def _summary(c: Collectives) -> str:
    """One sentence: the collectives, how many per step, their median size, their streams."""
    ops_text = (
        ", ".join(f"{n} {op}" for op, n in c.ops.items())
        or f"{c.comm_kernels} communication kernels"
    )
    return (
        f"Collectives: {ops_text}"
        + (f" ({c.per_step} per step" if c.per_step is not None else "")
        + (f", median {c.median_bytes / 2**20:.2f} MiB" if c.median_bytes is not None else "")
        + (")" if c.per_step is not None else "")
        + f" on stream(s) {', '.join(map(str, c.comm_streams))}."
    )


def _union(ops: dict, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return intervals.union(ops["start_ns"][mask], ops["end_ns"][mask])


SPEC = AnalyzerSpec(
    id="overlap",
    order=60,
    title="Communication overlap",
    description="Communication and copies hidden under compute, exposed communication per rank and step, and the fix.",
    run=run,
    thresholds=THRESHOLDS,
)
