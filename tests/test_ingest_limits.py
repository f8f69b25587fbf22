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
from stallscope.ingest.nsys.db import NsysDb, harden
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


def _limited(work, timeout_s=None, memory_mb=None):
    from stallscope.supervise import call_limited

    cleaned = []
    try:
        return call_limited(
            work, timeout_s=timeout_s, memory_mb=memory_mb, cleanup=lambda: cleaned.append(1)
        ), cleaned
    except BaseException as exc:
        exc.cleaned = cleaned
        raise


def test_call_limited_returns_the_workers_result():
    import os

    (pid, answer), cleaned = _limited(lambda: (os.getpid(), [1, "a"]))
    assert pid != os.getpid() and answer == [1, "a"] and cleaned == []


def test_call_limited_raises_the_workers_error_as_it_was():
    def bad():
        raise InputError("x.json", "truncated JSON")

    with pytest.raises(InputError) as caught:
        _limited(bad)
    assert (caught.value.source, caught.value.reason, str(caught.value)) == (
        "x.json", "truncated JSON", "x.json: truncated JSON"
    )  # fmt: skip


def test_call_limited_stops_a_worker_stuck_past_the_deadline(monkeypatch):
    """Stuck where no deadline check runs (C code; here a sleep): killed after the grace."""
    import time

    from stallscope import supervise

    monkeypatch.setattr(supervise, "GRACE_S", 0.3)
    started = time.monotonic()
    with pytest.raises(InputError) as caught:
        _limited(lambda: time.sleep(60), timeout_s=0.2)
    assert time.monotonic() - started < 10
    assert str(caught.value) == (
        "ingest took longer than the 0.2 s limit (--timeout or $STALLSCOPE_INGEST_TIMEOUT "
        "raise it); the store is unchanged"
    )
    assert caught.value.cleaned == [1]


def test_call_limited_stops_a_worker_past_the_memory_limit():
    def hog():
        import time

        block = bytearray(300 << 20)  # touched: resident, not just reserved
        block[::4096] = b"x" * len(block[::4096])
        time.sleep(30)

    with pytest.raises(InputError, match="ingest needed more than the 100 MiB memory limit"):
        _limited(hog, memory_mb=100)


def test_a_killed_worker_is_an_environment_problem():
    import os
    import signal

    from stallscope.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match=r"worker was killed \(SIGKILL: out of memory\?\)"):
        _limited(lambda: os.kill(os.getpid(), signal.SIGKILL))


def test_error_classes_survive_pickling():
    import pickle

    from stallscope.errors import StoreFileCorrupt, error_for_exit

    error = pickle.loads(pickle.dumps(InputError("a.json", "bad")))
    assert (type(error), error.source, error.reason, str(error)) == (
        InputError,
        "a.json",
        "bad",
        "a.json: bad",
    )
    assert type(pickle.loads(pickle.dumps(StoreFileCorrupt("x")))) is StoreFileCorrupt
    assert [type(error_for_exit(c, "m")).__name__ for c in (2, 3, 4, -9, 70)] == [
        "UsageError", "InputError", "EnvironmentProblem", "EnvironmentProblem", "StallscopeError"
    ]  # fmt: skip
    assert str(error_for_exit(3, "x.json: bad")) == "x.json: bad"


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
