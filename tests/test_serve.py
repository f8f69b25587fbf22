"""`stallscope serve` starts a real Streamlit server on a store, samples preloaded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from stallscope import preload
from stallscope.ingest.registry import BY_PACKAGE
from stallscope.store import Store
from tests.conftest import SAMPLES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 90.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.read().decode()
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(url)


def wait_preloaded(store_dir, timeout: float = 600.0) -> None:
    """Until the background preload of the samples has finished."""
    deadline = time.time() + timeout
    while preload.status(store_dir) is not None:
        assert time.time() < deadline, "the sample preload did not finish"
        time.sleep(0.5)


def test_serve_preloads_samples_and_answers(tmp_path):
    store_dir, port = tmp_path / "store", free_port()
    env = dict(os.environ, STALLSCOPE_SAMPLES=str(SAMPLES))
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope.cli", "serve", "--store", str(store_dir), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(f"http://127.0.0.1:{port}/_stcore/health") == "ok"
        sample_dirs = [p for p in (SAMPLES / "kineto").iterdir() if p.is_dir()]
        # and one job per file of each other format's folder (sample_traces/<format>/)
        files = [p for p in SAMPLES.glob("*/*") if p.is_file() and p.parent.name != "kineto"]
        single = [p for p in files if p.parent.name in BY_PACKAGE and p.parent.name != "ncu"]
        single = [p for p in single if not p.name.endswith((".truth.json", ".md"))]
        # the server answers before the samples are in: they load in the background
        running = preload.status(store_dir)
        assert running is not None and running.total == len(sample_dirs) + len(single)
        assert "<title>" in wait_for(f"http://127.0.0.1:{port}/")
        wait_preloaded(store_dir)
        assert not (store_dir / preload.MARKER).exists()
        jobs = Store(store_dir).jobs()
        assert len(jobs) == len(sample_dirs) + len(single)
        assert all("sample" in j["tags"] for j in jobs)
        assert {tuple(j["sources"]) for j in jobs} == {
            ("kineto",),
            ("kineto", "ncu"),
            *((BY_PACKAGE[p.parent.name][0].source,) for p in single),
        }
        # the occupancy sample comes with its Nsight Compute pages, in one job
        (occupancy,) = [j for j in jobs if j["name"] == "occupancy"]
        assert occupancy["sources"] == ["kineto", "ncu"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
