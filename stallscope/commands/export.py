"""``stallscope export TRACE --perfetto OUT.json``: a Chrome/Perfetto trace with the findings added."""

from __future__ import annotations

import argparse
import os
import sys

from stallscope.analyzers.base import SEVERITIES, SEVERITY_RANK
from stallscope.cli import EXIT_OK, add_store_option, open_store
from stallscope.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a trace with its findings as Chrome trace JSON (Perfetto, chrome://tracing)",
        description=(
            "Write one trace (a trace file, ingested first, or a stored trace id; a job id of a "
            "one-trace job) as Chrome trace JSON that Perfetto (ui.perfetto.dev) and chrome://tracing "
            "open: GPU activities per GPU and stream (with their launch configuration, bytes and ids), "
            "GPU-projected annotations, host activities per process and thread (with operator input "
            "shapes where recorded), a flow arrow from "
            "each launch call to the GPU work it launched, and the analyzers' findings (low "
            "severity or worse by default) as slices over their evidence windows on a "
            "'stallscope findings' track (args: severity, analyzer, detail, recommendation, "
            "impact_ms). Ingesting the export gives the same GPU, host and range tables."
        ),
    )
    p.add_argument(
        "trace", metavar="TRACE", help="trace file, stored trace id, or id of a one-trace job"
    )
    p.add_argument(
        "--perfetto",
        metavar="OUT.json",
        required=True,
        help="file to write ('-' for stdout); a name ending in .gz is gzip-compressed",
    )
    p.add_argument(
        "--findings",
        default="low",
        choices=[*SEVERITIES, "none"],
        metavar="SEVERITY",
        help="put findings of this severity or worse on the findings track "
        "(critical, high, medium, low, info; 'none' for no track; default: low)",
    )
    add_store_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stallscope.api import load
    from stallscope.jobdata import JobData
    from stallscope.perfetto import write_chrome_trace
    from stallscope.report import analyze_job

    store = open_store(args)
    target = load(args.trace, store=store).refs
    if len(target) != 1:
        ids = ", ".join(f"{r.trace_id} (rank {r.meta.get('rank')})" for r in target)
        raise InputError(args.trace, f"names {len(target)} traces; export one of: {ids}")
    (ref,) = target
    data = JobData(store, store.traces(ref.job_id))  # findings need the whole job (all ranks)
    try:
        findings = [
            f.to_dict()
            for f in analyze_job(data).findings
            if f.trace == ref.trace_id and _shown(f.severity, args.findings)
        ]
        if args.perfetto == "-":
            counts = write_chrome_trace(data, ref.trace_id, sys.stdout, findings)
        else:
            counts = _write_file(args.perfetto, data, ref.trace_id, findings, write_chrome_trace)
    finally:
        data.close()
    if args.perfetto != "-":
        print(
            f"wrote {args.perfetto}: {counts['gpu']} GPU and {counts['host']} host events, "
            f"{counts['flows']} launch flows, {counts['gpu_annotations']} GPU annotations, "
            f"{counts['findings']} finding slice(s); open it in https://ui.perfetto.dev"
        )
    return EXIT_OK


def _shown(severity: str, floor: str) -> bool:
    return floor != "none" and SEVERITY_RANK[severity] >= SEVERITY_RANK[floor]


def _write_file(path: str, data, trace_id: str, findings, writer) -> dict[str, int]:
    """Write next to ``path`` and rename into place, so a failure leaves no half file."""
    import gzip

    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        if path.endswith(".gz"):
            with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as fh:
                counts = writer(data, trace_id, fh, findings)
        else:
            with open(tmp, "w", encoding="utf-8", buffering=1 << 20) as fh:
                counts = writer(data, trace_id, fh, findings)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return counts
