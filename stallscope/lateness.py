"""How late each straggler was, why, and what it would save to be on time.

Built on :mod:`stallscope.collectives` (matched instances) and
:mod:`stallscope.critical_path` (the what-if replay). Times are int64 ns.

**Lateness interval.** For each matched instance, every rank is aligned at a
common earlier point: the end of the previous instance they all shared (a
collective ends at about the same moment everywhere), else each rank's step
start (its first captured GPU operation when there are no steps). A rank's
*offset* is its arrival minus its alignment point. The straggler (last
arrival) is compared with the *reference*: the other rank with the largest
offset. ``late_ns = offset(straggler) − offset(reference)`` is the extra time
the straggler took inside the capture; its interval ``[align, arrival]`` is
where to look for why.

**Outside the capture.** Aligned at step starts, a wait can come from the
straggler's step starting later than the others': its wait is then partly
``align(straggler) − align(waiting rank)``. When that is the straggler's
first captured step, the trace holds nothing of what delayed it.

**Why** (:func:`explain`). Over the straggler's interval and the
reference's: the GPU idle time by cause (:func:`stallscope.idle.attribute_idle`,
prorated per gap) and, from each rank's step start to its arrival, per
kernel name the count and time (extra kernels, the same kernels longer at a
different launch grid = extra compute, at the same grid = a slower GPU).
The straggler's excess over the reference, per cause, explains its lateness.
Busy time the straggler spent on kernels the reference had already run (it
ran ahead while waiting at an earlier collective) is *knock-on*: not a cause,
and not removed in the what-if.

**What-if** (:func:`saving_if_on_time`): each interval of the straggler is
replayed shorter by its explained (removable) lateness, on the job's
dependency graph; the saving is the drop in summed step time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from stallscope.collectives import CollectiveMatch, covered_length, job_ops
from stallscope.critical_path import (
    Compression,
    critical_path,
    dependencies,
    path_index,
    saving,
    step_times,
)
from stallscope.idle import CAUSES, DATALOADER_REGEX, attribute_idle
from stallscope.jobdata import JobData
from stallscope.kernel_tally import KernelTally, group_kernels
from stallscope.rank_card import card_rows
from stallscope.report_types import CriticalPathSegment, CriticalPathStep

STEP_NAME_REGEX = r"^(ProfilerStep#[0-9]+|[Ss]tep[ _#]?[0-9]+)$"


@dataclass
class Timeline:
    """The job's GPU operations and blocking host calls on one clock, per participant.

    ``ops``: :data:`stallscope.critical_path.OP_COLUMNS` plus ``is_kernel``
    and ``grid``; ``syncs``: ``part, start_ns, end_ns``; ``parts``: (rank,
    trace_id, device) per participant index; ``pids``: its host processes;
    ``step_start``: {(part, step): host step start}; ``first_step``: {part:
    its first captured step}; ``skew``: {part: ns subtracted from its clock}.
    """

    ops: pd.DataFrame
    syncs: pd.DataFrame
    parts: list[tuple[int, str, int]]
    pids: dict[int, list[int]]
    step_start: dict[tuple[int, int], int]
    first_step: dict[int, int]
    skew: dict[int, int]
    kernel_names: list[str] = field(default_factory=list)
    kernels: dict = field(
        default_factory=dict
    )  # (part, step) -> sorted kernel arrays, "graph" (cache)


def timeline(job: JobData, match: CollectiveMatch) -> Timeline:
    """The :class:`Timeline` of the job (cached on the JobData)."""
    key = ("timeline", id(match))
    if key not in job.cache:
        job.cache[key] = _timeline(job, match)
    return job.cache[key]


def _timeline(job: JobData, match: CollectiveMatch) -> Timeline:
    """The job's :class:`Timeline`: every rank's GPU operations in one query
    (:func:`~stallscope.collectives.job_ops`), their blocking host calls, step starts and
    launching processes from the rank cards (:mod:`stallscope.rank_card`), then columnar
    work: no query per rank."""
    rows = match.rows
    trace, device = rows["trace_id"], rows["device"]
    first = np.flatnonzero(np.r_[True, (trace[1:] != trace[:-1]) | (device[1:] != device[:-1])])
    parts = [(int(rows["rank"][i]), str(trace[i]), int(device[i])) for i in first]
    skew = {
        p: int(match.skew_ns.get((t, d), 0)) if match.skew_corrected.get((t, d)) else 0
        for p, (_, t, d) in enumerate(parts)
    }
    pids = _launch_pids(job, parts)
    ops = _participant_ops(job, parts, skew)
    ops = _tag_collectives(ops, rows, parts)
    own = ops[ops["step"] >= 0].groupby("part")["step"].min()
    codes, uniques = pd.factorize(ops["name_code"])  # codes by first appearance, part order
    ops["name_code"] = codes.astype(np.int64)
    return Timeline(
        ops=ops,
        syncs=_participant_syncs(job, parts, pids, skew),
        parts=parts,
        pids=pids,
        step_start=_step_starts(job, parts, pids, skew),
        first_step={int(p): int(v) for p, v in own.items()},
        skew=skew,
        kernel_names=[str(n) for n in job_ops(job)["names"][uniques]],
    )


def _launch_pids(job: JobData, parts: list[tuple[int, str, int]]) -> dict[int, list[int]]:
    """Per participant: the host processes whose API calls launched work on its device."""
    rows = card_rows(job, "launcher")  # from the rank cards: no join of every rank's host rows
    found: dict[tuple[str, int], set[int]] = {}
    for trace, device, pid in zip(
        rows["trace_id"], rows["device"].tolist(), rows["pid"].tolist(), strict=True
    ):
        found.setdefault((str(trace), int(device)), set()).add(int(pid))
    return {p: sorted(found.get((t, d), ())) for p, (_, t, d) in enumerate(parts)}


def _participant_ops(job: JobData, parts: list[tuple[int, str, int]], skew: dict) -> pd.DataFrame:
    """The participants' GPU operations (:func:`~stallscope.collectives.job_ops`), in
    participant order then by start, on the common clock (skew subtracted)."""
    allops = job_ops(job)
    pieces, part_col = [], []
    for p, (_, t, d) in enumerate(parts):
        lo, hi = allops["bounds"].get((t, d), (0, 0))
        pieces.append(np.arange(lo, hi))
        part_col.append(np.full(hi - lo, p, dtype=np.int64))
    take = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    part = np.concatenate(part_col) if part_col else np.zeros(0, np.int64)
    shift = np.array([skew[p] for p in range(len(parts))], dtype=np.int64)[part]
    launch = allops["launch_ns"][take]
    return pd.DataFrame(
        {
            "device": allops["device"][take],
            "stream": allops["stream"][take],
            "is_kernel": allops["is_kernel"][take],
            "start_ns": allops["start_ns"][take] - shift,
            "end_ns": allops["end_ns"][take] - shift,
            "grid": allops["grid"][take],
            "launch_ns": np.where(launch >= 0, launch - shift, -1),
            "step": allops["step"][take],
            "part": part,
            "rank": np.array([r for r, _, _ in parts], dtype=np.int64)[part] if parts else part,
            "name_code": allops["name_code"][take],
            "name": _names(allops["names"], allops["name_code"][take]),
            "own_start": allops["start_ns"][take],
            "own_end": allops["end_ns"][take],
        }
    )


def _names(names: np.ndarray, codes: np.ndarray):
    """Each op's name: a categorical over the job's distinct names (one string per name, not
    per op: a column of a million strings costs seconds in every copy and filter), the plain
    strings where a name is missing (as before)."""
    if any(n is None for n in names):
        return names[codes]
    return pd.Categorical.from_codes(codes, categories=pd.Index(names, dtype=object))


def _card_frame(job: JobData, kind: str) -> pd.DataFrame:
    """The rank cards' ``kind`` rows (``trace_id, pid, step, start_ns, end_ns``), by trace
    then start, end and pid."""
    rows = card_rows(job, kind)
    frame = pd.DataFrame(
        {c: rows[c] for c in ("trace_id", "pid", "step", "start_ns", "end_ns")}
    ).astype({"trace_id": str})
    return frame.sort_values(["trace_id", "start_ns", "end_ns", "pid"], kind="stable")


def _own_process_rows(rows: pd.DataFrame, parts, pids, only_if_any: bool) -> pd.DataFrame:
    """``rows`` (with ``trace_id`` and ``pid``) given to each participant of their trace, kept
    when on one of its launching processes (all of them when it has none; with
    ``only_if_any``, also when none of its rows is on one). Adds ``part``; in participant
    order, each participant's rows in their order in ``rows``. Columnar, no per-rank loop."""
    owners = pd.DataFrame(
        {"part": np.arange(len(parts), dtype=np.int64), "trace_id": [t for _, t, _ in parts]}
    )
    rows = rows.reset_index(drop=True).rename_axis("_row").reset_index()
    mine = owners.merge(rows, on="trace_id", how="inner")
    launching = pd.MultiIndex.from_arrays(
        [np.array([p for p, ps in pids.items() for _ in ps], dtype=np.int64),
         np.array([pid for ps in pids.values() for pid in ps], dtype=np.int64)]
    )  # fmt: skip
    part = mine["part"].to_numpy(np.int64)
    pid = mine["pid"].fillna(-1).to_numpy(np.int64)
    on_launcher = launching.get_indexer(pd.MultiIndex.from_arrays([part, pid])) >= 0
    has_pids = np.array([bool(pids.get(p)) for p in range(len(parts))], dtype=bool)[part]
    keep = ~has_pids | on_launcher
    if only_if_any:
        any_on = pd.Series(on_launcher).groupby(mine["part"].to_numpy()).transform("any")
        keep |= ~any_on.to_numpy(bool)
    return mine[keep].sort_values(["part", "_row"], kind="stable")


