"""nsys reads: the unchecked fast read gives exactly what the checked read gives, odd values included.

``NsysDb.fetch_fast`` reads integer columns as stored and falls back to the
checked SQL (``typeof``/``CAST`` per value) when Arrow refuses a value. Each
case plants one odd value in an export and compares every raw table with the
checked read of the same file.
"""

from __future__ import annotations

import sqlite3

import pytest

from stallscope.ingest.nsys import tables as nsys_tables
from stallscope.ingest.nsys.db import NsysDb
from tests.nsys_builder import NsysBuilder

READERS = {
    "act": nsys_tables.read_activities,
    "runtime": nsys_tables.read_runtime,
    "osrt": nsys_tables.read_osrt,
    "nvtx": nsys_tables.read_nvtx,
    "threads": lambda db: nsys_tables.read_threads(db)[0],
}


def export(tmp_path, schema: str = "new"):
    b = NsysBuilder(schema)
    b.process(10, "python", {10: "main"})
    b.gpu(0)
    for i in range(3):
        b.api(10, 10, 100 + 50 * i, 110 + 50 * i, i + 1, "cudaLaunchKernel")
        b.kernel(10, 0, 7, 120 + 50 * i, 140 + 50 * i, i + 1, f"k{i}(float*)")
        b.nvtx(10, 10, 95 + 50 * i, 145 + 50 * i, f"step {i}")
    b.memcpy(10, 0, 7, 300, 320, 9, 4096, "HTOD", "PAGEABLE", "DEVICE")
    b.osrt(10, 10, 90, 400, "poll")
    return b.write(tmp_path / f"{schema}.sqlite")


def checked(db: NsysDb, reader):
    """The reader with fetch_fast forced to the checked read."""
    original = db.fetch_fast
    db.fetch_fast = lambda build, schema, table=None: db.fetch(build(), schema)
    try:
        return reader(db)
    finally:
        db.fetch_fast = original


def unchecked_reads(db: NsysDb, reader) -> list[bool]:
    """Which fetches of ``reader`` ran unchecked (True) or checked (False)."""
    calls, fetch = [], db.fetch

    def spy(sql, schema, *, checked=True):
        calls.append(not checked)
        return fetch(sql, schema, checked=checked)

    db.fetch = spy
    try:
        reader(db)
    finally:
        db.fetch = fetch
    return calls


@pytest.mark.parametrize("schema", ["new", "old", "3.28"])
def test_clean_export_is_read_unchecked_once(tmp_path, schema):
    db = NsysDb(export(tmp_path, schema), "x")
    try:
        for name, reader in READERS.items():
            assert reader(db).equals(checked(db, reader)), name
            calls = unchecked_reads(db, reader)
            # no second, checked read (read_threads also reads the small PROCESSES table checked)
            assert calls == ([True, False] if name == "threads" else [True] * len(calls)), name
    finally:
        db.close()


ODD_VALUES = [
    ("CUPTI_ACTIVITY_KIND_KERNEL", "start", "'120'", "act"),  # text in an integer column
    ("CUPTI_ACTIVITY_KIND_KERNEL", "gridX", "x'01'", "act"),  # a BLOB
    ("CUPTI_ACTIVITY_KIND_KERNEL", "end", "139.75", "act"),  # a real: truncated either way
    ("CUPTI_ACTIVITY_KIND_KERNEL", "registersPerThread", "1e19", "act"),  # beyond int64
    ("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid", "-1.5e3", "act"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "bytes", "'many'", "act"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid", "'main'", "runtime"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId", "2.0", "runtime"),
    ("OSRT_API", "end", "-1e19", "osrt"),
    ("NVTX_EVENTS", "end", "'soon'", "nvtx"),
    ("NVTX_EVENTS", "text", "42", "nvtx"),  # a number in a text column: NULL either way
    ("NVTX_EVENTS", "domainId", "x'ff'", "nvtx"),
    ("ThreadNames", "globalTid", "2.5", "threads"),
]


@pytest.mark.parametrize(("table", "column", "value", "reader"), ODD_VALUES)
def test_odd_value_reads_as_the_checked_read(tmp_path, table, column, value, reader):
    path = export(tmp_path)
    con = sqlite3.connect(path)
    con.execute(f'UPDATE {table} SET "{column}" = {value} WHERE rowid = 1')
    con.commit()
    con.close()
    db = NsysDb(path, "x")
    try:
        read = READERS[reader]
        assert read(db).equals(checked(db, read))
    finally:
        db.close()
