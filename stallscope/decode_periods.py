"""What each decode period of an inference trace holds: GPU work, prefills, and host causes.

A *decode period* runs from the GPU completion of one decode iteration to the
GPU completion of the next (see :mod:`stallscope.iterations`): the time the
batch waited for its next token, i.e. the time per output token (TPOT) of
every sequence in the batch. When the host runs ahead of the GPU (CUDA graphs
queued early) the host period is shorter and is not it.

:func:`measure_periods` splits every nanosecond of every period into

* GPU busy: the decode iteration's own work, prefill/mixed iterations' work
  (``prefill_ns``), or other work (``other_busy_ns``), of which communication
  kernels not overlapped by compute are ``exposed_comm_ns`` and large
  host<->device copies ``kv_copy_ns``;
* GPU idle, labelled by what the host process (any thread of it) was doing,
  the first that applies: ``sync`` (a synchronize call, ``.item()``/
  ``aten::_local_scalar_dense``), ``graph_launch`` (inside ``cudaGraphLaunch``,
  which CUPTI inflates), ``launch`` (a launch call or the operator that made
  it), ``cpu`` (other operators,
  Python, runtime calls, and unrecorded time inside a user range), and
  ``unknown`` (nothing recorded).

Each idle nanosecond of host work (``sync``, ``cpu``, ``unknown``) is also
charged to the innermost user range covering it
that is neither an iteration nor ``ProfilerStep#N`` (``sample_and_schedule``,
a scheduler or detokenizer range): the cause is named by the range that owns
it. Periods that cross a ``ProfilerStep`` boundary are flagged: their idle
time holds the capture loop's own synchronize and ``prof.step()``.

A period that holds a prefill of exactly the batch of the decode that ends it
(static batching: each ``generate()`` call prefills its whole batch, then
decodes it) starts a new batch of requests: its wait is those requests' time to
first token, not a time per output token of a running batch, so it is left out
(:func:`new_batch_periods`). Batch sizes are known from input shapes or engine
names; where unknown nothing is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from stallscope import intervals
from stallscope.idle import GRAPH_LAUNCH_REGEX, LAUNCH_API_REGEX, SYNC_OP_REGEX
from stallscope.iterations import ITERATION_NAME_REGEX, Iterations
from stallscope.jobdata import JobData
from stallscope.sync_calls import API_SQL, SYNC_API_REGEX

IDLE_CAUSES = ("sync", "graph_launch", "launch", "issue", "cpu", "queued", "unknown")
HOST_WORK = ("sync", "cpu", "unknown")  # host work between iterations: not launching, not queued
KV_COPY_MIN_BYTES = 1 << 20  # a host<->device copy this large on the decode path is KV traffic

_HOST_SQL = f"""
WITH launch_ext AS (
  SELECT DISTINCT h.external_id FROM host h JOIN names n USING (trace_id, name_id)
  WHERE h.trace_id = $t AND h.kind IN ('runtime', 'driver') AND h.external_id IS NOT NULL
    AND regexp_matches(n.name, '{LAUNCH_API_REGEX}') AND NOT regexp_matches(n.name, '{GRAPH_LAUNCH_REGEX}')
)
SELECT h.start_ns, h.end_ns,
  CASE
    WHEN (h.kind IN ('runtime', 'driver') AND regexp_matches({API_SQL}, '{SYNC_API_REGEX}'))
      OR (h.kind = 'cpu_op' AND regexp_matches(n.name, '{SYNC_OP_REGEX}')) THEN 0
    WHEN h.kind IN ('runtime', 'driver') AND regexp_matches(n.name, '{GRAPH_LAUNCH_REGEX}') THEN 1
    WHEN (h.kind IN ('runtime', 'driver') AND regexp_matches(n.name, '{LAUNCH_API_REGEX}'))
      OR (h.kind = 'cpu_op' AND h.external_id IN (SELECT external_id FROM launch_ext)) THEN 2
    ELSE 3
  END AS cause
