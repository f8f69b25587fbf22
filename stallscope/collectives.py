"""Match every collective across the ranks of a job, and time who waited for whom.

:func:`match_collectives` reads the ``collectives`` table of all the job's
traces (one row per communication kernel per rank) and returns
:class:`CollectiveMatch`, columnar (numpy), cached on the JobData.

**Participants** are (trace, device) pairs; a rank normally has one.

**Group.** ``pg_name`` when the kernel carries process-group metadata. Without
it (old traces, name fallback) the kernel's stream is the group when every
participant uses the same set of communication streams (one NCCL stream per
communicator and device), else one job-wide group ``""``.

**Key** of a collective instance inside its group: ``seq`` when every row of
the group has one; else (``op``, order of that op in the group on that rank).
When ranks hold different counts of an op, each rank is aligned on the rank
with the most, at the offset where completion times agree best (a collective
ends at about the same moment everywhere), and a data-quality warning says so.
An instance is *matched* when every participant of its group has it.

**Clock skew.** For each participant, skew = median over matched instances
it shares with the reference participant (lowest rank) of
``end − end_ref``: waiting moves starts, never ends. Skew is corrected
(subtracted from that participant's times) only when it exceeds
``skew_tolerance_ns`` and is steady (MAD below half of it); below that the
ranks are taken to share one clock (same host) and the estimate is reported.

**Wait and transfer** (ns, per row of a matched instance, corrected clock):
``last = max start over ranks``; ``wait = max(0, min(end, last) − start)``;
``transfer = max(0, end − max(start, last))``. The straggler of an instance is
the participant with the latest start (ties: lowest rank). Per instance,
``transfer_ns`` is the median of the ranks' transfers; with a known size,
``algbw = bytes / transfer_ns`` (GB/s) and ``busbw = algbw × f(n)`` with
NCCL-tests factors: all-reduce 2(n−1)/n; all-gather, reduce-scatter,
all-to-all (n−1)/n; others 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from stallscope import job_settings
from stallscope.host_ops import JOB_LAUNCH_CTE
from stallscope.jobdata import JobData

SKEW_TOLERANCE_NS = job_settings.JobSettings().skew_tolerance_ns  # the default
MAX_ALIGN_OFFSET = 64
ALGO_REGEX = r"_(RING|TREE|NVLS_TREE|NVLS|COLLNET_DIRECT|COLLNET_CHAIN|PAT)_(LL128|LL|SIMPLE)"

# Every trace's GPU operations in one query (set-wise over all ranks: a query per rank
# binds and prunes every rank's files), each with the step whose host ProfilerStep range
# holds its launch call (else its own start; -1 outside every step), its launch time
# (-1 unknown), name and launch grid.
JOB_OPS_SQL = f"""
WITH {JOB_LAUNCH_CTE}, steps AS (
  SELECT trace_id, step, start_ns AS step_start, end_ns AS step_end FROM ranges WHERE kind = 'step'
), ops AS (
  SELECT g.trace_id, g.device, g.stream, g.kind = 'kernel' AS is_kernel, g.is_comm, g.start_ns,
         g.end_ns, coalesce(n.name, g.kind) AS name,
         coalesce(g.grid_x, 0)::BIGINT * 1000000 + coalesce(g.grid_y, 0)::BIGINT * 1000
           + coalesce(g.grid_z, 0) AS grid,
         coalesce(l.launch_ns, -1) AS launch_ns, coalesce(l.launch_ns, g.start_ns) AS anchor_ns
  FROM gpu g LEFT JOIN launch l ON l.trace_id = g.trace_id AND l.correlation = g.correlation
  LEFT JOIN names n ON n.trace_id = g.trace_id AND n.name_id = g.name_id
  WHERE g.kind IN ('kernel', 'memcpy', 'memset') AND g.device IS NOT NULL
)
SELECT ops.* EXCLUDE (anchor_ns),
       coalesce(CASE WHEN ops.anchor_ns < s.step_end THEN s.step END, -1) AS step
