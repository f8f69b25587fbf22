"""``stallscope ingest``: add traces to the store."""

from __future__ import annotations

import argparse
import json
import os
import threading

from stallscope.cli import EXIT_OK, add_scheduler_option, add_store_option, open_store, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="add trace files, directories or zips to the store",
        description=(
            "Add traces to the store: PyTorch profiler (Kineto) JSON, Nsight Systems exports (.sqlite, "
            ".sqlite.gz, .nsys-rep, .qdrep) and Nsight Compute CSVs (.ncu-rep with ncu). Files given "
            "together form one job (the ranks of one run; use --each for unrelated files); each "
            "directory or .zip is one job (its files that are not traces, such as a meta.json or "
            "notes, are skipped with a warning). "
            "Re-ingesting the same files finds the stored job instead of duplicating it, and "
            "records this upload (uploader, name, tags, notes) beside the earlier ones."
        ),
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="trace file (.json[.gz], .sqlite[.gz], .nsys-rep/.qdrep, ncu .csv/.ncu-rep), directory or .zip",
    )
    p.add_argument("--each", action="store_true", help="ingest every file as its own job")
    p.add_argument(
        "--tag", action="append", default=[], metavar="TAG", help="tag the job (repeatable)"
    )
    p.add_argument(
        "--name",
        default=None,
        help="the job's name (default: the directory or zip name, else the rank files' common prefix)",
    )
    p.add_argument("--notes", default="", help="free-text notes for the job")
    p.add_argument(
        "--user",
        default=None,
        help="uploader name (default: $STALLSCOPE_USER, else the login name)",
    )
    add_limit_options(p)
    p.add_argument(
        "--no-analyze",
        action="store_true",
        help="do not analyze the jobs after ingesting them (by default each job's report with the "
        "default thresholds is computed and stored beside it, for the dashboard and 'analyze')",
    )
    add_scheduler_option(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    # For the dashboard, which runs ingests as child processes (stallscope.ingest_child).
    p.add_argument("--progress-jsonl", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--upload-root", default=None, help=argparse.SUPPRESS)  # see plan_jobs
    add_store_option(p)
    p.set_defaults(handler=run)


def add_limit_options(p: argparse.ArgumentParser, subject: str = "the ingest") -> None:
    """``--timeout`` and ``--max-memory-mb``: the limits an ingest runs under (``subject`` names it)."""
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"give up {subject} (exit 3, store unchanged) after S seconds "
        "(default: $STALLSCOPE_INGEST_TIMEOUT, else 1800)",
    )
    p.add_argument(
        "--max-memory-mb",
        type=int,
        default=None,
        metavar="N",
        help=f"memory {subject} may use, in MiB; past it the input is refused "
        "(exit 3) (default: $STALLSCOPE_INGEST_MAX_MEMORY_MB, else 75%% of the RAM, at least 2048)",
    )


def ingest_limits(args: argparse.Namespace) -> tuple[float, int]:
    """(timeout s, memory MiB) from ``--timeout``/``--max-memory-mb`` or their defaults."""
    from stallscope.ingest.limits import default_memory_mb, default_timeout_s

    timeout = args.timeout if args.timeout is not None else default_timeout_s()
    memory = args.max_memory_mb if args.max_memory_mb is not None else default_memory_mb()
    if timeout <= 0 or memory <= 0:
        from stallscope.errors import UsageError

        raise UsageError("--timeout and --max-memory-mb must be positive")
    return timeout, memory


def run(args: argparse.Namespace) -> int:
    """Ingest in a forked worker under ``--timeout`` and ``--max-memory-mb`` (stallscope.supervise)."""
    from stallscope.cli import run_handler
    from stallscope.supervise import run_limited

    timeout, memory = ingest_limits(args)
    store = open_store(args)
    # The worker names the jobs it ingested on a pipe (never a temporary file: a killed
    # ingest leaves nothing behind); a thread drains it while the worker runs.
    read_fd, args.job_ids_fd = os.pipe()
    named: list[bytes] = []
    drain = threading.Thread(target=lambda: named.append(_read_all(read_fd)), daemon=True)
    drain.start()
    try:
        code = run_limited(
            lambda: run_handler(_ingest, args),
            timeout_s=timeout,
            memory_mb=memory,
            cleanup=store.clean_stale,
        )
    finally:
        os.close(args.job_ids_fd)
        drain.join()
        os.close(read_fd)
    if code != EXIT_OK or args.no_analyze:
        return code
    try:
        job_ids = json.loads(b"".join(named) or b"[]")
    except ValueError:
        return code
    return run_handler(lambda a: _analyze(a, store, job_ids), args)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _analyze(args: argparse.Namespace, store, job_ids: list[str]) -> int:
    """Store each ingested job's report (default thresholds) beside it: the dashboard and
    ``analyze`` read it instead of analyzing again. A job that cannot be analyzed stays stored
    (a warning says why); the exit code is the ingest's."""
    import sys

    from stallscope.progress import Progress
    from stallscope.report_store import store_default_reports

    if args.progress_jsonl:
        progress = Progress(jsonl=True)
    else:
        progress = Progress(enabled=None if not args.json else False)
    try:
        outcomes = store_default_reports(store, job_ids, progress)
    finally:
        progress.done()
    for job_id, how in outcomes:
        if how.startswith("failed"):
            print(
                f"stallscope: warning: job {job_id} is stored but its report is not ({how[8:]}); "
                "it is analyzed when first opened",
                file=sys.stderr,
            )
        elif not args.json:
            print(f"report of job {job_id}: {how}")
    return EXIT_OK


def _ingest(args: argparse.Namespace) -> int:
    from stallscope.cluster import DaskRanks, close_quietly, connect, scheduler_address
    from stallscope.ingest import ingest_paths
    from stallscope.progress import Progress

    store = open_store(args)
    address = scheduler_address(args.scheduler)
    client = connect(address) if address else None
    if args.progress_jsonl:
        progress = Progress(jsonl=True)
    else:
        progress = Progress(enabled=None if not args.json else False)
    try:
        results = ingest_paths(
            store,
            args.paths,
            each=args.each,
            uploaded_by=args.user,
            tags=args.tag,
            notes=args.notes,
            progress=progress,
            name=args.name,
            upload_root=args.upload_root,
            ranks=DaskRanks(client, store) if client is not None else None,
        )
    finally:
        progress.done()
        if client is not None:
            close_quietly(client)
    job_ids_fd = getattr(args, "job_ids_fd", None)
    if job_ids_fd is not None:
        with os.fdopen(job_ids_fd, "w", encoding="utf-8", closefd=False) as fh:
            json.dump([r.job_id for r in results], fh)
    if args.json:
        print_json([r.__dict__ for r in results])
        return EXIT_OK
    for r in results:
        state = "already stored; your upload was recorded" if r.existed else "ingested"
        print(
            f"{state}: job {r.job_id} '{r.job_name}' ({len(r.trace_ids)} trace(s): {', '.join(r.trace_ids)})"
        )
        for warning in r.warnings:
            print(f"  warning: {warning}")
    return EXIT_OK
