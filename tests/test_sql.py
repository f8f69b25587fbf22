"""The dashboard's SQL box: queries work, files and writes do not."""

from __future__ import annotations

import pytest

from stallscope.ingest import ingest_paths
from stallscope.sql import QueryError, readonly_query
from tests.kineto_builder import KinetoTrace


@pytest.fixture
def filled(store, tmp_path):
    t = KinetoTrace()
    t.kernel("gemm", 0, 5_000)
    t.kernel("relu", 6_000, 1_000)
    ingest_paths(store, [str(t.write(tmp_path / "t.json"))])
    return store


def test_select_over_views(filled):
    frame = readonly_query(
        filled,
        "SELECT n.name, g.end_ns - g.start_ns AS ns FROM gpu g JOIN names n USING (trace_id, name_id) ORDER BY ns",
    )
    assert frame.to_dict("records") == [{"name": "relu", "ns": 1000}, {"name": "gemm", "ns": 5000}]
    assert readonly_query(filled, "SELECT count(*) AS n FROM catalog").n[0] == 1


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/*')",
        "COPY gpu TO 'x.csv'",
        "ATTACH 'other.db'",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "CREATE TABLE t AS SELECT 1",
        "SELECT 1; SELECT 2",
        "PRAGMA database_list",
    ],
)
def test_refused(filled, query):
    with pytest.raises(QueryError):
        frame = readonly_query(filled, query)
        assert frame is None  # never reached: a refused query raises


def test_rows_are_capped(filled):
    assert len(readonly_query(filled, "SELECT * FROM range(100000)", max_rows=50)) == 50


def test_timeout(filled):
    with pytest.raises(QueryError, match="stopped after"):
        readonly_query(filled, "SELECT count(*) FROM range(100000000000) a", timeout_s=0.5)
