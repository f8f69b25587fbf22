"""The worker side of ``--scheduler`` ingest (stallscope.cluster's tasks), run here without Dask:
a rank's traces reach the job's staging folder whole, once, and failures come back as values."""

from __future__ import annotations

import os
from pathlib import Path

from stallscope.cluster import Failed, RankFile, hash_file, ingest_rank
from stallscope.errors import EnvironmentProblem, InputError
from stallscope.ingest.reader import expand
from stallscope.store import Lease

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "kineto" / "ddp_straggler"


def _rank_file(path: Path) -> RankFile:
    (source,) = expand(str(path)).sources
    return RankFile.of(source)


def test_a_rank_is_moved_in_whole_and_a_second_attempt_keeps_the_first(store):
    item = _rank_file(SAMPLE / "rank1.pt.trace.json.gz")
    digest = hash_file(item)
    assert isinstance(digest, str) and len(digest) == 64
    staging = store.new_staging()
    first = ingest_rank(str(store.root), str(staging), "job1", digest, item, False)
    (meta,) = first
    assert meta["rank"] == 1 and meta["file_hash"] == digest
    folder = staging / meta["trace_id"]
    written = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert "gpu.parquet" in written
    # the same rank again (its first worker died after finishing): the folder there is kept
    (again,) = ingest_rank(str(store.root), str(staging), "job1", digest, item, False)
    assert again | {"ingest_seconds": 0} == meta | {"ingest_seconds": 0}
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == written
    assert sorted(p.name for p in staging.iterdir()) == [".lease", meta["trace_id"]]
    assert os.listdir(store.staging_dir) == [staging.name]  # the workers' own folders are gone
    store.discard(staging)


def test_a_dead_workers_half_written_folder_is_removed_by_the_next_rank(store):
    dead = store.staging_dir / "999999-deadbeef-000000000000"
    (dead / "abc").mkdir(parents=True)
    (dead / "abc" / "gpu.parquet").write_bytes(b"PAR1 half")
    Lease.write(dead)
    lease = (dead / ".lease").read_text().replace(f'"pid": {os.getpid()}', '"pid": 999999')
    (dead / ".lease").write_text(lease)  # a process of this host that is gone
    staging = store.new_staging()  # as the client starts the job: stale folders go first
    assert not dead.exists()
    item = _rank_file(SAMPLE / "rank0.pt.trace.json.gz")
    assert ingest_rank(str(store.root), str(staging), "job1", hash_file(item), item, False)
    store.discard(staging)


def test_failures_are_returned_not_raised(store, tmp_path):
    item = _rank_file(SAMPLE / "rank0.pt.trace.json.gz")
    gone = ingest_rank(str(store.root), str(tmp_path / "nowhere"), "j", "d", item, False)
    assert isinstance(gone, Failed) and gone.kind == "environment"
    assert "does not see the job's staging folder" in gone.message
    assert isinstance(gone.error(), EnvironmentProblem)

    bad = tmp_path / "rank3.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": ')
    failed = ingest_rank(
        str(store.root), str(store.new_staging()), "j", "d", _rank_file(bad), False
    )
    assert isinstance(failed, Failed) and failed.kind == "input"
    error = failed.error()
    assert isinstance(error, InputError) and str(error) == failed.message
    assert str(error).startswith(f"{bad}: ")

    missing = RankFile("rank9.json", 10, path=str(tmp_path / "not-shared" / "rank9.json"))
    result = hash_file(missing)
    assert isinstance(result, Failed) and result.kind == "environment"
    assert "every Dask worker sees at the same path" in result.message


def test_a_zip_member_travels_as_its_bytes(tmp_path):
    import zipfile

    archive = tmp_path / "job.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(SAMPLE / "rank0.pt.trace.json.gz", "rank0.pt.trace.json.gz")
    (source,) = expand(str(archive)).sources
    item = RankFile.of(source)
    assert item.path is None and item.data == (SAMPLE / "rank0.pt.trace.json.gz").read_bytes()
    assert item.source().file_hash == source.file_hash


def test_a_task_uses_its_workers_threads(monkeypatch):
    """On a Dask worker of N threads, an ingest task's DuckDB and Arrow use N threads."""
    import pyarrow as pa

    from stallscope import cluster
    from stallscope.ingest import startup

    class Worker:
        class state:  # noqa: N801 (the attribute path of distributed.Worker)
            nthreads = 1

    import distributed

    monkeypatch.setattr(distributed, "get_worker", lambda: Worker())
    cpus = pa.cpu_count()
    try:
        cluster._use_worker_threads()
        assert startup.duckdb_threads() == 1
        assert pa.cpu_count() == 1
    finally:
        startup.set_thread_budget(None)
        pa.set_cpu_count(cpus)
