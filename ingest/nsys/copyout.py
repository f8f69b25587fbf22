"""Write an output query's rows straight from DuckDB to one Parquet file per trace (``COPY``).

The big output tables (``host``, ``ranges``) of an export are written by
DuckDB itself, with all its threads, one ``COPY (...) TO`` per trace: no
Arrow copy of the rows, no Python per batch (the route of
``ingest.streamed.write_split``, which converts DuckDB's batches to Arrow and
encodes them with one writer thread). Each trace gets a
:class:`~stallscope.ingest.streamed.WrittenTable` with the same record as a
streamed table: rows, the time bounds as parsed, the negative durations
(repaired as written: ``end_ns`` is at least ``start_ns``) and the distinct
``name_id`` values, from one aggregate query over the same rows.

The files hold the same rows, values, types and order as ``write_split``'s
(the declared columns first, in order, the missing ones as typed NULLs,
extras after, as ``canonical.conform`` lays them out); only the row groups
differ. Where that cannot be promised (a declared column of another type:
``conform`` would cast it, or keep it uncast when a value does not fit),
:func:`copy_split` returns None before writing anything.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from stallscope.ingest.streamed import PARQUET_OPTIONS, WrittenTable
from stallscope.schema import TABLE_NAMES, arrow_schema

# The DuckDB type of each Arrow type a canonical table declares.
_DUCK_TYPES = {
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.string(): "VARCHAR",
    pa.bool_(): "BOOLEAN",
    pa.float64(): "DOUBLE",
}
# Each trace's COPY runs the output query again (the filter on the trace reaches its join
# with ``units``, but every prepared row is still scanned): past this many traces in one
# file, one streamed pass through Arrow (``streamed.write_split``) costs less.
MAX_TRACES = 8
_COPY_OPTIONS = (
    f"FORMAT parquet, COMPRESSION {PARQUET_OPTIONS['compression']}, "
    f"COMPRESSION_LEVEL {PARQUET_OPTIONS['compression_level']}"
)


def copy_split(
    con: duckdb.DuckDBPyConnection, sql: str, order_by: str, table: str, paths: list[Path]
) -> list[WrittenTable] | None:
    """Write the rows of ``sql ORDER BY order_by`` with ``tix = i`` to ``paths[i]``.

    ``sql`` selects the rows of every trace with their trace index ``tix``
    (0 .. len(paths) - 1) and the declared columns of ``table`` (module
    docstring); ``order_by`` is the order of each trace's rows. Returns one
    :class:`WrittenTable` per path (a trace without rows gets an empty file
    of the same schema), or None, having written nothing, when a declared
    column is not of its declared type, the table has no ``start_ns``,
    ``end_ns`` or ``name_id``, or there are more than :data:`MAX_TRACES` paths.
    """
    if table not in TABLE_NAMES or len(paths) > MAX_TRACES:
        return None
    relation = con.sql(sql)
    have = dict(zip(relation.columns, map(str, relation.types), strict=True))
    declared = arrow_schema(table)
    if not {"tix", "start_ns", "end_ns", "name_id"} <= have.keys():
        return None
    if any(f.name in have and have[f.name] != _DUCK_TYPES.get(f.type) for f in declared):
        return None
    if any(f.name not in have and f.type not in _DUCK_TYPES for f in declared):
        return None
    select, names = [], []
    for f in declared:
        select.append(
            _nullable(f.name)
            if f.name in have
            else f"CAST(NULL AS {_DUCK_TYPES[f.type]}) AS {_quote(f.name)}"
        )
        names.append(f.name)
    extras = [c for c in have if c != "tix" and c not in declared.names]
    select += [_nullable(c) for c in extras]
    names += extras
    written = []
    for tix, path in enumerate(paths):
        _copy(
            con,
            f"COPY (SELECT {', '.join(select)} FROM ({sql} ORDER BY {order_by}) WHERE tix = {tix}) "
            f"TO {_literal(str(path))} ({_COPY_OPTIONS})",
        )
        written.append(_written(con, path, names, table))
        if not _all_nullable(path):  # a DuckDB that writes otherwise: the Arrow route instead
            for done in paths[: tix + 1]:
                done.unlink(missing_ok=True)
            return None
    return written


def _copy(con: duckdb.DuckDBPyConnection, statement: str) -> None:
    """Run one COPY; a failure to write the file (disk full, denied) is the OSError it is, as
    Arrow's writer raised it (the CLI says it in one line)."""
    try:
        con.execute(statement)
    except duckdb.IOException as exc:
        raise OSError(
            str(exc).strip().splitlines()[0] if str(exc).strip() else "I/O error"
        ) from None


def _nullable(column: str) -> str:
    """The column, written as an optional Parquet field like Arrow's (DuckDB 2 writes a column
    it can prove has no NULL as a required field, which reads back as ``not null``)."""
    name = _quote(column)
    return f"CASE WHEN {name} IS NULL THEN NULL ELSE {name} END AS {name}"


def _all_nullable(path: Path) -> bool:
    return all(f.nullable for f in pq.read_schema(path))


def _written(
    con: duckdb.DuckDBPyConnection, path: Path, names: list[str], table: str
) -> WrittenTable:
    """The record of one written file; its negative durations repaired (the file rewritten)."""
    file = f"read_parquet({_literal(str(path))})"
    rows, start_lo, start_hi, end_lo, end_hi, negative, ids = con.execute(
        "SELECT count(*), min(start_ns), max(start_ns), min(end_ns), max(end_ns), "
        "count(*) FILTER (WHERE end_ns < start_ns), "
        f"list(DISTINCT name_id) FILTER (WHERE name_id IS NOT NULL) FROM {file}"
    ).fetchall()[0]
    if negative:  # as the ingest repairs them: duration 0 (never in nsys output: rows are kept
        # only when end >= start, and a projection spans its launches)
        repaired = path.with_name(path.name + ".repaired")
        _copy(
            con,
            f"COPY (SELECT {', '.join(_nullable(c) for c in names)} FROM "
            f"(SELECT * REPLACE (greatest(end_ns, start_ns) AS end_ns) FROM {file})) "
            f"TO {_literal(str(repaired))} ({_COPY_OPTIONS})",
        )
        repaired.replace(path)
    return WrittenTable(
        path=path,
        num_rows=rows,
        column_names=names,
        bounds={"start_ns": (start_lo, start_hi), "end_ns": (end_lo, end_hi)},
        negative_durations=negative,
        name_ids=pa.array(ids or [], arrow_schema(table).field("name_id").type),
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
