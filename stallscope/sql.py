"""Read-only SQL over the store, safe to offer to every visitor of a shared server.

:func:`sandbox_query` runs one ``SELECT`` (or ``WITH … SELECT``) in a child
process (:mod:`stallscope.sql_child`) on an in-memory DuckDB that holds
copies of the canonical tables and can touch no file: external access off,
configuration locked, path-bearing settings pointed nowhere. The child's
address space, the wall time and the result (rows and bytes) are capped, so
a query can neither change the store, read a server path, nor grow the
server's memory. :func:`check_query` also refuses, from DuckDB's own parse
tree, every statement but one ``SELECT`` and every table function or setting
function that is not on the list below. docs/security.md ("SQL page") says
what a visitor can and cannot do and which tests prove it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from stallscope.errors import StallscopeError
from stallscope.schema import EMPTY_SELECTS
from stallscope.store import CATALOG_COLUMNS, TABLES, Store, TraceRef

if TYPE_CHECKING:  # pandas is imported by to_pandas(), in the server only, not in the sandbox
    import pandas as pd

MAX_ROWS = 10_000
MAX_RESULT_BYTES = 16 << 20  # Arrow bytes of a result handed to the server
TIMEOUT_S = 30.0
MEMORY_MB = 1024  # what one query may allocate, strings included (the child's RLIMIT_AS)
LOAD_CAP_BYTES = 256 << 20  # Parquet bytes on disk copied into one sandbox (newest jobs first)
LOAD_MEMORY_BYTES = 1 << 30  # address space for reading the copies: this plus
LOAD_EXPANSION = 8  # ... this many times their Parquet bytes (Arrow is larger than Parquet)
THREADS = 2
START_GRACE_S = 60.0  # the child's own start and load, on top of the query's timeout
MAX_QUERY_CHARS = 100_000
MAX_CONCURRENT = 2  # sandboxes at once per server process (each up to MEMORY_MB + its data)
QUEUE_WAIT_S = 15.0  # how long a query waits for a free sandbox before "busy"

ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
SYSTEM_TABLES = frozenset({("information_schema", "tables"), ("information_schema", "columns")})
DENIED_FUNCTIONS = frozenset({"current_setting", "getenv", "getvariable", "which_secret"})
DENIED_PREFIXES = ("read_", "duckdb_", "pragma_")


_SLOTS = threading.BoundedSemaphore(MAX_CONCURRENT)
_log = logging.getLogger(__name__)


class QueryError(StallscopeError):
    """A refused, failed or stopped user query (the message is one line, safe to show)."""


@dataclass(frozen=True)
class LoadPlan:
    """Which traces one sandbox copies in: whole jobs, newest first, up to a Parquet byte cap."""

    traces: list[TraceRef]
    jobs: int
    total_jobs: int
    parquet_bytes: int
    cap_bytes: int | None

    def describe(self) -> str:
        """One line for the page, e.g. ``2 jobs (3 traces, 1.2 MB of Parquet)``."""
        text = (
            f"{self.jobs} of {self.total_jobs} jobs"
            if self.jobs < self.total_jobs
            else f"{self.jobs} jobs"
        )
        text += f" ({len(self.traces)} traces, {self.parquet_bytes / 1e6:.1f} MB of Parquet)"
        if self.jobs < self.total_jobs and self.cap_bytes is not None:
            text += (
                f"; {self.total_jobs - self.jobs} left out: the SQL page copies in the newest "
                f"jobs up to {self.cap_bytes / 1e6:g} MB of Parquet"
            )
        return text


@dataclass
class SqlResult:
    """A query's (possibly cut) result, why it was cut, and what data it ran on."""

    frame: pd.DataFrame
    truncated: str | None = None  # e.g. "first 10,000 rows"; None when complete
    notes: list[str] = field(default_factory=list)  # jobs left out because unreadable
    loaded: str = ""  # LoadPlan.describe()


