"""Read a big nsys table straight into Arrow in C (the ADBC SQLite driver), by several threads.

Python's ``sqlite3`` makes one Python object per value, then Arrow converts
them back: most of an nsys ingest's CPU time on big exports. The ADBC SQLite
driver (``adbc-driver-sqlite``, a compiled wheel for Linux, macOS and Windows)
steps the same SQLite query and appends each value to Arrow builders in C; its
reads release the GIL, so a big table is also split by rowid into ranges read
by threads side by side, each with its own connection (no fork, no copy
between processes).

The driver infers each column's type from the values it meets, where the
``sqlite3`` path converts to the schema. :func:`read` therefore accepts a
result only when every column came out as ``schema`` says (a column that
holds only NULLs, whatever type it was given, is read as nulls of the
schema's type), its text is valid UTF-8 and the driver raised nothing;
otherwise it returns None and the caller reads the same query with ``sqlite3``
(``db.NsysDb``), which keeps every rule of that path: its checks, its errors,
its ``U+FFFD`` for bad bytes. Values are the same either way: integers and
text are copied as stored.

Only tables of :data:`MIN_ROWS` rows or more (by their rowid span) are read
here. ``STALLSCOPE_NSYS_READER=sqlite3`` turns this reader off (tests compare
the two).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from stallscope.errors import InputError
from stallscope.ingest import limits
from stallscope.ingest.startup import duckdb_threads

BATCH_ROWS = 65536
# Tables of fewer rows are read with sqlite3 (``db.NsysDb``): there the driver's import and
# connections cost more (~10 MB of peak memory on a small export) than its speed saves.
MIN_ROWS = 100_000
# Below this many rows a table is read by one thread: a connection per range costs more.
SPLIT_MIN_ROWS = 200_000
RANGES_PER_THREAD = 2  # smaller ranges even out the threads' shares


class NativeUnavailable(Exception):
    """The driver is not installed or cannot open the file: read with ``sqlite3``."""


def enabled() -> bool:
    """Whether the ADBC SQLite driver is installed and not turned off (module docstring)."""
    if os.environ.get("STALLSCOPE_NSYS_READER", "").strip().lower() == "sqlite3":
        return False
    try:
        import adbc_driver_manager  # noqa: F401
        import adbc_driver_sqlite  # noqa: F401
    except ImportError:
        return False
    return True


def read_threads(rows: int) -> int:
    """Threads that read a table of ``rows`` rows: 1 below :data:`SPLIT_MIN_ROWS`, else the
    parsers' thread count (``startup.duckdb_threads``: the usable CPUs, 2 to 8, or the budget)."""
    if rows < SPLIT_MIN_ROWS:
        return 1
    return duckdb_threads()


def read(
    name: str,
    uri: str,
    sql: str,
    schema: pa.Schema,
    ranges: list[tuple[int, int]] | None,
    threads: int,
) -> pa.Table | None:
    """The rows of ``sql`` as ``schema``, or None when they are not exactly of ``schema``'s types.

    ``ranges`` (inclusive rowid bounds, in order) splits the read of a plain
    ``SELECT ... FROM table [WHERE ...]``: each range is read by one of
    ``threads`` threads and the parts are joined in order, the same rows in
    the same order as one read (a table scan returns rows in rowid order).
    Past the ingest's deadline it raises the timeout's :class:`InputError`.
    """
    queries = [sql] if not ranges else [_ranged(sql, lo, hi) for lo, hi in ranges]
    one = lambda query: _read_one(name, uri, query, schema)  # noqa: E731
    if len(queries) == 1 or threads <= 1:
        parts = [one(q) for q in queries]
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            parts = list(pool.map(one, queries))
    if any(part is None for part in parts):
        return None
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _ranged(sql: str, first: int, last: int) -> str:
    where = " AND " if " WHERE " in sql else " WHERE "
    return f"{sql}{where}rowid BETWEEN {int(first)} AND {int(last)}"


def _read_one(name: str, uri: str, sql: str, schema: pa.Schema) -> pa.Table | None:
    """One query's rows as ``schema`` (None: not of its types, or the driver refused)."""
    import adbc_driver_manager as adbc

    try:
        with _statement(uri) as statement:
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            reader = pa.RecordBatchReader._import_from_c(stream.address)
            batches = []
            for batch in _batches(reader):
                if limits.deadline_passed():
                    raise InputError(name, limits.timeout_reason())
                batches.append(batch)
            got = pa.Table.from_batches(batches, schema=reader.schema)
    except (adbc.Error, pa.ArrowException, NativeUnavailable):
        return None
    return _as_schema(got, schema)


def _batches(reader: pa.RecordBatchReader):
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            return


class _statement:
    """An ADBC statement on its own read-only connection, everything closed on exit."""

    def __init__(self, uri: str):
        self.uri = uri

    def __enter__(self):
        import adbc_driver_manager as adbc
        import adbc_driver_sqlite

        self._closers: list[Callable[[], None]] = []
        try:
            database = adbc_driver_sqlite.connect(self.uri)
            self._closers.append(database.close)
            connection = adbc.AdbcConnection(database)
            self._closers.append(connection.close)
            statement = adbc.AdbcStatement(connection)
            self._closers.append(statement.close)
            statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
        except Exception as exc:  # noqa: BLE001 (any failure to open: the sqlite3 path says why)
            self.__exit__()
            raise NativeUnavailable(str(exc)) from None
        return statement

    def __exit__(self, *exc_info) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):  # a read-only handle: nothing to lose
                close()
        self._closers = []


def _as_schema(got: pa.Table, schema: pa.Schema) -> pa.Table | None:
    """``got`` with ``schema``'s names and types, or None when a column is of another type.

    A column of nulls only is taken whatever its type (the driver cannot
    tell the type of a NULL); text must be valid UTF-8.
    """
    if got.num_columns != len(schema):
        return None
    columns = []
    for column, field in zip(got.columns, schema, strict=True):
        if column.null_count == len(column):
            columns.append(pa.chunked_array([pa.nulls(len(column), field.type)]))
            continue
        if column.type != field.type:
            return None
        if pa.types.is_string(field.type):
            try:
                for chunk in column.chunks:
                    chunk.validate(full=True)
            except pa.ArrowInvalid:
                return None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)
