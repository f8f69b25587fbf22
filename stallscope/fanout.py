"""Analysis spread over worker processes or a Dask cluster (``analyze --jobs N``, ``--scheduler``).

:func:`analyze_jobs` gives the same report parts as ``report.job_report_part``
run on each job in turn, with the work cut into tasks submitted to an
executor (``submit(fn, *args)`` returning a future with ``result()``: a
``ProcessPoolExecutor`` or :class:`stallscope.cluster.DaskExecutor`):

* a job of one rank is one task (every analyzer, as ``job_report_part``);
* a larger job's rank triage (``rank_triage.select_ranks``) runs here first:
  only the ranks it picks get per-rank tasks, as ``job_report_part`` reads them;
* a job of several ranks is a few tasks of consecutive ranks (the analyzers
  with ``SPEC.per_rank``, over each rank's traces alone, as
  ``report.analyze_job`` runs them on ``JobData.rank_parts``) and one task for
  the cross-rank analyzers over the whole job (on the client instead when the
  executor says ``cross_here``: a Dask cluster's workers then run only
  per-rank work). The ranks' results are joined in rank order with
  ``SPEC.combine_ranks``, then every analyzer's result is put in report order.

Tasks take picklable arguments only (trace refs with absolute paths, the
threshold overrides) and read the store's Parquet files themselves: the
store must be at the same path wherever they run. Each task also returns a
:class:`TaskTiming` (process, wall-clock window), which ``build_report``
hands to its ``timings`` list: what ran where, and when.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from stallscope import job_settings
from stallscope.analyzers import all_specs, per_rank_ids
from stallscope.analyzers.base import AnalyzerResult, concatenate
from stallscope.jobdata import JobData
from stallscope.store import Store, TraceRef

Part = Any  # a report_types.Report


@dataclass(frozen=True)
class TaskTiming:
    """Where and when one analysis task ran: ``kind`` is ``job``, ``ranks`` (``rank``: the
    first of its run of ranks) or ``cross``; ``started``/``ended`` are Unix seconds
    (``time.time()``, comparable across processes)."""

    job_id: str
    kind: str
    rank: int | None
    host: str
    pid: int
    started: float
    ended: float


def _timed(
    job_id: str, kind: str, rank: int | None, work: Callable[[], Any]
) -> tuple[Any, TaskTiming]:
    started = time.time()
    value = work()
    timing = TaskTiming(job_id, kind, rank, socket.gethostname(), os.getpid(), started, time.time())
    return value, timing


def whole_job_task(
    root: str, refs: list[TraceRef], overrides: dict | None, all_ranks: bool = False
) -> tuple[Part, TaskTiming]:
    """A task: every analyzer over one job (``report.job_report_part``)."""
    from stallscope.report import job_report_part

    job_id = refs[0].job_id
    return _timed(
        job_id, "job", None, lambda: job_report_part(Store(root), refs, overrides, all_ranks)
    )


def rank_task(
    root: str, groups: list[list[TraceRef]], overrides: dict | None
) -> tuple[list[dict[str, AnalyzerResult]], TaskTiming]:
    """A task: the per-rank analyzers over a run of ranks, each rank's traces alone.

    As ``report.analyze_job`` runs them: each rank is a part of one database
    (``JobData(parent=..., load=True)``: its rows read once, then queried in
    memory), closed before the next. One result dict per rank, in order.
    """
    import duckdb

    from stallscope.report import reading_error

    store = Store(root)
    refs = [ref for group in groups for ref in group]
    specs = [spec for spec in all_specs() if spec.per_rank]

    def work() -> list[dict[str, AnalyzerResult]]:
        whole = JobData(store, refs)
        out = []
        try:
            job_settings.apply(whole, overrides)
            with whole.rank_phase():
                for group in groups:
                    part = JobData(store, group, parent=whole, load=True)
                    try:
                        out.append({s.id: s.run(part, s.params((overrides or {}).get(s.id)))
                                    for s in specs})  # fmt: skip
                    finally:
                        part.close()
        except duckdb.Error as exc:
            raise reading_error(store, refs, exc) from None
        finally:
            whole.close()
        return out

    return _timed(refs[0].job_id, "ranks", groups[0][0].meta.get("rank"), work)


def runs_of(groups: list[list[TraceRef]], tasks: int) -> list[list[list[TraceRef]]]:
    """``groups`` cut into at most ``tasks`` runs of consecutive ranks, of near-equal length."""
    tasks = max(1, min(tasks, len(groups)))
    size, extra = divmod(len(groups), tasks)
    runs, at = [], 0
    for index in range(tasks):
        length = size + (index < extra)
        runs.append(groups[at : at + length])
        at += length
    return runs


def cross_task(
    root: str, refs: list[TraceRef], overrides: dict | None
) -> tuple[dict[str, AnalyzerResult], TaskTiming]:
    """A task: the analyzers that are not per-rank, over the whole job."""
    store = Store(root)

    def work() -> dict[str, AnalyzerResult]:
        return _run_specs(store, refs, overrides, lambda spec_id: spec_id not in per_rank_ids())

    return _timed(refs[0].job_id, "cross", None, work)


def _run_specs(
    store: Store, refs: list[TraceRef], overrides: dict | None, wanted: Callable[[str], bool]
) -> dict[str, AnalyzerResult]:
    """The chosen analyzers' results over ``refs``, by analyzer id (unreadable files: one line)."""
    import duckdb

    from stallscope.report import reading_error

    job = JobData(store, refs)
    try:
        job_settings.apply(job, overrides)
        return {
            spec.id: spec.run(job, spec.params((overrides or {}).get(spec.id)))
            for spec in all_specs()
            if wanted(spec.id)
        }
    except duckdb.Error as exc:
        raise reading_error(store, refs, exc) from None
    finally:
        job.close()


