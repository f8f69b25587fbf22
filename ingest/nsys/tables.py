"""Read the nsys tables stallscope uses into raw Arrow tables (one SQL read each).

Which table and column each raw column comes from is documented in
docs/formats/nsys.md; a column the file lacks reads as NULL. Conventions of the
raw tables (consumed by ``canonical``):

* times (``start``, ``end``) are the file's integer nanoseconds, untouched;
* ``gp`` is the process key ``globalTid >> 24`` / ``globalPid >> 24`` (hardware,
  VM and process id: unique across the hosts of a merged report), ``tid`` the
  thread id ``globalTid & 0xFFFFFF``;
* names are a StringIds id (``name_id``) or, in exports that inline them, text
  (``name_txt``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stallscope.ingest.nsys.db import NsysDb

I64 = pa.int64()
STR = pa.string()
# eventType of NVTX_EVENTS rows read: ranges (59 push/pop, 60 start/end, 70/71
# their NVTXT-imported forms), 75 domain creation (domain names), 39 thread naming.
NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_TYPES = (*NVTX_RANGE_TYPES, 75, 39)

ACT_SCHEMA = pa.schema(
    [("kind", STR), ("start", I64), ("end", I64), ("device", I64), ("context", I64), ("stream", I64),
     ("correlation", I64), ("gp", I64), ("name_id", I64), ("name_txt", STR),
     ("grid_x", I64), ("grid_y", I64), ("grid_z", I64),
     ("block_x", I64), ("block_y", I64), ("block_z", I64), ("registers", I64),
     ("smem_static", I64), ("smem_dynamic", I64), ("bytes", I64),
     ("copy_id", I64), ("src_id", I64), ("dst_id", I64), ("sync_id", I64)]
)  # fmt: skip
GPU_TABLES = {
    "kernel": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
    "sync": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    # Whole-graph executions, recorded instead of the graph's kernels when CUDA
    # graphs are traced at graph level (--cuda-graph-trace=graph, the default).
    "graph": "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
}
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_TID_MASK = 0xFFFFFF  # the thread id bits of a serialized GlobalId


def _fetch_split(
    db: NsysDb, build: Callable[[], str], schema: pa.Schema, table: str | None = None
) -> pa.Table:
    """Rows of ``build()``'s query as ``schema``, ``gp`` and ``tid`` from one serialized GlobalId.

    The query (made by ``build``, see ``NsysDb.fetch_fast``) selects the
    GlobalId (as an integer or NULL) once, where ``schema``
    has ``gp, tid``; it is split here with Arrow (``>> 24``, ``& 0xFFFFFF``: the
    same arithmetic shift and mask as SQLite's), instead of twice in SQL: one
    integer less per row to build in Python, a large part of reading big tables.
    """
    at = schema.get_field_index("gp")  # ``tid`` follows it
    fetched = pa.schema([*schema][:at] + [pa.field("g", I64)] + [*schema][at + 2 :])
    rows = db.fetch_fast(build, fetched, table=table)
    g = rows.column(at)
    rows = rows.remove_column(at)
    rows = rows.add_column(at, "tid", pc.bit_wise_and(g, _TID_MASK))
    return rows.add_column(at, "gp", pc.shift_right(g, 24)).cast(schema)


def read_activities(db: NsysDb) -> pa.Table:
    """Kernels, memcpys, memsets and synchronizations in one table (``ACT_SCHEMA``)."""
    parts = []
    for kind, table in GPU_TABLES.items():
        if not db.has(table):
            continue
        part = db.fetch_fast(
            lambda k=kind, t=table: _activity_sql(db, k, t), _activity_schema(kind), table=table
        )
        if "gp" in part.column_names:  # the GlobalPid's process key, shifted here (as in SQLite)
            part = part.set_column(
                part.schema.get_field_index("gp"), "gp", pc.shift_right(part["gp"], 24)
            )
        n = part.num_rows
        parts.append(
            pa.table(
                [
                    pa.array([kind] * n, STR) if f.name == "kind"
                    else part[f.name] if f.name in part.column_names
                    else pa.nulls(n, f.type)
                    for f in ACT_SCHEMA
                ],
                schema=ACT_SCHEMA,
            )
        )  # fmt: skip
    return pa.concat_tables(parts) if parts else ACT_SCHEMA.empty_table()


_ACT_COLUMNS = {
    "kernel": ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers",
               "smem_static", "smem_dynamic"),
    "memcpy": ("bytes", "copy_id", "src_id", "dst_id"),
    "memset": ("bytes", "dst_id"),
    "sync": ("sync_id",),
    "graph": (),
}  # fmt: skip
_ACT_COMMON = (
    "start",
    "end",
    "device",
    "context",
    "stream",
    "correlation",
    "gp",
    "name_id",
    "name_txt",
)


def _activity_schema(kind: str) -> pa.Schema:
    """The columns read from one GPU activity table (the others are added as nulls)."""
    wanted = set(_ACT_COMMON) | set(_ACT_COLUMNS[kind])
    if kind not in ("kernel", "graph"):
        wanted -= {"name_id", "name_txt"}
    if kind == "graph":
        wanted -= {"name_txt"}
    return pa.schema([f for f in ACT_SCHEMA if f.name in wanted])


def _activity_sql(db: NsysDb, kind: str, table: str) -> str:
    """SELECT of one GPU activity table's columns, in ``_activity_schema(kind)`` order."""
    c = lambda *names: db.int_col(table, *names)  # noqa: E731
    name_id, name_txt = ("NULL", "NULL")
    if kind == "kernel":
        name_id, name_txt = db.name_ref(table, "demangledName", "shortName", "mangledName")
    if kind == "graph":  # no name: ``name_id`` carries the graph id for the synthetic name
        name_id = c("graphId")
    cols = {
        "kind": f"'{kind}'",
        "start": c("start"),
        "end": c("end"),
        "device": c("deviceId"),
        "context": c("contextId"),
        "stream": c("streamId"),
        "correlation": f"nullif({c('correlationId')}, 0)",
        "gp": c("globalPid"),  # the whole GlobalPid: shifted by the caller
        "name_id": name_id,
        "name_txt": name_txt,
    }
    if kind == "kernel":
        cols.update(
            grid_x=c("gridX"), grid_y=c("gridY"), grid_z=c("gridZ"),
            block_x=c("blockX"), block_y=c("blockY"), block_z=c("blockZ"),
            registers=c("registersPerThread"),
            smem_static=c("staticSharedMemory"), smem_dynamic=c("dynamicSharedMemory"),
        )  # fmt: skip
    if kind in ("memcpy", "memset"):
        cols["bytes"] = c("bytes")
    if kind == "memcpy":
        cols.update(copy_id=c("copyKind"), src_id=c("srcKind"), dst_id=c("dstKind"))
    if kind == "memset":
        cols["dst_id"] = c("memKind")
    if kind == "sync":
        cols["sync_id"] = c("syncType")
    # Read only this table's columns; the others are added as nulls (cheaper than reading NULLs).
    select = ", ".join(f"{cols[f.name]} AS {f.name}" for f in _activity_schema(kind))
    return f"SELECT {select} FROM {db.ref(table)}"


def read_runtime(db: NsysDb) -> pa.Table:
    """CUDA runtime and driver API calls (``eventClass`` kept as ``api_class``)."""
    schema = pa.schema(
        [("start", I64), ("end", I64), ("api_class", I64), ("gp", I64), ("tid", I64),
         ("correlation", I64), ("name_id", I64), ("name_txt", STR)]
    )  # fmt: skip
    if not db.has(RUNTIME):
        return schema.empty_table()

    def build() -> str:
        c = lambda *n: db.int_col(RUNTIME, *n)  # noqa: E731
        name_id, name_txt = db.name_ref(RUNTIME, "nameId", "name")
        return (
            f"SELECT {c('start')}, {c('end')}, {c('eventClass')}, {c('globalTid')}, "
            f"nullif({c('correlationId')}, 0), {name_id}, {name_txt} FROM {db.ref(RUNTIME)}"
        )

    return _fetch_split(db, build, schema, RUNTIME)


def read_osrt(db: NsysDb) -> pa.Table:
    """OS runtime calls (OSRT_API)."""
    schema = pa.schema(
        [("start", I64), ("end", I64), ("gp", I64), ("tid", I64), ("name_id", I64),
         ("name_txt", STR)]
    )  # fmt: skip
    if not db.has("OSRT_API"):
        return schema.empty_table()

    def build() -> str:
        c = lambda *n: db.int_col("OSRT_API", *n)  # noqa: E731
        name_id, name_txt = db.name_ref("OSRT_API", "nameId", "name")
        return (
            f"SELECT {c('start')}, {c('end')}, {c('globalTid')}, {name_id}, {name_txt} "
            f"FROM {db.ref('OSRT_API')}"
        )

    return _fetch_split(db, build, schema, "OSRT_API")


def read_nvtx(db: NsysDb) -> pa.Table:
    """NVTX ranges, domain names and thread names (``NVTX_TYPES`` rows only)."""
    schema = pa.schema(
        [("nvtx_id", I64), ("start", I64), ("end", I64), ("event_type", I64), ("gp", I64),
         ("tid", I64), ("domain_id", I64), ("text", STR), ("text_id", I64), ("json", STR),
         ("json_id", I64)]
    )  # fmt: skip
    table = "NVTX_EVENTS"
    if not {"start", "eventType"} <= db.columns(table):
        return schema.empty_table()

    def build() -> str:
        c = lambda *n: db.int_col(table, *n)  # noqa: E731
        # A row id for each event: eventId (3.28+, the primary key) or SQLite's rowid.
        ident = c("eventId") if "eventId" in db.columns(table) else "rowid"
        return (
            f"SELECT {ident}, {c('start')}, nullif({c('end')}, 0), {c('eventType')}, "
            f"{c('globalTid')}, {c('domainId')}, {db.text_col(table, 'text')}, {c('textId')}, "
            f"{db.text_col(table, 'jsonText')}, {c('jsonTextId')} FROM {db.ref(table)} "
            f"WHERE {c('eventType')} IN ({', '.join(map(str, NVTX_TYPES))})"
        )

    return _fetch_split(db, build, schema, table)


def read_strings(db: NsysDb) -> pa.Table:
    schema = pa.schema([("id", I64), ("value", STR)])
    if not {"id", "value"} <= db.columns("StringIds"):
        return schema.empty_table()
    return db.fetch(
        f"SELECT id, CAST(value AS TEXT) FROM {db.ref('StringIds')} WHERE typeof(id) = 'integer'",
        schema,
    )


def read_threads(db: NsysDb) -> tuple[pa.Table, pa.Table]:
    """(thread names ``gp, tid, name_id``; processes ``gp, pid, name``)."""
    t_schema = pa.schema([("gp", I64), ("tid", I64), ("name_id", I64), ("priority", I64)])
    p_schema = pa.schema([("gp", I64), ("pid", I64), ("name", STR)])
    threads, processes = t_schema.empty_table(), p_schema.empty_table()
    if {"nameId", "globalTid"} <= db.columns("ThreadNames"):
        threads = _fetch_split(
            db,
            lambda: (
                f"SELECT {db.int_col('ThreadNames', 'globalTid')}, "
                f"{db.int_col('ThreadNames', 'nameId')}, {db.int_col('ThreadNames', 'priority')} "
                f"FROM {db.ref('ThreadNames')}"
            ),
            t_schema,
        )
    if {"globalPid", "pid"} <= db.columns("PROCESSES"):
        g = db.int_col("PROCESSES", "globalPid")
        processes = db.fetch(
            f"SELECT ({g} >> 24), {db.int_col('PROCESSES', 'pid')}, "
            f"{db.text_col('PROCESSES', 'name')} FROM {db.ref('PROCESSES')}",
            p_schema,
        )
    return threads, processes


def export_meta(db: NsysDb) -> dict[str, str]:
    """META_DATA_EXPORT (3.x) or EXPORT_META_DATA (2.x) as a dict."""
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if {"name", "value"} <= db.columns(table):
            return {str(k): str(v) for k, v in db.rows(f"SELECT name, value FROM {db.ref(table)}")}
    return {}


def gpu_info(db: NsysDb) -> list[dict[str, Any]]:
    """TARGET_INFO_GPU rows as dicts (only the columns the file has)."""
    cols = sorted(db.columns("TARGET_INFO_GPU"))
    if not cols:
        return []
    names = ", ".join(f'"{c}"' for c in cols)
    return [
        dict(zip(cols, row, strict=True))
        for row in db.rows(f"SELECT {names} FROM {db.ref('TARGET_INFO_GPU')}")
    ]


def cuda_device_map(db: NsysDb) -> list[tuple[int, int, int]]:
    """TARGET_INFO_CUDA_DEVICE rows ``(gpuId, cudaId, pid)``: a process's CUDA ordinal -> GPU."""
    if not {"gpuId", "cudaId", "pid"} <= db.columns("TARGET_INFO_CUDA_DEVICE"):
        return []
    return db.rows(f"SELECT gpuId, cudaId, pid FROM {db.ref('TARGET_INFO_CUDA_DEVICE')}")


def mpi_ranks(db: NsysDb) -> dict[int, int]:
    """MPI_RANKS: process key -> rank (the first rank seen for a process)."""
    if not {"globalTid", "rank"} <= db.columns("MPI_RANKS"):
        return {}
    out: dict[int, int] = {}
    for gtid, rank in db.rows(f"SELECT globalTid, rank FROM {db.ref('MPI_RANKS')}"):
        if isinstance(gtid, int) and isinstance(rank, int) and rank >= 0:
            out.setdefault(gtid >> 24, rank)
    return out


def session_start_ns(db: NsysDb) -> int | None:
    """TARGET_INFO_SESSION_START_TIME.utcEpochNs: the wall-clock time of the file's 0 ns."""
    if "utcEpochNs" not in db.columns("TARGET_INFO_SESSION_START_TIME"):
        return None
    rows = db.rows(f"SELECT utcEpochNs FROM {db.ref('TARGET_INFO_SESSION_START_TIME')} LIMIT 1")
    value = rows[0][0] if rows else None
    return value if isinstance(value, int) else None
