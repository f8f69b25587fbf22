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

Measure, then speak (docs/architecture.md): :func:`measure` returns the job's typed
:class:`CollectiveWaits`; :func:`metrics`, the table rows (:func:`rank_wait_rows`,
:func:`collective_op_rows`, :func:`critical_path_rows`) and :func:`speak` read only it.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stallscope import intervals, job_settings
from stallscope.analyzers.base import (
    SEVERITY_RANK,
    AnalyzerResult,
    AnalyzerSpec,
    Finding,
    Metric,
    Threshold,
    Where,
    graded_severity,
    graded_thresholds,
)
from stallscope.collectives import (
    CollectiveMatch,
    covered_length,
    gpu_activity,
    job_ops,
    match_collectives,
    step_windows,
)
from stallscope.idle import CAUSES, launch_threads, mostly_range_only, top_host_ops
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
    CriticalPathStep,
    RankWaitRow,
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
TOP_WAITS = 5  # the collectives with the largest waits a waiting rank's evidence lists


def run(job: JobData, params: dict[str, float]) -> AnalyzerResult:
    """Measure the job's collective waits (:func:`measure`), then write the metrics, the
    tables and the findings from that measurement alone."""
    result = AnalyzerResult()
    m = measure(job, params)
    if m is None:
        return result
    result.metrics.extend(metrics(m))
    result.tables.rank_waits.extend(rank_wait_rows(m))
    if m.summary is not None:
        result.tables.collective_ops.extend(collective_op_rows(m.summary))
        result.tables.critical_path.extend(critical_path_rows(m.summary))
    result.findings.extend(speak(m, params))
    return result


# -- what is measured --------------------------------------------------------------------
class StragglerActivity(msgspec.Struct, kw_only=True):
    """What the straggler's GPU and host did over its lateness intervals (its own clock).

    ``window_ns`` 0: no lateness interval (the other fields are then empty)."""

    window_ns: int  # length of the union of the intervals
    windows: int = 0  # intervals after merging
    gpu_busy_pct: float = 0.0  # any GPU operation running, % of window_ns (1 decimal)
    compute_pct: float = 0.0  # compute kernels running, % of window_ns (1 decimal)
    idle_by_cause_ns: dict[str, int] = {}  # its GPU idle in the window by cause (stallscope.idle)
    top_host_ops: list[dict] = []  # host operations of its launching threads in the window


class Lateness(msgspec.Struct, kw_only=True):
    """Why a straggler was late (:mod:`stallscope.lateness`), ns; docs/analyzers/nccl_wait.md."""

    late_ns: int  # how much longer than the next-latest rank it took, from common points
    explained_ns: int  # of late_ns, what its own trace accounts for
    knock_on_ns: int  # kernels the other ranks had already run while they waited
    causes_ns: dict[str, int]  # explained time by cause, largest first
    main_cause: str | None
    reference_ranks: list[int]  # the ranks it was compared with
    intervals: list[list[int]]  # its lateness intervals (own clock, first MAX_INTERVALS)
    kernels: list[dict]  # its kernels against the others' (extra compute, slower GPU)
    host_ranges: list[dict]  # its host ranges over the intervals
    dataloader_range_ns: int  # data-loading ranges on other threads of its process
    covering_range: str | None  # a user range over most of the unrecorded or range-only time
    what_if: dict  # stallscope.critical_path.saving: the job were the straggler on time
    cpu_in_range_ns: int = 0  # of causes_ns["cpu"]: inside a user range, nothing recorded under it


class RankWait(msgspec.Struct, kw_only=True):
    """One rank and device that waited in collectives for a later rank, enough to report
    (:func:`measure_rank_wait`). Lengths in ns; no prose: :func:`speak_rank_wait` writes it."""

    where: Where
    waited_ns: int  # summed waits in the collectives it waited in
    waits: int  # collectives it waited in
    exposed_ns: int  # of the waits' union, with no compute kernel of its own beside it
    span_ns: int  # its profiled steps' length (first to last GPU operation without steps)
    straggler: int  # the rank whose late arrival cost it the most wait
    caused_ns: dict[int, int]  # straggler rank -> the wait it caused here
    min_wait_ns: int  # the min_wait_us threshold: a material wait is at least this long
    material: int  # its waits of a collective whose largest wait is material
    last_in: int  # of those, the ones where the straggler arrived last
    steps: list[dict]  # per step: wait, largest wait, exposed wait, the rank that caused most
    main_in: int  # steps in which the straggler caused most of the wait
    top_waits: list[dict]  # the collectives with the largest waits (_instance_dict)
    activity: StragglerActivity  # what the straggler did while it was late
    lateness: Lateness | None  # why it was late; None when it took no longer than the others
    outside_ns: int  # wait due to stragglers whose first captured step started later
    clock_skew_ns: int  # this rank's clock offset (corrected when material)
    data_quality: list[str]  # the matching's warnings
    windows: list[list[int]]  # the longest waits, [start_ns, end_ns]

    @property
    def share_pct(self) -> float:
        """The exposed wait, % of the span (unrounded)."""
        return 100.0 * self.exposed_ns / self.span_ns if self.span_ns else 0.0

    @property
    def before_capture(self) -> bool:
        """The wait comes from before the straggler's capture: that part outweighs what the
        straggler's own captured timeline explains (later waits are then knock-on of it)."""
        explained = 0 if self.lateness is None else self.lateness.explained_ns
        return self.outside_ns >= self.min_wait_ns and self.outside_ns >= explained

    @property
    def saving_ns(self) -> int | None:
        """The what-if saving of summed step time were the straggler on time; None when the
        trace cannot show why it was late, or the delay lies before its capture."""
        if self.lateness is None or self.before_capture:
            return None
        return self.lateness.what_if["saving_ns"]

    @property
    def per_step_known(self) -> bool:
        return bool(self.steps) and self.steps[0]["step"] is not None


