"""Build the versioned report (docs/report-schema.md) for stored jobs.

:func:`build_report` runs the analyzers over jobs and returns a plain dict
in the ``stallscope.report/1`` contract, built from its types
(:mod:`stallscope.report_types`); renderers live in ``render``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import duckdb
import msgspec

from stallscope import job_settings
from stallscope.analyzers import all_specs
from stallscope.analyzers.base import SEVERITY_RANK, AnalyzerResult, concatenate
from stallscope.errors import NotFoundError
from stallscope.jobdata import JobData
from stallscope.report_types import (
    REPORT_SCHEMA,
    DeviceEntry,
    FindingEntry,
    RankSelection,
    Report,
    TraceEntry,
)
from stallscope.store import TABLES, Store, TraceRef


def analyze_job(
    job: JobData,
    overrides: dict[str, dict[str, float]] | None = None,
    ranks: Collection[int] | None = None,
) -> AnalyzerResult:
    """Run every registered analyzer over one job; ``overrides[analyzer][threshold]``.

    ``ranks``: the ranks the per-rank analyzers (``SPEC.per_rank``) read (None: all; see
    :mod:`stallscope.rank_triage`); the others always read the whole job.

    The per-rank analyzers (``SPEC.per_rank``) run rank by rank, each rank's together on
    one part (``JobData.rank_parts``: that rank's files alone, freed before the
    next rank), and their ranks' results are joined (``SPEC.combine_ranks``);
    the others run once over the whole job. The result, in report order, is
    the same as every analyzer's ``run`` over the whole job; the work grows
    with the rank count instead of its square.
    """
    job_settings.apply(job, overrides)  # one value per job for every analyzer (and view)
    specs = all_specs()
    params = {spec.id: spec.params((overrides or {}).get(spec.id)) for spec in specs}
    rank_wise = [spec for spec in specs if spec.per_rank]
    by_rank: dict[str, list[AnalyzerResult]] = {spec.id: [] for spec in rank_wise}
    if rank_wise:
        for part in job.rank_parts():
            if ranks is not None and int(part.traces[0].meta.get("rank") or 0) not in ranks:
                continue  # never queried: its files are not read
            for spec in rank_wise:
                by_rank[spec.id].append(spec.run(part, params[spec.id]))
    combined = AnalyzerResult()
    for spec in specs:
        if spec.id in by_rank:
            result = (spec.combine_ranks or concatenate)(by_rank.pop(spec.id))
        else:
            result = spec.run(job, params[spec.id])
        combined.extend(result)
    return combined


def trace_entry(ref: TraceRef) -> TraceEntry:
    """The report's entry for one stored trace (from its catalog metadata)."""
    meta = ref.meta
    return TraceEntry(
        id=ref.trace_id,
        name=meta.get("name"),
        source=meta.get("source"),
        source_version=meta.get("source_version"),
        job=ref.job_id,
        rank=meta.get("rank"),
        world_size=meta.get("world_size"),
        devices=[
            DeviceEntry(d["device"], d.get("name"), d.get("sm_count"))
            for d in meta.get("devices", [])
        ],
        span_ns=meta.get("span_ns"),
        event_count=meta.get("event_count"),
        kernel_count=meta.get("kernel_count"),
        warnings=list(meta.get("warnings", [])),
    )


def job_report_part(
    store: Store,
    refs: list[TraceRef],
    overrides: dict[str, dict[str, float]] | None = None,
    all_ranks: bool = False,
) -> Report:
    """The report of one job: its traces, metrics, findings (in analyzer order) and, for a
    large job, its rank selection.

    Above ``rank_triage.DETAIL_ALL_UP_TO`` ranks the per-rank analyzers read
    the ranks :func:`~stallscope.rank_triage.select_ranks` picks (every rank
    with ``all_ranks``), and ``rank_selection`` says which and why.

    A stored file that cannot be read (truncated, damaged, or removed while
    this runs) raises :class:`~stallscope.errors.StoreFileCorrupt` or
    :class:`~stallscope.errors.NotFoundError` naming this job: never a raw
    DuckDB error, and never another job's failure.
    """
    from stallscope.rank_triage import select_ranks

    job = JobData(store, refs)
    selection = None
    try:
        selection = select_ranks(job, all_ranks=all_ranks)
        result = analyze_job(job, overrides, None if selection is None else selection.analyzed)
    except duckdb.Error as exc:
        raise reading_error(store, refs, exc) from None
    finally:
        job.close()
    if refs and not store.has_job(refs[0].job_id):  # removed while read: its views were empty
        raise NotFoundError(f"job {refs[0].job_id} was removed while it was being read")
    return part_of(job.traces, result, selection)


