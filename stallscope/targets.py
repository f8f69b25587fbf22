"""What a command-line or API target names: trace files, folders, zips, glob patterns, store ids.

One resolver for ``stallscope analyze``, ``compare``, ``export`` and
:func:`stallscope.load`: files are ingested first (grouped into jobs as
``stallscope ingest`` groups them), ids are looked up in the store
(:meth:`stallscope.store.Store.resolve`: a trace id, a job id, or a unique
prefix of either; the dashboard's links resolve through it too).
"""

from __future__ import annotations

import os

from stallscope.errors import InputError
from stallscope.store import Store, TraceRef

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

    return [r.job_id for r in ingest_paths(Store(store_root), paths, each=each)]


def resolve_targets(
    store: Store,
    targets: list[str],
    each: bool = False,
    *,
    workers: int = 1,
    progress=None,
    limits: tuple[float | None, int | None] = (None, None),
    scheduler: str | None = None,
) -> list[list[TraceRef]]:
    """Targets -> jobs, each a list of TraceRefs: files ingested first, then ids looked up.

    Files are ingested as ``stallscope ingest`` does, in a forked worker under
    ``limits`` (timeout s, memory MiB: :func:`stallscope.supervise.call_limited`);
    several units in parallel when ``workers > 1``. A missing target that looks like
    a path (it holds ``/`` or ``.``) is an InputError; anything else missing is taken
    as an id (NotFoundError when the store has none). With ``scheduler`` (a Dask
    scheduler's address), each job's files are parsed on its workers
    (:class:`stallscope.cluster.DaskRanks`, connected in the forked worker).
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
                lambda: _ingest_units(store, units, each, workers, progress, scheduler),
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


def _ingest_units(store, units: list[list[str]], each: bool, workers: int, progress,
                  scheduler: str | None = None):  # fmt: skip
    """Job ids of each unit, ingested one after another or in a pool of ``workers``, or
    with their files parsed on a Dask cluster (in the worker process: its progress line is
    cleared when it ends)."""
    try:
        if scheduler:
            return _ingest_on_cluster(store, units, each, scheduler, progress)
        return _ingest_each(store, units, each, workers, progress)
    finally:
        if progress is not None:
            progress.done()


def _ingest_on_cluster(store, units: list[list[str]], each: bool, scheduler: str, progress):
    from stallscope.cluster import DaskRanks, close_quietly, connect
    from stallscope.ingest import ingest_paths

    client = connect(scheduler)
    try:
        ranks = DaskRanks(client, store)
        return [
            [r.job_id for r in ingest_paths(store, unit, each=each, progress=progress, ranks=ranks)]
            for unit in units
        ]
    finally:
        close_quietly(client)


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


def upload_extensions() -> list[str]:
    """The file name endings the dashboard's uploader offers: every registered format's, plus
    ``gz`` and ``zip`` (``stallscope.ingest.registry``)."""
    from stallscope.ingest.registry import upload_extensions as registered

    return registered()


def _looks_like_path(target: str) -> bool:
    """A missing file, not a store id: ids are 12 hex digits (or a prefix)."""
    return "/" in target or os.sep in target or "." in target