class Participant(msgspec.Struct, kw_only=True):
    """One rank and device taking part in the job's collectives."""

    where: Where
    collectives: int  # its communication kernels inside steps (all of them without steps)
    waited_ns: int  # summed waits in those
    wait: RankWait | None  # its reportable wait (multi-rank jobs); None: nothing to report


class JobCollectives(msgspec.Struct, kw_only=True):
    """The job's matched collectives (:func:`measure_job`): the summary finding's numbers and
    the ``collective_ops`` and ``critical_path`` tables. Keys of ranks are str (JSON)."""

    where: Where  # the first participant's trace and rank, device None
    participants: int  # (trace, device) pairs taking part
    matched: int  # collectives matched across ranks
    unmatched_kernels: int
    methods: dict[str, str]  # process group -> how its collectives were matched
    clock_skew_ns: dict[str, int]  # rank -> its clock offset
    skew_corrected_ranks: list[int]
    material: int  # collectives whose largest wait is at least min_wait_us
    straggler_tally: dict[str, int]  # rank -> material collectives it arrived last in
    wait_caused_ns: dict[str, int]  # rank -> summed waits of the others it arrived last for
    ops: list[dict]  # per process group and op (_op_table)
    collectives: list[dict]  # the first MAX_INSTANCES collectives (_instance_dict)
    data_quality: list[str]
    critical_path: list[CriticalPathStep]  # each step's cross-rank critical path
    windows: list[list[int]]  # the collectives with the largest waits, first to last arrival
    min_wait_ns: int = 100_000  # the min_wait_us threshold ``material`` counts against

    @property
    def worst(self) -> str | None:
        """The rank that caused the most wait (None without matched collectives)."""
        caused = self.wait_caused_ns
        return max(caused, key=lambda r: caused[r]) if self.matched else None


class CollectiveWaits(msgspec.Struct, kw_only=True):
    """The analyzer's measurement of a job (:func:`measure`)."""

    participants: list[Participant]  # in rank, trace, device order
    summary: JobCollectives | None  # jobs with several participants only


def measure(job: JobData, params: dict[str, float]) -> CollectiveWaits | None:
    """The job's collectives and waits; None when it has no collective to match.

    ``params`` are the thresholds: the skew tolerance and ``min_wait_us`` shape the numbers,
    and a waiting rank is measured in full (its straggler's story) only when its exposed wait
    reaches the severity ladder (the story is the costly part)."""
    # The threshold is the job's setting: overlap and views read the same value.
    match = match_collectives(
        job, job_settings.set_skew_tolerance_us(job, params["skew_tolerance_us"])
    )
    if match is None:
        return None
    parts = participants_of(match)
    ranked = len(parts) > 1
    stories: dict[tuple[str, int], tuple[StragglerActivity, Lateness | None]] = {}
    measured = [
        measure_participant(job, match, where, params, ranked=ranked, stories=stories)
        for where in parts
    ]
    min_wait = int(params["min_wait_us"] * 1000)
    summary = measure_job(job, match, parts, min_wait_ns=min_wait) if ranked else None
    return CollectiveWaits(participants=measured, summary=summary)


def participants_of(match: CollectiveMatch) -> list[Where]:
    """The (trace, rank, device) taking part, in the match rows' order (rank, trace, device)."""
    rows = match.rows
    trace, device = rows["trace_id"], rows["device"]
    first = np.flatnonzero(np.r_[True, (trace[1:] != trace[:-1]) | (device[1:] != device[:-1])])
    return [Where(str(trace[i]), int(rows["rank"][i]), int(device[i])) for i in first]


def measure_participant(
    job: JobData,
    match: CollectiveMatch,
    where: Where,
    params: dict[str, float],
    *,
    ranked: bool,
    stories: dict,
) -> Participant:
    """One participant's collectives and waits; its :class:`RankWait` when ``ranked`` (other
    ranks to wait for). ``stories`` caches the stragglers' stories across participants."""
    rows = match.rows
    own = np.zeros(rows["inst"].size, dtype=bool)
    own[match.rows_of(where.trace, where.device)] = True  # its rows: one slice, no scan
    mine = _in_steps(rows, own)
    wait = measure_rank_wait(job, match, where, mine, params, stories=stories) if ranked else None
    return Participant(
        where=where,
        collectives=int(mine.sum()),
        waited_ns=int(rows["wait_ns"][mine].sum()),
        wait=wait,
    )


