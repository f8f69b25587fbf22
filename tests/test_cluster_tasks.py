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


class _Done:
    """A finished future of :class:`_InlineClient`."""

    def __init__(self, key: str, value):
        self.key, self.value, self.status = key, value, "finished"

    def done(self) -> bool:
        return True


class _InlineClient:
    """The part of ``distributed.Client`` that DaskRanks uses, running each task here."""

    def map(self, fn, *iterables, pure=False, retries=0):
        return [
            _Done(f"{fn.__name__}-{i}", fn(*args))
            for i, args in enumerate(zip(*iterables, strict=True))
        ]

    def gather(self, futures):
        return [f.value for f in futures]

    def cancel(self, futures):
        pass


def _fsyncs(monkeypatch) -> tuple[list[Path], list[Path]]:
    """Record the files and folders the store fsyncs from now on."""
    from stallscope import store as store_module

    files: list[Path] = []
    folders: list[Path] = []
    monkeypatch.setattr(store_module, "_fsync_file", files.append)
    real_dir = store_module._fsync_dir
    monkeypatch.setattr(store_module, "_fsync_dir", lambda p: (folders.append(p), real_dir(p)))
    return files, folders


def test_the_publish_syncs_only_what_the_workers_did_not(store, monkeypatch):
    """Each worker fsyncs its rank's files before moving them in; the publish then syncs the
    files written after (each trace's meta.json, job.json, the upload) and every folder."""
    from stallscope.cluster import DaskRanks
    from stallscope.ingest.job import prepare_job, publish_job

    sources = [s for n in (0, 1) for s in expand(str(SAMPLE / f"rank{n}.pt.trace.json.gz")).sources]
    ranks = DaskRanks(_InlineClient(), store)
    prepared = prepare_job(store, "two ranks", sources, ranks=ranks)
    staging = prepared.staging
    traces = [staging / t for t in prepared.result.trace_ids]
    assert prepared.durable == ranks.synced
    assert {p.parent for p in ranks.synced} == set(traces)
    assert {p.name for p in ranks.synced if p.parent == traces[0]} >= {
        "gpu.parquet",
        "host.parquet",
    }
    assert not any(p.name == "meta.json" for p in ranks.synced)  # written by the client after

    written_after = {p for p in staging.rglob("*") if p.is_file() and p not in ranks.synced} - {
        staging / ".lease"
    }  # (the lease is removed before the publish syncs)
    assert {p.name for p in written_after} == {"meta.json", "job.json", *(
        p.name for p in (staging / "uploads").iterdir())}  # fmt: skip

    files, folders = _fsyncs(monkeypatch)
    publish_job(store, prepared)
    assert set(files) == written_after
    assert set(folders) >= set(traces) | {staging, staging / "uploads"}
    assert store.has_job(prepared.result.job_id)


def test_a_finish_step_or_a_local_ingest_syncs_every_file_at_publish(store, monkeypatch):
    """Nothing counts as already synced when a format's finish step may have rewritten files
    (Nsight Compute pairing), nor in an ingest on one machine (it syncs nothing before)."""
    from stallscope.cluster import DaskRanks
    from stallscope.ingest import job as job_module

    source = [*expand(str(SAMPLE / "rank1.pt.trace.json.gz")).sources]
    monkeypatch.setattr(job_module, "_finish_formats", lambda metas, staging: True)
    prepared = job_module.prepare_job(store, "r1", source, ranks=DaskRanks(_InlineClient(), store))
    assert prepared.durable == frozenset()
    store.discard(prepared.staging)

    monkeypatch.undo()
    local = job_module.prepare_job(
        store, "r1", [*expand(str(SAMPLE / "rank1.pt.trace.json.gz")).sources]
    )
    assert local.durable == frozenset()
    files, _ = _fsyncs(monkeypatch)
    job_module.publish_job(store, local)
    assert "gpu.parquet" in {p.name for p in files}


def test_store_connections_keep_to_the_ingest_thread_budget(store):
    """An ingest task reads its rank back through a store connection (the rank card): within
    its worker's threads, not 4 of the host's CPUs each."""
    from stallscope.ingest import startup

    try:
        startup.set_thread_budget(1)
        con = store.connect([])
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
        con.close()
    finally:
        startup.set_thread_budget(None)
    con = store.connect([])
    expected = max(1, min(4, os.cpu_count() or 1))
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == expected
    con.close()
