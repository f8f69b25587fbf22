"""What ``stallscope compare`` reads of one rank, summed per rank at ingest (issue #15).

Each rank's ingest worker writes :data:`COMPARE_FILE` beside the rank's canonical tables
(``rank_card.write_card``), from that rank's files alone: one row per

* ``step``: each step range (step, start, end; ns);
* ``span``: the rank's GPU span (first start, last end of its GPU activity but syncs; ns);
* ``kernel``: each kernel name's GPU time and launches, over the kernels launched inside a
  step (every kernel of a rank without steps: :data:`IN_STEPS_SQL`);
* ``memcpy`` / ``memset``: each (copy kind, source, destination memory)'s GPU time, bytes
  and count, over the same operations.

Each row is a rank's share of what the comparison sums over the job (integers, so the
job's sums are the same), so comparing two jobs reads a few rows per rank instead of every
rank's ``gpu``, ``host``, ``ranges`` and ``names`` (~10 CPU-s at 1,024 ranks). A job stored
before these files (or a trace of a format without them) is compared from its tables as
before (:func:`stored_summaries` returns None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stallscope.host_ops import JOB_LAUNCH_CTE

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from stallscope.jobdata import JobData
    from stallscope.store import TraceRef

COMPARE_VERSION = 1  # bump when a row's meaning changes: older files are then ignored
COMPARE_FILE = f"rank_compare-{COMPARE_VERSION}.parquet"

# The GPU operations of every trace launched inside a step (the launch call's start, else the
# operation's own, inside a step range of its trace; scope.py's rule), or all of a trace's when
# it has no steps. Set-wise over the traces: a query per trace binds every rank's files.
IN_STEPS_SQL = f"""
WITH {JOB_LAUNCH_CTE}, steps AS (
  SELECT trace_id, start_ns AS step_start, end_ns AS step_end FROM ranges WHERE kind = 'step'
), ops AS (
  SELECT g.trace_id, g.kind, g.name_id, g.start_ns, g.end_ns, coalesce(g.bytes, 0) AS bytes,
         coalesce(g.copy_kind, '') AS copy_kind, coalesce(g.src_kind, '') AS src_kind,
         coalesce(g.dst_kind, '') AS dst_kind, coalesce(l.launch_ns, g.start_ns) AS anchor_ns
  FROM gpu g LEFT JOIN launch l ON l.trace_id = g.trace_id AND l.correlation = g.correlation
  WHERE g.kind IN ('kernel', 'memcpy', 'memset')
), scoped AS (
  SELECT ops.* FROM ops ASOF LEFT JOIN steps s
    ON ops.trace_id = s.trace_id AND ops.anchor_ns >= s.step_start
  WHERE ops.anchor_ns < s.step_end OR ops.trace_id NOT IN (SELECT trace_id FROM steps)
)
"""

# One rank's rows (the views of a JobData over that rank's files), in the file's columns.
_RANK_SQL = f"""
{IN_STEPS_SQL}
SELECT 'step' AS kind, step, start_ns, end_ns, NULL AS name, NULL AS copy_kind,
       NULL AS src_kind, NULL AS dst_kind, NULL AS total_ns, NULL AS bytes, NULL AS count
FROM ranges WHERE kind = 'step'
UNION ALL
SELECT 'span', NULL, min(start_ns), max(end_ns), NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM gpu WHERE kind <> 'sync' GROUP BY trace_id
UNION ALL
SELECT 'kernel', NULL, NULL, NULL, n.name, NULL, NULL, NULL, sum(o.end_ns - o.start_ns),
       NULL, count(*)
FROM scoped o JOIN names n ON n.trace_id = o.trace_id AND n.name_id = o.name_id
WHERE o.kind = 'kernel' GROUP BY n.name
UNION ALL
SELECT kind, NULL, NULL, NULL, NULL, copy_kind, src_kind, dst_kind, sum(end_ns - start_ns),
       sum(bytes), count(*)
FROM scoped WHERE kind <> 'kernel' GROUP BY kind, copy_kind, src_kind, dst_kind
ORDER BY ALL NULLS FIRST
"""  # ORDER BY: GROUP BY's order varies from run to run; the stored file must not


def file_schema() -> pa.Schema:
    """The Arrow schema of :data:`COMPARE_FILE`."""
    import pyarrow as pa

    text, num = pa.string(), pa.int64()
    return pa.schema(
        [("trace_id", text), ("kind", text), ("step", num), ("start_ns", num), ("end_ns", num),
         ("name", text), ("copy_kind", text), ("src_kind", text), ("dst_kind", text),
         ("total_ns", num), ("bytes", num), ("count", num)]
    )  # fmt: skip


def build_rows(rank: JobData, trace_id: str) -> pa.Table:
    """The rows of ``trace_id`` from ``rank`` (a JobData over that rank's files alone)."""
    import pyarrow as pa

    found = rank.relation(_RANK_SQL).fetchall()
    schema = file_schema()
    names = schema.names[1:]
    columns = {"trace_id": [trace_id] * len(found)}
    columns.update({name: [row[i] for row in found] for i, name in enumerate(names)})
    return pa.table(columns, schema=schema)


def stored_summaries(refs: list[TraceRef]) -> duckdb.DuckDBPyConnection | None:
    """A connection with the table ``rank_compare``: every trace's stored rows, or None
    when a trace has none (stored before them, or of a format without them)."""
    import duckdb

    if not refs or not all((r.path / COMPARE_FILE).is_file() for r in refs):
        return None
    listing = ", ".join("'" + str(r.path / COMPARE_FILE).replace("'", "''") + "'" for r in refs)
    con = duckdb.connect()
    con.execute(f"CREATE TABLE rank_compare AS SELECT * FROM read_parquet([{listing}])")
    return con
