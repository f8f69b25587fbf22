"""Uploads are per user: a job is stored once per content, uploaded by many; each upload
keeps its uploader, name, tags and notes, and the job's data goes with its last upload."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallscope.errors import NotFoundError
from stallscope.ingest import ingest_paths
from stallscope.ingest.job import prepare_job, publish_job
from stallscope.ingest.reader import expand_path
from stallscope.store import Store
from tests.kineto_builder import KinetoTrace


@pytest.fixture
def trace(tmp_path) -> Path:
    t = KinetoTrace(rank=0, world_size=1)
    t.kernel("a", 0, 10_000_000)
    t.kernel("b", 20_000_000, 5_000_000)
    t.step(1, 0, 30_000_000)
    return t.write(tmp_path / "small.pt.trace.json")


def _upload(store, trace, user, name="", tags=(), notes=""):
    (result,) = ingest_paths(
        store, [str(trace)], uploaded_by=user, tags=list(tags), notes=notes, name=name or None
    )
    return result


def _entries(store: Store, job_id: str) -> list[dict]:
    folder = store.jobs_dir / job_id / "uploads"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def test_first_ingest_records_its_upload(store, trace):
    result = _upload(store, trace, "ana", "run 1", ["a"], "first try")
    (entry,) = _entries(store, result.job_id)
    assert entry["upload_id"] == result.upload_id
    assert (entry["uploaded_by"], entry["name"], entry["tags"], entry["notes"]) == (
        "ana", "run 1", ["a"], "first try",
    )  # fmt: skip
    assert entry["uploaded_at"][:19] == store.job(result.job_id)["uploaded_at"][:19]


def test_reupload_is_recorded_and_the_row_shows_every_uploader(store, trace):
    first = _upload(store, trace, "ana", "run 1", ["a", "shared"], "first try")
    second = _upload(store, trace, "bo", "bo's copy", ["b", "shared"], "looks slow")
    assert second.existed and second.job_id == first.job_id
    assert second.upload_id != first.upload_id
    assert len(_entries(store, first.job_id)) == 2
    (row,) = store.jobs()
    assert row["name"] == "run 1" and row["uploaded_by"] == "ana"
    assert row["uploaders"] == ["ana", "bo"]
    assert row["tags"] == ["a", "b", "shared"]
    assert [u["notes"] for u in row["uploads"]] == ["first try", "looks slow"]
    assert "first try" in row["notes"] and "looks slow" in row["notes"]
    assert len(store.traces()) == 1  # stored once


def test_rm_removes_only_my_upload_until_the_last(store, trace):
    job_id = _upload(store, trace, "ana").job_id
    _upload(store, trace, "bo")
    assert store.remove_upload(job_id, "ana") is False
    row = store.job(job_id)
    assert row["uploaders"] == ["bo"] and row["uploaded_by"] == "bo"
    assert len(store.traces(job_id)) == 1
    with pytest.raises(NotFoundError, match="no upload by 'ana'"):
        store.remove_upload(job_id, "ana")
    assert store.remove_upload(job_id, "bo") is True
    assert store.jobs() == [] and list(store.trash_dir.iterdir()) == []


def test_rm_removes_every_upload_of_that_user(store, trace):
    job_id = _upload(store, trace, "ana").job_id
    _upload(store, trace, "ana", tags=["again"])
    assert store.remove_upload(job_id, "ana") is True and store.jobs() == []


def test_an_edit_of_the_tags_wins_over_earlier_uploads_only(store, trace):
    job_id = _upload(store, trace, "ana", tags=["a", "wrong"]).job_id
    store.annotate(job_id, tags=["a"])
    assert store.job(job_id)["tags"] == ["a"]
    _upload(store, trace, "bo", tags=["b"])
    assert store.job(job_id)["tags"] == ["a", "b"]


def _make_legacy(store: Store, job_id: str, tags=None) -> None:
    """What an older stallscope left: no uploads/ folder, tags in job.json."""
    folder = store.jobs_dir / job_id
    shutil.rmtree(folder / "uploads")
    job = json.loads((folder / "job.json").read_text())
    job["tags"] = tags or []
    (folder / "job.json").write_text(json.dumps(job))


def test_a_job_of_an_older_store_counts_as_one_upload(store, trace):
    job_id = _upload(store, trace, "ana", "old run", ["old"], "from before").job_id
    _make_legacy(store, job_id, ["old"])
    (row,) = store.jobs()
    assert row["uploaders"] == ["ana"] and row["tags"] == ["old"] and row["name"] == "old run"
    assert [u["upload_id"] for u in store.uploads(job_id)] == ["job"]
    second = _upload(store, trace, "bo", "new name", ["new"])
    assert second.existed
    row = store.job(job_id)
    assert row["uploaders"] == ["ana", "bo"] and row["name"] == "old run"
    assert row["tags"] == ["new", "old"]
    assert store.remove_upload(job_id, "ana") is False  # the job.json upload goes, bo's stays
    assert store.job(job_id)["uploaders"] == ["bo"]
    assert store.remove_upload(job_id, "bo") is True


def test_an_older_store_owner_removes_their_job(store, trace):
    job_id = _upload(store, trace, "ana").job_id
    _make_legacy(store, job_id)
    with pytest.raises(NotFoundError):
        store.remove_upload(job_id, "bo")
    assert store.remove_upload(job_id, "ana") is True and store.jobs() == []


def test_an_older_store_edit_of_the_tags_still_wins(store, trace):
    job_id = _upload(store, trace, "ana", tags=["x"]).job_id
    _make_legacy(store, job_id, ["x", "typo"])
    (store.jobs_dir / job_id / "annotations.json").write_text(json.dumps({"tags": ["x"]}))
    assert store.job(job_id)["tags"] == ["x"]


def test_same_files_published_twice_at_once_record_both_uploads(store, trace):
    name, sources = expand_path(str(trace))
    a = prepare_job(store, name, sources, uploaded_by="ana")
    _, sources = expand_path(str(trace))
    b = prepare_job(store, name, sources, uploaded_by="bo")
    assert a.staging is not None and b.staging is not None  # both parsed: neither stored yet
    assert not publish_job(store, a).existed
    assert publish_job(store, b).existed  # lost the race: recorded, not dropped
    assert store.job(a.result.job_id)["uploaders"] == ["ana", "bo"]
    assert list(store.staging_dir.iterdir()) == []


def test_job_removed_before_a_reupload_is_recorded_is_ingested_afresh(store, trace):
    job_id = _upload(store, trace, "ana").job_id
    name, sources = expand_path(str(trace))
    prepared = prepare_job(store, name, sources, uploaded_by="bo")
    assert prepared.staging is None  # found stored
    store.remove_upload(job_id, "ana")  # ... and gone before bo's upload is recorded
    result = publish_job(store, prepared)
    assert result.job_id == job_id and not result.existed
    assert store.job(job_id)["uploaders"] == ["bo"] and len(store.traces(job_id)) == 1


def test_an_upload_recorded_while_the_last_is_removed_keeps_the_job(store, trace, monkeypatch):
    """bo's re-upload lands between ana's last look at uploads/ and her rename into trash."""
    import stallscope.store as store_module

    job_id = _upload(store, trace, "ana").job_id
    real_rename = os.rename
    bo = store_module.new_upload("bo", "bo's", ["b"], "", "2030-01-01T00:00:00+00:00")

    def racing_rename(src, dst):
        if Path(dst).parent == store.trash_dir:
            assert store.add_upload(job_id, bo)
        return real_rename(src, dst)

    monkeypatch.setattr(store_module.os, "rename", racing_rename)
    assert store.remove_upload(job_id, "ana") is False
    monkeypatch.setattr(store_module.os, "rename", real_rename)
    assert store.job(job_id)["uploaders"] == ["bo"] and len(store.traces(job_id)) == 1
    assert list(store.trash_dir.iterdir()) == []


def test_a_removal_put_back_into_a_fresh_copy_moves_its_uploads(store, trace):
    job_id = _upload(store, trace, "ana").job_id
    _upload(store, trace, "bo")
    doomed = store._take_away(job_id)  # taken away by a remover...
    _upload(store, trace, "cy")  # ... meanwhile ingested afresh by cy (its clean-up spares it)
    assert doomed.is_dir()
    store._restore(doomed, job_id)  # the remover puts back what it must not delete
    assert store.job(job_id)["uploaders"] == ["ana", "bo", "cy"]
    assert not doomed.exists()


def test_an_entry_landing_in_the_trash_copy_while_it_is_deleted_goes_too(store, trace, monkeypatch):
    """A process that looked up ``jobs/<id>/uploads`` before the remover's rename may complete
    its create there after ``rmtree`` listed the folder (here: a temporary file, just before
    rmtree removes ``uploads/``): the trash copy is still deleted, ``trash/`` ends empty."""
    job_id = _upload(store, trace, "ana").job_id
    real_rmdir = os.rmdir
    landed = []

    def create_late_then_rmdir(path, *args, dir_fd=None, **kwargs):
        if not landed and dir_fd is not None and os.fspath(path) == "uploads":
            landed.append(True)
            os.close(os.open("uploads/.late.json.tmp", os.O_CREAT | os.O_WRONLY, dir_fd=dir_fd))
        return real_rmdir(path, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(os, "rmdir", create_late_then_rmdir)
    assert store.remove_upload(job_id, "ana") is True
    monkeypatch.undo()
    assert landed  # the interleaving happened
    assert store.jobs() == [] and list(store.trash_dir.iterdir()) == []


def test_an_upload_landing_in_a_removed_copy_is_ingested_afresh(store, trace, monkeypatch):
    """bo's rename of its entry looked up ``uploads/`` before ana's remover renamed the job into
    ``trash/``, and completes there after she looked at the copy (no upload: she deletes it).
    bo's upload must not count as recorded: its ingest publishes the job afresh."""
    import stallscope.store as store_module

    job_id = _upload(store, trace, "ana").job_id
    name, sources = expand_path(str(trace))
    prepared = prepare_job(store, name, sources, uploaded_by="bo")
    assert prepared.staging is None  # found stored: publishing records bo's upload
    entry_name = f"{prepared.upload['upload_id']}.json"
    real_replace = os.replace
    landed = []

    def replace_after_the_removal(src, dst, *args, **kwargs):
        if not landed and Path(dst).name == entry_name:
            landed.append(True)
            (ana,) = store_module._upload_files(store.jobs_dir / job_id / "uploads")
            ana[0].unlink()  # ana removes her upload, the last one ...
            doomed = store._take_away(job_id)  # ... takes the job away, looks: nothing
            assert not store_module._upload_files(doomed / "uploads")
            moved = doomed / "uploads"  # bo's rename completes where its folder went
            real_replace(moved / Path(src).name, moved / Path(dst).name)
            shutil.rmtree(doomed)  # ana deletes what she took
            return None
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(store_module.os, "replace", replace_after_the_removal)
    result = publish_job(store, prepared)
    monkeypatch.undo()
    assert landed
    assert result.job_id == job_id and not result.existed  # ingested afresh, not "recorded"
    assert store.job(job_id)["uploaders"] == ["bo"] and len(store.traces(job_id)) == 1
    assert list(store.trash_dir.iterdir()) == []