def measure_rank_wait(
    job: JobData,
    match: CollectiveMatch,
    where: Where,
    mine: np.ndarray,
    params: dict[str, float],
    *,
    stories: dict,
) -> RankWait | None:
    """The wait of one participant over its rows ``mine``; None when it never waited or its
    exposed wait is below the severity ladder (``graded_severity``)."""
    rows, inst = match.rows, match.instances
    waiting = mine & (rows["wait_ns"] > 0)
    if not waiting.any():
        return None
    starts, waits = rows["start_ns"][waiting], rows["wait_ns"][waiting]
    ops = gpu_activity(job)[(where.trace, where.device)]
    batch = _exposed_batch(job, match)
    own = match.rows_of(where.trace, where.device)
    if where in batch.parts and np.array_equal(batch.waiting[own], waiting[own]):
        exposed_each, exposed = batch.each[waiting], int(batch.total[batch.parts[where]])
    else:  # rows other than the participant's in-step waits: measured alone
        exposed_each, exposed = _exposed(ops, starts, waits)
    span = _span(ops)
    if graded_severity(100.0 * exposed / span if span else 0.0, exposed, params) is None:
        return None
    min_wait = int(params["min_wait_us"] * 1000)
    culprit = inst["straggler_rank"][rows["inst"][waiting]]
    caused = {int(r): int(waits[culprit == r].sum()) for r in np.unique(culprit)}
    straggler = max(caused, key=lambda r: (caused[r], -r))
    material = waiting & (inst["max_wait_ns"][np.maximum(rows["inst"], 0)] >= min_wait)
    steps = _per_step(rows["step"][waiting], waits, exposed_each, culprit)
    activity, why = _story_of(job, match, straggler, stories)
    order = np.argsort(-waits, kind="stable")[:MAX_WINDOWS]
    top = np.argsort(-inst["max_wait_ns"][rows["inst"][waiting]], kind="stable")[:TOP_WAITS]
    return RankWait(
        where=where,
        waited_ns=int(waits.sum()),
        waits=int(waiting.sum()),
        exposed_ns=exposed,
        span_ns=span,
        straggler=straggler,
        caused_ns=caused,
        min_wait_ns=min_wait,
        material=int(material.sum()),
        last_in=int((inst["straggler_rank"][rows["inst"][material]] == straggler).sum()),
        steps=steps,
        main_in=sum(1 for s in steps if s["straggler_rank"] == straggler),
        top_waits=[_instance_of(job, match, int(i)) for i in rows["inst"][waiting][top]],
        activity=activity,
        lateness=why,
        outside_ns=_wait_outside(job, match, where.trace, where.device),
        clock_skew_ns=match.skew_ns.get((where.trace, where.device), 0),
        data_quality=match.warnings,
        windows=[[int(starts[i]), int(starts[i] + waits[i])] for i in order],
    )


def measure_job(
    job: JobData, match: CollectiveMatch, parts: list[Where], *, min_wait_ns: int
) -> JobCollectives:
    """The job's matched collectives: who arrived last and the wait each rank caused, clock
    skews, the per-op table and each step's cross-rank critical path."""
    inst, rows = match.instances, match.rows
    n = inst["op"].size
    material = inst["max_wait_ns"] >= min_wait_ns
    matched = rows["inst"] >= 0
    first = parts[0]
    return JobCollectives(
        where=Where(first.trace, first.rank, None),
        participants=len(parts),
        matched=n,
        unmatched_kernels=int((~matched).sum()),
        methods=match.methods,
        clock_skew_ns={str(p.rank): match.skew_ns.get((p.trace, p.device), 0) for p in parts},
        skew_corrected_ranks=[
            p.rank for p in parts if match.skew_corrected.get((p.trace, p.device))
        ],
        material=int(material.sum()),
        min_wait_ns=min_wait_ns,
        straggler_tally={
            str(p.rank): int((inst["straggler_rank"][material] == p.rank).sum()) for p in parts
        },
        wait_caused_ns=_wait_caused(match, parts),
        ops=_op_table(inst),
        collectives=[_instance_dict(inst, i) for i in range(min(n, MAX_INSTANCES))],
        data_quality=match.warnings,
        critical_path=critical_path_table(job, _lateness_of(job, match)[0]) if n else [],
        windows=[
            [int(inst["start_ns"][i]), int(inst["last_ns"][i])]
            for i in np.argsort(-inst["max_wait_ns"])[:MAX_WINDOWS]
            if inst["max_wait_ns"][i] > 0
        ],
    )


def _wait_caused(match: CollectiveMatch, parts: list[Where]) -> dict[str, int]:
    """Rank -> the summed waits of all matched rows whose collective it arrived last in."""
    inst, rows = match.instances, match.rows
    ok = rows["inst"] >= 0
    culprit = inst["straggler_rank"][rows["inst"][ok]] if inst["op"].size else np.zeros(0, np.int64)
    ranks, at = np.unique(culprit, return_inverse=True)  # the wait each rank caused, at once
    sums = dict(
        zip(ranks.tolist(), np.bincount(at, rows["wait_ns"][ok], ranks.size).tolist(), strict=True)
    )
    return {str(p.rank): int(sums.get(p.rank, 0)) for p in parts}


