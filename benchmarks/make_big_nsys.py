"""Build a large Nsight Systems SQLite export by repeating a real one's events, shifted in time.

    python benchmarks/make_big_nsys.py SRC.sqlite[.gz] OUT.sqlite --copies 150

The output starts as a copy of the source (every table, index and metadata row
as it was); then every *event table*, a table with integer ``start`` and
``end`` columns (kernels, memcpys, memsets, synchronizations, CUDA API calls,
NVTX, OS runtime, scheduling, overhead...), gets ``copies - 1`` more copies of
its own rows. In copy k (k = 1 .. copies-1):

* ``start`` and ``end`` move later by k * shift ns, where shift is the source's
  span (first start to last end over all event tables) plus 1 ms. A time of 0
  or NULL (nsys: "not collected", an NVTX range never ended) stays as it is;
* ``correlationId`` moves up by k * (largest correlation id + 1), so every copy's
  GPU work still pairs with its own launch call (0 or NULL, "none", stays);
* an integer primary key (``eventId`` of NVTX_EVENTS in schema 3.28+) moves up
  by k * (its largest value + 1), so it stays unique.

Nothing else changes: names (StringIds), threads, processes, GPUs and enum
tables are shared by all copies, so the result is still a valid export that
any reader of the source reads, with ``copies`` times its events. No index is
added or dropped.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import sys
import time
from pathlib import Path

_GAP_NS = 1_000_000  # between two copies: 1 ms
_CORRELATION = "correlationId"


def event_tables(con: sqlite3.Connection) -> dict[str, list[tuple[str, str, int]]]:
    """Tables with ``start`` and ``end`` columns -> their ``(column, declared type, pk)`` rows."""
    out = {}
    names = con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    for (table,) in names.fetchall():
        info = con.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
        cols = [(row[1], (row[2] or "").upper(), row[5]) for row in info]
        if {"start", "end"} <= {c[0] for c in cols}:
            out[table] = cols
    return out


def span_ns(con: sqlite3.Connection, tables: list[str]) -> tuple[int, int]:
    """(first start, last end) over ``tables``, in the file's integer ns (0s ignored)."""
    lo, hi = None, None
    for table in tables:
        row = con.execute(
            f'SELECT min(nullif(start, 0)), max(nullif("end", 0)) FROM {_quote(table)}'
        ).fetchone()
        if row[0] is not None:
            lo = row[0] if lo is None else min(lo, row[0])
        if row[1] is not None:
            hi = row[1] if hi is None else max(hi, row[1])
    return (lo or 0, hi or 0)


def id_steps(con: sqlite3.Connection, tables: dict[str, list[tuple[str, str, int]]]) -> dict:
    """``{(table, column): step}``: how far copy 1 moves each id column (copy k: k * step)."""
    top_corr = 0
    for table, cols in tables.items():
        if _CORRELATION in {c[0] for c in cols}:
            value = con.execute(f"SELECT max({_CORRELATION}) FROM {_quote(table)}").fetchone()[0]
            top_corr = max(top_corr, value or 0)
    steps = {}
    for table, cols in tables.items():
        for name, kind, pk in cols:
            if name == _CORRELATION:
                steps[(table, name)] = top_corr + 1
            elif pk and "INT" in kind:
                value = con.execute(f"SELECT max({_quote(name)}) FROM {_quote(table)}").fetchone()
                steps[(table, name)] = (value[0] or 0) + 1
    return steps


def copy_sql(table: str, cols: list[tuple[str, str, int]], steps: dict) -> str:
    """``INSERT ... SELECT`` of the first ``:n`` rows of ``table`` with times moved by ``:dt``
    ns and id columns by ``:k`` times their step."""
    select = []
    for name, _, _ in cols:
        q = _quote(name)
        if name in ("start", "end"):
            select.append(f"CASE WHEN {q} IS NULL OR {q} = 0 THEN {q} ELSE {q} + :dt END")
        elif (table, name) in steps:
            select.append(
                f"CASE WHEN {q} IS NULL OR {q} = 0 THEN {q} ELSE {q} + :k * {steps[(table, name)]} END"
            )
        else:
            select.append(q)
    names = ", ".join(_quote(c[0]) for c in cols)
    return (
        f"INSERT INTO {_quote(table)} ({names}) SELECT {', '.join(select)} "
        f"FROM {_quote(table)} WHERE rowid <= :n ORDER BY rowid"
    )


def make(src: Path, out: Path, copies: int) -> dict[str, int]:
    """Write ``out``; returns the row count of each event table (after)."""
    if src.suffix == ".gz":
        with gzip.open(src, "rb") as fin, open(out, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    else:
        shutil.copyfile(src, out)
    con = sqlite3.connect(out, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        tables = event_tables(con)
        lo, hi = span_ns(con, list(tables))
        shift = hi - lo + _GAP_NS
        steps = id_steps(con, tables)
        counts = {}
        con.execute("BEGIN")
        for table, cols in tables.items():
            (n,) = con.execute(f"SELECT max(rowid) FROM {_quote(table)}").fetchone()
            if not n:
                counts[table] = 0
                continue
            sql = copy_sql(table, cols, steps)
            for k in range(1, copies):
                con.execute(sql, {"n": n, "dt": k * shift, "k": k})
            counts[table] = con.execute(f"SELECT count(*) FROM {_quote(table)}").fetchone()[0]
        con.execute("COMMIT")
    finally:
        con.close()
    return counts


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="an nsys SQLite export (.sqlite or .sqlite.gz)")
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--copies", type=int, default=150, help="copies of the events (default 150)"
    )
    args = parser.parse_args()
    if args.copies < 1:
        parser.error("--copies must be at least 1")
    started = time.perf_counter()
    counts = make(args.src, args.out, args.copies)
    for table, n in sorted(counts.items()):
        if n:
            print(f"{table}: {n:,} rows")
    size = args.out.stat().st_size / 1e6
    print(f"{args.out}: {size:.1f} MB, {args.copies} copies, {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