def plan_load(traces: list[TraceRef], cap_bytes: int | None = LOAD_CAP_BYTES) -> LoadPlan:
    """Whole jobs, newest upload first, each taken if it still fits in ``cap_bytes``
    of Parquet on disk (None: every job); a job too big to fit is skipped."""
    jobs: dict[str, list[TraceRef]] = {}
    for ref in traces:
        jobs.setdefault(ref.job_id, []).append(ref)
    order = sorted(
        jobs.values(),
        key=lambda refs: (max(str(r.meta.get("uploaded_at", "")) for r in refs), refs[0].job_id),
        reverse=True,
    )
    chosen: list[TraceRef] = []
    total = taken = 0
    for refs in order:
        size = sum(_parquet_bytes(r) for r in refs)
        if cap_bytes is not None and total + size > cap_bytes:
            continue
        chosen += refs
        total += size
        taken += 1
    return LoadPlan(chosen, taken, len(jobs), total, cap_bytes)


def _parquet_bytes(ref: TraceRef) -> int:
    total = 0
    for table in TABLES:
        with contextlib.suppress(OSError):
            total += ref.table_path(table).stat().st_size
    return total


def table_columns(traces: list[TraceRef]) -> list[tuple[str, list[str]]]:
    """Each table the sandbox offers over ``traces`` with its columns, read from the
    Parquet footers only (no sandbox needed: nothing here comes from a visitor).
    Columns are in order of first appearance, as the sandbox's union of traces has them;
    an unreadable footer is skipped (the sandbox leaves that job out and says so)."""
    listing = []
    for table in TABLES:
        names: dict[str, None] = {}
        for ref in traces:
            path = ref.table_path(table)
            if path.is_file():
                with contextlib.suppress(Exception):
                    names.update(dict.fromkeys(pq.read_schema(path).names))
        if not names:
            with duckdb.connect() as con:
                con.execute(f"SELECT * FROM {EMPTY_SELECTS[table]} LIMIT 0")
                names = dict.fromkeys(d[0] for d in con.description)
        listing.append((table, list(names)))
    listing.append(("catalog", [name for name, _ in CATALOG_COLUMNS]))
    return sorted(listing)


def trace_requests(traces: list[TraceRef]) -> list[dict[str, Any]]:
    """What the child needs to know of each trace (its folder is read by the child only)."""
    return [
        {"job_id": r.job_id, "trace_id": r.trace_id, "dir": str(r.path), "meta": r.meta}
        for r in traces
    ]


def sandbox_query(
    store: Store,
    sql: str,
    *,
    traces: list[TraceRef] | None = None,
    timeout_s: float = TIMEOUT_S,
    max_rows: int | None = MAX_ROWS,
    max_bytes: int | None = MAX_RESULT_BYTES,
    memory_mb: int = MEMORY_MB,
    load_cap_bytes: int | None = LOAD_CAP_BYTES,
) -> SqlResult:
    """Run one read-only query in the sandbox; raises :class:`QueryError` with one line.

    ``traces`` (default: the whole store) are copied in whole jobs, newest first,
    up to ``load_cap_bytes`` of Parquet (None: all). At most ``max_rows`` rows and
    ``max_bytes`` Arrow bytes come back (None: no cap); the query is stopped
    after ``timeout_s`` seconds or when it needs more than ``memory_mb``.
    """
    text = sql.strip()
    if not text.rstrip(";").strip():
        raise QueryError("empty query")
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(f"query longer than {MAX_QUERY_CHARS:,} characters")
    with _parser() as con:
        check_query(con, text)
    plan = plan_load(store.traces() if traces is None else traces, load_cap_bytes)
    request = {
        "sql": text,
        "traces": trace_requests(plan.traces),
        "timeout_s": timeout_s,
        "max_rows": max_rows,
        "max_bytes": max_bytes,
        "memory_bytes": memory_mb << 20,
        "load_memory_bytes": LOAD_MEMORY_BYTES + LOAD_EXPANSION * plan.parquet_bytes,
        "threads": THREADS,
    }
    if not _SLOTS.acquire(timeout=QUEUE_WAIT_S):
        raise QueryError(
            f"the SQL page is busy with {MAX_CONCURRENT} other queries; try again in a moment"
        )
    try:
        header, table = _run_child(request, timeout_s, max_bytes, memory_mb)
    finally:
        _SLOTS.release()
    if "error" in header:
        raise QueryError(_scrub(str(header["error"]), store))
    return SqlResult(
        frame=table.to_pandas(),
        truncated=header.get("truncated"),
        notes=[_scrub(n, store) for n in header.get("notes", [])],
        loaded=plan.describe(),
    )