def _participant_syncs(job, parts, pids, skew) -> pd.DataFrame:
    """Blocking host calls of each participant's launching processes (all of its trace's
    when none is known), on the common clock: ``part, start_ns, end_ns``."""
    sy = _own_process_rows(_card_frame(job, "sync"), parts, pids, only_if_any=False)
    shift = sy["part"].map(skew).to_numpy(np.int64)
    return pd.DataFrame(
        {
            "part": sy["part"].to_numpy(np.int64),
            "start_ns": sy["start_ns"].to_numpy(np.int64) - shift,
            "end_ns": sy["end_ns"].to_numpy(np.int64) - shift,
        }
    )


def _step_starts(job, parts, pids, skew) -> dict[tuple[int, int], int]:
    """{(participant, step): the step's host start}, from the launching processes' step
    ranges when they have any (else every process's), on the common clock."""
    st = _own_process_rows(_card_frame(job, "step"), parts, pids, only_if_any=True)
    first = st.groupby(["part", "step"])["start_ns"].min()
    return {(int(p), int(step)): int(start) - skew[int(p)] for (p, step), start in first.items()}


def part_index(parts: list[tuple[int, str, int]], traces, devices) -> np.ndarray:
    """The participant index of each (trace, device) (−1: none), hashed columnar."""
    known = pd.MultiIndex.from_arrays(
        [pd.Index([t for _, t, _ in parts], dtype=object), [int(d) for _, _, d in parts]]
    )
    wanted = pd.MultiIndex.from_arrays(
        [pd.Index(np.asarray(traces), dtype=object), np.asarray(devices, dtype=np.int64)]
    )
    return known.get_indexer(wanted).astype(np.int64)


