"""The sample preload that ``stallscope serve`` runs in the background (stallscope.preload)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from stallscope import preload
from stallscope.store import Store
from tests.conftest import SAMPLES


def two_samples(tmp_path):
    """A samples folder with two small Kineto jobs."""
    root = tmp_path / "samples"
    for name in ("healthy", "pageable_sync"):
        shutil.copytree(SAMPLES / "kineto" / name, root / "kineto" / name)
    return root


def run_worker(store_dir, samples, server_pid: int) -> None:
    env = dict(os.environ, STALLSCOPE_SAMPLES=str(samples))
    subprocess.run(
        [sys.executable, "-m", "stallscope.preload", str(store_dir), str(server_pid)],
        env=env, check=True, timeout=300,
    )  # fmt: skip


def test_the_worker_loads_every_sample_job_and_removes_its_marker(tmp_path):
    samples, store_dir = two_samples(tmp_path), tmp_path / "store"
    run_worker(store_dir, samples, os.getpid())
    names = sorted(j["name"] for j in Store(store_dir).jobs())
    assert [n.split(".")[0] for n in names] == ["healthy", "pageable_sync"]
    assert not (store_dir / preload.MARKER).exists()
    assert preload.status(store_dir) is None


def test_the_worker_stops_once_the_server_is_gone(tmp_path):
    samples, store_dir = two_samples(tmp_path), tmp_path / "store"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited and reaped: its pid names no process
    run_worker(store_dir, samples, gone.pid)
    assert Store(store_dir).ensure().jobs() == []
    assert not (store_dir / preload.MARKER).exists()


def test_status_reads_progress_and_ignores_a_dead_writer(tmp_path):
    tmp_path.joinpath(preload.MARKER).write_text(
        f'{{"pid": {os.getpid()}, "host": "{preload.socket.gethostname()}", "done": 3, '
        '"total": 7, "updated": 0}'
    )
    assert preload.status(tmp_path) == preload.PreloadStatus(done=3, total=7)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tmp_path.joinpath(preload.MARKER).write_text(
        f'{{"pid": {gone.pid}, "host": "{preload.socket.gethostname()}", "done": 3, "total": 7}}'
    )
    assert preload.status(tmp_path) is None
    tmp_path.joinpath(preload.MARKER).write_text("{not json")
    assert preload.status(tmp_path) is None


def test_nothing_starts_on_a_store_that_holds_traces(tmp_path, monkeypatch):
    samples, store_dir = two_samples(tmp_path), tmp_path / "store"
    run_worker(store_dir, samples, os.getpid())
    monkeypatch.setenv("STALLSCOPE_SAMPLES", str(samples))
    assert preload.start_in_background(Store(store_dir)) is False
    assert preload.status(store_dir) is None