def readonly_query(
    store: Store,
    sql: str,
    *,
    timeout_s: float = TIMEOUT_S,
    max_rows: int | None = MAX_ROWS,
    max_bytes: int | None = MAX_RESULT_BYTES,
    memory_mb: int = MEMORY_MB,
    load_cap_bytes: int | None = LOAD_CAP_BYTES,
    traces: list[TraceRef] | None = None,
) -> pd.DataFrame:
    """The result frame of :func:`sandbox_query` (cut to ``max_rows``/``max_bytes``)."""
    return sandbox_query(
        store,
        sql,
        traces=traces,
        timeout_s=timeout_s,
        max_rows=max_rows,
        max_bytes=max_bytes,
        memory_mb=memory_mb,
        load_cap_bytes=load_cap_bytes,
    ).frame


def check_query(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The one statement of ``sql`` (its text, as DuckDB split it), if it is a
    ``SELECT`` over the canonical tables, ``range``-like table functions and
    ordinary functions; else :class:`QueryError`. Judged on DuckDB's parse tree,
    so comments, quoting and case cannot hide a name. ``con`` only parses.
    """
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(first_line(exc)) from None
    if len(statements) != 1:
        raise QueryError("one statement at a time, please")
    statement = statements[0]
    if statement.type != duckdb.StatementType.SELECT:
        raise QueryError(f"only SELECT queries are allowed (got {statement.type.name})")
    ((serialized,),) = con.execute("SELECT json_serialize_sql(?)", [statement.query]).fetchall()
    tree = json.loads(serialized)
    if tree.get("error"):
        raise QueryError(first_line(tree.get("error_message") or "query not understood"))
    for node, ctes in _nodes(tree, frozenset()):
        if node.get("type") == "TABLE_FUNCTION":
            name = str(node.get("function", {}).get("function_name", "")).lower()
            if name not in ALLOWED_TABLE_FUNCTIONS:
                raise QueryError(
                    f"{name}() is not available here: only the store's tables and "
                    f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}()"
                )
        elif node.get("type") == "BASE_TABLE":
            _check_table(node, ctes)
        elif node.get("type") == "SHOW_REF" and node.get("query") is None:
            _check_show(node)
        elif node.get("class") == "FUNCTION":
            name = str(node.get("function_name", "")).lower()
            if name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES):
                raise QueryError(
                    f"{name}() is not available here (no settings, files or system state)"
                )
    return statement.query


def _check_table(node: dict[str, Any], ctes: set[str]) -> None:
    name = str(node.get("table_name", "")).lower()
    schema = str(node.get("schema_name", "")).lower()
    catalog = str(node.get("catalog_name", "")).lower()
    ours = catalog in ("", "memory", "temp") and schema in ("", "main", "temp")
    if ours and (name in TABLES or name == "catalog"):
        return
    if not schema and not catalog and name in ctes:
        return
    if (schema, name) in SYSTEM_TABLES and catalog in ("", "memory"):
        return
    shown = ".".join(p for p in (catalog, schema, name) if p)
    raise QueryError(
        f"no table {shown!r} here: the tables are {', '.join((*TABLES, 'catalog'))}, "
        "information_schema.tables and .columns"
    )


def _check_show(node: dict[str, Any]) -> None:
    """``DESCRIBE``/``SUMMARIZE`` of one of our tables; ``SHOW <setting>`` and
    ``SHOW TABLES``-like listings are refused (a query inside is checked as a query)."""
    name = str(node.get("table_name", "")).lower()
    if name in TABLES or name == "catalog":
        return
    raise QueryError(
        f"SHOW/DESCRIBE/SUMMARIZE of {name!r} is not available here: only of "
        f"{', '.join((*TABLES, 'catalog'))} or of a query"
    )


def _nodes(tree: Any, ctes: frozenset[str]) -> Iterator[tuple[dict[str, Any], frozenset[str]]]:
    """Every object of the parse tree with the CTE names in scope there (a query's
    ``WITH`` names cover that query, its CTE bodies and its subqueries, nothing else)."""
    stack = [(tree, ctes)]
    while stack:
        item, scope = stack.pop()
        if isinstance(item, dict):
            scope = scope | _cte_names(item)
            yield item, scope
            stack.extend((value, scope) for value in item.values())
        elif isinstance(item, list):
            stack.extend((value, scope) for value in item)


def _cte_names(node: dict[str, Any]) -> frozenset[str]:
    cte_map = node.get("cte_map")
    if not isinstance(cte_map, dict):
        return frozenset()
    entries = cte_map.get("map") or []
    return frozenset(
        e["key"].lower() for e in entries if isinstance(e, dict) and isinstance(e.get("key"), str)
    )


def _parser() -> duckdb.DuckDBPyConnection:
    """A connection used only to parse: it holds nothing and can reach nothing."""
    con = duckdb.connect(config={"enable_external_access": False, "threads": 1})
    con.execute("SET lock_configuration = true")
    return con


def _run_child(
    request: dict[str, Any], timeout_s: float, max_bytes: int | None, memory_mb: int
) -> tuple[dict[str, Any], pa.Table | None]:
    """Header and result of the sandbox child, which is killed at the deadline."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope.sql_child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        # malloc, not jemalloc: it reserves far less address space under RLIMIT_AS
        env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"},
        start_new_session=True,
    )
    limit = None if max_bytes is None else 2 * max_bytes + (1 << 20)
    out = _Collector(proc, proc.stdout, limit)
    err = _Collector(proc, proc.stderr, 64 << 10, kill=False)
    try:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        try:
            proc.wait(timeout=timeout_s + START_GRACE_S)
        except subprocess.TimeoutExpired:
            raise QueryError(f"query stopped after {timeout_s:g} s") from None
        out.join()
        err.join()
    finally:
        _kill(proc)
    if out.overflow:
        raise QueryError("query result too large")
    if proc.returncode != 0 or err.size:
        # for the server's log only: may name paths, never shown to the visitor
        _log.warning(
            "SQL sandbox exit status %s: %s",
            proc.returncode,
            err.data()[-2000:].decode(errors="replace"),
        )
    return _parse_output(out.data(), proc.returncode, memory_mb)


