"""``stallscope analyze``: run the analyzers and print or write a report."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stallscope.analyzers.base import SEVERITIES
from stallscope.cli import (
    EXIT_FINDINGS,
    EXIT_OK,
    add_scheduler_option,
    add_store_option,
    open_store,
)
from stallscope.commands.ingest import add_limit_options, ingest_limits
from stallscope.errors import InputError
from stallscope.render import FORMATS


def register(sub: argparse._SubParsersAction, thresholds: bool = True) -> None:
    """Add ``analyze``; ``thresholds=False`` leaves out the per-analyzer options (no analyzer imported)."""

    p = sub.add_parser(
        "analyze",
        help="analyze traces (files or store ids) and report findings",
        description=(
            "Analyze trace files, directories, zips or stored trace/job ids. Files are ingested into the "
            "store first (grouped into jobs as by 'stallscope ingest'). A trace id analyzes that trace; "
            "a job id analyzes all its ranks. Quoted glob patterns ('runs/**/*.json.gz') are expanded "
            "here too. Jobs, and the ranks of a job of many ranks, are ingested and analyzed in "
            "parallel processes (--jobs), or on a Dask cluster (--scheduler: every rank's file and "
            "per-rank analysis on its workers, see docs/dask.md); progress is shown on stderr when "
            "it is a terminal. Files are ingested as by 'stallscope ingest', in a worker "
            "process under its time and memory limits."
        ),
    )
    p.add_argument(
        "targets", nargs="+", metavar="PATH|ID", help="trace file, directory, zip, or store id"
    )
    p.add_argument(
        "--format", choices=FORMATS, default="text", help="report format (default: text)"
    )
    p.add_argument(
        "--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout"
    )
    p.add_argument(
        "--fail-on",
        type=str.lower,
        choices=SEVERITIES,
        metavar="SEVERITY",
        help=f"exit with code 1 when a finding has this severity or worse ({', '.join(SEVERITIES)})",
    )
    p.add_argument("--each", action="store_true", help="treat every file argument as its own job")
    p.add_argument(
        "--iteration-range",
        metavar="REGEX",
        help=(
            "inference: the host ranges (record_function/NVTX names) that are the serving loop's "
            "iterations, as a regular expression; default: found from engine names, CUDA-graph "
            "replays or input shapes (docs/analyzers/inference.md)"
        ),
    )
    p.add_argument(
        "--all-ranks",
        action="store_true",
        help="run the per-rank analyzers on every rank; by default a job of more than 64 ranks "
        "gets them on the ranks a first pass finds out of line and on median ranks (the report "
        "says which and why)",
    )
    p.add_argument(
        "--recompute",
        action="store_true",
        help="analyze again, neither reading nor writing stored reports (by default a whole job's "
        "report stored for these thresholds and this version is reused, and one computed here "
        "is stored)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        metavar="N",
        help="processes that ingest and analyze jobs (and the ranks of a job of 8 or more ranks) "
        "in parallel (default: the number of CPUs when there are 4 or more, else 1: on 2 CPUs "
        "the processes cost more than they save; ignored with --scheduler)",
    )
    add_limit_options(p, "ingesting the files")
    add_scheduler_option(p)
    add_store_option(p)
    p.set_defaults(handler=run)
    if thresholds:
        add_threshold_options(p)


def add_threshold_options(p: argparse.ArgumentParser) -> None:
    from stallscope.analyzers import all_specs

    group = p.add_argument_group("analyzer thresholds")
    for spec in all_specs():
        for t in spec.thresholds:
            group.add_argument(
                f"--{spec.id}-{t.name}".replace("_", "-"),
                dest=f"threshold__{spec.id}__{t.name}",
                type=float,
                metavar=t.unit.upper() if t.unit.isalpha() else "N",
                help=f"{t.help} (default {t.default:g} {t.unit})".replace("%", "%%"),
            )


def threshold_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``overrides[analyzer][threshold]`` from the flags; ``--iteration-range`` as the
    inference analyzer's ``iteration_range`` setting (:mod:`stallscope.job_settings`)."""
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in vars(args).items():
        if key.startswith("threshold__") and value is not None:
            _, analyzer, name = key.split("__", 2)
            overrides.setdefault(analyzer, {})[name] = value
    regex = (getattr(args, "iteration_range", None) or "").strip()
    if regex:
        from stallscope.job_settings import ITERATION_RANGE, check_iteration_range

        check_iteration_range(regex)
        overrides.setdefault(ITERATION_RANGE[0], {})[ITERATION_RANGE[1]] = regex
    return overrides


def run(args: argparse.Namespace) -> int:
    from stallscope.analyzers.base import severity_at_least
    from stallscope.cluster import DaskExecutor, close_quietly, connect, scheduler_address
    from stallscope.progress import Progress
    from stallscope.render import render
    from stallscope.report import (
        build_report,
        default_jobs,
        process_pool,
        worst_severity,
        worth_a_pool,
    )
    from stallscope.targets import expand_globs, resolve_targets

    if args.jobs is None:
        args.jobs = default_jobs()
    if args.jobs < 1:
        raise InputError("--jobs", "must be at least 1")
    overrides = threshold_overrides(args)  # a bad --iteration-range fails before any ingest
    limits = ingest_limits(args)
    store = open_store(args)
    progress = Progress()
    targets = expand_globs(args.targets)
    address = scheduler_address(args.scheduler)
    pool = client = None
    try:
        jobs = resolve_targets(
            store, targets, args.each, workers=args.jobs, progress=progress, limits=limits,
            scheduler=address,
        )  # fmt: skip
        if address:  # (connected after the ingest: it runs in a forked worker, with its own)
            client = connect(address)
            executor = DaskExecutor(client)
        elif args.jobs > 1 and worth_a_pool(jobs):
            executor = pool = process_pool(args.jobs)  # (processes start as tasks come)
        else:
            executor = None
        report = build_report(
            store, jobs, overrides, workers=args.jobs, executor=executor, progress=progress,
            all_ranks=args.all_ranks, reuse=not args.recompute,
        )  # fmt: skip
    finally:
        progress.done()
        if pool is not None:
            pool.shutdown()
        if client is not None:
            close_quietly(client)
    text = render(report, args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    worst = worst_severity(report)
    if args.fail_on and worst and severity_at_least(worst, args.fail_on):
        gating = [f for f in report["findings"] if severity_at_least(f["severity"], args.fail_on)]
        top = next(f for f in gating if f["severity"] == worst)
        print(
            f"stallscope: {len(gating)} finding(s) at or above {args.fail_on}; worst: "
            f"[{worst.upper()}] {top['title']} ({top['analyzer']}): exit code 1",
            file=sys.stderr,
        )
        return EXIT_FINDINGS
    return EXIT_OK