def analyze_jobs(
    store: Store,
    jobs: list[list[TraceRef]],
    overrides: dict | None,
    executor: Any,
    *,
    slots: int,
    all_ranks: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    timings: list[TaskTiming] | None = None,
) -> list[Part]:
    """Each job's report part (see the module docstring), in the order of ``jobs``.

    A job's ranks are cut into at most ``2 * slots`` tasks (``slots``: how many
    tasks the executor runs at once): a task per rank would open a database
    per rank, which costs more than the analysis of a small rank.
    """
    root = str(store.root.absolute())
    cross_here = getattr(executor, "cross_here", False)
    submitted = []
    for refs in jobs:
        refs = [replace(r, path=r.path.absolute()) for r in refs]
        groups = JobData(store, refs).rank_groups()  # (reads nothing: no connection is opened)
        if len(groups) <= 1:
            task = executor.submit(whole_job_task, root, refs, overrides, all_ranks)
            submitted.append((refs, task, None, None))
            continue
        selection = _selection(store, refs, all_ranks)
        if selection is not None:
            groups = [g for g in groups if int(g[0].meta.get("rank") or 0) in selection.analyzed]
        ranks = [
            executor.submit(rank_task, root, run, overrides)
            for run in runs_of(groups, 2 * slots)
            if run
        ]
        cross = None if cross_here else executor.submit(cross_task, root, refs, overrides)
        submitted.append((refs, ranks, cross, selection))
    parts = []
    for done, (refs, ranks, cross, selection) in enumerate(submitted, start=1):
        parts.append(_gather_job(root, refs, ranks, cross, selection, overrides, executor, timings))
        if progress:
            progress("analyzed", done, len(jobs))
    return parts


def _selection(store: Store, refs: list[TraceRef], all_ranks: bool):
    """The job's rank triage (``rank_triage.select_ranks``: which ranks the per-rank analyzers
    read), here, before any rank task is submitted; None: every rank."""
    import duckdb

    from stallscope.rank_triage import select_ranks
    from stallscope.report import reading_error

    job = JobData(store, refs)
    try:
        return select_ranks(job, all_ranks=all_ranks)
    except duckdb.Error as exc:
        raise reading_error(store, refs, exc) from None
    finally:
        job.close()


def _gather_job(root, refs, ranks, cross, selection, overrides, executor, timings) -> Part:
    """One job's part from its tasks' results (the cross-rank analyzers run here when
    ``cross`` is None)."""
    from stallscope.report import part_of

    what = f"analysis of job {refs[0].job_id}"
    result = getattr(executor, "result", None) or (lambda future, _what: future.result())
    if not isinstance(ranks, list):  # a one-rank job: one task
        part, timing = result(ranks, what)
        _note(timings, timing)
        return part
    if cross is None:
        whole, timing = cross_task(root, refs, overrides)
    else:
        whole, timing = result(cross, what)
    _note(timings, timing)
    by_rank: dict[str, list[AnalyzerResult]] = {s.id: [] for s in all_specs() if s.per_rank}
    for future in ranks:
        results, timing = result(future, what)
        _note(timings, timing)
        for rank_results in results:
            for spec_id, value in rank_results.items():
                by_rank[spec_id].append(value)
    combined = AnalyzerResult()
    for spec in all_specs():
        if spec.id in by_rank:
            value = (spec.combine_ranks or concatenate)(by_rank[spec.id])
        else:
            value = whole[spec.id]
        combined.extend(value)
    return part_of(refs, combined, selection)


def _note(timings: list[TaskTiming] | None, timing: TaskTiming) -> None:
    if timings is not None:
        timings.append(timing)