FROM ops ASOF LEFT JOIN steps s ON ops.trace_id = s.trace_id AND ops.anchor_ns >= s.step_start
ORDER BY trace_id, device, start_ns, end_ns
"""
OPS_INT_COLUMNS = ("device", "stream", "start_ns", "end_ns", "grid", "launch_ns", "step")

# pg_ranks is read as its hash: the text (thousands of characters per row at 1,024 ranks,
# ~240 MB over a job's collectives) is fetched once per distinct value (_PG_RANKS_SQL).
# {steps}: the step of each kernel from the rank cards (_CARD_STEPS_SQL), or -1 for all.
_ROWS_SQL = """
SELECT c.trace_id, c.rank, c.device, c.stream, c.pg_name, hash(c.pg_ranks) AS pg_ranks_hash,
  c.pg_ranks IS NULL AS pg_ranks_null, c.group_size, c.seq, c.op,
  CASE WHEN c.op IN ('allgather') THEN c.out_bytes ELSE coalesce(c.in_bytes, c.out_bytes) END AS bytes,
  c.start_ns, c.end_ns, c.order_in_group,
  nullif(regexp_extract(n.name, '{algo}', 1) || '_' || regexp_extract(n.name, '{algo}', 2), '_')
    AS algorithm, {step} AS step
FROM collectives c LEFT JOIN names n ON n.trace_id = c.trace_id AND n.name_id = c.name_id
{steps}
"""
# match_waits' rows: the same columns from the collectives alone (no step, algorithm, rank list)
_ROWS_SQL_WAITS = """
SELECT c.trace_id, c.rank, c.device, c.stream, c.pg_name, 0::UBIGINT AS pg_ranks_hash,
  true AS pg_ranks_null, c.group_size, c.seq, c.op,
  CASE WHEN c.op IN ('allgather') THEN c.out_bytes ELSE coalesce(c.in_bytes, c.out_bytes) END AS bytes,
  c.start_ns, c.end_ns, c.order_in_group, NULL::VARCHAR AS algorithm, -1::BIGINT AS step