class _ExposedBatch(msgspec.Struct):
    """:func:`_exposed` of every participant's in-step waits (:func:`_in_steps`) at once.

    ``waiting``: per match row, whether it is such a wait; ``each``: per match row, its wait's
    part with no compute kernel of its own rank beside it (0 off ``waiting``); ``total``: per
    participant index (``parts``: Where -> index), that of its waits' union (ns)."""

    parts: dict
    waiting: np.ndarray
    each: np.ndarray
    total: np.ndarray


def _exposed_batch(job: JobData, match: CollectiveMatch) -> _ExposedBatch:
    """The :class:`_ExposedBatch` of the job (cached on it): every participant's compute
    kernels and waits laid end to end on one axis, each participant's own clock shifted into
    a block of its own (two ns apart, so no union crosses blocks), then one union and one
    covered-length pass over the job instead of a few numpy calls per rank. The same
    integers as :func:`_exposed` per participant."""
    key = ("nccl_exposed", id(match))
    if key in job.cache:
        return job.cache[key]
    rows, ops = match.rows, job_ops(job)
    wheres = [w for w in participants_of(match) if (w.trace, w.device) in ops["bounds"]]
    n = len(wheres)
    own = [match.rows_of(w.trace, w.device) for w in wheres]
    waiting = np.zeros(rows["inst"].size, dtype=bool)
    row_part = np.full(rows["inst"].size, -1, dtype=np.int64)
    in_step = rows["step"] >= 0
    for p, sl in enumerate(own):  # slices: one assignment per participant, no scan
        row_part[sl] = p
        inside = in_step[sl]
        waiting[sl] = inside if inside.any() else True  # _in_steps of its rows
    waiting &= rows["wait_ns"] > 0
    # each participant's compute kernels (job_ops rows of its block)
    lo = np.array([ops["bounds"][(w.trace, w.device)][0] for w in wheres], dtype=np.int64)
    hi = np.array([ops["bounds"][(w.trace, w.device)][1] for w in wheres], dtype=np.int64)
    sizes = hi - lo
    idx = np.repeat(lo - np.r_[0, np.cumsum(sizes)[:-1]], sizes) + np.arange(int(sizes.sum()))
    op_part = np.repeat(np.arange(n), sizes)
    compute = ops["is_kernel"][idx] & ~ops["is_comm"][idx]
    c_s, c_e, c_p = ops["start_ns"][idx][compute], ops["end_ns"][idx][compute], op_part[compute]
    w_rows = np.flatnonzero(waiting & (row_part >= 0))
    w_p = row_part[w_rows]
    w_s = rows["start_ns"][w_rows]
    w_e = w_s + rows["wait_ns"][w_rows]
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    mn, mx = np.full(n, big), np.full(n, small)
    for part, a, b in ((c_p, c_s, c_e), (w_p, w_s, w_e)):
        np.minimum.at(mn, part, a)
        np.maximum.at(mx, part, b)
    mn, mx = np.where(mn == big, 0, mn), np.where(mx == small, 0, mx)
    width = np.maximum(mx - mn, 0) + 2
    base = np.r_[0, np.cumsum(width)[:-1]]
    shift = base - mn
    union = intervals.union(c_s + shift[c_p], c_e + shift[c_p])
    a, b = w_s + shift[w_p], w_e + shift[w_p]
    each = np.zeros(rows["inst"].size, dtype=np.int64)
    each[w_rows] = (w_e - w_s) - covered_length(union, a, b)
    u_s, u_e = intervals.union(a, b)
    u_part = np.searchsorted(base, u_s, side="right") - 1
    exposed = (u_e - u_s) - covered_length(union, u_s, u_e)
    total = np.zeros(n, dtype=np.int64)
    np.add.at(total, u_part, exposed)  # int64 sums (no float rounding)
    batch = _ExposedBatch(
        parts={w: p for p, w in enumerate(wheres)}, waiting=waiting, each=each, total=total
    )
    job.cache[key] = batch
    return batch


def _exposed(ops: dict, starts: np.ndarray, waits: np.ndarray) -> tuple[np.ndarray, int]:
    """Each wait's part with no compute kernel beside it, and that of the waits' union (ns)."""
    compute = _union(ops, ops["is_kernel"] & ~ops["is_comm"])
    each = waits - covered_length(compute, starts, starts + waits)
    w_s, w_e = intervals.union(starts, starts + waits)
    return each, int((w_e - w_s).sum() - covered_length(compute, w_s, w_e).sum())


def _span(ops: dict) -> int:
    """The profiled steps' summed length, or first to last GPU operation without steps (ns)."""
    step_ids, lo, hi = step_windows(ops)
    if step_ids.size:
        return int((hi - lo).sum())
    return int(ops["end_ns"].max() - ops["start_ns"].min())


