"""The dashboard's SQL box is a sandbox: queries work; files, settings, paths and the
server's memory are out of reach, whatever the query tries (docs/security.md, "SQL page")."""

from __future__ import annotations

import hashlib
import os
import resource
from pathlib import Path

import pytest

from stallscope.ingest import ingest_paths
from stallscope.sql import (
    MAX_RESULT_BYTES,
    QueryError,
    check_query,
    readonly_query,
    sandbox_query,
)
from tests.kineto_builder import KinetoTrace


def _ingest(store, folder: Path, name: str, kernels: list[tuple[str, int, int]]) -> str:
    t = KinetoTrace()
    for kernel, start, dur in kernels:
        t.kernel(kernel, start, dur)
    folder.mkdir(parents=True, exist_ok=True)
    (result,) = ingest_paths(store, [str(t.write(folder / name))])
    return result.job_id


@pytest.fixture
def filled(store, tmp_path):
    """Two jobs, uploaded from absolute paths (as the dashboard's temp files are)."""
    _ingest(store, tmp_path / "uploads" / "secret-dir", "t.json", [("gemm", 0, 5_000), ("relu", 6_000, 1_000)])  # fmt: skip
    _ingest(store, tmp_path / "uploads" / "other", "u.json", [("softmax", 0, 2_000)])
    return store


def snapshot(store) -> dict[str, str]:
    """Every file under the store root, by relative path, with a hash of its bytes."""
    return {
        str(p.relative_to(store.root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.root.rglob("*"))
        if p.is_file()
    }


def refused(store, query: str, **kw) -> str:
    """The one-line message of a refused or stopped query; the store is byte-identical after."""
    before = snapshot(store)
    with pytest.raises(QueryError) as info:
        readonly_query(store, query, **kw)
    assert snapshot(store) == before
    message = str(info.value)
    assert message and "\n" not in message
    assert str(store.root) not in message and "/etc/passwd" not in message.replace(
        "'/etc/passwd'", ""
    )
    return message


def test_select_over_tables(filled):
    frame = readonly_query(
        filled,
        "SELECT n.name, g.end_ns - g.start_ns AS ns FROM gpu g JOIN names n USING (trace_id, name_id) ORDER BY ns",
    )
    assert frame.to_dict("records") == [
        {"name": "relu", "ns": 1000},
        {"name": "softmax", "ns": 2000},
        {"name": "gemm", "ns": 5000},
    ]
    assert readonly_query(filled, "SELECT count(*) AS n FROM catalog").n[0] == 2
    # CTEs, subqueries, range() and ordinary functions are fine
    ok = readonly_query(
        filled,
        "WITH k AS (SELECT * FROM gpu) SELECT upper('a') AS u, (SELECT count(*) FROM k) AS n, "
        "(SELECT sum(range) FROM range(4)) AS s",
    )
    assert ok.to_dict("records") == [{"u": "A", "n": 3, "s": 6}]
    assert "start_ns" in set(readonly_query(filled, "DESCRIBE gpu").column_name)
    assert len(readonly_query(filled, "SUMMARIZE SELECT start_ns FROM gpu")) == 1


def test_column_listing_matches_the_sandbox(filled):
    from stallscope.sql import table_columns

    frame = readonly_query(
        filled,
        "SELECT table_name AS t, list(column_name ORDER BY ordinal_position) AS c "
        "FROM information_schema.columns GROUP BY 1 ORDER BY 1",
    )
    seen = [(t, list(c)) for t, c in zip(frame.t, frame.c, strict=True)]
    assert table_columns(filled.traces()) == seen
    assert dict(seen)["gpu"][:6] == ["trace_id", "device", "stream", "kind", "start_ns", "end_ns"]


def test_scoped_to_some_traces(filled):
    (job,) = [j["job_id"] for j in filled.jobs() if j["name"] == "u.json"]
    frame = readonly_query(filled, "SELECT count(*) AS n FROM gpu", traces=filled.traces(job))
    assert frame.n[0] == 1


def test_paths_shown_as_base_names(filled, tmp_path):
    frame = readonly_query(filled, "SELECT file_name, name FROM catalog ORDER BY 1")
    assert list(frame.file_name) == ["t.json", "u.json"]
    everything = readonly_query(
        filled,
        "SELECT string_agg(c::VARCHAR, ' ') AS s FROM (SELECT COLUMNS(*)::VARCHAR AS c FROM catalog)",
    )
    assert str(tmp_path) not in everything.s[0]


def test_explain_analyze_copy_onto_job_json(filled):
    """The reported escape: EXPLAIN ANALYZE executes its COPY, onto the store's own files."""
    job = filled.jobs()[0]["job_id"]
    target = filled.jobs_dir.resolve() / job / "job.json"
    message = refused(
        filled, f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv, HEADER false)"
    )
    assert "only SELECT" in message
    assert filled.has_job(job)


