"""``stallscope rm``: delete jobs from the store."""

from __future__ import annotations

import argparse

from stallscope.cli import EXIT_OK, add_store_option, open_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rm",
        help="delete stored jobs",
        description="Delete jobs (all their traces) from the store.",
    )
    p.add_argument("ids", nargs="+", metavar="ID", help="job id, or a trace id of the job")
    add_store_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    store = open_store(args)
    job_ids = []
    for ref in args.ids:
        job_ids += [r.job_id for r in store.resolve(ref)]
    for job_id in dict.fromkeys(job_ids):
        store.delete_job(job_id)
        print(f"deleted job {job_id}")
    return EXIT_OK