FROM host h JOIN names n USING (trace_id, name_id)
WHERE h.trace_id = $t AND h.pid IN (SELECT unnest($pids))
  AND h.kind IN ('cpu_op', 'python', 'runtime', 'driver', 'overhead')
"""


@dataclass
class DecodePeriods:
    """Per decode period (rows in time order), ns: the breakdown described in the module docstring.

    ``start``/``end`` bound period ``i`` (GPU end of decode iteration ``i`` and of
    the next one); ``iteration`` is the index (into :class:`Iterations`) of the
    decode iteration that ends it; ``prefills`` lists, per period, the indices
    of the prefill/mixed iterations whose GPU work falls in it. ``by_range``
    maps a user range's name to the idle ns charged to it in each period.
    """

    start: np.ndarray
    end: np.ndarray
    iteration: np.ndarray
    decode_busy_ns: np.ndarray
    prefill_ns: np.ndarray
    other_busy_ns: np.ndarray
    exposed_comm_ns: np.ndarray
    kv_copy_ns: np.ndarray
    idle: dict[str, np.ndarray]
    by_range: dict[str, np.ndarray]
    step_boundary: np.ndarray
    prefills: list[list[int]] = field(default_factory=list)
    sync_calls: np.ndarray | None = None

    @property
    def period_ns(self) -> np.ndarray:
        return self.end - self.start

    @property
    def idle_ns(self) -> np.ndarray:
        return sum(self.idle.values(), np.zeros(self.start.size, dtype=np.int64))

    def subset(self, keep: np.ndarray) -> DecodePeriods:
        """The periods where ``keep`` (bool per period) is true, every field alike."""
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {key: column[keep] for key, column in value.items()}
            elif isinstance(value, list):
                value = [item for item, kept in zip(value, keep, strict=True) if kept]
            elif value is not None:
                value = value[keep]
            values[f.name] = value
        return DecodePeriods(**values)


def measure_periods(
    job: JobData, trace_id: str, device: int, its: Iterations
) -> DecodePeriods | None:
    """The decode periods of one device; None with fewer than two decode iterations."""
    decode = its.token_steps()
    if decode.size < 2:
        return None
    starts, ends = its.gpu_end[decode[:-1]], its.gpu_end[decode[1:]]
    gpu = _gpu_ops(job, trace_id, device, int(starts[0]), int(ends[-1]))
    pids = _pids(job, trace_id, device)
    host = job.con.execute(_HOST_SQL, {"t": trace_id, "pids": pids}).fetchnumpy()
    user = _user_ranges(job, trace_id, int(starts[0]), int(ends[-1]))
    segs = _segments(starts, ends, gpu, host, its, decode, user)
    periods = _sum_segments(segs, starts, ends, decode)
    _charge_user_ranges(periods, segs, user)
    periods.step_boundary = _crosses_step(job, trace_id, its, decode)
    periods.prefills = _prefills_in(its, starts, ends)
    periods.sync_calls = _sync_calls(job, trace_id, pids, starts, ends)
    running = ~new_batch_periods(its, periods)
    if not running.any():
        return None
    return periods if running.all() else periods.subset(running)


def new_batch_periods(its: Iterations, periods: DecodePeriods) -> np.ndarray:
    """Per period, whether it holds a prefill of the same (known) batch as the decode that
    ends it: a new batch of requests (see the module docstring), not a running batch's token."""
    batch = its.batch[periods.iteration]
    return np.array(
        [
            b > 0 and any(its.phases[i] == "prefill" and its.batch[i] == b for i in held)
            for b, held in zip(batch.tolist(), periods.prefills, strict=True)
        ],
        dtype=bool,
    )