FROM collectives c
"""
# A collective's step from the cards' `collective` rows of (trace, device, start): the first
# such row of its card when several start at once (as _steps_of does with the cards in memory).
_CARD_STEPS_SQL = """
LEFT JOIN (
  SELECT trace_id, coalesce(device, -1) AS device, start_ns,
    arg_min(coalesce(step, -1), file_row_number) AS step
  FROM read_parquet([{files}], file_row_number = true) WHERE kind = 'collective' GROUP BY ALL
) k ON k.trace_id = c.trace_id AND k.device = c.device AND k.start_ns = c.start_ns
"""
_PG_RANKS_SQL = """
SELECT hash(pg_ranks) AS h, any_value(pg_ranks) AS text FROM {source}
WHERE pg_ranks IS NOT NULL{only} GROUP BY 1
"""


def job_ops(job: JobData) -> dict[str, np.ndarray]:
    """Every GPU operation of the job (:data:`JOB_OPS_SQL`), columnar, each (trace, device)
    one run sorted by (start, end); cached. Read from the ranks' stored operations
    (``rank_card.OPS_FILE``, written at ingest) when every rank has them. ``name_code`` indexes ``names`` (one code per distinct
    name across the ranks); ``bounds``: the rows of each (trace, device), ``{key: (lo, hi)}``."""
    if "job_ops" not in job.cache:
        from stallscope.rank_card import stored_ops

        cols = _ops_columns(stored_ops(job))
        if cols is None:  # a rank stored without them: the query over every rank's files
            cols = _ops_columns(job.relation(JOB_OPS_SQL).to_arrow_table())
        job.cache["job_ops"] = cols
    return job.cache["job_ops"]


def seed_job_ops(job: JobData, table) -> None:
    """Give :func:`job_ops` the operations a caller already read as an Arrow table of
    :data:`JOB_OPS_SQL`'s rows (the rank card at ingest), so that it does not run the query
    again; a table it cannot use (runs not contiguous) leaves :func:`job_ops` to read."""
    columns = _ops_columns(table)
    if columns is not None:
        job.cache["job_ops"] = columns


def _ops_columns(table) -> dict[str, np.ndarray] | None:
    """:func:`job_ops`'s columns from an Arrow table of :data:`JOB_OPS_SQL`'s rows, or None
    when ``table`` is None or its (trace, device) runs are not contiguous."""
    if table is None:
        return None
    import pyarrow.compute as pc

    cols = {c: table[c].to_numpy().astype(np.int64) for c in OPS_INT_COLUMNS}
    for c in ("is_kernel", "is_comm"):
        cols[c] = table[c].fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    codes = pc.dictionary_encode(table["name"]).combine_chunks()
    cols["name_code"] = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    cols["names"] = np.asarray(codes.dictionary.to_pylist(), dtype=object)
    traces = pc.dictionary_encode(table["trace_id"]).combine_chunks()
    trace = traces.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    trace_ids = traces.dictionary.to_pylist()
    device = cols["device"]
    new = np.r_[True, (trace[1:] != trace[:-1]) | (device[1:] != device[:-1])]
    cut = np.r_[np.flatnonzero(new), trace.size] if trace.size else np.zeros(1, np.int64)
    cols["bounds"] = {
        (trace_ids[trace[lo]], int(device[lo])): (int(lo), int(hi))
        for lo, hi in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True)
    }
    if len(cols["bounds"]) != cut.size - 1:  # a (trace, device) in two runs
        return None
    return cols


def gpu_activity(job: JobData) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """Kernels, memcpys and memsets of every (trace, device), sorted by start (cached).

    Columns: ``stream``, ``is_kernel`` (else a memcpy or memset), ``is_comm``,
    ``start_ns``, ``end_ns``, ``step`` (−1 when launched outside every ``ProfilerStep#N``).
    Views of :func:`job_ops` (one query over all ranks).
    """
    if "gpu_activity" not in job.cache:
        ops = job_ops(job)
        job.cache["gpu_activity"] = {
            key: {c: ops[c][lo:hi] for c in ("stream", "is_kernel", "is_comm", "start_ns", "end_ns", "step")}
            for key, (lo, hi) in ops["bounds"].items()
        }  # fmt: skip
    return job.cache["gpu_activity"]


def step_windows(ops: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps of one device's ``gpu_activity`` and their GPU windows ``[lo, hi)``.

    A step's window runs from its first operation to the next step's first
    operation (the last one: to the end of its last operation).
    """
    owned = ops["step"] >= 0
    steps = np.unique(ops["step"][owned])
    lo = np.full(steps.size, np.iinfo(np.int64).max)
    hi = np.zeros(steps.size, dtype=np.int64)
    idx = np.searchsorted(steps, ops["step"][owned])
    np.minimum.at(lo, idx, ops["start_ns"][owned])
    np.maximum.at(hi, idx, ops["end_ns"][owned])
    hi[:-1] = lo[1:]
    return steps, lo, hi


@dataclass
class CollectiveMatch:
    """Collectives of a job, matched across ranks. Times in int64 ns.

    ``rows``: one entry per communication kernel, sorted by (rank, device,
    start): ``trace_id, rank, device, step, start_ns, end_ns`` (own clock),
    ``inst`` (instance index, −1 when unmatched), ``wait_ns``,
    ``transfer_ns``, ``last`` (this rank arrived last).
    ``instances``: one entry per matched instance: ``group, op, key,
    size, start_ns`` (first arrival, reference clock), ``last_ns``,
    ``straggler_rank``, ``straggler_trace``, ``straggler_device``,
    ``max_wait_ns``, ``transfer_ns``, ``bytes`` (−1 unknown), ``algbw_gbps``,
    ``busbw_gbps`` (NaN unknown), ``algorithm``.
    ``skew_ns``/``skew_corrected``: per (trace_id, device).
    """

    rows: dict[str, np.ndarray]
    instances: dict[str, np.ndarray]
    skew_ns: dict[tuple[str, int], int] = field(default_factory=dict)
    skew_corrected: dict[tuple[str, int], bool] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)  # group -> 'seq' | 'order'
    warnings: list[str] = field(default_factory=list)

    def rows_of(self, trace_id: str, device: int) -> slice:
        """The rows of one participant: ``rows`` are sorted by (rank, trace, device), so each
        participant's rows are one slice (empty when it has none). Found by a dict built once,
        not a comparison over every row per participant."""
        if not hasattr(self, "_slices"):
            r = self.rows
            traces, devices = r["trace_id"], r["device"]
            new = np.r_[True, (traces[1:] != traces[:-1]) | (devices[1:] != devices[:-1])]
            cut = np.r_[np.flatnonzero(new), traces.size] if traces.size else np.zeros(1, np.int64)
            self._slices = {
                (str(traces[lo]), int(devices[lo])): slice(int(lo), int(hi))
                for lo, hi in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True)
            }
        return self._slices.get((trace_id, int(device)), slice(0, 0))

    def waits_of(self, trace_id: str, device: int) -> tuple[np.ndarray, np.ndarray]:
        """Wait intervals [start, start + wait) of one participant, on its own clock."""
        mine = self.rows_of(trace_id, device)
        start, wait = self.rows["start_ns"][mine], self.rows["wait_ns"][mine]
        return start[wait > 0], start[wait > 0] + wait[wait > 0]


