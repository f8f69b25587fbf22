"""``stallscope analyze``: run the analyzers and print or write a report."""

from __future__ import annotations

import argparse
import os
import sys

from stallscope.analyzers.base import SEVERITIES
from stallscope.cli import (
    EXIT_FINDINGS,
    EXIT_OK,
    add_scheduler_option,
    add_store_option,
    open_store,
)
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
            "it is a terminal."
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
        "--jobs",
        "-j",
        type=int,
        default=None,
        metavar="N",
        help="processes that ingest and analyze jobs (and the ranks of a job of 8 or more ranks) "
        "in parallel (default: the number of CPUs when there are 4 or more, else 1: on 2 CPUs "
        "the processes cost more than they save; ignored with --scheduler)",
    )
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


def threshold_overrides(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    overrides: dict[str, dict[str, float]] = {}
    for key, value in vars(args).items():
        if key.startswith("threshold__") and value is not None:
            _, analyzer, name = key.split("__", 2)
            overrides.setdefault(analyzer, {})[name] = value
    return overrides


GLOB_CHARS = frozenset("*?[")


def expand_globs(targets: list[str]) -> list[str]:
    """Targets with quoted glob patterns expanded (sorted); a pattern matching nothing is an error."""
    import glob

    out: list[str] = []
    for target in targets:
        if os.path.exists(target) or not GLOB_CHARS & set(target):
            out.append(target)
            continue
        matches = sorted(glob.glob(target, recursive=True))
        if not matches:
            raise InputError(target, "no file matches this pattern")
        out += [m for m in matches if not m.endswith(".truth.json")]
    return list(dict.fromkeys(out))


def ingest_units(paths: list[str], each: bool) -> list[list[str]]:
    """Paths grouped as ``plan_jobs`` groups them: plain files together (one job, unless
    ``each``), every directory or zip alone; each group can be ingested independently."""
    import zipfile

    containers = [p for p in paths if os.path.isdir(p) or zipfile.is_zipfile(p)]
    loose = [p for p in paths if p not in containers]
    units = [[p] for p in loose] if each else ([loose] if loose else [])
    return units + [[c] for c in containers]


def _ingest_in_worker(store_root: str, paths: list[str], each: bool) -> list[str]:
    from stallscope.ingest import ingest_paths
    from stallscope.store import Store

    return [r.job_id for r in ingest_paths(Store(store_root), paths, each=each)]


def resolve_targets(store, targets: list[str], each: bool, pool=None, progress=None, ranks=None):
    """Targets -> list of jobs, each a list of TraceRefs (ingesting files first: by ``pool``'s
    processes, one job each, or here with each job's files parsed by ``ranks``)."""
    targets = expand_globs(targets)
    paths = [t for t in targets if os.path.exists(t)]
    jobs = []
    if paths:
        units = ingest_units(paths, each)
        job_ids: list[list[str]] = []
        if pool is not None and len(units) > 1:
            futures = [pool.submit(_ingest_in_worker, str(store.root), u, each) for u in units]
            for done, future in enumerate(futures, start=1):
                job_ids.append(future.result())
                if progress:
                    progress("ingested", done, len(units))
        else:
            from stallscope.ingest import ingest_paths

            for unit in units:
                results = ingest_paths(store, unit, each=each, progress=progress, ranks=ranks)
                job_ids.append([r.job_id for r in results])
        jobs += [store.traces(job_id) for ids in job_ids for job_id in ids]
    for ref in (t for t in targets if not os.path.exists(t)):
        if _looks_like_path(ref):
            raise InputError(ref, "no such file or directory")
        jobs.append(store.resolve(ref))
    return jobs


def run(args: argparse.Namespace) -> int:
    from stallscope.analyzers.base import severity_at_least
    from stallscope.cluster import (
        DaskExecutor,
        DaskRanks,
        close_quietly,
        connect,
        scheduler_address,
    )
    from stallscope.progress import Progress
    from stallscope.render import render
    from stallscope.report import (
        build_report,
        default_jobs,
        process_pool,
        worst_severity,
        worth_a_pool,
    )

    if args.jobs is None:
        args.jobs = default_jobs()
    if args.jobs < 1:
        raise InputError("--jobs", "must be at least 1")
    store = open_store(args)
    progress = Progress()
    targets = expand_globs(args.targets)
    address = scheduler_address(args.scheduler)
    client = connect(address) if address else None
    # a local pool for ingest, only when there is more than one job to share out
    parallel = client is None and args.jobs > 1 and len(targets) > 1
    pool = process_pool(args.jobs) if parallel else None  # (processes start as tasks come)
    try:
        ranks = DaskRanks(client, store) if client is not None else None
        jobs = resolve_targets(store, targets, args.each, pool, progress, ranks)
        if client is not None:
            executor = DaskExecutor(client)
        else:
            executor = pool if pool is not None and worth_a_pool(jobs) else None
        report = build_report(
            store, jobs, threshold_overrides(args), workers=args.jobs, executor=executor,
            progress=progress,
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


def _looks_like_path(target: str) -> bool:
    """A missing file, not a store id: ids are 12 hex digits (or a prefix)."""
    return "/" in target or os.sep in target or "." in target
