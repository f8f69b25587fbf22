"""``stallscope analyze``: run the analyzers and print or write a report."""

from __future__ import annotations

import argparse
import os
import sys

from stallscope.analyzers.base import SEVERITIES
from stallscope.cli import EXIT_FINDINGS, EXIT_OK, add_store_option, open_store
from stallscope.errors import InputError
from stallscope.render import FORMATS


def register(sub: argparse._SubParsersAction) -> None:
    from stallscope.analyzers import all_specs

    p = sub.add_parser(
        "analyze",
        help="analyze traces (files or store ids) and report findings",
        description=(
            "Analyze trace files, directories, zips or stored trace/job ids. Files are ingested into the "
            "store first (grouped into jobs as by 'stallscope ingest'). A trace id analyzes that trace; "
            "a job id analyzes all its ranks."
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
        choices=SEVERITIES,
        metavar="SEVERITY",
        help=f"exit with code 1 when a finding has this severity or worse ({', '.join(SEVERITIES)})",
    )
    p.add_argument("--each", action="store_true", help="treat every file argument as its own job")
    add_store_option(p)
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
    p.set_defaults(handler=run)


def threshold_overrides(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    overrides: dict[str, dict[str, float]] = {}
    for key, value in vars(args).items():
        if key.startswith("threshold__") and value is not None:
            _, analyzer, name = key.split("__", 2)
            overrides.setdefault(analyzer, {})[name] = value
    return overrides


def resolve_targets(store, targets: list[str], each: bool):
    """Targets -> list of jobs, each a list of TraceRefs (ingesting files first)."""
    from stallscope.ingest import ingest_paths
    from stallscope.progress import Progress

    paths = [t for t in targets if os.path.exists(t)]
    jobs = []
    if paths:
        progress = Progress()
        try:
            results = ingest_paths(store, paths, each=each, progress=progress)
        finally:
            progress.done()
        jobs += [store.traces(r.job_id) for r in results]
    for ref in (t for t in targets if not os.path.exists(t)):
        if _looks_like_path(ref):
            raise InputError(ref, "no such file or directory")
        jobs.append(store.resolve(ref))
    return jobs


def run(args: argparse.Namespace) -> int:
    from stallscope.analyzers.base import severity_at_least
    from stallscope.render import render
    from stallscope.report import build_report, worst_severity

    store = open_store(args)
    jobs = resolve_targets(store, args.targets, args.each)
    report = build_report(store, jobs, threshold_overrides(args))
    text = render(report, args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    worst = worst_severity(report)
    if args.fail_on and worst and severity_at_least(worst, args.fail_on):
        return EXIT_FINDINGS
    return EXIT_OK


def _looks_like_path(target: str) -> bool:
    """A missing file, not a store id: ids are 12 hex digits (or a prefix)."""
    return "/" in target or os.sep in target or "." in target
