"""Read-only SQL over the store, safe to offer to every user of a shared server.

:func:`readonly_query` runs one ``SELECT`` (or ``WITH … SELECT``) on views of
the canonical tables. The connection may read only the store's ``jobs/``
folder (DuckDB ``allowed_directories`` with external access disabled and the
configuration locked), every statement that is not a query is refused before
it runs, and a query is interrupted after ``timeout_s``.
"""

from __future__ import annotations

import threading

import duckdb
import pandas as pd

from stallscope.errors import StallscopeError
from stallscope.store import Store, TraceRef

ALLOWED_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


class QueryError(StallscopeError):
    """A refused, failed or timed-out user query (the message is safe to show)."""


def readonly_connection(
    store: Store, traces: list[TraceRef] | None = None
) -> duckdb.DuckDBPyConnection:
    """Views over the whole store (or ``traces``); afterwards no file outside ``jobs/`` can be touched."""
    con = store.connect(traces)
    jobs = str(store.jobs_dir.resolve()) + "/"
    con.execute("SET allowed_directories = [?]", [jobs])
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET memory_limit = '2GB'")
    con.execute("SET lock_configuration = true")
    return con


def readonly_query(
    store: Store,
    sql: str,
    *,
    timeout_s: float = 30.0,
    max_rows: int | None = 10_000,
    traces: list[TraceRef] | None = None,
) -> pd.DataFrame:
    """Result of one read-only query (at most ``max_rows`` rows; None for all).

    With ``traces`` the views cover only those traces (one job's), else the whole store.
    """
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise QueryError("empty query")
    con = readonly_connection(store, traces)
    try:
        try:
            statements = con.extract_statements(text)
        except duckdb.Error as exc:
            raise QueryError(_first_line(exc)) from None
        if len(statements) != 1:
            raise QueryError("one statement at a time, please")
        if statements[0].type not in ALLOWED_STATEMENTS:
            raise QueryError(f"only SELECT queries are allowed (got {statements[0].type.name})")
        timer = threading.Timer(timeout_s, con.interrupt)
        timer.start()
        try:
            cursor = con.execute(text)
            if max_rows is None:
                return cursor.fetchdf()
            return cursor.fetch_df_chunk(max(1, max_rows // 2048 + 1)).head(max_rows)
        except duckdb.InterruptException:
            raise QueryError(f"query stopped after {timeout_s:g} s") from None
        except duckdb.Error as exc:
            raise QueryError(_first_line(exc)) from None
        finally:
            timer.cancel()
    finally:
        con.close()


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