def _story_of(
    job: JobData, match: CollectiveMatch, straggler: int, stories: dict
) -> tuple[StragglerActivity, Lateness | None]:
    """The straggler's story (:func:`_straggler_story`), once per straggler participant."""
    key = _participant_of(match.instances, straggler)
    if key not in stories:
        stories[key] = _straggler_story(job, match, *key)
    return stories[key]


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
    job: JobData, match: CollectiveMatch, trace: str, device: int
) -> tuple[StragglerActivity, Lateness | None]:
    """What the straggler did in its lateness intervals, and why it was late (with the
    what-if saving); docs/analyzers/nccl_wait.md. No interval: an empty activity and None."""
    tl, late = _lateness_of(job, match)
    part = _part_of(tl, trace, device)
    late = late[late["step"] >= 0] if (late["step"] >= 0).any() else late
    ex = explain(job, tl, late, part)
    if not ex.intervals:
        return StragglerActivity(window_ns=0), None
    skew = tl.skew[part]
    own = [[a + skew, b + skew] for a, b in ex.intervals if b > a]
    ranges, loader_ns = host_ranges(job, tl, part, ex.intervals)
    causes = _with_dataloader(dict(ex.causes_ns), loader_ns)
    main = max(causes, key=lambda c: causes[c]) if causes else None
    in_range = _cpu_in_range(job, trace, device, own, causes.get("cpu", 0))
    refs = sorted(
        {
            int(r)
            for r in late.loc[late["last"] & (late["part"] == part) & (late["late_ns"] > 0), "ref"]
        }
    )
    why = Lateness(
        late_ns=ex.late_ns,
        explained_ns=ex.removable_ns,
        knock_on_ns=ex.knock_on_ns,
        causes_ns=dict(sorted(causes.items(), key=lambda kv: -kv[1])),
        main_cause=main,
        reference_ranks=[tl.parts[r][0] for r in refs],
        intervals=[[a + skew, b + skew] for a, b in ex.intervals[:MAX_INTERVALS]],
        kernels=ex.kernels,
        host_ranges=ranges,
        dataloader_range_ns=loader_ns,
        covering_range=_covering_range(ranges, main, causes, in_range),
        what_if=saving_if_on_time(tl, ex.cuts),
        cpu_in_range_ns=in_range,
    )
    return _activity(job, trace, device, own), why


def _with_dataloader(causes: dict[str, int], loader_ns: int) -> dict[str, int]:
    """``causes`` with unrecorded time moved to ``dataloader`` when a data-loading range on
    another thread of the straggler's process covers at least half of it."""
    if causes.get("unknown", 0) and loader_ns >= causes["unknown"] / 2:
        moved = min(loader_ns, causes["unknown"])
        causes["unknown"] -= moved
        causes["dataloader"] = causes.get("dataloader", 0) + moved
        causes = {c: v for c, v in causes.items() if v > 0}
    return causes


def _covering_range(
    ranges: list[dict], main: str | None, causes: dict[str, int], cpu_in_range_ns: int = 0
) -> str | None:
    """A user range (record_function, NVTX) on the straggler's process that spans most of the
    main cause's time, when that time is unrecorded (``unknown``) or ``cpu`` only because the
    range covered it (``cpu_in_range_ns``, at least half the ``cpu`` time): it names the time."""
    named = next((r for r in ranges if r["kind"] in ("annotation", "nvtx")), None)
    if named is None or main not in ("unknown", "cpu"):
        return None
    if main == "cpu" and not mostly_range_only(cpu_in_range_ns, causes["cpu"]):
        return None  # recorded host work: the range does not name it
    return named["name"] if named["overlap_ns"] >= causes[main] / 2 else None


def _cpu_in_range(job, trace: str, device: int, windows: list[list[int]], cpu_ns: int) -> int:
    """Of ``cpu_ns`` (the straggler's ``cpu`` lateness), the part that is ``cpu`` only because a
    user range covered it with nothing recorded under it: ``cpu_ns`` times that share of its
    ``cpu`` idle over ``windows`` (own clock, ns). 0 without such time."""
    idle = rank_idle(job, trace, device)
    if not cpu_ns or not windows or idle.range_only_per_gap is None or not idle.per_gap.size:
        return 0
    union = intervals.union(
        np.array([w[0] for w in windows], dtype=np.int64),
        np.array([w[1] for w in windows], dtype=np.int64),
    )
    share = covered_length(union, idle.gap_starts, idle.gap_ends) / np.maximum(
        idle.gap_ends - idle.gap_starts, 1
    )
    cpu = float((idle.per_gap[:, CAUSES.index("cpu")] * share).sum())
    only = float((idle.range_only_per_gap * share).sum())
    return int(round(cpu_ns * min(1.0, only / cpu))) if cpu > 0 else 0


