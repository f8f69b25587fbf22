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

:func:`graph_saving` = launch-path idle − profiler share − one graph replay
per step, capped by the idle the launches explain (cause ``launch``; the
``cpu`` part belongs to ``gpu_idle``). Validated in
docs/analyzers/launch_overhead.md. Times are int64 nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallscope.idle import CAUSES, IdleAttribution
from stallscope.jobdata import JobData
from stallscope.sync_calls import SYNC_API_REGEX, api_name_sql

# Host cost of one recorded operator or API call under torch.profiler (record_shapes on):
# the train_small_eager pair (H200 host, torch 2.11), launch-bound and 8 % GPU-busy, took
# 22.0 ms per profiled step and 14.4 ms unprofiled with 3,396 recorded host events per step.
PROFILER_EVENT_NS = 2_200
HOST_KINDS = ("cpu_op", "runtime", "driver")
# idle during which the GPU waited for the host to make progress (a faster host shortens it)
_HOST_PROGRESS = [CAUSES.index(c) for c in ("dataloader", "launch", "cpu", "unknown")]
_LAUNCH, _CPU = CAUSES.index("launch"), CAUSES.index("cpu")


@dataclass(frozen=True)
class GraphSaving:
    """The CUDA-graph what-if of one device, in ns over the captured steps."""

    launch_idle_ns: int  # idle attributed to launches (outside graph launches): the cap
    host_idle_ns: int  # launch + cpu idle of the gaps with launch time: what a replay replaces
    profiler_ns: int  # of host_idle_ns, what the profiler's per-event cost explains
    replay_ns: int  # the replays' own cost (graph_replay_us x steps)
    saving_ns: int  # min(host_idle - profiler, launch_idle) - replay, at least 0
    event_cost_ns: int  # the per-event profiler cost assumed


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
    when there are no steps), the profiler's host cost (``event_cost_ns`` per recorded host
    event) taken out."""
    per_gap = attribution.per_gap
    if not per_gap.size:
        return GraphSaving(0, 0, 0, 0, 0, event_cost_ns)
    launch = per_gap[:, _LAUNCH] - attribution.graph_launch_per_gap
    waits = np.where(launch > 0, launch + per_gap[:, _CPU], 0)
    consumes = np.maximum(per_gap[:, _HOST_PROGRESS].sum(axis=1), waits)
    events, syncs = _host_events(job, trace_id, attribution.threads)
    profiler = profiler_share(attribution.gap_ends, waits, consumes, events, syncs, event_cost_ns)
    launch_idle, host_idle, share = int(launch.sum()), int(waits.sum()), int(profiler.sum())
    replay = replay_ns * max(steps, 1)
    saving = max(min(host_idle - share, launch_idle) - replay, 0)
    return GraphSaving(launch_idle, host_idle, share, replay, saving, event_cost_ns)


def profiler_share(
    gap_ends: np.ndarray,
    waits: np.ndarray,
    consumes: np.ndarray,
    event_starts: np.ndarray,
    sync_ends: np.ndarray,
    event_cost_ns: int,
) -> np.ndarray:
    """Per gap: how much of ``waits`` the host's profiler cost explains (the module docstring).

    ``gap_ends``: each idle gap's end; ``consumes``: the gap's idle that a faster host
    shortens (at least ``waits``, the part whose shrink is counted); ``event_starts``:
    the recorded host events, each costing ``event_cost_ns``; ``sync_ends``: when the
    host's waits for the GPU returned (the lead restarts there). An event or sync at a
    gap's end counts before the gap.
    """
    gap_ends = np.asarray(gap_ends, dtype=np.int64)
    events = np.sort(np.asarray(event_starts, dtype=np.int64))
    syncs = np.sort(np.asarray(sync_ends, dtype=np.int64))
    out = np.zeros(len(gap_ends), dtype=np.int64)
    seen = np.searchsorted(events, gap_ends, side="right")  # events up to each gap's end
    last = np.searchsorted(syncs, gap_ends, side="right") - 1  # the last sync before it, or -1
    sync_at = np.where(
        last >= 0, syncs[np.maximum(last, 0)] if syncs.size else 0, np.iinfo(np.int64).min
    )
    after_sync = np.searchsorted(events, sync_at, side="right")  # events up to that sync
    order = np.argsort(gap_ends, kind="stable")
    order = order[np.asarray(consumes)[order] > 0]
    lead, prev_end, prev_seen = 0, None, 0
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
            lead = event_cost_ns * (n_seen - n_sync)  # the host waited: its lead restarts
        else:
            lead += event_cost_ns * (n_seen - prev_seen)
        taken = min(int(want), lead)
        out[i] = min(int(can), taken)
        lead -= taken
        prev_end, prev_seen = end, n_seen
    return out


def _host_events(
    job: JobData, trace_id: str, threads: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Starts of the recorded host events on ``threads`` and ends of their synchronize calls."""
    empty = np.zeros(0, dtype=np.int64)
    if not threads:
        return empty, empty
    pairs = ", ".join(f"({int(p)}, {int(t)})" for p, t in threads)
    kinds = ", ".join(f"'{k}'" for k in HOST_KINDS)
    rows = job.numpy(
        f"""SELECT h.start_ns, h.end_ns,
              h.kind IN ('runtime', 'driver') AND regexp_matches({api_name_sql("n.name")}, '{SYNC_API_REGEX}') AS sync
            FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
            WHERE h.trace_id = ? AND h.kind IN ({kinds}) AND (h.pid, h.tid) IN (VALUES {pairs})""",
        [trace_id],
    )
    sync = np.asarray(rows["sync"], dtype=bool)
    return (
        np.asarray(rows["start_ns"], dtype=np.int64),
        np.asarray(rows["end_ns"], dtype=np.int64)[sync],
    )