def match_collectives(job: JobData, skew_tolerance_ns: int | None = None) -> CollectiveMatch | None:
    """Matched collectives of the job (cached per tolerance); None when it has none.

    ``skew_tolerance_ns`` None: the job's setting (:mod:`stallscope.job_settings`), which
    every reader of one job shares.
    """
    if skew_tolerance_ns is None:
        skew_tolerance_ns = job_settings.of(job).skew_tolerance_ns
    key = ("collectives", int(skew_tolerance_ns))
    if key not in job.cache:
        job.cache[key] = _match(job, int(skew_tolerance_ns))
    return job.cache[key]


def match_waits(job: JobData, skew_tolerance_ns: int | None = None) -> CollectiveMatch | None:
    """The match of :func:`match_collectives` read from the ``collectives`` table alone (for
    the Distributed page's wait matrix): the same ``rows`` and ``instances`` but for
    ``rows['step']`` (all −1) and ``instances['algorithm']`` (all ''), and no ``warnings``
    from the process groups' rank lists. No kernel names, rank cards or rank lists are read
    (at 1,024 ranks a third of the files). The whole match when the job holds it already.
    Cached per tolerance."""
    if skew_tolerance_ns is None:
        skew_tolerance_ns = job_settings.of(job).skew_tolerance_ns
    whole = ("collectives", int(skew_tolerance_ns))
    if whole in job.cache:
        return job.cache[whole]
    key = ("collective_waits", int(skew_tolerance_ns))
    if key not in job.cache:
        job.cache[key] = _match(job, int(skew_tolerance_ns), waits_only=True)
    return job.cache[key]


def _match(job: JobData, tolerance: int, waits_only: bool = False) -> CollectiveMatch | None:
    cards = None if waits_only else _stored_cards(job)
    sql = (
        _ROWS_SQL_WAITS
        if waits_only
        else _ROWS_SQL.format(
            algo=ALGO_REGEX,
            step="-1" if cards is None else "coalesce(k.step, -1)",
            steps="" if cards is None else _CARD_STEPS_SQL.format(files=_sql_list(cards)),
        )
    )
    # (no count(*) first: each query binds every rank's files, ~0.2 s at 1,024)
    r = job.numpy(sql + " ORDER BY rank, trace_id, device, start_ns, order_in_group")
    if r["trace_id"].size == 0:
        return None
    # participants: runs of (rank, trace, device) in row order, so numbered by rank
    trace, device = r["trace_id"].astype(str), r["device"].astype(np.int64)
    new = np.r_[True, (trace[1:] != trace[:-1]) | (device[1:] != device[:-1])]
    part = np.cumsum(new) - 1
    if cards is None and not waits_only:  # cards in memory already, or a card missing
        r["step"] = _steps_of(job, trace, device, r["start_ns"].astype(np.int64), new)
    warnings: list[str] = []
    group = _groups(r, part, warnings)
    seq = _masked_int(r["seq"])
    op = r["op"].astype(str)
    _, gcode = np.unique(group, return_inverse=True)
    has_seq = np.ones(gcode.max() + 1, dtype=bool)
    np.logical_and.at(has_seq, gcode, seq >= 0)
    by_seq = has_seq[gcode]
    order = _order(part, gcode, op, r["start_ns"])
    methods = {
        str(g): ("seq" if has_seq[gcode[i]] else "order")
        for g, i in zip(*_first_index(group), strict=True)
    }
    order = _align(part, gcode, op, order, r["end_ns"], by_seq, group, r["rank"], warnings)
    _, opcode = np.unique(op, return_inverse=True)
    key = np.where(by_seq, seq, order)
    key_op = np.where(by_seq, -1, opcode)
    _, inst = np.unique(np.stack([gcode, key_op, key]), axis=1, return_inverse=True)
    inst = inst.reshape(-1)
    matched = _complete(inst, part, gcode, r, group, warnings, job)
    inst = np.where(matched, inst, -1)
    _, inst = np.unique(inst, return_inverse=True)
    inst = _by_time(inst.reshape(-1) - (1 if (~matched).any() else 0), r["start_ns"])
    skew, corrected = _skew(inst, part, r["end_ns"], tolerance)
    start = r["start_ns"] - np.where(corrected, skew, 0)[part]
    end = r["end_ns"] - np.where(corrected, skew, 0)[part]
    rows, instances = _waits(r, inst, part, start, end, group, op, key)
    keys = [(str(r["trace_id"][i]), int(r["device"][i])) for i in _first_index(part)[1]]
    return CollectiveMatch(
        rows=rows,
        instances=instances,
        skew_ns={k: int(skew[p]) for p, k in enumerate(keys)},
        skew_corrected={k: bool(corrected[p]) for p, k in enumerate(keys)},
        methods=methods,
        warnings=warnings,
    )