def _activity(job, trace: str, device: int, windows: list[list[int]]) -> StragglerActivity:
    """GPU busy and compute share, idle by cause and host operations over ``windows`` (own clock)."""
    ops = gpu_activity(job)[(trace, device)]
    union = intervals.union(
        np.array([w[0] for w in windows], dtype=np.int64),
        np.array([w[1] for w in windows], dtype=np.int64),
    )
    window = int((union[1] - union[0]).sum())
    if window == 0:
        return StragglerActivity(window_ns=0)
    own = job.part_of(trace)  # this rank's files only
    busy = covered_length(_union(ops, slice(None)), *union).sum()
    comp = covered_length(_union(ops, ops["is_kernel"] & ~ops["is_comm"]), *union).sum()
    merged = [[int(s), int(e)] for s, e in zip(*union, strict=True)]
    return StragglerActivity(
        window_ns=window,
        windows=len(merged),
        gpu_busy_pct=round(100.0 * busy / window, 1),
        compute_pct=round(100.0 * comp / window, 1),
        idle_by_cause_ns=_idle_over(job, trace, device, union),
        top_host_ops=top_host_ops(own, trace, launch_threads(own, trace, device), merged),
    )


def _idle_over(job, trace: str, device: int, union) -> dict[str, int]:
    """The device's GPU idle by cause (:func:`stallscope.lateness.rank_idle`) over ``union``:
    each gap's causes in proportion to its covered part; causes under 1 ns left out."""
    idle = rank_idle(job, trace, device)
    if not idle.per_gap.size:
        return {}
    gap_len = np.maximum(idle.gap_ends - idle.gap_starts, 1)
    share = covered_length(union, idle.gap_starts, idle.gap_ends) / gap_len
    sums = (idle.per_gap * share[:, None]).sum(axis=0)
    return {c: int(sums[i]) for i, c in enumerate(CAUSES) if sums[i] >= 1}


# -- the metrics, tables and findings, written from the measurement alone ---------------
def metrics(m: CollectiveWaits) -> list[Metric]:
    """``collective_count`` per participant; ``nccl_wait_ns`` too on multi-rank jobs."""
    out = []
    for p in m.participants:
        w = p.where
        out.append(Metric(w.trace, w.rank, w.device, "collective_count", p.collectives, "count"))
        if m.summary is not None:
            out.append(Metric(w.trace, w.rank, w.device, "nccl_wait_ns", p.waited_ns, "ns"))
    return out


def rank_wait_rows(m: CollectiveWaits) -> list[RankWaitRow]:
    """The report's ``rank_waits`` table: one row per reported waiting rank."""
    return [rank_wait_row(p.wait) for p in m.participants if p.wait is not None]


def rank_wait_row(w: RankWait) -> RankWaitRow:
    """A waiting rank's row of the ``rank_waits`` table (the numbers its finding states)."""
    return RankWaitRow(
        trace=w.where.trace,
        rank=w.where.rank,
        device=w.where.device,
        straggler_rank=w.straggler,
        waited_ns=w.waited_ns,
        exposed_wait_ns=w.exposed_ns,
        share_of_span_pct=round(w.share_pct, 3),
        wait_outside_capture_ns=w.outside_ns,
        saving_ns=w.saving_ns,
    )


def collective_op_rows(s: JobCollectives) -> list[CollectiveOpRow]:
    """The ``collective_ops`` table: the summary's ops, rows of the summary's place."""
    w = s.where
    return [CollectiveOpRow(trace=w.trace, rank=w.rank, device=None, **op) for op in s.ops]


def critical_path_rows(s: JobCollectives) -> list[CriticalPathRow]:
    """The ``critical_path`` table: each step's cross-rank critical path."""
    w = s.where
    return [
        CriticalPathRow(
            trace=w.trace, rank=w.rank, device=None, step=p.step, time_ns=p.time_ns,
            segments=p.segments,
        )
        for p in s.critical_path
    ]  # fmt: skip


def speak(m: CollectiveWaits, params: dict[str, float]) -> list[Finding]:
    """The waiting ranks' findings (participant order), then the job's summary."""
    findings = [
        f for p in m.participants if p.wait is not None and (f := speak_rank_wait(p.wait, params))
    ]
    if m.summary is not None:
        findings.append(speak_summary(m.summary))
    return findings


def rank_wait_severity(w: RankWait, params: dict[str, float]) -> str | None:
    """Graded by the exposed wait's share of the span; at most ``low`` when the wait lies
    before the straggler's capture or the straggler alone does not set the step time."""
    severity = graded_severity(w.share_pct, w.exposed_ns, params)
    if severity is None:
        return None
    if (w.before_capture or _alone_not_enough(w, params)) and SEVERITY_RANK[severity] > SEVERITY_RANK["low"]:  # fmt: skip
        return "low"
    return severity


def _alone_not_enough(w: RankWait, params: dict[str, float]) -> bool:
    """Making the straggler on time would recover little of this rank's exposed wait (under a
    tenth, or under ``min_impact_ms``): it is not the fix to lead with."""
    saved = w.saving_ns
    return saved is not None and saved < max(w.exposed_ns / 10, params["min_impact_ms"] * 1e6)