def _step_start_index(tl: Timeline) -> tuple[pd.MultiIndex, np.ndarray]:
    """``tl.step_start`` as a (part, step) index and its int64 values (cached)."""
    if "step_start" not in tl.kernels:
        keys = list(tl.step_start)
        tl.kernels["step_start"] = (
            pd.MultiIndex.from_arrays(
                [np.array([p for p, _ in keys], dtype=np.int64),
                 np.array([st for _, st in keys], dtype=np.int64)]
            ),
            np.array(list(tl.step_start.values()), dtype=np.int64),
        )  # fmt: skip
    return tl.kernels["step_start"]


def _tag_collectives(ops: pd.DataFrame, rows: dict, parts: list) -> pd.DataFrame:
    """``inst`` and ``transfer_ns`` of the matched communication kernels (−1/0 elsewhere),
    found by each participant's own (start, end); ``is_comm`` = matched."""
    ok = rows["inst"] >= 0
    tags = pd.DataFrame(
        {
            "part": part_index(parts, rows["trace_id"][ok], rows["device"][ok]),
            "own_start": rows["start_ns"][ok],
            "own_end": rows["end_ns"][ok],
            "inst": rows["inst"][ok],
            "transfer_ns": rows["transfer_ns"][ok],
        }
    ).drop_duplicates(["part", "own_start", "own_end"])
    ops = ops.merge(tags, on=["part", "own_start", "own_end"], how="left")
    ops["inst"] = ops["inst"].fillna(-1).astype(np.int64)
    ops["transfer_ns"] = ops["transfer_ns"].fillna(0).astype(np.int64)
    ops["is_comm"] = ops["inst"] >= 0
    return ops.drop(columns=["own_start", "own_end"])


