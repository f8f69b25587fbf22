"""What capturing the step in a CUDA graph would save, with the profiler's own cost taken out.

A launch-bound trace shows the GPU waiting while the host issues work: inside
launch calls and the operators that made them (idle cause ``launch``) and in
the operator and Python work between them (cause ``cpu``) (see
:mod:`stallscope.idle`). One graph replay replaces all of that host work, so
the idle of those gaps is what the graph could save -- *unprofiled*. But the
profiler slows the host: every operator and API call it records costs the
host about :data:`PROFILER_EVENT_NS` of bookkeeping, and where the host only
just keeps behind the GPU that slowdown is most of the idle the trace shows.

:func:`profiler_share` replays the host without that cost: the host's *lead*
(how much earlier it would reach each point, relative to the GPU's own shift)
grows by the per-event cost at every recorded host event on the threads that
launch onto the device, restarts at 0 when the host waits for the GPU (a
synchronize call returns), and every gap in which the GPU waited for host
progress shrinks by as much of the lead as it can take; the lead it took is
spent (the GPU then runs that much earlier too). The part of each shrink that
falls on the gap's ``launch``/``cpu`` idle is the profiler's share.

The per-event cost was fitted on one capture; some captures run far slower than it
explains (decode_eager: about 8 us per recorded call, the whole host slower, Python and the
libraries' unrecorded CUDA calls included: CUPTI's callbacks run inside every one). The
unprofiled cost of the recorded work is what stays put across hosts and loops, so
:func:`host_work` counts the launching threads' recorded calls by kind and the host's own
time over the span, :func:`host_work_ns` prices the calls with weights fitted on paired
captures (the host-work model), and :func:`work_slowdown` f = busy / (work + events x cost).
Where the host bounds the step, its recorded calls cover most of its time and f is
plausible (at most ``MAX_SLOWDOWN``), the host's lead also grows by (1 - 1/f) of the time
that passes, and ``upper_ns`` keeps the saving without it: the trace cannot tell a
profiler-slowed host from a slower CPU. (:func:`inner_gaps` / :func:`host_slowdown`, the
pace between recorded calls inside one operator, are still reported but not used: that
pace depends on the code, not only on the host.)

:func:`graph_saving` = launch-path idle − profiler share − one graph replay
per step, capped by the idle the launches explain (cause ``launch``; the
``cpu`` part belongs to ``gpu_idle``). Validated in
docs/analyzers/launch_overhead.md. Times are int64 nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallscope.idle import CAUSES, LAUNCH_API_REGEX, IdleAttribution
from stallscope.jobdata import JobData
from stallscope.sync_calls import COPY_API_REGEX, SYNC_API_REGEX, api_name_sql

# Host cost of one recorded operator or API call under torch.profiler (record_shapes on):
# the train_small_eager pair (H200 host, torch 2.11), launch-bound and 8 % GPU-busy, took
# 22.0 ms per profiled step and 14.4 ms unprofiled with 3,396 recorded host events per step.
PROFILER_EVENT_NS = 2_200
# The same capture's host pace: the 10th percentile of the gaps between consecutive recorded
# events inside one operator (:func:`inner_gaps`), 0.83 us (reported as ``inner_gap_ns``).
REFERENCE_INNER_GAP_NS = 830
INNER_GAP_PERCENTILE = 10
MIN_INNER_GAPS = 200  # fewer: the pace is not measured (reported as None)
# The largest slowdown the profiler was measured to cause (decode_eager: 2.2); a host busier
# than that against its recorded work did work the model does not see (data loading, CPU
# compute inside one long operator, Python): there only the per-call cost is taken out.
MAX_SLOWDOWN = 2.5
# The host-work model: what the recorded work costs the host *unprofiled*, ns per recorded
# call by kind: operator (cpu_op), kernel-launch call, other CUDA runtime/driver call (events,
# stream queries, memsets: it also stands for the library and autograd-engine host work that
# comes with them and is not recorded). Least squares of the unprofiled eager step over 10
# paired H200 captures of 5 host-bound loops (tools/capture/fit_host_work.py; truths in
# sample_traces/logs/launch_pairs_2026-12-02.json); validated on held-out samples.
WORK_OP_NS = 1_530
WORK_LAUNCH_NS = 7_090
WORK_OTHER_NS = 13_600
# the model is applied where the host bounds the step: launch-path idle >= this share of span,
HOST_BOUND_SHARE = 0.5
# and where the recorded calls cover at least this share of the host's own time (the model
# sees only recorded work: unrecorded Python or data loading is not a profiler slowdown)
RECORDED_SHARE = 0.6
HOST_KINDS = ("cpu_op", "runtime", "driver")
# idle during which the GPU waited for the host to make progress (a faster host shortens it)
_HOST_PROGRESS = [CAUSES.index(c) for c in ("dataloader", "launch", "cpu", "unknown")]
_LAUNCH, _CPU = CAUSES.index("launch"), CAUSES.index("cpu")


@dataclass(frozen=True)
class HostEvents:
    """The recorded host events of the launching threads, int64 ns."""

    starts: np.ndarray  # every cpu_op, runtime and driver event
    sync_ends: np.ndarray  # when their synchronize calls returned
    inner_gaps: np.ndarray  # gaps between consecutive events inside one operator
    kinds: np.ndarray | None = None  # per event: 0 operator, 1 launch call, 2 other API call
    wait_ns: np.ndarray | None = None  # per event: its time if the host waited there (sync, copy)
    ends: np.ndarray | None = None  # per event: its end


@dataclass(frozen=True)
class HostWork:
    """The launching threads' recorded work over the idle attribution's span (ns, counts)."""

    busy_ns: int  # span less the time in synchronize and copy calls: the host's own time
    ops: int  # recorded operators
    launches: int  # kernel-launch calls (graph launches included)
    other: int  # other CUDA runtime / driver calls
    recorded_ns: int = 0  # of busy_ns, the time inside recorded calls (their union)

    @property
    def recorded_share(self) -> float:
        """How much of the host's own time the recorded calls cover (0..1)."""
        return self.recorded_ns / self.busy_ns if self.busy_ns else 0.0

    @property
    def work_ns(self) -> int:
        """What this work costs the host unprofiled (the host-work model), ns."""
        return host_work_ns(self.ops, self.launches, self.other)

    @property
    def events(self) -> int:
        return self.ops + self.launches + self.other