def speak_rank_wait(w: RankWait, params: dict[str, float]) -> Finding | None:
    """A waiting rank's finding (None when its exposed wait is below the severity ladder)."""
    severity = rank_wait_severity(w, params)
    if severity is None:
        return None
    rank, device, straggler = w.where.rank, w.where.device, w.straggler
    return Finding(
        analyzer="nccl_wait",
        trace=w.where.trace,
        rank=rank,
        device=device,
        severity=severity,
        title=(
            f"Rank {rank} sat {w.exposed_ns / 1e6:.1f} ms ({w.share_pct:.0f}% of GPU {device}'s time) in "
            f"collectives waiting for rank {straggler}"
        ),
        detail=_rank_wait_detail(w, params),
        recommendation=(
            _outside_recommendation(straggler)
            if w.before_capture
            else _several_recommendation(straggler)
            if _alone_not_enough(w, params)
            else _recommendation(straggler, w.lateness)
        ),
        impact_ns=w.exposed_ns,
        saving_ns=w.saving_ns,
        evidence=_rank_wait_evidence(w),
        windows=w.windows,
    )


def _consistency(w: RankWait) -> str:
    """'<steps the straggler caused most of the wait in>/<steps> steps', '' without steps."""
    return f"{w.main_in}/{len(w.steps)} steps" if w.per_step_known else ""


def _rank_wait_detail(w: RankWait, params: dict[str, float]) -> str:
    rank, straggler, consistency = w.where.rank, w.straggler, _consistency(w)
    return (
        f"Rank {rank} spent {w.waited_ns / 1e6:.2f} ms inside {w.waits} collectives before the "
        f"last rank arrived, {w.exposed_ns / 1e6:.2f} ms of it with no compute of its own running. "
        f"Rank {straggler} arrived last in {w.last_in} of the {w.material} collectives "
        + ("of the captured steps " if w.per_step_known else "")
        + f"that rank {rank} waited in with a wait of at least {w.min_wait_ns / 1000:.0f} µs"
        + (f" and caused most of the wait in {consistency}" if consistency else "")
        + ". "
        + (
            _outside_text(straggler, w.outside_ns)
            if w.before_capture
            else _doing_text(straggler, w.activity, w.lateness)
            + (
                _not_enough_text(straggler, w.saving_ns, w.exposed_ns)
                if _alone_not_enough(w, params)
                else ""
            )
        )
    )


def _rank_wait_evidence(w: RankWait) -> dict:
    return {
        "straggler_rank": w.straggler,
        "straggler_ranks": {str(r): ns for r, ns in sorted(w.caused_ns.items())},
        "straggler_last_in": f"{w.last_in}/{w.material} collectives",
        "straggler_main_cause_in": _consistency(w),
        "nccl_wait_ns": w.waited_ns,
        "exposed_wait_ns": w.exposed_ns,
        "share_of_span_pct": round(w.share_pct, 3),
        "steps": w.steps,
        "top_waits": w.top_waits,
        "straggler_activity": _activity_evidence(w.activity),
        "lateness": None if w.lateness is None else _lateness_evidence(w.lateness),
        "wait_outside_capture_ns": w.outside_ns,
        "what_if": None if w.lateness is None or w.before_capture else w.lateness.what_if,
        "clock_skew_ns": w.clock_skew_ns,
        "data_quality": w.data_quality,
    }


def _activity_evidence(a: StragglerActivity) -> dict:
    """``straggler_activity``: ``{"window_ns": 0}`` when there was no lateness interval."""
    if not a.window_ns:
        return {"window_ns": 0}
    return {
        "window_ns": a.window_ns,
        "windows": a.windows,
        "gpu_busy_pct": a.gpu_busy_pct,
        "compute_pct": a.compute_pct,
        "idle_by_cause_ns": a.idle_by_cause_ns,
        "top_host_ops": a.top_host_ops,
    }


def _lateness_evidence(why: Lateness) -> dict:
    """``lateness``: every field but the what-if (the evidence's own ``what_if``)."""
    return {
        "late_ns": why.late_ns,
        "explained_ns": why.explained_ns,
        "knock_on_ns": why.knock_on_ns,
        "causes_ns": why.causes_ns,
        "main_cause": why.main_cause,
        "reference_ranks": why.reference_ranks,
        "intervals": why.intervals,
        "kernels": why.kernels,
        "host_ranges": why.host_ranges,
        "dataloader_range_ns": why.dataloader_range_ns,
        "covering_range": why.covering_range,
        "cpu_in_range_ns": why.cpu_in_range_ns,
    }