def lateness(match: CollectiveMatch, tl: Timeline) -> pd.DataFrame:
    """One row per (matched instance, rank): its alignment point, offset and wait split.

    Columns: ``inst, part, rank, step, start_ns`` (common clock), ``align_ns``,
    ``aligned_on`` (``collective``/``step``/``capture``), ``offset_ns``,
    ``straggler`` (part of the last arrival), ``ref`` (the other part with
    the largest offset), ``late_ns`` (straggler offset − reference offset,
    ≥ 0; on the straggler's row, else 0), ``wait_ns``, ``wait_outside_ns``
    (the part of this rank's wait due to the straggler's first captured step
    starting later than this rank's: before the capture).
    """
    rows = match.rows
    ok = rows["inst"] >= 0
    df = pd.DataFrame(
        {
            "inst": rows["inst"][ok],
            "part": part_index(tl.parts, rows["trace_id"][ok], rows["device"][ok]),
            "rank": rows["rank"][ok],
            "step": rows["step"][ok],
            "start_ns": rows["start_ns"][ok],
            "end_ns": rows["end_ns"][ok],
            "wait_ns": rows["wait_ns"][ok],
            "last": rows["last"][ok],
        }
    )
    if df.empty:
        extra = ("group", "prev_inst", "prev_end", "align_ns", "aligned_on", "offset_ns",
                 "straggler", "ref", "late_ns", "wait_outside_ns")  # fmt: skip
        return df.assign(**{c: pd.Series(dtype=np.int64) for c in extra})
    shift = df["part"].map(tl.skew)
    df["start_ns"] -= shift
    df["end_ns"] -= shift
    group = match.instances["group"]
    df["group"] = group[df["inst"].to_numpy()]
    df = df.sort_values(["part", "start_ns"], kind="stable").reset_index(drop=True)
    part_a, group_a = df["part"].to_numpy(), df["group"].to_numpy()
    same = np.r_[False, (part_a[1:] == part_a[:-1]) & (group_a[1:] == group_a[:-1])]
    inst_a, end_a = df["inst"].to_numpy(np.int64), df["end_ns"].to_numpy(np.int64)
    df["prev_inst"] = np.where(same, np.r_[-1, inst_a[:-1]], -1)
    df["prev_end"] = np.where(same, np.r_[-1, end_a[:-1]], -1)
    prev = df.groupby("inst")["prev_inst"]
    shared = (prev.transform("min") == prev.transform("max")) & (prev.transform("min") >= 0)
    first_op = tl.ops.groupby("part")["start_ns"].min()
    keys, values = _step_start_index(tl)
    at = keys.get_indexer(pd.MultiIndex.from_arrays([df["part"], df["step"]]))
    has_step = at >= 0
    first = first_op.to_numpy(np.int64)[first_op.index.get_indexer(df["part"])]
    known = values[np.maximum(at, 0)] if values.size else np.zeros(at.size, dtype=np.int64)
    step_start = np.where(has_step, known, first)
    df["align_ns"] = np.where(shared, df["prev_end"], step_start)
    df["aligned_on"] = np.where(shared, "collective", np.where(has_step, "step", "capture"))
    df["offset_ns"] = df["start_ns"] - df["align_ns"]
    strag = df[df["last"]].set_index("inst")
    df["straggler"] = df["inst"].map(strag["part"])
    others = df[df["part"] != df["straggler"]]
    ref = others.loc[others.groupby("inst")["offset_ns"].idxmax()].set_index("inst")
    df["ref"] = df["inst"].map(ref["part"]).fillna(-1).astype(np.int64)
    s_off = df["inst"].map(strag["offset_ns"])
    s_align = df["inst"].map(strag["align_ns"])
    df["late_ns"] = np.where(
        df["last"], np.maximum(0, s_off - df["inst"].map(ref["offset_ns"]).fillna(s_off)), 0
    ).astype(np.int64)
    # the straggler's own first captured step (or capture) started after this rank's
    s_first = (
        df["inst"]
        .map(
            strag.apply(
                lambda r: (
                    r["aligned_on"] == "capture"
                    or (
                        r["aligned_on"] == "step"
                        and tl.first_step.get(int(r["part"])) == int(r["step"])
                    )
                ),
                axis=1,
            )
        )
        .astype(bool)
    )
    before = np.clip(s_align - df["align_ns"], 0, None)
    df["wait_outside_ns"] = np.where(
        s_first & (df["aligned_on"] != "collective"), np.minimum(df["wait_ns"], before), 0
    ).astype(np.int64)
    return df


