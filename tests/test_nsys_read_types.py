"""nsys reads: the unchecked fast read gives exactly what the checked read gives, odd values included.

``NsysDb.fetch_fast`` reads integer columns as stored and falls back to the
checked SQL (``typeof``/``CAST`` per value) when Arrow refuses a value. Each
case plants one odd value in an export and compares every raw table with the
checked read of the same file. The reads go through the ADBC driver
(``native``) where it is installed and through ``sqlite3`` otherwise: the odd
values are read both ways, and the native read of the samples is compared
with the ``sqlite3`` read.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import pytest

from stallscope.ingest.nsys import native
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


SAMPLES = sorted(
    (Path(__file__).resolve().parent.parent / "sample_traces" / "nsys").glob("*.sqlite.gz")
)
needs_native = pytest.mark.skipif(not native.enabled(), reason="adbc-driver-sqlite not installed")


@pytest.fixture(params=["native", "sqlite3"])
def reader_kind(request, monkeypatch):
    """Run a test with the ADBC reader (where installed) and with sqlite3 alone."""
    if request.param == "native" and not native.enabled():
        pytest.skip("adbc-driver-sqlite not installed")
    monkeypatch.setattr(native, "MIN_ROWS", 0)  # the test exports are small
    if request.param == "sqlite3":
        monkeypatch.setenv("STALLSCOPE_NSYS_READER", "sqlite3")
    return request.param


@pytest.mark.parametrize("schema", ["new", "old", "3.28"])
def test_clean_export_is_read_unchecked_once(tmp_path, schema, monkeypatch):
    monkeypatch.setenv("STALLSCOPE_NSYS_READER", "sqlite3")  # counts the sqlite3 path's reads
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
def test_odd_value_reads_as_the_checked_read(tmp_path, table, column, value, reader, reader_kind):
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


@needs_native
@pytest.mark.parametrize("schema", ["new", "old", "3.28"])
def test_clean_export_is_read_natively(tmp_path, schema, monkeypatch):
    """Every event table of a clean export comes from the ADBC driver, none from sqlite3."""
    got = []
    original = native.read
    monkeypatch.setattr(native, "MIN_ROWS", 0)
    monkeypatch.setattr(native, "read", lambda *a: got.append(original(*a)) or got[-1])
    db = NsysDb(export(tmp_path, schema), "x")
    try:
        for name in ("act", "runtime", "osrt", "nvtx"):
            got.clear()
            table = READERS[name](db)
            assert got and all(t is not None for t in got), name
            assert table.equals(checked(db, READERS[name])), name
    finally:
        db.close()


@needs_native
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name.split(".")[0])
def test_native_read_is_the_sqlite3_read(tmp_path, sample, monkeypatch):
    """On the real samples the ADBC read (split into rowid ranges by threads) is the sqlite3 read."""
    path = tmp_path / "x.sqlite"
    with gzip.open(sample) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    monkeypatch.setattr(native, "MIN_ROWS", 0)  # small tables are read natively,
    monkeypatch.setattr(native, "SPLIT_MIN_ROWS", 1000)  # and split too
    monkeypatch.setattr(native, "duckdb_threads", lambda: 3)
    db = NsysDb(path, "x")
    try:
        for name, reader in READERS.items():
            fast = reader(db)
            monkeypatch.setenv("STALLSCOPE_NSYS_READER", "sqlite3")
            slow = reader(db)
            monkeypatch.delenv("STALLSCOPE_NSYS_READER")
            assert fast.equals(slow), name
    finally:
        db.close()


@needs_native
def test_small_tables_are_read_with_sqlite3(tmp_path, monkeypatch):
    """Below native.MIN_ROWS rows a table never reaches the ADBC driver (small exports)."""
    calls = []
    monkeypatch.setattr(native, "read", lambda *a: calls.append(a))
    db = NsysDb(export(tmp_path), "x")
    try:
        for reader in READERS.values():
            reader(db)
    finally:
        db.close()
    assert calls == []