def speak_summary(s: JobCollectives) -> Finding:
    """The job's ``info`` finding on its matched collectives."""
    worst, corrected = s.worst, s.skew_corrected_ranks
    return Finding(
        analyzer="nccl_wait",
        trace=s.where.trace,
        rank=s.where.rank,
        device=None,
        severity="info",
        title=(
            f"Collectives: {s.matched} matched across {s.participants} ranks (all captured, in steps or not)"
            + (
                f"; rank {worst} arrived last in {s.straggler_tally[worst]} of the {s.material} with a wait "
                f"of at least {s.min_wait_ns / 1000:.0f} µs"
                if worst and s.material
                else ""
            )
        ),
        detail=(
            f"{s.matched} collectives matched by {', '.join(sorted(set(s.methods.values())))} "
            f"({s.unmatched_kernels} kernels unmatched). Clock skew per rank (ns, from completion times): "
            f"{_skew_text(s.clock_skew_ns)}"
            + (f"; corrected for ranks {corrected}" if corrected else "; no correction needed")
            + (f". Data quality: {' '.join(s.data_quality)}" if s.data_quality else ".")
        ),
        recommendation="See the per-rank nccl_wait findings; the table of collectives shows size, algorithm and bus bandwidth.",
        evidence={
            "key": "collectives",
            "matched": s.matched,
            "unmatched_kernels": s.unmatched_kernels,
            "methods": s.methods,
            "clock_skew_ns": s.clock_skew_ns,
            "skew_corrected_ranks": corrected,
            "straggler_tally": s.straggler_tally,
            "wait_caused_ns": s.wait_caused_ns,
            "ops": s.ops,
            "collectives": s.collectives,
            "data_quality": s.data_quality,
            "critical_path": s.critical_path,
        },
        windows=s.windows,
    )


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def _range_only(why: Lateness | None) -> bool:
    """The main cause is ``cpu`` only because a user range covered the time, nothing recorded
    under it: the trace shows the host was in that range, not that it used the CPU."""
    return why is not None and why.main_cause == "cpu" and bool(why.covering_range)


def _cause_text(cause: str, why: Lateness) -> str:
    """:data:`CAUSE_TEXT`, but the range-only ``cpu`` time says what the trace can show."""
    if cause == "cpu" and _range_only(why):
        return (
            f"inside host range `{why.covering_range}` with nothing recorded under it "
            "(sleep, I/O or CPU work: the trace cannot tell)"
        )
    return CAUSE_TEXT[cause]


def _doing_text(rank: int, doing: StragglerActivity, why: Lateness | None) -> str:
    """What the straggler did while it was late and what its being on time would save."""
    if why is None or not doing.window_ns:
        return (
            f"Rank {rank} took no longer than the other ranks to reach these collectives from a common point "
            "(the previous collective or the step start): the capture does not show why it was last."
        )
    causes = ", ".join(
        f"{_cause_text(c, why)} {_ms(ns)}" for c, ns in list(why.causes_ns.items())[:3]
    )
    ranges = ", ".join(r["name"] for r in why.host_ranges[:3])
    unrecorded = why.main_cause == "unknown" and not why.covering_range
    return (
        f"Aligned at the previous collective (or the step start), rank {rank} took {_ms(why.late_ns)} longer "
        f"in all than the next-latest rank to arrive (its GPU busy {doing.gpu_busy_pct:.0f}% in those "
        f"{_ms(doing.window_ns)}); its own trace accounts for {_ms(why.explained_ns)} of it"
        + (f": {causes}" if causes else "")
        + (
            f"; {_ms(why.knock_on_ns)} is knock-on (kernels the other ranks had already run while they waited)"
            if why.knock_on_ns >= 1e5
            else ""
        )
        + (
            f". Its host ranges then (around the unrecorded time, not its cause): {ranges}"
            if ranges and unrecorded
            else f". Its host was in: {ranges}"
            if ranges
            else ""
        )
        + f". Were rank {rank} on time, the captured steps would take {_ms(why.what_if['saving_ns'])} less in "
        "all (a what-if on the job's dependency graph)."
    )


def _outside_text(rank: int, outside: int) -> str:
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


def _recommendation(rank: int, why: Lateness | None) -> str:
    main = None if why is None else why.main_cause
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
    if _range_only(why):
        return (
            f"Rank {rank}'s host was inside `{why.covering_range}` while it fell behind, with nothing recorded "
            "under that range (no GPU work, no operator): look at what that range does on that rank (a sleep, "
            "I/O, a blocking call or CPU work), and shorten or remove it or move it off the step. To see which, "
            "capture it with Nsight Systems OS-runtime tracing (`-t osrt`) or py-spy." + tail
        )
    if main in ("cpu", "launch", "memcpy"):
        return (
            f"Rank {rank}'s host spent longer in Python/CPU work than the others: move rank-specific work "
            "(logging, metrics, checkpointing, evaluation) off the step or to a background thread; check garbage "
            "collection and whether that rank's CPU cores are oversubscribed (OMP_NUM_THREADS, pinning)."
            + tail
        )
    if main == "unknown" and why.covering_range:
        return (
            f"Rank {rank}'s host was inside `{why.covering_range}` while it fell behind (no GPU work, no recorded "
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


def _instance_of(job: JobData, match: CollectiveMatch, i: int) -> dict:
    """:func:`_instance_dict` of instance ``i``, built once per job (the ranks' top waits are
    mostly the same few collectives); a copy, so no two findings share one dict."""
    key = ("nccl_instance_dicts", id(match))
    built = job.cache.setdefault(key, {})
    if i not in built:
        built[i] = _instance_dict(match.instances, i)
    return dict(built[i])


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
    order=70,
    title="NCCL wait and stragglers",
    description="Time ranks spend inside collectives waiting for the last rank; who the straggler is and what it was doing.",
    run=run,
    thresholds=THRESHOLDS,
)
