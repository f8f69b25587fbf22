"""Sample traces preloaded into an empty store, in the background of ``stallscope serve``.

Ingesting the samples takes tens of seconds on a small machine; the dashboard should answer
at once. ``start_in_background`` runs the preload in a detached process (double fork, so the
server never has to reap it) that writes ``preloading.json`` in the store root while it runs;
jobs appear in the Library one by one (each is published atomically by the store, then its
report is computed and stored beside it, as ``stallscope ingest`` does), and the dashboard
shows the progress read from that file (``status``).

Run directly: ``python -m stallscope.preload STORE [SERVER_PID]`` (what the detached process
executes; it stops between jobs once the server has exited).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "preloading.json"


@dataclass(frozen=True)
class PreloadStatus:
    """A preload in progress: ``done`` of ``total`` sample jobs ingested so far."""

    done: int
    total: int


def sample_traces_dir() -> Path | None:
    """$STALLSCOPE_SAMPLES, else the checkout's sample_traces/ folder."""
    env = os.environ.get("STALLSCOPE_SAMPLES")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[1] / "sample_traces")
    return next((c for c in candidates if c.is_dir()), None)


def sample_jobs(root: Path) -> list[tuple[list[str], list[str]]]:
    """(paths, tags) of each sample job: each folder of ``kineto/`` (with the Nsight Compute
    CSV pages of the same program, ``ncu/<folder>.*.csv``, in the same job), then each file
    of every other format's folder (``<name>/``, named as its ``ingest/<name>/`` package:
    ``nsys/`` exports...), one job each; ``*.truth.json`` files (what a capture measured) are
    not traces."""
    from stallscope.ingest.registry import BY_PACKAGE

    jobs: list[tuple[list[str], list[str]]] = []
    kineto = root / "kineto"
    for folder in sorted(p for p in kineto.glob("*") if p.is_dir()) if kineto.is_dir() else []:
        traces = sorted(
            str(p) for p in folder.glob("*.json*") if not p.name.endswith(".truth.json")
        )
        traces += sorted(str(p) for p in (root / "ncu").glob(f"{folder.name}.*.csv"))
        if traces:
            jobs.append((traces, ["sample", "kineto"]))
    for package, formats in BY_PACKAGE.items():
        if package in ("kineto", "ncu") or not (root / package).is_dir():
            continue  # kineto: above; ncu: its pages join the kineto job of their program
        for path in sorted((root / package).iterdir()):
            if path.is_file() and not path.name.endswith((".truth.json", ".md")):
                jobs.append(([str(path)], ["sample", formats[0].source]))
    return jobs


def preload_samples(store, on_progress=None, keep_going=lambda: True) -> int:
    """Ingest every sample job into ``store`` if it holds no trace yet, each with its stored
    default report; the number ingested.

    ``on_progress(done, total)`` is called before the first job and after each one; the
    preload stops before a job when ``keep_going()`` is false (the server is gone).
    A sample that fails to ingest is reported on stderr and skipped.
    """
    from stallscope.errors import StallscopeError
    from stallscope.ingest import ingest_paths
    from stallscope.report_store import store_default_reports

    root = sample_traces_dir()
    if root is None or store.traces():
        return 0
    jobs = sample_jobs(root)
    count = 0
    for index, (paths, tags) in enumerate(jobs):
        if not keep_going():
            return count
        if on_progress:
            on_progress(index, len(jobs))
        try:
            results = ingest_paths(store, paths, uploaded_by="samples", tags=tags)
            count += 1
            # its report too, as `stallscope ingest` does (never raises for a job that fails)
            store_default_reports(store, [r.job_id for r in results])
        except StallscopeError as exc:
            print(f"stallscope: sample {Path(paths[0]).name} skipped: {exc}", file=sys.stderr)
    if on_progress:
        on_progress(len(jobs), len(jobs))
    return count


def _write_marker(store_root: Path, done: int, total: int) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "done": done,
        "total": total,
        "updated": time.time(),
    }
    tmp = store_root / f".{MARKER}.{os.getpid()}"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, store_root / MARKER)


def status(store_root: Path) -> PreloadStatus | None:
    """The preload running on this store, or None (none, finished, or its process is gone)."""
    try:
        record = json.loads((Path(store_root) / MARKER).read_text())
        pid, host = int(record["pid"]), str(record["host"])
        done, total = int(record["done"]), int(record["total"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    from stallscope.store import pid_alive

    if host == socket.gethostname() and not pid_alive(pid):
        return None
    return PreloadStatus(done=done, total=total)


def start_in_background(store) -> bool:
    """Start the preload in a detached process when the store is empty and samples exist.

    Returns whether one was started. The marker is written before this returns, so the
    dashboard shows the preload from its first page.
    """
    root = sample_traces_dir()
    jobs = sample_jobs(root) if root is not None else []
    if not jobs or store.traces():
        return False
    _write_marker(store.root, 0, len(jobs))
    server_pid = os.getpid()  # serve execs Streamlit in this process next
    child = os.fork()
    if child == 0:  # first child: start the worker in a new session, then leave at once
        try:
            os.setsid()
            if os.fork() == 0:
                _exec_worker(store.root, server_pid)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    return True


def _exec_worker(store_root: Path, server_pid: int) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # stderr stays: a skipped sample is said where the server logs
    os.execv(
        sys.executable,
        [sys.executable, "-m", "stallscope.preload", str(store_root), str(server_pid)],
    )


def main(argv: list[str]) -> int:
    """``STORE [SERVER_PID]``: preload the samples; stop early once the server has exited."""
    from stallscope.store import Store, pid_alive

    store = Store(argv[0]).ensure()
    server_pid = int(argv[1]) if len(argv) > 1 else None
    try:
        preload_samples(
            store,
            on_progress=lambda d, t: _write_marker(store.root, d, t),
            keep_going=lambda: server_pid is None or pid_alive(server_pid),
        )
    finally:
        (store.root / MARKER).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