@dataclass
class Explanation:
    """Why one straggler was late, over its lateness intervals (ns)."""

    late_ns: int
    removable_ns: int
    causes_ns: dict[str, int]
    knock_on_ns: int
    intervals: list[list[int]]
    ref_intervals: list[list[int]]
    kernels: list[dict]
    cuts: list[Compression]


CAUSE_TEXT = {
    "dataloader": "data loading",
    "host_sync": "host syncs",
    "memcpy": "synchronous copies",
    "launch": "Python/CPU work (launching kernels)",
    "cpu": "Python/CPU work",
    "queued": "waiting on other GPU streams",
    "unknown": "unrecorded host time (sleep, I/O or a blocking call)",
    "extra_compute": "extra compute (more or larger kernels than the other ranks)",
    "slower_gpu": "a slower GPU (the same kernels at the same launch grid took longer)",
}


def explain(job: JobData, tl: Timeline, late: pd.DataFrame, straggler: int) -> Explanation:
    """Why participant ``straggler`` was late (see the module docstring), with the what-if cuts."""
    mine = late[(late["part"] == straggler) & late["last"] & (late["late_ns"] > 0)]
    mine = mine.sort_values("start_ns")
    causes = dict.fromkeys([*CAUSES, "extra_compute", "slower_gpu"], 0)
    cuts, ivals, refs, knock, removable = [], [], [], 0, 0
    prev_excess: dict[tuple[int, int], dict] = {}
    kernels_total: dict[str, dict] = {}
    last_end = np.iinfo(np.int64).min
    # the reference's row of each of its instances: only the (instance, reference) pairs
    # asked for, found by one merge (not a dict over every rank's rows of those instances)
    asked = mine[["inst", "ref"]].drop_duplicates().rename(columns={"ref": "part"})
    wanted = late[["inst", "part", "align_ns", "start_ns"]].merge(asked, on=["inst", "part"])
    by_key = {
        (int(i), int(p)): (int(a), int(s))
        for i, p, a, s in zip(
            wanted["inst"], wanted["part"], wanted["align_ns"], wanted["start_ns"], strict=True
        )
    }
    for row in mine.itertuples():
        a, b = int(row.align_ns), int(row.start_ns)
        ra, rb = by_key[(int(row.inst), int(row.ref))]
        idle_s = _idle_by_cause(job, tl, straggler, a, b)
        idle_r = _idle_by_cause(job, tl, int(row.ref), ra, rb)
        diff = {c: max(0, idle_s[c] - idle_r[c]) for c in CAUSES}
        key = (int(row.step), int(row.ref))
        comp = _kernel_excess(tl, straggler, int(row.ref), int(row.step), b, rb)
        before = prev_excess.get(key, {"extra_compute": 0, "slower_gpu": 0})
        inc = {k: max(0, comp[k] - before[k]) for k in ("extra_compute", "slower_gpu")}
        prev_excess[key] = comp
        explained = sum(diff.values()) + sum(inc.values())
        take = min(int(row.late_ns), explained)
        scale = take / explained if explained else 0.0
        for c, v in {**diff, **inc}.items():
            causes[c] += int(round(v * scale))
        knock += int(row.late_ns) - take
        removable += take
        for k in comp["rows"]:
            kernels_total[k["name"]] = k
        a = max(a, last_end)
        if take > 0 and b > a:
            cuts.append(Compression(straggler, a, b, max(0, b - a - take)))
            last_end = b
        ivals.append([a, b])
        refs.append([ra, rb])
    ranked = sorted(kernels_total.values(), key=lambda k: -abs(k["excess_ns"]))[:5]
    return Explanation(
        late_ns=int(mine["late_ns"].sum()),
        removable_ns=removable,
        causes_ns={c: v for c, v in causes.items() if v > 0},
        knock_on_ns=knock,
        intervals=ivals,
        ref_intervals=refs,
        kernels=[k for k in ranked if k["excess_ns"] > 0],
        cuts=cuts,
    )


