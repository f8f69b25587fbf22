"""``stallscope rm``: remove your upload of a job, or (``--all``) the job for everyone."""

from __future__ import annotations

import argparse

from stallscope.cli import EXIT_OK, add_store_option, open_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rm",
        help="remove your upload of stored jobs (--all: delete them for everyone)",
        description=(
            "Remove your upload of each job: the job stays for the others who uploaded the "
            "same files, and its traces are deleted with its last upload. With --all, delete "
            "the jobs (all their traces and uploads) for everyone."
        ),
    )
    p.add_argument("ids", nargs="+", metavar="ID", help="job id, or a trace id of the job")
    p.add_argument(
        "--user",
        default=None,
        help="whose upload to remove (default: $STALLSCOPE_USER, else the login name, as in ingest)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="delete the jobs for everyone, whoever uploaded them",
    )
    add_store_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stallscope.store import current_user

    store = open_store(args)
    job_ids = []
    for ref in args.ids:
        job_ids += [r.job_id for r in store.resolve(ref)]
    user = args.user or current_user()
    for job_id in dict.fromkeys(job_ids):
        if args.all:
            store.delete_job(job_id)
            print(f"deleted job {job_id} for everyone")
        elif store.remove_upload(job_id, user):
            print(f"deleted job {job_id} (its last upload, by {user})")
        else:
            others = ", ".join(store.job(job_id).get("uploaders", []))
            print(f"removed {user}'s upload of job {job_id} (still uploaded by {others})")
    return EXIT_OK
