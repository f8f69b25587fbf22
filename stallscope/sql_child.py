"""The SQL sandbox process: one user query, run where it cannot hurt the server.

``python -m stallscope.sql_child`` reads one JSON request on stdin (built by
:func:`stallscope.sql.sandbox_query`), then:

1. caps its own address space (``RLIMIT_AS``), so a query that allocates
   gigabytes (``repeat()``, ``string_agg`` over a cross join: string memory
   that DuckDB's ``memory_limit`` does not count) fails inside this process;
2. reads the listed Parquet files with pyarrow into in-memory Arrow tables,
   leaving out (with a note) any job whose files cannot be read, and shows
   ``file_name``/``name`` of the catalog as base names;
3. opens an in-memory DuckDB that has never been given a file: the Arrow
   tables are registered, path-bearing settings are pointed nowhere, then
   ``enable_external_access=false`` and ``lock_configuration=true``. In DuckDB
   2.0 views over ``read_parquet`` stop working once external access is off,
   and ``allowed_paths``/``allowed_directories`` would let ``COPY`` write to the
   same files, so the data is copied in, not viewed (docs/security.md);
4. checks the statement (:func:`stallscope.sql.check_query`), runs it with a
   timer that calls ``con.interrupt()``, and keeps at most ``max_rows`` rows
   and ``max_bytes`` bytes of the result.

stdout carries one JSON header line (``{"error": ...}`` or ``{"truncated":
..., "notes": [...]}``) followed, on success, by the result as an Arrow IPC
stream.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from stallscope.schema import EMPTY_SELECTS
from stallscope.sql import QueryError, check_query, first_line
from stallscope.store import TABLES, create_catalog

NOWHERE = "/nonexistent"  # where path-bearing settings point: reveals nothing, holds nothing
START_OVERHEAD_BYTES = 1 << 30  # address space DuckDB's and Arrow's threads reserve at start
BATCH_ROWS = 2048


@dataclass
class Loaded:
    """The data a query may see: one Arrow table per canonical table, catalog rows, notes."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    catalog: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_tables(traces: list[dict[str, Any]]) -> Loaded:
    """Arrow tables of ``traces`` (dicts with job_id, trace_id, dir, meta), job by job.

    A job with any unreadable Parquet file is left out whole (its tables would
    disagree otherwise), with a one-line note that names the job and the table,
    never a path.
    """
    loaded = Loaded()
    parts: dict[str, list[pa.Table]] = {t: [] for t in TABLES}
    for job_id, job_traces in _by_job(traces):
        try:
            job_parts = {t: list(_read_trace_table(tr, t)) for tr in job_traces for t in TABLES}
        except _Unreadable as bad:
            loaded.notes.append(f"job {job_id} left out: {bad} cannot be read as Parquet")
            continue
        for table, tables in job_parts.items():
            parts[table] += tables
        loaded.catalog += [_public_meta(tr["meta"]) for tr in job_traces]
    for table, tables in parts.items():
        if tables:
            try:
                loaded.tables[table] = pa.concat_tables(tables, promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                raise QueryError(f"the traces disagree on the columns of table {table}") from None
    return loaded


class _Unreadable(Exception):
    """``<trace_id>/<table>.parquet`` of a trace could not be read."""


def _by_job(traces: list[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    jobs: dict[str, list[dict[str, Any]]] = {}
    for tr in traces:
        jobs.setdefault(tr["job_id"], []).append(tr)
    yield from jobs.items()


def _read_trace_table(trace: dict[str, Any], table: str) -> Iterator[pa.Table]:
    path = os.path.join(trace["dir"], f"{table}.parquet")
    if not os.path.isfile(path):
        return
    try:
        yield pq.read_table(path)
    except MemoryError:
        raise
    except Exception:
        raise _Unreadable(f"{trace['trace_id']}/{table}.parquet") from None


def _public_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The catalog row with uploaders' paths reduced to base names."""
    public = dict(meta)
    for key in ("file_name", "name"):
        if isinstance(public.get(key), str):
            public[key] = os.path.basename(public[key].rstrip("/\\").replace("\\", "/"))
    return public


def sandbox_connection(
    loaded: Loaded, *, memory_bytes: int, threads: int
) -> duckdb.DuckDBPyConnection:
    """In-memory DuckDB over ``loaded`` that can touch no file and change no setting."""
    con = duckdb.connect(
        config={
            "threads": threads,
            "memory_limit": f"{max(memory_bytes >> 20, 64)}MB",
            "temp_directory": "",  # no spilling to disk, and no cwd-based path in the settings
            "max_temp_directory_size": "0B",
            "home_directory": NOWHERE,
            "extension_directory": NOWHERE,
            "secret_directory": NOWHERE,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
        }
    )
    for table in TABLES:
        if table in loaded.tables:
            con.register(table, loaded.tables[table])
        else:
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM {EMPTY_SELECTS[table]} WHERE false")
    create_catalog(con, loaded.catalog)
    con.execute("SET python_enable_replacements = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def run_query(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    timeout_s: float,
    max_rows: int | None,
    max_bytes: int | None,
) -> tuple[pa.Table, str | None]:
    """The capped result of ``sql`` and why it was cut (None when complete)."""
    statement = check_query(con, sql)  # run exactly the statement that was checked
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        con.interrupt()

    timer = threading.Timer(timeout_s, stop)
    timer.start()
    try:
        reader = con.sql(statement).to_arrow_reader(BATCH_ROWS)
        return _capped(reader, max_rows, max_bytes)
    except Exception as exc:
        if stopped.is_set():
            raise QueryError(f"query stopped after {timeout_s:g} s") from None
        if isinstance(exc, MemoryError | duckdb.OutOfMemoryException | pa.ArrowMemoryError):
            raise
        if isinstance(exc, duckdb.Error | pa.ArrowException):
            raise QueryError(first_line(exc)) from None
        raise
    finally:
        timer.cancel()


def _capped(
    reader: pa.RecordBatchReader, max_rows: int | None, max_bytes: int | None
) -> tuple[pa.Table, str | None]:
    batches: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in reader:
        if max_rows is not None and rows >= max_rows:
            return _table(reader, batches), f"first {rows:,} rows"
        kept = batch if max_rows is None else batch.slice(0, max_rows - rows)
        if max_bytes is not None and size + kept.nbytes > max_bytes:
            kept = kept.slice(0, _rows_within(kept, max_bytes - size))
            batches.append(kept)
            rows += kept.num_rows
            return _table(
                reader, batches
            ), f"first {rows:,} rows (results stop at {_mb(max_bytes)})"
        batches.append(kept)
        rows, size = rows + kept.num_rows, size + kept.nbytes
        if kept.num_rows < batch.num_rows:
            return _table(reader, batches), f"first {rows:,} rows"
    return _table(reader, batches), None


def _rows_within(batch: pa.RecordBatch, budget: int) -> int:
    """How many leading rows of ``batch`` fit in ``budget`` bytes (binary search)."""
    low, high = 0, batch.num_rows
    while low < high:
        mid = (low + high + 1) // 2
        if batch.slice(0, mid).nbytes <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def _table(reader: pa.RecordBatchReader, batches: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(batches, schema=reader.schema)


def _mb(n: int) -> str:
    return f"{n / 2**20:g} MB"


def limit_address_space(extra_bytes: int) -> None:
    """Cap this process's virtual memory at its current size plus ``extra_bytes``
    (never above a cap already set: limits only go down)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            vm_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return  # not Linux: DuckDB's memory_limit and the server's timeout still apply
    limit = vm_kb * 1024 + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def handle(request: dict[str, Any]) -> tuple[dict[str, Any], pa.Table | None]:
    """Header and result table of one request; every failure becomes ``{"error": ...}``."""
    memory = int(request["memory_bytes"])
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file grows past 0 bytes
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        pa.set_cpu_count(int(request["threads"]))
        limit_address_space(START_OVERHEAD_BYTES + int(request["load_memory_bytes"]) + memory)
        try:
            loaded = load_tables(request["traces"])
        except (MemoryError, pa.ArrowMemoryError):
            return {"error": "the traces do not fit in the SQL page's memory"}, None
        con = sandbox_connection(loaded, memory_bytes=memory, threads=int(request["threads"]))
        limit_address_space(memory)
        table, truncated = run_query(
            con,
            request["sql"],
            timeout_s=float(request["timeout_s"]),
            max_rows=request["max_rows"],
            max_bytes=request["max_bytes"],
        )
    except QueryError as exc:
        return {"error": str(exc)}, None
    except (MemoryError, duckdb.OutOfMemoryException, pa.ArrowMemoryError):
        return {"error": f"query stopped: it needs more than {_mb(memory)} of memory"}, None
    return {"truncated": truncated, "notes": loaded.notes}, table


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    header, table = handle(request)
    out = sys.stdout.buffer
    out.write(json.dumps(header).encode() + b"\n")
    if table is not None:
        with pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