def _idle_by_cause(job: JobData, tl: Timeline, part: int, a: int, b: int) -> dict[str, int]:
    """GPU idle time of ``part`` in [a, b) (common clock) by cause, prorated per gap."""
    out = dict.fromkeys(CAUSES, 0)
    if b <= a:
        return out
    _, trace, device = tl.parts[part]
    idle = rank_idle(job, trace, device)
    if not idle.per_gap.size:
        return out
    s = tl.skew[part]
    # searched on the rank's own clock: shifting the gaps to the common one copies them all
    lo = max(0, int(np.searchsorted(idle.gap_ends, a + s, side="right")))
    hi = int(np.searchsorted(idle.gap_starts, b + s, side="left"))
    gs, ge = idle.gap_starts[lo:hi] - s, idle.gap_ends[lo:hi] - s
    share = covered_length((np.array([a]), np.array([b])), gs, ge) / np.maximum(ge - gs, 1)
    sums = (idle.per_gap[lo:hi] * share[:, None]).sum(axis=0)
    out.update({c: int(sums[i]) for i, c in enumerate(CAUSES)})
    # idle before the device's measured span (e.g. before its first step's GPU work)
    head = max(0, min(b, int(idle.span_start) - s) - a)
    if head:
        out["unknown"] += head
    return out


def rank_idle(job: JobData, trace: str, device: int):
    """:func:`stallscope.idle.attribute_idle` of one device, read from its rank's files alone
    (``job.part_of``: a query on the whole job binds every rank's files), cached on ``job``."""
    key = ("rank_idle", trace, device)
    if key not in job.cache:
        job.cache[key] = attribute_idle(job.part_of(trace), trace, device)
    return job.cache[key]


