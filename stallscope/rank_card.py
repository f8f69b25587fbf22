"""Rank cards: a small per-rank summary for the cross-rank step (issue #15).

Each rank's ingest worker (the local process pool and a Dask worker alike:
``ingest.job._ingest_source``) writes ``rank_card-2.parquet`` next to the
rank's canonical tables, computed from that rank's files alone (the name
carries :data:`CARD_VERSION`). Its columns
are declared in :data:`stallscope.schema.RANK_CARD`; one row per

* ``device``: the GPU's step scope (:func:`stallscope.scope.step_scope`),
  its compute and communication kernel time and first/last kernel (ns), and
  whether the trace shows DistributedDataParallel;
* ``step``: each step range (pid, step, start, end; ns);
* ``collective``: each communication kernel (device, op, start, end, bytes);
* ``launcher``: each (GPU, host process) whose API calls launched work on it;
* ``sync``: each blocking host call (``cudaStreamSynchronize``, a blocking
  copy: pid, start, end), which the what-if replays;
* ``kernel``: the rank's top :data:`TOP_KERNELS` compute (non-communication) kernels
  by summed time.

The cross-rank step reads the cards of all ranks with one query
(:func:`job_cards`) instead of querying each rank's files: two-tier triage
(:func:`stallscope.rank_triage.screen`) and the per-device collective
summary of ``overlap`` (:func:`collective_summaries`) and the step of each
collective (``stallscope.collectives``). A rank stored before cards existed
(or with a card of another :data:`CARD_VERSION`) gets its card computed on
demand from its files and stored beside them (once; not on a read-only
store), so old jobs analyze the same.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stallscope.schema import RANK_CARD
from stallscope.sync_calls import API_SQL, SYNC_API_REGEX

if TYPE_CHECKING:
    import pyarrow as pa

    from stallscope.jobdata import JobData

CARD_VERSION = 2  # bump when a card's columns or meaning change: older cards are then ignored
CARD_FILE = f"rank_card-{CARD_VERSION}.parquet"  # (and computed on demand, as for old jobs)
# The rank's GPU operations as the job's timeline reads them (collectives.JOB_OPS_SQL on this
# rank alone: launch time, step, name), so the cross-rank step joins nothing per rank.
OPS_FILE = f"rank_ops-{CARD_VERSION}.parquet"
TOP_KERNELS = 10  # kernels listed per rank, by summed time

_DEVICES_SQL = """
SELECT device,
  sum(end_ns - start_ns) FILTER (WHERE kind = 'kernel' AND NOT is_comm) AS compute_ns,
  sum(end_ns - start_ns) FILTER (WHERE kind = 'kernel' AND is_comm) AS comm_ns,
  min(start_ns) FILTER (WHERE kind = 'kernel') AS first_ns,
  max(end_ns) FILTER (WHERE kind = 'kernel') AS last_ns
FROM gpu WHERE trace_id = $trace AND device IS NOT NULL AND kind IN ('kernel', 'memcpy', 'memset')
GROUP BY device ORDER BY device
"""
_DDP_SQL = """
SELECT EXISTS (SELECT 1 FROM names WHERE trace_id = $trace AND (starts_with(name,
  'DistributedDataParallel') OR contains(name, 'c10d::Reducer')))
"""
_STEPS_SQL = """
SELECT pid, step, start_ns, end_ns FROM ranges WHERE trace_id = $trace AND kind = 'step'
ORDER BY start_ns, pid
"""
_COLLECTIVES_SQL = """
SELECT device, op, start_ns, end_ns, coalesce(in_bytes, out_bytes) AS bytes
FROM collectives WHERE trace_id = $trace ORDER BY device, start_ns
"""
_LAUNCHERS_SQL = """
SELECT DISTINCT g.device, h.pid FROM host h
JOIN gpu g ON g.trace_id = h.trace_id AND g.correlation = h.correlation
WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver') AND g.device IS NOT NULL
ORDER BY 1, 2
"""
_SYNCS_SQL = f"""
SELECT h.pid, h.start_ns, h.end_ns
FROM host h JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
WHERE h.trace_id = $trace AND h.kind IN ('runtime', 'driver')
  AND (regexp_matches({API_SQL}, '{SYNC_API_REGEX}')
       OR regexp_matches(n.name, '^(cudaMemcpy|hipMemcpy|cuMemcpyDtoH)$'))