def part_of(refs: list[TraceRef], result: AnalyzerResult, selection: Any = None) -> Report:
    """A job's report: its traces (by rank), the analyzers' metrics and findings, and its
    rank selection (``rank_triage.RankSelection`` or None)."""
    traces = sorted(refs, key=lambda r: r.meta.get("rank", 0))
    job_id = traces[0].job_id if traces else ""
    return Report(
        schema=REPORT_SCHEMA,
        traces=[trace_entry(r) for r in traces],
        metrics=result.metrics,
        findings=[f.to_entry() for f in result.findings],
        rank_selection=[]
        if selection is None
        else [msgspec.convert(selection.to_dict(job_id), RankSelection)],
        tables=result.tables,
    )


def reading_error(store: Store, refs: list[TraceRef], exc: duckdb.Error) -> Exception:
    """What a DuckDB error while analyzing a job is to the user: the job removed meanwhile
    (NotFoundError), a stored file unreadable (StoreFileCorrupt), else the error itself (a bug)."""
    job_id = refs[0].job_id if refs else ""
    if refs and not store.has_job(job_id):  # removed meanwhile: whatever DuckDB said
        return NotFoundError(f"job {job_id} was removed while it was being read")
    if not isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException)):
        return exc  # a bug, not the store
    return unreadable_job(store, refs, exc)


def unreadable_job(store: Store, refs: list[TraceRef], exc: Exception) -> Exception:
    """The one-line error for a job whose stored files DuckDB could not read."""
    import pyarrow.parquet as pq

    from stallscope.errors import StoreFileCorrupt

    job_id = refs[0].job_id if refs else "?"
    if not store.has_job(job_id):
        return NotFoundError(f"job {job_id} was removed while it was being read")
    for ref in refs:
        for table in TABLES:
            path = ref.table_path(table)
            if not path.is_file():
                continue
            try:
                pq.read_metadata(path)
            except Exception as bad:  # noqa: BLE001 (any failure to read the footer says corrupt)
                reason = (
                    str(bad).strip().splitlines()[0] if str(bad).strip() else type(bad).__name__
                )
                return StoreFileCorrupt(
                    f"job {job_id}: stored file {path} is unreadable ({reason}); "
                    f"remove the job (stallscope rm {job_id}) and ingest its traces again"
                )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreFileCorrupt(f"job {job_id}: its stored files cannot be read ({first})")


def stored_parts(
    store: Store, jobs: list[list[TraceRef]], overrides: dict[str, dict[str, float]] | None
) -> dict[int, Report]:
    """The stored reports (``stallscope.report_store``) of the whole jobs among ``jobs`` that
    have one matching ``overrides`` and this code, by index in ``jobs``."""
    from stallscope import report_store

    found: dict[int, Report] = {}
    for index, refs in enumerate(jobs):
        if report_store.is_whole_job(store, refs):
            key = report_store.report_key([r.trace_id for r in refs], overrides)
            report = report_store.load(store, refs[0].job_id, key)
            if report is not None:
                found[index] = msgspec.convert(report, Report)
    return found


def save_parts(
    store: Store,
    jobs: list[list[TraceRef]],
    parts: list[Report],
    overrides: dict[str, dict[str, float]] | None,
) -> None:
    """Store each whole job's freshly computed report; a read-only or full store keeps none
    (the report still stands)."""
    from stallscope import report_store
    from stallscope.errors import EnvironmentProblem

    for refs, part in zip(jobs, parts, strict=True):
        if not report_store.is_whole_job(store, refs):
            continue
        key = report_store.report_key([r.trace_id for r in refs], overrides)
        report = part.to_dict()
        report["findings"].sort(key=finding_order)
        try:
            report_store.save(store, refs[0].job_id, key, report, overrides=overrides)
        except (OSError, EnvironmentProblem):
            return


