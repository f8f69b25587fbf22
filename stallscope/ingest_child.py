"""Ingest in a child process: how the dashboard adds uploaded files to the store.

A trace is parsed where it cannot hurt the server: a file that needs more
memory than the machine has gets the *child* killed (the kernel's OOM killer
picks the biggest process), a long parse holds the child's GIL, not the
server's, and the child is the ``stallscope`` command, so big Kineto traces
get its forked decode workers (unsafe to fork inside a threaded server).
The store stays consistent whatever happens to the child: a job becomes
visible only when it is complete (``Store.publish``).

Limits: the child runs under ``--timeout`` and ``--max-memory-mb`` (their
defaults, ``$STALLSCOPE_INGEST_TIMEOUT`` and ``$STALLSCOPE_INGEST_MAX_MEMORY_MB``,
are read by the child), refusing an input past them with one line; a watchdog
here kills a child still running 30 s past the timeout.

The child is ``python -m stallscope.cli ingest --json --progress-jsonl``.
Its stderr carries one JSON object per progress update
(``{"progress": [label, done, total]}``) and, on failure, the CLI's one-line
error; its stdout carries the results as JSON. After publishing, the child
analyzes each job and stores its report (``stallscope.report_store``), so the
dashboard opens it without analyzing; a job it could not analyze is stored
all the same, with a warning (it is analyzed when first opened).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from stallscope.errors import InputError, StallscopeError, error_for_exit
from stallscope.ingest import IngestResult
from stallscope.supervise import killed_by_signal

ProgressFn = Callable[[str, int, int], None]
PROGRESS_KEY = "progress"
WATCHDOG_GRACE_S = 30.0
WARNING = "stallscope: warning: "
ANALYSIS_STOPPED = (
    "its analysis was stopped at the time limit: the dashboard analyzes it when it is first opened"
)


def ingest_command(
    store_root: str,
    paths: Sequence[str],
    *,
    each: bool = False,
    uploaded_by: str | None = None,
    tags: Sequence[str] = (),
    notes: str = "",
    name: str | None = None,
    upload_root: str | None = None,
) -> list[str]:
    """The child's argv (``sys.executable -m stallscope.cli ingest ...``)."""
    argv = [sys.executable, "-m", "stallscope.cli", "ingest", "--json", "--progress-jsonl"]
    argv += ["--store", store_root, "--notes", notes]
    if name:
        argv += ["--name", name]
    if upload_root:
        argv += ["--upload-root", upload_root]
    if uploaded_by:
        argv += ["--user", uploaded_by]
    for tag in tags:
        argv += ["--tag", tag]
    if each:
        argv.append("--each")
    return [*argv, "--", *paths]


def ingest_in_child(
    store_root: str,
    paths: Sequence[str],
    *,
    progress: ProgressFn | None = None,
    **job: Any,
) -> list[IngestResult]:
    """Ingest ``paths`` into the store at ``store_root`` in a child process.

    ``job`` takes :func:`ingest_command`'s keywords (``each``,
    ``uploaded_by``, ``tags``, ``notes``, ``name``, ``upload_root``, as for
    ``ingest_paths``). Same
    contract as :func:`stallscope.ingest.ingest_paths`: returns one result
    per job, or raises :class:`StallscopeError` with a one-line message (the
    child's own error, or why the child died) and the store unchanged: an
    :class:`InputError` for a bad input or one past a limit (exit 3), an
    :class:`EnvironmentProblem` for the machine (exit 4, or the child killed).
    ``progress(label, done, total)`` is called on the calling thread as the
    child reports (Streamlit's status widgets need that).
    """
    from stallscope.ingest.limits import default_timeout_s

    argv = ingest_command(store_root, paths, **job)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    # The child enforces --timeout itself (stallscope.supervise); this watchdog is the
    # backstop for a child that cannot (stopped, or stuck before it started its worker).
    timeout = default_timeout_s()
    expired = threading.Event()

    def stop_child() -> None:
        expired.set()
        child.kill()

    watchdog = threading.Timer(timeout + WATCHDOG_GRACE_S, stop_child)
    watchdog.daemon = True
    watchdog.start()
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(child.stdout.read()), daemon=True)
    reader.start()
    try:
        messages = _read_stderr(child.stderr, progress)  # progress runs on the caller's thread
        code = child.wait()
    finally:
        watchdog.cancel()
    reader.join()
    results = _results("".join(out))
    if expired.is_set():
        if results is not None:  # published, then stopped while analyzing the job
            for r in results:
                r.warnings.append(ANALYSIS_STOPPED)
            return results
        from stallscope.store import Store

        Store(store_root).clean_stale()  # the killed worker's staging folder (dead pid, this host)
        raise InputError(
            "upload",
            f"ingest took longer than {timeout:g} s and was stopped "
            "($STALLSCOPE_INGEST_TIMEOUT raises the limit); the store is unchanged",
        )
    if code != 0:  # the CLI's exit code says which error class (3 input, 4 environment, ...)
        raise error_for_exit(code, _failure(code, messages))
    if results is None:
        raise StallscopeError("ingest process gave an unreadable result")
    for r in results:  # the report phase's warnings (the job is stored either way)
        r.warnings += [
            m[len(WARNING) :] for m in messages if m.startswith(f"{WARNING}job {r.job_id} ")
        ]
    return results


def _results(text: str) -> list[IngestResult] | None:
    try:
        return [IngestResult(**item) for item in json.loads(text)]
    except (ValueError, TypeError):
        return None


def _read_stderr(stream, progress: ProgressFn | None) -> list[str]:
    """Read the child's stderr to its end: progress objects go to ``progress``; returns the other lines."""
    messages: list[str] = []
    for line in stream:
        text = line.rstrip("\n")
        update = _progress_update(text)
        if update is None:
            if text.strip():
                messages.append(text)
        elif progress is not None:
            progress(*update)
    return messages


def _progress_update(text: str) -> tuple[str, int, int] | None:
    if not text.startswith("{"):
        return None
    try:
        label, done, total = json.loads(text)[PROGRESS_KEY]
        return str(label), int(done), int(total)
    except (ValueError, KeyError, TypeError):
        return None


def _failure(code: int, messages: list[str]) -> str:
    """One line saying why the child failed."""
    if code < 0:
        return killed_by_signal(code, "the ingest process") + "; the store is unchanged"
    last = messages[-1] if messages else f"the ingest process exited with code {code}"
    for prefix in ("stallscope: error: ", "stallscope: "):
        if last.startswith(prefix):
            return last[len(prefix) :]
    return last