ORDER BY h.start_ns, h.end_ns, h.pid
"""
_KERNELS_SQL = """
SELECT g.device, coalesce(n.name, '?') AS name, count(*) AS count, sum(g.end_ns - g.start_ns) AS total
FROM gpu g LEFT JOIN names n ON n.trace_id = g.trace_id AND n.name_id = g.name_id
WHERE g.trace_id = $trace AND g.kind = 'kernel' AND NOT g.is_comm
GROUP BY ALL ORDER BY total DESC, name LIMIT $top
"""


def card_schema() -> pa.Schema:
    """The Arrow schema of a card (:data:`stallscope.schema.RANK_CARD`)."""
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_()}
    return pa.schema([pa.field(c.name, types[c.type]) for c in RANK_CARD.columns])


def build_card(rank: JobData, trace_id: str) -> pa.Table:
    """The card of ``trace_id`` from ``rank`` (a JobData over that rank's files)."""
    import pyarrow as pa

    rows = [
        *_device_rows(rank, trace_id),
        *_step_rows(rank, trace_id),
        *_collective_rows(rank, trace_id),
        *_host_rows(rank, trace_id),
        *_kernel_rows(rank, trace_id),
    ]
    schema = card_schema()
    columns = {f.name: [r.get(f.name) for r in rows] for f in schema}
    columns["trace_id"] = [trace_id] * len(rows)
    return pa.table(columns, schema=schema)


def _device_rows(rank: JobData, trace_id: str) -> list[dict[str, Any]]:
    """Per GPU: its step scope, compute and communication kernel time, first and last
    kernel (ns), and whether the trace shows DistributedDataParallel."""
    from stallscope.scope import step_scope

    arg = {"trace": trace_id}
    ddp = bool(rank.con.execute(_DDP_SQL, arg).fetchone()[0])
    rows = []
    for device, compute, comm, first, last in rank.con.execute(_DEVICES_SQL, arg).fetchall():
        scope = step_scope(rank, trace_id, int(device))
        rows.append(
            {"kind": "device", "device": int(device), "compute_ns": compute, "comm_ns": comm,
             "first_ns": first, "last_ns": last, "flag": ddp,
             "start_ns": None if scope is None else scope[0],
             "end_ns": None if scope is None else scope[1]}
        )  # fmt: skip
    return rows


def _step_rows(rank: JobData, trace_id: str) -> list[dict[str, Any]]:
    """Each step range: pid, step, start and end (ns)."""
    found = rank.con.execute(_STEPS_SQL, {"trace": trace_id}).fetchall()
    return [
        {"kind": "step", "pid": pid, "step": step, "start_ns": start, "end_ns": end}
        for pid, step, start, end in found
    ]


def _collective_rows(rank: JobData, trace_id: str) -> list[dict[str, Any]]:
    """Each communication kernel: device, op, start, end (ns), size (bytes) and step."""
    coll = rank.con.execute(_COLLECTIVES_SQL, {"trace": trace_id}).fetchall()
    steps = collective_steps(rank, trace_id, [c[0] for c in coll], [c[2] for c in coll])
    return [
        {"kind": "collective", "device": device, "name": op, "start_ns": start,
         "end_ns": end, "bytes": nbytes, "step": step}
        for (device, op, start, end, nbytes), step in zip(coll, steps, strict=True)
    ]  # fmt: skip


def _host_rows(rank: JobData, trace_id: str) -> list[dict[str, Any]]:
    """The launching processes of each GPU, and each blocking host call (pid, start, end)."""
    arg = {"trace": trace_id}
    launchers = rank.con.execute(_LAUNCHERS_SQL, arg).fetchall()
    syncs = rank.con.execute(_SYNCS_SQL, arg).fetchall()
    return [{"kind": "launcher", "device": d, "pid": pid} for d, pid in launchers] + [
        {"kind": "sync", "pid": pid, "start_ns": a, "end_ns": b} for pid, a, b in syncs
    ]


def _kernel_rows(rank: JobData, trace_id: str) -> list[dict[str, Any]]:
    """The top :data:`TOP_KERNELS` compute kernels: name, launches, summed time (ns)."""
    found = rank.con.execute(_KERNELS_SQL, {"trace": trace_id, "top": TOP_KERNELS}).fetchall()
    return [
        {"kind": "kernel", "device": device, "name": name, "count": count, "compute_ns": total}
        for device, name, count, total in found
    ]


def collective_steps(rank: JobData, trace_id: str, devices: list, starts: list) -> list[int]:
    """The step of each communication kernel (device, start): that of the GPU operation of
    its device starting when it starts (:func:`stallscope.collectives.gpu_activity`; −1
    when none or launched outside every step)."""
    from stallscope.collectives import gpu_activity

    activity = gpu_activity(rank)
    out = []
    for device, start in zip(devices, starts, strict=True):
        ops = None if device is None or start is None else activity.get((trace_id, int(device)))
        if ops is None:
            out.append(-1)
            continue
        i = min(int(np.searchsorted(ops["start_ns"], start)), ops["start_ns"].size - 1)
        out.append(int(ops["step"][i]) if int(ops["start_ns"][i]) == int(start) else -1)
    return out


def write_card(folder: Path, trace_id: str) -> None:
    """Compute and write the card of the trace whose canonical tables are in ``folder``, and
    its GPU operations as the job's timeline reads them (:data:`OPS_FILE`) and what
    ``stallscope compare`` reads of it (``rank_compare.COMPARE_FILE``), called by the
    ingest worker right after it wrote the tables. A card that cannot be built
    is not written (never an ingest failure): the analysis then builds it on demand."""
    import duckdb
    import pyarrow.parquet as pq

    from stallscope.collectives import JOB_OPS_SQL, seed_job_ops
    from stallscope.jobdata import JobData
    from stallscope.rank_compare import COMPARE_FILE, build_rows
    from stallscope.store import Store, TraceRef

    rank = JobData(Store(folder.parent), [TraceRef(trace_id, "", folder, {"rank": 0})])
    try:
        ops = rank.relation(JOB_OPS_SQL).to_arrow_table()
        # The card's collective steps read the same operations (collectives.job_ops): the
        # query runs once (it ran twice: 15-25 % of the card's CPU).
        seed_job_ops(rank, ops)
        table = build_card(rank, trace_id)
        compared = build_rows(rank, trace_id)
    except (duckdb.Error, ValueError, TypeError):
        return  # a trace the card cannot summarize: the analysis computes it or fails itself
    finally:
        rank.close()
    pq.write_table(compared, folder / COMPARE_FILE, compression="zstd", compression_level=1)
    pq.write_table(ops, folder / OPS_FILE, compression="zstd", compression_level=1)
    pq.write_table(table, folder / CARD_FILE, compression="zstd", compression_level=1)


def _keep(card: pa.Table, folder: Path) -> None:
    """Store a card computed on demand beside its rank's tables (written whole, then renamed
    into place), so a job stored before cards pays for them once; a read-only or full
    store keeps none (the card still serves this analysis)."""
    import pyarrow.parquet as pq

    tmp = folder / f".{CARD_FILE}.{os.getpid()}.tmp"
    try:
        pq.write_table(card, tmp, compression="zstd", compression_level=1)
        os.replace(tmp, folder / CARD_FILE)
    except OSError:
        tmp.unlink(missing_ok=True)


def stored_ops(job: JobData) -> pa.Table | None:
    """Every timeline trace's stored GPU operations (:data:`OPS_FILE`, in the job's trace
    order), read in one query; None when a trace has none (stored before them)."""
    refs = [r for r in job.traces if r.meta.get("source") in RANK_CARD.formats]
    if not refs or not all((r.path / OPS_FILE).is_file() for r in refs):
        return None
    listing = ", ".join("'" + str(r.path / OPS_FILE).replace("'", "''") + "'" for r in refs)
    return job.relation(f"SELECT * FROM read_parquet([{listing}])").to_arrow_table()


def job_cards(job: JobData) -> pa.Table:
    """The cards of every timeline trace of ``job`` (cached): the stored ones read in one
    query, the missing ones (ranks stored before cards) computed from their files and
    stored beside them."""
    if "rank_cards" not in job.cache:
        import pyarrow as pa

        stored = [r for r in job.traces if (r.path / CARD_FILE).is_file()]
        tables = []
        if stored:
            listing = ", ".join(
                "'" + str(r.path / CARD_FILE).replace("'", "''") + "'" for r in stored
            )
            tables.append(
                job.relation(f"SELECT * FROM read_parquet([{listing}])")
                .to_arrow_table()
                .cast(card_schema())
            )
        have = {r.trace_id for r in stored}
        for ref in job.traces:
            if ref.trace_id not in have and ref.meta.get("source") in RANK_CARD.formats:
                tables.append(build_card(job.part_of(ref.trace_id), ref.trace_id))
                _keep(tables[-1], ref.path)
        job.cache["rank_cards"] = (
            pa.concat_tables(tables).combine_chunks() if tables else card_schema().empty_table()
        )
    return job.cache["rank_cards"]


def card_rows(job: JobData, kind: str) -> dict[str, np.ndarray]:
    """The ``kind`` rows of all cards (:func:`job_cards`), columnar (numpy; NULL ints as −1)."""
    import pyarrow.compute as pc

    table = job_cards(job)
    table = table.filter(pc.equal(table["kind"], kind))
    out: dict[str, np.ndarray] = {}
    for field in table.schema:
        col = table[field.name].combine_chunks()
        if field.type == "int64":
            out[field.name + "_null"] = np.asarray(col.is_null(), dtype=bool)
            out[field.name] = np.asarray(col.fill_null(-1), dtype=np.int64)
        elif field.type == "bool":
            out[field.name] = np.asarray(col.fill_null(False), dtype=bool)
        else:
            out[field.name] = np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)
    return out


