"""The ingest's limits as units: the SQLite deadline, the rank and time ranges, the decompression cap."""

from __future__ import annotations

import gzip
import os
import re
import sqlite3

import pyarrow as pa
import pytest

from stallscope.errors import InputError
from stallscope.ingest import limits
from stallscope.ingest.nsys_db import NsysDb, harden
from stallscope.ingest.reader import gunzip_limited


@pytest.fixture(autouse=True)
def no_deadline():
    yield
    limits.start_deadline(None)
    limits.apply_memory_limit(None)


def test_a_query_past_the_deadline_is_interrupted(tmp_path):
    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).execute(
        "CREATE TABLE StringIds (id INTEGER, value TEXT)"
    ).connection.commit()
    db = NsysDb(path, "x.sqlite")
    limits.start_deadline(0.2)
    endless = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT max(n) FROM r"
    with pytest.raises(InputError, match=r"x.sqlite: ingest took longer than the 0.2 s limit"):
        db.rows(endless)
    db.close()


def test_hardened_connections_refuse_writes(tmp_path):
    con = sqlite3.connect(tmp_path / "y.sqlite")
    harden(con)
    with pytest.raises(sqlite3.OperationalError, match="readonly|query_only|attempt to write"):
        con.execute("CREATE TABLE t (a)")


@pytest.mark.parametrize(
    ("rank", "world", "message"),
    [
        (0, 1, None),
        (999_999, 1_000_000, None),
        (None, 4, None),
        (-1, None, "rank -1 is out of range"),
        (10**30, None, "rank 1e+30 is out of range"),
        (4, 4, "rank 4 is not below the world size 4"),
        (0, 1_000_001, "world size 1,000,001 is out of range"),
        (0, 0, "world size 0 is out of range"),
    ],
)
def test_rank_ranges(rank, world, message):
    if message is None:
        limits.check_rank("f", rank, world)
    else:
        with pytest.raises(InputError, match=re.escape(message)):
            limits.check_rank("f", rank, world)


def _gpu(starts, ends):
    return {
        "gpu": pa.table(
            {"start_ns": pa.array(starts, pa.int64()), "end_ns": pa.array(ends, pa.int64())}
        )
    }


def test_time_ranges():
    epoch = 1_700_000_000 * 10**9  # a real epoch time in ns is fine
    limits.check_times("f", _gpu([epoch], [epoch + 10**12]))
    with pytest.raises(InputError, match="timestamps out of range"):
        limits.check_times("f", _gpu([0], [2**63 - 1]))
    with pytest.raises(InputError, match="events span 32 days"):
        limits.check_times("f", _gpu([0], [32 * 86_400 * 10**9]))


def test_decompression_stops_at_the_cap_and_a_third_of_the_memory_limit(monkeypatch):
    blob = gzip.compress(b" " * (40 << 20))  # ~40 KiB -> 40 MiB: 1000:1
    with pytest.raises(
        InputError, match=r"over 100x its size plus 32.0 MiB\): a decompression bomb"
    ):
        gunzip_limited("b.gz", blob)
    monkeypatch.setenv("STALLSCOPE_DECOMPRESS_HEADROOM_MB", "64")
    assert len(gunzip_limited("b.gz", blob)) == 40 << 20  # a raised headroom lets it through
    limits.apply_memory_limit(90)
    with pytest.raises(InputError, match="more than 30.0 MiB, a third of the 90 MiB limit"):
        gunzip_limited("b.gz", blob)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux /proc only")
def test_group_memory_check_matches_the_pss_sum():
    """The cheap RSS bound never changes the verdict: over the limit iff the PSS sum is."""
    from stallscope.supervise import group_memory_mb, group_over_memory

    group = os.getpgid(0)
    pss = group_memory_mb(group)
    assert pss > 10  # this Python, with pyarrow loaded
    assert group_over_memory(group, pss / 2)
    assert not group_over_memory(group, pss * 4)
    assert not group_over_memory(group, 10**9)
