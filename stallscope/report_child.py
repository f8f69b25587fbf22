"""Analyze a job in a child process: how the dashboard gets a report that is not stored yet.

The dashboard never runs a whole job's analysis in the server process: a
job ingested by an older stallscope, one whose report was made by other code
(an upgrade), or a report with changed thresholds is built here, in
``python -m stallscope.report_child``, which computes the report, stores it
beside the job (``stallscope.report_store``: the next visit, from anyone,
reads it) and exits. A long analysis holds the child's CPU and GIL, not the
server's; an analysis that needs more memory than the machine has gets the
child killed (the kernel's OOM killer picks the biggest process), not the
server; and it is stopped after ``$STALLSCOPE_ANALYZE_TIMEOUT`` seconds
(default 600) with one line.

The child prints one JSON object on stdout: ``{"how": ..., "key": ...}``,
with ``"report"`` as well when it could not store it (a read-only store).
On failure its stderr ends with the CLI's one-line error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from stallscope.errors import StallscopeError
from stallscope.supervise import killed_by_signal

DEFAULT_TIMEOUT_S = 600.0


def analyze_timeout_s() -> float:
    """``$STALLSCOPE_ANALYZE_TIMEOUT`` (seconds), else :data:`DEFAULT_TIMEOUT_S`."""
    try:
        value = float(os.environ.get("STALLSCOPE_ANALYZE_TIMEOUT", "") or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def report_command(
    store_root: str, job_id: str, overrides: dict[str, dict[str, float]] | None = None
) -> list[str]:
    """The child's argv."""
    argv = [sys.executable, "-m", "stallscope.report_child", "--store", store_root]
    return [*argv, "--job", job_id, "--overrides", json.dumps(overrides or {}, sort_keys=True)]


def report_in_child(
    store_root: str,
    job_id: str,
    overrides: dict[str, dict[str, float]] | None = None,
    *,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """The whole job's report with these thresholds, computed and stored by a child process.

    Raises :class:`StallscopeError` with one line when the child fails, is
    killed, or runs past ``timeout_s`` (default :func:`analyze_timeout_s`).
    """
    from stallscope.report_store import load
    from stallscope.store import Store

    timeout = analyze_timeout_s() if timeout_s is None else timeout_s
    child = subprocess.Popen(
        report_command(store_root, job_id, overrides),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # killed as a group: nothing of it outlives the limit
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise StallscopeError(
            f"analyzing job {job_id} took longer than {timeout:g} s and was stopped "
            "($STALLSCOPE_ANALYZE_TIMEOUT raises the limit)"
        ) from None
    if child.returncode != 0:
        raise StallscopeError(_failure(child.returncode, err))
    try:
        answer = json.loads(out)
        if "report" in answer:
            return answer["report"]
        report = load(Store(store_root), job_id, answer["key"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StallscopeError(f"the analysis process gave an unreadable answer ({exc})") from None
    if report is None:
        raise StallscopeError(f"the report of job {job_id} was stored but cannot be read back")
    return report


def _failure(code: int, stderr: str) -> str:
    """One line saying why the child failed."""
    if code < 0:
        return killed_by_signal(code, "the analysis process")
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"the analysis process exited with code {code}"
    for prefix in ("stallscope: error: ", "stallscope: "):
        if last.startswith(prefix):
            return last[len(prefix) :]
    return last


def analyze_missing_in_background(store_root: str) -> None:
    """Start a detached child that stores the default report of every job that has none (``serve``
    after preloading the samples: the Library fills in while the dashboard starts). It is not
    this process's child (a shell in between exits at once), so nothing waits for it."""
    argv = [sys.executable, "-m", "stallscope.report_child", "--store", store_root, "--all-missing"]
    subprocess.run(
        ["sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", *argv],
        check=False,
        start_new_session=True,
    )


def _all_missing(store_root: str) -> int:
    from stallscope.cli import EXIT_OK
    from stallscope.report_store import store_default_reports
    from stallscope.store import Store

    store = Store(store_root)
    store_default_reports(store, [j["job_id"] for j in reversed(store.jobs())])
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from stallscope.cli import EXIT_OK, print_json
    from stallscope.errors import UsageError
    from stallscope.report_store import ensure, report_key
    from stallscope.store import Store

    if args.all_missing:
        return _all_missing(args.store)
    if not args.job:
        raise UsageError("--job or --all-missing is required")

    try:
        overrides = json.loads(args.overrides)
    except ValueError:
        raise UsageError("--overrides must be JSON") from None
    store = Store(args.store)
    refs = store.traces(args.job)
    if not refs:
        from stallscope.errors import NotFoundError

        raise NotFoundError(f"no job {args.job!r} in store {store.root}")
    report, how = ensure(store, refs, overrides)
    answer: dict[str, Any] = {"how": how, "key": report_key([r.trace_id for r in refs], overrides)}
    if how != "stored" and how != "computed":
        answer["report"] = report
    print_json(answer)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    from stallscope.cli import run_handler

    parser = argparse.ArgumentParser(prog="stallscope.report_child")
    parser.add_argument("--store", required=True)
    parser.add_argument("--job")
    parser.add_argument("--all-missing", action="store_true")
    parser.add_argument("--overrides", default="{}")
    return run_handler(_run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
