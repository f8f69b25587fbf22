"""What-if replay of a multi-rank job on its own dependency graph, and its critical path.

Pure functions over pandas tables; every time is an int64 ns on one common
clock (the ranks' clocks after skew correction).

**Ops** (:data:`OP_COLUMNS`): one row per GPU operation (kernel, memcpy,
memset) of every participant (``part``: a rank's device). ``launch_ns`` is the
start of the host call that launched it (−1 unknown); ``inst`` the matched
collective instance of a communication kernel (−1 otherwise); ``transfer_ns``
its transfer time after the last rank arrived.

**Syncs** (:data:`SYNC_COLUMNS`): host calls that block until the GPU is done
(``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, a blocking copy).

**The graph** (:func:`dependencies`), read from the observed times. An op
starts no earlier than

* the end of the previous op on its stream (``stream``);
* its host launch (``launch``), the host being shifted by how much earlier the
  syncs before it returned;
* when it started later than both, the op of its participant (other stream)
  that ended last before it started (``dep``: an event wait such as DDP's
  gradient-ready or all-reduce-done);

and a collective ends no earlier than its last rank's arrival (``join``) +
its own transfer time. The *binding* constraint is the latest of these; its
observed gap (e.g. a launch latency) is kept, the others are lower bounds.

**Replay** (:func:`replay`): the same graph re-timed after compressing given
intervals of a participant's timeline (:class:`Compression`: host and GPU
times inside ``[start, end)`` are mapped linearly onto ``new_len_ns``, times
after it move earlier by the difference). A sync returns when the op it
waited for is done in the replay (or, if that op had ended before the call,
after the call's own duration). Replaying with no compression reproduces the
observed times exactly.

**Step time** (:func:`step_times`): a step ends when the last of its ops on
any rank ends; its time runs from the previous step's end (the first step:
from its earliest op). Summed over steps, that is the captured steps'
makespan, which a rank's host starting its next step early cannot shorten.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import pandas as pd

OP_COLUMNS = (
    "part", "rank", "stream", "start_ns", "end_ns", "launch_ns", "inst", "transfer_ns",
    "step", "is_comm", "name",
)  # fmt: skip
SYNC_COLUMNS = ("part", "start_ns", "end_ns")
GAP_TOLERANCE_NS = 2_000  # an op starting this close after its known constraints is bound by them
NONE, STREAM, LAUNCH, DEP, JOIN = "start", "stream", "launch", "dep", "join"
BINDINGS = (NONE, STREAM, LAUNCH, DEP)  # dependencies()' binding categories, in code order
_NONE, _STREAM, _LAUNCH, _DEP = range(len(BINDINGS))


@dataclass(frozen=True)
class Compression:
    """Replay ``[start_ns, end_ns)`` of participant ``part``'s timeline in ``new_len_ns``."""

    part: int
    start_ns: int
    end_ns: int
    new_len_ns: int