@pytest.mark.parametrize(
    "query",
    [
        "COPY gpu TO 'x.csv'",
        "COPY (SELECT 1) TO '{jobs}/x.csv'",
        "EXPLAIN SELECT 1",
        "ATTACH '{jobs}/other.db' AS o",
        "SET enable_external_access = true",
        "RESET memory_limit",
        "PRAGMA database_list",
        "INSTALL httpfs",
        "LOAD httpfs",
        "CREATE TABLE t AS SELECT 1",
        "CREATE MACRO m(x) AS x + 1",
        "EXPORT DATABASE '{jobs}/dump'",
        "IMPORT DATABASE '{jobs}'",
        "SELECT 1; COPY (SELECT 1) TO '{jobs}/x.csv'",
        "SELECT 1; SELECT 2",
        "/* SELECT */ COPY gpu TO 'x.csv'",
        "SELECT 1 -- harmless\n; ATTACH 'x.db'",
    ],
)
def test_statements_other_than_one_select_are_refused(filled, query):
    refused(filled, query.format(jobs=filled.jobs_dir.resolve()))


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM read_blob('/etc/passwd')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM read_parquet('{jobs}/*/*/gpu.parquet', filename = true)",
        "SELECT filename FROM gpu",
        "SELECT * FROM glob('/*')",
        "SELECT * FROM glob('{jobs}/*')",
        "SELECT * FROM duckdb_settings()",
        "SELECT * FROM duckdb_databases()",
        "SELECT * FROM duckdb_extensions()",
        "SELECT * FROM pg_catalog.pg_settings",
        "SELECT current_setting('temp_directory')",
        "SELECT current_setting('allowed_directories')",
        "SELECT * FROM query('SELECT 1')",
        "SELECT * FROM gpu, /* a comment */ read_text('/etc/passwd')",
        "SELECT (SELECT max(content) FROM read_text('/etc/passwd')) AS x",
        "WITH x AS (SELECT * FROM glob('/*')) SELECT * FROM x",
        "SELECT * FROM pg_settings, (WITH pg_settings AS (SELECT 1) SELECT 1)",
        "SELECT * FROM duckdb_databases",
        "SELECT * FROM information_schema.schemata",
        "SHOW home_directory",
        "SELECT * FROM (SHOW temp_directory)",
        "SHOW ALL TABLES",
        "SUMMARIZE SELECT * FROM read_text('/etc/passwd')",
        "DESCRIBE pg_settings",
        "SELECT 'temp_directory'.current_setting()",
        "SELECT * FROM gpu, LATERAL read_text('/etc/passwd')",
        "SELECT getenv('HOME')",
    ],
)
def test_files_settings_and_paths_are_out_of_reach(filled, query):
    refused(filled, query.format(jobs=filled.jobs_dir.resolve()))


def test_the_connection_itself_blocks_files_even_past_the_filter(filled):
    """Defense in depth: raw SQL on the sandbox connection, no statement filter in front."""
    import duckdb

    from stallscope.sql_child import load_tables, sandbox_connection

    before = snapshot(filled)
    con = sandbox_connection(
        load_tables(_request_traces(filled)), memory_bytes=256 << 20, threads=1
    )
    jobs = filled.jobs_dir.resolve()
    job = filled.jobs()[0]["job_id"]
    for query in (
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{jobs}/{job}/job.json' (FORMAT csv)",
        f"COPY gpu TO '{jobs}/{job}/gpu.parquet'",
        "SELECT * FROM read_text('/etc/passwd')",
        f"SELECT * FROM glob('{jobs}/*')",
        f"ATTACH '{jobs}/x.db'",
        "SET enable_external_access = true",
        "RESET lock_configuration",
        "INSTALL httpfs",
        "LOAD httpfs",
    ):
        with pytest.raises(duckdb.Error):
            con.execute(query)
    assert snapshot(filled) == before
    assert con.execute("SELECT count(*) FROM gpu").fetchone() == (3,)
    settings = " ".join(
        str(v) for (v,) in con.execute("SELECT value FROM duckdb_settings()").fetchall()
    )
    assert str(filled.root) not in settings and str(Path.home()) not in settings
    assert os.getcwd() not in settings