@dataclass(frozen=True)
class GraphSaving:
    """The CUDA-graph what-if of one device, in ns over the captured steps."""

    launch_idle_ns: int  # idle attributed to launches (outside graph launches): the cap
    host_idle_ns: int  # launch + cpu idle of the gaps with launch time: what a replay replaces
    profiler_ns: int  # of host_idle_ns, what the profiler explains (per-event cost and slowdown)
    replay_ns: int  # the replays' own cost (graph_replay_us x steps)
    saving_ns: int  # min(host_idle - profiler, launch_idle) - replay, at least 0
    event_cost_ns: int  # the per-event profiler cost assumed
    slowdown: float = 1.0  # the host's pace against the calibration capture (host_slowdown)
    inner_gap_ns: int | None = None  # the trace's inner-gap percentile, None if not measured
    upper_ns: int = 0  # the saving with the per-event cost alone (slowdown 1): the upper end
    host_busy_ns: int | None = None  # the host's own time over the span (HostWork.busy_ns)
    host_work_ns: int | None = None  # that work unprofiled, by the host-work model


def inner_gaps(thread: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Gaps between consecutive recorded events that lie inside one outermost event.

    Rows sorted by thread, start, then end descending. Between two events inside the
    same operator (say ``aten::linear``'s ``aten::t`` and ``aten::addmm``) only C++ runs:
    the dispatcher and the profiler's own bookkeeping, so a low percentile of these
    gaps is the host's pace at recording events. Gaps where an event nests in the one
    before it (it starts before that one ends) are not transitions and are left out.
    """
    n = len(starts)
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    starts, ends = starts - starts.min(), ends - starts.min()  # small numbers: no overflow below
    new_thread = np.r_[True, thread[1:] != thread[:-1]]
    # the latest end among the earlier events of the same thread (each thread lifted above
    # the one before it, so that one running maximum serves all of them)
    offset = np.cumsum(new_thread) * (int(ends.max()) + 1)
    reach = np.maximum.accumulate(ends + offset) - offset
    prev_reach = np.r_[0, reach[:-1]]
    inside = ~new_thread & (starts < prev_reach)  # an earlier event still open: not top level
    prev_end = np.r_[0, ends[:-1]]
    transition = inside & (starts >= prev_end)  # the previous event ended: not nested in it
    return (starts - prev_end)[transition]


def host_work_ns(ops: int, launches: int, other: int) -> int:
    """Unprofiled host time of recorded work, ns: operators x ``WORK_OP_NS`` + launch calls x
    ``WORK_LAUNCH_NS`` + other CUDA API calls x ``WORK_OTHER_NS`` (the host-work model)."""
    return int(ops * WORK_OP_NS + launches * WORK_LAUNCH_NS + other * WORK_OTHER_NS)


def work_slowdown(work: HostWork, event_cost_ns: int) -> float:
    """How many times slower the profiled host ran than its recorded work explains.

    f = ``busy_ns`` / (``work_ns`` + events x ``event_cost_ns``): the host's own time over the
    span against the host-work model's unprofiled cost plus the per-event profiler cost; at
    least 1; 1 without recorded work. The profiled host time is then f x (unprofiled time +
    events x cost), as :func:`profiler_share` replays it. :func:`graph_saving` uses it only up
    to ``MAX_SLOWDOWN``.
    """
    expected = work.work_ns + work.events * event_cost_ns
    if expected <= 0 or work.busy_ns <= 0:
        return 1.0
    return max(work.busy_ns / expected, 1.0)


def host_slowdown(gaps: np.ndarray) -> tuple[float, int | None]:
    """The host's pace against the calibration capture (evidence only): (factor >= 1, percentile).

    ``gaps``: :func:`inner_gaps`. Factor = the trace's ``INNER_GAP_PERCENTILE``-th
    percentile over ``REFERENCE_INNER_GAP_NS``, at least 1 (a faster host keeps the
    per-event cost), at most ``MAX_SLOWDOWN``; 1 and None with fewer than
    ``MIN_INNER_GAPS`` gaps (no operators with recorded children) or on a clock too
    coarse to measure it (most gaps whole microseconds: older Kineto traces).
    """
    gaps = np.asarray(gaps, dtype=np.int64)
    if len(gaps) < MIN_INNER_GAPS or np.mean(gaps % 1_000 == 0) > 0.5:
        return 1.0, None
    pace = int(np.percentile(gaps, INNER_GAP_PERCENTILE))
    return min(max(pace / REFERENCE_INNER_GAP_NS, 1.0), MAX_SLOWDOWN), pace


def graph_saving(
    job: JobData,
    trace_id: str,
    device: int,
    attribution: IdleAttribution,
    steps: int,
    *,
    replay_ns: int,
    event_cost_ns: int = PROFILER_EVENT_NS,
) -> GraphSaving:
    """The saving of replaying each step as one CUDA graph (``replay_ns`` per step; one replay
    when there are no steps), the profiler's host cost taken out: ``event_cost_ns`` per
    recorded host event and, where the host ran slower than the calibration capture
    (:func:`host_slowdown`), the share of its time that slowdown explains.
    ``upper_ns`` is the saving with the per-event cost alone."""
    per_gap = attribution.per_gap
    if not per_gap.size:
        return GraphSaving(0, 0, 0, 0, 0, event_cost_ns)
    launch = per_gap[:, _LAUNCH] - attribution.graph_launch_per_gap
    waits = np.where(launch > 0, launch + per_gap[:, _CPU], 0)
    consumes = np.maximum(per_gap[:, _HOST_PROGRESS].sum(axis=1), waits)
    host = _host_events(job, trace_id, attribution.threads)
    pace = host_slowdown(host.inner_gaps)[1]
    launch_idle, host_idle = int(launch.sum()), int(waits.sum())
    replay = replay_ns * max(steps, 1)
    work = host_work(host, attribution.span_start, attribution.span_end)
    span = attribution.span_end - attribution.span_start
    slowdown = work_slowdown(work, event_cost_ns) if event_cost_ns else 1.0
    applies = (
        host_idle >= HOST_BOUND_SHARE * span
        and work.recorded_share >= RECORDED_SHARE
        and slowdown <= MAX_SLOWDOWN
    )
    slowdown = slowdown if applies else 1.0

    def saving(factor: float) -> tuple[int, int]:
        share = profiler_share(
            attribution.gap_ends,
            waits,
            consumes,
            host.starts,
            host.sync_ends,
            event_cost_ns,
            slowdown=factor,
        )
        total = int(share.sum())
        return total, max(min(host_idle - total, launch_idle) - replay, 0)

    share, value = saving(slowdown)
    upper = saving(1.0)[1] if slowdown > 1.0 else value
    return GraphSaving(
        launch_idle,
        host_idle,
        share,
        replay,
        value,
        event_cost_ns,
        round(slowdown, 2),
        pace,
        upper,
        work.busy_ns,
        work.work_ns,
    )


def host_work(host: HostEvents, span_start: int, span_end: int) -> HostWork:
    """The recorded work of ``host`` whose events start in [``span_start``, ``span_end``), the
    host's own time there (the span less the time its synchronize and copy calls took) and
    the part of it inside recorded calls (their union clipped to the span, less those waits)."""
    starts = host.starts
    inside = (starts >= span_start) & (starts < span_end)
    kinds = host.kinds if host.kinds is not None else np.zeros(len(starts), dtype=np.int8)
    counts = np.bincount(kinds[inside].astype(np.int64), minlength=3)
    waited = int(host.wait_ns[inside].sum()) if host.wait_ns is not None else 0
    busy = max(int(span_end - span_start) - waited, 0)
    recorded = 0
    if host.ends is not None and inside.any():
        s = starts[inside]
        e = np.minimum(host.ends[inside], span_end)
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        new = np.r_[True, s[1:] > reach[:-1]]  # a start past everything before it: a new run
        run_end = np.r_[reach[np.flatnonzero(new[1:])], reach[-1]]  # each run's last reach
        recorded = max(int((run_end - s[new]).sum()) - waited, 0)
    return HostWork(busy, int(counts[0]), int(counts[1]), int(counts[2]), min(recorded, busy))


def profiler_share(
    gap_ends: np.ndarray,
    waits: np.ndarray,
    consumes: np.ndarray,
    event_starts: np.ndarray,
    sync_ends: np.ndarray,
    event_cost_ns: int,
    *,
    slowdown: float = 1.0,
) -> np.ndarray:
    """Per gap: how much of ``waits`` the host's profiler cost explains (the module docstring).

    ``gap_ends``: each idle gap's end; ``consumes``: the gap's idle that a faster host
    shortens (at least ``waits``, the part whose shrink is counted); ``event_starts``:
    the recorded host events, each costing ``event_cost_ns``; ``sync_ends``: when the
    host's waits for the GPU returned (the lead restarts there). An event or sync at a
    gap's end counts before the gap. ``slowdown`` f > 1: the host ran f times slower than
    unprofiled, so besides the per-event cost its lead also grows by (1 - 1/f) of the
    time that passes (from the first event or the last sync); the counted events are
    then the calibration host's (H_profiled = f x (H_unprofiled + events x cost)).
    """
    gap_ends = np.asarray(gap_ends, dtype=np.int64)
    events = np.sort(np.asarray(event_starts, dtype=np.int64))
    syncs = np.sort(np.asarray(sync_ends, dtype=np.int64))
    out = np.zeros(len(gap_ends), dtype=np.int64)
    pace = 1.0 - 1.0 / slowdown if slowdown > 1.0 else 0.0
    seen = np.searchsorted(events, gap_ends, side="right")  # events up to each gap's end
    last = np.searchsorted(syncs, gap_ends, side="right") - 1  # the last sync before it, or -1
    sync_at = np.where(
        last >= 0, syncs[np.maximum(last, 0)] if syncs.size else 0, np.iinfo(np.int64).min
    )
    after_sync = np.searchsorted(events, sync_at, side="right")  # events up to that sync
    order = np.argsort(gap_ends, kind="stable")
    order = order[np.asarray(consumes)[order] > 0]
    first = int(events[0]) if events.size else (int(gap_ends.min()) if gap_ends.size else 0)
    lead, prev_end, prev_seen = 0.0, None, 0
    for i, end, n_seen, sync, n_sync, want, can in zip(
        order.tolist(),
        gap_ends[order].tolist(),
        seen[order].tolist(),
        sync_at[order].tolist(),
        after_sync[order].tolist(),
        np.asarray(consumes)[order].tolist(),
        np.asarray(waits)[order].tolist(),
        strict=True,
    ):
        if last[i] >= 0 and (prev_end is None or sync > prev_end):
            # the host waited: its lead restarts
            lead = event_cost_ns * (n_seen - n_sync) + pace * max(end - sync, 0)
        else:
            since = first if prev_end is None else prev_end
            lead += event_cost_ns * (n_seen - prev_seen) + pace * max(end - since, 0)
        taken = min(int(want), int(lead))
        out[i] = min(int(can), taken)
        lead -= taken
        prev_end, prev_seen = end, n_seen
    return out


def _host_events(job: JobData, trace_id: str, threads: list[tuple[int, int]]) -> HostEvents:
    """The recorded host events on ``threads``: their starts, their synchronize calls' ends
    and the gaps between events inside one operator (:func:`inner_gaps`)."""
    empty = np.zeros(0, dtype=np.int64)
    if not threads:
        return HostEvents(empty, empty, empty)
    pairs = ", ".join(f"({int(p)}, {int(t)})" for p, t in threads)
    kinds = ", ".join(f"'{k}'" for k in HOST_KINDS)
    rows = job.numpy(
        f"""WITH n AS (  -- the patterns per distinct name, not per event
              SELECT name_id,
                regexp_matches({api_name_sql("name")}, '{SYNC_API_REGEX}') AS sync_api,
                regexp_matches({api_name_sql("name")}, '{COPY_API_REGEX}') AS copy_api,
                regexp_matches(name, '{LAUNCH_API_REGEX}') AS launch_api
              FROM names WHERE trace_id = $1)
            SELECT h.pid, h.tid, h.start_ns, h.end_ns,
              h.kind IN ('runtime', 'driver') AND n.sync_api AS sync,
              h.kind IN ('runtime', 'driver') AND n.copy_api AS copy,
              CASE WHEN h.kind = 'cpu_op' THEN 0 WHEN n.launch_api THEN 1 ELSE 2 END AS what
            FROM host h JOIN n ON n.name_id = h.name_id
            WHERE h.trace_id = $1 AND h.kind IN ({kinds}) AND (h.pid, h.tid) IN (VALUES {pairs})
            ORDER BY h.pid, h.tid, h.start_ns, h.end_ns DESC""",
        [trace_id],
    )
    starts = np.asarray(rows["start_ns"], dtype=np.int64)
    ends = np.asarray(rows["end_ns"], dtype=np.int64)
    pid, tid = np.asarray(rows["pid"], dtype=np.int64), np.asarray(rows["tid"], dtype=np.int64)
    changes = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])  # rows are sorted by pid, tid
    thread = np.cumsum(np.r_[True, changes])  # one number per thread (pids may be 62-bit hashes)
    sync = np.asarray(rows["sync"], dtype=bool)
    waited = sync | np.asarray(rows["copy"], dtype=bool)
    return HostEvents(
        starts,
        ends[sync],
        inner_gaps(thread, starts, ends),
        np.asarray(rows["what"], dtype=np.int8),
        np.where(waited, ends - starts, 0),
        ends,
    )
