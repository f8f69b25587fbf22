"""nsys tables read by forked workers, one rowid range each: the same tables, and every fallback.

The forked workers are the ``sqlite3`` path's (the ADBC reader, ``native``, reads
ranges in threads instead): every test here turns the ADBC reader off.
"""

from __future__ import annotations

import os
import sqlite3

import pytest

from stallscope.errors import InputError
from stallscope.ingest import startup
from stallscope.ingest.nsys import db as nsys_db
from stallscope.ingest.nsys import parallel as nsys_parallel
from stallscope.ingest.nsys import tables as nsys_tables
from stallscope.ingest.nsys.db import NsysDb
from tests.nsys_builder import NsysBuilder

READERS = {
    "act": nsys_tables.read_activities,
    "runtime": nsys_tables.read_runtime,
    "osrt": nsys_tables.read_osrt,
    "nvtx": nsys_tables.read_nvtx,
}


@pytest.fixture(autouse=True)
def sqlite3_reader(monkeypatch):
    monkeypatch.setenv("STALLSCOPE_NSYS_READER", "sqlite3")


def export(tmp_path, n: int = 300):
    b = NsysBuilder("new")
    b.process(10, "python", {10: "main", 11: "loader"})
    b.gpu(0)
    for i in range(n):
        t = 1_000 * i
        b.api(10, 10, t, t + 100, i + 1, "cudaLaunchKernel")
        b.kernel(10, 0, 7, t + 200, t + 400, i + 1, f"k{i % 7}(float*)")
        b.nvtx(10, 10 + i % 2, t, t + 500, f"step {i}")
        b.osrt(10, 11, t + 10, t + 90, "poll")
        if i % 10 == 0:
            b.memcpy(10, 0, 8, t + 500, t + 600, 10_000 + i, 4096, "HTOD", "PINNED", "DEVICE")
    return b.write(tmp_path / "many.sqlite")


def read_all(path, workers: str, monkeypatch) -> dict:
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", workers)
    db = NsysDb(path, "many.sqlite")
    try:
        return {name: read(db) for name, read in READERS.items()}
    finally:
        db.close()


def test_parallel_read_equals_serial(tmp_path, monkeypatch):
    path = export(tmp_path)
    serial = read_all(path, "1", monkeypatch)
    parallel = read_all(path, "3", monkeypatch)
    for name in READERS:
        assert serial[name].num_rows > 0
        assert parallel[name].equals(serial[name]), name


def test_odd_value_in_a_worker_rereads_checked(tmp_path, monkeypatch):
    """A text in an integer column, met by a worker: the checked read runs, as in one process."""
    path = export(tmp_path)
    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'late' WHERE rowid = 250")
    con.commit()
    con.close()
    assert read_all(path, "3", monkeypatch)["act"].equals(read_all(path, "1", monkeypatch)["act"])


def test_a_worker_that_dies_means_reading_here(tmp_path, monkeypatch):
    path = export(tmp_path)
    parent = os.getpid()
    real = nsys_db._range_table

    def dying(*args):
        if os.getpid() != parent:
            os._exit(1)  # a worker killed mid-range (out of memory, say)
        return real(*args)

    monkeypatch.setattr(nsys_db, "_range_table", dying)
    assert read_all(path, "2", monkeypatch)["nvtx"].equals(read_all(path, "1", monkeypatch)["nvtx"])


def test_an_sqlite_error_in_a_worker_is_an_input_error(tmp_path, monkeypatch):
    path = export(tmp_path)
    real = nsys_db._range_table

    def broken(sql, schema, checked, con, first, last):
        return real("SELECT * FROM no_such_table", schema, checked, con, first, last)

    monkeypatch.setattr(nsys_db, "_range_table", broken)
    with pytest.raises(InputError, match="many.sqlite: corrupt or unreadable SQLite database"):
        read_all(path, "2", monkeypatch)


@pytest.mark.parametrize(
    ("lo", "hi", "count", "expected"),
    [
        (1, 10, 3, [(1, 4), (5, 7), (8, 10)]),
        (5, 5, 4, [(5, 5)]),
        (0, 2, 8, [(0, 0), (1, 1), (2, 2)]),
        (-3, 4, 2, [(-3, 0), (1, 4)]),
    ],
)
def test_rowid_ranges_cover_every_id_once(lo, hi, count, expected):
    assert nsys_parallel.rowid_ranges(lo, hi, count) == expected


def test_worker_count(monkeypatch):
    monkeypatch.delenv("STALLSCOPE_DECODE_WORKERS", raising=False)
    big = nsys_parallel.PARALLEL_MIN_ROWS
    assert nsys_parallel.read_workers(big) == 1  # not the stallscope command: never by default
    monkeypatch.setattr(startup, "in_cli", lambda: True)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert nsys_parallel.read_workers(big) == startup.MAX_WORKERS
    assert nsys_parallel.read_workers(big - 1) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert nsys_parallel.read_workers(big) == 1
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", "3")
    assert nsys_parallel.read_workers(10) == 3
    monkeypatch.setenv("STALLSCOPE_DECODE_WORKERS", "many")
    assert nsys_parallel.read_workers(big) == 1
