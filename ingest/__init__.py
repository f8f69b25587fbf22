"""Ingest: sniff and parse trace files into the canonical tables of the store.

Entry point: :func:`ingest_paths`. One module per format (``kineto_*``);
``reader`` handles compression and archives, ``job`` publishes atomically.
"""

from __future__ import annotations

from collections.abc import Iterable

from stallscope.errors import UsageError, environment_problem
from stallscope.ingest.job import (
    IngestResult,
    PreparedJob,
    Progress,
    discard_job,
    ingest_job,
    prepare_job,
    publish_job,
)
from stallscope.ingest.limits import check_deadline
from stallscope.ingest.reader import Source, expand_path
from stallscope.store import Store


def plan_jobs(
    paths: Iterable[str], *, each: bool = False, upload_root: str | None = None
) -> list[tuple[str, list[Source]]]:
    """Group user arguments into jobs.

    Each directory or zip is one job. Plain files given together form one job
    (the ranks of one run) unless ``each`` is set, in which case every file
    is its own job. ``upload_root`` is the dashboard's: each uploaded file
    lies in a folder of its own under it (``ROOT/<n>/<original name>``, so
    files that share a name never overwrite each other) and is named by its
    original name alone, in messages, stored metadata and job names.
    """
    jobs: list[tuple[str, list[Source]]] = []
    loose: list[Source] = []
    for arg in paths:
        name, sources = expand_path(arg)
        is_container = len(sources) != 1 or sources[0].name != arg
        if upload_root is not None:
            _rename_uploaded(sources, upload_root)
        if is_container or each:
            jobs.append((name, sources))
        else:
            loose.append(sources[0])
    if loose:
        if len(loose) == 1:
            name = loose[0].name.rsplit("/", 1)[-1]
        else:
            name = _common_name(loose, use_folder=upload_root is None)
        jobs.insert(0, (name, loose))
    return jobs


def _rename_uploaded(sources: list[Source], upload_root: str) -> None:
    """``ROOT/<n>/a.json`` -> ``a.json`` (zip members: ``ROOT/<n>/x.zip:m`` -> ``x.zip:m``)."""
    import os.path

    root = os.path.abspath(upload_root) + os.sep
    for source in sources:
        if os.path.abspath(source.name).startswith(root):
            relative = os.path.abspath(source.name)[len(root) :]
            source.name = relative.split(os.sep, 1)[-1]


def _common_name(sources: list[Source], *, use_folder: bool = True) -> str:
    """A job name for files given together: their folder, else their common prefix."""
    import os.path

    folders = {os.path.basename(os.path.dirname(os.path.abspath(s.name))) for s in sources}
    prefix = os.path.commonprefix([os.path.basename(s.name) for s in sources]).rstrip("._-")
    if use_folder and len(folders) == 1 and (folder := folders.pop()) and len(prefix) < 8:
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
    name: str | None = None,
    upload_root: str | None = None,
) -> list[IngestResult]:
    """Ingest files, directories and zips; see :func:`plan_jobs` for grouping.

    ``name`` names the job (only when the paths form one job: a
    :class:`UsageError` otherwise); without it the job is named by
    :func:`plan_jobs`. All or nothing: every job is parsed first, and only
    when all of them parse are they published; one bad input leaves the
    store as it was.
    """
    planned = plan_jobs(paths, each=each, upload_root=upload_root)
    if name is not None and name.strip():
        if len(planned) != 1:
            raise UsageError(
                f"a job name names one job, and these paths make {len(planned)} jobs "
                "(--each, or several directories/zips): leave the name out"
            )
        planned = [(name.strip(), planned[0][1])]
    prepared: list[PreparedJob] = []
    try:
        for job_name, sources in planned:
            check_deadline(job_name)
            options = {
                "uploaded_by": uploaded_by,
                "tags": tags,
                "notes": notes,
                "progress": progress,
            }
            prepared.append(prepare_job(store, job_name, sources, **options))
    except BaseException as exc:
        for job in prepared:
            discard_job(store, job)
        if isinstance(exc, OSError) and (problem := environment_problem(exc, "write the store")):
            raise problem from None
        raise
    try:
        return [publish_job(store, job) for job in prepared]
    except OSError as exc:
        problem = environment_problem(exc, "publish to the store")
        if problem is None:
            raise
        raise problem from None


__all__ = ["IngestResult", "Source", "ingest_job", "ingest_paths", "plan_jobs"]
