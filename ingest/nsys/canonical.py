"""Raw nsys tables -> the canonical tables of every trace in the file (docs/schema.md).

:class:`NsysCanonical` loads the raw Arrow tables of ``tables`` into a
private DuckDB connection, one big table at a time, and runs ``sql``: all per-event work is SQL,
nothing per event passes through Python. The caller decides the traces
(*units*: a process, or one GPU of a multi-GPU process) and their ranks, then
:meth:`NsysCanonical.emit` returns each trace's tables, ready for the store.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallscope.ingest.canonical import CanonicalTrace
from stallscope.ingest.comm import MACROS_SQL
from stallscope.ingest.formats import TableReader, table_readers
from stallscope.ingest.nsys.copyout import copy_split
from stallscope.ingest.nsys.ranks import payload_fields
from stallscope.ingest.nsys.sql import (
    COLLECTIVES_OUT_SQL,
    CORR_DEV_SQL,
    ENCLOSE_SQL,
    GPU_OUT_SQL,
    HOST_ORDER,
    HOST_OUT_SQL,
    PREPARE_END_SQL,
    PREPARE_STEPS,
    RANGES_ORDER,
    RANGES_OUT_SQL,
    THREADS_OUT_SQL,
)
from stallscope.ingest.startup import duckdb_threads
from stallscope.ingest.streamed import BATCH_ROWS as STREAM_BATCH_ROWS
from stallscope.ingest.streamed import WrittenTable, write_split

# (NVTX eventTypes, key columns): push/pop ranges hold what their own thread
# launched; start/end ranges may end on another thread, so they hold what any
# thread of their process launched (NVIDIA's nvtx_gpu_proj_* rules).
_RANGE_SCOPES = (((59, 70), ("gp", "tid")), ((60, 71), ("gp",)))
_MAX_PACKED = 1 << 62
# The range join is done by slices of about this many launch points (at most _MAX_SLICES).
_SLICE_POINTS = 150_000
_MAX_SLICES = 8


@functools.cache
def further_readers() -> list[TableReader]:
    """The readers of this folder's further tables (the ``TABLE_READER`` of its modules: their
    raw table read by parse.py, their canonical rows per trace by :meth:`NsysCanonical.emit`)."""
    return table_readers(__package__, Path(__file__).parent)


class NsysCanonical:
    """One export's events in DuckDB, prepared once; emits the canonical tables."""

    def __init__(self, raw: dict[str, pa.Table | Callable[[], pa.Table]]):
        """Load ``raw`` (the tables of ``tables``, by name) and prepare them.

        The big event tables (``PREPARE_STEPS``: runtime, act, osrt, nvtx) may
        be given as functions that read them: each is read, turned into its
        prepared tables and released before the next is read, so only one raw
        event table is held at a time. They are taken out of ``raw`` (the
        caller's dict), which keeps no reference to them.
        """
        self.con = duckdb.connect(config={"threads": duckdb_threads()})
        steps = [(name, sql, after, raw.pop(name)) for name, sql, after in PREPARE_STEPS]
        for name, table in raw.items():
            self.con.register(name, _loaded(table))
        self.con.execute(MACROS_SQL)
        self.further = [r for r in further_readers() if r.raw in raw]  # tables they were read for
        for name, sql, after, source in steps:
            self._prepare(name, sql, source)
            del source
            if after:
                self.con.execute(after)
        del steps
        self.con.execute(PREPARE_END_SQL)
        self._pairs()
        self.con.execute(ENCLOSE_SQL)

    def _prepare(self, name: str, sql: str, source: pa.Table | Callable[[], pa.Table]) -> None:
        """Read one raw event table, run its prepare step, and let Arrow free it."""
        table = _loaded(source)
        del source
        if (
            name == "act"
        ):  # ``gid``: a stable id per GPU activity (file order), every ORDER BY's tie-breaker
            table = table.append_column("gid", pa.array(np.arange(table.num_rows)))
        self.con.register(name, table)
        self.con.execute(sql)
        self.con.unregister(name)  # copied into DuckDB: let Arrow free it
        del table
        pa.default_memory_pool().release_unused()

    def close(self) -> None:
        self.con.close()

    def _pairs(self) -> None:
        """``pairs(nvtx_id, gid)``: the GPU activities launched inside each NVTX range.

        A range join on (key, time), done as a pure inequality join (DuckDB's
        IEJoin) by packing each key's times into its own band of one integer.
        """
        con = self.con
        con.execute("CREATE TEMP TABLE pairs (nvtx_id BIGINT, gid BIGINT)")
        for types, keys in _RANGE_SCOPES:
            cols, where = ", ".join(keys), f"event_type IN {types}"
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE rk AS SELECT {cols}, row_number() OVER (ORDER BY {cols}) - 1 AS ki "
                f"FROM (SELECT DISTINCT {cols} FROM launch_points UNION SELECT DISTINCT {cols} FROM nv WHERE {where})"
            )
            t0, t1, keys_n = con.execute(
                f"SELECT least((SELECT min(launch_ns) FROM launch_points), (SELECT min(start_ns) FROM nv WHERE {where})),"
                f" greatest((SELECT max(launch_ns) FROM launch_points), (SELECT max(end_ns) FROM nv WHERE {where})),"
                " (SELECT count(*) FROM rk)"
            ).fetchall()[0]
            if t0 is None or t1 is None:
                continue
            span = t1 - t0 + 1
            ranges = f"SELECT nv.nvtx_id, {{p}} AS ps, {{q}} AS pe FROM nv JOIN rk USING ({cols}) WHERE {where}"
            points = f"SELECT lp.gid, {{p}} AS pt FROM launch_points lp JOIN rk USING ({cols})"
            if keys_n * span < _MAX_PACKED:
                band = f"rk.ki * {span} - {t0}"
                con.execute(
                    "CREATE OR REPLACE TEMP TABLE pk_ranges AS "
                    + ranges.format(p=f"{band} + nv.start_ns", q=f"{band} + nv.end_ns")
                )
                con.execute(
                    "CREATE OR REPLACE TEMP TABLE pk_points AS "
                    + points.format(p=f"{band} + lp.launch_ns")
                )
                self._sliced_join()
            else:  # times too far apart to pack: an equality join (slower, same result)
                keys_eq = " AND ".join(f"l.{k} = r.{k}" for k in keys)
                con.execute(
                    f"INSERT INTO pairs SELECT r.nvtx_id, l.gid FROM (SELECT * FROM nv WHERE {where}) r "
                    f"JOIN launch_points l ON {keys_eq} AND l.launch_ns >= r.start_ns AND l.launch_ns < r.end_ns"
                )

    def _sliced_join(self) -> None:
        """``pairs`` += (range, point) of ``pk_ranges`` (``ps``, ``pe``) x ``pk_points``
        (``pt``) where ``ps <= pt < pe``, by slices of the points' values.

        Each point falls in one slice and each range joins the slices it
        overlaps, so every pair is found once; the inequality join of a slice
        holds a part of the tables instead of both whole (the ingest's peak
        memory was this join's).
        """
        con = self.con
        points = con.execute("SELECT count(*) FROM pk_points").fetchall()[0][0]
        slices = max(1, min(_MAX_SLICES, -(-points // _SLICE_POINTS)))
        cuts: list = []
        if slices > 1:
            quantiles = ", ".join(str(i / slices) for i in range(1, slices))
            cuts = sorted(
                {
                    row[0]
                    for row in con.execute(
                        f"SELECT unnest(quantile_disc(pt, [{quantiles}])) FROM pk_points"
                    ).fetchall()
                }
            )
        bounds = [None, *cuts, None]
        for lo, hi in itertools.pairwise(bounds):
            on_points = (
                " AND ".join([f"pt >= {lo}"] * (lo is not None) + [f"pt < {hi}"] * (hi is not None))
                or "true"
            )
            on_ranges = (
                " AND ".join([f"pe > {lo}"] * (lo is not None) + [f"ps < {hi}"] * (hi is not None))
                or "true"
            )
            con.execute(
                f"INSERT INTO pairs SELECT r.nvtx_id, l.gid FROM "
                f"(SELECT * FROM pk_ranges WHERE {on_ranges}) r JOIN "
                f"(SELECT * FROM pk_points WHERE {on_points}) l ON l.pt >= r.ps AND l.pt < r.pe"
            )
        con.execute("DROP TABLE pk_ranges; DROP TABLE pk_points")

    # -- what the caller needs to decide traces and ranks -------------------------------
    def unit_rows(self) -> list[tuple[int, int, int]]:
        """(process key, device, activity count) of every process/GPU that ran GPU work."""
        return self.con.execute(
            "SELECT gp, device, count(*) FROM g WHERE kind <> 'sync' GROUP BY ALL ORDER BY gp, device"
        ).fetchall()

    def idle_processes(self) -> list[int]:
        """Process keys with host events but no GPU activity (left out of the traces)."""
        rows = self.con.execute(
            "SELECT DISTINCT gp FROM (SELECT gp FROM api UNION SELECT gp FROM os UNION SELECT gp FROM nv) "
            "WHERE gp NOT IN (SELECT gp FROM g WHERE kind <> 'sync') ORDER BY gp"
        ).fetchall()
        return [r[0] for r in rows]

    def thread_name_rows(self) -> list[tuple[int, str]]:
        """NVTX thread names (eventType 39), e.g. ``MPI Rank 3``."""
        return self.con.execute("SELECT gp, text FROM thread_marks").fetchall()

    def nccl_init_payloads(self) -> list[tuple[int, str]]:
        """(process key, JSON payload) of NCCL-domain ``ncclCommInitRank*`` ranges."""
        return self.con.execute(
            "SELECT gp, json FROM nv WHERE domain = 'NCCL' AND json IS NOT NULL "
            "AND starts_with(name, 'ncclCommInit') ORDER BY start_ns"
        ).fetchall()

    def has_nccl(self) -> bool:
        """Whether the file shows NCCL: an NCCL NVTX domain or kernels launched inside one."""
        return self.con.execute(
            "SELECT EXISTS (SELECT 1 FROM nv WHERE domain = 'NCCL') OR EXISTS (SELECT 1 FROM nccl_of)"
        ).fetchall()[0][0]

    def counts(self) -> dict[str, int]:
        """GPU activities dropped (no valid timestamps), NVTX ranges never ended, graph rows."""
        row = self.con.execute("SELECT dropped, open_ranges, graphs FROM stats").fetchall()[0]
        return dict(zip(("dropped", "open_ranges", "graphs"), row, strict=True))

    # -- output ---------------------------------------------------------------------------
    def emit(
        self, units: list[dict[str, Any]], scratch: Path | None = None
    ) -> list[CanonicalTrace]:
        """The canonical tables of each unit (``tix, gp, device, split, trace_id, rank``).

        Called once, last: it drops the prepared event tables as soon as no
        later output needs them (only ``names``, ``stats`` and the small tables stay).
        With ``scratch`` (a folder: the ingest's staging folder), the two big
        tables, ``host`` and ``ranges``, are streamed from DuckDB straight to
        one Parquet file per trace there (``ingest.streamed``: batch by batch,
        never a whole table in Arrow) and the traces hold them as
        ``WrittenTable``; without, every table is returned in Arrow.
        """
        con = self.con
        con.register("units", pa.Table.from_pylist(units, schema=_UNITS_SCHEMA))
        con.register("nccl_payload", self._payload_table())
        con.execute(CORR_DEV_SQL)
        n = len(units)

        def drop(tables: tuple[str, ...]) -> None:
            """Drop the prepared tables no later query needs."""
            for table in tables:
                con.execute(f"DROP TABLE {table}")

        def rows_of(sql: str, *done: str) -> list[pa.Table]:
            """``sql``'s rows split by trace; then the tables ``done`` are dropped."""
            rows = _split(con.sql(sql).to_arrow_table(), n)
            drop(done)
            return rows

        def streamed(sql: str, order: str, table: str, *done: str) -> list[pa.Table | WrittenTable]:
            """``sql``'s rows (``ORDER BY order``) written per trace into ``scratch`` by DuckDB
            (``copyout``; else streamed through Arrow, ``streamed.write_split``); without
            ``scratch``, as ``rows_of``."""
            ordered = f"{sql} ORDER BY {order}"
            if scratch is None:
                return rows_of(ordered, *done)
            paths = [scratch / f".nsys-{u['trace_id']}-{table}.parquet" for u in units]
            written = copy_split(con, sql, order, table, paths)
            if written is None:
                reader = _reader(con.sql(ordered))
                written = write_split(reader, table, paths)
                if written is None:
                    written = _split(reader.read_all(), n)
            drop(done)
            return written

        # The tables written to files first: the Arrow rows of gpu and collectives are not
        # held while DuckDB sorts and writes them (the ingest's peak memory).
        further = {r.table: rows_of(r.out_sql) for r in self.further}  # while api etc. are there
        host = streamed(HOST_OUT_SQL, HOST_ORDER, "host", "api", "os", "corr_dev")
        ranges = streamed(RANGES_OUT_SQL, RANGES_ORDER, "ranges", "nv", "proj")
        gpu = rows_of(GPU_OUT_SQL)
        collectives = rows_of(COLLECTIVES_OUT_SQL, "nccl_of", "g")
        threads = rows_of(THREADS_OUT_SQL)
        names = con.sql("SELECT name_id, name FROM names ORDER BY name_id").to_arrow_table()
        out = []
        for i, unit in enumerate(units):
            used = pc.unique(
                pa.chunked_array(
                    [
                        chunk
                        for t in (gpu[i], host[i], ranges[i], collectives[i])
                        for chunk in _name_ids(t).chunks
                    ],
                    type=pa.int32(),
                )
            )
            mine = names.filter(pc.is_in(names["name_id"], value_set=used))
            ids = pa.array([unit["trace_id"]] * mine.num_rows, pa.string())
            out.append(
                CanonicalTrace(
                    gpu=gpu[i],
                    host=host[i],
                    ranges=ranges[i],
                    collectives=collectives[i],
                    names=mine.add_column(0, "trace_id", ids),
                    threads=threads[i],
                    devices=pa.table({}),  # filled by the caller (device limits)
                    event_count=gpu[i].num_rows + host[i].num_rows,
                )
            )
            for table, rows in further.items():
                setattr(out[-1], table, rows[i])
        return out

    def _payload_table(self) -> pa.Table:
        """NCCL payload fields (JSON payloads, only exported with ``--include-json``)."""
        rows = self.con.execute(
            "SELECT nvtx_id, json FROM nv WHERE domain = 'NCCL' AND json IS NOT NULL"
        ).fetchall()
        parsed = []
        size_of: dict[str, int] = {}  # communicator -> ranks, from its init payload
        for nvtx_id, payload in rows:
            fields = payload_fields(payload)
            comm = fields.get("nccl communicator id")
            comm = None if comm is None else str(comm)
            nranks = _int(fields.get("no. of ranks"))
            if comm is not None and nranks is not None:
                size_of.setdefault(comm, nranks)
            parsed.append((nvtx_id, comm, nranks, _int(fields.get("message size [bytes]"))))
        cols: dict[str, list] = {"nvtx_id": [], "comm": [], "nranks": [], "msg_bytes": []}
        for nvtx_id, comm, nranks, nbytes in parsed:
            cols["nvtx_id"].append(nvtx_id)
            cols["comm"].append(comm)
            cols["nranks"].append(nranks if nranks is not None else size_of.get(comm))
            cols["msg_bytes"].append(nbytes)
        return pa.table(cols, schema=_PAYLOAD_SCHEMA)


_UNITS_SCHEMA = pa.schema(
    [("tix", pa.int32()), ("gp", pa.int64()), ("device", pa.int32()), ("split", pa.bool_()),
     ("trace_id", pa.string()), ("rank", pa.int32())]
)  # fmt: skip
_PAYLOAD_SCHEMA = pa.schema(
    [("nvtx_id", pa.int64()), ("comm", pa.string()), ("nranks", pa.int64()),
     ("msg_bytes", pa.int64())]
)  # fmt: skip


def _reader(relation: duckdb.DuckDBPyRelation) -> pa.RecordBatchReader:
    """The relation's rows as Arrow batches of ``streamed.BATCH_ROWS`` (DuckDB < 1.4: the older name)."""
    method = getattr(relation, "to_arrow_reader", None) or relation.fetch_record_batch
    return method(STREAM_BATCH_ROWS)


def _name_ids(table: pa.Table | WrittenTable) -> pa.ChunkedArray:
    """The ``name_id`` values of a table (of a streamed one: the distinct ones it recorded)."""
    if isinstance(table, WrittenTable):
        return pa.chunked_array([table.name_ids], type=pa.int32())
    return table["name_id"]


def _loaded(table: pa.Table | Callable[[], pa.Table]) -> pa.Table:
    return table() if callable(table) else table


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _split(table: pa.Table, n: int) -> list[pa.Table]:
    """Slices of a table sorted by ``tix``, one per trace, without the ``tix`` column."""
    tix = table.column("tix").to_numpy() if table.num_rows else np.zeros(0, dtype=np.int32)
    bounds = np.searchsorted(tix, np.arange(n + 1), side="left")
    body = table.drop_columns(["tix"])
    return [body.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])) for i in range(n)]