def finding_order(finding: FindingEntry | dict[str, Any]) -> tuple[int, int, str]:
    """The report's order of findings: worst severity first, then most GPU time lost, then
    id (for a typed entry or its JSON object alike)."""
    keys = ("severity", "impact_ns", "id")
    f = finding if isinstance(finding, dict) else {k: getattr(finding, k) for k in keys}
    return (-SEVERITY_RANK[f["severity"]], -f["impact_ns"], f["id"])


def process_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes started fresh (spawn): never fork a process holding DuckDB threads."""
    import multiprocessing

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


POOL_MIN_CPUS = 4  # measured (docs/benchmarks.md): on 2 CPUs a pool was slower than one process


def default_jobs() -> int:
    """Analysis processes by default: one per CPU with at least POOL_MIN_CPUS CPUs, else 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cpus if (cpus or 1) >= POOL_MIN_CPUS else 1


RANKS_WORTH_A_POOL = 8  # a lone job of fewer ranks is analyzed here: starting workers costs more


def worth_a_pool(jobs: list[list[TraceRef]]) -> bool:
    """Whether worker processes pay for these jobs: several jobs, or one of many ranks."""
    jobs = [refs for refs in jobs if refs]
    ranks = max((len({r.meta.get("rank", 0) for r in refs}) for refs in jobs), default=0)
    return len(jobs) > 1 or ranks >= RANKS_WORTH_A_POOL


def build_report(
    store: Store,
    jobs: Iterable[list[TraceRef]],
    overrides: dict[str, dict[str, float]] | None = None,
    *,
    workers: int = 1,
    executor: Any = None,
    progress: Callable[[str, int, int], None] | None = None,
    all_ranks: bool = False,
    reuse: bool = False,
    timings: list | None = None,
) -> dict[str, Any]:
    """Report over several jobs (each a list of its traces).

    ``all_ranks``: the per-rank analyzers read every rank of every job (else a
    job above ``rank_triage.DETAIL_ALL_UP_TO`` ranks gets two-tier triage and
    the report a ``rank_selection`` entry).

    With ``executor`` (a process pool, or :class:`stallscope.cluster.DaskExecutor`),
    or ``workers > 1`` (a pool of that many processes, started here when
    :func:`worth_a_pool`), the jobs, and the ranks of each job, are analyzed
    in parallel tasks (:mod:`stallscope.fanout`, which appends each task's
    :class:`~stallscope.fanout.TaskTiming` to ``timings``); the report is the
    same as a sequential run's.
    With ``reuse`` (and not ``all_ranks``), a whole job's stored report is read
    when it matches, and a job analyzed here has its report stored
    (``stallscope.report_store``); the report is the same either way.
    """
    jobs = [refs for refs in jobs if refs]
    reusing = reuse and not all_ranks
    stored = stored_parts(store, jobs, overrides) if reusing else {}
    todo = [refs for index, refs in enumerate(jobs) if index not in stored]
    if executor is None and workers > 1 and worth_a_pool(todo):
        with process_pool(workers) as pool:
            return build_report(store, jobs, overrides, workers=workers, executor=pool,
                                progress=progress, all_ranks=all_ranks, reuse=reuse,
                                timings=timings)  # fmt: skip
    computed: list[Report] = []
    if executor is not None and todo:
        from stallscope.fanout import analyze_jobs

        slots = getattr(executor, "slots", None) or getattr(executor, "_max_workers", workers)
        computed = analyze_jobs(store, todo, overrides, executor, slots=slots,
                                all_ranks=all_ranks, progress=progress, timings=timings)  # fmt: skip
    else:
        for done, refs in enumerate(todo, start=1):
            computed.append(job_report_part(store, refs, overrides, all_ranks))
            if progress:
                progress("analyzed", done, len(todo))
    if reusing:
        save_parts(store, todo, computed, overrides)
    fresh = iter(computed)
    parts = [stored[i] if i in stored else next(fresh) for i in range(len(jobs))]
    report = Report(schema=REPORT_SCHEMA, traces=[], metrics=[], findings=[])
    for part in parts:
        report.traces.extend(part.traces)
        report.metrics.extend(part.metrics)
        report.findings.extend(part.findings)
        report.rank_selection.extend(part.rank_selection)
        report.tables.extend(part.tables)
    report.findings.sort(key=finding_order)
    return report.to_dict()


def worst_severity(report: dict[str, Any]) -> str | None:
    findings = report.get("findings", [])
    if not findings:
        return None
    return max((f["severity"] for f in findings), key=lambda s: SEVERITY_RANK[s])