def _parse_output(
    data: bytes, returncode: int, memory_mb: int
) -> tuple[dict[str, Any], pa.Table | None]:
    line, _, rest = data.partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        if returncode < 0 and -returncode in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT):
            raise QueryError(
                f"query stopped: it needs more than {memory_mb} MB of memory"
            ) from None
        raise QueryError(f"the query process failed (exit status {returncode})") from None
    if "error" in header:
        return header, None
    return header, pa.ipc.open_stream(rest).read_all()


class _Collector:
    """Reads one of a child's pipes in a thread, up to ``limit`` bytes, then flags
    ``overflow`` and kills the child (``kill``) or drains and drops the rest."""

    def __init__(self, proc: subprocess.Popen, pipe: Any, limit: int | None, kill: bool = True):
        self.proc, self.pipe, self.limit, self.kill = proc, pipe, limit, kill
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflow = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while chunk := self.pipe.read(1 << 16):
            self.size += len(chunk)
            if self.limit is not None and self.size > self.limit:
                self.overflow = True
                if self.kill:
                    _kill_group(self.proc)
                else:  # keep draining so the child never blocks on a full pipe
                    while self.pipe.read(1 << 16):
                        pass
                return
            self.chunks.append(chunk)

    def join(self) -> None:
        self.thread.join(timeout=30)

    def data(self) -> bytes:
        return b"".join(self.chunks)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        _kill_group(proc)
        proc.wait(timeout=30)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _scrub(message: str, store: Store) -> str:
    """The message without the store's or the home folder's absolute path."""
    for path, shown in (
        (str(store.root.resolve()), "<store>"),
        (str(store.root), "<store>"),
        (str(Path.home()), "~"),
    ):
        if len(path) > 1:
            message = message.replace(path, shown)
    return message


def first_line(exc: Exception | str) -> str:
    """The first non-empty line of an error, for a one-line message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