def dependencies(ops: pd.DataFrame) -> pd.DataFrame:
    """``ops`` sorted by (part, start), with each op's binding constraint.

    Adds ``prev`` (row index of the previous op on its stream, −1), ``dep``
    (the participant's op that ended last at or before this one's start, −1),
    ``binding`` (``stream``/``launch``/``dep``/``start``) and ``gap_ns``
    (start − the binding constraint's time). Vectorized; no per-op Python.
    """
    ops = ops.sort_values(["part", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    n = len(ops)
    start = ops["start_ns"].to_numpy(np.int64)
    end = ops["end_ns"].to_numpy(np.int64)
    part = ops["part"].to_numpy(np.int64)
    key = part * (1 << 32) + ops["stream"].to_numpy(np.int64)
    order = np.lexsort((start, key))
    prev = np.full(n, -1, dtype=np.int64)
    same = np.r_[False, key[order][1:] == key[order][:-1]]
    prev[order[same]] = order[np.flatnonzero(same) - 1]
    lo = np.iinfo(np.int64).min // 4
    p_val = np.where(prev >= 0, end[np.maximum(prev, 0)], lo)
    launch = ops["launch_ns"].to_numpy(np.int64)
    l_val = np.where(launch >= 0, launch, lo)
    dep = _latest_end_before(part, start, end)
    d_val = np.where(dep >= 0, end[np.maximum(dep, 0)], lo)
    known = np.maximum(p_val, l_val)
    use_dep = (start - known > GAP_TOLERANCE_NS) & (d_val > known) & (dep != prev)
    code = np.where(
        use_dep, _DEP, np.where(p_val >= l_val, np.where(prev >= 0, _STREAM, _NONE), _LAUNCH)
    )
    code = np.where((prev < 0) & (launch < 0) & ~use_dep, _NONE, code)
    bound = np.where(use_dep, d_val, known)
    ops["prev"] = prev
    ops["dep"] = np.where(use_dep, dep, -1)
    ops["binding"] = pd.Categorical.from_codes(code, categories=BINDINGS)
    ops["gap_ns"] = np.where(code == _NONE, 0, start - bound)
    return ops


def binding_codes(g: pd.DataFrame) -> np.ndarray:
    """``g``'s ``binding`` column as int codes: the index of each in :data:`BINDINGS`."""
    b = g["binding"]
    if isinstance(b.dtype, pd.CategoricalDtype) and list(b.cat.categories) == list(BINDINGS):
        return b.cat.codes.to_numpy(np.int64)
    values = b.to_numpy()
    return np.select([values == k for k in BINDINGS], np.arange(len(BINDINGS)), 0)


def _latest_end_before(part: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per op: index of the same participant's op with the latest end <= its start (−1).

    One sort of all ops by (participant, end) and one ``searchsorted`` on a key that
    lays the participants end to end: no per-participant loop.
    """
    if part.size == 0:
        return np.full(0, -1, dtype=np.int64)
    by_end = np.lexsort((np.arange(part.size), end, part))  # stable within (part, end)
    key_end, key_start = _part_axis(part, end, start)
    pos = np.searchsorted(key_end[by_end], key_start, side="right") - 1
    cand = by_end[np.maximum(pos, 0)]
    return np.where((pos >= 0) & (part[cand] == part), cand, -1)


def _part_axis(part: np.ndarray, *times: np.ndarray) -> list[np.ndarray]:
    """``times`` moved onto one increasing axis where each participant has its own block
    (``part`` × span + offset), so one sorted search serves every participant."""
    lo = min(int(t.min()) for t in times)
    width = max(int(t.max()) for t in times) - lo + 1
    base = part.astype(np.int64) * width
    return [base + (t.astype(np.int64) - lo) for t in times]


def compress_times(times: np.ndarray, parts: np.ndarray, cuts: list[Compression]) -> np.ndarray:
    """Map each time of ``parts`` through that participant's compressions (vectorized; only
    the rows of participants with cuts are touched)."""
    times = np.asarray(times, dtype=np.int64)
    out = times.copy()
    by_part: dict[int, list[Compression]] = {}
    for c in sorted(cuts, key=lambda c: (c.part, c.start_ns)):
        if c.end_ns - c.start_ns > 0:
            by_part.setdefault(c.part, []).append(c)
    for p, mine in by_part.items():
        rows = np.flatnonzero((parts == p) & (times >= 0))
        t = times[rows]
        out[rows] = t - _compression_shift(t, mine)
    return out


def _compression_shift(t: np.ndarray, cuts: list[Compression]) -> np.ndarray:
    """How much earlier each time of ``t`` (ns, one participant) moves through ``cuts``
    (sorted by start, each of positive length).

    A cut ``[start, end)`` made ``new_len`` long moves a time at or after its
    end by ``end - start - new_len`` and a time inside it by its share of that,
    rounded to the ns; the shifts of the cuts add up. Cuts that do not overlap
    (as :func:`stallscope.lateness.explain` makes them) take one sorted search
    per time, not one pass over the times per cut; overlapping ones are summed
    cut by cut.
    """
    starts = np.array([c.start_ns for c in cuts], dtype=np.int64)
    ends = np.array([c.end_ns for c in cuts], dtype=np.int64)
    new = np.array([c.new_len_ns for c in cuts], dtype=np.int64)
    if np.any(starts[1:] < ends[:-1]):
        return _compression_shift_each(t, starts, ends, new)
    shift = np.r_[0, np.cumsum(ends - starts - new)][np.searchsorted(ends, t, side="right")]
    k = np.searchsorted(starts, t, side="left") - 1  # the last cut starting before t
    inside = (k >= 0) & (t < ends[np.maximum(k, 0)])
    ti, ki = t[inside], k[inside]
    frac = (ti - starts[ki]) / (ends[ki] - starts[ki])
    shift[inside] += (ti - starts[ki]) - np.round(frac * new[ki]).astype(np.int64)
    return shift


def _compression_shift_each(
    t: np.ndarray, starts: np.ndarray, ends: np.ndarray, new: np.ndarray
) -> np.ndarray:
    """:func:`_compression_shift` one cut at a time (any cuts, overlapping ones too)."""
    shift = np.zeros(t.size, dtype=np.int64)
    for start, end, new_len in zip(starts.tolist(), ends.tolist(), new.tolist(), strict=True):
        length = end - start
        inside = (t > start) & (t < end)
        shift[t >= end] += length - new_len
        frac = (t[inside] - start) / length
        shift[inside] += (t[inside] - start) - np.round(frac * new_len).astype(np.int64)
    return shift


def replay(
    ops: pd.DataFrame,
    syncs: pd.DataFrame,
    cuts: list[Compression] | None = None,
    method: str = "auto",
) -> pd.DataFrame:
    """Re-time ``dependencies(ops)`` after ``cuts``; adds ``new_start_ns`` and ``new_end_ns``.

    The replay's order is a sweep in observed-time order (syncs returning
    before ops starting at the same time, collective arrivals before other
    ops). ``method``: ``"sweep"`` steps once per op and sync in that order
    (:func:`_sweep`); ``"waves"`` (:func:`_waves`) advances every participant
    by one of its own events per numpy step, a collective's end becoming
    readable once all its ranks arrived: one Python step per event of the
    busiest participant instead of one per event of the job, with the same
    times to the nanosecond (it declines, and the sweep runs, on a graph where
    the sweep would read a value before its last write, e.g. an op that starts
    before a collective it follows has ended on a badly skewed clock).
    ``"auto"``: waves when the job has many participants.
    """
    g = ops if "binding" in ops else dependencies(ops)
    new_start, new_end = replay_times(g, syncs, cuts, method)
    out = g.copy()
    out["new_start_ns"] = new_start
    out["new_end_ns"] = new_end
    return out


def replay_times(
    g: pd.DataFrame,
    syncs: pd.DataFrame,
    cuts: list[Compression] | None = None,
    method: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`replay`'s new (start, end) per row of ``g`` (a :func:`dependencies` table), as
    int64 arrays, without copying ``g``."""
    cuts = cuts or []
    n = len(g)
    part = g["part"].to_numpy(np.int64)
    start = g["start_ns"].to_numpy(np.int64)
    end = g["end_ns"].to_numpy(np.int64)
    c_start = compress_times(start, part, cuts)
    c_end = compress_times(end, part, cuts)
    launch = g["launch_ns"].to_numpy(np.int64)
    c_launch = compress_times(launch, part, cuts)
    inst = g["inst"].to_numpy(np.int64)
    transfer = g["transfer_ns"].to_numpy(np.int64)
    prev, dep = g["prev"].to_numpy(np.int64), g["dep"].to_numpy(np.int64)
    binding, gap = binding_codes(g), g["gap_ns"].to_numpy(np.int64)
    comm = inst >= 0
    sync_part = syncs["part"].to_numpy(np.int64)
    s_a, s_b = syncs["start_ns"].to_numpy(np.int64), syncs["end_ns"].to_numpy(np.int64)
    c_sa, c_sb = compress_times(s_a, sync_part, cuts), compress_times(s_b, sync_part, cuts)
    awaited = _awaited_ops(part, end, sync_part, s_a, s_b)
    times = np.r_[s_b, start]
    kinds = np.r_[np.zeros(s_b.size, dtype=np.int64), np.where(comm, 1, 2)]
    index = np.r_[np.arange(s_b.size), np.arange(n)]
    order = np.lexsort((index, kinds, times))
    found = None
    if method == "waves" or (method == "auto" and _waves_pay(part, sync_part)):
        found = _waves(
            order,
            _Graph(part, start, end, c_start, c_end, launch, c_launch, inst, transfer,
                   prev, dep, binding, gap),
            (sync_part, s_a, s_b, c_sa, c_sb, awaited),
        )  # fmt: skip
    if found is not None:
        return found
    members: dict[int, list[int]] = {}
    for i, k in zip(np.flatnonzero(comm).tolist(), inst[comm].tolist(), strict=True):
        members.setdefault(k, []).append(i)
    return _sweep(
        kinds[order].tolist(),
        index[order].tolist(),
        ops=_OpLists(
            part,
            start,
            end,
            c_start,
            c_end,
            launch,
            c_launch,
            inst,
            transfer,
            prev,
            dep,
            binding,
            gap,
            members,
        ),  # fmt: skip
        syncs=(
            sync_part.tolist(),
            s_a.tolist(),
            s_b.tolist(),
            c_sa.tolist(),
            c_sb.tolist(),
            awaited.tolist(),
        ),  # fmt: skip
    )


WAVES_MIN_PARTS = 32  # below this many participants the per-op sweep is as fast


def _waves_pay(part: np.ndarray, sync_part: np.ndarray) -> bool:
    """Whether :func:`_waves` beats the sweep: its Python steps follow the busiest participant's
    events, the sweep's every event; each wave costs some tens of numpy calls."""
    if part.size == 0:
        return False
    counts = np.bincount(np.r_[part, sync_part])
    return int((counts > 0).sum()) >= WAVES_MIN_PARTS and counts.sum() > 24 * counts.max()


@dataclass
class _Graph:
    """The replay's per-op columns (numpy), for :func:`_waves`."""

    part: np.ndarray
    start: np.ndarray
    end: np.ndarray
    c_start: np.ndarray
    c_end: np.ndarray
    launch: np.ndarray
    c_launch: np.ndarray
    inst: np.ndarray
    transfer: np.ndarray
    prev: np.ndarray
    dep: np.ndarray
    binding: np.ndarray
    gap: np.ndarray


def _waves(order: np.ndarray, g: _Graph, syncs: tuple) -> tuple[np.ndarray, np.ndarray] | None:
    """The sweep's result computed participant-parallel (see :func:`replay`), or None when the
    graph has a read the sweep makes before that value's last write (the sweep then runs).

    Events: syncs ``0..S-1``, ops ``S..S+n-1``; ``order`` the sweep's order of them. Each
    participant's events keep their sweep order. A wave takes every participant's next event
    whose inputs are final (a collective's end once its last rank arrived) and computes them
    all at once; the values each event reads are the ones the sweep reads at its turn, so the
    times are the sweep's exactly.
    """
    sync_part, s_a, s_b, c_sa, c_sb, awaited = syncs
    n_sync, n = s_b.size, g.part.size
    pos = np.empty(n_sync + n, dtype=np.int64)
    pos[order] = np.arange(order.size)
    op_pos = pos[n_sync:]
    comm = g.inst >= 0
    n_inst = int(g.inst.max()) + 1 if comm.any() else 0
    done_at = np.full(n_inst, -1, dtype=np.int64)  # sweep position where each instance ends
    np.maximum.at(done_at, g.inst[comm], op_pos[comm])
    final_at = np.where(comm, done_at[np.maximum(g.inst, 0)], op_pos)  # of each op's end

    def reads(reader_pos: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Instance a read of ``src``'s end waits for (−1: none); False where the sweep reads
        it before its last write."""
        ok = (src < 0) | (final_at[np.maximum(src, 0)] < reader_pos)
        need = np.where((src >= 0) & comm[np.maximum(src, 0)], g.inst[np.maximum(src, 0)], -1)
        return need, ok

    need_prev, ok_prev = reads(op_pos, g.prev)
    need_dep, ok_dep = reads(op_pos, g.dep)
    need_wait, ok_wait = reads(pos[:n_sync], awaited)
    if not (ok_prev.all() and ok_dep.all() and ok_wait.all()):
        return None
    need_a = np.r_[need_wait, need_prev, -1]
    need_b = np.r_[np.full(n_sync, -1, dtype=np.int64), need_dep, -1]
    launch_sync, sync_before = _host_syncs(g, syncs)
    # per participant, its events in sweep order (CSR)
    ev_part = np.r_[sync_part, g.part]
    seq = np.lexsort((pos, ev_part))
    parts, first, count = np.unique(ev_part[seq], return_index=True, return_counts=True)
    ptr, stop = first.astype(np.int64), (first + count).astype(np.int64)
    members = n_sync + np.flatnonzero(comm)[np.argsort(g.inst[comm], kind="stable")]
    m_cut = np.r_[0, np.cumsum(np.bincount(g.inst[comm], minlength=n_inst))]
    left = np.diff(m_cut).astype(np.int64)  # arrivals still to come per instance
    done = np.zeros(n_inst + 1, dtype=bool)
    done[-1] = True  # index −1: no instance needed
    # Per event (syncs, then ops, then one sentinel at −1), the constants of an op's rule
    # t = max(end[prev] + stream gap, launch + host offset + launch gap, end[dep] + gap), its
    # start where no constraint applies; a missing constraint reads the sentinel (−2^62).
    floor = -(1 << 62)
    binding = g.binding  # codes (BINDINGS)
    no_sync, zero = np.full(n_sync, -1, dtype=np.int64), np.zeros(n_sync + 1, dtype=np.int64)

    def events(values: np.ndarray, pad: int) -> np.ndarray:
        return np.r_[np.full(n_sync, pad, dtype=np.int64), values, pad]

    prev_e = np.r_[no_sync, np.where(g.prev >= 0, g.prev + n_sync, -1), -1]
    dep_e = np.r_[no_sync, np.where(g.dep >= 0, g.dep + n_sync, -1), -1]
    stream_gap = events(np.where(binding == _STREAM, g.gap, 0), 0)
    dep_gap = events(g.gap, 0)
    launch_at = events(
        np.where(g.launch >= 0, g.c_launch + np.where(binding == _LAUNCH, g.gap, 0), floor), floor
    )
    launch_sync = np.r_[no_sync, launch_sync, -1]
    c_start, dur = events(g.c_start, 0), events(g.c_end - g.c_start, 0)
    inst_e, comm_e = events(g.inst, -1), np.r_[np.zeros(n_sync, bool), comm, False]
    transfer = events(g.transfer, 0)
    waited = np.where(awaited >= 0, awaited + n_sync, -1)
    waited_shift = s_b - g.end[np.maximum(awaited, 0)] if n_sync else zero[:0]
    new_start = np.zeros(n_sync + n + 1, dtype=np.int64)
    new_end = np.zeros(n_sync + n + 1, dtype=np.int64)
    new_end[-1] = floor
    sync_off = zero  # index −1: no sync before, offset 0
    live = np.arange(parts.size)
    while live.size:
        ev = seq[ptr[live]]
        ready = done[need_a[ev]] & done[need_b[ev]]
        go = live[ready]
        if not go.size:
            return None  # cannot happen when every read follows its write in the sweep
        if go.size < live.size:
            ev = ev[ready]
        if n_sync and ev.min() < n_sync:  # syncs return: their host offsets
            sy = ev[ev < n_sync]
            a_new = c_sa[sy] + sync_off[sync_before[sy]]
            b_new = np.where(
                waited[sy] >= 0,
                np.maximum(a_new, new_end[waited[sy]] + waited_shift[sy]),
                a_new + c_sb[sy] - c_sa[sy],
            )
            sync_off[sy] = b_new - c_sb[sy]
        # every event as an op (a sync's row is never read)
        t = np.maximum(new_end[prev_e[ev]] + stream_gap[ev], new_end[dep_e[ev]] + dep_gap[ev])
        t = np.maximum(t, launch_at[ev] + sync_off[launch_sync[ev]])
        t = np.where(t < floor // 2, c_start[ev], t)
        new_start[ev] = t
        new_end[ev] = t + dur[ev]
        arrived = inst_e[ev[comm_e[ev]]]
        if arrived.size:
            np.subtract.at(left, arrived, 1)
            ended = np.unique(arrived[left[arrived] == 0])
            for k in ended.tolist():  # one Python step per collective instance
                rows = members[m_cut[k] : m_cut[k + 1]]
                last = new_start[rows].max()
                new_end[rows] = np.maximum(new_start[rows], last) + transfer[rows]
            done[ended] = True
        ptr[go] += 1
        live = live[ptr[live] < stop[live]]
    return new_start[n_sync:-1], new_end[n_sync:-1]


def _host_syncs(g: _Graph, syncs: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The sync whose host offset the sweep applies (−1: none), per op's launch and per sync's
    call: the participant's latest sync (sweep order) that returned by then, among those
    already swept (an op's: returned by its start; a sync's: before it in the order)."""
    sync_part, s_a, s_b = syncs[0], syncs[1], syncs[2]
    n_sync = s_b.size
    none_op = np.full(g.part.size, -1, dtype=np.int64)
    if n_sync == 0:
        return none_op, np.zeros(0, dtype=np.int64)
    by = np.lexsort((np.arange(n_sync), s_b, sync_part))  # per part by return, then index
    has_launch = g.launch >= 0
    at = np.where(has_launch, np.minimum(g.launch, g.start), g.start)
    lo = min(int(s_b.min()), int(s_a.min()), int(at.min()) if at.size else 0)
    hi = max(int(s_b.max()), int(s_a.max()), int(at.max()) if at.size else 0)
    width = hi - lo + 1  # times laid out per participant on one axis, as in _part_axis
    sorted_keys = sync_part[by] * width + (s_b[by] - lo)
    # an op: the last sync with s_b <= min(launch, start) of its part
    k = np.searchsorted(sorted_keys, g.part * width + (at - lo), side="right") - 1
    cand = by[np.maximum(k, 0)]
    ok = (k >= 0) & (sync_part[cand] == g.part) & has_launch
    launch_sync = np.where(ok, cand, -1)
    # a sync: the last sync before it in the order with s_b' <= its s_a
    rank_in = np.empty(n_sync, dtype=np.int64)
    rank_in[by] = np.arange(n_sync)
    c = np.searchsorted(sorted_keys, sync_part * width + (s_a - lo), side="right")
    k2 = np.minimum(c, rank_in) - 1
    cand2 = by[np.maximum(k2, 0)]
    ok2 = (k2 >= 0) & (sync_part[cand2] == sync_part)
    return launch_sync, np.where(ok2, cand2, -1)


class _OpLists:
    """The replay's per-op columns as Python lists (a list index costs a fraction of a numpy
    element's: the sweep takes one Python step per op)."""

    def __init__(self, part, start, end, c_start, c_end, launch, c_launch, inst, transfer,
                 prev, dep, binding, gap, members):  # fmt: skip
        self.part, self.end = part.tolist(), end.tolist()
        self.dur = (c_end - c_start).tolist()
        self.c_start, self.launch, self.c_launch = (
            c_start.tolist(),
            launch.tolist(),
            c_launch.tolist(),
        )
        self.inst, self.transfer = inst.tolist(), transfer.tolist()
        self.prev, self.dep = prev.tolist(), dep.tolist()
        binding = np.asarray(binding)  # codes (BINDINGS)
        self.stream_gap = np.where(binding == _STREAM, gap, 0).tolist()
        self.launch_gap = np.where(binding == _LAUNCH, gap, 0).tolist()
        self.gap = np.asarray(gap).tolist()
        self.members = members
        self.n = len(self.part)


def _sweep(kinds: list[int], index: list[int], ops: _OpLists, syncs: tuple) -> tuple:
    """The replay's sweep (see :func:`replay`): new (start, end) of every op, int64 arrays."""
    sync_part, s_a, s_b, c_sa, c_sb, awaited = syncs
    sync_ends: dict[int, list[int]] = {}  # per participant: observed sync returns, sorted
    sync_offsets: dict[int, list[int]] = {}  # and the host offset after each

    def host(p: int, t: int, ct: int) -> int:
        ends = sync_ends.get(p)
        if not ends:
            return ct
        k = bisect.bisect_right(ends, t) - 1
        return ct if k < 0 else ct + sync_offsets[p][k]

    new_start, new_end = [0] * ops.n, [0] * ops.n
    members, arrived = ops.members, dict.fromkeys(ops.members, 0)
    prev, dep, part, launch, c_launch = ops.prev, ops.dep, ops.part, ops.launch, ops.c_launch
    gap, stream_gap, launch_gap = ops.gap, ops.stream_gap, ops.launch_gap
    c_start, dur = ops.c_start, ops.dur  # locals: an attribute lookup per use costs more
    floor = -(1 << 62)
    for kind, i in zip(kinds, index, strict=True):
        if kind == 0:  # a sync returns
            p = sync_part[i]
            a_new = host(p, s_a[i], c_sa[i])
            w = awaited[i]
            b_new = (
                max(a_new, new_end[w] + s_b[i] - ops.end[w])
                if w >= 0
                else a_new + c_sb[i] - c_sa[i]
            )
            sync_ends.setdefault(p, []).append(s_b[i])
            sync_offsets.setdefault(p, []).append(b_new - c_sb[i])
            continue
        t = floor
        if prev[i] >= 0:
            t = max(t, new_end[prev[i]] + stream_gap[i])
        if launch[i] >= 0:  # host(part, launch, c_launch), inlined: one step per op
            p = part[i]
            ends = sync_ends.get(p)
            k = bisect.bisect_right(ends, launch[i]) - 1 if ends else -1
            shift = sync_offsets[p][k] if k >= 0 else 0
            t = max(t, c_launch[i] + shift + launch_gap[i])
        if dep[i] >= 0:
            t = max(t, new_end[dep[i]] + gap[i])
        if t == floor:  # nothing recorded before it: where the cuts put it
            t = c_start[i]
        new_start[i] = t
        new_end[i] = t + dur[i]
        if kind == 1:  # a communication kernel
            k = ops.inst[i]
            arrived[k] += 1
            if arrived[k] == len(members[k]):  # last arrival: every rank's end is known
                last = max(new_start[j] for j in members[k])
                for j in members[k]:
                    new_end[j] = max(new_start[j], last) + ops.transfer[j]
    return np.array(new_start, dtype=np.int64), np.array(new_end, dtype=np.int64)


def _awaited_ops(part, end, sync_part, s_a, s_b) -> np.ndarray:
    """Per sync: the participant's op that ended last while the call was blocked (−1: none)."""
    out = np.full(s_a.size, -1, dtype=np.int64)
    if s_a.size == 0 or part.size == 0:
        return out
    by_end = np.lexsort((np.arange(part.size), end, part))
    sp = sync_part.astype(np.int64)
    (keys,) = _part_axis(np.r_[part, sp], np.r_[end, s_b])
    key_end, key_sync = keys[: part.size], keys[part.size :]
    pos = np.searchsorted(key_end[by_end], key_sync, side="right") - 1
    cand = np.where(pos >= 0, by_end[np.maximum(pos, 0)], -1)
    ok = (cand >= 0) & (part[np.maximum(cand, 0)] == sp) & (end[np.maximum(cand, 0)] > s_a)
    return np.where(ok, cand, -1)


def step_times(ops: pd.DataFrame, start: str = "start_ns", end: str = "end_ns") -> pd.Series:
    """Job step time per step (ns), from the steps' ends (see the module docstring).

    A step ends when its last op on any rank ends (``E_k``); its time is
    ``E_k − E_{k−1}``, the first step's ``E_0 −`` the earliest start of its ops.
    The sum over steps is the captured steps' makespan.
    """
    mine = ops[ops["step"] >= 0]
    if mine.empty:
        return pd.Series(dtype=np.int64)
    ends = mine.groupby("step")[end].max().sort_index()
    first = int(mine.loc[mine["step"] == ends.index[0], start].min())
    prev = np.r_[first, ends.to_numpy()[:-1]]
    return pd.Series(ends.to_numpy() - prev, index=ends.index).astype(np.int64)


def saving(ops: pd.DataFrame, syncs: pd.DataFrame, cuts: list[Compression]) -> dict:
    """Step times before and after ``cuts``: ``{before_ns, after_ns, saving_ns, steps}``.

    ``ops``: the ops, or their :func:`dependencies` table (reused as it is).

    ``saving_ns`` = Σ steps (before − after), never negative; ``steps`` lists
    ``{step, before_ns, after_ns}``.
    """
    g = ops if "binding" in ops else dependencies(ops)
    new_start, new_end = replay_times(g, syncs, cuts)
    before = step_times(g)  # replaying without cuts reproduces the observed times
    after = step_times(
        pd.DataFrame({"step": g["step"].to_numpy(), "start_ns": new_start, "end_ns": new_end})
    )
    steps = [
        {"step": int(s), "before_ns": int(before[s]), "after_ns": int(after.get(s, before[s]))}
        for s in before.index
    ]
    total_before = sum(s["before_ns"] for s in steps)
    total_after = sum(s["after_ns"] for s in steps)
    return {
        "before_ns": total_before,
        "after_ns": total_after,
        "saving_ns": max(0, total_before - total_after),
        "steps": steps,
    }


def critical_path(
    g: pd.DataFrame,
    step: int,
    label_gap=None,
    capture_start: dict[int, int] | None = None,
    index=None,
) -> pd.DataFrame:
    """The chain of segments that set step ``step``'s end, earliest first.

    ``g`` is :func:`dependencies`' table (observed times). The walk starts at
    the op of the step that ends last and follows binding constraints back;
    at a collective whose rank waited, it jumps to the rank that arrived last.
    Columns: ``rank, part, what, start_ns, end_ns, duration_ns``; ``what`` is
    ``kernel``/``collective <op>``/``idle: <cause>``/``gap``. Consecutive
    kernels of one rank are merged (``kernels (N): <longest>``).
    ``label_gap(part, start, end)`` names a GPU-idle gap (default ``idle``);
    the part of a gap before ``capture_start[part]`` is ``before capture``;
    ``index`` is :func:`path_index` of ``g`` (computed when not given).
    """
    cols = ["rank", "part", "what", "start_ns", "end_ns", "duration_ns"]
    ix = index if index is not None else path_index(g)
    mine = np.flatnonzero(ix.step == step)
    if not mine.size:
        return pd.DataFrame(columns=cols)
    start, end, inst, part = ix.start, ix.end, ix.inst, ix.part
    floor = int(start[mine].min())
    is_comm, names, bindings = ix.is_comm, ix.names, ix.bindings
    prevs, deps = ix.prevs, ix.deps
    comm_rows = ix.comm_rows
    segs: list[tuple[int, str, int, int, str]] = []  # part, kind, start, end, name
    i = int(mine[np.argmax(end[mine])])
    seen = 0
    while i >= 0 and seen < 100_000:
        seen += 1
        s, e = int(start[i]), int(end[i])
        if inst[i] >= 0:
            rows = comm_rows[int(inst[i])]
            last = max(rows, key=lambda j: (start[j], -part[j]))
            if start[last] > s:  # this rank waited: the path runs through the last arrival
                segs.append((int(part[i]), "collective", int(start[last]), e, str(names[i])))
                i = last
                s = e = int(start[last])
                if s <= floor:
                    break
            else:
                segs.append((int(part[i]), "collective", s, e, str(names[i])))
        else:
            segs.append(
                (
                    int(part[i]),
                    "kernel" if not is_comm[i] else "collective",
                    s,
                    e,
                    str(names[i]),
                )
            )
        b = bindings[i]
        nxt = int(prevs[i]) if b == _STREAM else int(deps[i]) if b == _DEP else -1
        if b == _LAUNCH or (b == _NONE and s > floor):
            nxt = ix.last_ended_by(int(part[i]), s)
            lo = max(int(end[nxt]), floor) if nxt >= 0 else floor
            cs = (capture_start or {}).get(int(part[i]), lo)
            if s > lo:
                if lo < cs:  # the part of the gap before this rank's capture began
                    segs.append(
                        (
                            int(part[i]),
                            "idle",
                            max(cs, lo),
                            s,
                            _label(label_gap, part[i], max(cs, lo), s),
                        )
                    )
                    segs.append((int(part[i]), "idle", lo, min(cs, s), "before capture"))
                else:
                    segs.append((int(part[i]), "idle", lo, s, _label(label_gap, part[i], lo, s)))
        elif nxt >= 0 and s > end[nxt]:
            segs.append((int(part[i]), "gap", int(end[nxt]), s, "gap"))
        if nxt < 0 or end[nxt] <= floor:
            break
        i = nxt
    return _merge(segs[::-1], ix.rank_of, floor, cols)


class PathIndex:
    """:func:`critical_path`'s view of a :func:`dependencies` table, built once for many
    steps: its columns as arrays, the rows of each collective instance, per part its op
    indices sorted by end and those ends, each part's rank. ``names[i]``: op ``i``'s name (a categorical
    ``name`` column is read through its codes: no string per op)."""

    def __init__(self, g: pd.DataFrame):
        self.start = g["start_ns"].to_numpy(np.int64)
        self.end = g["end_ns"].to_numpy(np.int64)
        self.inst = g["inst"].to_numpy(np.int64)
        self.part = g["part"].to_numpy(np.int64)
        self.step = g["step"].to_numpy(np.int64)
        self.is_comm = g["is_comm"].to_numpy(bool)
        self.prevs = g["prev"].to_numpy(np.int64)
        self.deps = g["dep"].to_numpy(np.int64)
        self.bindings = binding_codes(g)
        self.names = _Names(g["name"])
        self.rank_of = g.groupby("part")["rank"].first().to_dict()
        inst, part, end = self.inst, self.part, self.end
        self.comm_rows: dict[int, list[int]] = {}
        comm = inst >= 0
        for i, k in zip(np.flatnonzero(comm).tolist(), inst[comm].tolist(), strict=True):
            self.comm_rows.setdefault(k, []).append(i)
        by_end = np.lexsort((np.arange(part.size), end, part))  # per part by end, stable
        cuts = np.flatnonzero(np.r_[True, part[by_end][1:] != part[by_end][:-1], True])
        self.ends_of = {
            int(part[by_end[lo]]): by_end[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)
        } if part.size else {}  # fmt: skip
        # their ends, sorted once: gathering them per query cost the part's ops per path step
        self.sorted_ends_of = {p: end[rows] for p, rows in self.ends_of.items()}

    def last_ended_by(self, part: int, t: int) -> int:
        """The op of ``part`` that ended last at or before ``t`` (ns; ties: the highest row),
        −1 if none. One sorted search of the part's ends."""
        ends = self.sorted_ends_of.get(part)
        if ends is None:
            return -1
        k = int(np.searchsorted(ends, t, side="right")) - 1
        return int(self.ends_of[part][k]) if k >= 0 else -1


class _Names:
    """Op names by row: a categorical column through its codes, else its values."""

    def __init__(self, column: pd.Series):
        if isinstance(column.dtype, pd.CategoricalDtype):
            self.codes = column.cat.codes.to_numpy(np.int64)
            self.categories = column.cat.categories.to_numpy(dtype=object)
            self.values = None
        else:
            self.values = column.to_numpy()

    def __getitem__(self, i: int):
        if self.values is not None:
            return self.values[i]
        code = self.codes[i]
        return self.categories[code] if code >= 0 else np.nan


def path_index(g: pd.DataFrame) -> PathIndex:
    """For :func:`critical_path` over many steps: :class:`PathIndex` of ``g``."""
    return PathIndex(g)


def _label(label_gap, part, a: int, b: int) -> str:
    return label_gap(int(part), int(a), int(b)) if label_gap else "idle"


SHORT_IDLE_NS = 100_000  # idle gaps shorter than this stay inside a run of kernels


def _merge(segs, rank_of, floor, cols) -> pd.DataFrame:
    """Segments clipped to the step; a rank's consecutive kernels, with the short idle gaps
    between them, become one ``kernels (N): <longest>`` segment."""
    rows: list[dict] = []
    for p, kind, s, e, name in segs:
        s = max(s, floor)
        if e <= s:
            continue
        short = kind in ("idle", "gap") and e - s < SHORT_IDLE_NS
        run = rows[-1] if rows and rows[-1]["part"] == p and rows[-1]["_kind"] == "kernel" else None
        if run is not None and (kind == "kernel" or short):
            run["end_ns"] = e
            if kind == "kernel":
                run["_n"] += 1
                if e - s > run["_longest"][0]:
                    run["_longest"] = (e - s, name)
            continue
        if short and kind == "gap":
            continue
        what = {"collective": f"collective {name}", "idle": name, "gap": "gap"}.get(kind, name)
        rows.append(
            {"rank": rank_of[p], "part": p, "what": what, "start_ns": s, "end_ns": e,
             "_kind": kind, "_n": 1, "_longest": (e - s, name)}
        )  # fmt: skip
    for r in rows:
        if r["_kind"] == "kernel":
            r["what"] = (
                f"kernels ({r['_n']}): {r['_longest'][1]}" if r["_n"] > 1 else r["_longest"][1]
            )
        r["duration_ns"] = r["end_ns"] - r["start_ns"]
    return pd.DataFrame([{c: r[c] for c in cols} for r in rows], columns=cols)