def test_rm_waits_for_its_upload_being_put_back_into_a_fresh_copy(store, trace):
    """ana's upload is in a copy taken into ``trash/`` whose remover is copying its uploads
    into the job ingested afresh meanwhile (cy's): ana's ``rm`` waits for it, not fails."""
    import threading

    job_id = _upload(store, trace, "ana").job_id
    _upload(store, trace, "bo")
    doomed = store._take_away(job_id)
    _upload(store, trace, "cy")  # ingested afresh: the visible job has only cy's upload
    remover = threading.Timer(0.3, store._restore, (doomed, job_id))
    remover.start()
    try:
        assert store.remove_upload(job_id, "ana") is False
    finally:
        remover.join()
    assert store.job(job_id)["uploaders"] == ["bo", "cy"]
    assert list(store.trash_dir.iterdir()) == []


def test_a_job_removed_between_the_publish_rename_and_its_look_is_published(
    store, trace, monkeypatch
):
    """The same job is in ``jobs/`` at the publishing rename (ENOTEMPTY) and gone at the look
    that follows (removed meanwhile): the publisher tries again, it does not fail."""
    import errno

    import stallscope.store as store_module

    name, sources = expand_path(str(trace))
    prepared = prepare_job(store, name, sources, uploaded_by="ana")
    real_rename = os.rename
    refused = []

    def rename_into_a_job_removed_meanwhile(src, dst, *args, **kwargs):
        if not refused and Path(dst).parent == store.jobs_dir:
            refused.append(True)
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(src), None, str(dst))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(store_module.os, "rename", rename_into_a_job_removed_meanwhile)
    result = publish_job(store, prepared)
    monkeypatch.undo()
    assert refused and not result.existed
    assert store.job(result.job_id)["uploaders"] == ["ana"]
    assert list(store.staging_dir.iterdir()) == []