def _request_traces(store) -> list[dict]:
    from stallscope.sql import trace_requests

    return trace_requests(store.traces())


def test_check_query_reads_the_parse_tree_not_the_text():
    import duckdb

    con = duckdb.connect()
    text = "SELECT 'read_text(''/etc/passwd'')' AS s -- glob('/')"
    assert check_query(con, text + ";").startswith("SELECT 'read_text(")
    with pytest.raises(QueryError, match="read_text"):
        check_query(con, "SELECT * FROM READ_TEXT/**/('/etc/passwd')")


def test_rows_are_capped(filled):
    result = sandbox_query(filled, "SELECT * FROM range(100000)", max_rows=50)
    assert len(result.frame) == 50 and "50 rows" in result.truncated


def test_result_bytes_are_capped_and_the_server_stays_small(filled):
    """A 300 MB result arrives as at most MAX_RESULT_BYTES; the server's memory barely moves."""
    before = _rss_mb()
    result = sandbox_query(
        filled, "SELECT repeat('x', 1000000) AS s FROM range(300)", max_rows=10_000
    )
    assert 0 < len(result.frame) < 300 and "MB" in result.truncated
    assert sum(len(s) for s in result.frame.s) <= MAX_RESULT_BYTES
    assert _rss_mb() - before < 150


@pytest.mark.parametrize(
    "query",
    [
        "SELECT length(repeat('x', 3000000000)) AS n",
        "SELECT length(repeat(repeat('x', 100000000), 40)) AS n",
        "SELECT length(string_agg(repeat('x', 1000000), '')) AS n FROM range(4000)",
        "SELECT max(length(s)) FROM (SELECT repeat('x', 1000000) || a::VARCHAR AS s "
        "FROM range(3000) a, range(2) b)",
    ],
)
def test_huge_strings_are_stopped_and_the_server_stays_small(filled, query):
    before = _rss_mb()
    message = refused(filled, query, memory_mb=512)
    assert "memory" in message.lower()
    assert _rss_mb() - before < 100
    # the sandbox process itself was held near its limit (peak RSS of any child, MB)
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 < 1600


def test_timeout(filled):
    message = refused(filled, "SELECT count(*) FROM range(100000000000) a", timeout_s=0.5)
    assert "stopped after 0.5 s" in message


def test_at_most_max_concurrent_sandboxes(filled, monkeypatch):
    import stallscope.sql as sql

    monkeypatch.setattr(sql, "QUEUE_WAIT_S", 0.1)
    taken = [sql._SLOTS.acquire(timeout=5) for _ in range(sql.MAX_CONCURRENT)]
    try:
        assert all(taken)
        assert "busy" in refused(filled, "SELECT 1")
    finally:
        for _ in taken:
            sql._SLOTS.release()
    assert readonly_query(filled, "SELECT 1 AS x").x[0] == 1


def test_corrupt_parquet_leaves_out_its_job_only(filled):
    bad_job = filled.jobs()[0]["job_id"]
    (ref,) = filled.traces(bad_job)
    ref.table_path("gpu").write_bytes(b"PAR1 this is not parquet PAR1")
    before = snapshot(filled)
    result = sandbox_query(filled, "SELECT count(DISTINCT trace_id) AS n FROM gpu")
    assert snapshot(filled) == before
    assert result.frame.n[0] == 1  # the other job is still there
    (note,) = result.notes
    assert bad_job in note and "gpu" in note and "\n" not in note and str(filled.root) not in note
    assert readonly_query(filled, "SELECT count(*) AS n FROM catalog").n[0] == 1


def test_load_cap_says_what_is_loaded(filled):
    from stallscope.sql import plan_load

    sizes = [plan_load(filled.traces(j["job_id"]), None).parquet_bytes for j in filled.jobs()]
    result = sandbox_query(filled, "SELECT count(*) AS n FROM catalog", load_cap_bytes=max(sizes))
    assert result.frame.n[0] == 1  # whole jobs, newest first, while they fit
    assert result.loaded.startswith("1 of 2 jobs (1 traces,") and "1 left out" in result.loaded
    nothing = sandbox_query(filled, "SELECT count(*) AS n FROM gpu", load_cap_bytes=1)
    assert nothing.frame.n[0] == 0 and nothing.loaded.startswith("0 of 2 jobs")


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")