def _gpu_ops(job: JobData, trace_id: str, device: int, lo: int, hi: int) -> dict:
    return job.numpy(
        """SELECT g.start_ns, g.end_ns, g.kind, g.is_comm, coalesce(g.bytes, 0) AS bytes,
             coalesce(g.copy_kind, '') AS copy_kind, h.start_ns AS launch_ns, h.end_ns AS launch_end
           FROM gpu g LEFT JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation
             AND h.kind IN ('runtime', 'driver')
           WHERE g.trace_id = ? AND g.device = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
             AND g.end_ns > ? AND g.start_ns < ?""",
        [trace_id, device, lo, hi],
    )


def _pids(job: JobData, trace_id: str, device: int) -> list[int]:
    rows = job.sql(
        """SELECT DISTINCT h.pid FROM host h JOIN gpu g ON g.trace_id = h.trace_id AND g.correlation = h.correlation
           WHERE h.trace_id = ? AND g.device = ? AND h.kind IN ('runtime', 'driver')""",
        [trace_id, device],
    ).fetchall()
    if not rows:
        rows = job.sql("SELECT DISTINCT pid FROM host WHERE trace_id = ?", [trace_id]).fetchall()
    return [int(r[0]) for r in rows]


def _owner_masks(gpu: dict, its: Iterations, decode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which GPU ops a decode iteration launched, and which a prefill/mixed one launched."""
    launch = np.where(np.isnan(gpu["launch_ns"].astype(float)), gpu["start_ns"], gpu["launch_ns"])
    launch = launch.astype(np.int64)

    def launched_by(indices: np.ndarray) -> np.ndarray:
        if indices.size == 0:
            return np.zeros(launch.size, dtype=bool)
        hs, he = its.host_start[indices], its.host_end[indices]
        order = np.argsort(hs)
        return intervals.covers(intervals.union(hs[order], he[order]), launch)

    others = np.flatnonzero(np.isin(np.asarray(its.phases), ("prefill", "mixed")))
    return launched_by(decode), launched_by(others)


def _segments(starts, ends, gpu, host, its: Iterations, decode: np.ndarray, user: dict) -> dict:
    """Elementary segments of [first period start, last period end) with their labels."""
    mine, prefill = _owner_masks(gpu, its, decode)
    kernel = gpu["kind"] == "kernel"
    comm = np.asarray(gpu["is_comm"], dtype=bool) & kernel
    big_copy = (gpu["kind"] == "memcpy") & (gpu["bytes"] >= KV_COPY_MIN_BYTES)
    big_copy &= np.isin(gpu["copy_kind"], ("HtoD", "DtoH"))
    unions = {
        "busy": intervals.union(gpu["start_ns"], gpu["end_ns"]),
        "decode": intervals.union(gpu["start_ns"][mine], gpu["end_ns"][mine]),
        "prefill": intervals.union(gpu["start_ns"][prefill], gpu["end_ns"][prefill]),
        "compute": intervals.union(gpu["start_ns"][kernel & ~comm], gpu["end_ns"][kernel & ~comm]),
        "comm": intervals.union(gpu["start_ns"][comm], gpu["end_ns"][comm]),
        "kv": intervals.union(gpu["start_ns"][big_copy], gpu["end_ns"][big_copy]),
        "iteration": intervals.union(its.host_start, its.host_end),
        "user": intervals.union(user["start_ns"], user["end_ns"]),
        "queued": _queued_gaps(gpu, intervals.union(gpu["start_ns"], gpu["end_ns"])),
    }
    cause = np.asarray(host["cause"])
    host_unions = [
        intervals.union(host["start_ns"][cause == c], host["end_ns"][cause == c]) for c in range(4)
    ]
    lo, hi = int(starts[0]), int(ends[-1])
    edges = [
        starts,
        ends,
        *[e for u in unions.values() for e in u],
        *[e for u in host_unions for e in u],
    ]
    points = np.unique(np.clip(np.concatenate(edges), lo, hi))
    seg_start, seg_len = points[:-1], np.diff(points)
    flags = {name: intervals.covers(u, seg_start) for name, u in unions.items()}
    label = np.full(seg_start.size, IDLE_CAUSES.index("unknown"), dtype=np.int64)
    label[flags["queued"]] = IDLE_CAUSES.index("queued")
    free = ~flags["queued"]
    for code, u in enumerate(host_unions):
        hit = free & intervals.covers(u, seg_start)
        label[hit] = code if code < 3 else IDLE_CAUSES.index("cpu")
        free &= ~hit
    return {"start": seg_start, "len": seg_len, "flags": flags, "label": label}


def _sum_segments(segs: dict, starts, ends, decode) -> DecodePeriods:
    """Sum the labelled segments per period (the unrecorded-time rules of the module docstring)."""
    seg_start, seg_len, flags, label = segs["start"], segs["len"], segs["flags"], segs["label"]
    period = np.searchsorted(starts, seg_start, side="right") - 1
    n = starts.size

    def per_period(mask: np.ndarray) -> np.ndarray:
        out = np.zeros(n, dtype=np.int64)
        np.add.at(out, period[mask], seg_len[mask])
        return out

    busy, idle = flags["busy"], ~flags["busy"]
    unknown = label == IDLE_CAUSES.index("unknown")
    label = label.copy()
    label[unknown & flags["user"]] = IDLE_CAUSES.index("cpu")  # Python inside a user range
    issuing = (unknown | (label == IDLE_CAUSES.index("cpu"))) & ~flags["user"] & flags["iteration"]
    label[issuing] = IDLE_CAUSES.index("issue")  # the iteration's own issue path
    segs["final"] = label
    return DecodePeriods(
        start=starts,
        end=ends,
        iteration=decode[1:],
        decode_busy_ns=per_period(busy & flags["decode"]),
        prefill_ns=per_period(busy & flags["prefill"] & ~flags["decode"]),
        other_busy_ns=per_period(busy & ~flags["decode"] & ~flags["prefill"]),
        exposed_comm_ns=per_period(flags["comm"] & ~flags["compute"]),
        kv_copy_ns=per_period(flags["kv"] & ~flags["compute"]),
        idle={c: per_period(idle & (label == i)) for i, c in enumerate(IDLE_CAUSES)},
        by_range={},
        step_boundary=np.zeros(n, dtype=bool),
    )


def _user_ranges(job: JobData, trace_id: str, lo: int, hi: int) -> dict:
    """Host ranges in [lo, hi) that are neither iterations nor profiler steps, shortest first."""
    return job.numpy(
        """SELECT r.start_ns, r.end_ns, n.name FROM ranges r
           JOIN names n ON n.trace_id = r.trace_id AND n.name_id = r.name_id
           WHERE r.trace_id = ? AND r.kind IN ('annotation', 'nvtx')
             AND NOT regexp_matches(n.name, '^ProfilerStep#') AND NOT regexp_matches(n.name, ?)
             AND r.end_ns > ? AND r.start_ns < ?
           ORDER BY r.end_ns - r.start_ns""",
        [trace_id, ITERATION_NAME_REGEX, lo, hi],
    )


def _queued_gaps(gpu: dict, busy: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """GPU gaps whose next operation's launch call had returned when the gap began.

    The host had already handed the work over (a graph's nodes, a queue that ran
    ahead): the gap is the device's, not the host's."""
    gap_s, gap_e = busy[1][:-1], busy[0][1:]
    if gap_s.size == 0:
        return gap_s, gap_e
    launch_end = np.where(np.isnan(gpu["launch_end"].astype(float)), np.inf, gpu["launch_end"])
    order = np.argsort(gpu["start_ns"], kind="stable")
    starts, first = np.unique(gpu["start_ns"][order], return_index=True)
    handed_over = np.minimum.reduceat(launch_end[order], first)  # earliest per start time
    at = np.clip(np.searchsorted(starts, gap_e), 0, starts.size - 1)
    queued = (starts[at] == gap_e) & (handed_over[at] <= gap_s)
    return gap_s[queued], gap_e[queued]


def _charge_user_ranges(periods: DecodePeriods, segs: dict, user: dict) -> None:
    """Charge each idle segment of host work (:data:`HOST_WORK`) to the innermost user range
    covering it (``by_range``).

    Ranges come shortest first; each claims the still unclaimed segments that start
    inside it (a binary search over the segment starts), so the work is the number
    of ranges times log(segments) plus the segments times the nesting depth.
    """
    host = np.isin(segs["final"], [IDLE_CAUSES.index(c) for c in HOST_WORK])
    keep = np.flatnonzero(~segs["flags"]["busy"] & host)
    starts, lengths = segs["start"][keep], segs["len"][keep]
    period = np.searchsorted(periods.start, starts, side="right") - 1
    owner = np.full(starts.size, -1, dtype=np.int64)
    lo = np.searchsorted(starts, user["start_ns"], side="left")
    hi = np.searchsorted(starts, user["end_ns"], side="left")
    for index in np.flatnonzero(hi > lo):  # shortest first: the innermost range claims
        claimed = owner[lo[index] : hi[index]]
        claimed[claimed < 0] = index
    names = np.array([str(x) for x in user["name"]] + [""], dtype=object)
    for name in dict.fromkeys(names[owner[owner >= 0]]):
        mask = names[owner] == name
        out = np.zeros(periods.start.size, dtype=np.int64)
        np.add.at(out, period[mask], lengths[mask])
        periods.by_range[str(name)] = out


def _crosses_step(job: JobData, trace_id: str, its: Iterations, decode: np.ndarray) -> np.ndarray:
    """Whether the host ranges of a period's two decode iterations lie in different profiler steps."""
    steps = job.numpy(
        "SELECT start_ns FROM ranges WHERE trace_id = ? AND kind = 'step' ORDER BY start_ns",
        [trace_id],
    )["start_ns"]
    if steps.size == 0:
        return np.zeros(decode.size - 1, dtype=bool)
    which = np.searchsorted(steps, its.host_start[decode], side="right")
    return which[1:] != which[:-1]


def _prefills_in(its: Iterations, starts: np.ndarray, ends: np.ndarray) -> list[list[int]]:
    others = np.flatnonzero(np.isin(np.asarray(its.phases), ("prefill", "mixed")))
    return [
        [int(i) for i in others if its.gpu_end[i] > s and its.gpu_start[i] < e]
        for s, e in zip(starts, ends, strict=True)
    ]


def _sync_calls(job: JobData, trace_id: str, pids: list[int], starts, ends) -> np.ndarray:
    """Per period, the host's synchronizing calls that start in it: sync APIs
    (``cudaStreamSynchronize``…) and ``aten::item`` reads, whichever is more."""
    rows = job.con.execute(
        f"""SELECT h.start_ns, h.kind IN ('runtime', 'driver') AS api FROM host h
           JOIN names n USING (trace_id, name_id)
           WHERE h.trace_id = $t AND h.pid IN (SELECT unnest($pids))
             AND ((h.kind IN ('runtime', 'driver') AND regexp_matches({API_SQL}, '{SYNC_API_REGEX}'))
               OR (h.kind = 'cpu_op' AND n.name = 'aten::item'))""",
        {"t": trace_id, "pids": pids},
    ).fetchnumpy()
    counts = []
    for api in (True, False):
        calls = np.sort(rows["start_ns"][np.asarray(rows["api"], dtype=bool) == api])
        out = np.zeros(starts.size, dtype=np.int64)
        period = np.searchsorted(starts, calls, side="right") - 1
        ok = (period >= 0) & (calls < ends[np.clip(period, 0, None)])
        np.add.at(out, period[ok], 1)
        counts.append(out)
    return np.maximum(*counts)
