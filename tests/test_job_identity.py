"""Jobs are keyed by content, never by file name, and carry the name people give them."""

from __future__ import annotations

import json
import shutil

from stallscope.ingest import ingest_paths, plan_jobs
from stallscope.store import Store
from tests.conftest import SAMPLES

RANKS = SAMPLES / "kineto" / "ddp_overlap"
STALL = SAMPLES / "kineto" / "dataloader_stall" / "dataloader_stall.pt.trace.json.gz"
HEALTHY = SAMPLES / "kineto" / "healthy" / "healthy.pt.trace.json.gz"


def _uploads(tmp_path, files):
    """Lay files out as the dashboard does: ROOT/<n>/<original name>, all named trace.json.gz."""
    root = tmp_path / "stallscope-upload-x"
    paths = []
    for index, source in enumerate(files):
        target = root / str(index) / "trace.json.gz"
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
        paths.append(str(target))
    return root, paths


def test_same_named_unrelated_uploads_are_separate_jobs(store: Store, tmp_path):
    root, paths = _uploads(tmp_path, [STALL, HEALTHY, RANKS / "rank0.pt.trace.json.gz"])
    results = ingest_paths(store, paths, each=True, upload_root=str(root))
    assert [r.existed for r in results] == [False, False, False]
    assert len({r.job_id for r in results}) == 3
    assert [j["name"] for j in store.jobs()] == ["trace.json.gz"] * 3
    for ref in store.traces():
        assert ref.meta["file_name"] == "trace.json.gz"  # no temporary folder leaks into the store


def test_same_named_ranks_upload_as_one_job(store: Store, tmp_path):
    ranks = sorted(RANKS.glob("rank*.pt.trace.json.gz"))
    root, paths = _uploads(tmp_path, ranks)
    (result,) = ingest_paths(store, paths, upload_root=str(root), name="ddp run 7")
    assert not result.existed and len(result.trace_ids) == 2
    assert store.job(result.job_id)["name"] == "ddp run 7"


def test_default_upload_name_is_never_the_temporary_folder(tmp_path):
    ranks = sorted(RANKS.glob("rank*.pt.trace.json.gz"))
    root = tmp_path / "stallscope-upload-abc"
    paths = []
    for index, source in enumerate(ranks):
        target = root / str(index) / source.name
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
        paths.append(str(target))
    ((name, sources, _),) = plan_jobs(paths, upload_root=str(root))
    assert name == "rank"  # the rank files' common prefix, not 'stallscope-upload-abc' or '0'
    assert [s.name for s in sources] == [p.name for p in ranks]


def test_cli_name_and_rename(cli, tmp_path):
    done = cli("ingest", "--json", "--name", "nightly 2026-12-01", str(STALL))
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["job_name"] == "nightly 2026-12-01"
    store = Store(cli.store_dir)
    store.annotate(result["job_id"], name="  renamed  ")
    store.annotate(result["job_id"], name="   ")  # blank: ignored
    assert store.job(result["job_id"])["name"] == "renamed"
    assert store.jobs()[0]["name"] == "renamed"


def test_cli_name_with_several_jobs_is_a_usage_error(cli):
    done = cli("ingest", "--each", "--name", "x", str(STALL), str(HEALTHY))
    assert done.returncode == 2
    assert "names one job" in done.stderr and "Traceback" not in done.stderr
    assert not (cli.store_dir / "jobs").exists() or not any((cli.store_dir / "jobs").iterdir())
