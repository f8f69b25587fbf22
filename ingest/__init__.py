"""Ingest: sniff and parse trace files into the canonical tables of the store.

Entry point: :func:`ingest_paths`. One module per format (``kineto_*``);
``reader`` handles compression and archives, ``job`` publishes atomically.
"""

from __future__ import annotations

from collections.abc import Iterable

from stallscope.ingest.job import (
    IngestResult,
    PreparedJob,
    Progress,
    discard_job,
    ingest_job,
    prepare_job,
    publish_job,
)
from stallscope.ingest.reader import Source, expand_path
from stallscope.store import Store


def plan_jobs(paths: Iterable[str], *, each: bool = False) -> list[tuple[str, list[Source]]]:
    """Group user arguments into jobs.

    Each directory or zip is one job. Plain files given together form one job
    (the ranks of one run) unless ``each`` is set, in which case every file
    is its own job.
    """
    jobs: list[tuple[str, list[Source]]] = []
    loose: list[Source] = []
    for arg in paths:
        name, sources = expand_path(arg)
        is_container = len(sources) != 1 or sources[0].name != arg
        if is_container or each:
            jobs.append((name, sources))
        else:
            loose.append(sources[0])
    if loose:
        name = loose[0].name.rsplit("/", 1)[-1] if len(loose) == 1 else _common_name(loose)
        jobs.insert(0, (name, loose))
    return jobs


def _common_name(sources: list[Source]) -> str:
    """A job name for files given together: their folder, else their common prefix."""
    import os.path

    folders = {os.path.basename(os.path.dirname(os.path.abspath(s.name))) for s in sources}
    prefix = os.path.commonprefix([os.path.basename(s.name) for s in sources]).rstrip("._-")
    if len(folders) == 1 and (folder := folders.pop()) and len(prefix) < 8:
        return folder
    return prefix or f"{len(sources)} files"


def ingest_paths(
    store: Store,
    paths: Iterable[str],
    *,
    each: bool = False,
    uploaded_by: str | None = None,
    tags: list[str] | None = None,
    notes: str = "",
    progress: Progress | None = None,
) -> list[IngestResult]:
    """Ingest files, directories and zips; see :func:`plan_jobs` for grouping.

    All or nothing: every job is parsed first, and only when all of them parse
    are they published; one bad input leaves the store as it was.
    """
    prepared: list[PreparedJob] = []
    try:
        for name, sources in plan_jobs(paths, each=each):
            options = {
                "uploaded_by": uploaded_by,
                "tags": tags,
                "notes": notes,
                "progress": progress,
            }
            prepared.append(prepare_job(store, name, sources, **options))
    except BaseException:
        for job in prepared:
            discard_job(store, job)
        raise
    return [publish_job(store, job) for job in prepared]


__all__ = ["IngestResult", "Source", "ingest_job", "ingest_paths", "plan_jobs"]