def test_a_trash_copy_is_owned_by_its_remover_not_by_the_lease_inside(store, trace):
    """Two removers write ``.lease`` in turn, one rename wins: the copy may hold the loser's
    lease. Once the loser is gone, clean-up must still leave the winner's copy alone."""
    job_id = _upload(store, trace, "ana").job_id
    doomed = store._take_away(job_id)  # this process won the rename
    loser = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    loser_pid = int(loser.communicate()[0])  # exited: its lease is a dead pid's
    lease = json.loads((doomed / ".lease").read_text())
    (doomed / ".lease").write_text(json.dumps(dict(lease, pid=loser_pid)))
    store.clean_stale()
    assert (doomed / "job.json").is_file()  # still ours: we may put it back
    store._restore(doomed, job_id)
    assert store.job(job_id)["uploaders"] == ["ana"]
    stale = store.trash_dir / f"{loser_pid}-{doomed.name.split('-', 1)[1]}"
    stale.mkdir()  # a copy whose remover (named by the folder) is gone: removed
    store.clean_stale()
    assert list(store.trash_dir.iterdir()) == []


def test_cli_reupload_and_rm(cli, trace):
    env = {"STALLSCOPE_USER": "ana"}
    first = cli("ingest", "--tag", "a", str(trace), env=env)
    assert first.returncode == 0 and first.stdout.startswith("ingested: job"), first.stderr
    job_id = first.stdout.split()[2]
    again = cli("ingest", "--user", "bo", "--notes", "mine", str(trace))
    assert again.stdout.startswith(f"already stored; your upload was recorded: job {job_id}")
    done = cli("rm", job_id, "--user", "cy")
    assert done.returncode == 3 and "no upload by 'cy' (uploaded by ana, bo)" in done.stderr
    done = cli("rm", job_id, env=env)
    assert done.returncode == 0 and "removed ana's upload" in done.stdout
    assert "still uploaded by bo" in done.stdout
    assert Store(cli.store_dir).job(job_id)["uploaders"] == ["bo"]
    done = cli("rm", job_id, "--user", "bo")
    assert done.returncode == 0 and "deleted job" in done.stdout
    assert Store(cli.store_dir).jobs() == []


