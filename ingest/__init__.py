"""Ingest: sniff and parse trace files into the canonical tables of the store.

Entry point: :func:`ingest_paths`. One folder per format (``kineto/``,
``nsys/``, ``ncu/``...: ``registry`` finds them, ``sniff`` tells them apart;
docs/extending.md); ``reader`` handles compression and archives, ``job``
publishes atomically.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from stallscope.errors import InputError, UsageError, environment_problem
from stallscope.ingest.job import (
    IngestResult,
    PreparedJob,
    Progress,
    RankIngest,
    discard_job,
    ingest_job,
    prepare_job,
    publish_job,
)
from stallscope.ingest.limits import check_deadline
from stallscope.ingest.reader import Expanded, Skipped, Source, check_rank_count, expand
from stallscope.store import Store


class PlannedJob(NamedTuple):
    """One job to ingest: its name, its trace files, and the files of its directory or zip
    that are not traces (left out of the job and of its id, named in its warnings)."""

    name: str
    sources: list[Source]
    skipped: list[Skipped] = []


def plan_jobs(
    paths: Iterable[str], *, each: bool = False, upload_root: str | None = None
) -> list[PlannedJob]:
    """Group user arguments into jobs.

    Each directory or zip is one job; inside it, files that are not traces
    (told by name, then by content: :func:`~stallscope.ingest.sniff.not_a_trace`)
    are skipped, and one with no trace at all is refused (InputError). Plain
    files given together form one job (the ranks of one run) unless ``each``
    is set, in which case every file is its own job; a plain file that is not
    a trace is refused when parsed. ``upload_root`` is the dashboard's: each
    uploaded file lies in a folder of its own under it (``ROOT/<n>/<original
    name>``, so files that share a name never overwrite each other) and is
    named by its original name alone, in messages, stored metadata and job names.
    """
    jobs: list[PlannedJob] = []
    loose: list[Source] = []
    for arg in paths:
        expanded = expand(arg)
        if upload_root is not None:
            _rename_uploaded([*expanded.sources, *expanded.skipped], upload_root)
            arg = _uploaded_name(arg, upload_root)
        if expanded.container:
            jobs.append(_container_job(arg, expanded))
        elif each:
            jobs.append(PlannedJob(expanded.name, expanded.sources))
        else:
            loose.append(expanded.sources[0])
    if loose:
        if len(loose) == 1:
            name = loose[0].name.rsplit("/", 1)[-1]
        else:
            name = _common_name(loose, use_folder=upload_root is None)
        jobs.insert(0, PlannedJob(name, loose))
    return jobs


def _container_job(display: str, expanded: Expanded) -> PlannedJob:
    """A directory's or zip's job: its traces, the rest skipped with a reason."""
    from stallscope.ingest.sniff import not_a_trace

    traces = []
    skipped = list(expanded.skipped)  # by name
    for source in expanded.sources:
        check_deadline(source.name)
        reason = not_a_trace(source)  # by content: the decompressed head only
        if reason is None:
            traces.append(source)
        else:
            skipped.append(Skipped(source.name, source.member or source.name, reason))
    skipped.sort(key=lambda s: s.short)
    if not traces:
        names = ", ".join(s.short for s in skipped)
        raise InputError(display, f"holds no traces (skipped: {names})")
    check_rank_count(display, len(traces), expanded.container)
    return PlannedJob(expanded.name, traces, skipped)


def skipped_warnings(skipped: list[Skipped]) -> list[str]:
    """One warning per skipped file: its name and why it is not a trace."""
    return [f"{s.name}: skipped ({s.reason})" for s in skipped]


def _rename_uploaded(sources: list[Source | Skipped], upload_root: str) -> None:
    """``ROOT/<n>/a.json`` -> ``a.json`` (zip members: ``ROOT/<n>/x.zip:m`` -> ``x.zip:m``)."""
    for source in sources:
        source.name = _uploaded_name(source.name, upload_root)


def _uploaded_name(name: str, upload_root: str) -> str:
    """``ROOT/<n>/a.json`` -> ``a.json``; other names unchanged."""
    import os.path

    root, path = os.path.abspath(upload_root) + os.sep, os.path.abspath(name)
    if path.startswith(root):
        return path[len(root) :].split(os.sep, 1)[-1]
    return name


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
    ranks: RankIngest | None = None,
) -> list[IngestResult]:
    """Ingest files, directories and zips; see :func:`plan_jobs` for grouping.

    ``name`` names the job (only when the paths form one job: a
    :class:`UsageError` otherwise); without it the job is named by
    :func:`plan_jobs`. All or nothing: every job is parsed first, and only
    when all of them parse are they published; one bad input leaves the
    store as it was. ``ranks`` parses each job's files (default: here, one after the
    other; :class:`stallscope.cluster.DaskRanks`: on a Dask cluster's workers).
    """
    planned = plan_jobs(paths, each=each, upload_root=upload_root)
    if name is not None and name.strip():
        if len(planned) != 1:
            raise UsageError(
                f"a job name names one job, and these paths make {len(planned)} jobs "
                "(--each, or several directories/zips): leave the name out"
            )
        planned = [planned[0]._replace(name=name.strip())]
    prepared: list[PreparedJob] = []
    try:
        for job_name, sources, skipped in planned:
            check_deadline(job_name)
            options = {
                "uploaded_by": uploaded_by,
                "tags": tags,
                "notes": notes,
                "progress": progress,
                "ranks": ranks,
            }
            job = prepare_job(store, job_name, sources, **options)
            job.result.warnings[:0] = skipped_warnings(skipped)
            prepared.append(job)
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


__all__ = ["IngestResult", "PlannedJob", "Source", "ingest_job", "ingest_paths", "plan_jobs"]