def _kernel_excess(tl: Timeline, part: int, ref: int, step: int, b: int, rb: int) -> dict:
    """Compute kernels of ``part`` vs ``ref`` from their step start to their arrivals.

    Per kernel name: ``more`` = extra launches × the straggler's mean duration;
    ``longer`` = matched launches × the mean's excess, counted as extra compute
    when the name's most common grid differs between the ranks (other shapes),
    as a slower GPU when it is the same. Columnar (numpy) over the step's kernels.
    """
    mine, theirs = _tally(tl, part, step, b), _tally(tl, ref, step, rb)
    names = tl.kernel_names
    n_s, t_s = mine.count, mine.total_ns
    n_r, t_r = theirs.count, theirs.total_ns
    used = np.flatnonzero(n_s > 0)
    mean_s = t_s[used] / n_s[used]
    mean_r = np.where(n_r[used] > 0, t_r[used] / np.maximum(n_r[used], 1), mean_s)
    more = np.maximum(0, n_s[used] - n_r[used]) * mean_s
    longer = np.minimum(n_s[used], n_r[used]) * np.maximum(0, mean_s - mean_r)
    same_grid = mine.mode_grid(used) == theirs.mode_grid(used)
    extra = more + np.where(same_grid, 0, longer)
    slower = np.where(same_grid, longer, 0)
    rows = [
        {
            "name": names[c],
            "count": int(n_s[c]),
            "ref_count": int(n_r[c]),
            "mean_ns": int(mean_s[i]),
            "ref_mean_ns": int(mean_r[i]),
            "same_grid": bool(same_grid[i]),
            "excess_ns": int(extra[i] + slower[i]),
        }
        for i, c in enumerate(used.tolist())
        if extra[i] + slower[i] > 0
    ]
    return {"extra_compute": int(extra.sum()), "slower_gpu": int(slower.sum()), "rows": rows}


def _tally(tl: Timeline, part: int, step: int, end: int) -> KernelTally:
    """``part``'s compute kernels of ``step`` starting before ``end``, tallied per name
    (:mod:`stallscope.kernel_tally`: grouped once per timeline, advanced per query)."""
    if None not in tl.kernels:  # group the compute kernels by (part, step) once, columnar
        o = tl.ops[tl.ops["is_kernel"] & ~tl.ops["is_comm"]]
        start = o["start_ns"].to_numpy(np.int64)
        tl.kernels.update(
            group_kernels(
                o["part"].to_numpy(np.int64),
                o["step"].to_numpy(np.int64),
                start,
                o["name_code"].to_numpy(np.int64),
                o["end_ns"].to_numpy(np.int64) - start,
                o["grid"].to_numpy(np.int64),
                len(tl.kernel_names),
            )
        )
        tl.kernels[None] = True
    tally = tl.kernels.get((part, step))
    if tally is None:
        empty = np.zeros(0, dtype=np.int64)
        tally = KernelTally(empty, empty, empty, empty, len(tl.kernel_names))
    return tally.advance(end)


def saving_if_on_time(tl: Timeline, cuts: list[Compression]) -> dict:
    """:func:`stallscope.critical_path.saving` of the job with ``cuts``."""
    return saving(graph(tl), tl.syncs, cuts)


def graph(tl: Timeline) -> pd.DataFrame:
    """The job's dependency table (:func:`stallscope.critical_path.dependencies`), computed
    once per timeline (the what-if and the critical path share it)."""
    if "graph" not in tl.kernels:
        tl.kernels["graph"] = dependencies(tl.ops)
    return tl.kernels["graph"]