def _stored_cards(job: JobData) -> list[str] | None:
    """The rank cards' files when the rows query can read the collectives' steps from them
    (every timeline trace has its card stored, and they are not in memory already: then
    :func:`_steps_of` reads them there); else None."""
    from stallscope.rank_card import CARD_FILE
    from stallscope.schema import RANK_CARD

    if "rank_cards" in job.cache:
        return None
    refs = [r for r in job.traces if r.meta.get("source") in RANK_CARD.formats]
    files = [r.path / CARD_FILE for r in refs]
    if not files or not all(f.is_file() for f in files):
        return None
    return [str(f) for f in files]


def _sql_list(paths: list[str]) -> str:
    return ", ".join("'" + p.replace("'", "''") + "'" for p in paths)


def _steps_of(job, trace, device, start, new) -> np.ndarray:
    """Step of each collective kernel: that of the GPU operation starting when it starts,
    read from the rank cards (:mod:`stallscope.rank_card`, written at ingest: no rank's
    GPU timeline is read here)."""
    import pandas as pd

    from stallscope.rank_card import card_rows

    cards = card_rows(job, "collective")
    known = pd.DataFrame(
        {"trace": cards["trace_id"].astype(str), "device": cards["device"],
         "start": cards["start_ns"], "step": cards["step"]}
    ).drop_duplicates(["trace", "device", "start"])  # fmt: skip
    asked = pd.DataFrame({"trace": trace, "device": device, "start": start})
    found = asked.merge(known, on=["trace", "device", "start"], how="left")["step"]
    return found.fillna(-1).to_numpy(np.int64)


