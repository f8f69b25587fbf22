"""``stallscope analyze``: run the analyzers and print or write a report."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from stallscope.analyzers.base import SEVERITIES
from stallscope.cli import EXIT_FINDINGS, EXIT_OK, add_store_option, open_store
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
            "here too. Jobs are ingested and analyzed in parallel (--jobs); progress is shown on "
            "stderr when it is a terminal. Files are ingested as by 'stallscope ingest', in a worker "
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
        "--jobs",
        "-j",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="processes that ingest and analyze jobs in parallel (default: the number of CPUs)",
    )
    add_limit_options(p, "ingesting the files")
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


def resolve_targets(
    store,
    targets: list[str],
    each: bool,
    *,
    workers: int = 1,
    progress=None,
    limits: tuple[float | None, int | None] = (None, None),
):
    """Targets -> list of jobs, each a list of TraceRefs (ingesting files first).

    Files are ingested as ``stallscope ingest`` does, in a forked worker under
    ``limits`` (timeout s, memory MiB: :func:`stallscope.supervise.call_limited`);
    several units in parallel when ``workers > 1``.
    """
    from stallscope.supervise import call_limited

    targets = expand_globs(targets)
    paths = [t for t in targets if os.path.exists(t)]
    jobs = []
    if paths:
        units = ingest_units(paths, each)
        timeout_s, memory_mb = limits
        try:
            job_ids = call_limited(
                lambda: _ingest_units(store, units, each, workers, progress),
                timeout_s=timeout_s,
                memory_mb=memory_mb,
                cleanup=store.clean_stale,
            )
        except BaseException:
            if progress is not None:
                progress.clear_line()  # a worker killed past a limit left its line drawn
            raise
        jobs += [store.traces(job_id) for ids in job_ids for job_id in ids]
    for ref in (t for t in targets if not os.path.exists(t)):
        if _looks_like_path(ref):
            raise InputError(ref, "no such file or directory")
        jobs.append(store.resolve(ref))
    return jobs


def _ingest_units(store, units: list[list[str]], each: bool, workers: int, progress):
    """Job ids of each unit, ingested one after another or in a pool of ``workers``
    (in the worker process: its progress line is cleared when it ends)."""
    try:
        return _ingest_each(store, units, each, workers, progress)
    finally:
        if progress is not None:
            progress.done()


def _ingest_each(store, units: list[list[str]], each: bool, workers: int, progress):
    from stallscope.ingest import ingest_paths
    from stallscope.report import process_pool

    if workers > 1 and len(units) > 1:
        job_ids: list[list[str]] = []
        with process_pool(min(workers, len(units))) as pool:
            futures = [pool.submit(_ingest_in_worker, str(store.root), u, each) for u in units]
            for done, future in enumerate(futures, start=1):
                job_ids.append(future.result())
                if progress:
                    progress("ingested", done, len(units))
        return job_ids
    return [
        [r.job_id for r in ingest_paths(store, unit, each=each, progress=progress)]
        for unit in units
    ]


def run(args: argparse.Namespace) -> int:
    from stallscope.analyzers.base import severity_at_least
    from stallscope.progress import Progress
    from stallscope.render import render
    from stallscope.report import build_report, process_pool, worst_severity

    if args.jobs < 1:
        raise InputError("--jobs", "must be at least 1")
    overrides = threshold_overrides(args)  # a bad --iteration-range fails before any ingest
    limits = ingest_limits(args)
    store = open_store(args)
    progress = Progress()
    targets = expand_globs(args.targets)
    pool = None
    try:
        jobs = resolve_targets(
            store, targets, args.each, workers=args.jobs, progress=progress, limits=limits
        )
        if args.jobs > 1 and len(jobs) > 1:  # a pool only when there are jobs to share out
            pool = process_pool(min(args.jobs, len(jobs)))
        report = build_report(
            store, jobs, overrides, executor=pool, progress=progress, all_ranks=args.all_ranks
        )
    finally:
        progress.done()
        if pool is not None:
            pool.shutdown()
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
