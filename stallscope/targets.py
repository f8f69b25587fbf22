"""What a command-line or API target names: trace files, folders, zips, glob patterns, store ids.

One resolver for ``stallscope analyze``, ``compare``, ``export`` and
:func:`stallscope.load`: files are ingested first (grouped into jobs as
``stallscope ingest`` groups them), ids are looked up in the store
(:meth:`stallscope.store.Store.resolve`: a trace id, a job id, or a unique
prefix of either; the dashboard's links resolve through it too).
"""

from __future__ import annotations

import os
from collections.abc import Callable

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
    pool=None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[list[TraceRef]]:
    """Targets -> jobs, each a list of TraceRefs: files ingested first (by ``pool``'s
    processes when given and there is more than one group), then ids looked up.

    A missing target that looks like a path (it holds ``/`` or ``.``) is an
    InputError; anything else missing is taken as an id (NotFoundError when
    the store has none).
    """
    targets = expand_globs(targets)
    paths = [t for t in targets if os.path.exists(t)]
    jobs = []
    if paths:
        units = ingest_units(paths, each)
        job_ids: list[list[str]] = []
        if pool is not None and len(units) > 1:
            futures = [pool.submit(_ingest_in_worker, str(store.root), u, each) for u in units]
            for done, future in enumerate(futures, start=1):
                job_ids.append(future.result())
                if progress:
                    progress("ingested", done, len(units))
        else:
            from stallscope.ingest import ingest_paths

            for unit in units:
                job_ids.append(
                    [r.job_id for r in ingest_paths(store, unit, each=each, progress=progress)]
                )
        jobs += [store.traces(job_id) for ids in job_ids for job_id in ids]
    for ref in (t for t in targets if not os.path.exists(t)):
        if _looks_like_path(ref):
            raise InputError(ref, "no such file or directory")
        jobs.append(store.resolve(ref))
    return jobs


def upload_extensions() -> list[str]:
    """The file name endings the dashboard's uploader offers: every registered format's, plus
    ``gz`` and ``zip`` (``stallscope.ingest.registry``)."""
    from stallscope.ingest.registry import upload_extensions as registered

    return registered()


def _looks_like_path(target: str) -> bool:
    """A missing file, not a store id: ids are 12 hex digits (or a prefix)."""
    return "/" in target or os.sep in target or "." in target