def test_cli_rm_all_deletes_for_everyone(cli, trace):
    job_id = json.loads(cli("ingest", "--json", "--user", "ana", str(trace)).stdout)[0]["job_id"]
    cli("ingest", "--user", "bo", str(trace))
    done = cli("rm", "--all", job_id, env={"STALLSCOPE_USER": "cy"})
    assert done.returncode == 0 and "for everyone" in done.stdout
    assert Store(cli.store_dir).jobs() == []


WORKER = textwrap.dedent(
    """
    import sys
    from stallscope.ingest import ingest_paths
    from stallscope.store import Store
    store, trace, user, rounds = Store(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    fresh = deleted = 0
    for _ in range(rounds):
        (r,) = ingest_paths(store, [trace], uploaded_by=user, tags=[user])
        fresh += not r.existed
        deleted += store.remove_upload(r.job_id, user)
    (r,) = ingest_paths(store, [trace], uploaded_by=user, tags=[user])
    print(r.job_id, fresh, deleted)
    """
)


def test_parallel_reuploads_and_removals_never_lose_an_upload(tmp_path, trace):
    """Four users upload and remove the same files at once, the job coming and going;
    each ends with an upload: all four are there, with the data."""
    store = Store(tmp_path / "store").ensure()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    users = ["u1", "u2", "u3", "u4"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(store.root), str(trace), user, "15"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for user in users
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(users), outs
    ((job_id,),) = {(out.split()[0],) for out, _ in outs}
    deletions = sum(int(out.split()[2]) for out, _ in outs)
    assert deletions >= 1, outs  # the job did go (and come back) while others uploaded
    row = store.job(job_id)
    assert sorted(row["uploaders"]) == users  # each ended with an upload: none lost
    assert len(store.uploads(job_id)) == 4
    (ref,) = store.traces(job_id)
    assert ref.table_path("gpu").is_file()  # data still there while referenced
    assert list(store.staging_dir.iterdir()) == []
    assert list(store.trash_dir.iterdir()) == []
    for user in users:
        store.remove_upload(job_id, user)
    assert store.jobs() == []
