"""Nsight Systems CUDA memory usage events -> the ``memory`` table (docs/formats/nsys.md#memory).

``nsys profile --cuda-memory-usage=true`` records every device-memory allocation
and free the process makes through the driver in ``CUDA_GPU_MEMORY_USAGE_EVENTS``.
For a PyTorch job these are the caching allocator's segments (``cudaMalloc`` when it
grows, ``cudaFree`` when it releases cached blocks: ``torch.cuda.empty_cache()``, an
out-of-memory retry) plus the buffers CUDA libraries allocate themselves. Tensors are
carved out of those segments inside the process and never reach the driver, so this
source gives the reserved timeline and the allocator's churn, never what is allocated.

:func:`read_memory_usage` reads the rows (``parse``); :data:`MEMORY_OUT_SQL` turns them
into canonical rows per trace (``canonical.NsysCanonical.emit``); both are found through
:data:`TABLE_READER`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from stallscope.ingest.formats import TableReader
from stallscope.ingest.nsys.db import NsysDb
from stallscope.ingest.nsys.sql import _PID

I64 = pa.int64()

MEMORY_USAGE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
MEMORY_SCHEMA = pa.schema(
    [("start", I64), ("gp", I64), ("device", I64), ("address", I64), ("bytes", I64),
     ("freed", I64), ("correlation", I64)]
)  # fmt: skip


def read_memory_usage(db: NsysDb) -> pa.Table:
    """Device-memory allocations and frees of ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``MEMORY_SCHEMA``).

    Only ``memKind`` DEVICE rows (device memory the driver hands out, ``cudaMalloc`` and kin:
    the caching allocator's segments and the CUDA libraries' own buffers) with a
    ``memoryOperationType`` of allocation or deallocation; statically declared ``__device__``
    variables (DEVICE_STATIC), pinned host and managed memory are left out. ``gp`` is the
    process key (``globalPid >> 24``); rows keep file order (rowid). Empty when the table is
    absent (captured without ``--cuda-memory-usage=true``) or lacks a needed column.
    """
    cols = db.columns(MEMORY_USAGE)
    if not {"start", "globalPid", "bytes", "memKind", "memoryOperationType"} <= cols:
        return MEMORY_SCHEMA.empty_table()
    device_kinds = _enum_ids(db, "ENUM_CUDA_MEM_KIND", lambda n: n.endswith("_KIND_DEVICE"), {2})
    alloc = _enum_ids(db, "ENUM_CUDA_DEV_MEM_EVENT_OPER", lambda n: n.endswith("_ALLOCATION"), {0})
    free = _enum_ids(db, "ENUM_CUDA_DEV_MEM_EVENT_OPER", lambda n: n.endswith("_DEALLOCATION"), {1})
    c = lambda *n: db.int_col(MEMORY_USAGE, *n)  # noqa: E731
    op = c("memoryOperationType")
    ids = lambda values: ", ".join(str(v) for v in sorted(values))  # noqa: E731
    return db.fetch(
        f"SELECT {c('start')}, ({c('globalPid')} >> 24), {c('deviceId')}, {c('address')}, "
        f"{c('bytes')}, CASE WHEN {op} IN ({ids(free)}) THEN 1 ELSE 0 END, nullif({c('correlationId')}, 0) "
        f"FROM {db.ref(MEMORY_USAGE)} WHERE {c('memKind')} IN ({ids(device_kinds)}) "
        f"AND {op} IN ({ids(alloc | free)}) AND {c('start')} IS NOT NULL "
        f"AND {c('bytes')} IS NOT NULL ORDER BY rowid",
        MEMORY_SCHEMA,
    )


def _enum_ids(
    db: NsysDb, table: str, matches: Callable[[str], bool], default: set[int]
) -> set[int]:
    """The ids of ``table`` whose upper-cased name ``matches`` (read by name, as in ``enums``);
    ``default`` (the documented ids) when the export has no such table."""
    if not {"id", "name"} <= db.columns(table):
        return default
    found = {
        ident
        for ident, name in db.rows(f"SELECT id, name FROM {db.ref(table)}")
        if isinstance(ident, int) and matches(str(name or "").upper())
    }
    return found or default


# Per trace (unit) and device: nsys sees the
# driver-level allocations (the caching allocator's segments), never tensors: each row is a
# segment_alloc/segment_free, total_reserved the running sum per trace and device from 0 at the
# first event, total_allocated NULL. The thread is the one of the API call with the same
# correlation id (cudaMalloc/cudaFree), when there is one.
MEMORY_OUT_SQL = f"""
WITH m AS (
  SELECT mu.*, CASE WHEN mu.freed = 1 THEN -mu.bytes ELSE mu.bytes END AS delta
  FROM memory_usage mu),
call AS (
  SELECT gp, correlation, min(tid) AS tid FROM api WHERE correlation IS NOT NULL GROUP BY ALL)
SELECT u.tix, u.trace_id, CAST(m.device AS INTEGER) AS device, m.start AS ts_ns, m.delta AS bytes,
  CAST(NULL AS BIGINT) AS total_allocated,
  sum(m.delta) OVER (PARTITION BY u.tix, m.device ORDER BY m.start, m.rid
                     ROWS UNBOUNDED PRECEDING)::BIGINT AS total_reserved,
  m.address AS addr, {_PID.format(t="m")} AS pid, call.tid, CAST(NULL AS BIGINT) AS external_id,
  row_number() OVER (PARTITION BY u.tix ORDER BY m.start, m.rid) - 1 AS seq,
  'nsys' AS source,
  CASE WHEN m.freed = 1 THEN 'segment_free' ELSE 'segment_alloc' END AS action,
  CAST(NULL AS VARCHAR) AS stack
FROM m JOIN units u ON u.gp = m.gp AND (NOT u.split OR m.device = u.device)
LEFT JOIN call ON call.gp = m.gp AND call.correlation = m.correlation
ORDER BY u.tix, seq
"""


def read_memory_rows(db: NsysDb) -> pa.Table:
    """:func:`read_memory_usage` with ``rid``, each row's place in the file (the tie-breaker
    of equal times in :data:`MEMORY_OUT_SQL`)."""
    rows = read_memory_usage(db)
    return rows.append_column("rid", pa.array(np.arange(rows.num_rows)))


# The memory table, found by parse.py (reads ``memory_usage``) and canonical.py (its rows).
TABLE_READER = TableReader("memory", read_memory_rows, raw="memory_usage", out_sql=MEMORY_OUT_SQL)