def _by_time(inst: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Renumber instances (−1 stays) in order of their first arrival."""
    ok = inst >= 0
    if not ok.any():
        return inst
    first = np.full(inst.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(first, inst[ok], start[ok])
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    return np.where(ok, rank[np.where(ok, inst, 0)], -1)


def _first_index(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values in order of first appearance, and that first index."""
    uniq, idx = np.unique(values, return_index=True)
    order = np.argsort(idx)
    return uniq[order], idx[order]


def _masked_int(values) -> np.ndarray:
    """A nullable integer column as int64 with −1 for NULL."""
    if np.ma.isMaskedArray(values):
        return values.filled(-1).astype(np.int64)
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype == object:
        return np.where(np.equal(arr, None), -1, arr).astype(np.int64)
    return np.nan_to_num(arr.astype(float), nan=-1).astype(np.int64)


def _strs(values) -> np.ndarray:
    """A nullable text column as str with '' for NULL."""
    if np.ma.isMaskedArray(values):
        values = values.filled("")
    arr = np.asarray(values, dtype=object)
    return np.where(np.equal(arr, None), "", arr).astype(str)


def _groups(r: dict, part: np.ndarray, warnings: list[str]) -> np.ndarray:
    """Group of each row: pg_name, else the stream when all ranks share those streams, else ''."""
    pg = _strs(r["pg_name"])
    missing = pg == ""
    if not missing.any():
        return pg
    stream = r["stream"].astype(np.int64)
    sets = {p: frozenset(stream[missing & (part == p)].tolist()) for p in np.unique(part[missing])}
    same = len(set(sets.values())) == 1 and len(sets) > 1
    derived = np.char.add("stream ", stream.astype(str)) if same else np.full(pg.size, "")
    warnings.append(
        f"{int(missing.sum())} communication kernels carry no process-group metadata: "
        + (
            "grouped by their stream (the same on every rank) and matched by kernel order"
            if same
            else "matched by kernel order in one job-wide group"
        )
    )
    return np.where(missing, derived, pg)


def _order(part, gcode, op, start) -> np.ndarray:
    """0-based order of each row among the rows of its (participant, group, op), by start."""
    _, opcode = np.unique(op, return_inverse=True)
    combo = (part.astype(np.int64) * (gcode.max() + 1) + gcode) * (opcode.max() + 1) + opcode
    idx = np.lexsort((start, combo))
    sorted_combo = combo[idx]
    new = np.r_[True, sorted_combo[1:] != sorted_combo[:-1]]
    run_start = np.maximum.accumulate(np.where(new, np.arange(idx.size), 0))
    order = np.empty(idx.size, dtype=np.int64)
    order[idx] = np.arange(idx.size) - run_start
    return order


def _align(part, gcode, op, order, end, by_seq, group, rank, warnings) -> np.ndarray:
    """Shift each rank's order where counts differ, so that completion times line up."""
    order = order.copy()
    mask = ~by_seq
    if not mask.any():
        return order
    combos = np.unique(np.stack([gcode[mask], np.unique(op, return_inverse=True)[1][mask]]), axis=1)
    opcode = np.unique(op, return_inverse=True)[1]
    for g, o in combos.T:  # one pass per (group, op): few, not per event
        sel = mask & (gcode == g) & (opcode == o)
        members, counts = np.unique(part[sel], return_counts=True)
        if counts.min() == counts.max():
            continue
        ref = members[np.argmax(counts)]
        ref_end = end[sel & (part == ref)][np.argsort(order[sel & (part == ref)])]
        shifts = []
        for p, c in zip(members, counts, strict=True):
            rows = np.flatnonzero(sel & (part == p))
            rows = rows[np.argsort(order[rows])]
            k = _best_offset(end[rows], ref_end) if p != ref else 0
            order[rows] += k
            if c != counts.max():
                shifts.append(f"rank {int(rank[rows[0]])}: {int(c)} (+{k})")
        warnings.append(
            f"group {group[sel][0] or '(none)'!s}, {op[sel][0]}: ranks hold different counts "
            f"(most: {int(counts.max())}; {', '.join(shifts)}); matched by order after aligning "
            "completion times"
        )
    return order


def _best_offset(ends: np.ndarray, ref: np.ndarray) -> int:
    """Offset k into ``ref`` at which ``ends − ref[k:k+n]`` is steadiest, then closest to 0.

    Steadiest = smallest median absolute deviation (within 10 µs of the best); a
    constant difference could also be clock skew, so among those the offset
    with the smallest median difference wins.
    """
    n = ends.size
    offsets = np.arange(min(ref.size - n, MAX_ALIGN_OFFSET) + 1)
    diffs = np.stack([ends - ref[k : k + n] for k in offsets])
    med = np.median(diffs, axis=1)
    mad = np.median(np.abs(diffs - med[:, None]), axis=1)
    steady = mad <= mad.min() + 10_000
    return int(offsets[steady][np.argmin(np.abs(med[steady]))])


def _complete(inst, part, gcode, r, group, warnings, job) -> np.ndarray:
    """Rows whose instance holds every participant of its group (once)."""
    members = np.zeros((gcode.max() + 1, part.max() + 1), dtype=bool)
    members[gcode, part] = True
    expected = members.sum(axis=1)
    pairs = np.unique(np.stack([inst, part]), axis=1)
    present = np.bincount(pairs[0], minlength=inst.max() + 1)
    rows_per = np.bincount(inst, minlength=inst.max() + 1)
    ok = (present[inst] == expected[gcode]) & (rows_per[inst] == present[inst])
    ok &= expected[gcode] >= 2
    unmatched = int((~ok & (expected[gcode] >= 2)).sum())
    if unmatched:
        warnings.append(
            f"{unmatched} communication kernels have no counterpart on every rank of their group "
            "(profiling windows differ, or point-to-point traffic): not matched"
        )
    listed = _listed_ranks(r, group, job)
    held = set(np.unique(r["rank"]).tolist())
    for g, ranks in listed.items():
        if ranks - held:
            warnings.append(
                f"group {g} lists {len(ranks)} ranks, the job holds {len(ranks & held)} of them: "
                "waits are relative to the captured ranks only"
            )
    return ok


def _listed_ranks(r: dict, group: np.ndarray, job: JobData) -> dict[str, set[int]]:
    """Ranks each group's process-group metadata lists (its first row's ``pg_ranks``)."""
    firsts = [
        (str(g), int(r["pg_ranks_hash"][i]))
        for g, i in zip(*_first_index(group), strict=True)
        if not r["pg_ranks_null"][i]
    ]
    if not firsts:
        return {}
    texts = _pg_ranks_texts(
        job, {h for _, h in firsts}, {str(r["trace_id"][i]) for i in _first_index(group)[1]}
    )
    out: dict[str, set[int]] = {}
    for g, h in firsts:
        body = str(texts.get(h, "")).strip("[] ")
        if body and "..." not in body:
            try:
                out[g] = {int(x) for x in body.split(",")}
            except ValueError:
                continue
    return out


def _pg_ranks_texts(job: JobData, hashes: set[int], traces: set[str]) -> dict[int, str]:
    """``pg_ranks`` text of each hash: read from the collectives of ``traces`` (the ones
    holding each group's first row, usually rank 0's alone) rather than every rank's; all
    ranks' when one of ``hashes`` is not found there."""
    refs = [r for r in job.traces if r.trace_id in traces]
    files = [str(r.table_path("collectives")) for r in refs]
    texts: dict[int, str] = {}
    if files and all(os.path.isfile(f) for f in files):
        only = " AND hash(pg_ranks) IN (" + ", ".join(str(int(h)) for h in sorted(hashes)) + ")"
        source = f"read_parquet([{_sql_list(files)}])"
        texts = {
            int(h): t for h, t in job.sql(_PG_RANKS_SQL.format(source=source, only=only)).fetchall()
        }
    if not hashes <= texts.keys():
        sql = _PG_RANKS_SQL.format(source="collectives", only="")
        texts = {int(h): text for h, text in job.sql(sql).fetchall()}
    return texts


def _skew(inst, part, end, tolerance) -> tuple[np.ndarray, np.ndarray]:
    """Per participant: median (end − end of participant 0) over shared instances; corrected?"""
    nparts = part.max() + 1
    skew = np.zeros(nparts, dtype=np.int64)
    corrected = np.zeros(nparts, dtype=bool)
    ok = inst >= 0
    if not ok.any():
        return skew, corrected
    ref_end = np.full(inst.max() + 1, np.iinfo(np.int64).min)
    is_ref = ok & (part == 0)
    ref_end[inst[is_ref]] = end[is_ref]
    usable = ok & (ref_end[np.where(ok, inst, 0)] != np.iinfo(np.int64).min)
    d = end[usable] - ref_end[inst[usable]]
    p = part[usable]
    # per participant at once (a sort, not a median call per participant): np.median's numbers
    order = np.lexsort((d, p))
    p, d = p[order], d[order]
    q, first, count = np.unique(p, return_index=True, return_counts=True)
    member = np.repeat(np.arange(q.size), count)
    med = _sorted_median(d, first, count).astype(np.int64)  # int(np.median): toward zero
    dev = np.abs(d - med[member])
    mad = _sorted_median(dev[np.lexsort((dev, member))], first, count)
    skew[q] = med
    corrected[q] = (np.abs(med) > tolerance) & (mad < np.abs(med) / 2) & (count >= 3)
    return skew, corrected


def _sorted_median(values: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """np.median (float64) of each run ``values[first:first + count]`` of sorted int64 values:
    the middle value, or the mean of the two middle ones, as np.median computes it."""
    lo = values[first + (count - 1) // 2].astype(np.float64)
    hi = values[first + count // 2].astype(np.float64)
    return (lo + hi) / 2.0


def _waits(r, inst, part, start, end, group, op, key):
    n_inst = int(inst.max()) + 1 if inst.size else 0
    ok = inst >= 0
    i = np.where(ok, inst, 0)
    last = np.full(max(n_inst, 1), np.iinfo(np.int64).min)
    np.maximum.at(last, inst[ok], start[ok])
    first = np.full(max(n_inst, 1), np.iinfo(np.int64).max)
    np.minimum.at(first, inst[ok], start[ok])
    wait = np.where(ok, np.clip(np.minimum(end, last[i]) - start, 0, None), 0)
    transfer = np.where(ok, np.clip(end - np.maximum(start, last[i]), 0, None), 0)
    # straggler: latest start; ties -> lowest rank (rows are sorted by rank)
    cand = np.flatnonzero(ok)
    cand = cand[np.lexsort((cand, -start[cand], inst[cand]))]
    lead = cand[np.r_[True, inst[cand][1:] != inst[cand][:-1]]] if cand.size else cand
    is_last = np.zeros(inst.size, dtype=bool)
    is_last[lead] = True
    max_wait = np.zeros(n_inst, dtype=np.int64)
    np.maximum.at(max_wait, inst[ok], wait[ok])
    med_transfer = _group_median(inst[ok], transfer[ok], n_inst)
    size = np.bincount(inst[ok], minlength=n_inst)
    nbytes = np.full(n_inst, -1, dtype=np.int64)
    np.maximum.at(nbytes, inst[ok], _masked_int(r["bytes"])[ok])
    algbw = np.where(
        (nbytes > 0) & (med_transfer > 0), nbytes / np.maximum(med_transfer, 1), np.nan
    )
    inst_op = op[lead]
    factor = np.where(
        inst_op == "allreduce",
        2 * (size - 1) / size,
        np.where(
            np.isin(inst_op, ["allgather", "reducescatter", "alltoall"]), (size - 1) / size, 1.0
        ),
    )
    rows = {
        "trace_id": r["trace_id"].astype(str),
        "rank": r["rank"].astype(np.int64),
        "device": r["device"].astype(np.int64),
        "step": _masked_int(r["step"]),
        "start_ns": r["start_ns"].astype(np.int64),
        "end_ns": r["end_ns"].astype(np.int64),
        "inst": inst,
        "wait_ns": wait.astype(np.int64),
        "transfer_ns": transfer.astype(np.int64),
        "last": is_last,
    }
    instances = {
        "group": group[lead],
        "op": inst_op,
        "key": key[lead],
        "size": size,
        "start_ns": first[:n_inst],
        "last_ns": last[:n_inst],
        "straggler_rank": rows["rank"][lead],
        "straggler_trace": rows["trace_id"][lead],
        "straggler_device": rows["device"][lead],
        "max_wait_ns": max_wait,
        "transfer_ns": med_transfer,
        "bytes": nbytes,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor,
        "algorithm": _strs(r["algorithm"])[lead],
    }
    return rows, instances


def _group_median(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Median of ``values`` per group id in [0, n) (lower median), 0 for empty groups."""
    out = np.zeros(n, dtype=np.int64)
    if values.size == 0:
        return out
    idx = np.lexsort((values, groups))
    g, v = groups[idx], values[idx]
    starts = np.searchsorted(g, np.arange(n), side="left")
    counts = np.bincount(g, minlength=n)
    has = counts > 0
    out[has] = v[starts[has] + (counts[has] - 1) // 2]
    return out


def covered_length(
    union: tuple[np.ndarray, np.ndarray], a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """For each [a_i, b_i): how much of it the sorted, disjoint ``union`` covers (ns)."""
    us, ue = union
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if us.size == 0:
        return np.zeros(a.size, dtype=np.int64)
    lengths = ue - us
    cum = np.r_[0, np.cumsum(lengths)]

    def before(x: np.ndarray) -> np.ndarray:  # covered length of (-inf, x)
        idx = np.searchsorted(us, x, side="right") - 1
        j = np.maximum(idx, 0)
        return np.where(idx >= 0, cum[j] + np.clip(x - us[j], 0, lengths[j]), 0)

    return before(b) - before(a)