def host_ranges(job: JobData, tl: Timeline, part: int, windows: list[list[int]], limit: int = 5):
    """Host ranges (record_function, NVTX, Python, operators) on any thread of the part's
    processes that overlap ``windows`` (common clock) most: [{name, kind, overlap_ns, count}];
    ``dataloader_ns``: how much of the windows a data-loading range covers."""
    _, trace, _ = tl.parts[part]
    if not windows:
        return [], 0
    s = tl.skew[part]
    con = job.part_of(trace).con  # this rank's files only
    con.execute("CREATE OR REPLACE TEMP TABLE _lw (ws BIGINT, we BIGINT)")
    con.executemany("INSERT INTO _lw VALUES (?, ?)", [(a + s, b + s) for a, b in windows if b > a])
    pids = tl.pids.get(part) or []
    pid_filter = f"AND h.pid IN ({', '.join(str(int(p)) for p in pids)})" if pids else ""
    rows = con.execute(
        f"""SELECT n.name, h.kind, sum(least(h.end_ns, w.we) - greatest(h.start_ns, w.ws)) AS overlap, count(*)
           FROM host h JOIN _lw w ON h.start_ns < w.we AND h.end_ns > w.ws
           JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
           WHERE h.trace_id = ? {pid_filter} AND h.kind IN ('annotation', 'python', 'cpu_op', 'osrt')
             AND NOT regexp_matches(n.name, '{STEP_NAME_REGEX}')
           GROUP BY 1, 2 ORDER BY overlap DESC LIMIT ?""",
        [trace, limit],
    ).fetchall()
    loader = con.execute(
        f"""SELECT h.start_ns, h.end_ns FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
           WHERE h.trace_id = ? {pid_filter} AND regexp_matches(n.name, '{DATALOADER_REGEX}')""",
        [trace],
    ).fetchnumpy()
    from stallscope import intervals

    ws = np.array([a + s for a, b in windows if b > a], dtype=np.int64)
    we = np.array([b + s for a, b in windows if b > a], dtype=np.int64)
    covered = int(
        covered_length(intervals.union(loader["start_ns"], loader["end_ns"]), ws, we).sum()
    )
    ops = [{"name": r[0], "kind": r[1], "overlap_ns": int(r[2]), "count": int(r[3])} for r in rows]
    return ops, covered


MAX_PATH_STEPS = 20
MAX_PATH_SEGMENTS = 200


def critical_path_table(job: JobData, tl: Timeline) -> list[CriticalPathStep]:
    """The cross-rank critical path of each step (first :data:`MAX_PATH_STEPS` steps).

    Per step: :class:`~stallscope.report_types.CriticalPathStep` ``{step, time_ns,
    segments: [{rank, what, start_ns, end_ns, duration_ns}]}`` (common clock, earliest first, at most
    :data:`MAX_PATH_SEGMENTS`). GPU idle on the path is named by its main
    cause (``idle: dataloader`` …), or ``before capture`` where it lies before
    that rank's first captured event.
    """
    g = graph(tl)
    times = step_times(g)
    first_step_start: dict[int, int] = {}  # per part, its earliest step start (one pass)
    for (q, _), v in tl.step_start.items():
        first_step_start[q] = min(v, first_step_start.get(q, v))
    capture_start = {
        p: first_step_start.get(p, int(t)) for p, t in g.groupby("part")["start_ns"].min().items()
    }

    def label(part: int, a: int, b: int) -> str:
        causes = _idle_by_cause(job, tl, part, a, b)
        main = max(causes, key=lambda c: causes[c])
        return f"idle: {main}" if causes[main] > 0 else "idle"

    out, index = [], path_index(g)
    for step in times.index[:MAX_PATH_STEPS]:
        path = critical_path(
            g, int(step), label_gap=label, capture_start=capture_start, index=index
        )
        segs = path.drop(columns=["part"]).head(MAX_PATH_SEGMENTS)
        out.append(
            CriticalPathStep(
                step=int(step),
                time_ns=int(times[step]),
                segments=[
                    CriticalPathSegment(
                        rank=int(row["rank"]),
                        what=str(row["what"]),
                        start_ns=int(row["start_ns"]),
                        end_ns=int(row["end_ns"]),
                        duration_ns=int(row["duration_ns"]),
                    )
                    for row in segs.to_dict("records")
                ],
            )
        )
    return out
