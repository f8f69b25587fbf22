"""Turn decoded Kineto events into the canonical tables (docs/schema.md).

All the per-event work is SQL over the Arrow table from ``decode``
(DuckDB, columnar): category mapping across the 2021 and current schemas,
exact text -> integer-nanosecond conversion (for the spellings the decoder
left as text), memcpy kinds, communication detection and the collectives
table; names are interned with Arrow compute. Python only handles the small
header (devices, rank). Rows with equal sort keys keep their file order.

Given a scratch folder (the ingest's staging folder), the two tables that
can be big, ``host`` and ``ranges``, go from DuckDB straight to Parquet
batch by batch (``ingest.streamed.write_split``, as nsys's do) instead of
being materialised in Arrow, and the host query, the last, consumes the
decoded rows as it scans them: its input is freed while DuckDB sorts.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallscope.ingest.canonical import CanonicalTrace, devices_table
from stallscope.ingest.comm import COMM_NAME_REGEX, MACROS_SQL
from stallscope.ingest.kineto.decode import (
    GPU_ARG_COLUMNS,
    SHAPE_COLUMNS,
    KinetoDecoded,
    empty_decoded,
    gpu_rows,
)
from stallscope.ingest.startup import duckdb_threads, give_back_freed_memory
from stallscope.ingest.streamed import BATCH_ROWS, WrittenTable, write_split

# Lower-cased Kineto category -> canonical kind.
GPU_KINDS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "sync",
}
HOST_KINDS = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "driver",
    "python_function": "python",
    "user_annotation": "annotation",
    "overhead": "overhead",
    "mtia_runtime": "runtime",
}
# Categories that are neither activities nor ranges (flows, instants, overlays).
IGNORED_CATS = (
    "ac2g",
    "async",
    "async_cpu_to_gpu",
    "async_gpu",
    "fwdbwd",
    "critical_path",
    "trace",
    "cpu_instant_event",
)


# DuckDB hands freed memory back to the system as soon as it can (its defaults keep up to
# 128 MB, or 512 MB after a bulk free, for reuse): ~25 MB less at the peak of a 486 MB trace.
_DUCKDB_GIVES_BACK = {
    "allocator_flush_threshold": "1MB",
    "allocator_bulk_deallocation_flush_threshold": "1MB",
}


def _map_sql(column: str, mapping: dict[str, str]) -> str:
    cases = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in mapping.items())
    return f"CASE {column} {cases} ELSE NULL END"


def _ns_sql(column: str) -> str:
    """Exact µs text -> int64 ns; falls back to double for exotic spellings."""
    txt = f"trim({column}, '\" ')"
    return (
        f"coalesce(TRY_CAST(round(TRY_CAST({txt} AS DECIMAL(38,6)) * 1000) AS BIGINT),"
        f" TRY_CAST(round(TRY_CAST({txt} AS DOUBLE) * 1000) AS BIGINT))"
    )


def _id_sql(column: str) -> str:
    """pid/tid text -> BIGINT; non-numeric labels get a stable 62-bit hash."""
    return f"coalesce(TRY_CAST({column} AS BIGINT), CAST(hash({column}) % 4611686018427387903 AS BIGINT))"


def to_canonical(
    decoded: KinetoDecoded, trace_id: str, rank: int, scratch: Path | None = None
) -> CanonicalTrace:
    """Canonical tables for one decoded Kineto trace (``decode.KinetoDecoded``).

    Consumes ``decoded``'s tables: ``events``, ``gpu_args`` and ``others`` are
    emptied (``decode.empty_decoded``'s) while the queries run, each column let
    go once no query left reads it (the peak of a big ingest; ``header`` and
    ``warnings`` stay). With ``scratch`` (a folder on the store's filesystem),
    ``host`` and ``ranges`` are written there as Parquet while queried and the
    trace holds them as ``streamed.WrittenTable`` (module docstring); without,
    every table is returned in Arrow. The rows are the same either way."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())  # see decode.decode_kineto
    try:
        return _to_canonical(decoded, trace_id, rank, scratch)
    finally:
        pa.set_memory_pool(previous)


def _consumed(rows: list[pa.Table]) -> pa.RecordBatchReader:
    """The one table in ``rows`` (taken out of the list) as a reader that lets each batch go
    once read: DuckDB scanning it frees the rows as its sort copies them in."""
    table = rows.pop()
    schema, batches = table.schema, table.to_batches()
    del table
    batches.reverse()

    def each():
        while batches:
            yield batches.pop()

    return pa.RecordBatchReader.from_batches(schema, each())


def _reader(relation: duckdb.DuckDBPyRelation) -> pa.RecordBatchReader:
    """The relation's rows as Arrow batches of ``streamed.BATCH_ROWS`` (DuckDB < 1.4: the older name)."""
    method = getattr(relation, "to_arrow_reader", None) or relation.fetch_record_batch
    return method(BATCH_ROWS)


def _to_canonical(
    decoded: KinetoDecoded, trace_id: str, rank: int, scratch: Path | None
) -> CanonicalTrace:
    events, gpu_args, others, header = (
        decoded.events, decoded.gpu_args, decoded.others, decoded.header
    )  # fmt: skip
    empty = empty_decoded()
    decoded.events, decoded.gpu_args, decoded.others = empty.events, empty.gpu_args, empty.others
    con = duckdb.connect(config={"threads": duckdb_threads(), **_DUCKDB_GIVES_BACK})
    try:
        con.execute(MACROS_SQL)
        # DuckDB draws a progress bar on the terminal for a query past 2 s (a big trace's
        # sorts on a busy machine): never in the middle of the ingest's own output.
        con.execute("SET enable_progress_bar = false")
        # Interned names: distinct, in byte order (DuckDB's ORDER BY for text),
        # over every event (also those no query reads: flows, instants).
        every_name = pa.chunked_array(events["name"].chunks + others["name"].chunks, pa.string())
        other_events = others.num_rows
        del others
        distinct = pc.unique(every_name).drop_null()
        distinct = distinct.take(pc.sort_indices(distinct))
        names = pa.table(
            {"name_id": pa.array(np.arange(len(distinct), dtype=np.int32)), "name": distinct}
        )
        where = pc.index_in(events["name"], value_set=distinct)
        events = events.append_column("name_id", where.cast(pa.int32()))
        # File order breaks ties in every ORDER BY, so the output never depends
        # on threads or chunking.
        lengths = [len(chunk) for chunk in events["ph"].chunks]
        index = np.split(np.arange(events.num_rows), np.cumsum(lengths)[:-1])
        events = events.append_column("event_index", pa.chunked_array(index, pa.int64()))
        del every_name, where, index
        tid = trace_id.replace("'", "")
        # The GPU activities with their args: the decoder kept the args for these rows only.
        gpu_events = events.select(_GPU_COMMON).filter(gpu_rows(events["cat"]))
        for column in gpu_args.column_names:
            gpu_events = gpu_events.append_column(column, gpu_args[column])
        del gpu_args

        def query(
            sql: str, table: str, view: str, rows: pa.Table | pa.RecordBatchReader, out: str = ""
        ) -> pa.Table | WrittenTable:
            # DuckDB scans the Arrow rows in place, only the columns it reads (its WHERE
            # picks the rows). Freed memory is given back to the system between
            # queries (the next one's peak starts lower). ``out``: the canonical table,
            # written to ``scratch`` as it comes when there is one.
            con.register(table, rows)
            del rows
            try:
                relation = con.sql(view + sql)
                if not out or scratch is None:
                    return relation.to_arrow_table()
                reader = _reader(relation)
                path = scratch / f".kineto-{tid}-{out}.parquet"
                written = write_split(reader, out, [path])
                return written[0] if written is not None else reader.read_all()
            finally:
                con.unregister(table)
                give_back_freed_memory()

        # The GPU queries read the one copy of the GPU rows joined with their args.
        gpu = query(_GPU_SQL.format(trace_id=tid), "evg_rows", _EVG, gpu_events)
        collectives = query(
            _COLLECTIVES_SQL.format(trace_id=tid, rank=int(rank)), "evg_rows", _EVG, gpu_events
        )
        del gpu_events
        ranges = query(
            _RANGES_SQL.format(trace_id=tid), "evn_rows", _EVN, events.select(_COMMON), "ranges"
        )
        threads = query(_THREADS_SQL.format(trace_id=tid), "evn_rows", _EVN, events.select(_COMMON))
        untimed = query(
            "SELECT count(*) AS n FROM evn WHERE ph = 'X' AND start_ns IS NULL",
            "evn_rows",
            _EVN,
            events.select(_COMMON),
        )
        metadata = pc.sum(pc.equal(events["ph"], "M")).as_py() or 0
        event_count = events.num_rows + other_events - metadata
        # The host query last, on the columns it reads alone: the others are let go first,
        # and these as DuckDB reads them (``_consumed``: nothing else holds them then).
        # The decoder drops the shapes columns when no row has them: nulls here.
        shapes = _SHAPES[0] in events.column_names
        host_rows = [events.select(_HOST_COLUMNS + _SHAPES if shapes else _HOST_COLUMNS)]
        del events
        host = query(
            _HOST_SQL.format(trace_id=tid),
            "evh_rows",
            _EVH if shapes else _EVH_NO_SHAPES,
            _consumed(host_rows),
            "host",
        )
        dropped = untimed["n"][0].as_py()
    finally:
        con.close()
    names = names.append_column("trace_id", pa.array([trace_id] * names.num_rows, pa.string()))
    return CanonicalTrace(
        gpu=gpu,
        host=host,
        ranges=ranges,
        collectives=collectives,
        names=names.select(["trace_id", "name_id", "name"]),
        threads=threads,
        devices=devices_table(trace_id, header.get("deviceProperties")),
        event_count=event_count,
        dropped_events=int(dropped),
    )


_RAW_TIMES = f"""
  coalesce(ts_fast_ns, {_ns_sql("ts_txt")}) AS start_ns,
  coalesce(dur_fast_ns, {_ns_sql("dur_txt")}, 0) AS dur_ns,"""

_COMMON = [
    "ph", "cat", "name", "pid", "tid", "ts_txt", "ts_fast_ns", "dur_txt", "dur_fast_ns",
    "device", "stream", "correlation", "external_id", "meta_name", "name_id", "event_index",
]  # fmt: skip
_GPU_COMMON = [c for c in _COMMON if c != "meta_name"]  # what the GPU queries read
_GPU_ARGS = list(GPU_ARG_COLUMNS)
_SHAPES = list(SHAPE_COLUMNS)  # operator input shapes (JSON text), host rows only


# ``evn`` (rows with the columns every event has) and ``evg`` (GPU activities,
# with their launch, copy and collective args): each query below reads one of
# them, over the rows registered for that query alone.
def _evn_view(extra: str = "") -> str:
    """The ``evn`` CTE; ``extra`` adds columns (``, a, b``)."""
    return f"""WITH evn AS (
SELECT
  ph,
  lower(coalesce(cat, '')) AS cat,
  name,
  pid, tid,{_RAW_TIMES}
  device, stream, correlation, external_id,
  meta_name,
  name_id,
  event_index{extra}
FROM evn_rows)
"""


_EVN = _evn_view()
# What the host query reads (``evh``): no name (the name_id), device, stream or meta_name.
_HOST_COLUMNS = [
    "ph", "cat", "pid", "tid", "ts_txt", "ts_fast_ns", "dur_txt", "dur_fast_ns",
    "correlation", "external_id", "name_id", "event_index",
]  # fmt: skip


def _evh_view(shapes: str) -> str:
    """The ``evh`` CTE (host rows: :data:`_HOST_COLUMNS`); ``shapes`` gives the input shapes."""
    return f"""WITH evh AS (
SELECT
  ph,
  lower(coalesce(cat, '')) AS cat,
  pid, tid,{_RAW_TIMES}
  correlation, external_id,
  name_id,
  event_index,
  {shapes}
FROM evh_rows)
"""


_EVH = _evh_view("input_dims, input_types")  # with the operators' input shapes
_EVH_NO_SHAPES = _evh_view(  # a trace without input shapes
    "CAST(NULL AS VARCHAR) AS input_dims, CAST(NULL AS VARCHAR) AS input_types"
)
_EVG = f"""WITH evg AS (
SELECT
  ph,
  lower(coalesce(cat, '')) AS cat,
  name,
  pid, tid,{_RAW_TIMES}
  device, stream, correlation, external_id,
  {", ".join(_GPU_ARGS)},
  name_id,
  event_index
FROM evg_rows)
"""


_GPU_SQL = f"""
SELECT
  '{{trace_id}}' AS trace_id,
  CAST(coalesce(device, TRY_CAST(pid AS BIGINT), -1) AS INTEGER) AS device,
  coalesce(TRY_CAST(stream AS BIGINT), TRY_CAST(regexp_extract(tid, '(-?\\d+)', 1) AS BIGINT), -1) AS stream,
  {_map_sql("cat", GPU_KINDS)} AS kind,
  start_ns,
  start_ns + greatest(dur_ns, 0) AS end_ns,
  name_id,
  correlation,
  external_id,
  CAST(grid_x AS INTEGER) AS grid_x, CAST(grid_y AS INTEGER) AS grid_y, CAST(grid_z AS INTEGER) AS grid_z,
  CAST(block_x AS INTEGER) AS block_x, CAST(block_y AS INTEGER) AS block_y, CAST(block_z AS INTEGER) AS block_z,
  CAST(registers AS INTEGER) AS registers_per_thread,
  shared_memory AS shared_mem_bytes,
  CAST(NULL AS BIGINT) AS static_shared_mem_bytes,
  CAST(NULL AS BIGINT) AS dynamic_shared_mem_bytes,
  bytes,
  CASE WHEN cat IN ('gpu_memcpy', 'memcpy') THEN
    nullif(coalesce(nullif(regexp_extract(name, 'Memcpy (\\w+)', 1), ''), kind), '') END AS copy_kind,
  CASE WHEN cat IN ('gpu_memcpy', 'memcpy') THEN
    nullif(lower(regexp_extract(name, '\\((\\w+) -> (\\w+)\\)', 1)), '') END AS src_kind,
  CASE WHEN cat IN ('gpu_memcpy', 'memcpy') THEN
    nullif(lower(regexp_extract(name, '\\((\\w+) -> (\\w+)\\)', 2)), '')
       WHEN cat IN ('gpu_memset', 'memset') THEN
    nullif(lower(regexp_extract(name, 'Memset \\((\\w+)\\)', 1)), '') END AS dst_kind,
  CASE WHEN cat = 'cuda_sync' THEN
    replace(lower(coalesce(sync_kind, name)), ' ', '_') END AS sync_kind,
  est_occupancy AS est_occupancy_pct,
  blocks_per_sm,
  warps_per_sm,
  (cat = 'kernel' AND (collective IS NOT NULL OR regexp_matches(name, '{COMM_NAME_REGEX}'))) AS is_comm
FROM evg
WHERE ph = 'X' AND cat IN ({", ".join(f"'{c}'" for c in GPU_KINDS)}) AND start_ns IS NOT NULL
ORDER BY device, start_ns, event_index
"""

_HOST_SQL = f"""
SELECT
  '{{trace_id}}' AS trace_id,
  {_id_sql("pid")} AS pid,
  {_id_sql("tid")} AS tid,
  {_map_sql("cat", HOST_KINDS)} AS kind,
  start_ns,
  start_ns + greatest(dur_ns, 0) AS end_ns,
  name_id,
  correlation,
  external_id,
  input_dims,
  input_types
FROM evh
WHERE ph = 'X' AND cat IN ({", ".join(f"'{c}'" for c in HOST_KINDS)}) AND start_ns IS NOT NULL
ORDER BY pid, tid, start_ns, event_index
"""

_RANGES_SQL = """
SELECT
  '{trace_id}' AS trace_id,
  CASE WHEN cat = 'gpu_user_annotation' THEN 'gpu_annotation'
       WHEN regexp_matches(name, '^ProfilerStep#\\d+$') THEN 'step'
       ELSE 'annotation' END AS kind,
  name_id,
  CAST(NULL AS VARCHAR) AS domain,
  CASE WHEN cat = 'gpu_user_annotation' THEN NULL ELSE coalesce(TRY_CAST(pid AS BIGINT), CAST(hash(pid) % 4611686018427387903 AS BIGINT)) END AS pid,
  CASE WHEN cat = 'gpu_user_annotation' THEN NULL ELSE coalesce(TRY_CAST(tid AS BIGINT), CAST(hash(tid) % 4611686018427387903 AS BIGINT)) END AS tid,
  CASE WHEN cat = 'gpu_user_annotation' THEN CAST(coalesce(device, TRY_CAST(pid AS BIGINT)) AS INTEGER) END AS device,
  CASE WHEN cat = 'gpu_user_annotation' THEN coalesce(TRY_CAST(stream AS BIGINT), TRY_CAST(tid AS BIGINT)) END AS stream,
  start_ns,
  start_ns + greatest(dur_ns, 0) AS end_ns,
  TRY_CAST(regexp_extract(name, '^ProfilerStep#(\\d+)$', 1) AS BIGINT) AS step,
  external_id
FROM evn
WHERE ph = 'X' AND start_ns IS NOT NULL AND (
  cat = 'gpu_user_annotation'
  OR cat = 'user_annotation'
  OR (cat IN ('cpu_op', 'operator') AND regexp_matches(name, '^ProfilerStep#\\d+$')))
ORDER BY start_ns, event_index
"""

_COLLECTIVES_SQL = f"""
SELECT
  '{{trace_id}}' AS trace_id,
  {{rank}} AS rank,
  CAST(coalesce(device, TRY_CAST(pid AS BIGINT), -1) AS INTEGER) AS device,
  coalesce(TRY_CAST(stream AS BIGINT), TRY_CAST(regexp_extract(tid, '(-?\\d+)', 1) AS BIGINT), -1) AS stream,
  pg_name,
  pg_desc,
  pg_ranks,
  CAST(group_size AS INTEGER) AS group_size,
  seq,
  CAST(row_number() OVER (PARTITION BY coalesce(pg_name, ''), device ORDER BY start_ns, event_index) - 1 AS BIGINT) AS order_in_group,
  stallscope_coll_op(collective, name) AS op,
  in_nelems,
  out_nelems,
  dtype,
  in_nelems * stallscope_dtype_bytes(dtype) AS in_bytes,
  out_nelems * stallscope_dtype_bytes(dtype) AS out_bytes,
  start_ns,
  start_ns + greatest(dur_ns, 0) AS end_ns,
  name_id,
  correlation,
  external_id,
  collective IS NOT NULL AS from_metadata
FROM evg
WHERE ph = 'X' AND cat = 'kernel' AND start_ns IS NOT NULL
  AND (collective IS NOT NULL OR regexp_matches(name, '{COMM_NAME_REGEX}'))
ORDER BY start_ns, event_index
"""

_THREADS_SQL = f"""
SELECT trace_id, pid, tid, kind, name
FROM (
  SELECT
    '{{trace_id}}' AS trace_id,
    {_id_sql("pid")} AS pid,
    CASE WHEN name = 'thread_name' THEN {_id_sql("tid")} END AS tid,
    CASE WHEN name = 'process_name' THEN 'process' ELSE 'thread' END AS kind,
    meta_name AS name,
    event_index
  FROM evn
  WHERE ph = 'M' AND name IN ('process_name', 'thread_name') AND meta_name IS NOT NULL
) AS t
QUALIFY row_number() OVER (PARTITION BY t.pid, t.tid, t.kind, t.name ORDER BY t.event_index) = 1
ORDER BY event_index
"""
