"""Turn decoded Kineto events into the canonical tables (docs/schema.md).

All the per-event work is SQL over the Arrow table from ``decode``
(DuckDB, columnar): category mapping across the 2021 and current schemas,
exact text -> integer-nanosecond conversion (for the spellings the decoder
left as text), memcpy kinds, communication detection and the collectives
table; names are interned with Arrow compute. Python only handles the small
header (devices, rank). Rows with equal sort keys keep their file order.
"""

from __future__ import annotations

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
    gpu_rows,
)
from stallscope.ingest.startup import duckdb_threads

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


def to_canonical(decoded: KinetoDecoded, trace_id: str, rank: int) -> CanonicalTrace:
    """Canonical tables for one decoded Kineto trace (``decode.KinetoDecoded``)."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())  # see decode.decode_kineto
    try:
        return _to_canonical(decoded, trace_id, rank)
    finally:
        pa.set_memory_pool(previous)


def _to_canonical(decoded: KinetoDecoded, trace_id: str, rank: int) -> CanonicalTrace:
    events, gpu_args, header = decoded.events, decoded.gpu_args, decoded.header
    con = duckdb.connect(config={"threads": duckdb_threads()})
    try:
        con.execute(MACROS_SQL)
        # Interned names: distinct, in byte order (DuckDB's ORDER BY for text),
        # over every event (also those no query reads: flows, instants).
        every_name = pa.chunked_array(
            events["name"].chunks + decoded.others["name"].chunks, pa.string()
        )
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
        rows = _RowFilter(events)
        tid = trace_id.replace("'", "")
        # The GPU activities with their args: the decoder kept the args for these rows only.
        on_gpu = gpu_rows(events["cat"])
        gpu_events = events.select(_COMMON).filter(on_gpu)
        for column in gpu_args.column_names:
            gpu_events = gpu_events.append_column(column, gpu_args[column])

        def query(
            sql: str, mask: pa.ChunkedArray, on_gpu_rows: bool = False, host: bool = False
        ) -> pa.Table:
            # Each query gets only its own rows, copied out of the Arrow table
            # in Arrow (a superset of its WHERE clause); nothing else is kept.
            if on_gpu_rows:
                table, view, selected = "evg_rows", _EVG, gpu_events.filter(mask.filter(on_gpu))
            else:
                # The decoder drops the shapes columns when no row has them: nulls here.
                shapes = host and _SHAPES[0] in events.column_names
                table, view = "evn_rows", _EVH if shapes else _EVN_NO_SHAPES if host else _EVN
                selected = events.select(_COMMON + _SHAPES if shapes else _COMMON).filter(mask)
            con.register(table, selected)
            try:
                return con.sql(view + sql).to_arrow_table()
            finally:
                con.unregister(table)

        gpu = query(_GPU_SQL.format(trace_id=tid), rows.complete(*GPU_KINDS), on_gpu_rows=True)
        collectives = query(
            _COLLECTIVES_SQL.format(trace_id=tid, rank=int(rank)),
            rows.complete("kernel"),
            on_gpu_rows=True,
        )
        gpu_events = None  # free the copy before the other queries
        host = query(_HOST_SQL.format(trace_id=tid), rows.complete(*HOST_KINDS), host=True)
        ranges = query(_RANGES_SQL.format(trace_id=tid), rows.ranges())
        threads = query(_THREADS_SQL.format(trace_id=tid), rows.metadata)
        untimed = query(
            "SELECT count(*) AS n FROM evn WHERE ph = 'X' AND start_ns IS NULL", rows.untimed()
        )
        dropped = untimed["n"][0].as_py()
    finally:
        con.close()
    metadata = pc.sum(rows.metadata).as_py() or 0
    names = names.append_column("trace_id", pa.array([trace_id] * names.num_rows, pa.string()))
    return CanonicalTrace(
        gpu=gpu,
        host=host,
        ranges=ranges,
        collectives=collectives,
        names=names.select(["trace_id", "name_id", "name"]),
        threads=threads,
        devices=devices_table(trace_id, header.get("deviceProperties")),
        event_count=events.num_rows + decoded.others.num_rows - metadata,
        dropped_events=int(dropped),
    )


_RAW_TIMES = f"""
  coalesce(ts_fast_ns, {_ns_sql("ts_txt")}) AS start_ns,
  coalesce(dur_fast_ns, {_ns_sql("dur_txt")}, 0) AS dur_ns,"""

_COMMON = [
    "ph", "cat", "name", "pid", "tid", "ts_txt", "ts_fast_ns", "dur_txt", "dur_fast_ns",
    "device", "stream", "correlation", "external_id", "meta_name", "name_id", "event_index",
]  # fmt: skip
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
_EVH = _evn_view(", input_dims, input_types")  # with the operators' input shapes: host rows
_EVN_NO_SHAPES = _evn_view(  # host rows of a trace without input shapes
    ", CAST(NULL AS VARCHAR) AS input_dims, CAST(NULL AS VARCHAR) AS input_types"
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


class _RowFilter:
    """Arrow masks that keep at least the rows each query's WHERE clause keeps.

    Categories are compared lower-cased in ASCII; any non-ASCII category is
    kept (DuckDB's Unicode ``lower`` then decides), as are null timestamps.
    """

    def __init__(self, events: pa.Table):
        self.events = events
        self.complete_rows = pc.equal(events["ph"], "X")
        self.metadata = pc.equal(events["ph"], "M")
        self.lowered = pc.ascii_lower(events["cat"])
        self.odd = pc.invert(pc.string_is_ascii(events["cat"]))

    def _kept(self, wanted: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.and_kleene(self.complete_rows, pc.or_kleene(wanted, self.odd)).fill_null(False)

    def complete(self, *categories: str) -> pa.ChunkedArray:
        return self._kept(pc.is_in(self.lowered, value_set=pa.array(categories, pa.string())))

    def ranges(self) -> pa.ChunkedArray:
        annotation = pc.is_in(
            self.lowered, value_set=pa.array(["user_annotation", "gpu_user_annotation"])
        )
        step = pc.and_(
            pc.is_in(self.lowered, value_set=pa.array(["cpu_op", "operator"])),
            pc.starts_with(self.events["name"], pattern="ProfilerStep#"),
        )
        return self._kept(pc.or_kleene(annotation, step))

    def untimed(self) -> pa.ChunkedArray:
        return pc.and_(self.complete_rows, pc.is_null(self.events["ts_fast_ns"]))


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
FROM evn
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
