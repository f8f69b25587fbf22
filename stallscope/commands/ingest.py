"""``stallscope ingest``: add traces to the store."""

from __future__ import annotations

import argparse

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
    return run_limited(
        lambda: run_handler(_ingest, args),
        timeout_s=timeout,
        memory_mb=memory,
        cleanup=store.clean_stale,
    )


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
