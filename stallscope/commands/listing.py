"""``stallscope ls``: list the store's jobs and traces."""

from __future__ import annotations

import argparse

from stallscope.cli import EXIT_OK, add_store_option, open_store, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ls",
        help="list stored traces",
        description=(
            "List the traces in the store, one line per trace. 'worst' (the job's worst finding "
            "severity and how many have it) and 'step ms' (median step time of its slowest rank) "
            "come from the job's stored report ('-': not analyzed yet). Span and kernel counts are the whole "
            "capture's, as ingested; 'analyze' measures only the steps when a trace has step markers, "
            "so its figures can be smaller. --json also shows each trace's ingest warnings."
        ),
    )
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    add_store_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    store = open_store(args)
    refs = store.traces()
    if args.json:
        print_json([r.meta for r in refs])
        return EXIT_OK
    if not refs:
        print(f"No traces in {store.root}. Add some with: stallscope ingest PATH")
        return EXIT_OK
    header = (
        "trace",
        "job",
        "job name",
        "worst",
        "step ms",
        "rank",
        "source",
        "kernels",
        "span ms",
        "uploaded",
        "file",
    )
    jobs = store.jobs()
    job_names = {j["job_id"]: j.get("name") or "" for j in jobs}
    figures = {j["job_id"]: _report_figures(store, j) for j in jobs}
    rows = [
        (
            r.trace_id,
            r.job_id,
            job_names.get(r.job_id, ""),
            *figures.get(r.job_id, ("-", "-")),
            f"{r.meta.get('rank')}/{r.meta.get('world_size')}",
            r.meta.get("source", ""),
            str(r.meta.get("kernel_count", "")),
            f"{(r.meta.get('span_ns') or 0) / 1e6:.1f}",
            (r.meta.get("uploaded_at") or "")[:16].replace("T", " "),
            r.meta.get("name", ""),
        )
        for r in refs
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def _report_figures(store, job: dict) -> tuple[str, str]:
    """(worst severity (count), median step ms) of a job's stored default report, else '-'."""
    from stallscope.report_store import default_summary

    summary = default_summary(store, job["job_id"], job.get("trace_ids", []))
    if summary is None:
        return "-", "-"
    worst = summary.get("worst_severity")
    step = summary.get("step_ms_median")
    return (
        f"{worst} ({summary.get('worst_count', 0)})" if worst else "none",
        "-" if step is None else f"{step:.1f}",
    )
