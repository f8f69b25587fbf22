"""Read-only access to an Nsight Systems SQLite export, whatever its schema version.

Nothing about the layout is assumed: :class:`NsysDb` lists the tables and
columns the file really has (``PRAGMA table_info``), resolves versioned table
names (``CUPTI_ACTIVITY_KIND_KERNEL_V3`` is read as ``..._KERNEL``, the highest
``_V<n>`` winning) and builds SQL that reads a missing column as NULL. Rows come
out as Arrow tables, fetched in batches of :data:`BATCH_ROWS`, so no table is
ever held as one list of Python rows.

Every SQLite failure (a truncated or corrupt file, a malformed page) becomes a
one-line :class:`InputError`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
import sqlite3
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from stallscope.errors import InputError
from stallscope.ingest import limits
from stallscope.ingest.nsys import native
from stallscope.ingest.nsys import parallel as nsys_parallel

SQLITE_MAGIC = b"SQLite format 3\x00"
BATCH_ROWS = 65536
_VERSIONED = re.compile(r"^(?P<base>.+?)_V(?P<n>\d+)$")


def check_header(name: str, head: bytes, size: int) -> None:
    """Refuse a file that is not SQLite, or shorter than its header says (truncated)."""
    if not head.startswith(SQLITE_MAGIC):
        raise InputError(name, "not an SQLite database")
    if size < 100:
        raise InputError(name, f"truncated SQLite file ({size} bytes: shorter than its header)")
    page_size = struct.unpack(">H", head[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    pages = struct.unpack(">I", head[28:32])[0]
    # The in-header page count is valid when the change counter matches (SQLite file format §1.3.7).
    if head[24:28] == head[92:96] and pages and page_size * pages > size:
        raise InputError(
            name,
            f"truncated SQLite file ({size:,} bytes of the {page_size * pages:,} its header "
            "announces): copy or export it again",
        )


@contextlib.contextmanager
def sqlite_errors(name: str) -> Iterator[None]:
    """Turn any sqlite3 error into an InputError naming the file."""
    try:
        yield
    except sqlite3.Error as exc:
        if "interrupted" in str(exc) and limits.deadline_passed():
            raise InputError(name, limits.timeout_reason()) from None
        raise InputError(name, f"corrupt or unreadable SQLite database ({exc})") from None


class NsysDb:
    """One open export: which tables and columns exist, and batched Arrow reads."""

    def __init__(self, path: str | Path, name: str):
        self.name = name
        self.uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
        self.warnings: list[str] = []
        with sqlite_errors(name):
            self.con = sqlite3.connect(self.uri, uri=True, check_same_thread=False)
            harden(self.con)
            rows = self.con.execute(
                "SELECT type, name, tbl_name FROM sqlite_master"
                " WHERE type IN ('table', 'view', 'trigger')"
            ).fetchall()
        # Views and triggers are code, not data: a view named like a table we read
        # could recurse forever or fan out without end. Refused when read (_checked).
        self.views = {table for kind, table, _ in rows if kind == "view"}
        self.triggered = {on for kind, _, on in rows if kind == "trigger"}
        self.tables: dict[str, str] = {}
        best: dict[str, int] = {}
        for kind, table, _ in rows:
            if kind == "trigger":
                continue
            match = _VERSIONED.match(table)
            base, version = (match["base"], int(match["n"])) if match else (table, 0)
            if version >= best.get(base, -1):
                best[base] = version
                self.tables[base] = table
        self._columns: dict[str, set[str]] = {}
        self._plain = False  # while True, the column helpers read columns as stored (fetch_fast)

    def close(self) -> None:
        self.con.close()

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        """Column names of ``table`` (empty when the table is absent)."""
        if table not in self._columns:
            real = self.tables.get(table)
            if real is None:
                self._columns[table] = set()
            else:
                self._checked(real)
                with sqlite_errors(self.name):
                    info = self.con.execute(f"PRAGMA table_info({_quote(real)})").fetchall()
                self._columns[table] = {row[1] for row in info}
        return self._columns[table]

    def ref(self, table: str) -> str:
        """The quoted real name of ``table`` for SQL."""
        return _quote(self._checked(self.tables[table]))

    def _checked(self, real: str) -> str:
        """``real``, or an InputError when it is a view or has a trigger (see ``__init__``)."""
        if real in self.views:
            raise InputError(
                self.name,
                f"{real} is a view, not a table: an export's event tables hold data, "
                "and a view could run without end (refusing a crafted export)",
            )
        if real in self.triggered:
            raise InputError(
                self.name, f"{real} has a trigger: refusing a crafted export (exports have none)"
            )
        return real

    def int_col(self, table: str, *candidates: str) -> str:
        """SQL for the first existing column of ``candidates`` as an integer (else NULL)."""
        for col in candidates:
            if col in self.columns(table):
                q = _quote(col)
                if self._plain:
                    return q
                return (
                    f"(CASE WHEN typeof({q}) IN ('integer', 'real') THEN CAST({q} AS INTEGER) END)"
                )
        return "NULL"

    def text_col(self, table: str, *candidates: str) -> str:
        """SQL for the first existing column of ``candidates`` holding text (else NULL)."""
        for col in candidates:
            if col in self.columns(table):
                q = _quote(col)
                return f"(CASE WHEN typeof({q}) = 'text' THEN {q} END)"
        return "NULL"

    def name_ref(self, table: str, *candidates: str) -> tuple[str, str]:
        """(StringIds id SQL, inline text SQL) of a name column, trying ``candidates`` in order.

        A name column normally holds a StringIds id; a few exports store the
        text itself. Whichever of the candidates is set first wins.
        """
        present = [c for c in candidates if c in self.columns(table)]
        if not present:
            return "NULL", "NULL"
        ids = ", ".join(
            f"CASE WHEN typeof({_quote(c)}) = 'integer' THEN {_quote(c)} END" for c in present
        )
        texts = ", ".join(
            f"CASE WHEN typeof({_quote(c)}) = 'text' THEN {_quote(c)} END" for c in present
        )
        return f"coalesce({ids}, NULL)", f"coalesce({texts}, NULL)"

    def fetch_fast(
        self, build: Callable[[], str], schema: pa.Schema, *, table: str | None = None
    ) -> pa.Table:
        """``build()``'s rows as ``schema``, read as stored when every value has the right type.

        ``build`` makes the query with this object's column helpers. It is
        first built with :meth:`int_col` reading integer columns as they are
        (no per-value ``typeof``/``CAST`` in SQLite: a third of the read time
        of a big table). A text or BLOB in such a column, or a real beyond the
        int64 range, then fails Arrow's conversion, and the query is built
        again with the checking helpers and read again. Other reals are
        truncated toward zero by Arrow exactly as by SQLite's ``CAST``, so the
        result is always that of :meth:`fetch` of the checked query. Text and
        name columns are checked in both (:meth:`text_col`, :meth:`name_ref`).

        Each query is first read in C by the ADBC driver (``native``: by
        threads, one rowid range each, when ``table``, the table the query
        scans as ``SELECT ... FROM table [WHERE ...]``, is big), and with
        ``sqlite3`` when that driver is missing or its result is not exactly of
        ``schema``'s types; there a big ``table`` is read by forked workers,
        one rowid range each (``parallel``). The same rows in the same order
        every way.
        """
        self._plain = True
        try:
            plain_sql = build()
        finally:
            self._plain = False
        try:
            return self._read(plain_sql, schema, checked=False, table=table)
        except _ValueMismatch:
            return self._read(build(), schema, checked=True, table=table)

    def _read(self, sql: str, schema: pa.Schema, *, checked: bool, table: str | None) -> pa.Table:
        """``fetch``: in C by threads where the ADBC driver can (``native``), else with
        ``sqlite3``, by several processes when ``table`` is big enough (``parallel``)."""
        span = self._rowid_span(table) if table is not None else None
        if span and span[1] - span[0] + 1 >= native.MIN_ROWS and native.enabled():
            got = self._read_native(sql, schema, span)
            if got is not None:
                return got
        possible = (
            table is not None and nsys_parallel.read_workers(nsys_parallel.PARALLEL_MIN_ROWS) > 1
        )
        span = span if possible else None
        workers = nsys_parallel.read_workers(span[1] - span[0] + 1) if span else 1
        if workers > 1:
            where = " AND " if " WHERE " in sql else " WHERE "
            ranged = f"{sql}{where}rowid BETWEEN ? AND ?"
            ranges = nsys_parallel.rowid_ranges(*span, workers * nsys_parallel.RANGES_PER_WORKER)
            read = functools.partial(_range_table, ranged, schema, checked)
            try:
                return nsys_parallel.read_parallel(self.uri, ranges, read, workers)
            except _RangeFailed as failed:
                if failed.reason is None:
                    raise _ValueMismatch from None
                raise InputError(self.name, failed.reason) from None
            except nsys_parallel.WorkerFailed:
                pass  # a worker died: read here instead
        return self.fetch(sql, schema, checked=checked)

    def _read_native(self, sql: str, schema: pa.Schema, span: tuple[int, int]) -> pa.Table | None:
        """``native.read`` of ``sql`` over the rowids ``span``, split when big (None: use sqlite3)."""
        threads = native.read_threads(span[1] - span[0] + 1)
        ranges = None
        if threads > 1:
            ranges = nsys_parallel.rowid_ranges(*span, threads * native.RANGES_PER_THREAD)
        return native.read(self.name, self.uri, sql, schema, ranges, threads)

    def _rowid_span(self, table: str) -> tuple[int, int] | None:
        """(first, last) rowid of ``table``; None when empty or without rowids."""
        try:
            lo, hi = self.con.execute(
                f"SELECT min(rowid), max(rowid) FROM {self.ref(table)}"
            ).fetchone()
        except sqlite3.Error:  # a WITHOUT ROWID table, or unreadable: the plain read says why
            return None
        return (lo, hi) if isinstance(lo, int) and isinstance(hi, int) else None

    def fetch(self, sql: str, schema: pa.Schema, *, checked: bool = True) -> pa.Table:
        """Run ``sql`` and return its rows as an Arrow table of ``schema``, batch by batch.

        A value Arrow cannot convert is an InputError, or with
        ``checked=False`` (``fetch_fast``'s unchecked try) the signal to read
        again checked.
        """
        with sqlite_errors(self.name):
            try:
                return self._lenient_text(lambda: _arrow_rows(self.con, sql, (), schema))
            except _Unconvertible as exc:
                if not checked:
                    raise _ValueMismatch from None
                raise InputError(self.name, str(exc)) from None

    def rows(self, sql: str) -> list[tuple]:
        """A small query's rows (metadata, enums): never an event table."""
        with sqlite_errors(self.name):
            return self._lenient_text(lambda: self.con.execute(sql).fetchall())

    def _lenient_text(self, read: Callable[[], T]) -> T:
        """``read()``; text that is not UTF-8 is read again with U+FFFD for bad bytes, with a warning."""
        try:
            return read()
        except sqlite3.OperationalError as exc:
            if "decode to UTF-8" not in str(exc) or self.con.text_factory is not str:
                raise
        self.con.text_factory = _replace_bad_utf8
        self.warnings.append("some strings are not UTF-8: their bad bytes are shown as \ufffd")
        return read()


T = TypeVar("T")
PROGRESS_STEPS = 20_000  # SQLite virtual-machine steps between deadline checks (~1 ms)


def harden(con: sqlite3.Connection) -> None:
    """Read-only in every way, and aborted once the ingest's deadline passes.

    ``PRAGMA query_only`` refuses any write even through a crafted schema; the
    progress handler stops a query (a recursive view, a huge join) past the
    ``--timeout`` budget: SQLite then raises "interrupted", reported as the timeout.
    """
    con.execute("PRAGMA query_only = ON")
    con.set_progress_handler(limits.deadline_passed, PROGRESS_STEPS)


def _replace_bad_utf8(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class _ValueMismatch(Exception):
    """A value of an unexpected type in a query read without checks (``fetch_fast``)."""


class _Unconvertible(Exception):
    """A value Arrow cannot convert to the schema's type (the message says which)."""


class _RangeFailed(Exception):
    """What a worker's range read failed with: ``reason`` None for a value mismatch."""

    def __init__(self, reason: str | None):
        super().__init__(reason)
        self.reason = reason


def _arrow_rows(con: sqlite3.Connection, sql: str, params: tuple, schema: pa.Schema) -> pa.Table:
    """The rows of ``sql`` as an Arrow table of ``schema``, batch by batch.

    Each batch of row tuples goes to Arrow in one call (as a struct array),
    and the cyclic garbage collector is paused meanwhile: the row tuples hold
    no cycles, and collecting them as they came made reads 3x slower.
    Raises sqlite3 errors as they come and :class:`_Unconvertible`.
    """
    struct = pa.struct(list(schema))
    batches = []
    paused = gc.isenabled()
    gc.disable()
    try:
        cursor = con.execute(sql, params)
        while rows := cursor.fetchmany(BATCH_ROWS):
            batches.append(pa.RecordBatch.from_struct_array(pa.array(rows, type=struct)))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise _Unconvertible(f"unexpected value in the export ({exc})") from None
    finally:
        if paused:
            gc.enable()
    return pa.Table.from_batches(batches, schema=schema)


def _range_table(
    sql: str, schema: pa.Schema, checked: bool, con: sqlite3.Connection, first: int, last: int
) -> pa.Table:
    """One rowid range of a parallel read, in a worker (errors as :class:`_RangeFailed`).

    Only the exception's text crosses back to the parent, as a plain argument.
    """
    try:
        return _arrow_rows(con, sql, (first, last), schema)
    except _Unconvertible as exc:
        raise _RangeFailed(str(exc) if checked else None) from None
    except sqlite3.Error as exc:
        if "interrupted" in str(exc) and limits.deadline_passed():
            raise _RangeFailed(limits.timeout_reason()) from None
        raise _RangeFailed(f"corrupt or unreadable SQLite database ({exc})") from None


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