def collective_summaries(job: JobData) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (trace, device), from the cards of all ranks in two queries: ``scope`` (its step
    scope or None), ``ops`` ({op: count} of the collectives starting in the scope, most
    first, ties by name), ``median_bytes`` (their median size, None unknown; float) and
    ``uses_ddp``. Cached on ``job``."""
    if "collective_summaries" not in job.cache:
        cards = job_cards(job)
        con = job.con
        con.register("_cards", cards)
        try:
            where = (
                "FROM _cards c JOIN (SELECT trace_id, device, start_ns AS lo, end_ns AS hi "
                "FROM _cards WHERE kind = 'device') d USING (trace_id, device) "
                "WHERE c.kind = 'collective' AND (d.lo IS NULL OR "
                "(c.start_ns >= d.lo AND c.start_ns < d.hi))"
            )
            by_op = con.execute(
                f"SELECT c.trace_id, c.device, c.name, count(*) {where} GROUP BY ALL "
                "ORDER BY 1, 2, 4 DESC, 3"
            ).fetchall()
            sizes = con.execute(
                f"SELECT c.trace_id, c.device, median(c.bytes) {where} GROUP BY ALL"
            ).fetchall()
            devices = con.execute(
                "SELECT trace_id, device, start_ns, end_ns, flag FROM _cards WHERE kind = 'device'"
            ).fetchall()
        finally:
            con.unregister("_cards")
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for trace, device, lo, hi, ddp in devices:
            out[(trace, int(device))] = {
                "scope": None if lo is None else (int(lo), int(hi)),
                "ops": {},
                "median_bytes": None,
                "uses_ddp": bool(ddp),
            }
        for trace, device, op, n in by_op:
            if (trace, int(device)) in out:
                out[(trace, int(device))]["ops"][str(op)] = int(n)
        for trace, device, median in sizes:
            if (trace, int(device)) in out:
                out[(trace, int(device))]["median_bytes"] = median
        job.cache["collective_summaries"] = out
    return job.cache["collective_summaries"]
